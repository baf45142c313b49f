#!/usr/bin/env python3
"""CPU cost of `virtprof top -d 1` watching busy vCPUs (xenmon reported 1-2% of a CPU).

Starts 8 busy vCPUs (4 testvm compute VMs x 2 vCPUs), runs `virtprof top -d 1` in a tmux
terminal for SECONDS (default 60) in trace mode and then in polling mode (--no-trace), and
reads the CPU time (utime + stime from /proc/PID/stat) the top process used. The kernel's cost
of the enabled tracepoints is paid by the traced threads, not by top: compare record_overhead_toggle.py
for that. Needs root, tracefs, /dev/kvm, tmux.

Usage: benches/top_overhead.py [SECONDS]
"""
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
V = os.environ.get("VIRTPROF", os.path.join(ROOT, "target/release/virtprof"))
SECONDS = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def top_pid(session):
    out = subprocess.run(["tmux", "list-panes", "-t", session, "-F", "#{pane_pid}"], capture_output=True, text=True)
    shell = int(out.stdout.split()[0])
    # The pane runs virtprof directly (no shell in between).
    return shell


def measure(extra):
    session = f"virtprof-bench-{os.getpid()}"
    cmd = " ".join([V, "top", "-d", "1"] + extra)
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "200", "-y", "50", cmd], check=True)
    try:
        time.sleep(2)  # startup (discovery, instance creation) is not steady state
        pid = top_pid(session)
        c0, t0 = cpu_seconds(pid), time.monotonic()
        time.sleep(SECONDS)
        c1, t1 = cpu_seconds(pid), time.monotonic()
        return 100.0 * (c1 - c0) / (t1 - t0)
    finally:
        subprocess.run(["tmux", "send-keys", "-t", session, "q"])
        time.sleep(1)
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


def main():
    if not os.path.exists(V):
        subprocess.run(["cargo", "build", "--release", "-q"], cwd=ROOT, check=True)
    vms = subprocess.Popen(
        [V, "testvm", "-w", "compute", "--vms", "4", "--vcpus", "2", "--duration", f"{int(2 * SECONDS + 30)}s"],
        stdout=subprocess.DEVNULL,
    )
    try:
        time.sleep(1)
        trace = measure([])
        polling = measure(["--no-trace"])
    finally:
        vms.terminate()
        vms.wait()
    print(f"virtprof top -d 1, 8 busy vCPUs on {os.cpu_count()} CPUs, {SECONDS:.0f} s each")
    print(f"  trace mode (tracefs sched + kvm events): {trace:.2f}% of one CPU (target <= 0.5%; xenmon: 1-2%)")
    print(f"  polling mode (--no-trace):               {polling:.2f}% of one CPU")


if __name__ == "__main__":
    main()
