#!/bin/sh
# Boot profiling (seed 003), Fig. 3 and Table 1 on an arm64 KVM host: the arm64 bed's L1
# (Debian's arm64 kernel with KVM in VHE mode, under QEMU TCG `-M virt,virtualization=on`) boots
# a real Linux guest (the same kernel as L2, `kvm-boot`: a minimal VMM with an in-kernel GICv3)
# under the aarch64 build's `virtprof record`, and `virtprof boot --recording` samples each boot
# from the hypervisor's kvm_exit/kvm_entry timeline with L1's /proc/kallsyms as the symbols
# (both kernels boot with nokaslr). Per boot: realms, the top symbols with realm, fraction and
# rank; across boots, how stable each rank is. Control boots only: the balloon (Table 2) is a
# module built against the kernel's headers, and Debian's arm64 kbuild tools are arm64
# programs this x86 host cannot run to build it (the x86 study, bootprof.sh, has it).
#
#   sh benches/papers/bootprof-arm64.sh [OUT]      (default target/papers/bootprof-arm64)
#
# RUNS (default 5) boots, RATE (samples per second, default 10000). Run again into the same
# OUT, it keeps the boots it has and does the rest. VIRTPROF: the x86-64 binary that profiles
# the recordings (default target/release/virtprof, built); VIRTPROF_AARCH64: the aarch64 one
# that records in L1 (default target/aarch64-unknown-linux-gnu/release/virtprof, built).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=$(realpath -m "${1:-$root/target/papers/bootprof-arm64}")
runs=${RUNS:-5} rate=${RATE:-10000}
study=bootprof-arm64.sh
mkdir -p "$out"
. "$here/common.sh"
for tool in qemu-system-aarch64 aarch64-linux-gnu-gcc dtc; do
    command -v "$tool" > /dev/null ||
        { echo "bootprof-arm64.sh: the arm64 bed needs $tool (scripts/test.sh installs it)" >&2; exit 2; }
done
study_binary
if [ -n "${VIRTPROF_AARCH64:-}" ]; then
    aarch64=$VIRTPROF_AARCH64
else
    aarch64=$root/target/aarch64-unknown-linux-gnu/release/virtprof
    echo "$study: cargo build --release --target aarch64-unknown-linux-gnu -p virtprof-cli" >&2
    (cd "$root" && CARGO_PROFILE_RELEASE_DEBUG=0 cargo build --release --locked -q --target aarch64-unknown-linux-gnu \
        -p virtprof-cli) >&2 || { echo "$study: the aarch64 release build failed" >&2; exit 2; }
fi
export VIRTPROF_AARCH64="$aarch64"
accel=arm64-bed
accel_why="the arm64 bed: L2 under KVM (VHE) in an arm64 L1 that QEMU TCG emulates; timings are emulation's"
# An L1 boot (about 60 s under TCG), L2's boot recorded whole (15-40 s) and its profile.
study_plan "$runs" 0 150
study_inputs arm64
study_manifest RUNS="$runs" RATE="$rate"

# One L1 boot per L2 boot, as bootprof.sh does: a broken emulated L1 costs one boot. A boot
# still running after 150 s is stopped by kvm-boot (it says where it was) and tried once more.
job= study_bed_out=
trap 'rm -rf "$job" "$study_bed_out"' EXIT
i=1
while [ "$i" -le "$runs" ]; do
    name=control-$i
    i=$((i + 1))
    grep -q "L2 booted" "$out/$name.console" 2> /dev/null && [ -s "$out/$name.vprec" ] && continue
    job=$(mktemp "${TMPDIR:-/tmp}/bootprof-arm64-job.XXXXXX")
    cat > "$job" << EOF
cat /proc/kallsyms > /out/$name.kallsyms
attempt=1
until virtprof record -o /out/$name.vprec -- kvm-boot /bed/l2/Image /bed/l2/machine.dtb /bed/l2/initrd.gz 256 150 \
    > /out/$name.console 2> /out/$name.log && grep -q "L2 booted" /out/$name.console; do
    [ \$attempt -ge 2 ] && { echo "$name: L2 did not boot in 2 tries"; rm -f /out/$name.vprec; break; }
    attempt=\$((attempt + 1))
done
EOF
    echo "bootprof-arm64.sh: $name: booting L2 in the arm64 bed" >&2
    study_bed_job "$name" "$root/scripts/arm64/bed.sh" 900 "$job" VIRTPROF="$aarch64"
    rm -f "$job"
done

# Each boot's profile from its recording, with the symbols of the L1 that recorded it.
study_boot_profiles per-run --rate "$rate"

echo "## Boot profiling (seed 003) on arm64 KVM (the arm64 bed), $(date -u +%Y-%m-%d): $runs boots, $rate samples/s"
echo
python3 "$here/bootprof_table.py" "$out" "$runs"
study_pack
