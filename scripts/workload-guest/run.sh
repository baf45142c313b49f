#!/bin/sh
# Run one real workload in the workload guest (build.sh) under QEMU, or natively in `chroot`
# of the guest's root (the same programs, libraries and data), under
# `virtprof record --interval ... --agent ...`: the host's trace and counters, the guest's
# kernel and application rows from `virtprof agent` (in the guest, or on this host natively).
#
#   run.sh [OPTIONS] WORKLOAD
#
#   WORKLOAD        stress | sqlite | compress | build   (run inside the guest)
#                   web   (lighttpd in the guest, wrk on this side)
#                   iperf (iperf3 -s in the guest, iperf3 -c on this side)
#   --native        run it on this host instead of in a guest
#   --nested        run it in a guest of the nested-SVM bed's L1 (a real kvm_amd host under
#                   QEMU TCG, scripts/nested-svm/bed.sh): the guest is L2 under QEMU-KVM, its
#                   agent on vsock, and L1 records; -o FILE comes back to this host. With
#                   --native: natively in L1 (the native side of a study on kvm_amd)
#   --seconds N     how long the workload runs (default 10)
#   --interval T    the recording's and the agent's interval (default 100ms)
#   -o FILE         the recording (default wg-WORKLOAD-guest|native.vprec here)
#   --accel A       kvm or tcg (default kvm where this CPU has VMX or SVM, else tcg)
#   --memory SIZE   the guest's memory (default 1G)
#   --net N         the guest's network: user (QEMU user networking, default) or tap (a tap
#                   device on this host, with vhost-net where /dev/vhost-net exists)
#   --record ARGS   more arguments for `virtprof record` (e.g. "--counters task-clock")
#   --connections N web: wrk's open connections (default 16), the load's step
#   --rate N        web: an open-loop load in place of wrk: N requests a second on a fixed
#                   schedule, one connection each (openloop.py; the XenMon paper's httperf)
#   --no-record     run the workload without `virtprof record` (the guest's agent idles,
#                   listening): the baseline of the recording's own overhead. No -o file
#
# WG_PLACE: a command run once the guest is ready, before the recording, with QEMU's pid as its
# argument (to pin or weigh its threads; its failure ends the run). WG_LOAD_CPUS: the host
# CPUs the load generator runs on (taskset -c).
# Prints the workload's own result line (WG-RESULT name=... seconds=... ops=... unit=...), what
# the recording is checked against, and exits with the workload's status (2: bad usage). The
# agent link is vsock where this host has /dev/vhost-vsock, else virtio-serial; the network
# card is virtio-net. WG_DIR: the built guest (default target/workload-guest,
# built when missing); VIRTPROF: the binary (default target/debug/virtprof).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
wg=${WG_DIR:-$root/target/workload-guest}
virtprof=${VIRTPROF:-$root/target/debug/virtprof}
die() { echo "run.sh: $*" >&2; exit 2; }

