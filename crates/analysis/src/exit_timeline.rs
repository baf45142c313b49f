//! A boot profile from a recording's `kvm_exit`/`kvm_entry` pairs (`boot --recording`): each
//! vCPU's timeline alternates between the guest running (from an entry to the next exit) and
//! the hypervisor handling an exit (from the exit to the next entry). Sampling that timeline on
//! a fixed grid gives time-weighted samples like the live samplers' (seed 003), with the
//! hypervisor realm measured rather than missing:
//! - a grid point inside an exit is a hypervisor sample, named by the exit reason;
//! - a grid point while the guest runs takes the rip of the exit that ended that run (where
//!   the guest was when it stopped: exact for code that exits, a stand-in for the rest);
//! - guest code below the kernel half is firmware until the vCPU first runs kernel code (BIOS,
//!   option ROMs, boot loader, decompressor, an AP's real-mode trampoline), user after.

use rustc_hash::FxHashMap;
use virtprof_model::pcsample::{PcSample, Realm};
use virtprof_model::{Event, EventKind};

use crate::Names;

/// The most samples a profile holds (about 1.5 GB): a timeline stretched by a corrupt
/// timestamp would otherwise ask for terabytes.
pub const MAX_SAMPLES: u64 = 20_000_000;

/// The grid asked for more than [`MAX_SAMPLES`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TooManySamples {
    /// Samples the grid asked for.
    pub wanted: u64,
    /// The vCPU time the timelines covered, ns.
    pub covered_ns: u64,
}

/// Where 64-bit kernels live: addresses with the top bit set (x86-64's upper canonical half,
/// arm64's TTBR1 range, whatever its VA size).
const KERNEL_HALF: u64 = 1 << 63;

/// Where one vCPU is on its timeline.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// The guest runs since this time.
    Guest(u64),
    /// Handling an exit since this time.
    Exit { since: u64, reason: u32, isa: u32 },
}

#[derive(Debug, Clone, Copy)]
struct Vcpu {
    phase: Phase,
    /// The vCPU has run code in the kernel half.
    kernel_seen: bool,
}

/// Samples on a grid of `period_ns` over every vCPU's exit/entry timeline.
#[derive(Debug)]
pub struct ExitTimeline {
    period_ns: u64,
    /// The grid's origin: the first kvm event.
    origin: Option<u64>,
    vcpus: FxHashMap<u32, Vcpu>,
    samples: Vec<PcSample>,
    /// Exit time and total time covered, ns (the hypervisor's share is their ratio).
    exit_ns: u64,
    covered_ns: u64,
    /// Grid points met, kept or not (past [`MAX_SAMPLES`] none are kept).
    wanted: u64,
}

impl ExitTimeline {
    /// Sample every vCPU `rate_hz` times a second.
    pub fn new(rate_hz: u32) -> ExitTimeline {
        ExitTimeline {
            period_ns: 1_000_000_000 / u64::from(rate_hz.max(1)),
            origin: None,
            vcpus: FxHashMap::default(),
            samples: Vec::new(),
            exit_ns: 0,
            covered_ns: 0,
            wanted: 0,
        }
    }

    /// Samples of vCPU `vcpu` at the grid points in `[from, to)`: at `rip` in `realm`, or,
    /// for the hypervisor, named by `activity` (made only if a point falls in the interval).
    fn sample(&mut self, vcpu: u32, from: u64, to: u64, rip: u64, realm: Realm, activity: impl FnOnce() -> String) {
        let (period, origin) = (self.period_ns, self.origin.unwrap_or(from));
        let first = from.saturating_sub(origin).div_ceil(period).saturating_mul(period);
        let end = to.saturating_sub(origin);
        if first >= end {
            return;
        }
        self.wanted = self.wanted.saturating_add((end - first).div_ceil(period));
        if self.wanted > MAX_SAMPLES {
            return;
        }
        let activity = activity();
        let step = usize::try_from(period).unwrap_or(usize::MAX);
        self.samples.extend((first..end).step_by(step).map(|t_ns| PcSample {
            t_ns,
            vcpu,
            rip,
            realm,
            activity: activity.clone(),
        }));
    }

