#!/bin/sh
# XenMon (seed 001), the Dom0 CPU-allocation study (Figs. 3-9) in KVM terms: the web server
# (lighttpd) in the workload guest, its network I/O done by the VMM's own threads (QEMU's main
# loop runs the virtio-net backend; the disk is on an iothread), the load generator (wrk)
# stepping its load. Four allocations of the VMM's I/O side relative to the vCPUs, as the
# paper's BVT weights of Dom0 to Dom1 (Conf_0.5, Conf_Equal, Conf_2, Conf_10): every QEMU
# thread on one host CPU, the vCPU threads in one cgroup and every other QEMU thread in
# another, cpu.shares in that ratio; wrk on the other CPU. Per configuration and load step:
# throughput and response time (wrk's), and XenMon's metrics for the vCPUs and for the work
# done outside them (`virtprof sched`'s roles), with the I/O count per execution period of the
# I/O side: the guest's network packets (its agent's counts) per main-loop execution.
#
#   sh benches/papers/xenmon.sh [OUT]      (default target/papers/xenmon)
#
# RATIOS (default "0.5 1 2 10"), CONNECTIONS (wrk's open connections, the load steps; default
# "1 4 16 64"), RATES (requests a second: the load steps of an open-loop load in place of wrk,
# as the paper's httperf offers them; scripts/workload-guest/openloop.py), SECONDS_EACH
# (default 8), RUNS (default 5). Run again into the same OUT, it keeps the runs that succeeded
# and does the rest. What this host cannot give is said, never made up: without VMX/SVM the
# guest runs under QEMU TCG, so its vCPUs make no exits and KVM's I/O count is unknown (the
# packet count stands in); wrk is closed-loop (it steps open connections, not a request rate:
# RATES steps the rate); cgroup v2 `cpu.weight` (or v1 `cpu.shares` where v2 has no cpu
# controller) is CFS's proportional share, not BVT's.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-$root/target/papers/xenmon}
ratios=${RATIOS:-0.5 1 2 10} steps=${CONNECTIONS:-1 4 16 64} rates=${RATES:-}
# A step is c<connections> (wrk) or r<rate> (open loop).
if [ -n "$rates" ]; then
    for r in $rates; do
        case $r in *[!0-9]* | 0) echo "xenmon.sh: RATES takes whole numbers of requests a second, not '$r'" >&2; exit 2 ;; esac
    done
    load_steps=$(for r in $rates; do printf 'r%s ' "$r"; done)
else
    load_steps=$(for c in $steps; do printf 'c%s ' "$c"; done)
fi
seconds=${SECONDS_EACH:-8} runs=${RUNS:-5}
study=xenmon.sh
mkdir -p "$out"
. "$here/common.sh"
[ "$(nproc)" -ge 2 ] || { echo "xenmon.sh: needs 2 CPUs (QEMU on one, wrk on the other)" >&2; exit 2; }
# Where the groups go: cgroup v2's cpu controller (cpu.weight; threaded groups hold a process's
# threads apart) where a cgroup2 mount offers it, else cgroup v1's (cpu.shares).
cgroup=
for mount in $(awk '$3 == "cgroup2" { print $2 }' /proc/mounts); do
    if grep -qw cpu "$mount/cgroup.controllers" 2> /dev/null; then cgroup="v2 $mount"; break; fi
done
[ -n "$cgroup" ] || { [ -w /sys/fs/cgroup/cpu/cgroup.procs ] && cgroup="v1 /sys/fs/cgroup/cpu"; } || true
[ -n "$cgroup" ] || { echo "xenmon.sh: needs the cpu controller of cgroup v2 (a cgroup2 mount listing cpu in its cgroup.controllers) or of cgroup v1 (/sys/fs/cgroup/cpu)" >&2; exit 2; }
cgroup_version=${cgroup%% *} cgroup_root=${cgroup#* }
base=$cgroup_root/virtprof-xenmon
study_binary
study_accel
echo "xenmon.sh: cgroup $cgroup_version at $cgroup_root; $accel_why" >&2
study_plan "$(study_count "$runs" "$ratios" "$load_steps")" "$seconds"
study_inputs
study_manifest RATIOS="$ratios" CONNECTIONS="$steps" RATES="$rates" SECONDS_EACH="$seconds" RUNS="$runs" \
    CGROUP="$cgroup_version"

# The groups go when the study ends, however it ends (their threads are gone by then).
trap 'rmdir "$base/vcpu" "$base/io" "$base" 2> /dev/null || true' EXIT

last=$(($(nproc) - 2))
for ratio in $ratios; do
    for step in $load_steps; do
        case $step in
            r*) load="--rate ${step#r}" said="${step#r} requests a second (open loop)" ;;
            *) load="--connections ${step#c}" said="${step#c} connections" ;;
        esac
        i=1
        while [ "$i" -le "$runs" ]; do
            name=conf$ratio-$step-$i
            # Done before (the study run again with more RUNS, or after a failure): kept.
            if [ -s "$out/$name.sched.json" ] && grep -q WG-RESULT "$out/$name.result" 2>/dev/null; then
                i=$((i + 1))
                continue
            fi
            echo "xenmon.sh: I/O side : vCPUs = $ratio : 1, $said, run $i" >&2
            # shellcheck disable=SC2086 # $load is an option and its value
            XENMON_RATIO=$ratio XENMON_BASE=$base XENMON_CGROUP=$cgroup_version WG_PLACE="sh $here/xenmon_place.sh" \
                WG_LOAD_CPUS=0-$last study_run "$name" "$out/$name.log" "$out/$name.result" \
                sh "$root/scripts/workload-guest/run.sh" --net tap $load --seconds "$seconds" \
                --interval 100ms -o "$out/$name.vprec" web ||
                echo "xenmon.sh: $name failed: see $out/$name.log" >&2
            if [ -s "$out/$name.vprec" ]; then
                "$virtprof" sched --json "$out/$name.vprec" > "$out/$name.sched.json" 2>> "$out/$name.log" || true
                "$virtprof" report --json "$out/$name.vprec" > "$out/$name.report.json" 2>> "$out/$name.log" || true
            fi
            i=$((i + 1))
        done
    done
done

echo "## XenMon in KVM terms, $(date -u +%Y-%m-%d): QEMU's threads on one host CPU, I/O side : vCPUs by cgroup $cgroup_version CPU weight"
echo
python3 "$here/xenmon_table.py" "$out" "$ratios" "$steps" "$rates"
study_pack