# How many console lines hold MARKER so far (0 before the console has any).
lines_with() {
    n=$(grep -ac "$1" "$run/console.log" 2>/dev/null || true)  # grep -c fails on no match
    echo "${n:-0}"
}
# Lines from the guest's console are appended to RUN/console.log as they come. Wait until
# MARKER has been seen more than N times (at most WITHIN seconds, while QEMU runs).
await() {
    marker=$1 seen=$2 within=$3 waited=0
    while [ "$(lines_with "$marker")" -le "$seen" ]; do
        if [ "$waited" -ge $((within * 10)) ] || ! kill -0 "$qemu" 2>/dev/null; then
            echo "run.sh: no '$marker' from the guest within ${within}s (QEMU $(kill -0 "$qemu" 2>/dev/null &&
                echo running || echo ended)); its console:" >&2
            tail -20 "$run/console.log" >&2
            [ -s "$run/qemu.log" ] && { echo "run.sh: QEMU said:" >&2; tail -5 "$run/qemu.log" >&2; }
            return 1
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
}
# The tap QEMU made (it does so as it starts): this side's address on it, and up.
tap_up() {
    waited=0
    until ip link show "$tap" > /dev/null 2>&1; do
        [ "$waited" -ge 100 ] && { echo "run.sh: QEMU made no tap $tap within 10s" >&2; return 1; }
        kill -0 "$qemu" 2>/dev/null || return 1
        sleep 0.1
        waited=$((waited + 1))
    done
    ip addr add "$subnet.1/24" dev "$tap" && ip link set "$tap" up
}
# Give the guest a command (init reads its console); true if its WG-DONE says rc=0, else the
# line and the console before it are shown.
tell() {
    before=$(lines_with "WG-DONE $2 ")
    echo "$1" > "$run/con.in"
    await "WG-DONE $2 " "$before" "$3" || return 1
    done_line=$(grep -a "WG-DONE $2 " "$run/console.log" | tail -1 | tr -d '\r')
    [ "$(echo "$done_line" | sed 's/.*rc=\([0-9]*\).*/\1/')" = 0 ] && return 0
    echo "run.sh: the guest's '$1' ended: $done_line; its console:" >&2
    tail -10 "$run/console.log" >&2
    return 1
}
# The guest's root with this host's kernel: /proc, /dev and the run's data bound in and a
# tmpfs on /tmp (the root may be read-only: the bed's L1 reads it from the host), in a mount
# namespace of its own (the mounts go when the command ends), with a PATH of its own (L1's
# lacks sbin).
in_root() {
    # exec: started in the background, the server is then the very process the cleanup stops
    # (a subshell around it would be stopped instead, and the server left running).
    exec unshare -m sh -c "mount --bind /proc '$wg/root/proc' && mount --bind /dev '$wg/root/dev' &&
        mount --bind '$run/data' '$wg/root/data' && mount -t tmpfs tmp '$wg/root/tmp' &&
        TMPDIR=/tmp PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin exec chroot '$wg/root' \"\$@\"" sh "$@"
}

# The command `virtprof record` runs for a workload inside the guest or the root: it runs the
# workload and passes its result line on.
case ${1:-} in
    --_guest)
        run=$2 qemu=$3
        tell "run $4 $5" "$4" $(($5 + 300)) && status=0 || status=1
        grep -a "WG-RESULT name=$4 " "$run/console.log" | tail -1 | tr -d '\r'
        exit $status
        ;;
    --_root)
        wg=$2 run=$3
        shift 3
        in_root "$@"
        exit
        ;;
esac

native=0 nested=0 seconds=10 interval=100ms out= accel= memory=1G net=user record_args= workload= connections=16
rate= record=1
while [ $# -gt 0 ]; do
    case $1 in
        --native) native=1 ;;
        --nested) nested=1 ;;
        --memory) memory=${2:?--memory SIZE}; shift ;;
        --net) net=${2:?--net user|tap}; shift ;;
        --seconds) seconds=${2:?--seconds N}; shift ;;
        --interval) interval=${2:?--interval TIME}; shift ;;
        -o) out=${2:?-o FILE}; shift ;;
        --accel) accel=${2:?--accel kvm|tcg}; shift ;;
        --record) record_args=${2:?--record ARGS}; shift ;;
        --connections) connections=${2:?--connections N}; shift ;;
        --rate) rate=${2:?--rate N}; shift ;;
        --no-record) record=0 ;;
        -h | --help) sed -n '2,/^set -eu/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        -*) die "unknown option '$1' (see --help)" ;;
        *) [ -z "$workload" ] || die "one workload at a time ('$workload', then '$1')"; workload=$1 ;;
    esac
    shift
done
case $workload in
    stress | sqlite | compress | build | web | iperf) ;;
    "") die "which workload? stress, sqlite, compress, build, web or iperf (see --help)" ;;
    *) die "unknown workload '$workload': stress, sqlite, compress, build, web or iperf" ;;
