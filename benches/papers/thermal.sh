#!/bin/sh
# Thermal balancing (seed 002), Tables 6.1-6.4 on a real guest: the workload guest with two
# vCPUs, its vCPU threads placed one on each host CPU and swapped by `virtprof balance
# --force-hz F --verify` at 0, 1, 10, 20, 100 and 1000 Hz (0: placed and kept, the baseline).
# Per frequency: iperf3's throughput to the guest over virtio-net on a tap (Tables 6.1/6.2),
# the duration of a real build in the guest (tcc compiling and linking 8 files, Table 6.3),
# the swaps requested and realized as the kernel's sched trace saw them (Table 6.4's rows),
# and the energy the model charged each core against the core's busy time.
#
#   sh benches/papers/thermal.sh [OUT]      (default target/papers/thermal)
#
# HZ (default "0 1 10 20 100 1000"), WORKLOADS (default "iperf build"), SECONDS_EACH
# (default 20), RUNS (default 5): the frequencies are taken in a different order in every run
# (rotated), so that a drift of the host over the study does not read as a trend in F. Run
# again into the same OUT, it keeps the runs that succeeded and does the rest. Where the host
# has no VMX/SVM the guest runs under QEMU TCG (its vCPU threads are swapped all the same;
# exits, and the events the energy model weighs, are unknown and listed as such).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-$root/target/papers/thermal}
freqs=${HZ:-0 1 10 20 100 1000} workloads=${WORKLOADS:-iperf build}
seconds=${SECONDS_EACH:-20} runs=${RUNS:-5}
study=thermal.sh
mkdir -p "$out"
. "$here/common.sh"
[ "$(nproc)" -ge 2 ] || { echo "thermal.sh: needs 2 CPUs (one per vCPU)" >&2; exit 2; }
study_binary
study_accel
study_plan "$(study_count "$runs" "$workloads" "$freqs")" "$seconds"
study_inputs
study_manifest HZ="$freqs" WORKLOADS="$workloads" SECONDS_EACH="$seconds" RUNS="$runs"

# Run by run.sh once the guest is ready: the balancer on QEMU's vCPU threads, in the
# background until QEMU exits (it stops by itself when its vCPU threads are gone).
place=$out/place.sh
cat > "$place" <<'EOF'
#!/bin/sh
set -eu
"$VIRTPROF" balance --vm "$1" --cpus 0,1 --force-hz "$THERMAL_HZ" --verify --json \
    > "$THERMAL_OUT.tmp" 2> "$THERMAL_OUT.err" &
echo $! > "$THERMAL_OUT.pid"
# Placed within a moment; a balancer that refused (no such VM, no tracefs) fails the run.
sleep 1
kill -0 "$(cat "$THERMAL_OUT.pid")" || { cat "$THERMAL_OUT.err" >&2; exit 1; }
EOF

# Wait for the balancer of run NAME to finish its report (QEMU is gone by then), at most 20 s.
settle() {
    pid=$(cat "$out/$1.balance.pid" 2> /dev/null || true)
    [ -n "$pid" ] || return 0
    waited=0
    while kill -0 "$pid" 2> /dev/null && [ "$waited" -lt 200 ]; do sleep 0.1; waited=$((waited + 1)); done
    kill -INT "$pid" 2> /dev/null && sleep 2 || true
    rm -f "$out/$1.balance.pid"
    [ -s "$out/$1.balance.tmp" ] && mv "$out/$1.balance.tmp" "$out/$1.balance.json"
    rm -f "$out/$1.balance.tmp"
}

i=1
while [ "$i" -le "$runs" ]; do
    # Rotate the frequencies by the run's number.
    order=$(echo "$freqs" | awk -v r="$i" '{ for (k = 0; k < NF; k++) printf "%s ", $(((k + r - 1) % NF) + 1) }')
    for workload in $workloads; do
        for hz in $order; do
            name=$workload-${hz}hz-$i
            if [ -s "$out/$name.balance.json" ] && grep -q WG-RESULT "$out/$name.result" 2> /dev/null; then
                continue
            fi
            echo "thermal.sh: $workload, vCPUs swapped at $hz Hz, run $i of $runs" >&2
            rm -f "$out/$name.balance.json"
            # The balancer runs beside the guest, started by place.sh: its CPU is the run's.
            THERMAL_HZ=$hz THERMAL_OUT=$out/$name.balance WG_PLACE="sh $place" \
                GUARD_ALSO_PIDFILES=$out/$name.balance.pid \
                study_run "$name" "$out/$name.log" "$out/$name.result" \
                sh "$root/scripts/workload-guest/run.sh" --net tap --seconds "$seconds" --interval 100ms \
                -o "$out/$name.vprec" "$workload" ||
                echo "thermal.sh: $name failed: see $out/$name.log" >&2
            settle "$name"
            # The recordings are large and the tables need none of them (KEEP_RECORDINGS=1 keeps).
            [ -n "${KEEP_RECORDINGS:-}" ] || rm -f "$out/$name.vprec"
        done
    done
    i=$((i + 1))
done

echo "## Thermal balancing (seed 002) on the workload guest, $(date -u +%Y-%m-%d): vCPUs swapped by force"
echo
python3 "$here/thermal_table.py" "$out" "$freqs" "$workloads"
study_pack
