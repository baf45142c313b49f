#!/usr/bin/env bash
# An arm64 KVM host on any x86 Linux machine: QEMU TCG `-M virt,virtualization=on -cpu max`
# gives the emulated CPU EL2, and Debian's own arm64 kernel (L1) boots there with KVM in VHE
# mode. The aarch64 build under test runs there as root with tracefs mounted.
#
#   bed.sh prepare             fetch and cache Debian's arm64 kernel and busybox, build the
#                              initramfs
#   bed.sh run [-t SECONDS] SCRIPT
#                              boot L1, run SCRIPT (sh) there, print its output, power off;
#                              exits with SCRIPT's status (124: timed out)
#
# VIRTPROF: the aarch64 binary under test (default
# target/aarch64-unknown-linux-gnu/release/virtprof, static: `cargo build --release --target
# aarch64-unknown-linux-gnu`, set up in .cargo/config.toml). Inside L1: `virtprof` on PATH,
# busybox, `kvm-probe` (a KVM guest with exactly known exits: kvm-probe.c), `kvm-boot` (a minimal
# VMM that boots Linux as an L2 guest: kvm-boot.c), /bed/l2 (what it boots: `kvm-boot
# /bed/l2/Image /bed/l2/machine.dtb /bed/l2/initrd.gz` boots the same Debian kernel with a
# busybox init that prints "L2 booted" and powers off), /out (a host folder whose files come
# back: BED_OUT, default a fresh folder under the cache whose path is printed). Everything in L1 is emulated: commands take 10-50x longer
# than on the host.
# Cache: target/arm64-bed (the kernel package, about 60 MB, fetched once with apt, which needs
# the arm64 architecture added: `dpkg --add-architecture arm64 && apt-get update`).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cache=${BED_CACHE:-$root/target/arm64-bed}
virtprof=$(realpath -m "${VIRTPROF:-$root/target/aarch64-unknown-linux-gnu/release/virtprof}")
mkdir -p "$cache"

die() { echo "bed.sh: $*" >&2; exit 2; }

# Debian's arm64 packages, downloaded once; apt must know the arm64 architecture.
fetch() {
    ls "$cache"/linux-image-*.deb > /dev/null 2>&1 && ls "$cache"/busybox-static_*.deb > /dev/null 2>&1 && return
    dpkg --print-foreign-architectures | grep -qx arm64 ||
        die "apt does not know arm64 packages: dpkg --add-architecture arm64 && apt-get update"
    local pkg
    pkg=$(apt-cache depends linux-image-arm64:arm64 | awk '/Depends: linux-image-/{print $2; exit}')
    [ -n "$pkg" ] || die "apt knows no linux-image-arm64:arm64 (run apt-get update)"
    echo "bed.sh: downloading $pkg and busybox-static:arm64" >&2
    (cd "$cache" && apt-get download -qq "$pkg" busybox-static:arm64 2> /dev/null)
}

# The packages unpacked under $cache/kernel and $cache/busybox (call with the lock held).
unpack() {
    fetch
    local deb
    deb=$(ls "$cache"/linux-image-*.deb | head -1)
    if [ ! -s "$cache/vmlinuz" ] || [ "$deb" -nt "$cache/vmlinuz" ]; then
        rm -rf "$cache/kernel" "$cache/busybox"
        dpkg-deb -x "$deb" "$cache/kernel"
        dpkg-deb -x "$(ls "$cache"/busybox-static_*.deb | head -1)" "$cache/busybox"
        cp "$cache"/kernel/boot/vmlinuz-* "$cache/vmlinuz"
    fi
}

# Everything L1 boots with, the initramfs written to $1.
prepare() {
    command -v qemu-system-aarch64 > /dev/null || die "needs qemu-system-aarch64 (apt-get install qemu-system-arm)"
    [ -x "$virtprof" ] || die "no aarch64 virtprof at $virtprof (cargo build --release --target aarch64-unknown-linux-gnu, or set VIRTPROF)"
    file -L "$virtprof" | grep -q 'ARM aarch64' || die "$virtprof is not an aarch64 binary"
    (flock 9 && unpack) 9> "$cache/lock"
    local ir=$cache/initramfs.$$
    rm -rf "$ir" && mkdir -p "$ir"/{bin,usr/bin,proc,sys,dev,tmp,out,lib/modules}
    cp "$cache/busybox/bin/busybox" "$ir/bin/busybox"
    python3 "$root/scripts/module-order.py" "$cache/kernel/lib/modules" virtio_pci 9pnet_virtio 9p |
        while read -r ko; do
            cp "$ko" "$ir/lib/modules/"
            basename "$ko" .ko >> "$ir/lib/modules/order"
        done
    aarch64-linux-gnu-strip -o "$ir/usr/bin/virtprof" "$virtprof" 2> /dev/null || cp "$virtprof" "$ir/usr/bin/virtprof"
    local tool
    for tool in kvm-probe kvm-boot; do
        aarch64-linux-gnu-gcc -O2 -static -o "$ir/usr/bin/$tool" "$root/scripts/arm64/$tool.c" ||
            die "cannot build $tool (apt-get install gcc-aarch64-linux-gnu)"
    done
    cp "$root/scripts/arm64/init" "$ir/init" && chmod +x "$ir/init"
    python3 "$root/scripts/newc.py" "$ir" | gzip -1 > "$1"
    rm -rf "$ir"
}