esac
case $seconds in '' | *[!0-9]* | 0) die "--seconds takes a whole number of seconds above 0, not '$seconds'" ;; esac
case $net in user | tap) ;; *) die "--net takes user or tap, not '$net'" ;; esac
case $connections in '' | *[!0-9]* | 0) die "--connections takes a whole number above 0, not '$connections'" ;; esac
if [ -n "$rate" ]; then
    case $rate in *[!0-9]* | 0) die "--rate takes a whole number of requests a second above 0, not '$rate'" ;; esac
    [ "$workload" = web ] || die "--rate is the web workload's open-loop load, not $workload's"
    # The bed's L1 has no Python to run openloop.py.
    [ "$nested" = 0 ] || die "--rate cannot run in the nested bed (its L1 has no Python for openloop.py)"
fi
[ "$record$nested" = 01 ] && die "--no-record runs on this host, not in the nested bed"
side=guest
[ "$native" = 1 ] && side=native
[ "$nested" = 1 ] && side=nested
[ "$native$nested" = 11 ] && side=nested-native
out=${out:-wg-$workload-$side.vprec}
[ -x "$virtprof" ] || die "no virtprof binary at $virtprof (cargo build, or set VIRTPROF)"
[ "$(id -u)" = 0 ] || die "needs root (virtprof record traces the host; --native uses chroot and mount namespaces)"
if [ "$native" = 0 ]; then
    command -v qemu-system-x86_64 > /dev/null || die "needs qemu-system-x86_64 (apt-get install qemu-system-x86)"
fi
# Built (or brought up to date) here unless WG_DIR names one made elsewhere.
if [ -z "${WG_DIR:-}" ]; then
    bash "$here/build.sh" "$wg" > /dev/null
elif [ ! -s "$wg/initrd.gz" ] || [ ! -d "$wg/root" ]; then
    die "no workload guest in $wg (build it: scripts/workload-guest/build.sh $wg)"
fi

if [ "$nested" = 1 ]; then
    # This script again, inside L1: the guest and this root read from the host's (shared
    # read-only at /host), the recording written to the bed's /out, a folder of this run's
    # own (the bed empties /out before running a broken attempt again: never the caller's
    # folder), moved to -o when done. L1 keeps the TSC as its clocksource so that KVM pairs
    # clocks for the guest's ptp_kvm.
    mkdir -p "$(dirname "$out")"
    job=$(mktemp "${TMPDIR:-/tmp}/wg-job.XXXXXX")
    bed_out=$(mktemp -d "$(dirname "$out")/.wg-bed-out.XXXXXX")
    more=
    [ -n "$record_args" ] && more="--record '$record_args'"
    [ "$native" = 1 ] && more="$more --native"
    [ "$workload" = web ] && more="$more --connections $connections"
    trap 'rm -rf "$job" "$bed_out"' EXIT
    cat > "$job" <<EOF
export WG_DIR=/host$(realpath "$wg") VIRTPROF=/usr/bin/virtprof TMPDIR=/tmp
hang-guard $((seconds + 600)) sh /host$here/run.sh --memory 768M --net $net --seconds $seconds --interval $interval \
    $more -o /out/$(basename "$out") $workload
EOF
    status=0
    BED_OUT=$bed_out BED_APPEND="clocksource=tsc tsc=reliable" VIRTPROF=$virtprof \
        bash "$root/scripts/nested-svm/bed.sh" run -t $((seconds + 900)) "$job" || status=$?
    [ -e "$bed_out/$(basename "$out")" ] && mv "$bed_out/$(basename "$out")" "$out"
    exit $status
fi

