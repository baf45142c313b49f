// SPDX-License-Identifier: MIT OR GPL-2.0
//
// virtprof's in-kernel aggregation for the live views: per vCPU thread, KVM exits by reason and
// run/wait/blocked time, kept in maps that user space reads a few hundred entries of per
// refresh instead of decoding every event. What is counted, and how, is what the user-space
// analysis (`analysis::sched::SchedAccounting`) does with the same tracepoints:
//   exits, per (thread, kind, reason):
//     kind 1: kvm_exit           (reason = exit_reason, isa = isa; on arm64, as the decoder
//                                 keys them: a trap by its exception class, anything else by
//                                 ARM64_NOT_A_TRAP | ret, isa = ISA_ARM64)
//     kind 2: kvm_userspace_exit (reason = the KVM_EXIT_* reason)
//     kind 3: evidence events    (reason = the event's id: kvm_cpuid, kvm_msr, ...)
//   durations, per (kind, reason): a log-linear histogram (as `analysis::hist`) of each exit
//     from kvm_exit to kvm_entry, or of each userspace round trip from kvm_userspace_exit to
//     the VMM's return (kvm_fpu load, or kvm_entry) where no kvm_exit fires, as
//     `analysis::exits::ExitAnalyzer` times them (only when the loader attaches those events);
//   threads, per thread: the state machine over sched_switch, sched_wakeup(_new),
//     sched_migrate_task and the thread's own kvm events (a thread that emits one is running:
//     some kernels resume a thread from idle without sched_switch), with time per state.
// Threads are tracked from their first kvm event, or when user space adds them (a vCPU thread
// found in /proc). Field offsets and sizes come from the running kernel's format files, set by
// the loader as read-only globals: no kernel headers, no CO-RE.
//
// Built by scripts/bpf/build.sh with Debian's clang 14; the object is committed beside this
// file and a test rebuilds it and compares.

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "Dual MIT/GPL";

// Every program returns 1: on a tracepoint, 0 would make the kernel drop the event for every
// perf event on it (perf_trace_run_bpf_submit), blinding `perf stat -e kvm:*` while we run.

struct exit_key {
	__u32 tid;
	__u32 kind;
	__u32 reason;
	__u32 isa;
};

#define KIND_EXIT 1
#define KIND_USERSPACE 2
#define KIND_EVIDENCE 3

// Thread states, as `SchedAccounting`'s.
#define UNKNOWN 0
#define RUNNING 1
#define RUNNABLE 2
#define BLOCKED 3
#define EXITED 4

// One thread's accounting. Times are CLOCK_MONOTONIC (bpf_ktime_get_ns), the clock the
// traced path records with ("mono").
struct thread {
	__u64 since;      // accounted up to here
	__u64 entered;    // when it entered its state
	__u64 queued;     // when last put on a run queue
	__u64 exec_start; // start of the current execution
	__u64 run_ns;
	__u64 wait_ns;
	__u64 blocked_ns;
	__u64 unknown_ns;
	__u64 execs;
	__u64 inferred_execs;
	__u64 preemptions;
	__u64 alloc_sum_ns;
	__u64 alloc_min_ns; // the extremes (these three) since the read `generation` numbers
	__u64 alloc_max_ns;
	__u64 wait_max_ns;
	__u64 wakeups;
	__u64 io;
	__u32 state;
	__u32 cpu;
	__u32 runs_guest; // it emitted kvm events: a vCPU thread
	__u32 generation; // of its extremes
	__u64 exit_start; // the exit in flight: when, and its key
	__u32 exit_kind;
	__u32 exit_reason;
	__u32 exit_isa;
	__u32 exit_open;
};

struct timing_key {
	__u32 kind;
	__u32 reason;
	__u32 isa;
	__u32 bucket; // ~0 for the summary
};

// Count, sum, min and max of a reason's durations (bucket ~0); counts per bucket (others).
struct timing {
	__u64 count;
	__u64 sum;
	__u64 min;
	__u64 max;
};

