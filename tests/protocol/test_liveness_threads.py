"""The training thread asks who is live (session.batch_size) while the communication thread observes
leases: the answer must come without "dictionary changed size during iteration"."""

import threading

from slowlink.protocol.leases import Liveness


def test_live_keys_can_be_read_while_another_thread_observes_and_forgets_leases():
    liveness = Liveness(lease_seconds=60.0)
    stop, errors = threading.Event(), []

    def communication_thread() -> None:
        beat = 0
        while not stop.is_set():
            beat += 1
            present = [f"nodes/n{i}.json" for i in range(beat % 200, beat % 200 + 300)]
            for key in present:
                liveness.observe(key, f"etag-{beat}", ("life", beat))
            liveness.forget_absent(present)

    thread = threading.Thread(target=communication_thread)
    thread.start()
    try:
        for _ in range(3000):
            try:
                assert all(key.startswith("nodes/") for key in liveness.live_keys())
            except RuntimeError as error:  # dictionary changed size during iteration
                errors.append(error)
                break
    finally:
        stop.set()
        thread.join()
    assert errors == []
