#!/usr/bin/env python3
"""Record the series deploy/prometheus/alerts.test.yml replays: a real `virtprof serve` watching
test VMs made to trip the alerts (two VMs pinned on one CPU: each vCPU waits about half the
time; one making in-kernel PIO exits as fast as it can; one whose I/O thread serves requests on
the pinned VMs' CPU), scraped once a second.

    python3 scripts/alerts/record-series.py [VIRTPROF] > deploy/prometheus/alerts.test.yml

promtool evaluates rules over minutes, so the scrapes are replayed one per minute, with every
counter scaled by 60 to keep its rate per second. An alert is expected where the recorded rate
stays clear of its threshold (a tenth either way) at every evaluation its `for` spans; series
too close to call are left out. `up` and the lost-event series of the second host are made up
(Prometheus writes `up` itself; serve counting in the kernel loses no events): the file says so.
Needs root, /dev/kvm and two CPUs.
"""
import re
import socket
import os
import yaml
import subprocess
import sys
import time
import urllib.request

VIRTPROF = sys.argv[1] if len(sys.argv) > 1 else "target/debug/virtprof"
SCRAPES = 18  # minutes once replayed: 5m ranges and 10m `for`s, then a margin
SCALE = 60  # one scrape a second, replayed one a minute
HOST = {"job": "virtprof", "instance": "kvm-host-1"}
KEEP = {
    "virtprof_vcpu_wait_seconds_total",
    "virtprof_vcpu_exits_total",
    "virtprof_vmm_thread_wait_seconds_total",
    "virtprof_vm_lost_by_seconds_total",
    "virtprof_vm_lost_seconds_total",
    "virtprof_trace_lost_events_total",
}
SAMPLE = re.compile(r'^([a-z_]+)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-z_]+)="((?:[^"\\]|\\.)*)"')


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(url):
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    series = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m and m.group(1) in KEEP:
            labels = tuple(sorted(dict(LABEL.findall(m.group(2) or ""), **HOST).items()))
            series[(m.group(1), labels)] = float(m.group(3))
    return series


