#!/usr/bin/env python3
"""Recording overhead measured inside one long guest run, by switching tracers on and off.

Separate runs per mode (the method of benches/results/2026-11-21-record-overhead-*.txt,
whose script this one replaces) cannot resolve the tracepoint floor on a host whose speed
drifts by more than the floor between runs. Here one `testvm` loop runs for the whole
measurement, and the tracers stay attached to it all along:

  floor           record's default events enabled in a tracefs instance, nobody reading
                  (the kernel's default instance settings: `local` clock, 1.4 MB per CPU)
  floor-record    the same with record's instance settings: `mono` clock (aligned with
                  CLOCK_MONOTONIC), record-tgid, 8 MB per CPU
  virtprof        `virtprof record` (the same events; its readers and writer keep running)
  perf            `perf record -e 'kvm:*' -p VMM`
  drained         (optional) the floor drained every 20 ms by a minimal reader that discards
                  the pages: what getting the data out costs at all; drained-record likewise

Each is switched on and off without detaching (tracing_on of the instances, perf's
--control fifo), so every state carries the same probes and only one tracer writes at a
time. Windows cycle through: base, one tracer, base, the next tracer, ... (tracer order
shuffled per cycle). A window's cost is its ns per guest iteration (read from the guest's
shared page, docs/testvm.md) minus the mean of the base windows either side of it, which
cancels drift slower than a few hundred ms.

Prints the median added ns per iteration per tracer with a 95% bootstrap interval; the
ratios virtprof/floor and virtprof/floor-record (target <= 1.2) and virtprof/perf (target
< 1); and, per state, the tracer's own CPU use, how often the vCPU thread was preempted and
the vCPU's CPU's interrupts, which rule those out as causes of a difference.
Needs root, tracefs, /dev/kvm; perf optional. 300 cycles take about 10 minutes.

usage: benches/record_overhead_toggle.py [--cycles N] [--window-ms MS] [--workload W]
         [--tracers floor,floor-record,drained,virtprof,perf] [--record-cpus LIST]
         [--record-args ARGS] [--control-load CPU:PERCENT] [--out-dir DIR]
"""
import argparse
import glob
import json
import mmap
import multiprocessing
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

TRACEFS = "/sys/kernel/tracing"
# `virtprof record`'s default event set (CaptureConfig::default_events), as tracefs paths.
RECORD_EVENTS = ["kvm", "sched/sched_switch", "sched/sched_wakeup", "sched/sched_wakeup_new",
                 "sched/sched_migrate_task", "irq", "irq_vectors"]
# docs/testvm.md: vCPU i's shared page is at 0x100000 + 0x2000*i; iterations at +0x80.
ITERATIONS_GPA = 0x100000 + 0x80
SETTLE_S = 0.03


def write(path, value):
    with open(path, "w") as f:
        f.write(value)


def vmm_pid(testvm_pid, deadline):
    """`testvm` runs each VM in a child process (the VMM)."""
    while time.monotonic() < deadline:
        try:
            children = open(f"/proc/{testvm_pid}/task/{testvm_pid}/children").read().split()
        except OSError:
            children = []
        if children:
            return int(children[0])
        time.sleep(0.01)
    sys.exit("testvm started no VMM")


class GuestIterations:
    """vCPU 0's iteration counter, read from the memfd that backs the VMM's guest RAM."""

    def __init__(self, pid, deadline):
        while True:
            for fd in glob.glob(f"/proc/{pid}/fd/*"):
                try:
                    if os.readlink(fd).startswith("/memfd:virtprof-guest-ram"):
                        self.file = open(fd, "rb")
                        self.map = mmap.mmap(self.file.fileno(), ITERATIONS_GPA + 8, prot=mmap.PROT_READ)
                        return
                except OSError:
                    pass
            if time.monotonic() > deadline:
                sys.exit("testvm's guest RAM did not appear")
            time.sleep(0.01)

    def read(self):
        return int.from_bytes(self.map[ITERATIONS_GPA:ITERATIONS_GPA + 8], "little")


class Instance:
    """A tracefs instance switched by tracing_on."""

    pid = None  # no process of its own

    def __init__(self, path):
        self.path = path

    def on(self, value):
        write(os.path.join(self.path, "tracing_on"), "1" if value else "0")

    def close(self):
        pass


