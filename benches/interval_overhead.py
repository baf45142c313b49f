#!/usr/bin/env python3
"""Cost of `virtprof record --interval 1ms` on busy guests: a testvm with 4 compute vCPUs
(no exits; the guest throughput is its own iteration count) run

  untraced    alone
  trace       under `virtprof record` (default events, no interval sampling)
  interval D  under `virtprof record --interval D` for each D of --intervals (default 1ms,10ms):
              trace + per-interval sampling of /proc/stat, schedstat, KVM stats, perf counters
              and the guests' shared pages

Prints guest throughput (iterations/s summed over vCPUs, median of the reps), the loss against
untraced in %, the recorder's peak RSS (VmHWM of the `virtprof record` process), and the rows,
missed intervals and lost events it reported. Needs root, tracefs and /dev/kvm.

usage: benches/interval_overhead.py [--reps N] [--duration 3s] [--vcpus 4] [--intervals 1ms,10ms]
                                   [--binary PATH]
"""
import argparse
import json
import os
import re
import statistics
import sys
import tempfile

from procwatch import run_watched


def testvm_cmd(binary, vcpus, duration):
    return [binary, "testvm", "--workload", "compute", "--vcpus", str(vcpus), "--duration", duration, "--json"]


def throughput(stdout, seconds):
    vm = json.loads(stdout)["vms"][0]
    return sum(v["iterations"] for v in vm["vcpus"]) / seconds


def run(cmd, seconds):
    _, peaks, out, err = run_watched(cmd)
    return throughput(out, seconds), peaks["VmHWM"], err


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--duration", default="3s")
    ap.add_argument("--vcpus", type=int, default=4)
    ap.add_argument("--intervals", default="1ms,10ms")
    ap.add_argument("--binary", default="target/release/virtprof")
    args = ap.parse_args()
    seconds = float(args.duration.rstrip("s"))
    tmp = tempfile.mkdtemp(prefix="virtprof-bench-")
    rec = os.path.join(tmp, "r.vprec")
    guest = testvm_cmd(args.binary, args.vcpus, args.duration)
    modes = {
        "untraced": guest,
        "trace": [args.binary, "record", "-o", rec, "--"] + guest,
    }
    for d in args.intervals.split(","):
        modes[f"interval {d}"] = [args.binary, "record", "-o", rec, "--interval", d, "--"] + guest
    results = {m: [] for m in modes}
    rss = {m: 0 for m in modes}
    notes = {}
    for rep in range(args.reps):
        for mode, cmd in modes.items():  # interleaved, so drift hits every mode alike
            tput, kb, err = run(cmd, seconds)
            results[mode].append(tput)
            if mode != "untraced":
                rss[mode] = max(rss[mode], kb)
                rows = re.search(r"(\d+) intervals of .*missed (\d+)", err)
                lost = re.search(r"lost events: (\d+)", err)
                notes.setdefault(mode, []).append(
                    (int(rows.group(1)) if rows else 0, int(rows.group(2)) if rows else 0, int(lost.group(1)) if lost else 0))
            if sys.stderr.isatty():
                print(f"\rrep {rep + 1}/{args.reps} {mode:14}", end="", file=sys.stderr, flush=True)
    if sys.stderr.isatty():
        print("\r" + " " * 40 + "\r", end="", file=sys.stderr)
    os.remove(rec)
    os.rmdir(tmp)

    base = statistics.median(results["untraced"])
    print(f"{'MODE':14} {'ITER/S (median)':>16} {'LOSS %':>7} {'PEAK RSS MiB':>13} {'ROWS':>6} {'MISSED':>7} {'LOST EV':>8}")
    for mode, xs in results.items():
        med = statistics.median(xs)
        loss = 100.0 * (base - med) / base
        n = notes.get(mode, [(0, 0, 0)])
        rows = max(r for r, _, _ in n)
        missed = max(m for _, m, _ in n)
        lost = max(l for _, _, l in n)
        mib = f"{rss[mode] / 1024:.1f}" if mode != "untraced" else "-"
        sampled = mode.startswith("interval")
        print(f"{mode:14} {med:16.4g} {loss:7.2f} {mib:>13} {rows if sampled else '-':>6} "
              f"{missed if sampled else '-':>7} {lost if mode != 'untraced' else '-':>8}")
    spread = {m: 100.0 * (max(xs) - min(xs)) / statistics.median(xs) for m, xs in results.items()}
    print("run-to-run spread (max-min)/median %: " + ", ".join(f"{m} {s:.1f}" for m, s in spread.items()))
    print(f"({args.reps} reps of testvm compute, {args.vcpus} vCPUs, {args.duration}, interleaved; "
          f"{os.cpu_count()} host CPUs; target peak RSS <= 64 MiB)")


if __name__ == "__main__":
    main()
