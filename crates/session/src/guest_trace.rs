//! A guest's own trace opened beside its host's (`--guest FILE`): trace-cmd writes one file per
//! machine when it records a host and its guests together (`trace-cmd record -A`). The guest's
//! events are placed on the host's clock by the guest file's own TIME_SHIFT corrections, per
//! guest CPU, as trace-cmd's reader places them; the host file's GUEST option says which host
//! thread runs each guest CPU. A guest file without corrections is read on its own clock and
//! said to be not aligned.

use std::path::Path;

use virtprof_model::clock::TimeScale;
use virtprof_model::clock_sync::ClockSync;
use virtprof_model::Event;
use virtprof_trace::decode::Decoder;
use virtprof_trace::merge::WalkStats;

use crate::error::{Result, SessionError};
use crate::import::SourceOptions;
use crate::session::Session;

/// How the guest's clock is placed on the host's.
#[derive(Debug, Clone, PartialEq)]
pub enum Alignment {
    /// By the guest file's corrections.
    Synced(ClockSync),
    /// Not at all, and why: the guest's events keep their own clock.
    NotAligned(String),
}

/// A guest trace paired with its host's.
pub struct GuestTrace {
    /// The guest's events; its timestamps are raw (its time scale is applied after the
    /// corrections, as trace-cmd applies it).
    pub session: Session,
    /// The guest's name in the host file (its GUEST option), or the file's stem.
    pub name: String,
    /// How its clock is placed.
    pub alignment: Alignment,
    /// (guest CPU, host thread running it), from the host file's GUEST option.
    pub vcpu_threads: Vec<(u32, u32)>,
    scale: Option<TimeScale>,
    /// Why its timestamps cannot be read as time, if so (told before the pairing takes its
    /// time scale to apply after the corrections).
    clock_not_time: Option<String>,
}

/// The walk of a guest trace: the usual counts, and events that could not be placed.
#[derive(Debug, Clone, Default)]
pub struct GuestWalk {
    /// Pages, events and loss, as for a host walk.
    pub stats: WalkStats,
    /// Events of guest CPUs the corrections do not cover (skipped).
    pub unplaced: u64,
}

impl GuestTrace {
    /// Open `path` as the guest of `host`. Files that are not a pair (the guest's corrections
    /// were measured against another host trace) are bad input.
    pub fn open(host: &Session, path: &Path, options: &SourceOptions) -> Result<GuestTrace> {
        // A guest recorded in TSC cycles (`-C x86-tsc`, as trace-cmd's own pairing wants it)
        // is converted with its host's TSC2NSEC, after the corrections have put its cycles on
        // the host's TSC.
        let host_tsc = (host.metadata.trace_clock == "x86-tsc")
            .then_some(host.metadata.time_scale)
            .flatten()
            .map(|s| TimeScale { offset_ns: 0, ..s });
        let options = SourceOptions { tsc_scale: options.tsc_scale.or(host_tsc), ..options.clone() };
        let session = Session::open_warning(path, &options)?;
        let stem = path.file_stem().map_or_else(|| "guest".to_string(), |s| s.to_string_lossy().into_owned());
        GuestTrace::pair(host, session, stem)
    }

    /// The guest machine `host` holds (a recording `import --guest` made), where it holds one.
    pub fn embedded(host: &Session) -> Option<Result<GuestTrace>> {
        let (session, file) = match host.embedded_guest()? {
            Ok(found) => found,
            Err(e) => return Some(Err(e)),
        };
        let stem = Path::new(&file).file_stem().map_or_else(|| file.clone(), |s| s.to_string_lossy().into_owned());
        Some(GuestTrace::pair(host, session, stem))
    }

    /// The guest trace `host` is read with: `explicit` (`--guest FILE`) where given, else the
    /// guest machine the host's recording holds, else none.
    pub fn of(host: &Session, explicit: Option<&Path>, options: &SourceOptions) -> Result<Option<GuestTrace>> {
        match explicit {
            Some(path) => GuestTrace::open(host, path, options).map(Some),
            None => GuestTrace::embedded(host).transpose(),
        }
    }

