"""Runs pytest (the arguments as given) under a second set of CPU kernels,
so that a green run on this CPU means green on others too (numerics.py):

- ATEN_CPU_CAPABILITY=avx2 on a CPU with AVX512 (where ATen's default is
  avx512), else ATEN_CPU_CAPABILITY=default (ATen's kernels without vector
  instructions): ATen's other vectorized kernels;
- MKL_CBWR=COMPATIBLE: MKL's code path for any x86-64 CPU instead of the
  one chosen for this CPU (BLAS blocks its sums another way).

ctest runs the numerics-sensitive tests once as they are and once through
this script (test/CMakeLists.txt).
"""
import os
import sys

import pytest


def second_isa_environment():
    with open("/proc/cpuinfo") as f:
        avx512 = " avx512f" in f.read()
    return {"ATEN_CPU_CAPABILITY": "avx2" if avx512 else "default", "MKL_CBWR": "COMPATIBLE"}


if __name__ == "__main__":
    env = second_isa_environment()
    os.environ.update(env)  # before torch is imported; bmt's binaries inherit it
    print("second set of CPU kernels: " + " ".join(f"{k}={v}" for k, v in env.items()), flush=True)
    sys.exit(pytest.main(sys.argv[1:]))
