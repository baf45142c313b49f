"""The osnoise-for-VMs study's tables from its runs (benches/papers/osnoise.sh writes them).

    python3 benches/papers/osnoise_table.py OUT

Table 1: exits timed from inside L2 (`agent --noise-probe`, each step between two clock reads
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
import sys

from study import load

# Seed 004, Table 1: instruction, n., average overhead ns, min. overhead ns.
PAPER_TABLE1 = {"CPUID": (16040, 2535.42, 2199), "I/O": (125178, 13734.75, 9534)}
# Table 2: clock cycles without and with osnoise.
PAPER_TABLE2 = {"CPUID": (6280, 8483), "I/O": (19942, 22631)}
PROBES = [("CPUID", "cpuid", "cpuid"), ("I/O", "inb", "inb:0x3fd")]
SETUPS = [("untuned", "no tuning"), ("guest-isolated", "guest isolation (L2 isolcpus=1)"),
          ("host-isolated", "host isolation (L1 isolcpus=1, vCPU 1 alone on L1 CPU 1)"),
          ("both-isolated", "host and guest isolation")]


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
        unexplained = cpu.get("by_cause", {}).get("unexplained", {}).get("samples", 0)
        bound = f"±{us(guest['median_bound_ns'])} (max ±{us(guest['max_bound_ns'])})"
        print(f"| {label} | {n}, {avg} ns, {mn} ns | {inside} | {by_host} | {explained} of {s['samples']} "
              f"({unexplained} with no host event) | {bound} |")
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


def fig17(out):
    print("### Fig. 17: lightweight and heavyweight exits of the vCPU running the noise loop")
    print()
    print("| setup | exits | lightweight | heavyweight | top reasons |")
    print("|---|---|---|---|---|")
    for name, label in SETUPS:
        e = exits_of(out, name)
        if not e:
            print(f"| {label} | (no run) | | | |")
            continue
        t = e["totals"]
        n = max(t["exits"], 1)
        heavy = "unknown" if t.get("heavyweight") is None else f"{t['heavyweight']} ({100 * t['heavyweight'] / n:.1f} %)"
        top = ", ".join(f"{r['reason']} {r['count']}" for r in e["by_reason"][:4])
        print(f"| {label} | {t['exits']} | {t['lightweight']} ({100 * t['lightweight'] / n:.1f} %) | {heavy} | {top} |")
    print()


def figs22_24(out):
    print("### Figs. 22-24: steal and hypervisor noise on L2's CPU 1 by setup")
    print()
    print("| setup | measured s | noise µs (% avail) | max single µs | steal µs (host trace) | hypervisor µs "
          "(light / heavy) | explained % | who took the CPU (µs) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, label in SETUPS:
        cpu, _ = cpu_noise(out, name)
        if cpu is None:
            print(f"| {label} | (no run) | | | | | | |")
            continue
        s, by = cpu, cpu.get("by_cause", {})
        light, heavy = by.get("hyp_lw", {}).get("ns", 0), by.get("hyp_hw", {}).get("ns", 0)
        who = ", ".join(f"{k} {v / 1000:.0f}" for k, v in sorted(cpu.get("preemptors", {}).items(),
                                                                   key=lambda kv: -kv[1])[:3]) or "-"
        print(f"| {label} | {s['measured_ns'] / 1e9:.2f} | {us(s['noise_ns'])} ({cpu['available_pct']:.3f} %) "
              f"| {us(s['max_single_ns'])} | {us(cpu['host_steal_ns'])} | {us(light + heavy)} ({us(light)} / {us(heavy)}) "
              f"| {cpu['explained_pct']:.1f} | {who} |")
    print()
    for name, label in SETUPS:
        cpu, _ = cpu_noise(out, name)
        if cpu:
            causes = ", ".join(f"{k} {v['samples']} samples {v['ns'] / 1000:.0f} µs" for k, v in cpu["by_cause"].items())
            reasons = ", ".join(f"{k} {v}" for k, v in sorted(cpu["exit_reasons"].items(), key=lambda kv: -kv[1])[:5])
            print(f"- {label}: {causes}; exits explaining samples: {reasons or 'none'}")
    print()


def main():
    out = sys.argv[1]
    table1(out)
    table2(out)
    fig17(out)
    figs22_24(out)


if __name__ == "__main__":
    main()
