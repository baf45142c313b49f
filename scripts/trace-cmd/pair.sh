#!/usr/bin/env bash
# A host and guest trace.dat pair made on a real kvm_amd host (the nested-SVM bed) the way
# trace-cmd's own documentation makes one without its agent (`trace-cmd attach`):
#   L1 (the KVM host) records kvm_exit/kvm_entry/kvm_userspace_exit and sched_switch with the
#   tsc2nsec clock while L2 (a real Linux guest, 2 vCPUs) records its own sched, irq and timer
#   events with x86-tsc; then `trace-cmd attach` writes the guest's clock correction (the
#   negated tsc-offset KVM's debugfs shows for each vCPU) into the guest file as TIME_SHIFT,
#   and the vCPU threads into the host file as GUEST. trace-cmd 3.3 (scripts/trace-cmd/fetch.sh)
#   does all of it, in L1 and in L2.
#
#   scripts/trace-cmd/pair.sh OUT_DIR
#
# OUT_DIR gets host.dat and guest.dat (attached), host-raw.dat and guest-raw.dat (before),
# pair-report.txt (`trace-cmd report -i host.dat -i guest.dat`), the vCPU threads and offsets.
# `trace-cmd agent` (record -A) would do the same over vsock, but trixie's 3.3 agent aborts
# in L2 (`free(): invalid pointer`) right after negotiating its time sync.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$(realpath -m "${1:?usage: pair.sh OUT_DIR}")
tc=$root/target/trace-cmd-trixie
[ -x "$tc/trace-cmd" ] || bash "$root/scripts/trace-cmd/fetch.sh" "$tc" >&2
lib=$tc/root/usr/lib/x86_64-linux-gnu
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# L2: busybox runs a job that traces a small workload (timer sleeps and file reads: the guest
# idles between them, which the host sees as HLT exits) and writes the file to its disk.
cat > "$work/l2job.sh" <<'L2'
export B=/tmp/busybox
cd /tmp
echo GUEST-TRACE-BEGIN
/tmp/ld-linux-x86-64.so.2 --library-path /tmp /tmp/trace-cmd record -q -C x86-tsc \
    -e sched:sched_switch -e sched:sched_wakeup -e irq -e timer:hrtimer_expire_entry \
    -o /tmp/guest.dat -- $B sh -c 'for i in $($B seq 40); do $B ls -R /sys/kernel/mm > /dev/null; $B usleep 20000; done'
echo "GUEST-DAT-SIZE=$($B stat -c %s /tmp/guest.dat)"
$B dd if=/tmp/guest.dat of=/dev/vda bs=65536 conv=fsync 2> /dev/null
echo GUEST-TRACE-END
L2
files="$(command -v busybox):tmp/busybox $work/l2job.sh:tmp/l2job.sh $tc/root/usr/bin/trace-cmd:tmp/trace-cmd"
for l in ld-linux-x86-64.so.2 libc.so.6 libtraceevent.so.1 libtracefs.so.1 libz.so.1 libzstd.so.1; do
    files="$files $(realpath "$lib/$l"):tmp/$l"
done
FILES=$files MODULES="virtio_pci virtio_blk" bash "$root/scripts/debian-kernel/guest-initrd.sh" \
    "$root/target/debug/virtprof" "$work/l2.cpio" >&2

# L1: trace the host while L2 runs (trace-cmd's command is the L2 run), note L2's vCPU threads
# and their TSC offsets meanwhile, then attach.
cat > "$work/l1job.sh" <<L1
set -e
TC=/host$tc/trace-cmd
mount -t debugfs none /sys/kernel/debug 2>/dev/null || true
dmesg | grep -i tsc > /out/l1-tsc.txt || true
cd /tmp
truncate -s 32M /tmp/disk.img
cat > /tmp/run-l2.sh <<'RUN'
qemu-system-x86_64 -enable-kvm -cpu host -m 512M -smp 2 -nographic -no-reboot -nodefaults \
    -serial stdio -net none -name l2pair,debug-threads=on \
    -drive file=/tmp/disk.img,format=raw,if=virtio \
    -kernel /bed/l2/vmlinuz -initrd /host$work/l2.cpio \
    -append "console=ttyS0 panic=-1 quiet -- /tmp/busybox sh /tmp/l2job.sh" > /out/l2console.txt 2>&1 &
l2=\$!
for i in \$(seq 300); do grep -q GUEST-TRACE-BEGIN /out/l2console.txt && break; sleep 1; done
for t in /proc/\$l2/task/*; do echo "\$(basename \$t) \$(cat \$t/comm)"; done > /out/l2-threads.txt
for f in /sys/kernel/debug/kvm/\$l2-*/vcpu*/tsc-offset; do echo "\$f \$(cat \$f)"; done > /out/tsc-offsets.txt
wait \$l2
RUN
hang-guard 500 \$TC record -q -C tsc2nsec -e kvm:kvm_exit -e kvm:kvm_entry -e kvm:kvm_userspace_exit \
    -e sched:sched_switch -o /tmp/host.dat -- sh /tmp/run-l2.sh > /out/host-record.txt 2>&1
size=\$(sed -n 's/.*GUEST-DAT-SIZE=\([0-9]*\).*/\1/p' /out/l2console.txt | tr -d '\r')
head -c "\$size" /tmp/disk.img > /tmp/guest.dat
cp /tmp/host.dat /out/host-raw.dat
cp /tmp/guest.dat /out/guest-raw.dat
offset=\$(head -1 /out/tsc-offsets.txt | cut -d' ' -f2)
\$TC attach -c 2 -s "\$((-offset))" /tmp/host.dat /tmp/guest.dat \$(cut -d' ' -f1 /out/l2-threads.txt) > /out/attach.txt 2>&1
cp /tmp/host.dat /tmp/guest.dat /out/
\$TC report -N -i /tmp/host.dat -i /tmp/guest.dat > /out/pair-report.txt 2> /out/pair-report.err
ls /sys/kernel/tracing/instances > /out/instances
L1
mkdir -p "$out"
# L1 keeps the TSC as its clocksource: only then does perf (and so trace-cmd's tsc2nsec) have
# a TSC-to-nanosecond conversion to give.
BED_APPEND="clocksource=tsc tsc=reliable" BED_OUT=$out VIRTPROF=$root/target/debug/virtprof \
    bash "$root/scripts/nested-svm/bed.sh" run -t 900 "$work/l1job.sh"
