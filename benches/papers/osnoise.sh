#!/bin/sh
# osnoise for VMs (seed 004), Tables 1-2, Fig. 17, Figs. 22-24 on a real kvm_amd host: the
# nested-SVM bed's L1 runs a real Linux guest (Debian's kernel, L2 under QEMU-KVM, 2 CPUs,
# ptp_kvm and vsock) whose `virtprof` measures from inside while L1's `virtprof record` traces.
#
#   probes       one L2 boot. Table 2: `noise --probe cpuid` and `--probe inb:0x3fd` on L2's
#                CPU 1 (each step between two clock reads one exit) with L1 not tracing, then
#                again while L1 records. Table 1: `agent --noise 1 --noise-probe ...` while L1
#                records it: the exits timed from inside, beside L1's kvm_exit->kvm_entry.
#   untuned/...  Figs. 17, 22-24: the plain noise loop (`agent --noise 1`) on L2's CPU 1 while
#                L1 records, in five setups: no tuning; guest isolation (L2 isolcpus=1); host
#                isolation (L1 isolcpus=1, L2's CPU 1 thread alone on L1's CPU 1, its other
#                threads on CPU 0); both; and both with L1 and L2 also nohz_full=1
#                rcu_nocbs=1 (Fig. 23's explanation tested: does the hypervisor noise left
#                after isolation go with the tick and RCU's callbacks moved off the CPU?).
#   l1-...       Figs. 15/16: the same loop run natively in L1 on its CPU 1 (`virtprof noise`,
#                the host's own noise) in the two isolated L1s, beside what L2's loop has left
#                when L1's account of its vCPU is taken out.
#
#   sh benches/papers/osnoise.sh [OUT]      (default target/papers/osnoise)
#
# One L1 boot per job, so a broken emulated L1 costs one job; run again into the same OUT, it
# keeps the jobs it has and does the rest. VIRTPROF: the binary (default target/release/virtprof,
# built when missing). SECONDS_TRACED (default 10): how long L1 records each noise setup;
# RUNS (default 5): runs of each setup.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=$(realpath -m "${1:-$root/target/papers/osnoise}")
traced=${SECONDS_TRACED:-10} runs=${RUNS:-5}
study=osnoise.sh
mkdir -p "$out"
. "$here/common.sh"
study_binary
accel=kvm accel_why="the nested-SVM bed: L2 under kvm_amd in an L1 that QEMU TCG emulates; timings are emulation's"
# The probes' L1 boot, then per run three L1 boots holding five L2 boots (the setups): 50 s
# for each L2 boot with its L1's share on the 2-CPU development host.
study_plan $((1 + 5 * runs)) 0 50
study_inputs bed
study_manifest SECONDS_TRACED="$traced" RUNS="$runs"

# L2's initramfs: virtprof, busybox and the job script below, with the vsock and PTP modules.
l2job=$(mktemp "${TMPDIR:-/tmp}/osnoise-l2.XXXXXX")
initrd=$out/.l2.cpio
trap 'rm -f "$l2job" "$initrd"' EXIT
cat > "$l2job" <<'L2'
#!/tmp/busybox sh
# In L2: what the kernel command line's l2_mode= asks for. Each JSON document sits between
# L2-JSON-BEGIN NAME and L2-JSON-END NAME; L2-PHASE lines tell L1 what comes next.
b=/tmp/busybox
mode=$($b sed -n 's/.*l2_mode=\([a-z]*\).*/\1/p' /proc/cmdline)
json() {
    name=$1
    shift
    echo "L2-JSON-BEGIN $name"
    /virtprof "$@"
    echo "L2-JSON-END $name"
}
agent() {
    echo "L2-PHASE agent-$1"
    shift
    /virtprof agent --listen vsock:9478 --sessions 1 --interval 100ms --noise 1 "$@" > /dev/null
}
probe_loop() {
    json "$1-$2" noise --probe "$2" --no-trace --cpus 1 --duration 3s --period 1s --threshold 1us --json
}
case $mode in
probes)
    for p in cpuid inb:0x3fd; do probe_loop untraced "$p"; done
    agent cpuid --noise-probe cpuid --noise-period 500ms --noise-runtime 50ms --noise-threshold 1us
    agent inb --noise-probe inb:0x3fd --noise-period 500ms --noise-runtime 50ms --noise-threshold 1us
    echo "L2-PHASE traced"
    # L1 starts recording when it reads the line above; its start-up is given time.
    $b sleep 15
    for p in cpuid inb:0x3fd; do probe_loop traced "$p"; done
    ;;
noise)
    agent noise --noise-period 1s --noise-runtime 900ms --noise-threshold 5us
    ;;
esac
echo "L2-PHASE done"
L2
FILES="/bin/busybox:tmp/busybox $l2job:tmp/l2job.sh" MODULES="virtio_pci vmw_vsock_virtio_transport ptp_kvm" \
    bash "$root/scripts/debian-kernel/guest-initrd.sh" "$virtprof" "$initrd" 2> /dev/null

