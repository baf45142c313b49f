"""The boot-profiling study's tables from its boots (benches/papers/bootprof.sh writes them).

    python3 benches/papers/bootprof_table.py OUT RUNS [USERLAND_RUNS]

From each boot's `virtprof boot --recording --json` (OUT/{control,balloon}-N.boot.json) and its
console (the guest's uptime when its init ran): the realms (Fig. 3), the top 10 symbols with
realm, fraction and rank in every control boot and how far each rank moves (Table 1), the
ballooned symbol's fraction and the boots' length (Table 2), per-symbol profiles over the boot
(Figs. 5-7) as one line of bars per boot, and the rank correlation between boots. The seed's
figures are quoted exactly beside ours.
"""

import os
import re
import statistics
import sys

from study import guard_note, load, scan_guards

# Seed 003, Table 1: realm, symbol, fraction of time sampled, rank.
PAPER_TOP10 = [("Xen", "handle-exception", 0.28891, 1), ("Xen", "hypercall", 0.16096, 2),
               ("Xen", "hypercall-page", 0.12231, 3), ("User", "", 0.09183, 4),
               ("Kernel", "scrit", 0.07392, 5), ("Kernel", "system-call", 0.06101, 6),
               ("Kernel", "page-fault", 0.04858, 7), ("Kernel", "error-code", 0.03929, 8),
               ("Xen", "flush-area-local", 0.02421, "0 [sic]"), ("Kernel", "paging-init", 0.00968, 10)]
# Table 2: fraction of cycles sampled, boot-up time s, time in the symbol s.
PAPER_BALLOON = {"control": (0.019, 30.1, 0.6), "ballooned": (0.719, 94.2, 67.5)}
BALLOONED = "delay_tsc"
BARS = " ▁▂▃▄▅▆▇█"


def uptime(path):
    """The guest's uptime (s) when its init printed its marker, or None."""
    try:
        with open(path, errors="replace") as f:
            m = re.search(r"L2-INIT-MARKER uptime=([0-9.]+)", f.read())
    except OSError:
        return None
    return float(m.group(1)) if m else None


def boots(out, kind, runs):
    """[(run, profile, uptime)] of the boots of KIND that have a profile."""
    found = []
    for i in range(1, runs + 1):
        p = load(os.path.join(out, f"{kind}-{i}.boot.json"))
        if p:
            found.append((i, p, uptime(os.path.join(out, f"{kind}-{i}.console"))))
    return found


def mean_sd(values, fmt="{:.3f}"):
    if not values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{fmt.format(statistics.fmean(values))} ± {fmt.format(sd)}"


def symbol(profile, name):
    return next((s for s in profile["symbols"] if s["name"] == name), None)


def bars(counts, width=50):
    """COUNTS as one line of WIDTH bars, each the most in its stretch, scaled to the line's peak."""
    if not counts:
        return ""
    step = len(counts) / width if len(counts) > width else 1
    cells = [max(counts[int(k * step): max(int((k + 1) * step), int(k * step) + 1)])
             for k in range(min(width, len(counts)))]
    peak = max(cells) or 1
    return "".join(BARS[0 if c == 0 else max(1, round(8 * c / peak))] for c in cells)


def timeline(profile, name):
    for s in profile["bins"]["symbols"]:
        if s["name"] == name:
            return s["counts"]
    return None


def spearman(a, b, top=20):
    """Spearman's rho over the union of A's and B's top TOP symbols (absent: ranked last)."""
    names = [s["name"] for s in a["symbols"][:top]] + [s["name"] for s in b["symbols"][:top]]
    names = list(dict.fromkeys(names))
    rank = lambda p: {s["name"]: s["rank"] for s in p["symbols"]}
    ra, rb = rank(a), rank(b)
    last = max(len(a["symbols"]), len(b["symbols"])) + 1
    x = [ra.get(n, last) for n in names]
    y = [rb.get(n, last) for n in names]
    return statistics.correlation(x, y) if len(names) > 2 else float("nan")


