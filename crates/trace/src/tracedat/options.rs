//! The options both trace.dat versions share (`id: u16, size: u32, body`), decoded into
//! [`TraceDat`]. BUFFER, BUFFER_TEXT and the v7 section pointers are laid out per version and
//! handed back to the version's reader.

use super::cursor::Cursor;
use super::{TraceDat, TraceDatError};
use virtprof_model::clock_sync::{ClockSync, SyncSample};

pub(super) const DONE: u16 = 0;
const DATE: u16 = 1;
const CPUSTAT: u16 = 2;
pub(super) const BUFFER: u16 = 3;
pub(super) const TRACECLOCK: u16 = 4;
const UNAME: u16 = 5;
const OFFSET: u16 = 7;
const CPUCOUNT: u16 = 8;
const VERSION: u16 = 9;
const TRACEID: u16 = 11;
const TIME_SHIFT: u16 = 12;
const GUEST: u16 = 13;
const TSC2NSEC: u16 = 14;
pub(super) const HEADER_INFO: u16 = 16;
pub(super) const FTRACE_EVENTS: u16 = 17;
pub(super) const EVENT_FORMATS: u16 = 18;
pub(super) const CMDLINES: u16 = 21;
pub(super) const BUFFER_TEXT: u16 = 22;

/// The kernel's perf-clock conversion of TSC cycles that trace-cmd saved (TSC2NSEC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tsc2Nsec {
    /// Multiplier.
    pub mult: u32,
    /// Shift.
    pub shift: u32,
    /// The offset trace-cmd saves beside them (its reader does not add it to timestamps;
    /// neither do we).
    pub offset: u64,
}

/// A guest a host trace knows (GUEST): its name, trace id, and each vCPU's host thread.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GuestVcpus {
    /// The guest's name.
    pub name: String,
    /// The guest trace's TRACEID.
    pub trace_id: u64,
    /// (guest CPU, host thread id running it).
    pub vcpus: Vec<(u32, u32)>,
}

/// The most samples a TIME_SHIFT may hold per CPU (trace-cmd takes a few per second).
const MAX_SAMPLES: usize = 1 << 20;

/// Apply one option whose meaning is the same in both versions. False: the caller handles it.
pub(super) fn apply(id: u16, body: &[u8], at: usize, out: &mut TraceDat) -> Result<bool, TraceDatError> {
    let mut b = Cursor::within(body, at);
    let string =
        |b: &mut Cursor| b.cstr().or_else(|_| Ok::<_, TraceDatError>(String::from_utf8_lossy(body).into_owned()));
    match id {
        CPUSTAT => out.cpu_stats.push(string(&mut b)?),
        TRACECLOCK => {
            let text = string(&mut b)?;
            // The whole `trace_clock` file, the selected clock in brackets.
            out.clock = crate::tracefs::selected_clock(&text);
        }
        UNAME => out.uname = string(&mut b)?,
        VERSION => out.tracer_version = string(&mut b)?,
        DATE | OFFSET => {
            let text = string(&mut b)?;
            let text = text.trim();
            let value = match text.strip_prefix("0x") {
                Some(hex) => i64::from_str_radix(hex, 16).ok(),
                None => text.parse::<i64>().ok(),
            };
            let Some(value) = value else {
                return b.fail(format!("time offset '{}' is not a number", text.escape_debug()));
            };
            out.offset_ns = out.offset_ns.saturating_add(value);
        }
        CPUCOUNT => out.cpu_count = Some(b.u32()?),
        TRACEID => out.trace_id = Some(b.u64()?),
        TSC2NSEC => {
            let (mult, shift, offset) = (b.u32()?, b.u32()?, b.u64()?);
            if shift > 63 {
                return b.fail(format!("TSC2NSEC shift {shift} is over 63"));
            }
            out.tsc2nsec = Some(Tsc2Nsec { mult, shift, offset });
        }
        TIME_SHIFT => out.time_shift = Some(time_shift(&mut b)?),
        GUEST => out.guests.push(guest(&mut b)?),
        _ => return Ok(false),
    }
    Ok(true)
}

/// TIME_SHIFT: `peer id: u64, flags: u32, cpus: u32`, per CPU `count: u32` and arrays of
/// times, offsets and scalings, then (trace-cmd 3.0 on) per CPU its samples' fraction bits.
fn time_shift(b: &mut Cursor) -> Result<ClockSync, TraceDatError> {
    let peer_trace_id = b.u64()?;
    let interpolate = b.u32()? & 1 != 0;
    let cpus = b.size32()?;
    if cpus > super::MAX_CPUS {
        return b.fail(format!("TIME_SHIFT names {cpus} CPUs"));
    }
    let mut sync = ClockSync { peer_trace_id, interpolate, cpus: Vec::with_capacity(cpus) };
    for cpu in 0..cpus {
        let count = b.size32()?;
        if count > MAX_SAMPLES || count.saturating_mul(24) > b.remaining() {
            return b.fail(format!("TIME_SHIFT claims {count} samples for a CPU; the option is shorter"));
        }
        let mut column = || -> Result<Vec<u64>, TraceDatError> { (0..count).map(|_| b.u64()).collect() };
        let (times, offsets, scalings) = (column()?, column()?, column()?);
        if times.windows(2).any(|w| w[0] > w[1]) {
            return b.fail(format!("TIME_SHIFT samples of CPU {cpu} are not in time order"));
        }
        if scalings.contains(&0) {
            return b.fail(format!("TIME_SHIFT of CPU {cpu} has a scaling of 0"));
        }
        sync.cpus.push(
            times
                .iter()
                .zip(&offsets)
                .zip(&scalings)
                .map(|((&time, &offset), &scaling)| SyncSample { time, offset: offset as i64, scaling, fraction: 0 })
                .collect(),
        );
    }
    // trace-cmd 3.0 on: per CPU, a fraction for each of its samples (no count of its own).
    if b.remaining() > 0 {
        for samples in &mut sync.cpus {
            for sample in samples.iter_mut() {
                let fraction = b.u64()?;
                let Some(fraction) = u32::try_from(fraction).ok().filter(|&f| f <= 63) else {
                    return b.fail(format!("TIME_SHIFT fraction {fraction} is over 63 bits"));
                };
                sample.fraction = fraction;
            }
        }
    }
    Ok(sync)
}

/// GUEST: `name\0, trace id: u64, cpus: u32, (cpu: u32, host pid: u32)...`.
fn guest(b: &mut Cursor) -> Result<GuestVcpus, TraceDatError> {
    let name = b.cstr()?;
    let trace_id = b.u64()?;
    let cpus = b.size32()?;
    if cpus.saturating_mul(8) > b.remaining() {
        return b.fail(format!("GUEST '{name}' claims {cpus} vCPUs; the option is shorter"));
    }
    let vcpus = (0..cpus).map(|_| Ok((b.u32()?, b.u32()?))).collect::<Result<_, TraceDatError>>()?;
    Ok(GuestVcpus { name, trace_id, vcpus })
}
