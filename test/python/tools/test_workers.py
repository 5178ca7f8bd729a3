"""bmt.workers.OrderedPool: results in input order, a worker's exception
raised in the parent, and a worker that dies, even halfway through sending
its result, fails map with WorkerDied instead of hanging it."""

import os
import signal
import threading
import time

import pytest

from bmt.workers import OrderedPool, WorkerDied


def square_slowly(x):
    time.sleep((x * 7 % 5) / 1000)   # results come back out of order
    return x * x


def fail_on_13(x):
    if x == 13:
        raise ValueError(f"bad item {x}")
    return x


def die_on_5(x):
    if x == 5:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def die_while_sending(x):
    if x == 3:
        # Writing 256 MiB takes long enough that the kill (after 0.4 s) lands
        # while the result is being sent: the partial message on which
        # concurrent.futures' ProcessPoolExecutor waits forever.
        result = b"x" * (256 << 20)
        threading.Timer(0.4, os.kill, (os.getpid(), signal.SIGKILL)).start()
        return result
    return x


def run_with_deadline(fn, seconds=60):
    """fn() in a thread; fails the test instead of hanging it."""
    outcome = {}

    def target():
        try:
            outcome["value"] = fn()
        except BaseException as e:   # noqa: BLE001 - reported below
            outcome["error"] = e
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


@pytest.mark.parametrize("workers", [1, 3])
def test_results_come_in_input_order(workers):
    with OrderedPool(workers, square_slowly) as pool:
        assert list(pool.map(range(40))) == [x * x for x in range(40)]
        assert list(pool.map([])) == []   # the pool is reusable


def test_a_worker_exception_is_raised_in_the_parent():
    with OrderedPool(2, fail_on_13) as pool:
        with pytest.raises(ValueError, match="bad item 13"):
            list(pool.map(range(20)))


def test_a_killed_worker_raises_worker_died():
    def go():
        with OrderedPool(2, die_on_5) as pool:
            return list(pool.map(range(20)))
    with pytest.raises(WorkerDied, match="killed by signal 9"):
        run_with_deadline(go)


def test_a_worker_killed_while_sending_its_result_raises_worker_died():
    def go():
        with OrderedPool(2, die_while_sending) as pool:
            return [len(r) if isinstance(r, bytes) else r for r in pool.map(range(8))]
    with pytest.raises(WorkerDied):
        run_with_deadline(go)


def test_leaving_the_pool_ends_its_workers():
    with OrderedPool(3, square_slowly) as pool:
        procs = list(pool._procs)
        assert all(p.is_alive() for p in procs)
    assert not any(p.is_alive() for p in procs)
