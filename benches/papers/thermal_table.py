"""The thermal-balancing study's tables from its runs (benches/papers/thermal.sh writes them).

    python3 benches/papers/thermal_table.py OUT "FREQUENCIES" "WORKLOADS"

Per forced swap frequency, beside the seed's figures (seed 002, quoted exactly): iperf3's
throughput to the guest (Tables 6.1/6.2), the build's duration (Table 6.3) and their loss
against 0 Hz; the swaps requested and realized (Table 6.4's rows, from `balance --verify`);
the energy the model charged the two cores and how much of their busy time it covers. Each
figure is the mean over the runs that have it, with the sample standard deviation and the
number of runs; a run that failed is left out and said.
"""

import glob
import os
import statistics
import sys

from study import guard_note, load, result

# Seed 002, Table 6.1: Netperf Mbit/s (eager, lazy) per migration frequency.
PAPER_NETPERF = {0: (846.25, 846.25), 1: (841.40, 844.67), 10: (841.77, 844.91), 20: (846.51, 849.92),
                 100: (855.64, 858.84), 1000: (855.72, 859.12)}
# Table 6.3: kernel build, total execution time s and performance loss %.
PAPER_BUILD = {0: (187, 0.0), 1: (191, 2.1), 10: (191, 2.1), 20: (193, 3.2), 100: (199, 6.4), 1000: (209, 11.8)}
# Table 6.4: different mappings (Dm), realized mappings (Rm), realized ratio (Rr).
PAPER_MAPPINGS = {1: (191, 191, 1.00), 10: (1913, 1913, 1.00), 20: (3867, 3867, 1.00),
                  100: (19994, 19095, 0.96), 1000: (209648, 139110, 0.66)}




def runs(out, workload, hz):
    """(result, balance report) of every run of WORKLOAD at HZ that has both."""
    found, failed = [], []
    for path in sorted(glob.glob(os.path.join(out, f"{workload}-{hz}hz-*.result"))):
        base = path[: -len(".result")]
        kv, bal = result(path), load(base + ".balance.json")
        if kv and bal:
            found.append((kv, bal))
        else:
            failed.append(os.path.basename(base))
    return found, failed


def stats(values):
    """'mean ± sd (n)' of VALUES, or '-' when there are none."""
    if not values:
        return "-", None
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.2f} ± {sd:.2f} ({len(values)})", mean


def loss(value, base):
    return "-" if value is None or not base else f"{100.0 * (base - value) / base:+.1f}"


def slowdown(value, base):
    return "-" if value is None or not base else f"{100.0 * (value - base) / base:+.1f}"


