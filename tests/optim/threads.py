"""Several DeMo nodes in one process, one thread each: an exchange whose all-gather is a barrier."""

import threading


class ThreadedGroup:
    """Rank r's exchange is group.member(r); every member must call all_gather once per step."""

    def __init__(self, nodes: int) -> None:
        self.nodes, self.rows = nodes, [None] * nodes
        self.barrier = threading.Barrier(nodes)

    def member(self, rank: int):
        group = self

        class Member:
            nodes = group.nodes

            def all_gather(self, payload, *, step, max_bytes):
                assert len(payload) <= max_bytes
                group.rows[rank] = payload
                group.barrier.wait()
                gathered = list(group.rows)
                group.barrier.wait()  # nobody overwrites a row before everyone has read it
                return gathered

        return Member()


def run_threads(functions) -> list:
    results = [None] * len(functions)

    def run(i):
        results[i] = functions[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(functions))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results