// Bounded: a host with more (thread, reason) pairs, or tracked threads, than these loses
// counts, and says so through `full` (never silently).
// Not per-CPU: a per-CPU map's entries are allocated for every CPU up front (65 536 of them
// would be 134 MB on a 256-CPU host). A thread's key is only ever updated from the CPU the
// thread runs on, so adding atomically is enough.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 32768);
	__type(key, struct exit_key);
	__type(value, __u64);
} exits SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct thread);
} threads SEC(".maps");

// A reason's key is updated from every CPU its exits end on: counts and sums are added
// atomically; min and max may, rarely, miss a racing update.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 32768);
	__type(key, struct timing_key);
	__type(value, struct timing);
} timings SEC(".maps");

// Who ran while a vCPU thread waited for a CPU, per vCPU thread: the first BY_SLOTS processes
// (by tgid; 0 is the idle task) that took a CPU from it, and the time the later ones took,
// summed. Bounded by the vCPUs, not by the pairs of tasks that meet: with a hundred contending
// VMs, keying by (waiter, task) filled 16384 entries in seconds. Only the waiter's own
// switch-ins write its entry, so one CPU at a time does.
#define BY_SLOTS 16

struct waits {
	__u32 by[BY_SLOTS];
	__u64 ns[BY_SLOTS]; // 0: the slot is free
	__u64 others_ns;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, __u32);
	__type(value, struct waits);
} waits_by SEC(".maps");

// Each CPU's last RUNS runs (the task and when), written by that CPU only: at a tracked
// thread's switch-in there, the runs since it was queued there are who took the CPU from it.
// A wait longer than the runs kept is charged for what they cover; the rest stays unnamed.
#define RUNS 16
struct run {
	__u32 tid;
	__u32 tgid; // its process
	__u64 start;
	__u64 end;
};

struct runs {
	__u64 since; // when the task on the CPU now started (0: before the program was attached)
	__u32 head;
	__u32 pad;
	struct run ring[RUNS];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct runs);
} cpu_runs SEC(".maps");

// Events that found a map full: index 0 exits, 1 threads, 2 timings; 3: exits that began
// before the previous one of their thread ended (not timed); 4: whether any kvm_exit fired;
// 5: waits the waits_by map had no room for.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 6);
	__type(key, __u32);
	__type(value, __u64);
} full SEC(".maps");

// Each timed exit's own clock reads, in the order they ended, for a test to set beside the
// trace's timestamps of the same exits: kept only where the loader makes the log longer than
// its one placeholder entry (it then also sizes it). `exit_log_len` counts every exit offered,
// so one past the end is a known drop.
struct exit_time {
	__u32 tid;
	__u32 kind;
	__u32 reason;
	__u32 isa;
	__u64 start;
	__u64 end;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct exit_time);
} exit_log SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} exit_log_len SEC(".maps");

volatile const __u32 exit_log_on = 0;

// Each CPU's last traced event: where a switch-in the trace missed began.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} cpu_last SEC(".maps");

// Which read of the maps the extremes are counted from: user space adds one after each read,
// and a thread's extremes start afresh at its first update after that. Extremes cannot be
// differenced between reads as sums can.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} generation SEC(".maps");

// Byte offsets (and sizes where they vary) of the fields read, from the format files.
volatile const __u32 exit_reason_offset = 8;
volatile const __u32 exit_isa_offset = 0;
// arm64's kvm_exit (ret, esr_ec) where these are nonzero, and the ret its print fmt calls TRAP.
volatile const __u32 exit_ret_offset = 0;
volatile const __u32 exit_esr_ec_offset = 0;
volatile const __u32 arm64_trap_code = 2;
volatile const __u32 userspace_reason_offset = 8;
volatile const __u32 switch_prev_pid_offset = 24;
volatile const __u32 switch_prev_state_offset = 32;
volatile const __u32 switch_prev_state_size = 8;
volatile const __u32 switch_next_pid_offset = 56;
volatile const __u32 wakeup_pid_offset = 24;
volatile const __u32 wakeup_target_cpu_offset = 32;
volatile const __u32 migrate_pid_offset = 12;
volatile const __u32 migrate_dest_cpu_offset = 24;
volatile const __u32 mmio_type_offset = 8;
volatile const __u32 fpu_load_offset = 8;

