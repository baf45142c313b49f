"""Shared by the benchmark scripts: run a command while following its memory peaks."""
import subprocess
import sys
import threading
import time


def _follow(pid, peaks):
    """Read /proc/PID/status until the process exits, keeping the peak of each key in `peaks`."""
    while True:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    key = line.split(":")[0]
                    if key in peaks:
                        peaks[key] = max(peaks[key], int(line.split()[1]))
        except OSError:
            return
        time.sleep(0.01)


def run_watched(cmd, keys=("VmHWM",)):
    """Run `cmd` (exit on failure); return (wall seconds, {key: peak kB}, stdout, stderr)."""
    peaks = {k: 0 for k in keys}
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watcher = threading.Thread(target=_follow, args=(proc.pid, peaks))
    watcher.start()
    out, err = proc.communicate()
    watcher.join()
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{err}")
    return time.monotonic() - t0, peaks, out, err