def main():
    out, runs = sys.argv[1], int(sys.argv[2])
    userland = [(i, p) for i, p, _ in boots(out, "userland", int(sys.argv[3]) if len(sys.argv) > 3 else runs)]
    control, balloon = boots(out, "control", runs), boots(out, "balloon", runs)
    if not control:
        print("No control boot has a profile (see the boots' .log and .boot.err files).")
        print()
        last_mile(userland)
        scan_guards(sys.argv[1])
        guard_note()
        return
    first = control[0][1]
    print(f"Source: {first['source']}; {first['rate_hz']} samples/s. {first.get('note') or ''}")
    print()

    print("### Fig. 3: where the boot's time went, by realm (control boots)")
    print()
    print(f"| realm | share (mean ± sd over boots) | over control boot {control[0][0]} (per bin, scaled to its peak) |")
    print("|---|---:|---|")
    for realm in ["hypervisor", "firmware", "kernel", "user"]:
        shares = [p["realms"].get(realm, 0.0) for _, p, _ in control]
        line = bars(first["bins"]["realms"].get(realm, []))
        print(f"| {realm} | {mean_sd(shares)} | `{line}` |")
    print()
    print("Seed 003 (Fig. 3, Xen 3.0, Ubuntu 6.06): the Xen realm \"significant and relatively constant\"; "
          "the paper reads about 60 % of boot time as switching between realms (Section 4.4).")
    print()

    print("### Table 1: the top 10 symbols of the control boots (mean fraction), rank in each boot")
    print()
    names = {}
    for _, p, _ in control:
        for s in p["symbols"]:
            names.setdefault(s["name"], s["realm"])
    mean_fraction = {n: statistics.fmean((symbol(p, n) or {"fraction": 0.0})["fraction"] for _, p, _ in control)
                     for n in names}
    top = sorted(mean_fraction, key=lambda n: -mean_fraction[n])[:10]
    runs_header = " | ".join(f"rank, boot {i}" for i, _, _ in control)
    print(f"| rank | realm | symbol | fraction | {runs_header} | rank moves by | seed (Table 1): realm, symbol, fraction |")
    print("|---:|---|---|---:|" + "---:|" * len(control) + "---:|---|")
    for k, n in enumerate(top):
        ranks = [(symbol(p, n) or {}).get("rank") for _, p, _ in control]
        known = [r for r in ranks if r is not None]
        moves = max(known) - min(known) if known else "-"
        paper = PAPER_TOP10[k]
        cells = " | ".join("-" if r is None else str(r) for r in ranks)
        print(f"| {k + 1} | {names[n]} | `{n}` | {mean_fraction[n]:.4f} | {cells} | {moves} | "
              f"{paper[0]}, {paper[1] or '(user)'}, {paper[2]} (rank {paper[3]}) |")
    print()
    if len(control) > 1:
        pairs = [(a, b) for ai, (a, _, _) in enumerate([(i, p, u) for i, p, u in control])
                 for b in [i for i, _, _ in control][ai + 1:]]
        by_run = {i: p for i, p, _ in control}
        rhos = [f"boots {a}-{b}: {spearman(by_run[a], by_run[b]):.2f}" for a, b in pairs]
        print(f"Rank correlation of the top 20 between control boots (Spearman): {', '.join(rhos)}.")
        print()

    if balloon:
        ballooned_table(control, balloon)
    else:
        print("### Table 2: not run (this study boots no ballooned guest)")
        print()

    figures(top, names, control, balloon)
    last_mile(userland)
    scan_guards(sys.argv[1])
    guard_note()


