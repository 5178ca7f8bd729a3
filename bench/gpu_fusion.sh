#!/usr/bin/env bash
# The elementwise fusion on one GPU: build bmt-run (runtime only), check the
# fused and plain plans of the 14 tiny architectures against eager PyTorch
# in fp32 and bf16 (bench/gpu_parity.py, about 2 minutes),
# then time bmt-run on the Llama-3.2-1B-shaped model (bench/make_llama_1b.py)
# with and without the fusion, recompute on and off, on the same random
# tokens, and print tokens/s, peak memory, the losses of both (the same data
# and init: they must agree to bf16 noise) and the fused run's profile.
#
# usage (on the GPU machine, in a checkout): bash bench/gpu_fusion.sh PLANS OUT
#   PLANS: tiny-fused/NAME.sharded.pt, tiny-plain/NAME.sharded.pt (the tiny
#          architectures compiled by the default pipeline, which fuses, and with
#          bmt-opt --fuse-elementwise=false), optionally tiny-{fused,plain}-bf16/ (the
#          same in bf16): `python3 bench/make_parity_plans.py PLANS --plain` writes
#          all four for every architecture (NAMES: default all; a subset, e.g. the
#          fixture names "gpt2 llama bert t5", for an older PLANS folder),
#          llama-{on,off}-{plain,fused,inline,gqa}.sharded.pt (--random-init,
#          --checkpoint all (on) or none (off); plain: --fuse-elementwise=false;
#          fused: the default pipeline's fusion; inline: the same with
#          fuse-inline-calls=true said explicitly (now its default);
#          gqa: fused with --grouped-query-attention)
# env: VARIANTS (default "off-plain off-fused on-plain on-fused"; empty: none), SKIP_PARITY=1,
#      NAMES (default "all": the architectures gpu_parity.py checks),
#      GTEST_SOURCE=<googletest folder>: also build bmt-runtime-unit-tests and
#      run its FusionCuda.* tests (the generated kernels against ATen on the GPU)
#      and AdamCuda.* (the Adam step that writes the bf16 shards, against ATen's),
#      and ColumnSum* (bias gradients and row partials, against float64 sums),
#      REFERENCE="off on" (the FSDP2 + torch.compile runs; empty: none),
#      PROFILES (default "llama-off-fused llama-off-plain": the runs whose
#      profile is printed, with a breakdown of their copy and elementwise
#      kernels by launching op from the Chrome trace, bench/trace_breakdown.py).
set -o pipefail
plans=$1; out=$2; mkdir -p "$out/logs"
source bench/gpu_build.sh "$out/logs"
export BMT_KERNEL_CACHE=/tmp/bmt-kernels
VARIANTS=${VARIANTS-off-plain off-fused on-plain on-fused}
REFERENCE=${REFERENCE-off on}
if [ -n "${GTEST_SOURCE:-}" ]; then
  echo "== FusionCuda, AdamCuda and ColumnSum unit tests"
  ./build-gpu/test/bmt-runtime-unit-tests --gtest_filter='FusionCuda.*:Fusion.*:AdamCuda.*:AdamLowPrecision.*:ColumnSum*' 2>&1 | tee "$out/logs/unit.log" \
    | grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|difference|\[ note \]" | head -30
fi
if [ -z "${SKIP_PARITY:-}" ]; then
read -r -a names <<< "${NAMES:-all}"
echo "== parity, fused plans (fp32)"; python3 bench/gpu_parity.py "$B" "$plans/tiny-fused" "${names[@]}" --jobs 4 2>&1 | tee "$out/logs/parity-fused.log" | grep -v Warning | tail -16
if [ -d "$plans/tiny-plain" ]; then
  echo "== parity, plain plans (fp32)"; python3 bench/gpu_parity.py "$B" "$plans/tiny-plain" "${names[@]}" --jobs 4 2>&1 | tee "$out/logs/parity-plain.log" | grep -v Warning | tail -2
