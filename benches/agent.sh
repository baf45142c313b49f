#!/usr/bin/env bash
# The agent's own cost: CPU time per interval (from /proc/PID/stat) at 100 ms and 1 s rows,
# with and without perf counters, while a host records it over TCP on this machine; and its
# effect on a CPU-bound workload (iterations in 5 s with and without an agent at 100 ms).
#   cargo build --release && sudo bash benches/agent.sh
# Run as root (record needs tracefs). Prints one table; nothing is timed against a bound.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${VIRTPROF:-target/release/virtprof}
seconds=${SECONDS_PER_RUN:-10}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
echo "bench-agent-token-0001" > "$work/token"
ticks=$(getconf CLK_TCK)

cpu_ns() { awk -v t="$ticks" '{ print ($14 + $15) * 1e9 / t }' "/proc/$1/stat"; }

run() {
    local interval=$1 perf=$2 port=$((9600 + RANDOM % 300))
    "$bin" agent --listen "tcp:127.0.0.1:$port" --token-file "$work/token" --interval "$interval" \
        $perf 2> "$work/agent.log" &
    sleep 0.5; kill -0 $! 2>/dev/null || { cat "$work/agent.log" >&2; exit 1; }
    local agent=$!
    sleep 0.5
    local before
    before=$(cpu_ns "$agent")
    "$bin" record -o "$work/r.vprec" -d "${seconds}s" --events sched:sched_switch \
        --agent "tcp:127.0.0.1:$port" --agent-token-file "$work/token" 2> /dev/null
    local after rows
    after=$(cpu_ns "$agent")
    kill "$agent" && wait "$agent" || true
    rows=$("$bin" report "$work/r.vprec" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["guests"][0]["rows"])')
    python3 - "$interval" "${perf:-none}" "$before" "$after" "$rows" "$seconds" <<'PY'
import sys
interval, perf, before, after, rows, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
used = after - before
print(f"{interval:>8} {perf:>7} {rows:>6} {used / max(rows, 1) / 1e3:>14.1f} {100 * used / (seconds * 1e9):>12.3f}")
PY
}

echo "agent on $(nproc) CPUs, $(uname -r), $seconds s per run; CPU from /proc/PID/stat (10 ms ticks)"
printf "%8s %7s %6s %14s %12s\n" interval perf rows "µs CPU / row" "% of a core"
run 100ms ""
run 100ms --perf
run 1s ""
run 1s --perf

loop() { python3 -c 'import time
n, end = 0, time.monotonic() + 5
while time.monotonic() < end: n += 1
print(n)'; }
base=$(loop)
port=$((9900 + RANDOM % 90))
"$bin" agent --listen "tcp:127.0.0.1:$port" --token-file "$work/token" --interval 100ms --perf --sessions 1 2> /dev/null &
sleep 0.3
"$bin" record -o "$work/w.vprec" -d 7s --events sched:sched_switch --agent "tcp:127.0.0.1:$port" \
    --agent-token-file "$work/token" 2> /dev/null &
sleep 1
with=$(loop)
wait
python3 -c "import sys; b, w = int(sys.argv[1]), int(sys.argv[2]); print(f'workload: {b} iterations alone, {w} with the agent at 100 ms (--perf): {100 * (b - w) / b:+.2f}% slower')" "$base" "$with"
