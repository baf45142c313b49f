#!/usr/bin/env python3
"""Recording overhead on an exit-heavy guest loop (`testvm pio-user`), ns per iteration:

  untraced        no tracing at all
  floor-kvm       kvm events enabled in a tracefs instance, nobody reading
  floor           record's default events enabled, nobody reading (the tracepoint floor of
                  what `virtprof record` traces: the ratio's denominator)
  virtprof        `virtprof record` (default events: kvm, sched, irq, irq_vectors)
  perf            `perf record -e 'kvm:*'`

Prints min/median ns per iteration, the cost each adds over untraced, and the ratios
virtprof/floor and virtprof/perf (targets: <= 1.2 and < 1), plus virtprof record's peak RSS.
On a PVM host a heavyweight round trip (pio-user) costs ~70 us and tracepoints vanish in its
noise; --workload pio-kernel (lightweight exits, ~25 us) makes them measurable.
Needs root, tracefs and /dev/kvm; perf is optional.

usage: benches/record_overhead.py [--reps N] [--iterations N] [--workload W] [--binary PATH]
"""
import argparse
import os
import resource
import shutil
import statistics
import subprocess
import json
import sys
import tempfile

TRACEFS = "/sys/kernel/tracing"


WORKLOAD = "pio-user"


def testvm_cmd(binary, n):
    return [binary, "testvm", "--workload", WORKLOAD, "--iterations", str(n), "--pin", "0", "--json"]


def ns_per_iter(stdout):
    return json.loads(stdout)["vms"][0]["vcpus"][0]["ns_per_iteration"]


def run(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return ns_per_iter(out.stdout)


# `virtprof record`'s default event set (CaptureConfig::default_events), as tracefs paths.
RECORD_EVENTS = ["kvm", "sched/sched_switch", "sched/sched_wakeup", "sched/sched_wakeup_new",
                 "sched/sched_migrate_task", "irq", "irq_vectors"]


def floor(binary, n, events):
    inst = os.path.join(TRACEFS, "instances", f"virtprof-bench-floor-{os.getpid()}")
    os.mkdir(inst)
    present = [e for e in events if os.path.exists(os.path.join(inst, "events", e, "enable"))]

    def enable(value):
        for e in present:
            with open(os.path.join(inst, "events", e, "enable"), "w") as f:
                f.write(value)
    try:
        enable("1")
        with open(os.path.join(inst, "tracing_on"), "w") as f:
            f.write("1")
        return run(testvm_cmd(binary, n))
    finally:
        with open(os.path.join(inst, "tracing_on"), "w") as f:
            f.write("0")
        enable("0")
        os.rmdir(inst)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=5000)
    ap.add_argument("--binary", default="target/release/virtprof")
    ap.add_argument("--workload", default="pio-user",
                    help="testvm workload: pio-user (heavyweight exits, ~70 us here) or pio-kernel (lightweight, ~27 us)")
    args = ap.parse_args()
    global WORKLOAD
    WORKLOAD = args.workload
    tmp = tempfile.mkdtemp(prefix="virtprof-bench-")
    rec = os.path.join(tmp, "r.vprec")
    modes = {
        "untraced": lambda: run(testvm_cmd(args.binary, args.iterations)),
        "floor-kvm": lambda: floor(args.binary, args.iterations, ["kvm"]),
        "floor": lambda: floor(args.binary, args.iterations, RECORD_EVENTS),
        "virtprof": lambda: run([args.binary, "record", "-o", rec, "--"] + testvm_cmd(args.binary, args.iterations)),
    }
    if shutil.which("perf"):
        pdata = os.path.join(tmp, "perf.data")
        modes["perf"] = lambda: run(["perf", "record", "-q", "-e", "kvm:*", "-o", pdata, "--"]
                                    + testvm_cmd(args.binary, args.iterations))
    results = {m: [] for m in modes}
    for rep in range(args.reps):
        for mode, fn in modes.items():  # interleaved, so drift hits every mode alike
            results[mode].append(fn())
            print(f"\rrep {rep + 1}/{args.reps} {mode:10}", end="", file=sys.stderr, flush=True)
    print("\r" + " " * 40 + "\r", end="", file=sys.stderr)
    # Peak RSS of one `virtprof record` process tree (the recorder dominates; testvm is small).
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    subprocess.run([args.binary, "record", "-o", rec, "--duration", "3s"], check=True, capture_output=True)
    rss_kb = max(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, before)
    shutil.rmtree(tmp)

    base = min(results["untraced"])
    # Paired: each repetition runs every mode back to back, so the median of the per-repetition
    # differences cancels the host's slow drift, which min and median alone do not.
    print(f"{'MODE':10} {'MIN_NS':>10} {'MEDIAN_NS':>10} {'ADDED_MIN':>10} {'ADDED_PAIRED':>12}")
    added = {}
    for mode, xs in results.items():
        added[mode] = statistics.median(x - u for x, u in zip(xs, results["untraced"]))
        print(f"{mode:10} {min(xs):10.1f} {statistics.median(xs):10.1f} {min(xs) - base:10.1f} {added[mode]:12.1f}")
    if added["floor"] > 0:
        print(f"virtprof added / floor added (paired): {added['virtprof'] / added['floor']:.2f} (target <= 1.2)")
    if "perf" in added and added["perf"] > 0:
        print(f"virtprof added / perf added (paired):  {added['virtprof'] / added['perf']:.2f} (target < 1)")
    print(f"peak RSS of virtprof record (3 s idle host): {rss_kb / 1024:.1f} MiB (target <= 64)")
    print(f"({args.reps} reps of {WORKLOAD} -n {args.iterations}, pinned to CPU 0, interleaved)")


if __name__ == "__main__":
    main()
