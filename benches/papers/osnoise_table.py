"""The osnoise-for-VMs study's tables from its runs (benches/papers/osnoise.sh writes them).

    python3 benches/papers/osnoise_table.py OUT [RUNS]

Figs. 15/16: the noise loop natively in L1 (OUT/l1-{isolated,nohz}-N.noise.json) against L2's
loop before and after L1's account of its vCPU is taken out. Table 1: exits timed from inside L2 (`agent --noise-probe`, each step between two clock reads
one exit; OUT/agent-{cpuid,inb}.noise.json) beside L1's kvm_exit->kvm_entry of the same vCPU
(OUT/agent-*.exits.json, `exits --vcpu 1`). Table 2: the probe loop's cost per step with L1
not tracing and tracing (`noise --probe`, JSON in OUT/probes.console). Fig. 17: light and
heavy exits of L2's CPU 1 under the plain noise loop. Figs. 22-24: steal and hypervisor noise
in the four isolation setups, with the host events that explain what remains. The seed's
numbers are quoted exactly beside ours.
"""

import json
import os
import re
import statistics
import sys

from study import guard_note, load, scan_guards

# Seed 004, Table 1: instruction, n., average overhead ns, min. overhead ns.
PAPER_TABLE1 = {"CPUID": (16040, 2535.42, 2199), "I/O": (125178, 13734.75, 9534)}
# Table 2: clock cycles without and with osnoise.
PAPER_TABLE2 = {"CPUID": (6280, 8483), "I/O": (19942, 22631)}
PROBES = [("CPUID", "cpuid", "cpuid"), ("I/O", "inb", "inb:0x3fd")]
SETUPS = [("untuned", "no tuning"), ("guest-isolated", "guest isolation (L2 isolcpus=1)"),
          ("host-isolated", "host isolation (L1 isolcpus=1, vCPU 1 alone on L1 CPU 1)"),
          ("both-isolated", "host and guest isolation"),
          ("nohz-isolated", "host and guest isolation, both also nohz_full=1 rcu_nocbs=1")]
# Noise classes of a native `virtprof noise` that come from below the kernel measuring: in L1
# (a guest of QEMU TCG) what no traced L1 context explains is L1's "hardware".
BELOW = ("hw", "steal", "hyp", "hyp_lw", "hyp_hw")


def console_json(path):
    """Every `L2-JSON-BEGIN NAME` ... `L2-JSON-END NAME` document of a console, by name."""
    docs = {}
    try:
        text = open(path, errors="replace").read().replace("\r", "")
    except OSError:
        return docs
    for m in re.finditer(r"L2-JSON-BEGIN (\S+)\n(.*?)\nL2-JSON-END \1", text, re.S):
        try:
            docs[m.group(1)] = json.loads(m.group(2))
        except ValueError:
            pass
    return docs


def cpu_noise(out, name):
    """The first guest CPU of OUT/NAME.noise.json and its guest, or (None, None)."""
    r = load(os.path.join(out, name + ".noise.json"))
    try:
        g = r["guests"][0]
        return g["cpus"][0], g
    except (TypeError, KeyError, IndexError):
        return None, None


def exits_of(out, name):
    """OUT/NAME.exits.json (`exits --vcpu 1`), or None."""
    return load(os.path.join(out, name + ".exits.json"))


def reason(exits, name):
    rows = [r for r in (exits or {}).get("by_reason", []) if r["reason"] == name]
    return rows[0] if rows else None


def us(ns):
    return "-" if ns is None else f"{ns / 1000:.2f}"


def table1(out):
    print("### Table 1: exits timed from inside the guest and by the host")
    print()
    print("| exit | the paper (n., avg, min overhead) | inside L2: samples, avg, min (µs) | L1 kvm_exit→kvm_entry: "
          "count, avg, min (µs) | samples the host names by that exit | clock bound (µs) |")
    print("|---|---|---|---|---|---|")
    host_reason = {"cpuid": "cpuid", "inb": "io"}
    for label, name, _ in PROBES:
        n, avg, mn = PAPER_TABLE1[label]
        cpu, guest = cpu_noise(out, "agent-" + name)
        host = reason(exits_of(out, "agent-" + name), host_reason[name])
        if cpu is None:
            print(f"| {label} | {n}, {avg} ns, {mn} ns | (no run) | | | |")
            continue
        s = cpu
        inside = f"{s['samples']}, {us(s['noise_ns'] / max(s['samples'], 1))}, {us(s.get('min_single_ns'))}"
        if s.get("dropped_samples"):
            inside += f" ({s['dropped_samples']} over the per-period cap)"
        by_host = "-" if host is None else f"{host['count']}, {us(host['avg_ns'])}, {us(host['min_ns'])}"
        # Samples are named by the exit in them: a heavyweight one by its way out to the VMM.
        named = {"cpuid": "cpuid", "inb": "KVM_EXIT_IO"}[name]
        explained = cpu.get("exit_reasons", {}).get(named, 0)
        outside = cpu.get("outside_trace_samples", 0)
        bound = f"±{us(guest['median_bound_ns'])} (max ±{us(guest['max_bound_ns'])})"
        print(f"| {label} | {n}, {avg} ns, {mn} ns | {inside} | {by_host} | {explained} of {s['samples']} "
              f"({outside} before the trace began) | {bound} |")
    print()


