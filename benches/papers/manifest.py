#!/usr/bin/env python3
"""Write a study's manifest.json: what was run, with what, on what.

    manifest.py OUT/manifest.json STUDY VIRTPROF ACCEL ACCEL_WHY [KEY=VALUE ...]

Versions (virtprof's own, with its commit; the kernel; QEMU), the study's inputs checked
against benches/papers/pins.sha256 (the Debian kernels, the workload guest's packages and the
arm64 bed's, by version and SHA-256), and the host's facts (CPUs, model, memory, virtualization). A study
whose inputs are not the pinned ones is refused (exit 2) unless STUDY_UNPINNED=1, and the
manifest then lists what differs. STUDY_INPUTS names the kinds of input the study uses
(default "kernel guest"). KEY=VALUE pairs are the study's parameters (RUNS, ...).
"""

import datetime
import glob
import hashlib
import json
import os
import platform
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# Where each kind of pinned input is cached on this machine (under STUDY_TARGET, default the
# repository's target/).
TARGET = os.environ.get("STUDY_TARGET") or os.path.join(ROOT, "target")
INPUTS = {
    "kernel": os.path.join(TARGET, "nested-svm"),
    "guest": os.path.join(TARGET, "workload-guest", "debs"),
    "arm64": os.path.join(TARGET, "arm64-bed"),
}


def first_line(command):
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=30).stdout
        return out.splitlines()[0].strip() if out else None
    except (OSError, subprocess.SubprocessError):
        return None


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def pins():
    wanted = {}
    with open(os.path.join(HERE, "pins.sha256")) as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                digest, name = line.split()
                wanted[name] = digest
    return wanted


def check_inputs(kinds):
    """(inputs found, differences from the pins) of the KINDS of input the study uses."""
    found, differences = {}, []
    wanted = pins()
    for kind in kinds:
        folder = INPUTS[kind]
        present = {f"{kind}/{os.path.basename(p)}": p for p in glob.glob(os.path.join(folder, "*.deb"))}
        if not present:
            differences.append(f"no {kind} packages in {folder} (the study builds them before its manifest)")
            continue
        for name, path in sorted(present.items()):
            found[name] = sha256(path)
            if name not in wanted:
                differences.append(f"{name} is not pinned (another version than the pinned one)")
            elif wanted[name] != found[name]:
                differences.append(f"{name} has SHA-256 {found[name]}, pinned {wanted[name]}")
        for name in sorted(n for n in wanted if n.startswith(kind + "/") and n not in present):
            differences.append(f"{name} (pinned) is not in {folder}")
    return found, differences


def host():
    facts = {"machine": platform.machine(), "cpus": os.cpu_count(), "kernel": platform.release()}
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
        facts["cpu_model"] = next((l.split(":", 1)[1].strip() for l in info.splitlines()
                                   if l.startswith("model name")), None)
        flags = next((l.split(":", 1)[1].split() for l in info.splitlines() if l.startswith("flags")), [])
        facts["vt"] = [f for f in ("vmx", "svm", "hypervisor") if f in flags]
        with open("/proc/meminfo") as f:
            facts["memory_kib"] = int(f.readline().split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return facts


def main():
    if len(sys.argv) < 6:
        sys.exit(__doc__)
    path, study, virtprof, accel, accel_why = sys.argv[1:6]
    params = dict(kv.split("=", 1) for kv in sys.argv[6:] if "=" in kv)
    kinds = os.environ.get("STUDY_INPUTS", "kernel guest").split()
    unknown = [k for k in kinds if k not in INPUTS]
    if unknown:
        sys.exit(f"manifest.py: STUDY_INPUTS names unknown kinds {unknown} (known: {', '.join(INPUTS)})")
    inputs, differences = check_inputs(kinds)
    unpinned = bool(os.environ.get("STUDY_UNPINNED"))
    if differences and not unpinned:
        print(f"{study}: the study's inputs are not the pinned ones (benches/papers/pins.sha256):", file=sys.stderr)
        for d in differences:
            print(f"  {d}", file=sys.stderr)
        print(f"{study}: fetch the pinned versions (snapshot.debian.org keeps them), or set STUDY_UNPINNED=1 "
              "to run on these (the manifest then says so)", file=sys.stderr)
        sys.exit(2)
    manifest = {
        "study": study,
        "started_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "parameters": params,
        "virtprof": first_line([virtprof, "--version"]),
        "qemu": first_line(["qemu-system-aarch64" if "arm64" in kinds else "qemu-system-x86_64", "--version"]),
        "accel": accel,
        "accel_why": accel_why,
        "host": host(),
        "inputs": inputs,
        "inputs_pinned": not differences,
        "inputs_differences": differences,
    }
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
