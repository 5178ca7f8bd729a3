#!/usr/bin/env bash
# The Adam step that writes the bf16 shards (runtime/optim/kernels/Adam.cu) on
# one GPU: its unit tests against ATen's fused AdamW/Adam (AdamCuda.*), then
# the same bf16 plan trained twice on the same random tokens, the optimizer
# writing the shards (the default) and BMT_FUSED_ADAM=0 (the float32 casts,
# at::_fused_adamw_ and the copy into the shards), with tokens/s of each, the
# ratio, both runs' losses (they agree up to a master's float32 ulp now and
# then, so to bf16 noise after a few steps) and the profiled ops of the
# optimizer's part of the step.
#
# usage (on the GPU machine, in a checkout): bash bench/gpu_adamw.sh PLAN OUT
#   PLAN: a bf16 plan with --random-init, e.g. llama-off-plain.sharded.pt of
#         bench/gpu_fusion.sh (bench/make_llama_1b.py)
# env: GTEST_SOURCE=<googletest folder> (default: none, no unit tests),
#      STEPS (23), MICRO_BATCH (8), SEQ_LEN (1024).
set -o pipefail
plan=$1; out=$2; mkdir -p "$out"
source bench/gpu_build.sh "$out"
export BMT_KERNEL_CACHE=/tmp/bmt-kernels
steps=${STEPS:-23}
if [ -n "${GTEST_SOURCE:-}" ]; then
  echo "== AdamCuda unit tests"
  ./build-gpu/test/bmt-runtime-unit-tests --gtest_filter='AdamCuda.*:AdamLowPrecision.*' 2>&1 \
    | tee "$out/unit.log" | grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|\[ note \]" | head -30
fi
python3 bench/random_tokens.py /tmp/tok.bin $(( (steps + 7) * ${MICRO_BATCH:-8} * (${SEQ_LEN:-1024} + 1) * 2 )) 128256
for v in kernel aten; do
  env=(); [ $v = aten ] && env=(BMT_FUSED_ADAM=0)
  env "${env[@]}" timeout 200 ./build-gpu/bin/bmt-run "$plan" --data /tmp/tok.bin --steps "$steps" \
    --micro-batch "${MICRO_BATCH:-8}" --seq-len "${SEQ_LEN:-1024}" --lr 1e-4 --schedule constant \
    --clip-grad 1.0 --device cuda --log-file "$out/$v.jsonl" --log-every 1 \
    --profile $((steps - 2)):"$steps" > "$out/$v.out" 2>&1
  echo "$v: exit $?; $(grep -c 'optimizer writes the' "$out/$v.out") line(s) saying the optimizer writes the shards"
done
python3 - "$out" "$steps" <<'PY'
import json, sys, os
d, steps = sys.argv[1], int(sys.argv[2])
runs = {}
for v in ("kernel", "aten"):
    f = os.path.join(d, v + ".jsonl")
    if not os.path.exists(f):
        continue
    s = [json.loads(l) for l in open(f)]
    s = [x for x in s if x.get("kind") == "train"]
    timed = [x for x in s if 5 < x["step"] <= steps - 4]  # not the step before the profile window
    tps = sum(x["tokens"] for x in timed) / sum(x["tokens"] / x["tokens_per_s"] for x in timed)
    runs[v] = (tps, [x["loss"] for x in s], [x["grad_norm"] for x in s])
    print(f"{v:6} {tps:9,.0f} tokens/s  losses {[round(l, 4) for l in runs[v][1][:12:3]]}")
if len(runs) == 2:
    a, b = runs["kernel"], runs["aten"]
    print(f"kernel / aten = {a[0] / b[0]:.3f}")
    first = next((i + 1 for i, (x, y) in enumerate(zip(a[1], b[1])) if x != y), None)
    print(f"losses identical up to step {first - 1 if first else len(a[1])}; max |difference| "
          f"{max(abs(x - y) for x, y in zip(a[1], b[1])):.2e}; grad norms max relative difference "
          f"{max(abs(x - y) / y for x, y in zip(a[2], b[2])):.2e}")
PY
for v in kernel aten; do
  echo "== $v: the optimizer's ops (profile, ms per step)"
  sed -n '/profile:/,$p' "$out/$v.out" | grep -iE "adam|_to_copy|copy_|div_|_foreach_norm|total|busy" | head -12
done
