#!/bin/sh
# VrtProf (seed 000), Figures 2-4 on real workloads: each workload of the workload guest run
# natively and in the guest, several runs each, under `virtprof record --interval 100ms
# --agent`; per workload and over all of them (the paper's matrices average its benchmarks),
# `virtprof compare NATIVE-RUNS --vs GUEST-RUNS`: rates with their spread, the correlation
# changes beyond the runs' spread, the difference matrix, each run's exit rate over time (one
# HTML page each).
#
#   sh benches/papers/vrtprof.sh [OUT]      (default target/papers/vrtprof)
#
# RUNS (default 3), SECONDS_EACH (default 10), WORKLOADS (default "stress sqlite compress build
# web"), RUN_ARGS (more run.sh options, e.g. "--nested": the guest is L2 on kvm_amd, the native
# side runs in L1). Run again into the same OUT, it keeps the runs that succeeded and does the
# rest. What this host cannot give is said,
# never made up: the paper's hardware events need a PMU (none here: the host's and the guest's
# cycles/instructions are refused with the kernel's reason), and without VMX/SVM the guest runs
# under QEMU TCG, which emulates every instruction: its differences from native are emulation's
# as much as virtualization's (RUN_ARGS=--nested runs it as a KVM guest of the nested bed).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-$root/target/papers/vrtprof}
runs=${RUNS:-3} seconds=${SECONDS_EACH:-10}
workloads=${WORKLOADS:-stress sqlite compress build web}
virtprof=${VIRTPROF:-$root/target/debug/virtprof}
mkdir -p "$out"

echo "vrtprof.sh: $runs runs of ${seconds}s for each of: $workloads; natively and in the guest ${RUN_ARGS:-}" >&2
grep -qwE 'vmx|svm' /proc/cpuinfo || case " ${RUN_ARGS:-} " in
    *" --nested "*) ;;
    *) echo "vrtprof.sh: no VMX/SVM here: the guest runs under QEMU TCG (emulated), not as a KVM guest" >&2 ;;
esac
for w in $workloads; do
    for side in native guest; do
        i=1
        while [ "$i" -le "$runs" ]; do
            flag= run=$out/$w-$side-$i
            [ "$side" = native ] && flag=--native
            # Done before (a study run again after a failure): kept.
            if [ -s "$run.vprec" ] && grep -q WG-RESULT "$run.result" 2>/dev/null; then
                i=$((i + 1))
                continue
            fi
            # shellcheck disable=SC2086 # options are words
            if ! sh "$root/scripts/workload-guest/run.sh" $flag ${RUN_ARGS:-} --seconds "$seconds" --interval 100ms \
                -o "$run.vprec" "$w" 2> "$run.log" > "$run.result" || ! grep -q WG-RESULT "$run.result"; then
                # A failed run's recording is not one of the side's runs.
                [ -e "$run.vprec" ] && mv "$run.vprec" "$run.vprec.failed"
                echo "vrtprof.sh: $w ($side, run $i) failed: see $run.log and $run.result" >&2
            fi
            i=$((i + 1))
        done
    done
    "$virtprof" compare "$out/$w"-native-*.vprec --vs "$out/$w"-guest-*.vprec --json --matrix > "$out/$w.json"
    "$virtprof" compare "$out/$w"-native-*.vprec --vs "$out/$w"-guest-*.vprec --html "$out/$w.html" 2> /dev/null
done
# The paper's matrices are averages over its benchmarks: every native run against every guest run.
# Every pair's change (--top: all of them), for the summary's own selection below.
"$virtprof" compare "$out"/*-native-*.vprec --vs "$out"/*-guest-*.vprec --json --matrix --top 1000000 > "$out/all.json"
"$virtprof" compare "$out"/*-native-*.vprec --vs "$out"/*-guest-*.vprec --html "$out/all.html" --top 25 2> /dev/null

# The summary: each workload's own count per side, and the correlation changes beyond spread.
python3 - "$out" $workloads <<'PY'
import glob, json, statistics, sys
out, workloads = sys.argv[1], sys.argv[2:]
def results(w, side):
    vals = []
    for f in sorted(glob.glob(f"{out}/{w}-{side}-*.result")):
        for line in open(f):
            if line.startswith("WG-RESULT"):
                kv = dict(p.split("=", 1) for p in line.split()[1:] if "=" in p)
                vals.append((float(kv["ops"]) / float(kv["seconds"]), kv["unit"]))
    return vals
print("## Workloads, each side's own count per second (mean ± sd over runs)\n")
print("| workload | unit | native | guest | guest / native |")
print("|---|---|---|---|---|")
for w in workloads:
    n, g = results(w, "native"), results(w, "guest")
    if not n or not g:
        print(f"| {w} | | {'-' if not n else ''} | {'-' if not g else ''} | |")
        continue
    f = lambda v: f"{statistics.mean(x for x, _ in v):,.1f} ± {statistics.stdev(x for x, _ in v) if len(v) > 1 else 0:,.1f}"
    ratio = statistics.mean(x for x, _ in g) / statistics.mean(x for x, _ in n)
    print(f"| {w} | {n[0][1]}/s | {f(n)} | {f(g)} | {ratio:.3f} |")
a = json.load(open(f"{out}/all.json"))
# Pairs both sides define (a metric the native side has no source for, such as the guest's
# eth0, is no change under virtualization), largest changes first.
both = [c for c in a["changes"] if c["r_in_a"] is not None and c["r_in_b"] is not None]
beyond = [c for c in both if c["beyond_spread"]]
print(f"\n## Correlation changes, native ({len(a['a'])} runs) -> guest ({len(a['b'])} runs), all workloads\n")
print(f"{len(both)} pairs defined on both sides; {len(beyond)} changed beyond the runs' spread. The 20 largest:\n")
print("| change | metric | metric | native r | guest r | beyond spread |")
print("|---|---|---|---|---|---|")
show = lambda r, sd: f"{r:+.2f}" + ("" if sd is None else f" ± {sd:.2f}")
for c in both[:20]:
    print(f"| {c['change']:+.2f} | {c['a']} | {c['b']} | {show(c['r_in_a'], c['a_sd'])} | {show(c['r_in_b'], c['b_sd'])} | {'yes' if c['beyond_spread'] else ''} |")
PY
echo "vrtprof.sh: pages in $out (all.html: every workload; WORKLOAD.html: one each)" >&2