def main():
    run = ["--duration", "40s", "--json"]
    vms = [
        subprocess.Popen([VIRTPROF, "testvm", "--vms", "2", "--pin", "0", "--name", "pinned", *run],
                         stdout=subprocess.DEVNULL),
        subprocess.Popen([VIRTPROF, "testvm", "-w", "pio-kernel", "--pin", "1", "--name", "storm", *run],
                         stdout=subprocess.DEVNULL),
        # Its I/O thread on the pinned VMs' CPU: each request waits behind them.
        subprocess.Popen([VIRTPROF, "testvm", "-w", "io-bound", "--io-latency", "20us", "--io-thread", "0",
                          "--pin", "1", "--name", "starved", *run], stdout=subprocess.DEVNULL),
    ]
    port = free_port()
    serve = subprocess.Popen([VIRTPROF, "serve", "--listen", f"127.0.0.1:{port}", "--max-age", "0"],
                             stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        time.sleep(2)
        scrapes = []
        for _ in range(SCRAPES):
            scrapes.append(scrape(url))
            time.sleep(1)
    finally:
        serve.terminate()
        serve.wait()
        for vm in vms:
            vm.kill()
            vm.wait()
    write(scrapes)


def rate(values, minute):
    """Per second over the 5 minutes up to `minute`, as the replay has it (no extrapolation:
    the margin covers it)."""
    first = max(0, minute - 5)
    return (values[minute] - values[first]) / ((minute - first) * 60)


def fires(values, threshold, hold):
    """True / False where every evaluation from `hold` minutes before the end agrees, else None."""
    end = len(values) - 1
    rates = [rate(values, m) for m in range(end - hold, end + 1)]
    if all(r > threshold * 1.1 for r in rates):
        return True
    if all(r < threshold * 0.9 for r in rates):
        return False
    return None


def yaml_str(text):
    """A double-quoted YAML scalar."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def write(scrapes):
    keys = sorted(set().union(*scrapes))
    # Series present in every scrape only (a VM that came or went mid-run is left out).
    keys = [k for k in keys if all(k in s for s in scrapes)]
    end = len(scrapes) - 1
    rules = {
        # alert: (metric, threshold per second, `for` in minutes), per series
        "VcpuWaitingForCpu": ("virtprof_vcpu_wait_seconds_total", 0.2, 10),
        "VmmIoThreadStarved": ("virtprof_vmm_thread_wait_seconds_total", 0.1, 10),
    }
    inputs, alerts = [], {name: [] for name in
                          ["VcpuWaitingForCpu", "VmExitStorm", "VmmIoThreadStarved", "VmSlow", "VmCpuTakenBy"]}
    left_out = 0
    for name, labels in keys:
        values = [s[(name, labels)] * SCALE for s in scrapes]
        d = dict(labels)
        verdict = True
        for alert, (metric, threshold, hold) in rules.items():
            if name != metric:
                continue
            if alert == "VmmIoThreadStarved" and d.get("role") not in ("io-thread", "main-loop", "vhost", "worker"):
                continue
            verdict = fires(values, threshold, hold)
            if verdict:
                alerts[alert].append(d)
        if verdict is None:
            left_out += 1
            continue
        inputs.append((name, d, values))
    # Sums by VM and by (VM, who): the storm and who-took-the-CPU rules.
    for alert, metric, by, threshold in [
        ("VmExitStorm", "virtprof_vcpu_exits_total", ("instance", "vm", "pid"), 10000),
        ("VmSlow", "virtprof_vm_lost_seconds_total", ("instance", "vm", "pid", "cause"), 0.2),
        ("VmCpuTakenBy", "virtprof_vm_lost_by_seconds_total", ("instance", "vm", "pid", "by"), 0.2),
    ]:
        groups = {}
        for name, d, values in inputs:
            if name == metric:
                key = tuple((k, d.get(k, "")) for k in by)
                groups.setdefault(key, []).append(values)
        for key, members in groups.items():
            summed = [sum(v[i] for v in members) for i in range(end + 1)]
            verdict = fires(summed, threshold, 10)
            if verdict is None:
                inputs = [i for i in inputs if not (i[0] == metric and all(i[1].get(k, "") == v for k, v in key))]
                left_out += len(members)
            elif verdict:
                alerts[alert].append(dict(key))
    out = sys.stdout
    out.write("# Made by scripts/alerts/record-series.py from a real `virtprof serve` (see there);\n")
    out.write(f"# {len(inputs)} recorded series, {left_out} too close to a threshold to call left out.\n")
    out.write("rule_files: [alerts.yml]\nevaluation_interval: 1m\ntests:\n")
    out.write("  - interval: 1m\n    input_series:\n")
    for name, d, values in inputs:
        labels = ",".join(f'{k}="{v}"' for k, v in sorted(d.items()))
        out.write(f"      - series: '{name}{{{labels}}}'\n")
        out.write(f"        values: '{' '.join(f'{v:.6g}' for v in values)}'\n")
    # Made up: host 1 answers every scrape; host 2 stops answering at minute 5, and had lost
    # events before (a traced serve).
    out.write("      # Made up (Prometheus writes `up`; a serve counting in the kernel loses none):\n")
    out.write(f"      - series: 'up{{job=\"virtprof\",instance=\"kvm-host-1\"}}'\n        values: '1x{end}'\n")
    out.write(f"      - series: 'up{{job=\"virtprof\",instance=\"kvm-host-2\"}}'\n        values: '1x4 0x{end - 4}'\n")
    out.write(f"      - series: 'virtprof_trace_lost_events_total{{job=\"virtprof\",instance=\"kvm-host-2\"}}'\n"
              f"        values: '0x2 120x{end - 2}'\n")
    rules_file = os.path.join(os.path.dirname(__file__), "../../deploy/prometheus/alerts.yml")
    annotations = {r["alert"]: r["annotations"] for g in yaml.safe_load(open(rules_file))["groups"] for r in g["rules"]}
    severities = {r["alert"]: r["labels"]["severity"] for g in yaml.safe_load(open(rules_file))["groups"] for r in g["rules"]}

    def exp_alert(alert, labels):
        labels = dict(labels, severity=severities[alert])
        out.write("          - exp_labels:\n")
        for k, v in sorted(labels.items()):
            out.write(f"              {k}: {yaml_str(v)}\n")
        out.write("            exp_annotations:\n")
        for k, template in sorted(annotations[alert].items()):
            text = re.sub(r"\{\{ \$labels\.([a-z_]+) \}\}", lambda m: labels.get(m.group(1), ""), template)
            out.write(f"              {k}: {yaml_str(text)}\n")

    out.write("    alert_rule_test:\n")
    expected = dict(alerts)
    expected["VirtprofDown"] = [{"job": "virtprof", "instance": "kvm-host-2"}]
    for alert in sorted(expected):
        out.write(f"      - eval_time: {end}m\n        alertname: {alert}\n")
        if not expected[alert]:
            out.write("        exp_alerts: []\n")
            continue
        out.write("        exp_alerts:\n")
        for labels in sorted(expected[alert], key=lambda d: sorted(d.items())):
            exp_alert(alert, labels)
    # Lost events: the made-up increase at minute 3 is inside the 10 minutes before minute 12.
    out.write("      - eval_time: 12m\n        alertname: VirtprofLostEvents\n        exp_alerts:\n")
    exp_alert("VirtprofLostEvents", {"job": "virtprof", "instance": "kvm-host-2"})
    out.write(f"      - eval_time: {end}m\n        alertname: VirtprofLostEvents\n        exp_alerts: []\n")


if __name__ == "__main__":
    main()
