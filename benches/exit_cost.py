#!/usr/bin/env python3
"""Cost of each kind of VM exit on this host, measured with `virtprof testvm`.

Like seed 004's Table 1 (CPUID vs I/O-port exits): each workload runs REPS times; we report
min and median ns per iteration, and the net cost of the exit itself (minus the compute loop's
ns per iteration, the baseline measured in the same run).

usage: benches/exit_cost.py [--reps N] [--binary PATH] [--json]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# (workload, iterations): sized so one rep takes well under a second on a PVM host, where a
# userspace round trip costs ~100 us; VMX/SVM hosts are faster and just finish sooner.
# What each operation usually is on VMX/SVM; the KVM_EXITS/IT column (the vCPU's KVM stats fd)
# says what it is on this host: an operation with 0.00 never reaches this host's KVM.
WORKLOADS = [
    ("compute", 20_000_000, "pure loop (baseline)"),
    ("cpuid", 4_000, "CPUID (a lightweight exit on VMX/SVM)"),
    ("pio-kernel", 4_000, "OUT to ioeventfd port: handled in KVM"),
    ("mmio-kernel", 4_000, "store to ioeventfd MMIO: handled in KVM"),
    ("pio-user", 3_000, "OUT handled by the VMM: heavyweight"),
    ("mmio-user", 3_000, "MMIO store handled by the VMM: heavyweight"),
]


def run(binary, workload, iterations):
    out = subprocess.run(
        [binary, "testvm", "--workload", workload, "--iterations", str(iterations), "--pin", "0", "--json"],
        check=True, capture_output=True, text=True,
    )
    vcpu = json.loads(out.stdout)["vms"][0]["vcpus"][0]
    return vcpu["ns_per_iteration"], vcpu["kvm_stats"].get("exits", 0) / max(vcpu["iterations"], 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--binary", default="target/release/virtprof")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    rows = []
    for workload, iterations, what in WORKLOADS:
        samples, exits = [], []
        for rep in range(args.reps):
            ns, e = run(args.binary, workload, iterations)
            samples.append(ns)
            exits.append(e)
            print(f"\r{workload:12} rep {rep + 1}/{args.reps}", end="", file=sys.stderr, flush=True)
        rows.append({"workload": workload, "what": what, "iterations": iterations,
                     "min_ns": min(samples), "median_ns": statistics.median(samples),
                     "kvm_exits_per_iter": statistics.median(exits)})
    print("\r" + " " * 40 + "\r", end="", file=sys.stderr)
    base = rows[0]["min_ns"]
    for r in rows:
        r["net_exit_ns"] = max(r["min_ns"] - base, 0.0)
        r["ratio_to_baseline"] = r["min_ns"] / base if base else None

    if args.json:
        json.dump({"date": time.strftime("%Y-%m-%d"), "reps": args.reps, "rows": rows}, sys.stdout, indent=2)
        print()
        return
    print(f"{'WORKLOAD':12} {'MIN_NS':>10} {'MEDIAN_NS':>10} {'NET_EXIT_NS':>11} {'X_BASELINE':>10} {'KVM_EXITS/IT':>12}  WHAT")
    for r in rows:
        what = r["what"]
        if r["workload"] != "compute" and r["kvm_exits_per_iter"] < 0.5:
            what += "; here: no exit reaches KVM"
        print(f"{r['workload']:12} {r['min_ns']:10.1f} {r['median_ns']:10.1f} {r['net_exit_ns']:11.1f} "
              f"{r['ratio_to_baseline']:10.1f} {r['kvm_exits_per_iter']:12.2f}  {what}")
    print(f"(ns per guest iteration, {args.reps} reps each, pinned to CPU 0; NET = MIN - compute MIN; "
          f"{time.strftime('%Y-%m-%d')}, {os.uname().release})")


if __name__ == "__main__":
    main()