run=$(mktemp -d "${TMPDIR:-/tmp}/wg-run.XXXXXX")
chmod 700 "$run"
mkdir "$run/data"  # /data of the root on this side
pids= recording=
# However the run ends (done, failed, interrupted): its processes stopped, its folder gone.
# A recording under way is stopped first, as its own Ctrl-C would (it keeps what it has).
cleanup() {
    if [ -n "$recording" ]; then
        kill -TERM "$recording" 2>/dev/null || true
        wait "$recording" 2>/dev/null || true
    fi
    for p in $pids; do kill "$p" 2>/dev/null || true; done
    for p in $pids; do wait "$p" 2>/dev/null || true; done
    [ -n "${KEEP_RUN:-}" ] && echo "run.sh: kept $run" >&2 || rm -rf "$run"
}
trap cleanup EXIT
trap 'echo "run.sh: interrupted" >&2; exit 130' INT TERM HUP

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null ||
        echo "$1"
}

web_port=$(free_port 18080) iperf_port=$(free_port 15201)
token=$run/token
umask 077
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$token"

if [ "$native" = 0 ]; then
    # --- in the guest ---
    if [ -z "$accel" ]; then
        accel=tcg
        grep -qwE 'vmx|svm' /proc/cpuinfo && [ -w /dev/kvm ] && accel=kvm
    fi
    cpu=max
    [ "$accel" = kvm ] && cpu=host
    cp --sparse=always "$wg/disk.img" "$run/disk.img" 2>/dev/null || cp "$wg/disk.img" "$run/disk.img"
    mkfifo "$run/con.in" "$run/con.out"
    if [ -c /dev/vhost-vsock ]; then
        cid=$(( $$ % 60000 + 3 ))
        link="-device vhost-vsock-pci,guest-cid=$cid" listen=vsock:9478 agent=vsock:$cid:9478
    else
        link="-device virtio-serial-pci -chardev socket,id=vp,path=$run/agent.sock,server=on,wait=off
              -device virtserialport,chardev=vp,name=virtprof"
        listen=serial:virtprof agent=serial:$run/agent.sock
    fi
    if [ "$net" = tap ]; then
        # A tap device QEMU makes and removes, on a /24 of its own: this side .1, the guest .2;
        # vhost-net moves its packets in the kernel where the host has it.
        [ -c /dev/net/tun ] || die "--net tap needs /dev/net/tun (modprobe tun)"
        tap=wg$$ subnet=10.$(($$ % 200 + 20)).0 vhost=off
        [ -c /dev/vhost-net ] && vhost=on
        netdev="tap,id=n0,ifname=$tap,script=no,downscript=no,vhost=$vhost"
        ip_config=wg.ip=$subnet.2/24,$subnet.1 server=$subnet.2 web_target=8080 iperf_target=5201
    else
        netdev="user,id=n0,hostfwd=tcp:127.0.0.1:$web_port-:8080,hostfwd=tcp:127.0.0.1:$iperf_port-:5201"
        ip_config= server=127.0.0.1 web_target=$web_port iperf_target=$iperf_port
    fi
    # Held open read-write (which never blocks on a FIFO): QEMU never sees its input end.
    exec 8<> "$run/con.in"
    : > "$run/console.log"
    # A guest that ends while booting is booted again, twice at most, and said: under emulated
    # SVM (the nested bed) about one L2 boot in three resets midway for no reason of its own.
    attempt=1
    while :; do
        # shellcheck disable=SC2086 # $link is words
        qemu-system-x86_64 -accel "$accel" -cpu "$cpu" -smp 2 -m "$memory" -nographic -no-reboot -nodefaults \
            -name "wg-$workload,debug-threads=on" -serial "pipe:$run/con" \
            -kernel "$wg/vmlinuz" -initrd "$wg/initrd.gz" \
            -append "console=ttyS0 quiet wg.agent=$listen wg.interval=$interval $ip_config" \
            -object iothread,id=io0 -drive "file=$run/disk.img,format=raw,if=none,id=data" \
            -device virtio-blk-pci,drive=data,iothread=io0 \
            -netdev "$netdev" -device virtio-net-pci,netdev=n0 $link >> "$run/qemu.log" 2>&1 &
        qemu=$!
        pids="$pids $qemu"
        [ "$net" != tap ] || tap_up || echo "run.sh: could not set up $tap on this side" >&2
        cat "$run/con.out" >> "$run/console.log" &
        pids="$pids $!"
        await WG-READY 0 300 && break
        if ! kill -0 "$qemu" 2>/dev/null && [ "$attempt" -lt 3 ]; then
            attempt=$((attempt + 1))
            echo "run.sh: the guest ended while booting; booting it again (attempt $attempt of 3)" >&2
            continue
        fi
        # In the nested-SVM bed an L2 that hangs while booting (seen: stuck unpacking its
        # initramfs) is the emulator's too: the bed runs the job again.
        command -v hang-guard > /dev/null && [ -d /bed ] && hang-guard --broken "the workload guest (L2) did not boot"
        exit 1
    done
    grep -a WG-WARN "$run/console.log" >&2 || true
    echo "run.sh: $(grep -a WG-READY "$run/console.log" | sed 's/.*WG-READY/guest ready:/' | tr -d '\r') ($accel)" >&2
    [ "$net" = tap ] && echo "run.sh: network: tap $tap, guest $server, vhost-net $vhost" >&2
    case $workload in
        # Seen once under load: a start that said rc≠0. A second try after a stop (which ends
        # a server half started) costs seconds; a guest that fails twice is said.
        web | iperf)
            tell "start $workload" "$workload" 60 ||
                { echo "run.sh: starting $workload again" >&2; tell "stop $workload" "$workload" 60 || true
                  tell "start $workload" "$workload" 60; } || die "the guest could not start $workload" ;;
    esac
    if [ -n "${WG_PLACE:-}" ]; then
        # shellcheck disable=SC2086 # a command and its words
        $WG_PLACE "$qemu" || die "WG_PLACE ($WG_PLACE $qemu) failed"
    fi
