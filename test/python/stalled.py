"""Real signals at a known point of a Python tool's run.

stalled_module(tmp, "transformers") writes a stand-in package that, once
reached, touches a marker file and sleeps for a minute: in its import
(when="import") or when the tool looks up one of its names
(when="getattr"). Put first on PYTHONPATH (the env it returns), it holds the
tool there; signal_when_stalled(cmd, env, marker, signum) starts the tool,
waits for the marker, sends the signal and returns (exit status, stderr).
"""
import os
import subprocess
import time


def stalled_module(tmp, name, when="import"):
    """(env with the stand-in `name` first on PYTHONPATH, marker path)."""
    marker = tmp / f"stalled-{name}"
    package = tmp / "stalled" / name
    package.mkdir(parents=True)
    stall = f"open({str(marker)!r}, 'w').close()\ntime.sleep(60)\n"
    if when == "import":
        body = "import time\n" + stall
    elif when == "getattr":
        body = "import time\ndef __getattr__(name):\n" + "".join(
            "    " + line + "\n" for line in stall.splitlines())
    else:
        raise ValueError(f"when must be import or getattr, not {when!r}")
    (package / "__init__.py").write_text(body)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(tmp / "stalled"), os.environ.get("PYTHONPATH", "")]))
    return env, marker


def signal_when_stalled(cmd, env, marker, signum, before_signal=None, timeout=60):
    """Runs cmd, sends signum once marker exists (after before_signal(), a
    check of the state at that point), and returns (exit status, stderr). The
    process is killed if it outlives the test."""
    proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + timeout
        while not marker.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.02)
        assert marker.exists(), f"the run did not reach {marker.name}: " + proc.communicate()[1]
        if before_signal is not None:
            before_signal()
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, stderr
