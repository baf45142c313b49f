#!/usr/bin/env python3
"""`virtprof report --html` on a big recording: throughput and memory.

Records an event-heavy testvm run (pio-kernel on every vCPU: several kvm events per iteration,
plus the sched and irq events of the host) until the recording holds at least --events events,
unless --recording gives one. Then runs `report --html` on it --reps times and prints events,
wall time, events/s, and memory: peak anonymous RSS (what the report allocates: bounded) and
peak total RSS (which also counts the recording's pages, mapped from the page cache).

usage: benches/report_stream.py [--events 50e6] [--recording FILE] [--reps 3] [--binary PATH]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

from procwatch import run_watched


def events_in(binary, rec):
    out = subprocess.run([binary, "report", rec, "--json"], check=True, capture_output=True, text=True).stdout
    r = json.loads(out)
    return r["events"], r["lost_events"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=float, default=50e6)
    ap.add_argument("--recording")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--binary", default="target/release/virtprof")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="virtprof-bench-", dir=os.environ.get("BENCH_DIR"))
    rec = args.recording
    if rec is None:
        rec = os.path.join(tmp, "big.vprec")
        seconds = 10
        while True:
            print(f"recording {seconds} s of testvm pio-kernel on 2 vCPUs...", file=sys.stderr)
            subprocess.run([args.binary, "record", "-o", rec, "--buffer-size", "65536", "--",
                            args.binary, "testvm", "-w", "pio-kernel", "--vcpus", "2", "--duration", f"{seconds}s"],
                           check=True, capture_output=True)
            events, lost = events_in(args.binary, rec)
            print(f"  {events / 1e6:.1f} M events, {lost} lost", file=sys.stderr)
            if events >= args.events:
                break
            seconds = int(seconds * args.events / max(events, 1) * 1.1) + 1
    size = os.path.getsize(rec)
    html = os.path.join(tmp, "big.html")
    rows = []
    for _ in range(args.reps):
        wall, peaks, _, _ = run_watched([args.binary, "report", rec, "--html", html], ("RssAnon", "VmHWM"))
        rows.append((wall, peaks))
    events, lost = events_in(args.binary, rec)
    best = min(rows, key=lambda r: r[0])
    print(f"recording: {size / 2**20:.0f} MiB, {events:,} events, {lost} lost")
    print(f"report --html: best of {args.reps}: {best[0]:.2f} s = {events / best[0] / 1e6:.1f} M events/s")
    print(f"peak anonymous RSS (allocated by the report): {max(p['RssAnon'] for _, p in rows) / 1024:.1f} MiB")
    print(f"peak total RSS (including the mapped recording): {max(p['VmHWM'] for _, p in rows) / 1024:.1f} MiB")
    print(f"HTML page: {os.path.getsize(html) / 1024:.0f} KiB")
    for name in os.listdir(tmp):
        if args.recording is None or not name.endswith(".vprec"):
            os.remove(os.path.join(tmp, name))
    os.rmdir(tmp)


if __name__ == "__main__":
    main()
