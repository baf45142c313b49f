"""What the studies' table scripts share: reading a run's JSON outputs and its workload result,
and leaving out runs that other load disturbed (benches/papers/guard.py's verdict)."""

import glob
import json
import os

# Runs left out of every table because guard.py found them disturbed: (run, reasons).
DISTURBED = []
# Runs made before guard.py existed: nobody knows whether they were disturbed.
UNGUARDED = []


def load(path):
    """The JSON at PATH, or None when it is missing or not JSON (a run that failed)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def result(path):
    """The `WG-RESULT key=value ...` line of a run.sh result file as a dict, or None (also for
    a run other load disturbed, unless STUDY_KEEP_DISTURBED is set)."""
    base = path[: -len(".result")] if path.endswith(".result") else path
    guard = load(base + ".guard.json")
    run = os.path.basename(base)
    if guard is None:
        UNGUARDED.append(run)
    elif guard.get("disturbed") and not os.environ.get("STUDY_KEEP_DISTURBED"):
        DISTURBED.append((run, guard.get("reasons") or []))
        return None
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("WG-RESULT"):
                    return dict(p.split("=", 1) for p in line.split()[1:] if "=" in p)
    except OSError:
        pass
    return None


def scan_guards(out):
    """Note every run in OUT whose final guard verdict says disturbed (for tables that do not
    read runs through result())."""
    for path in sorted(glob.glob(os.path.join(out, "*.guard.json"))):
        if ".disturbed-" in os.path.basename(path):
            continue
        guard = load(path)
        if guard and guard.get("disturbed"):
            DISTURBED.append((os.path.basename(path)[: -len(".guard.json")], guard.get("reasons") or []))


def guard_note():
    """Say which runs the tables left out, and which carry no verdict."""
    disturbed = sorted(set((run, tuple(reasons)) for run, reasons in DISTURBED))
    unguarded = sorted(set(UNGUARDED))
    if disturbed:
        print(f"Left out as disturbed by other load ({len(disturbed)} runs; STUDY_KEEP_DISTURBED=1 keeps them):")
        for run, reasons in disturbed:
            print(f"- {run}: {'; '.join(reasons)}")
        print()
    if unguarded:
        print(f"{len(unguarded)} runs carry no load guard verdict (made before benches/papers/guard.py).")
        print()
