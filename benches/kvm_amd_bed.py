#!/usr/bin/env python3
"""Exit costs per reason and recording overhead on a real kvm_amd host: the nested-SVM bed.

One L1 boot (scripts/nested-svm/bed.sh) runs, with the build under test:

  exit costs   each testvm workload (CPL3, and CPL0 for hlt, rdmsr and cpuid) under
               `virtprof record`; `virtprof exits` gives every exit's kvm_exit -> kvm_entry
               time per reason (median and mean), and the guest its ns per iteration.
  overhead     `testvm -w pio-user` alone (base), with record's events enabled in a tracefs
               instance nobody reads (floor: what the tracepoints cost at all), and under
               `virtprof record` (record), interleaved REPS times; median ns per iteration.

Everything in L1 is emulated (QEMU TCG), so absolute figures say nothing about hardware;
ratios between modes in the same boot are what this measures. Prints a table and, with
--save FILE, writes it there too.

usage: benches/kvm_amd_bed.py [--reps N] [--iterations N] [--binary PATH] [--save FILE]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# (workload, cpl, the exit reason its loop makes on kvm_amd)
WORKLOADS = [
    ("cpuid", 3, "cpuid"),
    ("pio-kernel", 3, "io"),
    ("mmio-kernel", 3, "npf"),
    ("pio-user", 3, "io"),
    ("mmio-user", 3, "npf"),
    ("cpuid", 0, "cpuid"),
    ("rdmsr", 0, "msr"),
    ("hlt", 0, "hlt"),
]
# `virtprof record`'s default events (CaptureConfig::default_events), as tracefs paths.
FLOOR_EVENTS = ["kvm", "sched/sched_switch", "sched/sched_wakeup", "sched/sched_wakeup_new",
                "sched/sched_migrate_task", "irq", "irq_vectors"]


def job(reps, iterations):
    specs = " ".join(f"{w}@{cpl}" for w, cpl, _ in WORKLOADS)
    enable = "\n".join(f"echo 1 > $F/events/{e}/enable" for e in FLOOR_EVENTS)
    return f"""
set -e
T=/sys/kernel/tracing
for spec in {specs}; do
    w=${{spec%@*}}; cpl=${{spec#*@}}; d=/out/cost/$w-cpl$cpl; mkdir -p $d
    virtprof record -o /tmp/r.vprec -- virtprof testvm -w $w --cpl $cpl -n {iterations} --pin 0 --json > $d/testvm.json
    virtprof exits /tmp/r.vprec --json > $d/exits.json
done
F=$T/instances/bench-floor
mkdir $F
echo mono > $F/trace_clock
echo 8192 > $F/buffer_size_kb
{enable}
echo 0 > $F/tracing_on
mkdir -p /out/overhead
run() {{ virtprof testvm -w pio-user -n {iterations} --pin 0 --json > /out/overhead/$1.$2.json; }}
for i in $(seq {reps}); do
    run base $i
    echo 1 > $F/tracing_on; run floor $i; echo 0 > $F/tracing_on; echo > $F/trace
    virtprof record -o /tmp/o.vprec -- sh -c "virtprof testvm -w pio-user -n {iterations} --pin 0 --json > /out/overhead/record.$i.json"
    virtprof exits /tmp/o.vprec --json > /out/overhead/record-exits.$i.json
done
rmdir $F
"""


def load(path):
    with open(path) as f:
        return json.load(f)


def vcpu(report):
    return report["vms"][0]["vcpus"][0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--iterations", type=int, default=2000)
    ap.add_argument("--binary", default=os.path.join(ROOT, "target/release/virtprof"))
    ap.add_argument("--save", default=None, metavar="FILE")
    args = ap.parse_args()

    out = tempfile.mkdtemp(prefix="kvm-amd-bed-")
    try:
        report(args, out)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def report(args, out):
    script = os.path.join(out, "job.sh")
    with open(script, "w") as f:
        f.write(job(args.reps, args.iterations))
    env = dict(os.environ, VIRTPROF=args.binary, BED_OUT=os.path.join(out, "out"))
    print("booting L1 and running the job (a few minutes)...", file=sys.stderr)
    run = subprocess.run(["bash", os.path.join(ROOT, "scripts/nested-svm/bed.sh"), "run", "-t", "1200", script],
                         env=env, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"the bed job failed ({run.returncode}):\n{run.stdout}\n{run.stderr}")
    res = os.path.join(out, "out")

    lines = [f"kvm_amd in L1 (QEMU TCG -cpu max, Debian 6.1), {time.strftime('%Y-%m-%d')}, "
             f"host {os.uname().release}; {args.iterations} iterations per run, pinned to L1's CPU 0",
             "",
             "EXIT COSTS (kvm_exit -> kvm_entry per exit, from virtprof exits on a recording)",
             f"{'WORKLOAD':12} {'CPL':>3} {'REASON':7} {'EXITS':>6} {'LIGHT':>6} {'HEAVY':>6} "
             f"{'P50_US':>8} {'AVG_US':>8} {'GUEST_US/IT':>11}"]
    for workload, cpl, reason in WORKLOADS:
        d = os.path.join(res, "cost", f"{workload}-cpl{cpl}")
        exits, testvm = load(os.path.join(d, "exits.json")), load(os.path.join(d, "testvm.json"))
        row = next(r for r in exits["by_reason"] if r["reason"] == reason)
        lines.append(f"{workload:12} {cpl:3} {reason:7} {row['count']:6} {row['lightweight']:6} "
                     f"{row['heavyweight']:6} {row['p50_ns'] / 1e3:8.1f} {row['avg_ns'] / 1e3:8.1f} "
                     f"{vcpu(testvm)['ns_per_iteration'] / 1e3:11.1f}")

    per_mode = {}
    for mode in ("base", "floor", "record"):
        per_mode[mode] = [vcpu(load(os.path.join(res, "overhead", f"{mode}.{i}.json")))["ns_per_iteration"]
                          for i in range(1, args.reps + 1)]
    lost = sum(load(os.path.join(res, "overhead", f"record-exits.{i}.json"))["lost_events"]
               for i in range(1, args.reps + 1))
    med = {m: statistics.median(v) for m, v in per_mode.items()}
    added = {m: med[m] - med["base"] for m in ("floor", "record")}
    lines += ["",
              f"RECORD OVERHEAD (testvm pio-user, median of {args.reps} interleaved runs; ns per guest iteration)",
              f"{'MODE':8} {'MEDIAN_US':>9} {'MIN_US':>8} {'ADDED_US':>9}"]
    for mode in ("base", "floor", "record"):
        extra = f"{added[mode] / 1e3:9.2f}" if mode in added else f"{'-':>9}"
        lines.append(f"{mode:8} {med[mode] / 1e3:9.2f} {min(per_mode[mode]) / 1e3:8.2f} {extra}")
    if added["floor"] > 0:
        lines.append(f"record / floor (added cost): {added['record'] / added['floor']:.2f}x; "
                     f"events lost while recording: {lost}")
    else:
        lines.append(f"the floor is below this bed's run-to-run noise (added {added['floor']:.0f} ns); "
                     f"record added {added['record'] / 1e3:.2f} us ({100 * added['record'] / med['base']:.1f} %); "
                     f"events lost while recording: {lost}")
    text = "\n".join(lines)
    print(text)
    if args.save:
        with open(args.save, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
