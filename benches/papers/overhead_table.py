"""The recording-overhead study's table from its runs (benches/papers/overhead.sh writes them).

    python3 benches/papers/overhead_table.py OUT "WORKLOADS" "INTERVALS"

Per workload: its own rate in the guest not recorded (OUT/WORKLOAD-bare-N.result) and
recorded every T (OUT/WORKLOAD-T-N.result), mean ± sd (n); the overhead, the time per operation
recorded over not recorded less 1, with its standard error from the runs' spread; the events
each recording held and lost. VrtProf's Table IV beside it.
"""

import glob
import math
import os
import statistics
import sys

from study import guard_note, load, result


def rates(out, workload, condition):
    values, unit = [], None
    for path in sorted(glob.glob(os.path.join(out, f"{workload}-{condition}-*.result"))):
        kv = result(path)
        if kv and "ops" in kv and "seconds" in kv and float(kv["seconds"]) > 0:
            values.append(float(kv["ops"]) / float(kv["seconds"]))
            unit = kv.get("unit", "ops")
    return values, unit


def spread(values):
    if not values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    # Slow workloads (a few rounds a second) need more places to show their spread.
    places = 3 if abs(statistics.mean(values)) < 10 else 1
    return f"{statistics.mean(values):,.{places}f} ± {sd:,.{places}f} (n={len(values)})"


def overhead(bare, recorded):
    """(overhead, its standard error) from the two sides' runs, or None without two runs a side."""
    if len(bare) < 2 or len(recorded) < 2 or not all(statistics.mean(v) > 0 for v in (bare, recorded)):
        return None
    mb, mr = statistics.mean(bare), statistics.mean(recorded)
    ratio = mb / mr
    relative = math.sqrt((statistics.stdev(bare) / mb) ** 2 / len(bare)
                         + (statistics.stdev(recorded) / mr) ** 2 / len(recorded))
    return ratio - 1, ratio * relative


def recorded_events(out, workload, condition):
    events = lost = seconds = 0.0
    runs = 0
    for path in sorted(glob.glob(os.path.join(out, f"{workload}-{condition}-*.recorded.json"))):
        r = load(path)
        if r and r.get("events") is not None and r.get("duration_s"):
            events += r["events"]
            lost += r.get("lost_events") or 0
            seconds += r["duration_s"]
            runs += 1
    return (events / seconds if seconds else None), int(lost), runs


def main():
    out, workloads, intervals = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
    for interval in intervals:
        print(f"## The recording's overhead in the guest: `record --interval {interval} --agent` "
              "against no recording (VrtProf Table IV)\n")
        print("Overhead: the time per operation recorded over not recorded, less 1 (the paper's run "
              "time with VrtProf over without, less 1); ± its standard error from the runs' spread.\n")
        print(f"| workload | unit | not recorded | recorded every {interval} | overhead | beyond 2 se "
              "| events/s recorded | events lost |")
        print("|---|---|---|---|---:|---|---:|---:|")
        sizes = []
        for w in workloads:
            bare, unit = rates(out, w, "bare")
            recorded, unit_recorded = rates(out, w, interval)
            o = overhead(bare, recorded)
            per_s, lost, _ = recorded_events(out, w, interval)
            cell = "-" if o is None else f"{100 * o[0]:+.1f} % ± {100 * o[1]:.1f}"
            beyond = "-" if o is None else ("yes" if abs(o[0]) > 2 * o[1] else "no")
            if o is not None:
                sizes.append(abs(o[0]))
            rate = "-" if per_s is None else f"{per_s:,.0f}"
            print(f"| {w} | {unit or unit_recorded or ''}/s | {spread(bare)} | {spread(recorded)} | {cell} | "
                  f"{beyond} | {rate} | {lost} |")
        print()
        if sizes:
            # The paper's geomean takes the negative overheads' size (its footnote 1).
            geomean = math.exp(statistics.mean(math.log(max(s, 1e-6)) for s in sizes))
            print(f"Geometric mean of the overheads' sizes over {len(sizes)} workloads: {100 * geomean:.1f} % "
                  "(VrtProf Table IV: 1.34 % over 7 benchmarks, each between −1.78 and +2.59 %, "
                  "on Xen 3.0.4 with VT).\n")
    guard_note()


if __name__ == "__main__":
    main()
