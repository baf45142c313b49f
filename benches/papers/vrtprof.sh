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
# RUNS (default 5), SECONDS_EACH (default 10), WORKLOADS (default "stress sqlite compress build
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
runs=${RUNS:-5} seconds=${SECONDS_EACH:-10}
workloads=${WORKLOADS:-stress sqlite compress build web}
study=vrtprof.sh
mkdir -p "$out"
. "$here/common.sh"
study_binary
study_accel
case " ${RUN_ARGS:-} " in
    *" --nested "*) accel_why="the nested-SVM bed: the guest is L2 under kvm_amd in an L1 QEMU TCG emulates, timings are emulation's" ;;
esac
echo "vrtprof.sh: $runs runs of ${seconds}s for each of: $workloads; natively and in the guest ${RUN_ARGS:-}" >&2
study_plan "$(study_count "$runs" "$workloads" "native guest")" "$seconds"
study_inputs
study_manifest RUNS="$runs" SECONDS_EACH="$seconds" WORKLOADS="$workloads" RUN_ARGS="${RUN_ARGS:-}"
for w in $workloads; do
    for side in native guest; do
        i=1
        while [ "$i" -le "$runs" ]; do
            flag= name=$w-$side-$i
            run=$out/$name
            [ "$side" = native ] && flag=--native
            # Done before (a study run again after a failure): kept.
            if [ -s "$run.vprec" ] && grep -q WG-RESULT "$run.result" 2>/dev/null; then
                i=$((i + 1))
                continue
            fi
            # shellcheck disable=SC2086 # options are words
            if ! study_run "$name" "$run.log" "$run.result" sh "$root/scripts/workload-guest/run.sh" $flag ${RUN_ARGS:-} \
                --seconds "$seconds" --interval 100ms -o "$run.vprec" "$w" || ! grep -q WG-RESULT "$run.result"; then
                # A failed run's recording is not one of the side's runs.
                [ -e "$run.vprec" ] && mv "$run.vprec" "$run.vprec.failed"
                echo "vrtprof.sh: $w ($side, run $i) failed: see $run.log and $run.result" >&2
            elif grep -q '"disturbed": true' "$run.guard.json"; then
                # Disturbed after every retry: kept aside, not compared (the tables list it).
                mv "$run.vprec" "$run.vprec.disturbed"
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

python3 "$here/vrtprof_table.py" "$out" "$workloads"
study_pack
echo "vrtprof.sh: pages in $out (all.html: every workload; WORKLOAD.html: one each)" >&2
