#!/usr/bin/env bash
# explain's pathology suite, RUNS times: each case injected with known size (testvm VMs),
# recorded and explained; prints every run's table (expected cause, causes named in rank
# order, the contention share's error against schedstat) and the precision and recall of
# the first-named cause over all runs. The same cases are the test
# it::explain::explain_names_each_injected_cause_first_with_its_size (crates/cli/tests/it/explain.rs).
#
#   benches/explain_suite.sh [RUNS]      (root, /dev/kvm, tracefs; default 3 runs)
set -euo pipefail
runs=${1:-3}
cd "$(dirname "$0")/.."
cargo build --release -q -p virtprof-cli --tests
hits=0 named=0 expected=0
for i in $(seq "$runs"); do
    out=$(cargo test --release -q -p virtprof-cli --test tests explain_names -- --nocapture --test-threads 1 2>&1) || true
    echo "run $i:"
    echo "$out" | sed -n '/^CASE/,/^precision/p'
    line=$(echo "$out" | grep '^precision')
    h=$(echo "$line" | sed -E 's/precision ([0-9]+)\/([0-9]+), recall ([0-9]+)\/([0-9]+)/\1/')
    n=$(echo "$line" | sed -E 's/precision ([0-9]+)\/([0-9]+), recall ([0-9]+)\/([0-9]+)/\2/')
    e=$(echo "$line" | sed -E 's/precision ([0-9]+)\/([0-9]+), recall ([0-9]+)\/([0-9]+)/\4/')
    hits=$((hits + h)) named=$((named + n)) expected=$((expected + e))
done
echo "over $runs runs: precision $hits/$named, recall $hits/$expected of the first-named cause"
