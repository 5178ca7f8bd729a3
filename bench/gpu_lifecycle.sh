#!/usr/bin/env bash
# The run-lifecycle and integrity checks on CUDA that the CPU suite makes on
# CPU ranks (test_bmt_run.py, test_checkpoint.py): the memory check against
# the device's free memory, SIGTERM finishing the step and saving, a resume
# continuing the uninterrupted run, a flipped byte in a checkpoint refused
# on resume, a flipped byte in sharded.pt's weights refused, and a final
# save onto a full tmpfs exiting 1. Each check prints `PASS name` or
# `FAIL name: why`; the script exits 1 if any failed.
#
# usage (on the GPU machine, in a checkout): bash bench/gpu_lifecycle.sh PLAN OUT
#   PLAN: a tiny plan with its weights, e.g. tiny-fused/gpt2.sharded.pt of
#         bench/make_parity_plans.py
# env: VOCAB (the plan's vocabulary, 128), DEVICE (cuda), TERM_AFTER (seconds
#      before the SIGTERM, 25), B (a built bmt-run: no build)
set -o pipefail
plan=$1; out=$2; mkdir -p "$out"
[ -n "${B:-}" ] || source bench/gpu_build.sh "$out"  # B=bmt-run: use a built one
export BMT_KERNEL_CACHE=/tmp/bmt-kernels
fails=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; fails=$((fails + 1)); }
vocab=${VOCAB:-128}  # the tiny models of scripts/architectures.py
python3 bench/random_tokens.py /tmp/tok.bin 4000000 "$vocab"
common=(--data /tmp/tok.bin --micro-batch 4 --seq-len 12 --lr 1e-3 --schedule constant --device "${DEVICE:-cuda}")

# 1. memory: a micro-batch no GPU holds is refused before step 1, naming both numbers.
$B "$plan" "${common[@]}" --steps 2 --micro-batch 50000000 > "$out/memory.out" 2>&1
rc=$?
if [ $rc -ne 0 ] && grep -q "allocates at least" "$out/memory.out" && ! grep -q "^step" "$out/memory.out"; then
  pass "memory check ($(grep -m1 error "$out/memory.out"))"
else fail "memory check" "exit $rc: $(tail -2 "$out/memory.out")"; fi

# 2. the uninterrupted reference: 40 steps.
$B "$plan" "${common[@]}" --steps 40 --log-file "$out/ref.jsonl" > "$out/ref.out" 2>&1 || fail reference "exit $?"

# 3. SIGTERM mid-run: finishes the step, saves, one line, exit 143.
rm -rf /tmp/ck; $B "$plan" "${common[@]}" --steps 1000000 --checkpoint-dir /tmp/ck \
  --log-file "$out/term.jsonl" > "$out/term.out" 2>&1 &
pid=$!; sleep ${TERM_AFTER:-25}; kill -TERM $pid; wait $pid; rc=$?
last=$(ls -d /tmp/ck/step-* 2>/dev/null | tail -1)
if [ $rc -eq 143 ] && [ -n "$last" ] && [ -f "$last/COMPLETE" ]; then
  pass "SIGTERM (exit 143, saved $(basename "$last"): $(grep -i -m1 "signal\|SIGTERM" "$out/term.out"))"
else fail SIGTERM "exit $rc, checkpoint '${last}': $(tail -3 "$out/term.out")"; fi

# 4. resume from a step-20 checkpoint of a 40-step run: the losses after it against the reference.
rm -rf /tmp/ck2; $B "$plan" "${common[@]}" --steps 20 --checkpoint-dir /tmp/ck2 > "$out/first.out" 2>&1
$B "$plan" "${common[@]}" --steps 40 --checkpoint-dir /tmp/ck2 --resume auto \
  --log-file "$out/resumed.jsonl" > "$out/resumed.out" 2>&1; rc=$?
python3 - "$out/ref.jsonl" "$out/resumed.jsonl" $rc <<'PY' || fails=$((fails + 1))
import json, sys
ref, res, rc = sys.argv[1], sys.argv[2], int(sys.argv[3])
load = lambda f: {x["step"]: x["loss"] for x in map(json.loads, open(f)) if x.get("kind") == "train"}
a, b = load(ref), load(res)
steps = sorted(set(a) & set(b))
d = max((abs(a[s] - b[s]) for s in steps), default=float("nan"))
ok = rc == 0 and steps and steps[0] == 21 and steps[-1] == 40 and d == 0.0
print(("PASS" if ok else "FAIL") + f" resume on CUDA: steps {steps[:1]}..{steps[-1:]} exit {rc}, "
      f"max |loss - uninterrupted| {d:.3g} (bit-exact: {d == 0.0})")
sys.exit(0 if ok else 1)
PY

# 5. a flipped byte in the checkpoint's shard: the resume is refused.
f=/tmp/ck2/step-00000020/rank-00000.safetensors
python3 - "$f" <<'PY'
import sys, struct
p = sys.argv[1]; b = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", b[:8])[0]; b[8 + n + 100] ^= 0x40; open(p, "wb").write(b)
PY
rm -rf /tmp/ck3; cp -r /tmp/ck2/step-00000020 /tmp/ck3
$B "$plan" "${common[@]}" --steps 40 --resume /tmp/ck3 > "$out/corrupt.out" 2>&1; rc=$?
if [ $rc -ne 0 ] && grep -qiE "crc|checksum" "$out/corrupt.out" && ! grep -q "^step" "$out/corrupt.out"; then
  pass "corrupt checkpoint ($(grep -m1 -iE "crc|checksum" "$out/corrupt.out" | cut -c1-200))"
else fail "corrupt checkpoint" "exit $rc: $(tail -2 "$out/corrupt.out")"; fi

# 6. a flipped byte in sharded.pt's weights: refused (if this build checks them).
python3 - "$plan" /tmp/bad.sharded.pt <<'PY'
import sys, zipfile
src, dst = sys.argv[1], sys.argv[2]
z = zipfile.ZipFile(src)
info = max((i for i in z.infolist() if "/weights/" in i.filename), key=lambda i: i.file_size)
raw = bytearray(open(src, "rb").read())
start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
raw[start + info.file_size // 2] ^= 0x10
open(dst, "wb").write(raw)
print("flipped a byte of", info.filename)
PY
$B /tmp/bad.sharded.pt "${common[@]}" --steps 2 > "$out/badplan.out" 2>&1; rc=$?
if [ $rc -ne 0 ] && ! grep -q "^step" "$out/badplan.out"; then
  pass "corrupt sharded.pt weight ($(grep -m1 error "$out/badplan.out"))"
else fail "corrupt sharded.pt weight" "exit $rc: $(tail -2 "$out/badplan.out")"; fi

# 7. the last save onto a full disk: exit 1 naming the lost state.
mkdir -p /tmp/full && if mount -t tmpfs -o size=64k tmpfs /tmp/full 2>/dev/null; then
  $B "$plan" "${common[@]}" --steps 3 --checkpoint-dir /tmp/full/ck > "$out/full.out" 2>&1; rc=$?
  if [ $rc -eq 1 ]; then pass "full disk ($(grep -m1 error "$out/full.out"))"
  else fail "full disk" "exit $rc: $(tail -2 "$out/full.out")"; fi
  umount /tmp/full
else echo "SKIP full disk: mount -t tmpfs is not allowed here"; fi

echo "$fails failed"
[ $fails -eq 0 ]
