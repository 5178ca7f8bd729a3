#!/usr/bin/env python3
"""usage: expect_exit.py CODE COMMAND [ARGS...]

Runs COMMAND, passes its stdout/stderr through, and exits 0 only if it
exited with exactly CODE (a crash shows as a signal, never as CODE). lit's
`not` accepts any non-zero exit; bmt promises exit code 1 on bad input.
"""
import subprocess
import sys

want = int(sys.argv[1])
rc = subprocess.call(sys.argv[2:])
if rc != want:
    print(f"expect_exit: {sys.argv[2]} exited with {rc}, expected {want}", file=sys.stderr)
    sys.exit(1)
