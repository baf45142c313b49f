#!/usr/bin/env python3
"""Cost of `virtprof serve` against node_exporter on the same host, as VMs are added.

For 16, 64 and 256 testvm VMs (one vCPU each, I/O-bound with a long --io-latency, so they
make exits and context switches without loading the CPUs), scrapes `virtprof serve` (in the
kernel: the eBPF program, the default), `virtprof serve --trace` (every traced event decoded in
user space), `virtprof serve --no-trace` (polling schedstat and KVM stats) and then node_exporter (Debian's prometheus-node-exporter, default collectors) every
1 s and every 15 s for SECONDS (default 60) each, and reports per exporter: CPU (utime + stime
from /proc/PID/stat) as % of one core and per scrape, peak RSS (VmHWM), the slowest scrape
seen by the client, and the response size; then each serve's CPU against node_exporter's and
against the traced serve's. serve's CPU includes its refreshes between scrapes (traced: drains
every 1 to 10 s, by how fast the buffers fill, so it follows the host's event rate, not the
scrape interval). The kernel's cost of the tracepoints and of the program is paid by the traced
threads (see record_overhead_toggle.py and top_overhead.py).

The goal (issue 25): at most 0.5 % of a core at 15 s with 256 vCPUs.
Needs root, tracefs, /dev/kvm, prometheus-node-exporter.

Usage: benches/serve_cost.py [SECONDS] [VM COUNTS...]
"""
import os
import socket
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
V = os.environ.get("VIRTPROF", os.path.join(ROOT, "target/release/virtprof"))
SECONDS = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
COUNTS = [int(n) for n in sys.argv[2:]] or [16, 64, 256]
TICK = os.sysconf("SC_CLK_TCK")
# The VMs outlive every measurement of their count: two intervals, four exporters, each its
# SECONDS plus a few of start-up, and the VMs' own start. (They lived 4 * SECONDS + 120 s
# before, so the last exporters at 15 s scraped a host whose VMs had ended.)
LIFETIME = 2 * 4 * (SECONDS + 10) + 120


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def peak_rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_up(url):
    for _ in range(100):
        try:
            urllib.request.urlopen(url, timeout=5).read()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{url} never answered")


def measure(argv, url, interval):
    """CPU % of a core, CPU ms per scrape, peak RSS, slowest scrape, response bytes."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until_up(url)
        time.sleep(3)  # startup (discovery, instance creation) is not steady state
        c0, t0 = cpu_seconds(proc.pid), time.monotonic()
        scrapes, slowest, size = 0, 0.0, 0
        next_at = t0
        while time.monotonic() - t0 < SECONDS:
            started = time.monotonic()
            body = urllib.request.urlopen(url, timeout=30).read()
            slowest = max(slowest, time.monotonic() - started)
            size, scrapes = len(body), scrapes + 1
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))
        c1, t1 = cpu_seconds(proc.pid), time.monotonic()
        cpu = c1 - c0
        return 100.0 * cpu / (t1 - t0), 1000.0 * cpu / scrapes, peak_rss_mib(proc.pid), 1000.0 * slowest, size
    finally:
        proc.terminate()
        proc.wait()


def main():
    if not os.path.exists(V):
        subprocess.run(["cargo", "build", "--release", "-q"], cwd=ROOT, check=True)
    node_exporter = "prometheus-node-exporter"
    print(f"serve_cost: {SECONDS:.0f} s per measurement; CPU in % of one core; host {os.cpu_count()} CPUs")
    print(f"{'VMs':>4} {'every':>6} {'exporter':>14} {'CPU %':>7} {'ms/scrape':>10} {'RSS MiB':>8} {'slowest ms':>11} {'bytes':>8}")
    for count in COUNTS:
        # testvm starts at most 64 VMs per invocation.
        vms = [
            subprocess.Popen(
                [V, "testvm", "-w", "io-bound", "--io-latency", "50ms", "--vms", str(min(64, count - first)),
                 "--name", f"bench{first}", "--duration", f"{int(LIFETIME)}s"],
                stdout=subprocess.DEVNULL,
            )
            for first in range(0, count, 64)
        ]
        try:
            time.sleep(3 + count / 50)  # every VMM up
            for interval in (1, 15):
                port = free_port()
                url = f"http://127.0.0.1:{port}/metrics"
                rows = [
                    ("virtprof serve", [V, "serve", "--listen", f"127.0.0.1:{port}"], url),
                    ("serve --trace", [V, "serve", "--trace", "--listen", f"127.0.0.1:{port}"], url),
                    ("serve no-trace", [V, "serve", "--no-trace", "--listen", f"127.0.0.1:{port}"], url),
                    ("node_exporter", [node_exporter, f"--web.listen-address=127.0.0.1:{port}"], url),
                ]
                figures = {}
                for name, argv, url in rows:
                    figures[name] = measure(argv, url, interval)
                    pct, per, rss, slow, size = figures[name]
                    print(f"{count:>4} {interval:>5}s {name:>14} {pct:>7.3f} {per:>10.2f} {rss:>8.1f} {slow:>11.1f} {size:>8}", flush=True)
                node = max(figures["node_exporter"][0], 1e-9)
                ratios = " ".join(
                    f"{name} {figures[name][0] / node:.2f}x" for name in ("virtprof serve", "serve --trace", "serve no-trace")
                )
                print(f"{count:>4} {interval:>5}s {'vs node':>14} {ratios}", flush=True)
                traced = figures["serve --trace"][0] / max(figures["virtprof serve"][0], 1e-9)
                print(f"{count:>4} {interval:>5}s {'traced/kernel':>14} {traced:.1f}x", flush=True)
        finally:
            for v in vms:
                v.terminate()
                v.wait()


if __name__ == "__main__":
    main()
