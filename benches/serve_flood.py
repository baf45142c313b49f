#!/usr/bin/env python3
"""`virtprof serve` under scrapers that ask as fast as they can (issue 54, item 2).

With VMS test VMs (default 16, io-bound, one vCPU each), runs `virtprof serve` as it was
before (`--max-age 0 --client-rate 0`: every request scrapes) and as it is by default (a
scrape answers requests for 1 s after it started; 10 answers a second per connection, 10 new
connections a second per address), each against: no flood, one client looping on a kept-alive
connection, one opening a connection per request, and four of each. Beside them, a scraper at
Prometheus' pace (once a second, kept alive) measures its scrape latency. Prints per case:
serve's CPU (utime + stime from /proc/PID/stat) as % of a core, the scrapes serve made (its
own virtprof_scrapes_total), the flooders' answers and 429s per second, and the paced
scraper's median and slowest scrape; then the default's CPU against the old one's.

Needs root, tracefs, /dev/kvm. Usage: benches/serve_flood.py [SECONDS] [VMS]
"""
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
V = os.environ.get("VIRTPROF", os.path.join(ROOT, "target/release/virtprof"))
SECONDS = float(sys.argv[1]) if len(sys.argv) > 1 else 20.0
VMS = int(sys.argv[2]) if len(sys.argv) > 2 else 16
TICK = os.sysconf("SC_CLK_TCK")
REQUEST = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def read_answer(sock, buf):
    """One answer from a kept-alive socket: (status, body); `buf` keeps what follows."""
    while b"\r\n\r\n" not in buf[0]:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        buf[0] += chunk
    head, rest = buf[0].split(b"\r\n\r\n", 1)
    status = int(head.split(b" ")[1])
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        rest += chunk
    buf[0] = rest[length:]
    return status, rest[:length]


def kept_alive_flood(port, stop, counts):
    sock = socket.create_connection(("127.0.0.1", port))
    buf = [b""]
    while not stop.is_set():
        sock.sendall(REQUEST)
        status, _ = read_answer(sock, buf)
        counts[status] = counts.get(status, 0) + 1
    sock.close()


def reconnecting_flood(port, stop, counts):
    while not stop.is_set():
        try:
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            status, _ = read_answer(sock, [b""])
            sock.close()
        except OSError:
            status = 0
        counts[status] = counts.get(status, 0) + 1


def scrapes_made(sock, buf):
    sock.sendall(REQUEST)
    _, body = read_answer(sock, buf)
    for line in body.decode().splitlines():
        if line.startswith("virtprof_scrapes_total"):
            return float(line.split()[-1])
    return float("nan")


def case(flags, kept, reconnecting):
    port = free_port()
    serve = subprocess.Popen([V, "serve", "--listen", f"127.0.0.1:{port}", *flags],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                paced = socket.create_connection(("127.0.0.1", port))
                break
            except OSError:
                time.sleep(0.1)
        buf = [b""]
        paced.sendall(REQUEST)
        read_answer(paced, buf)
        time.sleep(2)  # startup is not steady state
        stop = threading.Event()
        counts = [dict() for _ in range(kept + reconnecting)]
        threads = [threading.Thread(target=kept_alive_flood, args=(port, stop, counts[i])) for i in range(kept)]
        threads += [threading.Thread(target=reconnecting_flood, args=(port, stop, counts[kept + i]))
                    for i in range(reconnecting)]
        made0 = scrapes_made(paced, buf)
        time.sleep(1)  # the paced scraper's own rate: its next request is not held back
        c0, t0 = cpu_seconds(serve.pid), time.monotonic()
        for t in threads:
            t.start()
        latencies = []
        while time.monotonic() - t0 < SECONDS:
            started = time.monotonic()
            paced.sendall(REQUEST)
            status, _ = read_answer(paced, buf)
            assert status == 200, status
            latencies.append(time.monotonic() - started)
            time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
        cpu = (cpu_seconds(serve.pid) - c0) / (time.monotonic() - t0) * 100
        stop.set()
        for t in threads:
            t.join()
        made = scrapes_made(paced, buf) - made0
        total = {}
        for c in counts:
            for k, v in c.items():
                total[k] = total.get(k, 0) + v
        return cpu, made, total, statistics.median(latencies) * 1e3, max(latencies) * 1e3
    finally:
        serve.terminate()
        serve.wait()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    vms = subprocess.Popen([V, "testvm", "-w", "io-bound", "--io-latency", "2ms", "--vms", str(VMS),
                            "--duration", "3600s"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(3)
    print(f"# virtprof serve under looping scrapers: {VMS} io-bound VMs, {SECONDS:.0f} s per case, "
          f"a paced scraper once a second; {os.uname().release}, {os.cpu_count()} CPUs")
    print(f"{'serve':<10} {'flood':<22} {'CPU%':>6} {'scrapes':>8} {'200/s':>8} {'429/s':>8} "
          f"{'paced p50 ms':>13} {'paced max ms':>13}")
    configs = [("before", ["--max-age", "0", "--client-rate", "0"]), ("default", [])]
    floods = [("none", 0, 0), ("1 kept-alive", 1, 0), ("1 reconnecting", 0, 1), ("4+4", 4, 4)]
    cpu = {}
    try:
        for flood, kept, reconnecting in floods:
            for name, flags in configs:
                c, made, total, p50, worst = case(flags, kept, reconnecting)
                cpu[(name, flood)] = c
                print(f"{name:<10} {flood:<22} {c:6.2f} {made:8.0f} {total.get(200, 0) / SECONDS:8.1f} "
                      f"{total.get(429, 0) / SECONDS:8.1f} {p50:13.1f} {worst:13.1f}", flush=True)
        for flood, _, _ in floods[1:]:
            before, after = cpu[("before", flood)], cpu[("default", flood)]
            print(f"{flood}: default serve's CPU is {after / before:.3f} of the old one's "
                  f"({after:.2f} % vs {before:.2f} % of a core)")
    finally:
        vms.terminate()
        vms.wait()


if __name__ == "__main__":
    main()