def last_mile(userland):
    """Fig. 4: the kernel and user realms per tenth of the boot, the hypervisor left out as the
    seed leaves out the noise of virtualization."""
    print("### Fig. 4: a boot's user-space last mile (the workload guest, booted to WG-READY)")
    print()
    if not userland:
        print("No workload-guest boot in this study (bootprof.sh boots them on kvm_amd unless USERLAND_RUNS=0; "
              "a boot that failed left its log).")
        print()
        return
    # Per tenth of each boot: kernel and user as shares of the guest's own time (the seed's
    # Fig. 4), and that own time's share of all realms (what the exits and firmware leave).
    tenths = {"kernel": [[] for _ in range(10)], "user": [[] for _ in range(10)],
              "guest": [[] for _ in range(10)]}
    last_ratio, user_s = [], []
    for _, p in userland:
        bins = p["bins"]["realms"]
        n = max((len(v) for v in bins.values()), default=0)
        column = lambda realm: bins.get(realm) or [0] * n
        for k in range(10):
            lo, hi = k * n // 10, max((k + 1) * n // 10, k * n // 10 + 1)
            kernel, user = sum(column("kernel")[lo:hi]), sum(column("user")[lo:hi])
            everything = sum(sum(v[lo:hi]) for v in bins.values())
            if everything:
                tenths["guest"][k].append((kernel + user) / everything)
            if kernel + user:
                tenths["kernel"][k].append(kernel / (kernel + user))
                tenths["user"][k].append(user / (kernel + user))
            if k == 9 and kernel:
                last_ratio.append(user / kernel)
        user_s.append(p["realms"].get("user", 0.0) * p["duration_ns"] / 1e9)
    print(f"Share of the guest's own time (kernel + user = 1) in each tenth of the boot, mean ± sd over "
          f"{len(userland)} boots; below them, that own time's share of the tenth (the rest is exits "
          f"and firmware; \"-\": no boot has a kernel or user sample there, only firmware and exits):")
    print()
    print("| realm | " + " | ".join(f"{10 * k}–{10 * (k + 1)} %" for k in range(10)) + " |")
    print("|---|" + "---:|" * 10)
    for realm in ("kernel", "user"):
        print(f"| {realm} | " + " | ".join(mean_sd(v, "{:.2f}") for v in tenths[realm]) + " |")
    print("| guest of all | " + " | ".join(mean_sd(v, "{:.2f}") for v in tenths["guest"]) + " |")
    print()
    print(f"User realm over kernel realm in the last tenth: {mean_sd(last_ratio, '{:.2f}')} (the seed: more "
          f"than 2); user time in the whole boot {mean_sd(user_s, '{:.2f}')} s.")
    print()
    print("Seed 003 (Fig. 4): \"time spent in user space is relatively insignificant, averaging 3%, until "
          "the last mile of the boot-sequence. During the last mile the time spent in user realm more "
          "than doubles that spent in kernel realm.\"")
    print()


def ballooned_table(control, balloon):
    print(f"### Table 2: the ballooned symbol (`{BALLOONED}`, a module's init busy-waiting in it)")
    print()
    print("| boots | fraction sampled | boot s (recording) | boot s (guest uptime at init) | s in the symbol | s elsewhere | seed (Table 2): fraction, boot s, s in symbol |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for kind, found, paper in [("control", control, PAPER_BALLOON["control"]),
                               ("ballooned", balloon, PAPER_BALLOON["ballooned"])]:
        if not found:
            print(f"| {kind} | - | - | - | - | - | {paper[0]}, {paper[1]}, {paper[2]} |")
            continue
        fr = [(symbol(p, BALLOONED) or {"fraction": 0.0})["fraction"] for _, p, _ in found]
        span = [p["duration_ns"] / 1e9 for _, p, _ in found]
        up = [u for _, _, u in found if u is not None]
        inside = [f * s for f, s in zip(fr, span)]
        elsewhere = [s - x for s, x in zip(span, inside)]
        print(f"| {kind} ({len(found)}) | {mean_sd(fr, '{:.4f}')} | {mean_sd(span, '{:.1f}')} | "
              f"{mean_sd(up, '{:.1f}')} | {mean_sd(inside, '{:.2f}')} | {mean_sd(elsewhere, '{:.1f}')} | "
              f"{paper[0]}, {paper[1]}, {paper[2]} |")
    print()


def figures(top, names, control, balloon):
    print("### Figs. 5-7: symbols over the boot, one line per boot (bars scaled to each line's peak)")
    print()
    # The seed follows system_call (Fig. 6) and page_init (Fig. 7) over three boots to show a
    # profile repeats; an L2 boot to its init makes almost no system calls, so the busiest
    # kernel function and the busiest exit reason are followed instead.
    top_in = lambda realm: next((n for n in top if names[n] == realm), top[0])
    shown = [(BALLOONED, "Fig. 5: the ballooned symbol, control and ballooned boots")] if balloon else []
    shown += [(top_in("kernel"), f"Fig. 6's question (does a symbol's profile repeat?) for the busiest kernel function, `{top_in('kernel')}`"),
             (top_in("hypervisor"), f"Fig. 7's question for the busiest exit reason, `{top_in('hypervisor')}`")]
    print("```")
    for name, title in shown:
        print(f"{title}")
        for kind, found in [("control", control), ("balloon", balloon)]:
            if kind == "balloon" and name != BALLOONED:
                continue
            for i, p, _ in found:
                counts = timeline(p, name)
                total = (symbol(p, name) or {"count": 0})["count"]
                line = bars(counts) if counts else "(not followed in this profile)"
                print(f"  {kind:>7} {i}  {name:<18} {total:>6} samples  |{line}|")
        print()
    print("```")


if __name__ == "__main__":
    main()
