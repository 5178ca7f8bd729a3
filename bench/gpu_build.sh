# Sourced by the bench/gpu_*.sh scripts on the GPU machine, in a checkout:
# builds bmt-run (the runtime only: -DBMT_COMPILER=OFF) into build-gpu/ and,
# with GTEST_SOURCE=<googletest folder>, bmt-runtime-unit-tests too; writes
# LOGS/cmake.log and LOGS/build.log and exits the script if either step fails.
# Sets LD_LIBRARY_PATH (the torch wheel's libraries, cuDNN, NVRTC), `carry`
# (DEVCARRY, default .devcarry/: its include/ has nlohmann/json) and `B`
# (the bmt-run binary).
#
# usage: source bench/gpu_build.sh LOGS
gpu_logs=$1
site=$(python3 -c 'import torch,os;print(os.path.dirname(os.path.dirname(torch.__file__)))')
export LD_LIBRARY_PATH="$site/torch/lib:$site/nvidia/cu13/lib:$site/nvidia/cuda_nvrtc/lib:${LD_LIBRARY_PATH:-}"
carry=${DEVCARRY:-$PWD/.devcarry}
gpu_tests=(-DBMT_TESTS=OFF); gpu_targets=(bmt-run)
if [ -n "${GTEST_SOURCE:-}" ]; then
  gpu_tests=(-DBMT_TESTS=ON -DBMT_GTEST_SOURCE_DIR="$GTEST_SOURCE"); gpu_targets+=(bmt-runtime-unit-tests)
fi
gpu_t0=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DBMT_COMPILER=OFF "${gpu_tests[@]}" \
  -DPython3_EXECUTABLE="$(command -v python3)" -DNLOHMANN_JSON_INCLUDE_DIR="$carry/include" \
  > "$gpu_logs/cmake.log" 2>&1 && ninja -C build-gpu "${gpu_targets[@]}" > "$gpu_logs/build.log" 2>&1 \
  || { tail -40 "$gpu_logs/cmake.log" "$gpu_logs/build.log"; exit 1; }
echo "built ${gpu_targets[*]} in $(( $(date +%s) - gpu_t0 )) s"
grep -h "bmt: CUDA kernels\|bmt: no CUDA" "$gpu_logs/cmake.log"
B=$PWD/build-gpu/bin/bmt-run
