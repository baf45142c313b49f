#!/usr/bin/env bash
# The long fuzzing run: ITERS inputs (default 1 000 000) per target, in release, through
#   crates/trace/tests/fuzz.rs    pages, event formats, header_page (decoder level)
#   crates/session/tests/fuzz.rs  recording (CRC-valid damage), trace.dat, perf.data, a
#                                  host+guest pair's guest, ftrace text, and bombs (trace.dat
#                                  and perf.data whose sizes are claims: shared, repeated or
#                                  over-expanding chunks, support/bombs.rs; a tenth as many)
#                                  (whole sources through Session and two analyzers)
#   crates/agent/tests/fuzz.rs    agent: the guest link's frame decoder (untrusted guests)
#   cli serve::http::request      http: serve's request-head parser (untrusted clients)
# TARGETS picks some of them (default: all nine). Each whole-source target runs as SHARDS
# processes with their own seeds (default: one per CPU). Any panic, abort (a runaway
# allocation meets the 8 GiB address-space limit) or hang (an input over 20 s) fails the run
# and names the seed and iteration to replay; a hang also saves its input to
# /tmp/virtprof-fuzz-hang.bin. Prints per target: inputs, panics, aborts, hangs and peak RSS,
# and saves them to benches/results/DATE-fuzz-TARGETS.txt (logs in target/fuzz-logs).
set -euo pipefail
cd "$(dirname "$0")/.."
ITERS=${ITERS:-1000000}
SHARDS=${SHARDS:-$(nproc)}
TARGETS=${TARGETS:-decoders recording tracedat perfdata pair text bombs agent http}
out=benches/results/$(date +%F)-fuzz-$(echo "$TARGETS" | tr ' ' '-').txt
# Kept after the run: a failure's seed, iteration and backtrace are in the target's logs.
work=target/fuzz-logs
rm -rf "$work" && mkdir -p "$work"
cargo test --release -q -p virtprof-trace -p virtprof-session -p virtprof-agent --test fuzz --no-run 2>/dev/null
cargo test --release -q -p virtprof-cli --bin virtprof --no-run 2>/dev/null

failed=0
summary() { # target inputs status log
    local target=$1 inputs=$2 status=$3 log=$4
    local panics=0 aborts=0 hangs=0
    grep -q "PANIC" "$log" && panics=1
    grep -q "HANG" "$log" && hangs=1
    [ "$status" -ne 0 ] && [ $panics -eq 0 ] && [ $hangs -eq 0 ] && aborts=1
    local rss
    rss=$(grep -o 'peak RSS [0-9]* MiB' "$log" | awk '{print $3}' | sort -n | tail -1)
    printf '%-10s %9s inputs  panics %d  aborts %d  hangs %d  peak RSS %s MiB\n' \
        "$target" "$inputs" "$panics" "$aborts" "$hangs" "${rss:-?}"
    if [ "$status" -ne 0 ]; then
        failed=1
        grep -h "PANIC\|HANG\|panicked at\|memory allocation" "$log" | head -5 | sed 's/^/    /'
    fi
}

{
    echo "# virtprof fuzzing, $(date -u +%FT%TZ), $(git rev-parse --short HEAD), $ITERS inputs per target, $SHARDS shards"
    for target in $TARGETS; do
        if [ "$target" = agent ] || [ "$target" = http ]; then
            log=$work/$target.log
            status=0
            if [ "$target" = agent ]; then
                VIRTPROF_FUZZ_ITERS=$ITERS cargo test --release -q -p virtprof-agent --test fuzz -- --nocapture >"$log" 2>&1 || status=$?
            else
                VIRTPROF_FUZZ_ITERS=$ITERS cargo test --release -q -p virtprof-cli --bin virtprof fuzz_request_heads -- --nocapture >"$log" 2>&1 || status=$?
            fi
            summary "$target" "$ITERS" "$status" "$log"
            continue
        fi
        if [ "$target" = decoders ]; then
            log=$work/trace.log
            status=0
            VIRTPROF_FUZZ_ITERS=$ITERS cargo test --release -q -p virtprof-trace --test fuzz -- --nocapture >"$log" 2>&1 || status=$?
            summary "decoders" "$ITERS" "$status" "$log"
            continue
        fi
        per_shard=$(( (ITERS + SHARDS - 1) / SHARDS ))
        pids=()
        for shard in $(seq 0 $((SHARDS - 1))); do
            VIRTPROF_FUZZ_TARGET=$target VIRTPROF_FUZZ_SHARD=$shard VIRTPROF_FUZZ_ITERS=$per_shard \
                cargo test --release -q -p virtprof-session --test fuzz -- --nocapture \
                >"$work/$target.$shard.log" 2>&1 &
            pids+=($!)
        done
        status=0
        for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
        cat "$work"/"$target".*.log > "$work/$target.log"
        inputs=$((per_shard * SHARDS))
        # The bombs target runs a tenth as many inputs (each compresses up to 32 MiB).
        [ "$target" = bombs ] && inputs=$(( (per_shard + 9) / 10 * SHARDS ))
        summary "$target" "$inputs" "$status" "$work/$target.log"
    done
} | tee "$out"
echo "saved in $out; logs in $work"
exit $failed
