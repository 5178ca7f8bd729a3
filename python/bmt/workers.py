"""An ordered process pool that fails, never hangs, when a worker dies.

OrderedPool(n, fn).map(items) runs fn(item) in n forked worker processes and
yields the results in the order of the items, with at most one item in
flight per worker (memory stays bounded however fast items come).

Why not concurrent.futures.ProcessPoolExecutor: its workers share one result
pipe, so a worker killed in the middle of writing a result (out of memory,
SIGKILL) leaves a partial message that the executor's reader waits on
forever while the other workers keep the pipe open (CPython 3.11, seen on
CI). Here every worker has its own socket pair whose worker end no other
process holds: a worker that dies, at any point, shows as end of file or its
process sentinel, and map raises WorkerDied.

Exceptions raised by fn in a worker are raised again by map in the parent.
Linux workers also end with their parent (PR_SET_PDEATHSIG).
"""

import multiprocessing
import os
import sys
import traceback
from multiprocessing.connection import wait


class WorkerDied(RuntimeError):
    """A worker process ended without returning its item's result."""


def _end_with_parent(parent):
    if sys.platform.startswith("linux"):
        import ctypes
        import signal
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))   # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:   # it died before prctl
        os._exit(1)


def _worker_main(conn, inherited, parent, fn):
    import signal
    # Ctrl-C reaches the whole process group: the parent stops the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)   # not the parent's handler
    for other in inherited:   # the parent's ends of the earlier workers' pairs
        other.close()
    _end_with_parent(parent)
    while True:
        try:
            item = conn.recv()
        except (EOFError, OSError):
            return
        if item is None:
            return
        try:
            reply = ("ok", fn(item))
        except BaseException as e:   # noqa: BLE001 - handed to the parent
            reply = ("error", e, traceback.format_exc())
        try:
            conn.send(reply)
        except (TypeError, AttributeError, ValueError):   # an exception that does not pickle
            conn.send(("error", RuntimeError(reply[2]), reply[2]))
        except OSError:
            return


class OrderedPool:
    """n forked workers running fn (a module-level function, or one whose
    state the fork inherits). Use as a context manager: leaving it stops the
    workers (killed, when leaving by an exception)."""

    def __init__(self, n, fn):
        if n < 1:
            raise ValueError(f"an OrderedPool needs at least one worker, not {n}")
        context = multiprocessing.get_context("fork")
        self._conns = []
        self._procs = []
        try:
            for _ in range(n):
                ours, theirs = context.Pipe(duplex=True)
                proc = context.Process(target=_worker_main, daemon=True,
                                       args=(theirs, list(self._conns), os.getpid(), fn))
                proc.start()
                theirs.close()   # only the worker holds its end: its death is end of file
                self._conns.append(ours)
                self._procs.append(proc)
        except BaseException:
            self.close(kill=True)
            raise

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        self.close(kill=kind is not None)

    def _died(self, w):
        proc = self._procs[w]
        proc.join(timeout=1)
        code = proc.exitcode
        how = "still running" if code is None else (
            f"killed by signal {-code}" if code < 0 else f"exit status {code}")
        return WorkerDied(f"a worker process died (pid {proc.pid}, {how})")

    def _receive(self, w):
        conn, proc = self._conns[w], self._procs[w]
        ready = wait([conn, proc.sentinel])
        if conn not in ready:
            raise self._died(w)
        try:
            reply = conn.recv()
        except (EOFError, OSError):
            raise self._died(w) from None
        if reply[0] == "error":
            raise reply[1]
        return reply[1]

    def _send(self, w, item):
        try:
            self._conns[w].send(item)
        except OSError:
            raise self._died(w) from None

    def map(self, items):
        """Yields fn(item) for each item, in order."""
        n = len(self._procs)
        sent = received = 0
        for item in items:
            if sent - received == n:   # every worker holds one: take the oldest
                yield self._receive(received % n)
                received += 1
            self._send(sent % n, item)
            sent += 1
        while received < sent:
            yield self._receive(received % n)
            received += 1

    def close(self, kill=False):
        for conn, proc in zip(self._conns, self._procs):
            if not kill and proc.is_alive():
                try:
                    conn.send(None)
                except OSError:
                    pass
            conn.close()
        for proc in self._procs:
            if kill:
                proc.kill()
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join()
        self._conns, self._procs = [], []
