"""One machine of a two-machine run, in PyTorch. Its partner, examples/mlx_learner.py, trains the same model
in MLX on another machine (a Mac, say); the run lives in a bucket both machines reach. docs/frameworks.md
says how the two frameworks' models become one run's.

The store, a MinIO server on a machine both learners reach (here 10.0.0.5; any S3 store will do):

    docker run -d --name minio -p 9000:9000 -v minio-data:/data \\
        -e MINIO_ROOT_USER=slowlink -e MINIO_ROOT_PASSWORD=change-this-secret \\
        quay.io/minio/minio server /data
    docker exec minio mc alias set local http://localhost:9000 slowlink change-this-secret
    docker exec minio mc mb local/training

On this machine, and likewise on the MLX one (pip install 'slowlink[mlx,s3]', python examples/mlx_learner.py):

    pip install 'slowlink[torch,s3]'
    export AWS_ACCESS_KEY_ID=slowlink AWS_SECRET_ACCESS_KEY=change-this-secret
    export AWS_ENDPOINT_URL=http://10.0.0.5:9000 AWS_DEFAULT_REGION=us-east-1
    python examples/torch_learner.py --mailbox s3://training/runs/mixed-1

Both on one machine, over a folder (the tests run this, with --steps 30):

    python examples/torch_learner.py --mailbox /tmp/mixed-run & python examples/mlx_learner.py --mailbox /tmp/mixed-run
"""

import argparse
import time

import numpy as np
import torch

import slowlink as sl

FEATURES, HIDDEN, GLOBAL_BATCH = 8, 32, 64  # both learners: the same architecture, the same global batch
ALGORITHM = sl.DiLoCo(sync_every=10, quorum_size=2, overlap_steps=0, global_batch_size=GLOBAL_BATCH)


def build_model() -> torch.nn.Module:
    # mlx_learner.py's nn.Sequential names its tensors as this one does: 0.weight, 0.bias, 2.weight, 2.bias
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, 1))


def batch(rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Samples of one function both learners fit: y = tanh(x·A)·b, with A and b the same everywhere."""
    teacher = np.random.default_rng(1234)
    a, b = teacher.standard_normal((FEATURES, 4)), teacher.standard_normal((4, 1))
    x = rng.standard_normal((size, FEATURES))
    return x.astype(np.float32), (np.tanh(x @ a) @ b).astype(np.float32)


def heldout_loss(model: torch.nn.Module) -> float:
    x, y = batch(np.random.default_rng(999), 1000)  # the same held-out set in both learners
    with torch.no_grad():
        return torch.nn.functional.mse_loss(model(torch.from_numpy(x)), torch.from_numpy(y)).item()


def wait_for_partner(session: sl.Session, timeout: float = 300.0) -> None:
    """Until the partner is live: session.batch_size is the global batch shared by the live nodes, so it
    halves when the other learner joins. A node alone would merge its first rounds by itself."""
    deadline = time.monotonic() + timeout
    while session.batch_size > GLOBAL_BATCH // 2:
        if time.monotonic() > deadline:
            raise SystemExit(
                f"no partner joined the run within {timeout:.0f} s: start examples/mlx_learner.py"
            )
        time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mailbox", required=True, help="a folder, or s3://bucket/prefix")
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = build_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    rng = np.random.default_rng(0)  # this learner's own data
    losses = []
    with sl.Session(model, algorithm=ALGORITHM, mailbox=args.mailbox, node_id="torch-node") as session:
        wait_for_partner(session)
        for _ in range(args.steps):
            x, y = batch(rng, session.batch_size)
            loss = torch.nn.functional.mse_loss(model(torch.from_numpy(x)), torch.from_numpy(y))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            session.step(samples=len(x))
    print(f"torch node: loss {np.mean(losses[:10]):.4f} -> {np.mean(losses[-10:]):.4f}, "
          f"{session.stats.commits_applied} commits applied, versions {list(session.stats.versions)}")  # fmt: skip
    fresh = build_model()
    print(f"torch node: a fresh model: held-out loss {heldout_loss(fresh):.5f}")
    versions = sl.align(fresh, mailbox=args.mailbox)  # the newest committed model, for evaluation
    print(f"torch node: committed model at versions {versions}: held-out loss {heldout_loss(fresh):.5f}")


if __name__ == "__main__":
    main()