// As virtprof_model's ISA_ARM64 and ARM64_NOT_A_TRAP.
#define ISA_ARM64 64
#define ARM64_NOT_A_TRAP 0x80000000U

// `sched_switch` prev_state bits of an exiting task (X dead, Z zombie), and the state bits.
#define EXITING_STATES 0x30
#define STATE_BITS 0xff

static __always_inline __u32 field_u32(void *ctx, __u32 offset)
{
	__u32 value = 0;
	bpf_probe_read_kernel(&value, sizeof(value), (char *)ctx + offset);
	return value;
}

static __always_inline __u64 field_u64(void *ctx, __u32 offset, __u32 size)
{
	__u64 value = 0;
	if (size > sizeof(value))
		size = sizeof(value);
	bpf_probe_read_kernel(&value, size, (char *)ctx + offset);
	return value;
}

static __always_inline void map_full(__u32 which)
{
	__u64 *lost = bpf_map_lookup_elem(&full, &which);
	if (lost)
		*lost += 1;
}

// Index of the highest set bit of v (v > 0).
static __always_inline __u32 log2_u64(__u64 v)
{
	__u32 r = 0;
	if (v >> 32) { v >>= 32; r += 32; }
	if (v >> 16) { v >>= 16; r += 16; }
	if (v >> 8) { v >>= 8; r += 8; }
	if (v >> 4) { v >>= 4; r += 4; }
	if (v >> 2) { v >>= 2; r += 2; }
	if (v >> 1) { r += 1; }
	return r;
}

// analysis::hist's bucket: 32 linear sub-buckets per power of two.
static __always_inline __u32 bucket_of(__u64 v)
{
	if (v < 32)
		return (__u32)v;
	__u32 exp = log2_u64(v);
	__u32 sub = (__u32)(v >> (exp - 5)) & 31;
	return (exp - 5 + 1) * 32 + sub;
}

static __always_inline void add_timing(struct timing_key *key, __u64 ns, int summary)
{
	struct timing *t = bpf_map_lookup_elem(&timings, key);
	if (!t) {
		struct timing fresh = { .count = 0, .sum = 0, .min = ~0ULL, .max = 0 };
		// Another CPU may have inserted it meanwhile: then look it up again.
		if (bpf_map_update_elem(&timings, key, &fresh, BPF_NOEXIST) != 0 &&
		    !bpf_map_lookup_elem(&timings, key)) {
			map_full(2);
			return;
		}
		t = bpf_map_lookup_elem(&timings, key);
		if (!t)
			return;
	}
	__sync_fetch_and_add(&t->count, 1);
	if (summary) {
		__sync_fetch_and_add(&t->sum, ns);
		if (ns < t->min)
			t->min = ns;
		if (ns > t->max)
			t->max = ns;
	}
}

// Log thread `tid`'s exit that ends at `ts` (only where the loader turned the log on).
static __always_inline void log_exit(struct thread *t, __u32 tid, __u64 ts)
{
	__u32 zero = 0;
	__u64 *len = bpf_map_lookup_elem(&exit_log_len, &zero);
	if (!len)
		return;
	__u32 at = (__u32)__sync_fetch_and_add(len, 1);
	struct exit_time *e = bpf_map_lookup_elem(&exit_log, &at);
	if (!e)
		return;
	e->tid = tid;
	e->kind = t->exit_kind;
	e->reason = t->exit_reason;
	e->isa = t->exit_isa;
	e->start = t->exit_start;
	e->end = ts;
}

