#!/bin/sh
# Boot profiling (seed 003), Fig. 3, Tables 1-2, Figs. 5-7 on a real kvm_amd host: the
# nested-SVM bed's L1 boots a real Linux guest (Debian's kernel, L2 under QEMU-KVM) under
# `virtprof record --events kvm`, and `virtprof boot --recording` samples each boot from the
# hypervisor's kvm_exit/kvm_entry timeline, the hypervisor realm measured. Boots alternate
# between the control and the ballooned guest: the same initramfs loads a small module
# (scripts/boot-balloon) whose init busy-waits BALLOON_MS in the kernel's delay loop (0 in the
# control), the seed's ballooned symbol. Per boot: realms, the top symbols with realm,
# fraction and rank, the ballooned symbol's fraction and the boot's length, per-symbol time
# profiles; across runs, how stable each rank is. Fig. 4 (a boot's user-space "last mile"):
# the workload guest booted the same way, its init doing real user-space work (modules, the
# network, the agent) up to WG-READY, then powered off: kernel and user realms per tenth of
# the boot.
#
#   sh benches/papers/bootprof.sh [OUT]      (default target/papers/bootprof)
#
# RUNS (default 5) boots of each kind, USERLAND_RUNS (default RUNS; 0: none) workload-guest
# boots, BALLOON_MS (default 10000), RATE (samples per second, default 10000). Run again into
# the same OUT, it keeps the boots it has and does the rest.
# VIRTPROF: the binary (default target/release/virtprof, built when missing).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=$(realpath -m "${1:-$root/target/papers/bootprof}")
runs=${RUNS:-5} balloon_ms=${BALLOON_MS:-10000} rate=${RATE:-10000} userland_runs=${USERLAND_RUNS:-${RUNS:-5}}
study=bootprof.sh
mkdir -p "$out"
. "$here/common.sh"
study_binary
accel=kvm accel_why="the nested-SVM bed: L2 under kvm_amd in an L1 that QEMU TCG emulates; timings are emulation's"
# An L1 boot, L2's boot recorded whole and L1's shutdown: 36 s each on the 2-CPU development host.
study_plan $((2 * runs + userland_runs)) 0 45
study_inputs bed
if [ "$userland_runs" -gt 0 ]; then
    # The workload guest too (its packages are pinned as well): its initramfs is L2's userland.
    study_inputs
    wg=$root/target/workload-guest
fi
study_manifest RUNS="$runs" USERLAND_RUNS="$userland_runs" BALLOON_MS="$balloon_ms" RATE="$rate"
balloon=$(sh "$root/scripts/boot-balloon/build.sh")
kernel=$root/target/debian-kernel
bash "$root/scripts/debian-kernel/fetch.sh" "$kernel" > /dev/null
bed_kernel=$(basename "$(ls "$root"/target/nested-svm/linux-image-*.deb | head -1)" | sed 's/^linux-image-\([^_]*\)_.*/\1/')
[ "$(cat "$kernel/version")" = "$bed_kernel" ] ||
    { echo "bootprof.sh: the System.map is of $(cat "$kernel/version"), the bed boots $bed_kernel (refetch both)" >&2; exit 2; }

# The boots still to do, control and balloon alternating (which comes first, by run).
todo=
i=1
while [ "$i" -le "$runs" ]; do
    pair="control-$i balloon-$i"
    [ $((i % 2)) = 0 ] && pair="balloon-$i control-$i"
    for name in $pair; do
        grep -q L2-INIT-MARKER "$out/$name.console" 2> /dev/null && [ -s "$out/$name.vprec" ] || todo="$todo $name"
    done
    i=$((i + 1))
done
i=1
while [ "$i" -le "$userland_runs" ]; do
    grep -q WG-READY "$out/userland-$i.console" 2> /dev/null && [ -s "$out/userland-$i.vprec" ] || todo="$todo userland-$i"
    i=$((i + 1))
done

# One L1 boot per L2 boot: emulated SVM now and then breaks L1 itself (a panic, a reset), and
# the bed then runs the job again from the start, so a job of one boot loses only that boot.
# In L1 the boot is recorded whole; an L2 that ends before its marker is booted again, three
# times at most.
job= study_bed_out=
trap 'rm -rf "$job" "$study_bed_out"' EXIT
for name in $todo; do
    ms=0
    case $name in balloon-*) ms=$balloon_ms ;; esac
    job=$(mktemp "${TMPDIR:-/tmp}/bootprof-job.XXXXXX")
    case $name in
        userland-*)
            # The workload guest's init reads commands from its console once it has said
            # WG-READY: its boot is recorded until then, and a poweroff ends it.
            cat > "$job" <<EOF
mkfifo /tmp/console-in
exec 3<> /tmp/console-in
L2_INITRD=/host$wg/initrd.gz hang-guard 900 virtprof record -o /out/$name.vprec --events kvm -- l2-boot -m 768M \
    < /tmp/console-in > /out/$name.console 2> /out/$name.log &
recording=\$!
waited=0
until grep -q WG-READY /out/$name.console; do
    kill -0 \$recording 2> /dev/null || break
    waited=\$((waited + 1))
    [ \$waited -gt 900 ] && break
    sleep 1
done
echo poweroff >&3
wait \$recording || true
grep -q WG-READY /out/$name.console || { echo "$name: the workload guest never said WG-READY"; rm -f /out/$name.vprec; }
EOF
            echo "bootprof.sh: $name: booting the workload guest as L2 in the nested-SVM bed" >&2
            ;;
        *)
            cat > "$job" <<EOF
attempt=1
while :; do
    L2_INITRD=/host$balloon/balloon-initrd.gz L2_APPEND="rdinit=/balloon-init balloon_ms=$ms" \
        hang-guard 900 virtprof record -o /out/$name.vprec --events kvm -- l2-boot > /out/$name.console 2> /out/$name.log
    grep -q L2-INIT-MARKER /out/$name.console && break
    [ \$attempt -ge 3 ] && { echo "$name: L2 did not reach its marker in 3 boots"; rm -f /out/$name.vprec; break; }
    attempt=\$((attempt + 1))
done
EOF
            echo "bootprof.sh: $name: booting L2 in the nested-SVM bed (balloon $ms ms)" >&2
            ;;
    esac
    study_bed_job "$name" "$root/scripts/nested-svm/bed.sh" 1800 "$job"
    rm -f "$job"
done

# Each boot's profile from its recording; the symbols of Figs. 5-7 followed over time.
study_boot_profiles "$kernel/System.map" --rate "$rate" --symbol delay_tsc --symbol read_pci_config \
    --symbol native_write_msr

echo "## Boot profiling (seed 003) on kvm_amd (nested-SVM bed), $(date -u +%Y-%m-%d): $runs boots each, balloon $balloon_ms ms, $rate samples/s"
echo
python3 "$here/bootprof_table.py" "$out" "$runs" "$userland_runs"
study_pack