    /// `session` (a guest's own trace) as the guest of `host`; `stem` names it where the host
    /// file does not.
    fn pair(host: &Session, mut session: Session, stem: String) -> Result<GuestTrace> {
        // Placed on the host's clock here, in the walk below, not as a file read alone.
        session.time_shift = None;
        let clock_not_time = session.clock_not_time();
        let scale = session.metadata.time_scale.take();
        let trace_id = |s: &Session| {
            s.metadata.host.get("trace_id").and_then(|id| u64::from_str_radix(id.trim_start_matches("0x"), 16).ok())
        };
        let (host_id, guest_id) = (trace_id(host), trace_id(&session));
        let known = guest_id.and_then(|id| host.metadata.guests.iter().find(|g| g.trace_id == Some(id)));
        // `trace-cmd attach` leaves the name empty.
        let name = known.map(|g| g.name.clone()).filter(|n| !n.is_empty()).unwrap_or(stem);
        let vcpu_threads = known.map(|g| g.vcpus.clone()).unwrap_or_default();
        let path = session.path.display().to_string();
        let alignment = match session.metadata.clock_sync.take() {
            None => Alignment::NotAligned(format!(
                "'{path}' has no time-sync data (TIME_SHIFT): it was not recorded with its host (`trace-cmd record -A`), so its events keep the guest's own clock"
            )),
            Some(sync) if host_id.is_some_and(|id| id != sync.peer_trace_id) => {
                return Err(SessionError::BadInput(format!(
                    "'{path}' was synchronised with the host trace {:#x}, but '{}' is trace {:#x}: give the host file recorded with this guest",
                    sync.peer_trace_id,
                    host.path.display(),
                    host_id.unwrap_or(0)
                )))
            }
            Some(sync) if sync.samples() == 0 => Alignment::NotAligned(format!(
                "'{path}' has a TIME_SHIFT option with no samples: its events keep the guest's own clock"
            )),
            Some(sync) => Alignment::Synced(sync),
        };
        Ok(GuestTrace { session, name, alignment, vcpu_threads, scale, clock_not_time })
    }

    /// Its metadata as a recording holding it keeps it (`import --guest`): with its time
    /// scale and corrections, read again as this file is read.
    pub fn recording_metadata(&self) -> virtprof_store::recording::Metadata {
        let mut metadata = self.session.recording_metadata();
        metadata.time_scale = self.scale;
        if let Alignment::Synced(sync) = &self.alignment {
            metadata.clock_sync = Some(sync.clone());
        }
        metadata
    }

    /// What the guest's trace holds, and so which of its figures it can give.
    pub fn holdings(&self, decoder: &Decoder) -> virtprof_model::evidence::Holdings {
        self.session.holdings_on(decoder, self.clock_not_time.clone())
    }

    /// Whether its events are on the host's clock.
    pub fn aligned(&self) -> bool {
        matches!(self.alignment, Alignment::Synced(_))
    }

    /// The guest CPU a host thread runs, by the host file's GUEST option.
    pub fn guest_cpu_of(&self, host_tid: u32) -> Option<u32> {
        self.vcpu_threads.iter().find(|&&(_, tid)| tid == host_tid).map(|&(cpu, _)| cpu)
    }

    /// Walk the guest's events, each on the host's clock where aligned (per CPU in time order;
    /// across CPUs as the guest recorded them).
    pub fn walk(&self, decoder: &mut Decoder, mut sink: impl FnMut(&Event, &Decoder)) -> Result<GuestWalk> {
        let mut unplaced = 0;
        let scale = |ts| self.scale.map_or(ts, |s| s.apply(ts));
        let stats = self.session.walk(decoder, |e, d| {
            let placed = match &self.alignment {
                Alignment::Synced(sync) => sync.to_host(e.cpu, e.ts),
                Alignment::NotAligned(_) => Some(e.ts),
            };
            match placed {
                Some(ts) => sink(&Event { ts: scale(ts), ..*e }, d),
                None => unplaced += 1,
            }
        })?;
        Ok(GuestWalk { stats, unplaced })
    }

    /// One line on how the guest was placed, for the text outputs.
    pub fn describe(&self) -> String {
        match &self.alignment {
            Alignment::Synced(sync) => format!(
                "guest '{}' ({}): aligned to the host by its TIME_SHIFT ({} samples over {} CPUs{}); {} vCPU threads named by the host file",
                self.name,
                self.session.path.display(),
                sync.samples(),
                sync.cpus.len(),
                if sync.interpolate { ", interpolated" } else { "" },
                self.vcpu_threads.len()
            ),
            Alignment::NotAligned(why) => format!("guest '{}' is NOT aligned to the host: {why}", self.name),
        }
    }
}