class FloorInstance(Instance):
    """record's events enabled in an instance of our own, nobody reading."""

    def __init__(self, name, like_record=False):
        super().__init__(os.path.join(TRACEFS, "instances", f"virtprof-bench-{name}-{os.getpid()}"))
        os.mkdir(self.path)
        self.on(False)
        if like_record:  # the instance settings `virtprof record` uses (capture.rs)
            write(os.path.join(self.path, "buffer_size_kb"), "8192")
            write(os.path.join(self.path, "trace_clock"), "mono")
            write(os.path.join(self.path, "options", "record-tgid"), "1")
        self.events = [e for e in RECORD_EVENTS if os.path.exists(os.path.join(self.path, "events", e, "enable"))]
        for e in self.events:
            write(os.path.join(self.path, "events", e, "enable"), "1")

    def close(self):
        self.on(False)
        for e in self.events:
            write(os.path.join(self.path, "events", e, "enable"), "0")
        os.rmdir(self.path)


class DrainedInstance(FloorInstance):
    """The floor plus the least a reader can do: every 20 ms, read each CPU's trace_pipe_raw
    without blocking and throw the pages away (a child process, pinned like record)."""

    def __init__(self, name, like_record, cpus):
        super().__init__(name, like_record)
        paths = sorted(glob.glob(os.path.join(self.path, "per_cpu", "cpu*", "trace_pipe_raw")))
        self.proc = multiprocessing.Process(target=DrainedInstance.drain, args=(paths, cpus), daemon=True)
        self.proc.start()
        self.pid = self.proc.pid

    @staticmethod
    def drain(paths, cpus):
        if cpus:
            os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
        fds = [os.open(p, os.O_RDONLY | os.O_NONBLOCK) for p in paths]
        while True:
            for fd in fds:
                try:
                    while os.read(fd, 4096):
                        pass
                except BlockingIOError:
                    pass
            time.sleep(0.02)

    def close(self):
        self.proc.terminate()  # its readers hold the instance open
        self.proc.join()
        super().close()


class Record(Instance):
    """`virtprof record`, switched by its own instance's tracing_on."""

    def __init__(self, binary, output, cpus, extra):
        cmd = [binary, "record", "-o", output] + extra
        if cpus:
            cmd = ["taskset", "-c", cpus] + cmd
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.pid = self.proc.pid
        self.summary = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            found = glob.glob(os.path.join(TRACEFS, "instances", f"virtprof-*-{self.pid}"))
            if found and open(os.path.join(found[0], "tracing_on")).read().strip() == "1":
                super().__init__(found[0])
                time.sleep(0.5)  # its readers are up
                return
            time.sleep(0.02)
        self.proc.kill()
        sys.exit("virtprof record did not start tracing: " + self.proc.stderr.read())

    def close(self):
        # Peak RSS over the whole run (target: bounded, <= 64 MiB, whatever the duration).
        peak = next((line.split(":")[1].strip() for line in open(f"/proc/{self.pid}/status")
                     if line.startswith("VmHWM")), "?")
        self.proc.send_signal(signal.SIGINT)
        _, err = self.proc.communicate()
        self.summary = [line.strip() for line in err.splitlines() if "lost" in line] + [f"peak RSS {peak}"]


