"""The XenMon study's table from its runs (benches/papers/xenmon.sh writes them).

    python3 benches/papers/xenmon_table.py OUT "RATIOS" "CONNECTIONS" ["RATES"]

Per configuration (I/O side : vCPUs) and load step (wrk's connections, or with RATES the
open-loop load's offered requests a second), the mean over runs of: the throughput (± its
standard deviation over the runs) and response time; for an open-loop load, the requests that
failed or timed out and those the client sent late or not at all (then it, not the server,
set the pace); the vCPUs' and the I/O side's CPU use (% of the one host CPU they share,
XenMon's Fig. 4), their waiting and blocked shares (Figs. 5, 6: the vCPUs' mean, and the main
loop's, which does the I/O side's network work), executions per second and CPU time per
execution of the main loop (Figs. 8, 9), and the guest's network packets per main-loop
execution (the stand-in for XenMon's page flips per Dom0 execution, Fig. 7b).
"""

import glob
import statistics
import sys

from study import guard_note, load, result


def number(kv, key):
    """A result's figure, or None where the run did not give it ("unknown")."""
    try:
        return float(kv[key])
    except (KeyError, ValueError):
        return None


def run_row(base):
    kv, sched, report = result(base + ".result"), load(base + ".sched.json"), load(base + ".report.json")
    if not kv or not sched or not report:
        return None
    vm = next((v for v in sched["windows"][-1]["vms"] if v["kind"] == "qemu"), None)
    if vm is None:
        return None
    roles = {r["role"]: r for r in vm["roles"]}
    vcpu, main = roles.get("vcpu"), roles.get("main-loop")
    if not vcpu or not main:
        return None
    io_side_cpus = sum(r["cpus"] for r in vm["roles"] if r["role"] != "vcpu")
    packets = None
    for guest in report.get("guests") or []:
        names = ("net.eth0.rx_packets", "net.eth0.tx_packets")
        packets = sum(m["total"] for m in guest["metrics"] if m["metric"] in names)
    return {
        "rps": float(kv["ops"]) / float(kv["seconds"]),
        "latency_ms": None if number(kv, "latency_avg_us") is None else number(kv, "latency_avg_us") / 1000,
        "failed": None if number(kv, "sent") is None else number(kv, "errors") + number(kv, "timeouts"),
        "client_lag": None if number(kv, "sent") is None else number(kv, "late") + number(kv, "unsent"),
        "vcpu_cpu": 100 * vcpu["cpus"],
        "io_cpu": 100 * io_side_cpus,
        "vcpu_wait": vcpu["waiting_pct"],
        "vcpu_blocked": vcpu["blocked_pct"],
        "main_wait": main["waiting_pct"],
        "main_blocked": main["blocked_pct"],
        "main_execs": main["execs_per_s"],
        "main_us": main["cpu_per_exec_us"],
        "vcpu_execs": vcpu["execs_per_s"],
        "packets_s": packets / float(kv["seconds"]) if packets is not None else None,
        "packets_exec": packets / main["exec_count"] if packets is not None and main["exec_count"] else None,
        "lost": sched["lost_events"],
    }


def mean(rows, key):
    values = [r[key] for r in rows if r[key] is not None]
    return statistics.mean(values) if values else None


def cell(value, places=1):
    return "-" if value is None else f"{value:,.{places}f}"


COLUMNS = [
    ("req/s", "rps", 0),
    ("latency ms", "latency_ms", 2),
    ("failed or timed out", "failed", 0),
    ("sent late or not sent", "client_lag", 0),
    ("vCPUs CPU %", "vcpu_cpu", 1),
    ("I/O side CPU %", "io_cpu", 1),
    ("vCPU wait %", "vcpu_wait", 1),
    ("vCPU blocked %", "vcpu_blocked", 1),
    ("main loop wait %", "main_wait", 1),
    ("main loop blocked %", "main_blocked", 1),
    ("vCPU exec/s", "vcpu_execs", 0),
    ("main loop exec/s", "main_execs", 0),
    ("main loop µs/exec", "main_us", 1),
    ("packets/s", "packets_s", 0),
    ("packets per main-loop exec", "packets_exec", 2),
]


def main():
    out, ratios = sys.argv[1], sys.argv[2].split()
    rates = sys.argv[4].split() if len(sys.argv) > 4 else []
    # The open-loop study's steps are rates (files conf<R>-r<rate>-N), wrk's connections (-c<N>-).
    steps, prefix, step_name = (rates, "r", "offered req/s") if rates else (sys.argv[3].split(), "c", "connections")
    # The open-loop columns mean nothing for wrk's runs.
    columns = [c for c in COLUMNS if rates or c[1] not in ("failed", "client_lag")]
    print(f"| I/O : vCPU | {step_name} | runs | " + " | ".join(c[0] for c in columns) + " | lost events |")
    print("|---" * (len(columns) + 4) + "|")
    runs = {}
    for ratio in ratios:
        for step in steps:
            bases = sorted(p[: -len(".result")] for p in glob.glob(f"{out}/conf{ratio}-{prefix}{step}-*.result"))
            rows = runs[ratio, step] = [r for r in map(run_row, bases) if r]
            if not rows:
                print(f"| {ratio} | {step} | 0 | (every run failed: see its log) |")
                continue
            cells = [cell(mean(rows, key), places) for _, key, places in columns]
            if len(rows) > 1:
                cells[0] += f" ± {statistics.stdev(r['rps'] for r in rows):,.0f}"
            print(f"| {ratio} | {step} | {len(rows)} | " + " | ".join(cells) + f" | {sum(r['lost'] for r in rows)} |")
    print()
    ends(runs, ratios, steps, step_name)
    guard_note()


def ends(runs, ratios, steps, step_name):
    """The paper's comparison: the most I/O weight against the least, per load step, and
    whether the two differ beyond the runs' spread (the means further apart than the sum of
    their standard deviations)."""
    low, high = ratios[0], ratios[-1]
    print(f"I/O : vCPU {high} over {low}, per {step_name}:")
    print()
    print(f"| {step_name} | req/s | beyond the spread | packets per main-loop exec |")
    print("|---|---:|---|---:|")
    for step in steps:
        a, b = runs.get((low, step)), runs.get((high, step))
        if not a or not b or len(a) < 2 or len(b) < 2:
            print(f"| {step} | - | - | - |")
            continue
        ra, rb = [r["rps"] for r in a], [r["rps"] for r in b]
        beyond = abs(statistics.mean(rb) - statistics.mean(ra)) > statistics.stdev(ra) + statistics.stdev(rb)
        pa, pb = mean(a, "packets_exec"), mean(b, "packets_exec")
        packets = "-" if pa is None or pb is None or pa == 0 else f"{pb / pa:.2f}"
        print(f"| {step} | {statistics.mean(rb) / statistics.mean(ra):.2f} | {'yes' if beyond else 'no'} | {packets} |")
    print()


if __name__ == "__main__":
    main()
