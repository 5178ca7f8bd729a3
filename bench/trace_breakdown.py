"""Where the kernel time of a profiled bmt-run goes, by the op that launched it.

Reads the Chrome trace of `bmt-run --profile A:B --profile-trace FILE`
(Kineto's; with --profile-trace each op records its inputs' sizes and
dtypes) and prints, for the kernels whose launching op matches --op (a
regular expression, default: copies and casts), milliseconds per step
grouped by the launching op, its enclosing op (the ATen op or autograd node
that called it: aten::to, ToCopyBackward0, aten::contiguous, ...) and the
input sizes and dtypes, largest first.

With --gaps it prints instead where the GPU waits: the idle time between
kernels (on any stream) of at least --min-gap microseconds, grouped by the
op that launched the kernel ending the gap and its enclosing op (what the
host was doing while the GPU had nothing to run: launching small kernels,
a synchronization, the optimizer's host work). With --host also the CUDA
runtime calls and the CPU ops that overlap the gaps of the largest group
(time inside the gaps, summed by name: a cudaStreamSynchronize, the ops the
host was still running, the launch of the kernel that ended the gap).

usage: python3 bench/trace_breakdown.py TRACE.json[.gz] --steps N [--op REGEX] [--top K]
       python3 bench/trace_breakdown.py TRACE.json[.gz] --steps N --gaps [--min-gap US]
"""
import argparse
import bisect
import collections
import gzip
import json
import re


