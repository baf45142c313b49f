#!/usr/bin/env python3
"""Cost of `virtprof top -d 1` in each of its modes (xenmon reported 1-2% of a CPU).

Two loads, each watched for SECONDS (default 30) per mode:
  compute: 8 busy vCPUs (4 testvm compute VMs x 2 vCPUs), few events;
  exits:   2 testvm pio-kernel VMs, ~10^5 exits/s each, the event-heavy case.
Modes: kernel (the default: an eBPF program counts in the kernel), trace (--trace: every event
decoded in user space), polling (--no-trace). Printed per mode: the CPU time top itself used
(utime + stime from /proc/PID/stat, in tmux like a user's terminal), and, for the exits load,
what the guests lost: their iterations per second against a run with no top (the kernel-side
cost of the tracepoints and of the program, paid by the traced threads). Needs root, tracefs,
/dev/kvm, tmux.

Usage: benches/top_overhead.py [SECONDS]
"""
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
V = os.environ.get("VIRTPROF", os.path.join(ROOT, "target/release/virtprof"))
SECONDS = float(sys.argv[1]) if len(sys.argv) > 1 else 30.0
TICK = os.sysconf("SC_CLK_TCK")
MODES = [("kernel", []), ("trace", ["--trace"]), ("polling", ["--no-trace"])]


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def start_top(extra):
    session = f"virtprof-bench-{os.getpid()}"
    cmd = " ".join([V, "top", "-d", "1"] + extra)
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "200", "-y", "50", cmd], check=True)
    out = subprocess.run(["tmux", "list-panes", "-t", session, "-F", "#{pane_pid}"], capture_output=True, text=True)
    # The pane runs virtprof directly (no shell in between).
    return session, int(out.stdout.split()[0])


def stop_top(session):
    subprocess.run(["tmux", "send-keys", "-t", session, "q"])
    time.sleep(1)
    subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


def top_cpu(extra):
    """% of one CPU `top` used over SECONDS, after its start-up."""
    session, pid = start_top(extra)
    try:
        time.sleep(2)  # startup (discovery, instance or program load) is not steady state
        c0, t0 = cpu_seconds(pid), time.monotonic()
        time.sleep(SECONDS)
        c1, t1 = cpu_seconds(pid), time.monotonic()
        return 100.0 * (c1 - c0) / (t1 - t0)
    finally:
        stop_top(session)


def exit_load(extra):
    """(top's % of a CPU, guest iterations per second) with 2 pio-kernel VMs; no top if None."""
    session = pid = None
    if extra is not None:
        session, pid = start_top(extra)
        time.sleep(2)
    try:
        c0 = cpu_seconds(pid) if pid else 0.0
        t0 = time.monotonic()
        out = subprocess.run(
            [V, "testvm", "-w", "pio-kernel", "--vms", "2", "--duration", f"{int(SECONDS)}s", "--json"],
            capture_output=True, text=True, check=True,
        )
        t1 = time.monotonic()
        cpu = 100.0 * (cpu_seconds(pid) - c0) / (t1 - t0) if pid else 0.0
    finally:
        if session:
            stop_top(session)
    report = json.loads(out.stdout)
    vcpus = [v for vm in report["vms"] for v in vm["vcpus"]]
    rate = sum(v["iterations"] / (v["wall_ns"] / 1e9) for v in vcpus if v["wall_ns"])
    return cpu, rate


def main():
    if not os.path.exists(V):
        subprocess.run(["cargo", "build", "--release", "-q"], cwd=ROOT, check=True)
    vms = subprocess.Popen(
        [V, "testvm", "-w", "compute", "--vms", "4", "--vcpus", "2", "--duration", f"{int(3 * SECONDS + 45)}s"],
        stdout=subprocess.DEVNULL,
    )
    try:
        time.sleep(1)
        compute = {name: top_cpu(extra) for name, extra in MODES}
    finally:
        vms.terminate()
        vms.wait()
    _, alone = exit_load(None)
    exits = {name: exit_load(extra) for name, extra in MODES}
    print(f"virtprof top -d 1 on {os.cpu_count()} CPUs, {SECONDS:.0f} s per mode (xenmon: 1-2% of a CPU)")
    print(f"  8 busy compute vCPUs:        " + "  ".join(f"{n} {c:.2f}%" for n, c in compute.items()))
    print(f"  2 pio-kernel VMs, top's CPU: " + "  ".join(f"{n} {c:.2f}%" for n, (c, _) in exits.items()))
    print(f"  their iterations/s (no top: {alone:,.0f}): "
          + "  ".join(f"{n} {r:,.0f} ({100 * (r / alone - 1):+.1f}%)" for n, (_, r) in exits.items()))
    print(f"  ratio trace / kernel, top's CPU under exits: {exits['trace'][0] / max(exits['kernel'][0], 1e-9):.1f}x")


if __name__ == "__main__":
    main()
