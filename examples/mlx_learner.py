"""One machine of a two-machine run, in MLX. Its partner, examples/torch_learner.py, trains the same model in
PyTorch on another machine; the run lives in a bucket both machines reach. An nn.Sequential is named as
torch's is (0.weight, ...); docs/frameworks.md says how to map the names of other modules.

The store, a MinIO server on a machine both learners reach (here 10.0.0.5; any S3 store will do):

    docker run -d --name minio -p 9000:9000 -v minio-data:/data \\
        -e MINIO_ROOT_USER=slowlink -e MINIO_ROOT_PASSWORD=change-this-secret \\
        quay.io/minio/minio server /data
    docker exec minio mc alias set local http://localhost:9000 slowlink change-this-secret
    docker exec minio mc mb local/training

On this machine (a Mac; on Linux the mlx extra installs mlx[cpu], the build that loads there), and likewise
on the torch one (pip install 'slowlink[torch,s3]', python examples/torch_learner.py):

    pip install 'slowlink[mlx,s3]'
    export AWS_ACCESS_KEY_ID=slowlink AWS_SECRET_ACCESS_KEY=change-this-secret
    export AWS_ENDPOINT_URL=http://10.0.0.5:9000 AWS_DEFAULT_REGION=us-east-1
    python examples/mlx_learner.py --mailbox s3://training/runs/mixed-1

Both on one machine, over a folder (the tests run this, with --steps 30):

    python examples/torch_learner.py --mailbox /tmp/mixed-run & python examples/mlx_learner.py --mailbox /tmp/mixed-run
"""

import argparse
import time

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np

import slowlink as sl

FEATURES, HIDDEN, GLOBAL_BATCH = 8, 32, 64  # both learners: the same architecture, the same global batch
ALGORITHM = sl.DiLoCo(sync_every=10, quorum_size=2, overlap_steps=0, global_batch_size=GLOBAL_BATCH)


def build_model() -> nn.Module:
    mx.random.seed(0)
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1))


def batch(rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Samples of one function both learners fit: y = tanh(x·A)·b, with A and b the same everywhere."""
    teacher = np.random.default_rng(1234)
    a, b = teacher.standard_normal((FEATURES, 4)), teacher.standard_normal((4, 1))
    x = rng.standard_normal((size, FEATURES))
    return x.astype(np.float32), (np.tanh(x @ a) @ b).astype(np.float32)


def mse(model: nn.Module, x: mx.array, y: mx.array) -> mx.array:
    return nn.losses.mse_loss(model(x), y)


def heldout_loss(model: nn.Module) -> float:
    x, y = batch(np.random.default_rng(999), 1000)  # the same held-out set in both learners
    return mse(model, mx.array(x), mx.array(y)).item()


def wait_for_partner(session: sl.Session, timeout: float = 300.0) -> None:
    """Until the partner is live: session.batch_size is the global batch shared by the live nodes, so it
    halves when the other learner joins. A node alone would merge its first rounds by itself."""
    deadline = time.monotonic() + timeout
    while session.batch_size > GLOBAL_BATCH // 2:
        if time.monotonic() > deadline:
            raise SystemExit(
                f"no partner joined the run within {timeout:.0f} s: start examples/torch_learner.py"
            )
        time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mailbox", required=True, help="a folder, or s3://bucket/prefix")
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    model = build_model()
    optimizer = optim.Adam(learning_rate=1e-2)
    loss_and_grad = nn.value_and_grad(model, mse)
    rng = np.random.default_rng(1)  # this learner's own data
    losses = []
    with sl.Session(model, algorithm=ALGORITHM, mailbox=args.mailbox, node_id="mlx-node") as session:
        wait_for_partner(session)
        for _ in range(args.steps):
            x, y = batch(rng, session.batch_size)
            loss, grads = loss_and_grad(model, mx.array(x), mx.array(y))
            optimizer.update(model, grads)
            mx.eval(model.parameters(), optimizer.state)  # the step is done before slowlink reads the model
            losses.append(loss.item())
            session.step(samples=len(x))
    print(f"mlx node: loss {np.mean(losses[:10]):.4f} -> {np.mean(losses[-10:]):.4f}, "
          f"{session.stats.commits_applied} commits applied, versions {list(session.stats.versions)}")  # fmt: skip
    fresh = build_model()
    print(f"mlx node: a fresh model: held-out loss {heldout_loss(fresh):.5f}")
    versions = sl.align(fresh, mailbox=args.mailbox)  # the newest committed model, for evaluation
    print(f"mlx node: committed model at versions {versions}: held-out loss {heldout_loss(fresh):.5f}")


if __name__ == "__main__":
    main()