def table2(out):
    docs = console_json(os.path.join(out, "probes.console"))
    print("### Table 2: the probe loop's step with the host not tracing and tracing")
    print()
    print("| exit | the paper (cycles, no osnoise / with) | L2 step, L1 not tracing: avg, min (µs) "
          "| L1 tracing (`virtprof record`): avg, min (µs) | change of the average |")
    print("|---|---|---|---|---|")
    for label, _, probe in PROBES:
        a, b = PAPER_TABLE2[label]
        row = []
        for phase in ("untraced", "traced"):
            d = docs.get(f"{phase}-{probe}")
            t = d["cpus"][0]["total"] if d else None
            row.append(None if not t or not t["samples"] else (t["noise_ns"] / t["samples"], t.get("min_single_ns")))
        cells = ["(no run)" if r is None else f"{us(r[0])}, {us(r[1])}" for r in row]
        change = "-" if None in row else f"{100 * (row[1][0] / row[0][0] - 1):+.1f} %"
        print(f"| {label} | {a} / {b} ({100 * (b / a - 1):+.1f} %) | {cells[0]} | {cells[1]} | {change} |")
    print()


def runs_of(out, name, runs):
    """(run, OUT/NAME-RUN.noise.json's CPU, OUT/NAME-RUN.exits.json) of the runs that have both."""
    got = []
    for i in range(1, runs + 1):
        cpu, _ = cpu_noise(out, f"{name}-{i}")
        exits = exits_of(out, f"{name}-{i}")
        if cpu and exits:
            got.append((i, cpu, exits))
    return got


def spread(values, fmt="{:.1f}"):
    """Median and range of VALUES as text."""
    v = sorted(values)
    if not v:
        return "-"
    return fmt.format(statistics.median(v)) + (f" ({fmt.format(v[0])}–{fmt.format(v[-1])})" if len(v) > 1 else "")


def fig17(out, runs):
    print("### Fig. 17: lightweight and heavyweight exits of the vCPU running the noise loop")
    print()
    print("Median (range) over the runs of each setup; every exit of L2's CPU 1 while L1 recorded.")
    print()
    print("| setup | runs | exits | lightweight % | heavyweight % | top reasons (first run) |")
    print("|---|---|---|---|---|---|")
    for name, label in SETUPS:
        got = runs_of(out, name, runs)
        if not got:
            print(f"| {label} | 0 | | | | |")
            continue
        totals = [e["totals"] for _, _, e in got]
        light = [100 * t["lightweight"] / max(t["exits"], 1) for t in totals]
        heavy = [100 * t["heavyweight"] / max(t["exits"], 1) for t in totals if t.get("heavyweight") is not None]
        top = ", ".join(f"{r['reason']} {r['count']}" for r in got[0][2]["by_reason"][:4])
        print(f"| {label} | {len(got)} | {spread([t['exits'] for t in totals], '{:.0f}')} | {spread(light)} "
              f"| {spread(heavy) if heavy else 'unknown'} | {top} |")
    print()