else
    # --- natively: the guest's root with this host's kernel ---
    server=127.0.0.1 web_target=$web_port iperf_target=$iperf_port
    cp -a "$wg/data/." "$run/data/"
    sed "s/^server.port = .*/server.port = $web_port/; s/^server.bind = .*/server.bind = \"127.0.0.1\"/" \
        "$wg/root/bed/lighttpd.conf" > "$run/data/lighttpd.conf"
    if [ "$record" = 1 ]; then
        agent=tcp:127.0.0.1:$(free_port 19478)
        "$virtprof" agent --listen "$agent" --token-file "$token" --interval "$interval" --sessions 1 \
            2> "$run/agent.log" &
        pids="$!"
    fi
    case $workload in
        web) in_root lighttpd -D -f /data/lighttpd.conf > "$run/server.log" 2>&1 & pids="$pids $!" ;;
        iperf) in_root iperf3 -s -p "$iperf_port" > "$run/server.log" 2>&1 & pids="$pids $!" ;;
    esac
    # The server listening (slow to start in an emulated L1), or 60 s passed.
    case $workload in web) port=$web_port ;; iperf) port=$iperf_port ;; *) port= ;; esac
    if [ -n "$port" ]; then
        hex=$(printf '%04X' "$port") waited=0
        until cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | grep -Eq ":$hex 0+:0000 0A"; do
            [ "$waited" -ge 600 ] && { cat "$run/server.log" >&2; die "the $workload server is not listening on $port after 60s"; }
            sleep 0.1
            waited=$((waited + 1))
        done
    fi
    sleep 1
fi

# The load: run by `virtprof record` as its command, so the recording spans it exactly.
threads=2
[ "$connections" -lt 2 ] && threads=1
pin=
[ -n "${WG_LOAD_CPUS:-}" ] && pin="taskset -c $WG_LOAD_CPUS"
case $workload in
    # A stuck guest must not hold the load generator (iperf3 waits on a silent peer for ever).
    web)
        if [ -n "$rate" ]; then
            load="timeout -k 5 $((seconds + 60)) $pin python3 $here/openloop.py --rate $rate --seconds $seconds http://$server:$web_target/index.html"
        else
            load="timeout -k 5 $((seconds + 60)) $pin sh $0 --_root $wg $run wrk -t $threads -c $connections -d ${seconds}s http://$server:$web_target/index.html"
        fi
        ;;
    iperf) load="timeout -k 5 $((seconds + 60)) sh $0 --_root $wg $run iperf3 -c $server -p $iperf_target -t $seconds -J" ;;
    *)
        if [ "$native" = 1 ]; then
            load="sh $0 --_root $wg $run sh /bed/workloads.sh run $workload $seconds"
        else
            load="sh $0 --_guest $run $qemu $workload $seconds"
        fi
        ;;
