#!/usr/bin/env bash
# One command per study: run it on the best virtualization this host has, and leave a results
# folder anyone can check.
#
#   bash benches/papers/run.sh STUDY [RESULTS]
#
# STUDY: vrtprof, overhead (VrtProf's Table IV), xenmon, xenmon-open (xenmon under an
# open-loop load, RATES requests a second; default 250 500 1000 2000), thermal (the workload
# guest: under KVM where the CPU has VMX or SVM, else under QEMU TCG, said first), bootprof,
# osnoise (the nested-SVM bed: kvm_amd in an emulated L1 on any x86 host), bootprof-arm64 (the
# arm64 bed: arm64 KVM in an emulated L1). The study's own variables (RUNS, SECONDS_EACH, ...)
# pass through; see the top of benches/papers/STUDY.sh.
#
# The study works in target/papers/STUDY (kept for reruns: a study run again does only the
# runs it lacks). RESULTS (default benches/results/papers/STUDY-DATE-ACCEL) gets manifest.json
# (command, versions, inputs checked against pins.sha256, host facts), runs.tar.xz (every
# run's JSON, results, logs and load-guard verdicts) and table.md, the tables made from
# RESULTS alone by benches/papers/table.py (as anyone checking a number would make them).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
die() { echo "run.sh: $*" >&2; exit 2; }

studies="vrtprof, overhead, xenmon, xenmon-open, thermal, bootprof, osnoise, bootprof-arm64"
which=${1:-}
script=$which
case $which in
    vrtprof | overhead | xenmon | thermal | bootprof | osnoise | bootprof-arm64) ;;
    xenmon-open) script=xenmon RATES=${RATES:-250 500 1000 2000} && export RATES ;;
    "") die "usage: run.sh STUDY [RESULTS] (STUDY: $studies)" ;;
    *) die "unknown study '$which' ($studies)" ;;
esac
# The same choice the study makes (common.sh), said before anything is built.
out= study=run.sh
. "$here/common.sh"
case $which in
    vrtprof | overhead | xenmon | xenmon-open | thermal)
        # The workload guest is an x86-64 guest run by qemu-system-x86_64.
        [ "$(uname -m)" = x86_64 ] ||
            die "$which runs the x86-64 workload guest; on $(uname -m) it cannot run yet (the arm64 bed, docs/testbeds.md, runs testvm guests)"
        study_accel
        echo "run.sh: $which: $accel_why" >&2
        ;;
    bootprof-arm64)
        accel=arm64-bed
        echo "run.sh: $which: in the arm64 bed (arm64 KVM in an L1 that QEMU TCG emulates; timings are emulation's)" >&2
        ;;
    *)
        accel=nested-svm
        echo "run.sh: $which: in the nested-SVM bed (kvm_amd in an L1 that QEMU TCG emulates; timings are emulation's)" >&2
        ;;
esac
results=$(realpath -m "${2:-$root/benches/results/papers/$which-$(date -u +%Y-%m-%d)-$accel}")
work=$root/target/papers/$which
mkdir -p "$work" "$results"

sh "$here/$script.sh" "$work"
cp "$work/manifest.json" "$work/runs.tar.xz" "$results/"
# table.md comes from the results folder alone, as anyone checking it would make it.
python3 "$here/table.py" "$results" > "$results/table.md"
echo "run.sh: $results: manifest.json, runs.tar.xz and table.md (made from the folder alone by benches/papers/table.py)" >&2
