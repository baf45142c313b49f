#!/usr/bin/env python3
"""Run one study run and say whether other load disturbed it.

    guard.py REPORT.json -- COMMAND [ARGS...]

A study's timings mean something only if the study had its CPUs. Before the run this waits
(up to GUARD_WAIT seconds, default 60) for the host to be quiet: busy under GUARD_QUIET_PCT
(default 20) of the CPUs over a second (what it saw is in the report; only the run's own
measurements decide). During the run it reads the host's CPU time from
/proc/stat and the run's own (its process tree's, as reaped: getrusage(RUSAGE_CHILDREN)); the
difference is other tasks' time on the host, and the steal column is time the hypervisor under
this host gave to others. The run is marked disturbed when other tasks took more than
GUARD_OTHER_PCT (default 10) of the CPUs or steal more than GUARD_STEAL_PCT (default 5).

REPORT.json gets every figure and the verdict; one line on stderr says it. The exit code is
the command's. Interrupt and kernel threads' time is not counted as other load (the run's own
network and disk cause most of it). A process the run starts but does not reap counts as other
load, so a verdict errs towards "disturbed", unless its pid is in one of the files
GUARD_ALSO_PIDFILES names (space-separated): their CPU time when the command ends is the run's.
"""

import json
import os
import resource
import subprocess
import sys
import time

# /proc/stat's cpu line: user nice system idle iowait irq softirq steal guest guest_nice, in
# USER_HZ ticks; guest time is already inside user.
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def host_ticks():
    """(busy, steal, total) ticks of all CPUs: busy is user + nice + system."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    total = user + nice + system + idle + iowait + irq + softirq + steal
    return user + nice + system, steal, total


def children_cpu_s():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def also_cpu_s():
    """CPU time of the processes GUARD_ALSO_PIDFILES names (those still running)."""
    total = 0.0
    for path in os.environ.get("GUARD_ALSO_PIDFILES", "").split():
        try:
            with open(path) as f:
                pid = int(f.read().split()[0])
            with open(f"/proc/{pid}/stat") as f:
                # Fields after the command's closing parenthesis: utime is the 12th, then
                # stime, cutime, cstime.
                fields = f.read().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15]) * TICK_S
        except (OSError, ValueError, IndexError):
            continue
    return total


def env_float(name, default):
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        sys.exit(f"guard.py: {name}={os.environ[name]!r} is not a number")


def wait_for_quiet(limit_pct, wait_s):
    """Seconds waited for a second with the host busy under LIMIT_PCT, and the last share seen."""
    start = time.monotonic()
    while True:
        busy0, _, total0 = host_ticks()
        time.sleep(1)
        busy1, _, total1 = host_ticks()
        pct = 100.0 * (busy1 - busy0) / max(total1 - total0, 1)
        waited = time.monotonic() - start
        if pct < limit_pct or waited >= wait_s:
            return waited, pct


def main():
    args = sys.argv[1:]
    if len(args) < 3 or args[1] != "--":
        sys.exit("usage: guard.py REPORT.json -- COMMAND [ARGS...]")
    report, command = args[0], args[2:]
    quiet_pct = env_float("GUARD_QUIET_PCT", 20)
    other_limit = env_float("GUARD_OTHER_PCT", 10)
    steal_limit = env_float("GUARD_STEAL_PCT", 5)
    waited, before_pct = wait_for_quiet(quiet_pct, env_float("GUARD_WAIT", 60))

    cpus = os.cpu_count() or 1
    busy0, steal0, total0 = host_ticks()
    own0 = children_cpu_s()
    start = time.monotonic()
    code = subprocess.call(command)
    wall = time.monotonic() - start
    busy1, steal1, total1 = host_ticks()
    own = children_cpu_s() - own0 + also_cpu_s()

    host_busy = (busy1 - busy0) * TICK_S
    other = max(host_busy - own, 0.0)
    capacity = max(wall * cpus, 1e-9)
    other_pct = 100.0 * other / capacity
    steal_pct = 100.0 * (steal1 - steal0) / max(total1 - total0, 1)
    reasons = []
    if other_pct > other_limit:
        reasons.append(f"other tasks took {other_pct:.1f} % of the CPUs (limit {other_limit:g} %)")
    if steal_pct > steal_limit:
        reasons.append(f"steal took {steal_pct:.1f} % (limit {steal_limit:g} %)")
    verdict = {
        "command": command,
        "exit_code": code,
        "wall_s": round(wall, 3),
        "cpus": cpus,
        "run_cpu_s": round(own, 3),
        "host_busy_s": round(host_busy, 3),
        "other_cpu_s": round(other, 3),
        "other_pct": round(other_pct, 2),
        "steal_pct": round(steal_pct, 2),
        "busy_before_pct": round(before_pct, 1),
        "waited_for_quiet_s": round(waited, 1),
        "limits": {"other_pct": other_limit, "steal_pct": steal_limit, "quiet_pct": quiet_pct},
        "disturbed": bool(reasons),
        "reasons": reasons,
    }
    with open(report, "w") as f:
        json.dump(verdict, f, indent=1)
        f.write("\n")
    said = "DISTURBED: " + "; ".join(reasons) if reasons else "undisturbed"
    print(f"guard: {os.path.basename(report)}: other tasks {other_pct:.1f} % of the CPUs, "
          f"steal {steal_pct:.1f} %, the run's own CPU {own:.1f} s in {wall:.1f} s: {said}",
          file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
