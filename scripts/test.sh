#!/usr/bin/env bash
# The README's test command: installs and builds what is missing, makes the
# test fixtures, then runs every test through ctest: the lit suite (test/**,
# FileCheck), the GoogleTest unit tests (test/unit) and pytest (test/python).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$root/build}"
export BUILD_DIR

bash "$root/scripts/build.sh"
ctest --test-dir "$BUILD_DIR" --output-on-failure "$@"