# The L2 guest kvm-boot boots, into $1/l2: the kernel Image, a busybox initramfs whose init
# says "L2 booted" and powers off, and the machine's device tree (dtc).
l2_files() {
    command -v dtc > /dev/null || die "needs dtc (apt-get install device-tree-compiler)"
    local l2=$1/l2 ir=$1/l2-initramfs
    mkdir -p "$l2" "$ir"/{bin,proc,sys,dev}
    cp "$cache/vmlinuz" "$l2/Image"
    cp "$cache/busybox/bin/busybox" "$ir/bin/busybox"
    printf '%s\n' '#!/bin/busybox sh' '/bin/busybox mount -t proc proc /proc' \
        'echo "L2 booted: $(/bin/busybox cat /proc/version)"' '/bin/busybox poweroff -f' > "$ir/init"
    chmod +x "$ir/init"
    python3 "$root/scripts/newc.py" "$ir" | gzip -1 > "$l2/initrd.gz"
    rm -rf "$ir"
    local end
    end=$(printf '0x%x' $((0x48000000 + $(stat -c %s "$l2/initrd.gz"))))
    sed "s/INITRD_END/$end/" "$root/scripts/arm64/kvm-boot.dts" | dtc -q -I dts -O dtb -o "$l2/machine.dtb" -
}

# L1's QEMU (its `timeout` wrapper's pid) while it runs.
l1=

run() {
    local timeout=600
    if [ "${1:-}" = -t ]; then timeout=$2; shift 2; fi
    local script=${1:?usage: bed.sh run [-t SECONDS] SCRIPT}
    local share out
    share=$(mktemp -d "$cache/run.XXXXXX")
    # Interrupted (Ctrl-C, a closed terminal, kill): stop L1 and leave nothing behind.
    trap '[ -n "$l1" ] && kill "$l1" 2> /dev/null; rm -rf "$share"; echo "bed.sh: interrupted; L1 stopped" >&2; exit 130' INT TERM HUP
    out=$(realpath -m "${BED_OUT:-$share/out}")
    mkdir -p "$out"
    prepare "$share/initrd.gz"
    l2_files "$share"
    cp "$script" "$share/job.sh"
    # QEMU in the background so that a signal reaches the trap above between commands.
    timeout -k 5 "$timeout" qemu-system-aarch64 -M virt,virtualization=on,gic-version=3 -cpu max -smp 2 -m 1G \
        -nographic -no-reboot -kernel "$cache/vmlinuz" -initrd "$share/initrd.gz" \
        -append "console=ttyAMA0 panic=-1 quiet nokaslr ${BED_APPEND:-}" \
        -virtfs "local,path=$share,mount_tag=bed,security_model=none" \
        -virtfs "local,path=$out,mount_tag=out,security_model=none" \
        > "$share/console.log" 2>&1 < /dev/null &
    l1=$!
    local status=0
    wait "$l1" || status=$?
    l1=
    rm -f "$share/initrd.gz"
    [ -n "${BED_OUT:-}" ] || echo "bed.sh: the job's /out is $out" >&2
    if [ ! -s "$share/rc" ]; then
        echo "bed.sh: L1 ended without the job's status (QEMU exit $status; 124: timed out after ${timeout}s); console tail:" >&2
        tail -20 "$share/console.log" >&2
        cat "$share/log" 2> /dev/null || true
        return 124
    fi
    cat "$share/log"
    local rc
    rc=$(cat "$share/rc")
    # With BED_OUT the caller has what it asked for; keep the run's folder only on failure.
    if [ -n "${BED_OUT:-}" ] && [ "$rc" = 0 ]; then rm -rf "$share"; fi
    return "$rc"
}

case "${1:-}" in
    prepare) prepare "$cache/initrd.gz" ;;
    run) shift; run "$@" ;;
    *) sed -n '2,/^# Cache/p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