// Thread `tid`'s exit in flight ends at `ts`: its duration goes into its reason's histogram.
static __always_inline void finish_exit(struct thread *t, __u32 tid, __u64 ts)
{
	if (!t->exit_open)
		return;
	t->exit_open = 0;
	if (exit_log_on)
		log_exit(t, tid, ts);
	__u64 ns = ts > t->exit_start ? ts - t->exit_start : 0;
	struct timing_key key = { .kind = t->exit_kind, .reason = t->exit_reason, .isa = t->exit_isa, .bucket = ~0U };
	add_timing(&key, ns, 1);
	key.bucket = bucket_of(ns);
	add_timing(&key, ns, 0);
}

static __always_inline void start_exit(struct thread *t, __u64 ts, __u32 kind, __u32 reason, __u32 isa)
{
	if (t->exit_open)
		map_full(3);
	t->exit_open = 1;
	t->exit_start = ts;
	t->exit_kind = kind;
	t->exit_reason = reason;
	t->exit_isa = isa;
}

static __always_inline int exit_path(void)
{
	__u32 at = 4;
	__u64 *seen = bpf_map_lookup_elem(&full, &at);
	return seen && *seen;
}

static __always_inline void count(__u32 tid, __u32 kind, __u32 reason, __u32 isa)
{
	struct exit_key key = { .tid = tid, .kind = kind, .reason = reason, .isa = isa };
	__u64 *n = bpf_map_lookup_elem(&exits, &key);
	if (n) {
		__sync_fetch_and_add(n, 1);
		return;
	}
	__u64 one = 1;
	// Only this thread's events insert its keys: a failure means the map is full.
	if (bpf_map_update_elem(&exits, &key, &one, BPF_NOEXIST) != 0)
		map_full(0);
}

// The thread's extremes, from the current read on.
static __always_inline void extremes_since_read(struct thread *t)
{
	__u32 zero = 0;
	__u32 *now = bpf_map_lookup_elem(&generation, &zero);
	__u32 current = now ? *now : 0;
	if (t->generation != current) {
		t->generation = current;
		t->alloc_min_ns = ~0ULL;
		t->alloc_max_ns = 0;
		t->wait_max_ns = 0;
	}
}

// Add the time since `since` to the thread's current state.
static __always_inline void account(struct thread *t, __u64 ts)
{
	__u64 ns = ts > t->since ? ts - t->since : 0;
	if (ts > t->since)
		t->since = ts;
	if (ns == 0)
		return;
	switch (t->state) {
	case RUNNING: t->run_ns += ns; break;
	case RUNNABLE: t->wait_ns += ns; break;
	case BLOCKED: t->blocked_ns += ns; break;
	case UNKNOWN: t->unknown_ns += ns; break;
	default: break;
	}
}

static __always_inline void transition(struct thread *t, __u32 state, __u32 cpu, __u64 ts)
{
	account(t, ts);
	if (t->state != state)
		t->entered = ts;
	if (state == RUNNABLE)
		t->queued = ts;
	t->state = state;
	t->cpu = cpu;
}

// Unknown time turns out to have been `state` (a thread added before its first event).
static __always_inline void resolve(struct thread *t, __u32 state, __u64 ts)
{
	account(t, ts);
	__u64 ns = t->unknown_ns;
	t->unknown_ns = 0;
	switch (state) {
	case RUNNING: t->run_ns += ns; break;
	case RUNNABLE: t->wait_ns += ns; break;
	case BLOCKED: t->blocked_ns += ns; break;
	default: break;
	}
}

// Every event: a tracked thread that emits one while blocked or waiting is running; the trace
// missed its switch-in (see SchedAccounting::infer_switch_in). Then this CPU's last event is
// this one.
static __always_inline void on_event(__u32 tid, __u32 cpu, __u64 ts)
{
	__u32 zero = 0;
	__u64 *last = bpf_map_lookup_elem(&cpu_last, &zero);
	struct thread *t = bpf_map_lookup_elem(&threads, &tid);
	if (t && (t->state == BLOCKED || t->state == RUNNABLE)) {
		__u64 before = last && *last > t->since && *last <= ts ? *last : 0;
		__u64 at = before ? before : ts;
		if (t->state == RUNNABLE && t->cpu == cpu) {
			// Queued here: not before it was queued; from then if the CPU did nothing since.
			__u64 queued = t->queued > t->since ? t->queued : t->since;
			if (queued > ts)
				queued = ts;
			at = before > queued ? before : queued;
		}
		transition(t, RUNNING, cpu, at);
		t->exec_start = at;
		t->execs += 1;
		t->inferred_execs += 1;
	}
	if (last)
		*last = ts;
}