# In L1, for each L2 boot: boot it, follow its console, record what each phase needs.
l1_helpers='
wait_line() { # FILE PATTERN [COUNT]: until PATTERN shows COUNT times (L2 gone: give up)
    for i in $(seq 600); do
        [ "$(grep -c "$2" "$1")" -ge "${3:-1}" ] && return 0
        kill -0 "$l2" 2> /dev/null || return 1
        sleep 1
    done
    return 1
}
boot_l2() { # NAME MODE GUEST_APPEND HOST_ISOLATED
    console=/out/$1.console
    qemu-system-x86_64 -enable-kvm -cpu host -m 512M -smp 2 -nographic -no-reboot -nodefaults \
        -serial stdio -net none -name l2guest,debug-threads=on -device vhost-vsock-pci,guest-cid=3 \
        -kernel /bed/l2/vmlinuz -initrd /host'"$initrd"' \
        -append "console=ttyS0 panic=-1 quiet l2_mode=$2 $3 -- /tmp/busybox sh /tmp/l2job.sh" > "$console" 2>&1 &
    l2=$!
    for i in $(seq 60); do grep -q "^CPU 1/KVM$" /proc/$l2/task/*/comm 2> /dev/null && break; sleep 1; done
    vcpu1=$(grep -l "^CPU 1/KVM$" /proc/$l2/task/*/comm | cut -d/ -f5)
    echo "$vcpu1" > /out/$1.vcpu1.tid
    if [ "$4" = yes ]; then
        # Host isolation: every QEMU thread on CPU 0, the one running L2 CPU 1 alone on CPU 1.
        for t in /proc/$l2/task/*; do taskset -p 1 "${t##*/}" > /dev/null; done
        taskset -p 2 "$vcpu1" > /dev/null
    fi
}
record_phase() { # NAME PHASE [LISTENING_COUNT]: record the agent of that phase
    wait_line "$console" "L2-PHASE $2" || hang-guard --broken "L2 never reached $2"
    wait_line "$console" "listening on" "${3:-1}" || hang-guard --broken "L2 agent of $2 did not start"
    hang-guard 300 virtprof record -o /out/$1.vprec -d '"$traced"'s --agent vsock:3:9478 --agent-wait 120s \
        2> /out/$1.record.log
}
l1_noise() { # NAME: the noise loop natively in L1 on CPU 1, as L2 runs it (the noise of L1 itself)
    hang-guard 120 virtprof noise --cpus 1 --duration '"$traced"'s --period 1s --runtime 900ms --threshold 5us --json \
        > /out/$1.noise.json 2> /out/$1.noise.err || echo "L1 noise loop $1 failed: see $1.noise.err"
}
end_l2() {
    wait_line "$console" "L2-PHASE done" || true
    for i in $(seq 60); do kill -0 $l2 2> /dev/null || break; sleep 1; done
    kill $l2 2> /dev/null || true
    wait || true
}
'

# One L1 boot: $1 job name, $2 L1's extra command line, $3 the job's own lines.
job= study_bed_out=
trap 'rm -f "$l2job" "$initrd" "$job"; rm -rf "$study_bed_out"' EXIT
run_job() {
    [ -s "$out/$1.done" ] && return 0
    job=$(mktemp "${TMPDIR:-/tmp}/osnoise-job.XXXXXX")
    { echo "set -e"; echo "$l1_helpers"; echo "$3"; echo "date > /out/$1.done"; } > "$job"
    echo "osnoise.sh: $1: L1 boot (append '$2')" >&2
    study_bed_job "$1" "$root/scripts/nested-svm/bed.sh" 2400 "$job" BED_APPEND="clocksource=tsc tsc=reliable $2"
    rm -f "$job"
}

run_job probes "" '
boot_l2 probes probes "" no
record_phase agent-cpuid agent-cpuid 1
record_phase agent-inb agent-inb 2
wait_line "$console" "L2-PHASE traced" || hang-guard --broken "L2 never reached its traced probes"
hang-guard 300 virtprof record -o /out/probes-traced.vprec -d 40s 2> /out/probes-traced.record.log
end_l2
'
# The five noise setups, RUNS times each (one L1 boot per run and host tuning), and L1's own noise.
i=1
while [ "$i" -le "$runs" ]; do
    run_job "host-untuned-$i" "" "
boot_l2 untuned-$i noise '' no
record_phase untuned-$i agent-noise
end_l2
boot_l2 guest-isolated-$i noise isolcpus=1 no
record_phase guest-isolated-$i agent-noise
end_l2
"
    run_job "host-isolated-$i" "isolcpus=1" "
l1_noise l1-isolated-$i
boot_l2 host-isolated-$i noise '' yes
record_phase host-isolated-$i agent-noise
end_l2
boot_l2 both-isolated-$i noise isolcpus=1 yes
record_phase both-isolated-$i agent-noise
end_l2
"
    run_job "host-nohz-$i" "isolcpus=1 nohz_full=1 rcu_nocbs=1" "
l1_noise l1-nohz-$i
boot_l2 nohz-isolated-$i noise 'isolcpus=1 nohz_full=1 rcu_nocbs=1' yes
record_phase nohz-isolated-$i agent-noise
end_l2
"
    i=$((i + 1))
done

# What virtprof makes of each recording.
for rec in "$out"/*.vprec; do
    [ -e "$rec" ] || continue
    base=${rec%.vprec}
    [ -s "$base.exits.json" ] && [ "$base.exits.json" -nt "$rec" ] && continue
    "$virtprof" exits --json --vcpu 1 "$rec" > "$base.exits.json" 2> "$base.exits.err" || rm -f "$base.exits.json"
    case $(basename "$base") in
    probes-traced) ;;
    *) "$virtprof" noise --host-recording "$rec" --json > "$base.noise.json" 2> "$base.noise.err" || rm -f "$base.noise.json" ;;
    esac
done

echo "## osnoise for VMs (seed 004) on kvm_amd (nested-SVM bed), $(date -u +%Y-%m-%d)"
echo
python3 "$here/osnoise_table.py" "$out" "$runs"
study_pack
