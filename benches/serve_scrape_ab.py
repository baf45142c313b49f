#!/usr/bin/env python3
"""CPU per scrape of two `virtprof` builds side by side, as VMs are added.

Starts N testvm VMs (I/O-bound, one vCPU each, as in serve_cost.py), then for each mode
(`serve --bpf`, `serve --trace`, `serve --no-trace`; builds before --trace existed took no flag
for the traced path: set TRACED_FLAG= to give them none) runs build A and build B in turn, twice, and
prints per run: serve's CPU (utime + stime from /proc/PID/stat) over 15 scrapes 1 s apart,
per scrape (each scrape refreshes the sampler, so this is the whole cost of a scrape), and the
slowest scrape the client saw. Alternating the builds keeps the host's drift out of the
comparison. Needs root, tracefs, /dev/kvm.

Usage: benches/serve_scrape_ab.py N BUILD_A BUILD_B
  e.g. git stash; cargo build --release; cp target/release/virtprof /tmp/virtprof-a; git stash pop
       cargo build --release; benches/serve_scrape_ab.py 256 /tmp/virtprof-a target/release/virtprof
"""
import os
import socket
import subprocess
import sys
import time
import urllib.request

TICK = os.sysconf("SC_CLK_TCK")
SCRAPES = 15


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(build, mode):
    """(CPU ms per scrape, slowest scrape ms) of one serve."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    serve = subprocess.Popen([build, "serve", *mode, "--listen", f"127.0.0.1:{port}"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(url, timeout=5).read()
                break
            except OSError:
                time.sleep(0.1)
        time.sleep(3)  # discovery and start-up are not steady state
        c0, slowest = cpu_seconds(serve.pid), 0.0
        for _ in range(SCRAPES):
            started = time.monotonic()
            urllib.request.urlopen(url, timeout=30).read()
            slowest = max(slowest, time.monotonic() - started)
            time.sleep(1)
        return 1000 * (cpu_seconds(serve.pid) - c0) / SCRAPES, 1000 * slowest
    finally:
        serve.terminate()
        serve.wait()


def main():
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    count, builds = int(sys.argv[1]), {"A": sys.argv[2], "B": sys.argv[3]}
    vms = [
        subprocess.Popen([builds["B"], "testvm", "-w", "io-bound", "--io-latency", "50ms",
                          "--vms", str(min(64, count - first)), "--name", f"ab{first}", "--duration", "900s"],
                         stdout=subprocess.DEVNULL)
        for first in range(0, count, 64)
    ]
    try:
        time.sleep(3 + count / 50)  # every VMM up
        for _ in range(2):
            traced = [f for f in [os.environ.get("TRACED_FLAG", "--trace")] if f]
            for mode in (["--bpf"], traced, ["--no-trace"]):
                for name, build in builds.items():
                    per, slowest = measure(build, mode)
                    label = " ".join(mode) or "traced"
                    print(f"{count:4} {label:10} {name} cpu/scrape {per:7.1f} ms  slowest {slowest:6.1f} ms", flush=True)
    finally:
        for vm in vms:
            vm.terminate()
            vm.wait()


if __name__ == "__main__":
    main()
