#!/usr/bin/env bash
# Where one plan's step goes on one GPU: bmt-run (built by bench/gpu_fusion.sh
# or bench/gpu_adamw.sh into build-gpu/) trains PLAN on random tokens below
# VOCAB, prints tokens/s over steps 6 to STEPS-4, the profile of the last
# three steps, and from their Chrome trace the copies and casts by the op
# that made them and the GPU's idle gaps (bench/trace_breakdown.py).
#
# usage (on the GPU machine, in a checkout): bash bench/gpu_profile.sh PLAN VOCAB OUT
# env: STEPS (18), MICRO_BATCH (8), SEQ_LEN (1024), BMT_RUN (build-gpu/bin/bmt-run)
set -o pipefail
plan=$1; vocab=$2; out=$3; mkdir -p "$out"
steps=${STEPS:-18}; mb=${MICRO_BATCH:-8}; seq=${SEQ_LEN:-1024}
site=$(python3 -c 'import torch,os;print(os.path.dirname(os.path.dirname(torch.__file__)))')
export LD_LIBRARY_PATH="$site/torch/lib:$site/nvidia/cu13/lib:$site/nvidia/cuda_nvrtc/lib:${LD_LIBRARY_PATH:-}"
export BMT_KERNEL_CACHE=/tmp/bmt-kernels
python3 bench/random_tokens.py "$out/tok.bin" $(( (steps + 4) * mb * (seq + 1) )) "$vocab"
timeout 300 "${BMT_RUN:-build-gpu/bin/bmt-run}" "$plan" --data "$out/tok.bin" --steps "$steps" \
  --micro-batch "$mb" --seq-len "$seq" --lr 1e-4 --schedule constant --clip-grad 1.0 --device cuda \
  --log-file "$out/log.jsonl" --log-every 1 --profile $((steps - 2)):"$steps" \
  --profile-trace "$out/trace.json" > "$out/run.out" 2>&1
echo "exit $?"
python3 - "$out/log.jsonl" "$steps" <<'PY'
import json, sys
s = [json.loads(l) for l in open(sys.argv[1]) if '"train"' in l]
t = [x for x in s if 5 < x["step"] <= int(sys.argv[2]) - 4]  # not the step before the window
tps = sum(x["tokens"] for x in t) / sum(x["tokens"] / x["tokens_per_s"] for x in t)
print(f"{tps:,.0f} tokens/s, peak {max(x.get('peak_mem_gib', 0) for x in s):.1f} GiB")
PY
sed -n '/profile:/,$p' "$out/run.out" | grep -v '^step ' | head -${PROFILE_LINES:-30}
python3 bench/trace_breakdown.py "$out/trace.json" --steps 3 --top 12
python3 bench/trace_breakdown.py "$out/trace.json" --steps 3 --top 12 --gaps
rm -f "$out/trace.json" "$out/tok.bin"