    fn on_event(&mut self, e: &Event, names: &dyn Names) {
        let (vcpu_id, exit) = match e.kind {
            EventKind::KvmExit { vcpu_id, reason, isa, guest_rip, .. } => (vcpu_id, Some((reason, isa, guest_rip))),
            EventKind::KvmEntry { vcpu_id, .. } => (vcpu_id, None),
            _ => return,
        };
        self.origin.get_or_insert(e.ts);
        let Some(v) = self.vcpus.get(&vcpu_id).copied() else {
            // A vCPU's timeline starts at its first event: before it, where it was is unknown.
            let phase = match exit {
                Some((reason, isa, _)) => Phase::Exit { since: e.ts, reason, isa },
                None => Phase::Guest(e.ts),
            };
            self.vcpus.insert(vcpu_id, Vcpu { phase, kernel_seen: false });
            return;
        };
        let mut next = v;
        match (v.phase, exit) {
            (Phase::Guest(since), Some((reason, isa, rip))) => {
                next.kernel_seen |= rip >= KERNEL_HALF;
                let realm = match rip {
                    _ if rip >= KERNEL_HALF => Realm::Kernel,
                    _ if next.kernel_seen => Realm::User,
                    _ => Realm::Firmware,
                };
                self.sample(vcpu_id, since, e.ts, rip, realm, String::new);
                self.covered_ns += e.ts.saturating_sub(since);
                next.phase = Phase::Exit { since: e.ts, reason, isa };
            }
            (Phase::Exit { since, reason, isa }, None) => {
                let activity = || format!("kvm:{}", names.exit_reason(reason, isa));
                self.sample(vcpu_id, since, e.ts, 0, Realm::Hypervisor, activity);
                let took = e.ts.saturating_sub(since);
                self.exit_ns += took;
                self.covered_ns += took;
                next.phase = Phase::Guest(e.ts);
            }
            // Two exits or two entries in a row (a lost event between them): start over here.
            (_, Some((reason, isa, _))) => next.phase = Phase::Exit { since: e.ts, reason, isa },
            (_, None) => next.phase = Phase::Guest(e.ts),
        }
        self.vcpus.insert(vcpu_id, next);
    }

    /// The samples in time order, and the share of the covered time spent handling exits; or,
    /// when the grid asked for more than [`MAX_SAMPLES`], how many.
    pub fn finish(mut self) -> Result<(Vec<PcSample>, Option<f64>), TooManySamples> {
        if self.wanted > MAX_SAMPLES {
            return Err(TooManySamples { wanted: self.wanted, covered_ns: self.covered_ns });
        }
        self.samples.sort_by_key(|s| (s.t_ns, s.vcpu));
        let share = (self.covered_ns > 0).then(|| self.exit_ns as f64 / self.covered_ns as f64);
        Ok((self.samples, share))
    }
}

impl crate::Analyzer for ExitTimeline {
    fn on_event(&mut self, event: &Event, names: &dyn Names) {
        ExitTimeline::on_event(self, event, names);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtprof_model::StrId;

    struct Reasons;
    impl Names for Reasons {
        fn exit_reason(&self, reason: u32, _isa: u32) -> String {
            format!("r{reason}")
        }
        fn userspace_reason(&self, reason: u32) -> String {
            format!("u{reason}")
        }
        fn event(&self, id: u16) -> String {
            format!("e{id}")
        }
        fn task(&self, _: StrId) -> String {
            String::new()
        }
    }

    fn exit(ts: u64, rip: u64, reason: u32) -> Event {
        let kind = EventKind::KvmExit { reason, isa: 2, guest_rip: rip, vcpu_id: 0 };
        Event { ts, cpu: 0, tid: 9, kind }
    }

    fn entry(ts: u64) -> Event {
        Event { ts, cpu: 0, tid: 9, kind: EventKind::KvmEntry { vcpu_id: 0, rip: 0 } }
    }

    #[test]
    fn time_splits_into_realms_by_where_the_vcpu_was() {
        // 1 ms grid. Firmware runs 0-10 ms, an exit takes 10-14 ms, the kernel runs 14-30 ms,
        // exits 30-32 ms, then low code (user, now that the kernel has run) 32-40 ms.
        let ms = 1_000_000;
        let mut t = ExitTimeline::new(1000);
        let events = [
            entry(0),
            exit(10 * ms, 0xf_e05b, 1),
            entry(14 * ms),
            exit(30 * ms, 0xffff_ffff_8100_0000, 2),
            entry(32 * ms),
            exit(40 * ms, 0x40_1000, 1),
        ];
        events.iter().for_each(|e| t.on_event(e, &Reasons));
        let (samples, share) = t.finish().unwrap();
        let count = |realm| samples.iter().filter(|s| s.realm == realm).count();
        assert_eq!(
            (count(Realm::Firmware), count(Realm::Hypervisor), count(Realm::Kernel), count(Realm::User)),
            (10, 6, 16, 8)
        );
        assert_eq!(share, Some(6.0 / 40.0));
        let hyp: Vec<&str> = samples.iter().filter(|s| s.realm == Realm::Hypervisor).map(|s| &*s.activity).collect();
        assert_eq!(hyp, ["kvm:r1", "kvm:r1", "kvm:r1", "kvm:r1", "kvm:r2", "kvm:r2"]);
    }

    #[test]
    fn a_timeline_stretched_past_the_sample_limit_says_how_far_instead_of_allocating() {
        // A corrupt timestamp: the vCPU's next exit seems to come 3 years later.
        let mut t = ExitTimeline::new(1000);
        let events = [entry(0), exit(100_000_000_000_000_000, 0x40_1000, 1)];
        events.iter().for_each(|e| t.on_event(e, &Reasons));
        let too_many = t.finish().unwrap_err();
        assert_eq!(too_many, TooManySamples { wanted: 100_000_000_000, covered_ns: 100_000_000_000_000_000 });
        // A timestamp going back does not underflow.
        let mut t = ExitTimeline::new(1000);
        [entry(5_000_000), exit(1_000_000, 0, 1), entry(2_000_000)].iter().for_each(|e| t.on_event(e, &Reasons));
        assert!(t.finish().is_ok());
    }
}
