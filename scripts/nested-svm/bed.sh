#!/usr/bin/env bash
# A real kvm_amd host on any x86 Linux machine: QEMU TCG with `-cpu max` emulates AMD SVM and
# NPT, and Debian's own kernel (L1) loads kvm_amd inside it. The build under test runs there
# as root with tracefs mounted; the host's root is shared read-only at /host.
#
#   bed.sh prepare                      fetch and cache the kernel package, build the initramfs
#   bed.sh kernel                       unpack the kernel package; print the folder holding
#                                       vmlinuz and kernel/lib/modules
#   bed.sh modules DIR NAME...          those modules of DIR and their dependencies, in load order
#   bed.sh run [-t SECONDS] SCRIPT      boot L1, run SCRIPT (sh) there, print its output, power
#                                       off; exits with SCRIPT's status (124: timed out)
#
# `hang-guard SECONDS CMD` inside L1 runs CMD and, should it still run after SECONDS, ends
# L1 as broken (so the job runs again) instead of letting the whole job time out.
#
# L2: `l2-boot [QEMU ARGS]` inside L1 boots the same kernel as a KVM guest of L1 with the
# host's own QEMU (read from /host), named l2guest; its init prints L2-INIT-MARKER and powers
# off. `qemu-system-x86_64` in L1 is that QEMU.
#
# VIRTPROF: the binary under test (default target/debug/virtprof); it is copied in stripped,
# with the libraries it links (none: the static binary of scripts/package.sh goes in alone). Inside L1: `virtprof` on PATH, busybox, /out (a host folder
# whose files come back: BED_OUT, default a fresh folder under target/nested-svm whose path
# is printed). Runs may go on at once: each has its own folders and initramfs, and the
# kernel is unpacked once under a lock. Everything inside L1 is emulated: exits cost tens of
# microseconds and commands take 3-10x longer than on the host. An attempt whose L1 breaks
# under emulation (a panic, a stall) is run again, up to BED_ATTEMPTS (5) in all; BED_APPEND
# adds to L1's kernel command line.
# Cache: target/nested-svm (the kernel package, about 70 MB, fetched once with apt).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cache=${BED_CACHE:-$root/target/nested-svm}
virtprof=$(realpath "${VIRTPROF:-$root/target/debug/virtprof}")
mkdir -p "$cache"

die() { echo "bed.sh: $*" >&2; exit 2; }

# The kernel package: Debian's current one, downloaded once.
kernel_package() {
    local deb
    deb=$(ls "$cache"/linux-image-*.deb 2>/dev/null | head -1 || true)
    if [ -z "$deb" ]; then
        local pkg
        pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-/{print $2; exit}')
        [ -n "$pkg" ] || die "apt knows no linux-image-amd64 (run apt-get update)"
        echo "bed.sh: downloading $pkg" >&2
        (cd "$cache" && apt-get download -qq "$pkg" 2>/dev/null)
        deb=$(ls "$cache"/linux-image-*.deb | head -1)
    fi
    echo "$deb"
}

# Modules named after DIR, with everything they depend on, in load order.
module_order() {
    python3 "$root/scripts/module-order.py" "$@"
}

# The kernel package unpacked under $cache/kernel, its vmlinuz at $cache/vmlinuz (call with
# the cache lock held).
unpack_kernel() {
    local deb
    deb=$(kernel_package)
    if [ ! -s "$cache/vmlinuz" ] || [ "$deb" -nt "$cache/vmlinuz" ] || [ ! -d "$cache/kernel/lib/modules" ]; then
        rm -rf "$cache/kernel" && dpkg-deb -x "$deb" "$cache/kernel"
        cp "$cache"/kernel/boot/vmlinuz-* "$cache/vmlinuz"
    fi
}

