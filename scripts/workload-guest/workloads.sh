#!/bin/sh
# The workloads, the same in the guest (its init runs them) and natively (run.sh runs them in
# `chroot` of the guest's root): the same programs, libraries and data either way.
#
#   workloads.sh run NAME SECONDS    stress | sqlite | compress | build, for SECONDS
#   workloads.sh start NAME          web (lighttpd on :8080) | iperf (iperf3 -s on :5201)
#   workloads.sh stop NAME
#
# Each run prints one line `WG-RESULT name=NAME seconds=S ops=N unit=U` (what it did, measured
# by the workload itself, more NAME=VALUE pairs after it), the ground truth a recording is
# checked against. Data: /data.
set -u
now() { cut -d' ' -f1 /proc/uptime; }
result() { echo "WG-RESULT name=$1 seconds=$(echo "$(now) $2" | awk '{printf "%.2f", $1 - $2}') ops=$3 unit=$4"; }

run() {
    name=$1 seconds=$2 began=$(now) ops=0
    end=$(echo "$began $seconds" | awk '{print $1 + $2}')
    before() { awk -v t="$(now)" -v e="$end" 'BEGIN { exit !(t < e) }'; }
    case $name in
        stress)
            # CPU, memory and file I/O at once; stress-ng counts its own bogo operations.
            stress-ng --cpu 1 --vm 1 --vm-bytes 64M --hdd 1 --hdd-bytes 8M --temp-path /data \
                --timeout "${seconds}s" --metrics-brief 2> /tmp/stress.log
            rc=$?
            # Lines "stress-ng: metrc: [PID] STRESSOR BOGO-OPS ...": one figure per stressor.
            ops() { awk -v s="$1" '$4 == s && $5 ~ /^[0-9]+$/ { print $5; exit }' /tmp/stress.log; }
            result stress "$began" "$(ops cpu)" "cpu-bogo-ops vm-bogo-ops=$(ops vm) hdd-bogo-ops=$(ops hdd)"
            return $rc
            ;;
        sqlite)
            # Transactions of 1000 inserts, each followed by an indexed query.
            rm -f /data/bench.db
            sqlite3 /data/bench.db "CREATE TABLE t(id INTEGER PRIMARY KEY, k INTEGER, v TEXT); CREATE INDEX tk ON t(k);"
            while before; do
                sqlite3 /data/bench.db "BEGIN; WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000)
                    INSERT INTO t(k, v) SELECT abs(random()) % 10000, hex(randomblob(32)) FROM n; COMMIT;
                    SELECT count(*) FROM t WHERE k < 100;" > /dev/null || return 1
                ops=$((ops + 1000))
            done
            rows=$(sqlite3 /data/bench.db "SELECT count(*) FROM t")
            [ "$rows" = "$ops" ] || { echo "WG-ERROR sqlite: $rows rows, $ops inserted" >&2; return 1; }
            result sqlite "$began" "$ops" rows
            ;;
        compress)
            # 2 MiB of text through zstd and xz, round after round. By path: busybox's shell
            # runs its own xz applet before looking at PATH.
            while before; do
                /usr/bin/zstd -q -3 -c /data/input.txt > /data/input.zst &&
                    /usr/bin/xz -1 -c /data/input.txt > /data/input.xz || return 1
                ops=$((ops + 1))
            done
            /usr/bin/zstd -q -d -c /data/input.zst | cmp -s - /data/input.txt || { echo "WG-ERROR zstd round trip" >&2; return 1; }
            result compress "$began" "$ops" rounds
            ;;
        build)
            # tcc compiles the 8 files of /data/src and links them, build after build.
            mkdir -p /data/obj
            while before; do
                for c in /data/src/*.c; do
                    tcc -c "$c" -o "/data/obj/$(basename "$c" .c).o" || return 1
                done
                tcc -shared -o /data/obj/libunits.so /data/obj/*.o || return 1
                ops=$((ops + 1))
            done
            result build "$began" "$ops" builds
            ;;
        *)
            echo "WG-ERROR unknown workload '$name' (stress, sqlite, compress, build; web and iperf are started)" >&2
            return 2
            ;;
    esac
}

case ${1:-} in
    run) run "${2:?workload}" "${3:-10}" ;;
    start)
        case ${2:-} in
            web) lighttpd -f /bed/lighttpd.conf ;;
            iperf) iperf3 -s -D -p 5201 --logfile /tmp/iperf.log ;;
            *) echo "WG-ERROR no server '${2:-}' (web, iperf)" >&2; exit 2 ;;
        esac
        ;;
    stop)
        case ${2:-} in
            web) killall lighttpd ;;
            iperf) killall iperf3 ;;
            *) exit 2 ;;
        esac
        ;;
    *) sed -n '2,/^set/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
esac
