"""What the studies' table scripts share: reading a run's JSON outputs and its workload result."""

import json


def load(path):
    """The JSON at PATH, or None when it is missing or not JSON (a run that failed)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def result(path):
    """The `WG-RESULT key=value ...` line of a run.sh result file as a dict, or None."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("WG-RESULT"):
                    return dict(p.split("=", 1) for p in line.split()[1:] if "=" in p)
    except OSError:
        pass
    return None
