#!/usr/bin/env python3
"""Does `virtprof record` lose events at its default settings on a loaded host?

The load (issue 36 item 4): 16 busy testvm VMs (pio-user: every iteration an exit handled by
the VMM, the event-heavy case) beside a QEMU TCG guest (a Debian kernel that panics at once
and then spins in its panic loop, so both of its emulating threads stay busy), all on this
host's CPUs. Then RUNS recordings of SECONDS each at default settings (plus any RECORD_ARGS),
one after another under the same load. Printed per run: events lost (the kernel's overrun
and dropped counts, as `record` reports them), MiB recorded and per second, record's own CPU
time and the per-CPU buffer it sized from the rate it probed; then how many runs lost anything.

Needs root, tracefs, /dev/kvm, qemu-system-x86_64 and the Debian kernel
(`bash scripts/debian-kernel/fetch.sh target/debian-kernel`).

Usage: benches/record_loss.py [RUNS] [SECONDS] [-- RECORD_ARGS...]
"""
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
V = os.environ.get("VIRTPROF", os.path.join(ROOT, "target/release/virtprof"))
KERNEL = os.path.join(ROOT, "target/debian-kernel/vmlinuz")
TICK = os.sysconf("SC_CLK_TCK")

args = sys.argv[1:]
extra = []
if "--" in args:
    extra = args[args.index("--") + 1:]
    args = args[: args.index("--")]
RUNS = int(args[0]) if args else 10
SECONDS = int(args[1]) if len(args) > 1 else 30


def children_cpu_seconds():
    t = os.times()
    return t.children_user + t.children_system


def start_load():
    qemu = subprocess.Popen(
        ["qemu-system-x86_64", "-accel", "tcg", "-smp", "2", "-m", "256", "-nographic", "-nodefaults",
         "-no-reboot", "-serial", "null", "-kernel", KERNEL, "-append", "console=ttyS0 rdinit=/nonexistent"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    total = RUNS * (SECONDS + 10) + 60
    vms = subprocess.Popen(
        [V, "testvm", "-w", "pio-user", "--vms", "16", "--duration", f"{total}s"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    time.sleep(5)  # QEMU boots into its panic loop; the VMs are all running
    return [qemu, vms]


def record_once(path):
    before = children_cpu_seconds()
    started = time.monotonic()
    out = subprocess.run([V, "record", "--duration", f"{SECONDS}s", "-o", path] + extra,
                         capture_output=True, text=True)
    wall = time.monotonic() - started
    cpu = children_cpu_seconds() - before
    text = out.stderr + out.stdout
    if out.returncode != 0:
        sys.exit(f"record failed ({out.returncode}): {text}")
    lost = int(re.search(r"lost events: (\d+)", text).group(1))
    mib = float(re.search(r"\(([\d.]+) MiB\)", text).group(1))
    grown = re.search(r"grown to (\d+) MiB per CPU", text)
    buffer = int(grown.group(1)) if grown else None
    return lost, mib, wall, cpu, buffer


def main():
    print(f"# record_loss: {RUNS} runs of {SECONDS} s; 16 pio-user testvm VMs + a QEMU TCG guest on "
          f"{os.cpu_count()} CPUs; record args: {' '.join(extra) or '(defaults)'}")
    load = start_load()
    path = f"/tmp/record-loss-{os.getpid()}.vprec"
    lossy = 0
    try:
        print(f"{'run':>3} {'lost':>10} {'MiB':>8} {'MiB/s':>7} {'record CPU %':>12} {'buffer/CPU':>10}")
        for run in range(1, RUNS + 1):
            lost, mib, wall, cpu, buffer = record_once(path)
            lossy += lost > 0
            size = f"{buffer} MiB" if buffer else ("given" if extra else "8 MiB")
            print(f"{run:>3} {lost:>10} {mib:>8.1f} {mib / wall:>7.2f} {100 * cpu / wall:>12.2f} {size:>10}",
                  flush=True)
    finally:
        for p in load:
            p.terminate()
        for p in load:
            p.wait()
        if os.path.exists(path):
            os.remove(path)
    print(f"runs that lost events: {lossy} of {RUNS}")


main()
