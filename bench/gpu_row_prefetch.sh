#!/usr/bin/env bash
# The 8-wide row kernels with and without loading a block's next row while
# the current one is reduced (BMT_ROW_PREFETCH=0 | backward | 1, read when
# the kernel source is generated), on one GPU: for each mode the FusionCuda
# unit tests (the generated kernels against ATen), then bmt-run on the
# Llama-3.2-1B shape (bench/gpu_fusion.sh's llama-{off,on}-gqa plans) and on
# GPT-2 1.3 B (bench/gpu_speed.py's plans), recompute off and on, printing
# tokens/s and the fused kernels' milliseconds a step.
#
# usage (on the GPU machine, in a checkout): bash bench/gpu_row_prefetch.sh PLANS OUT
#   PLANS: llama-{off,on}-gqa.sharded.pt and gpt2-1p3b-recompute-{off,on}.sharded.pt
# env: MODES (default "0 backward 1"), GTEST_SOURCE (as bench/gpu_build.sh),
#      BMT_ROW_BLOCKS_PER_SM (the forward's blocks an SM, default 16).
set -o pipefail
plans=$1; out=$2; mkdir -p "$out/logs"
source bench/gpu_build.sh "$out/logs"
python3 bench/random_tokens.py /tmp/tok.bin $(( 30 * 8 * 1025 * 2 )) 50257
for mode in ${MODES:-0 backward 1}; do
  export BMT_ROW_PREFETCH=$mode BMT_KERNEL_CACHE=/tmp/bmt-kernels-$mode
  if [ -n "${GTEST_SOURCE:-}" ]; then
    ./build-gpu/test/bmt-runtime-unit-tests --gtest_filter='FusionCuda.*:Fusion.*' > "$out/logs/unit-$mode.log" 2>&1
    echo "prefetch $mode: unit tests exit $? ($(grep -cE '^\[       OK \]' "$out/logs/unit-$mode.log") passed)"
  fi
  for p in llama-off-gqa llama-on-gqa gpt2-1p3b-recompute-off gpt2-1p3b-recompute-on; do
    [ -f "$plans/$p.sharded.pt" ] || continue
    log=$out/logs/$p-$mode
    timeout 200 "$B" "$plans/$p.sharded.pt" --data /tmp/tok.bin --steps 23 --micro-batch 8 --seq-len 1024 \
      --lr 1e-4 --schedule constant --clip-grad 1.0 --device cuda --log-file "$log.jsonl" \
      --log-every 1 --profile 21:23 --profile-trace "$log.trace.json" > "$log.out" 2>&1
    rc=$?
    python3 - "$log" "$p" "$mode" "$rc" <<'PY'
import json, sys
log, p, mode, rc = sys.argv[1:]
steps = [json.loads(l) for l in open(log + ".jsonl") if '"loss"' in l]
timed = [s for s in steps if 5 < s.get("step", 0) <= 19]
tps = sum(s["tokens"] for s in timed) / sum(s["tokens"] / s["tokens_per_s"] for s in timed) if timed else 0
tr = json.load(open(log + ".trace.json"))
ev = [e for e in tr.get("traceEvents", []) if e.get("cat") == "kernel"]
fused = {}
for e in ev:
    if e["name"].startswith("bmt_fused_row"):
        k = e["name"].rsplit("_", 1)[-1]
        fused[k] = fused.get(k, 0) + e["dur"] / 3e3
print(f"prefetch {mode:8} {p:26} exit {rc}  {tps:9,.0f} tokens/s  row kernels ms/step "
      + "  ".join(f"{k} {v:.2f}" for k, v in sorted(fused.items())))
PY
    rm -f "$log.trace.json"
  done
done
tar -czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
