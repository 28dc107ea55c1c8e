"""Several DeMo nodes in one process: one thread per node, and an exchange whose all-gather waits for every
node's rows and returns them in rank order (engine/exchange.py's contract), so the run is the one
torch.distributed would give. A node that fails breaks the barrier, so the others stop instead of hanging."""

from __future__ import annotations

import threading
from collections.abc import Callable

WAIT_SECONDS = 600.0  # one step of the slowest node; far more than any bench step takes


class LockstepGroup:
    """Rank r's exchange is member(r); every member calls all_gather once per step."""

    def __init__(self, nodes: int) -> None:
        self.nodes = nodes
        self.rows: list[bytes | None] = [None] * nodes
        self.barrier = threading.Barrier(nodes, timeout=WAIT_SECONDS)

    def member(self, rank: int) -> Member:
        return Member(self, rank)


class Member:
    def __init__(self, group: LockstepGroup, rank: int) -> None:
        self.group, self.rank, self.nodes = group, rank, group.nodes

    def all_gather(self, payload: bytes, *, step: int, max_bytes: int) -> list[bytes | None]:
        del step, max_bytes  # every node is at the same step, and the payloads are this process's own
        group = self.group
        group.rows[self.rank] = payload
        group.barrier.wait()
        gathered = list(group.rows)
        group.barrier.wait()  # nobody writes the next step's row before everyone has read this one
        return gathered


def run_in_lockstep(group: LockstepGroup, nodes: list[Callable[[], object]]) -> list[object]:
    """Run each node's function on its own thread; the first error is raised once all have stopped."""
    results: list[object] = [None] * len(nodes)
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            results[rank] = nodes[rank]()
        except threading.BrokenBarrierError:
            pass  # another node failed first; its error is the one to report
        except BaseException as error:
            errors.append(error)
            group.barrier.abort()

    threads = [
        threading.Thread(target=run, args=(rank,), name=f"demo-node-{rank}") for rank in range(len(nodes))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    if any(result is None for result in results):
        raise RuntimeError("a DeMo node stopped at the all-gather without an error: the barrier timed out")
    return results
