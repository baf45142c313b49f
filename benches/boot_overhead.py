#!/usr/bin/env python3
"""Cost of `virtprof boot` sampling: boot without sampling against sampling at each --rates.

  testvm  the `boot` workload (its functions run for fixed TSC time, 2 s): the guest's work
          done in that time (loop iterations) sampled vs `virtprof testvm -w boot` alone
  qemu    a Debian kernel booted under QEMU TCG to its init marker (scripts/debian-kernel):
          wall time of `virtprof boot --qemu --until MARKER` vs the same QEMU alone

Prints medians of --reps runs and the ratios against no sampling. Needs /dev/kvm for testvm;
qemu-system-x86_64 and target/debian-kernel (scripts/debian-kernel/fetch.sh) for qemu.

usage: benches/boot_overhead.py [--reps 3] [--rates 100,1000] [--binary PATH] [--skip-qemu]
"""
import argparse
import json
import os
import statistics
import subprocess
import time

MARKER = "VIRTPROF-INIT-MARKER"


def testvm_iterations(binary, rate):
    if rate == 0:
        out = subprocess.run([binary, "testvm", "-w", "boot", "--duration", "2s", "--json"], check=True, capture_output=True)
        return sum(v["iterations"] for v in json.loads(out.stdout)["vms"][0]["vcpus"])
    out = subprocess.run([binary, "boot", "--testvm", "--duration", "2s", "--rate", str(rate), "--json"], check=True, capture_output=True)
    return json.loads(out.stdout)["truth"]["iterations"]


def qemu_args(kernel_dir):
    k = lambda f: os.path.join(kernel_dir, f)
    return ["-accel", "tcg", "-m", "512", "-nographic", "-no-reboot", "-net", "none", "-kernel", k("vmlinuz"),
            "-initrd", k("initrd.cpio"), "-append", "console=ttyS0 quiet"]


def qemu_seconds(binary, kernel_dir, rate):
    start = time.monotonic()
    if rate == 0:
        out = subprocess.run(["qemu-system-x86_64"] + qemu_args(kernel_dir), capture_output=True, timeout=300)
        assert MARKER in out.stdout.decode(errors="replace"), "the kernel did not reach its init marker"
    else:
        cmd = [binary, "boot", "--qemu", "--rate", str(rate), "--until", MARKER, "--system-map",
               os.path.join(kernel_dir, "System.map"), "--json", "--"] + qemu_args(kernel_dir)
        out = subprocess.run(cmd, capture_output=True, timeout=300, check=True)
        assert b"never matched" not in out.stderr, out.stderr
    return time.monotonic() - start


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--rates", default="100,1000")
    p.add_argument("--binary", default=os.path.join(root, "target/release/virtprof"))
    p.add_argument("--skip-qemu", action="store_true")
    a = p.parse_args()
    rates = [0] + [int(r) for r in a.rates.split(",")]
    label = lambda r: "no sampling" if r == 0 else f"{r} Hz"

    print("testvm boot workload, 2 s of guest functions (work done: loop iterations, higher is better)")
    base = None
    for rate in rates:
        its = statistics.median(testvm_iterations(a.binary, rate) for _ in range(a.reps))
        base = base or its
        print(f"  {label(rate):12} {its:14,.0f} iterations   ratio {its / base:.4f}   loss {100 * (1 - its / base):5.2f}%")

    kernel_dir = os.path.join(root, "target/debian-kernel")
    if a.skip_qemu or not os.path.exists(os.path.join(kernel_dir, "initrd.cpio")):
        print("qemu: skipped (run scripts/debian-kernel/fetch.sh target/debian-kernel)")
        return
    print("Debian kernel under QEMU TCG to its init marker (wall seconds, lower is better)")
    base = None
    for rate in rates:
        secs = statistics.median(qemu_seconds(a.binary, kernel_dir, rate) for _ in range(a.reps))
        base = base or secs
        print(f"  {label(rate):12} {secs:8.2f} s   ratio {secs / base:.3f}")


if __name__ == "__main__":
    main()