// A kvm event of thread `tid`: it runs guest code, on this CPU, now.
static __always_inline struct thread *kvm_event(__u32 tid, __u32 cpu, __u64 ts)
{
	on_event(tid, cpu, ts);
	struct thread *t = bpf_map_lookup_elem(&threads, &tid);
	if (!t) {
		struct thread fresh = {
			.since = ts, .entered = ts, .queued = ts, .exec_start = ts,
			.alloc_min_ns = ~0ULL, .state = RUNNING, .cpu = cpu, .runs_guest = 1,
		};
		if (bpf_map_update_elem(&threads, &tid, &fresh, BPF_NOEXIST) != 0)
			map_full(1);
		return bpf_map_lookup_elem(&threads, &tid);
	}
	if (t->state == UNKNOWN) {
		resolve(t, RUNNING, ts);
		transition(t, RUNNING, cpu, ts);
	}
	t->runs_guest = 1;
	return t;
}

static __always_inline __u32 current_tid(void)
{
	return (__u32)bpf_get_current_pid_tgid();
}

SEC("tracepoint/kvm/kvm_exit")
int kvm_exit(void *ctx)
{
	__u32 tid = current_tid();
	__u64 ts = bpf_ktime_get_ns();
	struct thread *t = kvm_event(tid, bpf_get_smp_processor_id(), ts);
	__u32 isa, reason;
	if (exit_ret_offset) {
		__u32 ret = field_u32(ctx, exit_ret_offset);
		reason = ret == arm64_trap_code ? field_u32(ctx, exit_esr_ec_offset) : (ARM64_NOT_A_TRAP | ret);
		isa = ISA_ARM64;
	} else {
		isa = exit_isa_offset ? field_u32(ctx, exit_isa_offset) : 0;
		reason = field_u32(ctx, exit_reason_offset);
	}
	count(tid, KIND_EXIT, reason, isa);
	__u32 at = 4;
	__u64 *seen = bpf_map_lookup_elem(&full, &at);
	if (seen)
		*seen = 1;
	if (t)
		start_exit(t, ts, KIND_EXIT, reason, isa);
	return 1;
}

// Where no kvm_exit fires (PVM), a userspace exit starts a round trip that the VMM's return
// ends; where it does, the exit in flight simply went to the VMM.
SEC("tracepoint/kvm/kvm_userspace_exit")
int kvm_userspace_exit(void *ctx)
{
	__u32 tid = current_tid();
	__u64 ts = bpf_ktime_get_ns();
	struct thread *t = kvm_event(tid, bpf_get_smp_processor_id(), ts);
	__u32 reason = field_u32(ctx, userspace_reason_offset);
	count(tid, KIND_USERSPACE, reason, 0);
	if (t && !t->exit_open && !exit_path())
		start_exit(t, ts, KIND_USERSPACE, reason, 0);
	return 1;
}

// The end of an exit (attached only when exits are timed).
SEC("tracepoint/kvm/kvm_entry")
int kvm_entry(void *ctx)
{
	__u64 ts = bpf_ktime_get_ns();
	__u32 tid = current_tid();
	struct thread *t = kvm_event(tid, bpf_get_smp_processor_id(), ts);
	if (t)
		finish_exit(t, tid, ts);
	return 1;
}

// The VMM's return to KVM reloads the guest FPU: the end of a userspace round trip.
SEC("tracepoint/kvm/kvm_fpu")
int kvm_fpu(void *ctx)
{
	__u64 ts = bpf_ktime_get_ns();
	__u32 tid = current_tid();
	struct thread *t = kvm_event(tid, bpf_get_smp_processor_id(), ts);
	if (t && field_u32(ctx, fpu_load_offset) && t->exit_open && t->exit_kind == KIND_USERSPACE)
		finish_exit(t, tid, ts);
	return 1;
}

