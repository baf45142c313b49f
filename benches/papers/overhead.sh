#!/bin/sh
# VrtProf (seed 000), Table IV: what recording costs the recorded. Each workload of the
# workload guest run in the guest without `virtprof record` (its agent idles, listening) and
# under `virtprof record --interval T --agent` for each T of INTERVALS (100ms: the VrtProf
# study's setting), the conditions taking turns run by run so that a drift of the host weighs
# on each alike. Per workload and condition: the workload's own rate (mean ± sd, n); the
# overhead is the time per operation recorded over unrecorded, less 1 (the paper's run time
# with VrtProf over without, less 1), with its standard error, and whether it exceeds twice
# that.
#
#   sh benches/papers/overhead.sh [OUT]      (default target/papers/overhead)
#
# RUNS (default 5 per condition), SECONDS_EACH (default 10), WORKLOADS (default "stress sqlite
# compress build web"), INTERVALS (default "100ms"; the paper also ran its lowest rate: add
# "1s"). Run again into the same OUT, it keeps the runs that succeeded and does the rest.
# Without VMX/SVM the guest runs under QEMU TCG: the recording's cost is then measured against
# an emulated guest, whose own slowness hides part of it (said in the table).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-$root/target/papers/overhead}
runs=${RUNS:-5} seconds=${SECONDS_EACH:-10}
workloads=${WORKLOADS:-stress sqlite compress build web}
intervals=${INTERVALS:-100ms}
study=overhead.sh
mkdir -p "$out"
. "$here/common.sh"
for t in $intervals; do
    case $t in *[0-9]ms | *[0-9]s) ;; *) echo "overhead.sh: INTERVALS takes times such as 100ms or 1s, not '$t'" >&2; exit 2 ;; esac
done
study_binary
study_accel
echo "overhead.sh: $runs runs of ${seconds}s for each of: $workloads; in the guest, not recorded and recorded every $intervals" >&2
study_plan "$(study_count "$runs" "$workloads" "bare $intervals")" "$seconds"
study_inputs
study_manifest RUNS="$runs" SECONDS_EACH="$seconds" WORKLOADS="$workloads" INTERVALS="$intervals"
for w in $workloads; do
    i=1
    while [ "$i" -le "$runs" ]; do
        for condition in bare $intervals; do
            name=$w-$condition-$i
            run=$out/$name
            # Done before (a study run again after a failure): kept.
            grep -q WG-RESULT "$run.result" 2> /dev/null && continue
            if [ "$condition" = bare ]; then
                set -- --no-record
            else
                set -- --interval "$condition" -o "$run.vprec"
            fi
            study_run "$name" "$run.log" "$run.result" sh "$root/scripts/workload-guest/run.sh" \
                --seconds "$seconds" "$@" "$w" && grep -q WG-RESULT "$run.result" ||
                echo "overhead.sh: $w ($condition, run $i) failed: see $run.log and $run.result" >&2
            # What the recording lost, beside its run (the table says it).
            if [ -s "$run.vprec" ]; then
                "$virtprof" report --json "$run.vprec" 2>> "$run.log" | python3 -c 'import json, sys
d = json.load(sys.stdin)
json.dump({k: d.get(k) for k in ("events", "lost_events", "duration_s")}, sys.stdout)' > "$run.recorded.json" || true
                [ -n "${KEEP_RECORDINGS:-}" ] || rm -f "$run.vprec"
            fi
        done
        i=$((i + 1))
    done
done

python3 "$here/overhead_table.py" "$out" "$workloads" "$intervals"
study_pack
