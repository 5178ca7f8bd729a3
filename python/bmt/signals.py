"""SIGINT and SIGTERM as an orderly stop for bmt's Python tools.

Inside `stopped_by_signals()` either signal raises `Stopped` where the main
thread is, so that `finally` blocks remove temporary outputs on the way out;
`run_stoppable(main)` turns a stop (or a Ctrl-C before the handlers were set)
into one "error: stopped by SIG...; no output written" line and status
128 + the signal, as a shell reports a killed command.
"""

import contextlib
import signal
import sys
import threading


class Stopped(BaseException):
    """SIGTERM or SIGINT arrived (BaseException: `except Exception` does not
    swallow it)."""

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


def _stop(signum, frame):
    raise Stopped(signum)


@contextlib.contextmanager
def stopped_by_signals():
    """SIGTERM and SIGINT raise Stopped in the block (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def run_stoppable(main, *args):
    """main(*args)'s result, or 128 + the signal after one error line when
    SIGINT or SIGTERM stopped it."""
    try:
        with stopped_by_signals():
            return main(*args)
    except (Stopped, KeyboardInterrupt) as e:  # KeyboardInterrupt: before the handlers were set
        signum = e.signum if isinstance(e, Stopped) else signal.SIGINT
        print(f"error: stopped by {signal.Signals(signum).name}; no output written",
              file=sys.stderr)
        return 128 + signum