def main():
    out, freqs, workloads = sys.argv[1], [int(f) for f in sys.argv[2].split()], sys.argv[3].split()
    failures = []

    # Per workload: its title, the figure of one run, its column's name, the change against
    # 0 Hz (positive: worse), the extra column, and the seed's figure.
    tables = {
        "iperf": ("Tables 6.1/6.2: iperf3 to the guest over virtio-net (tap)",
                  lambda kv: 8 * int(kv["ops"]) / float(kv["seconds"]) / 1e6, "Mbit/s", loss,
                  ("swaps/s", lambda found: f"{stats([b['swaps_per_s'] for _, b in found])[1] or 0:.1f}"),
                  ("seed Netperf Mbit/s eager / lazy (Table 6.1)",
                   lambda hz: f"{PAPER_NETPERF[hz][0]} / {PAPER_NETPERF[hz][1]}")),
        "build": ("Table 6.3: a build in the guest (tcc, 8 files compiled and linked)",
                  lambda kv: float(kv["seconds"]) / int(kv["ops"]) if int(kv["ops"]) > 0 else None,
                  "s per build", slowdown,
                  ("builds", lambda found: str(sum(int(kv["ops"]) for kv, _ in found))),
                  ("seed: kernel build s, loss % (Table 6.3)",
                   lambda hz: f"{PAPER_BUILD[hz][0]} s, {PAPER_BUILD[hz][1]} %")),
    }
    for workload in [w for w in workloads if w in tables]:
        title, figure, unit, change, (extra, extra_cell), (seed, seed_cell) = tables[workload]
        print(f"### {title}, by swap frequency")
        print()
        print(f"| Hz | {unit} (mean ± sd (runs)) | worse than 0 Hz % | {extra} | {seed} |")
        print("|---:|---:|---:|---:|---:|")
        base = None
        for hz in freqs:
            found, failed = runs(out, workload, hz)
            failures += failed
            text, mean = stats([v for v in (figure(kv) for kv, _ in found) if v is not None])
            base = mean if hz == 0 else base
            print(f"| {hz} | {text} | {change(mean, base) if hz else '0'} | {extra_cell(found)} | "
                  f"{seed_cell(hz) if hz in PAPER_BUILD else '-'} |")
        print()

    print("### Table 6.4: swaps requested and realized, as the kernel's sched trace saw them (all runs)")
    print()
    print("Requested: forced ticks that fell due; carried out: swaps made (a late wake-up skips the"
          " ticks it missed); placements: thread moves (2 per swap, 2 initial pins); seen: placements"
          " after which the thread was traced on its new CPU; wrong: traced on another CPU before its"
          " next move; lost: trace events lost. realized = carried out / requested, the counterpart"
          " of the seed's Rr (realized over requested mappings); seen / placements is another"
          " quantity, not the seed's.")
    print()
    print("| Hz | requested | carried out | realized | placements | seen | wrong | lost |"
          " seen / placements | seed Dm / Rm / Rr (Table 6.4) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for hz in freqs:
        found = [b for w in workloads for _, b in runs(out, w, hz)[0]]
        if not found:
            continue
        due = sum(b["forced_due"] for b in found)
        made = sum(b["swap_count"] for b in found)
        v = [b["verify"] for b in found if b.get("verify")]
        placed = sum(x["placements"] for x in v)
        seen = sum(x["observed"] for x in v)
        wrong = sum(x["wrong_cpu"] for x in v)
        lost = sum(x["lost_events"] for x in v)
        paper = PAPER_MAPPINGS.get(hz)
        ratio = f"{seen / placed:.2f}" if placed else "-"
        realized = f"{made / due:.2f}" if due else "-"
        print(f"| {hz} | {due} | {made} | {realized} | {placed} | {seen} | {wrong} | {lost} | {ratio} | "
              f"{f'{paper[0]} / {paper[1]} / {paper[2]:.2f}' if paper else '-'} |")
    print()

    print("### Energy: what the model charged the two cores, and what it covers")
    print()
    print("| workload | Hz | core J (CPU 0 / CPU 1) | per-core gap J | CPUs busy s | vCPUs ran s | covered % |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    unavailable = set()
    for w in workloads:
        for hz in freqs:
            found = [b for _, b in runs(out, w, hz)[0]]
            if not found:
                continue
            for b in found:
                unavailable.update(b.get("unavailable_metrics", []))
            j = [statistics.fmean(b["cores"][c]["total_j"] for b in found) for c in range(2)]
            gap = statistics.fmean(b["gap_j"] for b in found)
            busy = [sum(c["busy_s"] for c in b["core_time"]) for b in found
                    if all(c["busy_s"] is not None for c in b["core_time"])]
            vcpu = [sum(c["vcpu_s"] for c in b["core_time"]) for b in found]
            busy_m = statistics.fmean(busy) if busy else None
            vcpu_m = statistics.fmean(vcpu)
            cover = f"{100 * vcpu_m / busy_m:.0f}" if busy_m else "unknown"
            print(f"| {w} | {hz} | {j[0]:.1f} / {j[1]:.1f} | {gap:.2f} | "
                  f"{'unknown' if busy_m is None else f'{busy_m:.2f}'} | {vcpu_m:.2f} | {cover} |")
    print()
    if unavailable:
        print(f"Weighted events the model has no count of on this host (charged nothing, said so): "
              f"{', '.join(sorted(unavailable))}.")
    if failures:
        print(f"Runs left out (failed; their logs are in {out}): {', '.join(failures)}.")

    guard_note()

if __name__ == "__main__":
    main()
