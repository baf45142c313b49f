"""The VrtProf study's tables from its runs (benches/papers/vrtprof.sh writes them).

    python3 benches/papers/vrtprof_table.py OUT "WORKLOADS"

From each run's workload result (OUT/WORKLOAD-{native,guest}-N.result) and `virtprof compare
--json --matrix` over every native run against every guest run (OUT/all.json): each workload's
own rate per side, the guest runs' exit rates by reason (Fig. 4's counterpart), the guest's
interrupts against the host's exits by reason (Fig. 3's VT events), and the correlation changes
between the sides beyond the runs' spread (Figs. 2-3). Every figure with its spread and runs.
"""

import glob
import os
import statistics
import sys

from study import guard_note, load, result


def rates(out, workload, side):
    values = []
    for path in sorted(glob.glob(os.path.join(out, f"{workload}-{side}-*.result"))):
        kv = result(path)
        if kv and "ops" in kv and "seconds" in kv:
            values.append((float(kv["ops"]) / float(kv["seconds"]), kv.get("unit", "ops")))
    return values


def spread(values):
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):,.1f} ± {sd:,.1f} (n={len(values)})"


def with_sd(r, sd):
    return f"{r:+.2f}" + ("" if sd is None else f" ± {sd:.2f}")


def workloads_table(out, workloads):
    print("## Workloads, each side's own count per second (mean ± sd over runs)\n")
    print("| workload | unit | native | guest | guest / native |")
    print("|---|---|---|---|---|")
    for w in workloads:
        native, guest = rates(out, w, "native"), rates(out, w, "guest")
        if not native or not guest:
            print(f"| {w} | | {spread([x for x, _ in native]) if native else '-'} | "
                  f"{spread([x for x, _ in guest]) if guest else '-'} | |")
            continue
        ratio = statistics.mean(x for x, _ in guest) / statistics.mean(x for x, _ in native)
        print(f"| {w} | {native[0][1]}/s | {spread([x for x, _ in native])} | "
              f"{spread([x for x, _ in guest])} | {ratio:.3f} |")
    print()


def exit_rates(every):
    exits = [r for r in every["rates"] if r["metric"].startswith("trace.exit.") and r["b_per_second"]]
    print(f"## Exit rates in the guest runs (traced kvm_exit by reason, per second, {len(every['b'])} runs)\n")
    if not exits:
        print("No traced kvm_exit in the guest runs: the guest made no exits this host can trace "
              "(under QEMU TCG a guest makes none).\n")
        return
    print("| reason | per second | sd | runs |")
    print("|---|---:|---:|---:|")
    for r in sorted(exits, key=lambda r: -r["b_per_second"]):
        sd = "-" if r["b_sd"] is None else f"{r['b_sd']:,.1f}"
        print(f"| {r['metric'][len('trace.exit.'):]} | {r['b_per_second']:,.1f} | {sd} | {r['b_runs']} |")
    total = sum(r["b_per_second"] for r in exits)
    print(f"| all | {total:,.1f} | | |\n")


BARS = " ▁▂▃▄▅▆▇█"


def exit_timelines(every):
    """Fig. 4's counterpart: each guest run's exits per second over time, as a line of bars."""
    runs = (every.get("exit_rates") or [[], []])[1]
    if not runs:
        return
    top = max((max(r["per_s"], default=0) for r in runs), default=0) or 1
    print(f"## Exit rate over time, each guest run (`{runs[0]['counts']}`; one bar per interval, "
          f"full bar = {top:,.0f}/s)\n")
    print("```")
    for r in runs:
        line = "".join(BARS[min(int(v / top * (len(BARS) - 1) + 0.5), len(BARS) - 1)] for v in r["per_s"])
        print(f"{os.path.basename(r['path']):<24} |{line}|")
    print("```\n")


def interrupts_against_exits(every):
    """Pairs of a guest interrupt series and a host exit reason, as correlated in the guest runs."""
    pairs = []
    for c in every["changes"]:
        names = (c["a"], c["b"])
        irq = next((n for n in names if n.startswith("guest") and ".irq." in n), None)
        exit_reason = next((n for n in names if n.startswith("trace.exit.")), None)
        if irq and exit_reason and c["r_in_b"] is not None:
            pairs.append((c["r_in_b"], c["b_sd"], irq, exit_reason))
    print("## The guest's interrupts against the host's exits by reason, in the guest runs "
          "(Pearson r, mean ± sd over runs; |r| ≥ 0.5)\n")
    strong = sorted((p for p in pairs if abs(p[0]) >= 0.5), key=lambda p: -p[0])
    if not strong:
        print(f"None of the {len(pairs)} pairs the guest runs define reaches |r| 0.5.\n")
        return
    print("| guest interrupt | host exit | r |")
    print("|---|---|---:|")
    for r, sd, irq, exit_reason in strong:
        print(f"| {irq} | {exit_reason[len('trace.exit.'):]} | {with_sd(r, sd)} |")
    print()


def changes(every):
    # Pairs both sides define (a metric the native side has no source for, such as the guest's
    # eth0, is no change under virtualization), largest changes first.
    both = [c for c in every["changes"] if c["r_in_a"] is not None and c["r_in_b"] is not None]
    beyond = [c for c in both if c["beyond_spread"]]
    print(f"## Correlation changes, native ({len(every['a'])} runs) -> guest ({len(every['b'])} runs), all workloads\n")
    print(f"{len(both)} pairs defined on both sides; {len(beyond)} changed beyond the runs' spread. The 20 largest:\n")
    print("| change | metric | metric | native r | guest r | beyond spread |")
    print("|---|---|---|---|---|---|")
    for c in both[:20]:
        print(f"| {c['change']:+.2f} | {c['a']} | {c['b']} | {with_sd(c['r_in_a'], c['a_sd'])} | "
              f"{with_sd(c['r_in_b'], c['b_sd'])} | {'yes' if c['beyond_spread'] else ''} |")
    print()


def main():
    out, workloads = sys.argv[1], sys.argv[2].split()
    workloads_table(out, workloads)
    every = load(os.path.join(out, "all.json"))
    if every is None:
        print(f"No {out}/all.json (`virtprof compare` over every run): the correlation tables need it.\n")
    else:
        exit_rates(every)
        exit_timelines(every)
        interrupts_against_exits(every)
        changes(every)
    guard_note()


if __name__ == "__main__":
    main()