def read_events(path):
    """The traceEvents of a Chrome trace file (plain or gzip-compressed JSON)."""
    try:
        with open(path, "rb") as f:
            gz = f.read(2) == b"\x1f\x8b"
        with (gzip.open if gz else open)(path, "rt") as f:
            trace = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SystemExit(f"error: cannot read {path} as a Chrome trace: {e}")
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise SystemExit(f"error: {path} is JSON but not a Chrome trace (no traceEvents list)")
    return [e for e in trace["traceEvents"] if isinstance(e, dict)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--steps", type=int, required=True, help="steps the trace covers")
    ap.add_argument("--op", default=r"aten::(copy_|_to_copy|to|clone|contiguous)$")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--gaps", action="store_true", help="where the GPU is idle between kernels")
    ap.add_argument("--min-gap", type=float, default=10.0, help="with --gaps: microseconds (default 10)")
    ap.add_argument("--host", action="store_true",
                    help="with --gaps: what the host did during the largest group's gaps")
    args = ap.parse_args()
    if args.steps <= 0:
        raise SystemExit(f"error: --steps must be positive (the steps the trace covers), got {args.steps}")
    try:
        pattern = re.compile(args.op)
    except re.error as e:
        raise SystemExit(f"error: --op {args.op!r} is not a regular expression: {e}")
    events = read_events(args.trace)
    if not any(e.get("cat") == "kernel" for e in events):
        raise SystemExit(f"error: {args.trace} has no GPU kernels (a CPU run's trace: bmt-run "
                         "--profile prints the CPU ops' self time itself)")
    ops = [e for e in events if e.get("cat") == "cpu_op" and "dur" in e]
    by_id = {}
    by_thread = collections.defaultdict(list)
    for e in ops:
        ext = e.get("args", {}).get("External id")
        if ext is not None:
            by_id[ext] = e
        by_thread[(e["pid"], e["tid"])].append(e)
    for lst in by_thread.values():
        lst.sort(key=lambda e: (e["ts"], -e["dur"]))
    starts = {k: [e["ts"] for e in v] for k, v in by_thread.items()}

    def enclosing(op):
        """The innermost op on the same thread that encloses `op` and does not match --op."""
        lst, st = by_thread[(op["pid"], op["tid"])], starts[(op["pid"], op["tid"])]
        best = None
        for e in lst[:bisect.bisect_right(st, op["ts"])][-400:]:
            if e is op or e["ts"] + e["dur"] < op["ts"] + op["dur"]:
                continue
            if pattern.search(e["name"]) or e["name"].startswith("aten::copy"):
                continue
            if best is None or e["dur"] <= best["dur"]:
                best = e
        return best["name"] if best else "-"

    if args.gaps:
        print_gaps(events, by_id, enclosing, args)
        return
    groups = collections.defaultdict(lambda: [0.0, 0])
    total = matched = 0.0
    for k in events:
        if k.get("cat") != "kernel":
            continue
        total += k["dur"]
        op = by_id.get(k.get("args", {}).get("External id"))
        if op is None or not pattern.search(op["name"]):
            continue
        matched += k["dur"]
        a = op.get("args", {})
        key = (op["name"], enclosing(op), str(a.get("Input Dims", ""))[:70], str(a.get("Input type", ""))[:50])
        groups[key][0] += k["dur"]
        groups[key][1] += 1
    s = args.steps
    print(f"kernel time {total / 1e3 / s:.2f} ms a step; matching {args.op}: {matched / 1e3 / s:.2f} ms "
          f"({100 * matched / max(total, 1):.1f} %)")
    print_top(groups, args, "launches", "op <- enclosing op  input sizes  dtypes")


def print_top(groups, args, count, heading):
    """The --top groups (key -> [microseconds, count]) by time, per step."""
    s = args.steps
    print(f"{'ms/step':>8} {count:>8}  {heading}")
    for key, (us, n) in sorted(groups.items(), key=lambda kv: -kv[1][0])[:args.top]:
        print(f"{us / 1e3 / s:8.3f} {n / s:8.1f}  {key[0]} <- {'  '.join(key[1:])}")


def print_gaps(events, by_id, enclosing, args):
    """Idle GPU time between kernels, by the op launching the kernel after each gap."""
    kernels = sorted((e for e in events if e.get("cat") == "kernel" and "dur" in e), key=lambda e: e["ts"])
    groups = collections.defaultdict(lambda: [0.0, 0])
    intervals = collections.defaultdict(list)  # key -> the gaps' (start, end)
    busy_until = None
    total_idle = 0.0
    for k in kernels:
        if busy_until is not None and k["ts"] - busy_until >= args.min_gap:
            gap = k["ts"] - busy_until
            total_idle += gap
            op = by_id.get(k.get("args", {}).get("External id"))
            key = (op["name"], enclosing(op)) if op else (f"(no op: {k['name'][:40]})", "-")
            groups[key][0] += gap
            groups[key][1] += 1
            intervals[key].append((busy_until, k["ts"]))
        end = k["ts"] + k["dur"]
        busy_until = end if busy_until is None else max(busy_until, end)
    span = busy_until - kernels[0]["ts"]
    s = args.steps
    print(f"GPU span {span / 1e3 / s:.2f} ms a step; idle in gaps of >= {args.min_gap:g} us: "
          f"{total_idle / 1e3 / s:.2f} ms a step ({100 * total_idle / max(span, 1):.1f} %)")
    print_top(groups, args, "gaps", "op launching the kernel after the gap <- enclosing op")
    if args.host and groups:
        key = max(groups, key=lambda k: groups[k][0])
        print_host_during(events, sorted(intervals[key]), key, args)


def print_host_during(events, gaps, key, args):
    """The CUDA runtime calls and CPU ops overlapping `gaps`, by time inside them."""
    starts = [g[0] for g in gaps]

    def inside(e):
        """Microseconds of event `e` inside the gaps."""
        t0, t1 = e["ts"], e["ts"] + e["dur"]
        total = 0.0
        for a, b in gaps[max(0, bisect.bisect_right(starts, t0) - 1):bisect.bisect_right(starts, t1)]:
            total += max(0.0, min(b, t1) - max(a, t0))
        return total

    for cat, title in (("cuda_runtime", "CUDA runtime calls"), ("cpu_op", "CPU ops (inclusive)")):
        groups = collections.defaultdict(lambda: [0.0, 0])
        for e in events:
            if e.get("cat") != cat or "dur" not in e:
                continue
            t = inside(e)
            if t > 0:
                groups[(e["name"][:90],)][0] += t
                groups[(e["name"][:90],)][1] += 1
        print(f"-- during the gaps before {key[0]} <- {key[1]}: {title}")
        s = args.steps
        print(f"{'ms/step':>8} {'events':>8}  name")
        for (name,), (us, n) in sorted(groups.items(), key=lambda kv: -kv[1][0])[:args.top]:
            print(f"{us / 1e3 / s:8.3f} {n / s:8.1f}  {name}")


if __name__ == "__main__":
    main()