esac
status=0
# In the background: a signal to this script runs its trap at once (sh defers traps until a
# foreground command ends).
if [ "$record" = 1 ]; then
    echo "run.sh: recording $workload ($side, ${seconds}s) into $out" >&2
    # shellcheck disable=SC2086 # $record_args and $load are words
    "$virtprof" record --interval "$interval" --agent "$agent" --agent-token-file "$token" $record_args \
        -o "$out" -- $load > "$run/load.out" &
else
    echo "run.sh: running $workload ($side, ${seconds}s), not recorded" >&2
    # shellcheck disable=SC2086 # $load is words
    $load > "$run/load.out" &
fi
recording=$!
wait "$recording" || status=$?
recording=
if [ "$native" = 0 ] && { [ "$status" = 124 ] || ! kill -0 "$qemu" 2>/dev/null; }; then
    if [ "$status" = 124 ]; then
        echo "run.sh: the load did not end within $((seconds + 60))s: the guest stopped answering; its console:" >&2
    else
        echo "run.sh: the guest ended during the run; its console:" >&2
    fi
    tail -20 "$run/console.log" >&2
    # Under emulated SVM an L2 now and then resets or stalls midway for no reason of its own
    # (seen in CI: iperf3's connection reset 1 s in, QEMU gone): the bed runs the job again.
    command -v hang-guard > /dev/null && [ -d /bed ] && hang-guard --broken "the workload guest (L2) died or stalled during the run"
    [ "$status" = 0 ] && status=1
fi
grep -av WG-RESULT "$run/load.out" >&2 || true
case $workload$rate in
    # openloop.py prints its own result line (web with a --rate).
    web[0-9]*) grep -a WG-RESULT "$run/load.out" || true ;;
    web)
        # wrk: "Latency 805.21us ..." (us, ms or s) and "N requests in S, ...".
        awk '/^ *Latency/ { v = $2; k = 1; if (v ~ /ms$/) k = 1000; else if (v ~ /us$/) k = 1; else if (v ~ /s$/) k = 1e6
                gsub(/[a-z]/, "", v); lat = v * k }
            /requests in/ { n = $1; s = $4 }
            END { if (n) printf "WG-RESULT name=web seconds=%.2f ops=%d unit=requests latency_avg_us=%.1f\n", s, n, lat }' \
            "$run/load.out"
        ;;
    iperf)
        # iperf3 -J: the first "seconds" and "bytes" of its "sum_received" object (no python
        # in the bed's L1).
        awk '/"sum_received"/ { on = 1 } on && /"seconds"/ { gsub(/[^0-9.]/, "", $2); s = $2 }
            on && /"bytes"/ { gsub(/[^0-9]/, "", $2); printf "WG-RESULT name=iperf seconds=%.2f ops=%s unit=bytes\n", s, $2; exit }' \
            "$run/load.out"
        ;;
    *) grep -a WG-RESULT "$run/load.out" || true ;;
esac > "$run/result"
cat "$run/result"
if [ ! -s "$run/result" ]; then
    echo "run.sh: $workload gave no result (its output is above)" >&2
    [ "$status" = 0 ] && status=1
fi
if [ "$native" = 0 ]; then
    case $workload in web | iperf) tell "stop $workload" "$workload" 60 || true ;; esac
    echo poweroff > "$run/con.in"
    waited=0
    while kill -0 "$qemu" 2>/dev/null && [ $waited -lt 300 ]; do sleep 0.1; waited=$((waited + 1)); done
fi
exit "$status"
