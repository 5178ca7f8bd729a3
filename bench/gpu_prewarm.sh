#!/usr/bin/env bash
# The fused kernels compiled before step 1 (docs/runtime/prewarm.md), on one GPU: build bmt-run (runtime only), then run
# the Llama-3.2-1B-shaped plan (bench/make_llama_1b.py, fused, --random-init)
# with an empty kernel cache, with the warm cache, with the warm cache and
# --no-prewarm-kernels, and recompute on; then the tiny fused fixtures
# (fp32 and bf16). Each run prints its "compiled N fused kernels" line, the
# count of kernels compiled during training (0 expected with the prewarm),
# step 1's time and the losses (equal with and without the prewarm).
#
# usage (on the GPU machine, in a checkout): bash bench/gpu_prewarm.sh PLANS OUT
#   PLANS: llama-off-gqa.sharded.pt, llama-on-gqa.sharded.pt (recompute off /
#          on; bench/gpu_fusion.sh's), tiny-fused/NAME.sharded.pt and
#          tiny-fused-bf16/NAME.sharded.pt (NAME: llama, gpt2, bert)
# env: GTEST_SOURCE=<googletest folder>: also build and run FusionCuda.*
set -o pipefail
plans=$1; out=$2; mkdir -p "$out"
source bench/gpu_build.sh "$out"
python3 bench/random_tokens.py /tmp/tok.bin $(( 10 * 8 * 1025 * 2 )) 128256
python3 bench/random_tokens.py /tmp/tiny.bin $(( 10 * 8 * 1025 * 2 )) 100 --vocab-size 128
# run NAME PLAN CACHE [bmt-run options]: a short training run; its lines.
run() {
  local name=$1 plan=$2 cache=$3; shift 3
  BMT_KERNEL_CACHE=$cache timeout 200 "$B" "$plan" --steps 6 --lr 1e-4 --schedule constant \
    --clip-grad 1.0 --device cuda --log-file "$out/$name.jsonl" "$@" > "$out/$name.out" 2>&1
  echo "== $name: exit $?"
  grep -E "fused kernels|error" "$out/$name.out"
  python3 - "$out/$name.jsonl" <<'PY'
import json, sys
s = [json.loads(l) for l in open(sys.argv[1]) if '"train"' in l]
if s:
    t1 = s[0]["elapsed_s"]
    print(f"  step 1 {t1:.3f} s, step 2 {s[1]['elapsed_s'] - t1:.3f} s; fused_lazy_kernels per step "
          f"{[x['fused_lazy_kernels'] for x in s]}; losses {[round(x['loss'], 5) for x in s]}")
PY
}
llama=(--data /tmp/tok.bin --micro-batch 8 --seq-len 1024)
rm -rf /tmp/kc-llama
run llama-cold "$plans/llama-off-gqa.sharded.pt" /tmp/kc-llama "${llama[@]}"
run llama-warm "$plans/llama-off-gqa.sharded.pt" /tmp/kc-llama "${llama[@]}"
run llama-lazy "$plans/llama-off-gqa.sharded.pt" /tmp/kc-llama "${llama[@]}" --no-prewarm-kernels
rm -rf /tmp/kc-lazy-cold
run llama-lazy-cold "$plans/llama-off-gqa.sharded.pt" /tmp/kc-lazy-cold "${llama[@]}" --no-prewarm-kernels
run llama-recompute "$plans/llama-on-gqa.sharded.pt" /tmp/kc-llama "${llama[@]}"
for m in llama gpt2 bert; do
  for v in "" -bf16; do
    run "tiny-$m$v" "$plans/tiny-fused$v/$m.sharded.pt" /tmp/kc-tiny --data /tmp/tiny.bin --micro-batch 3 \
      --seq-len 24 --objective causal-lm
  done
done
if [ -n "${GTEST_SOURCE:-}" ]; then
  echo "== FusionCuda unit tests"
  ./build-gpu/test/bmt-runtime-unit-tests --gtest_filter='FusionCuda.*:Fusion.*' 2>&1 | tee "$out/unit.log" \
    | grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure" | head -30
fi