# Everything L1 boots with, the initramfs written to $1.
prepare() {
    command -v busybox >/dev/null || die "needs a static busybox (apt-get install busybox-static)"
    command -v qemu-system-x86_64 >/dev/null || die "needs qemu-system-x86_64 (apt-get install qemu-system-x86)"
    [ -x "$virtprof" ] || die "no virtprof binary at $virtprof (cargo build, or set VIRTPROF)"
    local kimg=$cache/kernel ir
    (
        flock 9
        unpack_kernel
        if [ ! -s "$cache/l2-initrd.gz" ]; then
            local l2=$cache/l2-initramfs
            rm -rf "$l2" && mkdir -p "$l2"/{bin,proc,sys,dev}
            cp "$(command -v busybox)" "$l2/bin/busybox"
            cp "$root/scripts/nested-svm/l2-init" "$l2/init" && chmod +x "$l2/init"
            python3 "$root/scripts/newc.py" "$l2" | gzip -1 > "$cache/l2-initrd.gz"
            rm -rf "$l2"
        fi
    ) 9> "$cache/lock"
    ir=$cache/initramfs.$$
    rm -rf "$ir" && mkdir -p "$ir"/{bin,usr/bin,proc,sys,dev,tmp,out,host,lib/modules}
    cp "$(command -v busybox)" "$ir/bin/busybox"
    module_order "$kimg/lib/modules" virtio_pci 9pnet_virtio 9p kvm_amd vhost_vsock tun vhost_net | while read -r ko; do
        cp "$ko" "$ir/lib/modules/"
        basename "$ko" .ko >> "$ir/lib/modules/order"
    done
    objcopy --strip-debug "$virtprof" "$ir/usr/bin/virtprof"
    # The libraries a dynamic build links (none for scripts/package.sh's static binary), and
    # the loader the host's QEMU starts with (its libraries come from /host).
    { ldd "$virtprof" 2>/dev/null || true; } | { grep -o '/[^ ]*' || true; } | while read -r lib; do
        mkdir -p "$ir$(dirname "$lib")" && cp -L "$lib" "$ir$lib"
    done
    loader=$(readelf -l "$(command -v qemu-system-x86_64)" | sed -n 's/.*interpreter: \(.*\)]/\1/p')
    mkdir -p "$ir$(dirname "$loader")" && cp -L "$loader" "$ir$loader"
    cp "$root/scripts/nested-svm/init" "$ir/init"
    cp "$root/scripts/nested-svm/qemu-system-x86_64" "$root/scripts/nested-svm/l2-boot" \
        "$root/scripts/nested-svm/hang-guard" "$ir/usr/bin/"
    chmod +x "$ir/init" "$ir/usr/bin/qemu-system-x86_64" "$ir/usr/bin/l2-boot" "$ir/usr/bin/hang-guard"
    python3 "$root/scripts/newc.py" "$ir" | gzip -1 > "$1"
    rm -rf "$ir"
}

# Boot L1 once with the job in $share; true if it reported a status.
boot_l1() {
    local share=$1 out=$2 timeout=$3
    rm -f "$share/rc" "$share/log" "$share/hung" "$share/alive"
    # L1 arms its timers in the LAPIC's one-shot mode (lapic=notscdeadline): with the TSC
    # deadline timer, emulated SVM now and then lost a CPU's timer while L2 guests ran (an RCU
    # stall "timer wakeup didn't happen ... on cpu=0" in a third of the long jobs; none in 48
    # guest runs without it). A soft lockup or an RCU stall panics L1 (and so ends QEMU)
    # instead of hanging until the timeout. Both thresholds are 60 s or more (watchdog_thresh=60
    # makes soft lockups 120 s), as a loaded host can starve an emulated CPU for tens of
    # seconds. QEMU
    # runs in the background so that a signal to this script reaches the trap in `run`
    # (bash runs traps only between commands; `wait` is one).
    timeout -k 5 "$timeout" qemu-system-x86_64 -accel tcg -cpu max -m 2G -smp 2 \
        -nographic -no-reboot -kernel "$cache/vmlinuz" -initrd "$share/initrd.gz" \
        -append "console=ttyS0 panic=-1 lapic=notscdeadline softlockup_panic=1 watchdog_thresh=60 \
rcupdate.rcu_cpu_stall_timeout=60 sysctl.kernel.panic_on_rcu_stall=1 quiet ${BED_APPEND:-}" \
        -virtfs "local,path=$share,mount_tag=bed,security_model=none" \
        -virtfs "local,path=$out,mount_tag=out,security_model=none" \
        -virtfs "local,path=/,mount_tag=host,security_model=none,readonly=on" \
        > "$share/console.log" 2>&1 < /dev/null &
    l1=$!
    watch_l1 "$share"
    local status=0
    wait "$l1" || status=$?
    l1=
    # The job still running at the time limit in an L1 that kept beating is the job's own
    # hang (every step that waits on L2 is under hang-guard): it fails, it is not repeated.
    if [ "$status" = 124 ] && [ ! -s "$share/rc" ] && [ ! -s "$share/hung" ]; then
        echo "bed.sh: the job was still running after ${timeout}s (L1 itself was alive)" >&2
    elif [ ! -s "$share/rc" ] && [ ! -s "$share/hung" ]; then
        # L1 went away before its time limit without the job's status and without a panic
        # on its console (seen in CI: QEMU ended 51 s into the boot, the console stopping at
        # an unhandled WRMSR): the emulator's, so the attempt is repeated like a stuck one.
        echo "L1 ended without the job's status (QEMU exit $status), before its time limit" > "$share/hung"
    fi
    [ -s "$share/rc" ]
}