fi
for v in fused plain; do
  [ -d "$plans/tiny-$v-bf16" ] || continue
  echo "== parity, $v plans (bf16 against float32, bound: 2 x eager bf16's difference)"
  python3 bench/gpu_parity.py "$B" "$plans/tiny-$v-bf16" "${names[@]}" --dtype bfloat16 --jobs 4 2>&1 \
    | tee "$out/logs/parity-$v-bf16.log" | grep -E "\(bf16\)|worst|failed|not compiled|no such"
done
fi
python3 bench/random_tokens.py /tmp/tok.bin $(( 30 * 8 * 1025 * 2 )) 128256
PROFILES=${PROFILES-llama-off-fused llama-off-plain}
for v in $VARIANTS; do
  p=llama-$v
  trace=()
  case " $PROFILES " in *" $p "*) trace=(--profile-trace "$out/logs/$p.trace.json");; esac
  timeout 150 "$B" "$plans/$p.sharded.pt" --data /tmp/tok.bin --steps 23 --micro-batch 8 --seq-len 1024 \
    --lr 1e-4 --schedule constant --clip-grad 1.0 --device cuda --log-file "$out/logs/$p.jsonl" \
    --log-every 1 --profile 21:23 "${trace[@]}" > "$out/logs/$p.out" 2>&1
  echo "$p: exit $?"
done
python3 - "$out/logs" $VARIANTS <<'PY'
import json, sys, os
d = sys.argv[1]
runs = {}
for p in ["llama-" + v for v in sys.argv[2:]]:
    f = os.path.join(d, p + ".jsonl")
    if not os.path.exists(f):
        continue
    steps = [json.loads(l) for l in open(f) if '"train"' in l or '"loss"' in l]
    steps = [s for s in steps if "loss" in s and "step" in s]
    # Step 20 ends the queued run before the profile window (21-23) and also
    # counts the device's lag behind the host: steps 6-19 are timed.
    timed = [s for s in steps if 5 < s["step"] <= 19]
    if not timed:
        continue
    tps = sum(s["tokens"] for s in timed) / sum(s["tokens"] / s["tokens_per_s"] for s in timed)
    peak = max(s.get("peak_mem_gib", 0) for s in steps)
    runs[p] = (tps, peak, [round(s["loss"], 4) for s in steps[:20:4]])
    print(f"{p:16} {tps:9,.0f} tokens/s  peak {peak:5.1f} GiB  losses {runs[p][2]}")
for r in ["off", "on"]:
    for v in ["fused", "inline", "gqa"]:
        a, b = runs.get(f"llama-{r}-plain"), runs.get(f"llama-{r}-{v}")
        if a and b:
            print(f"recompute {r}: {v} / plain = {b[0] / a[0]:.3f}")
PY
for r in $REFERENCE; do
  echo "== fsdp2-compile llama recompute $r"
  timeout 240 python3 bench/gpu_speed.py --reference fsdp2-compile --arch llama --recompute $r \
    --steps 15 --warmup 5 2>"$out/logs/fsdp2-compile-$r.err" | grep RESULT | cut -c1-300
done
for p in $PROFILES; do
  echo "== $p"; grep -iE "error|fused" "$out/logs/$p.out" | head -5
  sed -n '/profile:/,$p' "$out/logs/$p.out" | grep -v '^step ' | head -${PROFILE_LINES:-32}
  if [ -f "$out/logs/$p.trace.json" ]; then
    echo "== $p: copies and casts by the op that made them (bench/trace_breakdown.py)"
    python3 bench/trace_breakdown.py "$out/logs/$p.trace.json" --steps 3 --top ${BREAKDOWN_LINES:-20}
    echo "== $p: other elementwise kernels outside the fused regions"
    python3 bench/trace_breakdown.py "$out/logs/$p.trace.json" --steps 3 --top ${BREAKDOWN_LINES:-20} \
      --op 'aten::(mul|add|add_|sub|div|neg|cat|pow|sum|mean|fill_|silu|silu_backward|rsqrt|zero_)$'
    echo "== $p: where the GPU waits (idle gaps between kernels)"
    python3 bench/trace_breakdown.py "$out/logs/$p.trace.json" --steps 3 --top ${BREAKDOWN_LINES:-20} --gaps --host
    rm -f "$out/logs/$p.trace.json"
  fi
done
tar -czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
