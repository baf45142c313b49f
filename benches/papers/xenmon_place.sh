#!/bin/sh
# The XenMon study's placement (benches/papers/xenmon.sh), run by the workload guest's run.sh
# once the guest serves, with QEMU's pid: every QEMU thread on the last CPU, its vCPU threads
# in one group and the rest (main loop, iothread, pool: threads made later join their maker's,
# the main loop's) in the other, weighted XENMON_RATIO : 1. XENMON_CGROUP says v2 (cpu.weight,
# threaded groups under XENMON_BASE, which then holds the whole process) or v1 (cpu.shares).
#
#   XENMON_RATIO=R XENMON_BASE=DIR XENMON_CGROUP=v2|v1 sh xenmon_place.sh PID
set -eu
pid=$1 base=$XENMON_BASE
cpu=$(($(nproc) - 1))
mkdir -p "$base/vcpu" "$base/io"
if [ "$XENMON_CGROUP" = v2 ]; then
    # Threaded groups under a domain that holds the whole process; weight 100 is 1.
    echo +cpu > "$base/../cgroup.subtree_control"
    echo threaded > "$base/vcpu/cgroup.type"
    echo threaded > "$base/io/cgroup.type"
    echo +cpu > "$base/cgroup.subtree_control"
    echo "$pid" > "$base/cgroup.procs"
    echo 100 > "$base/vcpu/cpu.weight"
    awk -v r="$XENMON_RATIO" 'BEGIN { w = int(r * 100); print (w < 1 ? 1 : w > 10000 ? 10000 : w) }' > "$base/io/cpu.weight"
    member=cgroup.threads
else
    echo 1024 > "$base/vcpu/cpu.shares"
    awk -v r="$XENMON_RATIO" 'BEGIN { printf "%d\n", r * 1024 }' > "$base/io/cpu.shares"
    member=tasks
fi
for task in /proc/"$pid"/task/*; do
    tid=${task##*/}
    taskset -p -c "$cpu" "$tid" > /dev/null
    case $(cat "$task/comm") in
        CPU*) echo "$tid" > "$base/vcpu/$member" ;;
        *) echo "$tid" > "$base/io/$member" ;;
    esac
done
