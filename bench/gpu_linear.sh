#!/usr/bin/env bash
# Linear layers whose bias gradient comes from the weight-gradient GEMM
# (runtime/ops/Linear.cpp, docs/runtime.md "Linear layers on CUDA"), on one
# GPU: build bmt-run and the unit tests (runtime only), run LinearCuda.*
# (against ATen), the bf16 and fp32 parity of the tiny fused plans (every
# architecture; GPT-2 runs addmm, most others linear), then GPT-2 1.3 B
# (bench/gpu_speed.py's plans) with the epilogue and with
# BMT_LINEAR_BIAS_GRAD=0 (ATen's mm + sum), recompute off and on, in the
# same call: tokens/s, model TFLOP/s, peak GiB and the profiles.
#
# usage (on the GPU machine, in a checkout): bash bench/gpu_linear.sh PLANS OUT
#   PLANS: tiny-fused/, tiny-fused-bf16/ (bench/make_parity_plans.py) and
#          gpt2-1p3b-recompute-{on,off}.sharded.pt
#          (python3 bench/gpu_speed.py --make-archives-only --out PLANS)
# env: GTEST_SOURCE=<googletest folder> (needed for the unit tests),
#      SKIP_PARITY=1, RECOMPUTE (default "off on")
set -o pipefail
plans=$1; out=$2; mkdir -p "$out/logs"
site=$(python3 -c 'import torch,os;print(os.path.dirname(os.path.dirname(torch.__file__)))')
export LD_LIBRARY_PATH="$site/torch/lib:$site/nvidia/cu13/lib:$site/nvidia/cuda_nvrtc/lib:${LD_LIBRARY_PATH:-}"
export BMT_KERNEL_CACHE=/tmp/bmt-kernels
carry=${DEVCARRY:-$PWD/.devcarry}
tests=(-DBMT_TESTS=OFF); targets=(bmt-run)
if [ -n "${GTEST_SOURCE:-}" ]; then
  tests=(-DBMT_TESTS=ON -DBMT_GTEST_SOURCE_DIR="$GTEST_SOURCE"); targets+=(bmt-runtime-unit-tests)
fi
t0=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DBMT_COMPILER=OFF "${tests[@]}" \
  -DPython3_EXECUTABLE="$(command -v python3)" -DNLOHMANN_JSON_INCLUDE_DIR="$carry/include" \
  > "$out/logs/cmake.log" 2>&1 && ninja -C build-gpu "${targets[@]}" > "$out/logs/build.log" 2>&1 \
  || { tail -40 "$out/logs/cmake.log" "$out/logs/build.log"; exit 1; }
echo "built ${targets[*]} in $(( $(date +%s) - t0 )) s"
grep -q BMT_WITH_CUBLASLT build-gpu/build.ninja && echo "cuBLASLt: linked" || echo "cuBLASLt: NOT linked"
if [ -n "${GTEST_SOURCE:-}" ]; then
  echo "== Linear unit tests"
  ./build-gpu/test/bmt-runtime-unit-tests --gtest_filter='Linear*' 2>&1 | tee "$out/logs/unit.log" \
    | grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|note|fell back" | head -40
fi
B=$PWD/build-gpu/bin/bmt-run
if [ -z "${SKIP_PARITY:-}" ]; then
  echo "== parity, fused plans (fp32)"
  python3 bench/gpu_parity.py "$B" "$plans/tiny-fused" all --jobs 4 2>&1 | tee "$out/logs/parity.log" \
    | grep -E "worst|failed|not compiled|no such"
  echo "== parity, fused plans (bf16 against float32, bound: 2 x eager bf16's difference)"
  python3 bench/gpu_parity.py "$B" "$plans/tiny-fused-bf16" all --dtype bfloat16 --jobs 4 2>&1 \
    | tee "$out/logs/parity-bf16.log" | grep -E "\(bf16\)|worst|failed|not compiled|no such"
fi
for r in ${RECOMPUTE:-off on}; do
  for v in epilogue aten; do
    flag=1; [ $v = aten ] && flag=0
    echo "== GPT-2 1.3 B, recompute $r, bias gradients: $v"
    BMT_LINEAR_BIAS_GRAD=$flag timeout 200 python3 bench/gpu_speed.py --only bmt --recompute $r \
      --archives "$plans" --out "$out/logs/gpt2-$v-$r" --steps 15 --warmup 5 \
      > "$out/logs/gpt2-$v-$r.log" 2>&1
    grep -E "^bmt |host synchron" "$out/logs/gpt2-$v-$r.log"
    [ $v = epilogue ] || [ "${PROFILE_ATEN:-}" ] || continue
    sed -n '/profile ---/,$p' "$out/logs/gpt2-$v-$r.log" | head -${PROFILE_LINES:-26}
  done
done
tar -czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