// The evidence events, a program each: a tracepoint program cannot read its record's
// common_type (the kernel stores its pt_regs pointer over the common fields before the program
// runs), so each reports the event id the loader found in tracefs for it.
const volatile __u32 evidence_id_kvm_cpuid = 0;
const volatile __u32 evidence_id_kvm_msr = 0;
const volatile __u32 evidence_id_kvm_hypercall = 0;
const volatile __u32 evidence_id_kvm_hv_hypercall = 0;
const volatile __u32 evidence_id_kvm_cr = 0;
const volatile __u32 evidence_id_kvm_xsetbv = 0;

static __always_inline int evidence(__u32 id)
{
	__u32 tid = current_tid();
	kvm_event(tid, bpf_get_smp_processor_id(), bpf_ktime_get_ns());
	count(tid, KIND_EVIDENCE, id, 0);
	return 1;
}

#define EVIDENCE(event)                                     \
	SEC("tracepoint/kvm/" #event)                       \
	int evidence_##event(void *ctx)                     \
	{                                                   \
		return evidence(evidence_id_##event);       \
	}
EVIDENCE(kvm_cpuid)
EVIDENCE(kvm_msr)
EVIDENCE(kvm_hypercall)
EVIDENCE(kvm_hv_hypercall)
EVIDENCE(kvm_cr)
EVIDENCE(kvm_xsetbv)

SEC("tracepoint/kvm/kvm_pio")
int kvm_pio(void *ctx)
{
	struct thread *t = kvm_event(current_tid(), bpf_get_smp_processor_id(), bpf_ktime_get_ns());
	if (t)
		t->io += 1;
	return 1;
}

// A satisfied access (type != KVM_TRACE_MMIO_READ_UNSATISFIED) is I/O.
SEC("tracepoint/kvm/kvm_mmio")
int kvm_mmio(void *ctx)
{
	struct thread *t = kvm_event(current_tid(), bpf_get_smp_processor_id(), bpf_ktime_get_ns());
	if (t && field_u32(ctx, mmio_type_offset) != 0)
		t->io += 1;
	return 1;
}

// Add `ns` of a wait to process `by`, which ran meanwhile: in its slot, a free one, or others.
static __always_inline void charge(struct waits *w, __u32 by, __u64 ns)
{
	for (int i = 0; i < BY_SLOTS; i++) {
		if (w->ns[i] && w->by[i] != by)
			continue;
		// Named before it counts: a reader seeing the time sees whose it is.
		w->by[i] = by;
		__sync_fetch_and_add(&w->ns[i], ns);
		return;
	}
	__sync_fetch_and_add(&w->others_ns, ns);
}

// `prev` ran on this CPU until `ts`; `next` runs from now. Returns the CPU's runs.
static __always_inline struct runs *record_run(__u32 prev, __u64 ts)
{
	__u32 zero = 0;
	struct runs *r = bpf_map_lookup_elem(&cpu_runs, &zero);
	if (!r)
		return 0;
	if (r->since) {
		struct run *slot = &r->ring[r->head & (RUNS - 1)];
		slot->tid = prev;
		// The switch's tracepoint runs before the switch: the current task is still `prev`.
		slot->tgid = bpf_get_current_pid_tgid() >> 32;
		slot->start = r->since;
		slot->end = ts;
		r->head += 1;
	}
	r->since = ts;
	return r;
}

// `waiter`, queued on this CPU since `from`, runs at `ts`: the runs there since are who took it.
static __always_inline void charge_wait(struct runs *r, __u32 waiter, __u64 from, __u64 ts)
{
	struct waits *w = bpf_map_lookup_elem(&waits_by, &waiter);
	if (!w) {
		struct waits fresh = {};
		if (bpf_map_update_elem(&waits_by, &waiter, &fresh, BPF_NOEXIST) != 0 &&
		    !bpf_map_lookup_elem(&waits_by, &waiter)) {
			map_full(5);
			return;
		}
		w = bpf_map_lookup_elem(&waits_by, &waiter);
		if (!w)
			return;
	}
	for (int i = 0; i < RUNS; i++) {
		struct run *x = &r->ring[i];
		if (!x->start || x->end <= from || x->start >= ts)
			continue;
		__u64 start = x->start > from ? x->start : from;
		__u64 end = x->end < ts ? x->end : ts;
		if (end > start && x->tid != waiter)
			charge(w, x->tgid, end - start);
	}
}

// A switch on this CPU from `prev` (which leaves running, blocked or exited) to `next`.
#define LEAVES_RUNNABLE 0
#define LEAVES_BLOCKED 1
#define LEAVES_EXITED 2
static __always_inline void on_switch(__u32 prev, __u32 next, __u32 leaves)
{
	__u64 ts = bpf_ktime_get_ns();
	__u32 cpu = bpf_get_smp_processor_id();
	on_event(current_tid(), cpu, ts);
	struct runs *runs = record_run(prev, ts);
	struct thread *t = prev ? bpf_map_lookup_elem(&threads, &prev) : 0;
	if (t) {
		if (t->state == UNKNOWN)
			resolve(t, RUNNING, ts);
		if (t->state == UNKNOWN || t->state == RUNNING) {
			__u32 state = BLOCKED;
			if (leaves == LEAVES_EXITED) {
				state = EXITED;
			} else if (leaves == LEAVES_RUNNABLE) {
				// Preempted: the execution's length is an allocation.
				__u64 len = ts > t->exec_start ? ts - t->exec_start : 0;
				extremes_since_read(t);
				t->preemptions += 1;
				t->alloc_sum_ns += len;
				if (len < t->alloc_min_ns)
					t->alloc_min_ns = len;
				if (len > t->alloc_max_ns)
					t->alloc_max_ns = len;
				state = RUNNABLE;
			}
			transition(t, state, cpu, ts);
		}
	}
	t = next ? bpf_map_lookup_elem(&threads, &next) : 0;
	if (t) {
		if (t->state == RUNNABLE) {
			__u64 waited = ts > t->entered ? ts - t->entered : 0;
			extremes_since_read(t);
			if (waited > t->wait_max_ns)
				t->wait_max_ns = waited;
			if (runs && t->cpu == cpu && t->runs_guest)
				charge_wait(runs, next, t->queued, ts);
		}
		if (t->state == UNKNOWN)
			resolve(t, RUNNABLE, ts);
		transition(t, RUNNING, cpu, ts);
		t->exec_start = ts;
		t->execs += 1;
	}
}

// Thread `pid` was woken onto `target_cpu`.
static __always_inline void on_wakeup(__u32 pid, __u32 target_cpu)
{
	__u64 ts = bpf_ktime_get_ns();
	on_event(current_tid(), bpf_get_smp_processor_id(), ts);
	struct thread *t = bpf_map_lookup_elem(&threads, &pid);
	if (!t)
		return;
	if (t->state == UNKNOWN)
		resolve(t, BLOCKED, ts);
	else if (t->state != BLOCKED)
		return; // waking a runnable task changes nothing
	transition(t, RUNNABLE, target_cpu, ts);
	t->wakeups += 1;
}

// Thread `pid` was moved to `dest_cpu`.
static __always_inline void on_migrate(__u32 pid, __u32 dest_cpu)
{
	__u64 ts = bpf_ktime_get_ns();
	on_event(current_tid(), bpf_get_smp_processor_id(), ts);
	struct thread *t = bpf_map_lookup_elem(&threads, &pid);
	if (t && t->state != RUNNING)
		transition(t, t->state, dest_cpu, ts);
}

// The sched events as tracepoint programs, reading the formatted record: every kernel.
SEC("tracepoint/sched/sched_switch")
int sched_switch(void *ctx)
{
	__u64 prev_state = field_u64(ctx, switch_prev_state_offset, switch_prev_state_size);
	__u32 leaves = LEAVES_BLOCKED;
	if (prev_state & EXITING_STATES)
		leaves = LEAVES_EXITED;
	else if ((prev_state & STATE_BITS) == 0)
		leaves = LEAVES_RUNNABLE;
	on_switch(field_u32(ctx, switch_prev_pid_offset), field_u32(ctx, switch_next_pid_offset), leaves);
	return 1;
}

// sched_wakeup and sched_wakeup_new.
SEC("tracepoint/sched/wakeup")
int sched_wakeup(void *ctx)
{
	on_wakeup(field_u32(ctx, wakeup_pid_offset), field_u32(ctx, wakeup_target_cpu_offset));
	return 1;
}

SEC("tracepoint/sched/sched_migrate_task")
int sched_migrate_task(void *ctx)
{
	on_migrate(field_u32(ctx, migrate_pid_offset), field_u32(ctx, migrate_dest_cpu_offset));
	return 1;
}

// The same as raw tracepoint programs, reading the tracepoint's arguments, where the kernel has
// BTF to place the task fields (the loader uses them only then). Why: the kernel does not run
// a tracepoint program while its CPU is inside a BPF map syscall or another such program
// (one per-CPU guard for all of them), so a reader of the maps, or an interrupt during a kvm
// event's program, made it skip wakeups (counted; 2-18 in 2 s on a loaded CPU read every
// millisecond); a raw tracepoint program is only kept from running inside itself.
struct task_struct {
	int pid;
	int exit_state;
	int wake_cpu; // where it is being woken: set with task_cpu() when placed (what the
	              // event reports as target_cpu; a NUMA swap of a sleeping task may set it alone)
} __attribute__((preserve_access_index));

static __always_inline __u32 task_field(const int *field)
{
	int value = 0;
	bpf_probe_read_kernel(&value, sizeof(value), field);
	return (__u32)value;
}

// TP_PROTO(bool preempt, struct task_struct *prev, struct task_struct *next,
//          unsigned int prev_state): the fourth argument since Linux 5.18; where it is missing
// the kernel refuses to attach this program, and the loader takes the one above.
SEC("raw_tracepoint/sched_switch")
int raw_sched_switch(struct bpf_raw_tracepoint_args *ctx)
{
	struct task_struct *prev = (struct task_struct *)ctx->args[1];
	struct task_struct *next = (struct task_struct *)ctx->args[2];
	// As the event's prev_state: preempted tasks are runnable whatever their state; an
	// exiting one shows its exit state (X, Z); no reportable state bit is still runnable.
	__u32 state = ((__u32)ctx->args[3] | task_field(&prev->exit_state)) & 0x7f;
	__u32 leaves = LEAVES_BLOCKED;
	if (ctx->args[0] & 1)
		leaves = LEAVES_RUNNABLE;
	else if (state & EXITING_STATES)
		leaves = LEAVES_EXITED;
	else if (state == 0)
		leaves = LEAVES_RUNNABLE;
	on_switch(task_field(&prev->pid), task_field(&next->pid), leaves);
	return 0;
}

// sched_wakeup and sched_wakeup_new: TP_PROTO(struct task_struct *p).
SEC("raw_tracepoint/sched_wakeup")
int raw_sched_wakeup(struct bpf_raw_tracepoint_args *ctx)
{
	struct task_struct *p = (struct task_struct *)ctx->args[0];
	on_wakeup(task_field(&p->pid), task_field(&p->wake_cpu));
	return 0;
}

// TP_PROTO(struct task_struct *p, int dest_cpu).
SEC("raw_tracepoint/sched_migrate_task")
int raw_sched_migrate_task(struct bpf_raw_tracepoint_args *ctx)
{
	struct task_struct *p = (struct task_struct *)ctx->args[0];
	on_migrate(task_field(&p->pid), (__u32)ctx->args[1]);
	return 0;
}