def figs22_24(out, runs):
    print("### Figs. 22-24: steal and hypervisor noise on L2's CPU 1 by setup")
    print()
    print("Median (range) over the runs; ms over about 10 s of the noise loop (900 ms of every 1 s).")
    print()
    print("| setup | noise ms | % available | max single ms | steal ms (host trace) | hypervisor ms | "
          "explained % | who took the vCPU's CPU (ms, all runs) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, label in SETUPS:
        got = runs_of(out, name, runs)
        if not got:
            print(f"| {label} | (no run) | | | | | | |")
            continue
        cpus = [c for _, c, _ in got]
        hyp = [sum(c["by_cause"].get(k, {}).get("ns", 0) for k in ("hyp_lw", "hyp_hw", "hyp")) / 1e6 for c in cpus]
        who = {}
        for c in cpus:
            for k, v in c.get("preemptors", {}).items():
                who[k] = who.get(k, 0) + v
        top = ", ".join(f"{k} {v / 1e6:.1f}" for k, v in sorted(who.items(), key=lambda kv: -kv[1])[:4]) or "-"
        print(f"| {label} | {spread([c['noise_ns'] / 1e6 for c in cpus])} | {spread([c['available_pct'] for c in cpus])} "
              f"| {spread([c['max_single_ns'] / 1e6 for c in cpus], '{:.2f}')} | {spread([c['host_steal_ns'] / 1e6 for c in cpus])} "
              f"| {spread(hyp)} | {spread([c['explained_pct'] for c in cpus])} | {top} |")
    print()
    print("What explains the samples, by run:")
    print()
    for name, label in SETUPS:
        for i, cpu, _ in runs_of(out, name, runs):
            causes = ", ".join(f"{k} {v['samples']} samples {v['ns'] / 1e6:.1f} ms" for k, v in cpu["by_cause"].items())
            reasons = ", ".join(f"{k} {v}" for k, v in sorted(cpu["exit_reasons"].items(), key=lambda kv: -kv[1])[:5])
            print(f"- {label}, run {i}: {causes}; exits in samples: {reasons or 'none'}")
    print()


def l1_rates(out, name, runs):
    """[(noise, noise from below L1's kernel)] in ms per s measured, of L1's native loops."""
    got = []
    for i in range(1, runs + 1):
        r = load(os.path.join(out, f"{name}-{i}.noise.json"))
        try:
            total = r["cpus"][0]["total"]
            seconds = total["runtime_ns"] / 1e9
            below = sum(total["noise_ns_by_class"].get(k, 0) for k in BELOW)
            got.append((total["noise_ns"] / 1e6 / seconds, below / 1e6 / seconds))
        except (TypeError, KeyError, IndexError, ZeroDivisionError):
            continue
    return got


def l2_rates(out, name, runs):
    """[(noise, noise nothing on L1 explains)] in ms per s measured, of L2's loops."""
    got = []
    for _, cpu, _ in runs_of(out, name, runs):
        seconds = cpu["measured_ns"] / 1e9
        if seconds > 0:
            unexplained = cpu["by_cause"].get("unexplained", {}).get("ns", 0)
            got.append((cpu["noise_ns"] / 1e6 / seconds, unexplained / 1e6 / seconds))
    return got


def figs15_16(out, runs):
    print("### Figs. 15/16: hardware noise, the host's own against what the guest has left")
    print()
    print("ms of noise per s measured, median (range) over runs. In L1 (itself a guest of QEMU TCG) "
          "\"hardware\" is what no traced L1 context explains; in L2, before L1's account it is "
          "all the loop's noise (an upper bound of what osnoise in a guest without the seed's "
          "extension calls hardware: it adds the guest's own interrupts, which the agent's loop "
          "does not trace apart), after it the samples with nothing on L1 within the clock's "
          "bound.")
    print()
    print("| where the loop ran | runs | noise | \"hardware\" |")
    print("|---|---|---|---|")
    rows = [("L1 natively, isolcpus=1 (the host's own)", l1_rates(out, "l1-isolated", runs), 1),
            ("L2, host and guest isolated: before L1's account", l2_rates(out, "both-isolated", runs), 0),
            ("L2, host and guest isolated: after L1's account", l2_rates(out, "both-isolated", runs), 1),
            ("L1 natively, isolcpus=1 nohz_full=1 rcu_nocbs=1", l1_rates(out, "l1-nohz", runs), 1),
            ("L2, nohz_full on both: after L1's account", l2_rates(out, "nohz-isolated", runs), 1)]
    for label, got, which in rows:
        if not got:
            print(f"| {label} | 0 | | |")
            continue
        print(f"| {label} | {len(got)} | {spread([g[0] for g in got], '{:.2f}')} | "
              f"{spread([g[which] for g in got], '{:.2f}')} |")
    print()
    print("Seed 004 (Figs. 15/16): the guest's hardware noise falls from the vanilla tool's to the "
          "extension's, which \"matched that obtained when running osnoise directly on the host\".")
    print()


def main():
    out = sys.argv[1]
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    table1(out)
    table2(out)
    figs15_16(out, runs)
    fig17(out, runs)
    figs22_24(out, runs)

    scan_guards(sys.argv[1])
    guard_note()


if __name__ == "__main__":
    main()