# Until L1 ends: an L1 whose heartbeat (init writes a new count to $share/alive every 5 s)
# stops for BED_STALL seconds (default 60: twelve missed beats; L1's own watchdogs panic it
# at 60 s of lockup too), or that never starts beating within 120 s, is stuck under
# emulation: it is stopped and the reason written to $share/hung, so the attempt is repeated
# within a minute or two instead of at the job's time limit. One that wrote its status but
# does not power off is stopped too.
watch_l1() {
    local share=$1 stall=${BED_STALL:-60} beat= seen=$SECONDS start=$SECONDS now done_at=
    while kill -0 "$l1" 2>/dev/null; do
        sleep 1
        now=$(cat "$share/alive" 2>/dev/null || true)
        if [ "$now" != "$beat" ]; then
            beat=$now
            seen=$SECONDS
        fi
        if [ -s "$share/rc" ]; then
            done_at=${done_at:-$SECONDS}
            [ $((SECONDS - done_at)) -lt 30 ] && continue
        elif [ -n "$beat" ] && [ $((SECONDS - seen)) -lt "$stall" ]; then
            continue
        elif [ -z "$beat" ] && [ $((SECONDS - seen)) -lt 120 ]; then
            continue
        elif [ -z "$beat" ]; then
            echo "L1 did not boot (no heartbeat within 120s)" > "$share/hung"
        else
            echo "L1 stuck $((seen - start))s into the run (no heartbeat for ${stall}s)" > "$share/hung"
        fi
        kill "$l1" 2>/dev/null  # timeout(1) passes the TERM on to QEMU
        return
    done
}

# The L1 QEMU running now (its `timeout` wrapper's pid), if any.
l1=

# On a signal: stop L1, remove the run's folder, exit as interrupted.
stopped() {
    [ -n "$l1" ] && kill "$l1" 2>/dev/null && wait "$l1" 2>/dev/null
    rm -rf "$1"
    echo "bed.sh: interrupted; L1 stopped" >&2
    exit 130
}

run() {
    local timeout=600
    if [ "${1:-}" = -t ]; then timeout=$2; shift 2; fi
    local script=${1:?usage: bed.sh run [-t SECONDS] SCRIPT}
    local share out
    share=$(mktemp -d "$cache/run.XXXXXX")
    # Interrupted (Ctrl-C, a closed terminal, kill): stop L1 and leave nothing behind.
    trap 'stopped "$share"' INT TERM HUP
    out=$(realpath -m "${BED_OUT:-$share/out}")
    mkdir -p "$out"
    prepare "$share/initrd.gz"
    cp "$script" "$share/job.sh"
    mkdir -p "$share/l2" && cp "$cache/vmlinuz" "$cache/l2-initrd.gz" "$share/l2/"
    # Emulated SVM under TCG now and then locks an L1 CPU up, corrupts a kernel stack, or
    # leaves an L2 guest making no progress (a hang-guard'ed command that never ends; once a
    # micro-VM triple-faulted), or stops L1's clock (its heartbeat stops; see watch_l1): the
    # emulator's, not the job's. L1 then panics or is powered
    # off, and the job runs again, up to BED_ATTEMPTS times in all (default 5), saying so.
    # Each broken attempt's console is kept as console.N.log.
    local broke='soft lockup|Kernel panic|RCU Stall' attempt=1 began=$SECONDS
    while ! boot_l1 "$share" "$out" "$timeout" && { [ -s "$share/hung" ] || grep -Eq "$broke" "$share/console.log"; } &&
        [ "$attempt" -lt "${BED_ATTEMPTS:-5}" ]; do
        local why
        why=$(cat "$share/hung" 2>/dev/null || grep -Em1 "$broke" "$share/console.log" | sed 's/^\[[^]]*\] //')
        echo "bed.sh: L1 broke under emulation ($why) after $((SECONDS - began))s; running the job again" >&2
        began=$SECONDS
        mv "$share/hung" "$share/hung.$attempt" 2>/dev/null || true
        mv "$share/console.log" "$share/console.$attempt.log"
        mv "$share/log" "$share/log.$attempt" 2>/dev/null || true
        find "$out" -mindepth 1 -delete
        attempt=$((attempt + 1))
    done
    rm -f "$share/initrd.gz"
    [ -n "${BED_OUT:-}" ] || echo "bed.sh: the job's /out is $out" >&2
    if [ ! -s "$share/rc" ]; then
        [ -s "$share/hung" ] && echo "bed.sh: $(cat "$share/hung") on every attempt" >&2
        echo "bed.sh: L1 ended without the job's status (timed out after ${timeout}s, or broke on every attempt); console tail:" >&2
        tail -20 "$share/console.log" >&2
        cat "$share/log" 2>/dev/null || true
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
    # The folder holding vmlinuz and kernel/lib/modules of the bed's kernel package.
    kernel) (flock 9 && unpack_kernel) 9> "$cache/lock" && echo "$cache" ;;
    # MODULES_DIR NAME...: those modules and their dependencies' paths, in load order.
    modules) shift; module_order "$@" ;;
    run) shift; run "$@" ;;
    *) sed -n '2,/^# Cache/p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