class Perf:
    """`perf record -e 'kvm:*'` attached to the VMM, switched by its control fifo."""

    def __init__(self, tmp, vmm):
        ctl, ack = os.path.join(tmp, "ctl"), os.path.join(tmp, "ack")
        os.mkfifo(ctl)
        os.mkfifo(ack)
        self.proc = subprocess.Popen(
            ["perf", "record", "-q", "-D", "-1", "-e", "kvm:*", "-p", str(vmm), "-o", os.path.join(tmp, "perf.data"),
             "--control", f"fifo:{ctl},{ack}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.pid = self.proc.pid
        self.ctl, self.ack = open(ctl, "w"), open(ack, "r")

    def on(self, value):
        self.ctl.write("enable\n" if value else "disable\n")
        self.ctl.flush()
        self.ack.readline()

    def close(self):
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait()


class Load:
    """A control, not a tracer: a process on `cpu` busy `percent`% of the time while on, to
    show what that much work on another CPU costs the vCPU without any tracing (CPUs of a
    VM may share cores or caches below it)."""

    def __init__(self, cpu, percent):
        self.flag = multiprocessing.Value("b", 0, lock=False)
        self.proc = multiprocessing.Process(target=Load.spin, args=(self.flag, cpu, percent / 100), daemon=True)
        self.proc.start()
        self.pid = self.proc.pid

    @staticmethod
    def spin(flag, cpu, duty):
        os.sched_setaffinity(0, {cpu})
        period = 0.02
        while True:
            if flag.value:
                end = time.perf_counter() + duty * period
                while time.perf_counter() < end:
                    pass
                time.sleep(period * (1 - duty))
            else:
                time.sleep(period)

    def on(self, value):
        self.flag.value = 1 if value else 0

    def close(self):
        self.proc.terminate()


def cpu_ticks(pid):
    """utime + stime of every thread of `pid`, in clock ticks."""
    total = 0
    for stat in glob.glob(f"/proc/{pid}/task/*/stat"):
        try:
            fields = open(stat).read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError):
            pass
    return total


def involuntary_switches(task_dir):
    for line in open(os.path.join(task_dir, "status")):
        if line.startswith("nonvoluntary_ctxt_switches"):
            return int(line.split()[1])
    return 0


def interrupts(cpu):
    """/proc/interrupts counts of one CPU, by line name."""
    out = {}
    for line in open("/proc/interrupts").readlines()[1:]:
        parts = line.split()
        if len(parts) > cpu + 1 and parts[cpu + 1].isdigit():
            out[parts[0].rstrip(":")] = int(parts[cpu + 1])
    return out


class Windows:
    """Measures windows and keeps, per state, what else happened on the vCPU's CPU."""

    def __init__(self, iters, seconds, vcpu_task, cpu):
        self.iters, self.seconds, self.vcpu_task, self.cpu = iters, seconds, vcpu_task, cpu
        self.preempted, self.irqs, self.own_ticks, self.count = {}, {}, {}, {}

    def measure(self, state, pid=None):
        """ns per guest iteration over one window in `state` (after a settling pause)."""
        time.sleep(SETTLE_S)
        q0, s0 = interrupts(self.cpu), involuntary_switches(self.vcpu_task)
        c0 = cpu_ticks(pid) if pid else 0
        i0, t0 = self.iters.read(), time.monotonic_ns()
        time.sleep(self.seconds)
        i1, t1 = self.iters.read(), time.monotonic_ns()
        self.count[state] = self.count.get(state, 0) + 1
        self.preempted[state] = self.preempted.get(state, 0) + involuntary_switches(self.vcpu_task) - s0
        if pid:
            self.own_ticks[state] = self.own_ticks.get(state, 0) + cpu_ticks(pid) - c0
        irqs = self.irqs.setdefault(state, {})
        for k, v in interrupts(self.cpu).items():
            irqs[k] = irqs.get(k, 0) + v - q0.get(k, 0)
        return (t1 - t0) / max(i1 - i0, 1)

    def own_cpu_percent(self, state):
        span = self.count.get(state, 0) * (self.seconds + SETTLE_S)
        return 100 * self.own_ticks.get(state, 0) / os.sysconf("SC_CLK_TCK") / span if span else 0.0


def bootstrap(xs, stat, n=2000):
    rng = random.Random(1)
    vals = sorted(stat([rng.choice(xs) for _ in xs]) for _ in range(n))
    return vals[int(0.025 * n)], vals[int(0.975 * n)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cycles", type=int, default=300)
    ap.add_argument("--window-ms", type=int, default=200)
    ap.add_argument("--workload", default="pio-user", help="testvm workload: pio-user or pio-kernel")
    ap.add_argument("--pin", type=int, default=0, help="the vCPU's host CPU")
    ap.add_argument("--binary", default="target/release/virtprof")
    ap.add_argument("--tracers", default="floor,floor-record,virtprof,perf",
                    help="which to switch, comma-separated: floor, floor-record, drained, drained-record, virtprof, perf")
    ap.add_argument("--out-dir", default=None, help="where the recordings go (default: a temporary directory)")
    ap.add_argument("--record-cpus", default=None, help="run virtprof record (and the drained reader) on these CPUs")
    ap.add_argument("--record-args", default="", help="more arguments for virtprof record")
    ap.add_argument("--save", default=None, metavar="FILE", help="also write every window's added ns as JSON")
    ap.add_argument("--control-load", default=None, metavar="CPU:PERCENT",
                    help="also switch a busy loop on CPU, PERCENT%% of the time (a control: no tracing)")
    args = ap.parse_args()
    wanted = args.tracers.split(",")
    tmp = tempfile.mkdtemp(prefix="virtprof-bench-", dir=args.out_dir)
    vm = subprocess.Popen([args.binary, "testvm", "--workload", args.workload, "--iterations", "1000000000",
                           "--pin", str(args.pin)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tracers = {}
    try:
        vmm = vmm_pid(vm.pid, time.monotonic() + 20)
        iters = GuestIterations(vmm, time.monotonic() + 20)
        vcpu_task = next(d for d in glob.glob(f"/proc/{vmm}/task/*") if open(d + "/comm").read().startswith("vcpu0"))
        makers = {
            "floor": lambda: FloorInstance("floor"),
            "floor-record": lambda: FloorInstance("floor-record", like_record=True),
            "drained": lambda: DrainedInstance("drained", False, args.record_cpus),
            "drained-record": lambda: DrainedInstance("drained-record", True, args.record_cpus),
            "virtprof": lambda: Record(args.binary, os.path.join(tmp, "r.vprec"), args.record_cpus,
                                       args.record_args.split()),
        }
        if shutil.which("perf"):
            makers["perf"] = lambda: Perf(tmp, vmm)
        for name in wanted:
            if name not in makers:
                sys.exit(f"unknown or unavailable tracer '{name}' (have: {', '.join(makers)})")
            tracers[name] = makers[name]()
            tracers[name].on(False)
        if args.control_load:
            cpu, percent = args.control_load.split(":")
            tracers["load"] = Load(int(cpu), float(percent))
        time.sleep(1)
        windows = Windows(iters, args.window_ms / 1000, vcpu_task, args.pin)
        rng = random.Random(42)
        added = {t: [] for t in tracers}
        base_before = windows.measure("base")
        for cycle in range(args.cycles):
            order = list(tracers)
            rng.shuffle(order)
            for name in order:
                tracers[name].on(True)
                x = windows.measure(name, tracers[name].pid)
                tracers[name].on(False)
                base_after = windows.measure("base")
                added[name].append(x - (base_before + base_after) / 2)
                base_before = base_after
            print(f"\rcycle {cycle + 1}/{args.cycles}", end="", file=sys.stderr, flush=True)
        print("\r" + " " * 30 + "\r", end="", file=sys.stderr)
    finally:
        for t in tracers.values():
            t.close()
        vm.send_signal(signal.SIGTERM)
        vm.wait()
        shutil.rmtree(tmp)

    if args.save:
        with open(args.save, "w") as f:
            json.dump({"args": vars(args), "added_ns_per_iteration": added}, f)
    print(f"{'TRACER':14} {'ADDED_NS/ITER':>14} {'95% CI':>20} {'WINDOWS':>8} {'ITS_CPU%':>9}")
    med = {}
    for name, xs in added.items():
        med[name] = statistics.median(xs)
        lo, hi = bootstrap(xs, statistics.median)
        print(f"{name:14} {med[name]:14.1f} {f'[{lo:.1f}, {hi:.1f}]':>20} {len(xs):8} "
              f"{windows.own_cpu_percent(name):9.1f}")

    def ratio(a, b, target):
        pairs = list(zip(added[a], added[b]))
        lo, hi = bootstrap(pairs, lambda ps: statistics.median(x for x, _ in ps) / statistics.median(y for _, y in ps))
        print(f"{a} added / {b} added: {med[a] / med[b]:.2f}  95% CI [{lo:.2f}, {hi:.2f}]  (target {target})")
    if "virtprof" in med:
        for floor in ("floor", "floor-record"):
            if med.get(floor, 0) > 0:
                ratio("virtprof", floor, "<= 1.2")
        if med.get("perf", 0) > 0:
            ratio("virtprof", "perf", "< 1")
    print(f"vCPU thread preempted per window: " + ", ".join(
        f"{k} {v / windows.count[k]:.2f}" for k, v in sorted(windows.preempted.items())))
    for state, irqs in sorted(windows.irqs.items()):
        print(f"CPU {args.pin} interrupts per window in {state}: "
              + ", ".join(f"{k} {v / windows.count[state]:.2f}" for k, v in sorted(irqs.items()) if v))
    print(f"{args.cycles} cycles of {args.window_ms} ms windows; {args.workload} pinned to CPU {args.pin}")
    if "virtprof" in tracers:
        for line in tracers["virtprof"].summary:
            print("virtprof record: " + line)


if __name__ == "__main__":
    main()
