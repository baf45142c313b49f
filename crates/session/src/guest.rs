//! Guest agents' rows in a recording (`record --agent`): per agent, its guest, its rows in
//! the guest's clock with the series they carry, the measured clock alignment and the gaps.

use std::ops::Range;

use virtprof_model::guest::{Alignment, ClockPoint, GuestInfo, GuestSeries, NoiseBatch};
use virtprof_store::recording::{agent_value, decode_noise, AgentFooter, AgentRecord};

use crate::backing::Backing;

/// One interval of a guest, in its own clock.
#[derive(Debug, Clone, PartialEq)]
pub struct GuestRow {
    /// Guest time it starts.
    pub start_ns: u64,
    /// Guest time it ends.
    pub end_ns: u64,
    /// One value per series of its segment.
    pub values: Vec<f64>,
}

/// Rows that carry the same series.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GuestSegment {
    /// Columns.
    pub series: Vec<GuestSeries>,
    /// Rows in order.
    pub rows: Vec<GuestRow>,
}

/// A stretch of host time without rows from a guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestGap {
    /// Host time last heard.
    pub from_ns: u64,
    /// Host time heard again (or the end).
    pub to_ns: u64,
    /// Why.
    pub cause: String,
}

/// Everything one agent's link recorded.
#[derive(Debug, Clone, Default)]
pub struct GuestStream {
    /// Agent number.
    pub agent: u32,
    /// Its address.
    pub address: String,
    /// The guest (as it last said).
    pub guest: GuestInfo,
    /// Rows by series set.
    pub segments: Vec<GuestSegment>,
    /// Guest clock → recording clock.
    pub alignment: Alignment,
    /// Gaps.
    pub gaps: Vec<GuestGap>,
    /// Periods of the guest's noise loop (`agent --noise`), in the order received: read from
    /// the recording one at a time, never all held.
    pub noise: NoisePeriods,
    /// The link's figures (None when the recording has no footer).
    pub footer: Option<AgentFooter>,
    points: Vec<ClockPoint>,
}

impl GuestStream {
    /// Rows over all segments.
    pub fn rows(&self) -> usize {
        self.segments.iter().map(|s| s.rows.len()).sum()
    }

    /// A name for tables: the guest's host name, else its address.
    pub fn name(&self) -> String {
        if self.guest.hostname.is_empty() {
            self.address.clone()
        } else {
            self.guest.hostname.clone()
        }
    }
}

/// A guest's noise periods where its recording holds them: a guest that sends many (one a
/// period per guest CPU, up to 4096 samples each) can fill a recording to its cap, and
/// reading must not hold all of that at once. Older recordings kept them as JSON records,
/// decoded when the recording is opened.
#[derive(Debug, Clone, Default)]
pub struct NoisePeriods {
    bytes: Option<Backing>,
    /// Payloads of `AgentNoise` chunks in `bytes`.
    chunks: Vec<Range<usize>>,
    /// Periods of older recordings' JSON records.
    decoded: Vec<NoiseBatch>,
}

impl NoisePeriods {
    /// Periods recorded.
    pub fn len(&self) -> usize {
        self.chunks.len() + self.decoded.len()
    }

    /// True if none was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The guest CPUs the periods measured, sorted (read without their samples).
    pub fn cpus(&self) -> Vec<u32> {
        let bytes = self.bytes.as_deref().unwrap_or_default();
        let mut cpus: Vec<u32> = self
            .decoded
            .iter()
            .map(|b| b.cpu)
            .chain(self.chunks.iter().filter_map(|r| {
                let at = r.start + 4;
                Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
            }))
            .collect();
        cpus.sort_unstable();
        cpus.dedup();
        cpus
    }

    /// Each period, read from the recording as it is reached.
    pub fn iter(&self) -> impl Iterator<Item = NoiseBatch> + '_ {
        let bytes = self.bytes.as_deref().unwrap_or_default();
        self.decoded
            .iter()
            .cloned()
            .chain(self.chunks.iter().map(move |range| decode_noise(bytes.get(range.clone()).unwrap_or_default())))
    }
}

/// Builds the guest streams while a recording's chunks are indexed.
#[derive(Debug, Default)]
pub struct GuestStreams {
    streams: Vec<GuestStream>,
}

impl GuestStreams {
    fn stream(&mut self, agent: u32) -> &mut GuestStream {
        let at = match self.streams.iter().position(|s| s.agent == agent) {
            Some(at) => at,
            None => {
                self.streams.push(GuestStream { agent, ..Default::default() });
                self.streams.len() - 1
            }
        };
        &mut self.streams[at]
    }

    /// Take one record.
    pub fn record(&mut self, record: AgentRecord) {
        match record {
            AgentRecord::Connected { agent, address, guest, series } => {
                let s = self.stream(agent);
                s.address = address;
                s.guest = guest;
                s.segments.push(GuestSegment { series, rows: Vec::new() });
            }
            AgentRecord::Schema { agent, series } => {
                self.stream(agent).segments.push(GuestSegment { series, rows: Vec::new() })
            }
            AgentRecord::Clock { agent, point } => self.stream(agent).points.push(point),
            AgentRecord::Gap { agent, from_ns, to_ns, cause } => {
                self.stream(agent).gaps.push(GuestGap { from_ns, to_ns, cause })
            }
            AgentRecord::Noise { agent, batch } => self.stream(agent).noise.decoded.push(batch),
        }
    }

    /// Take one noise period: where its chunk's payload is in the recording's bytes.
    pub(crate) fn noise(&mut self, agent: u32, payload: Range<usize>) {
        self.stream(agent).noise.chunks.push(payload);
    }

    /// Take one row; false if it does not fit its agent's series (damage).
    pub fn row(&mut self, agent: u32, start_ns: u64, end_ns: u64, values: &[u8]) -> bool {
        let Some(segment) = self.stream(agent).segments.last_mut() else { return false };
        let n = values.len() / 8;
        if n != segment.series.len() {
            return false;
        }
        segment.rows.push(GuestRow { start_ns, end_ns, values: (0..n).map(|i| agent_value(values, i)).collect() });
        true
    }

    /// The streams, with their alignments and the footer's figures, their noise periods read
    /// from `bytes`. An agent that never answered is still one: its footer says what its link
    /// saw.
    pub(crate) fn finish(mut self, footers: &[AgentFooter], bytes: &Backing) -> Vec<GuestStream> {
        for f in footers {
            let s = self.stream(f.agent);
            if s.address.is_empty() {
                s.address.clone_from(&f.address);
            }
            s.footer = Some(f.clone());
        }
        for s in &mut self.streams {
            s.alignment = Alignment::new(std::mem::take(&mut s.points));
            if !s.noise.chunks.is_empty() {
                s.noise.bytes = Some(bytes.clone());
            }
        }
        self.streams.sort_by_key(|s| s.agent);
        self.streams
    }
}

/// A guest row placed on the recording's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlacedRow {
    /// Host time it starts.
    pub start_ns: u64,
    /// Host time it ends.
    pub end_ns: u64,
    /// The alignment's error bound there.
    pub bound_ns: u64,
}

impl GuestStream {
    /// Where each row of `segment` lies on the recording's clock (None without any clock point).
    fn placed(&self, segment: &GuestSegment) -> Option<Vec<PlacedRow>> {
        segment
            .rows
            .iter()
            .map(|r| {
                let (start_ns, b0) = self.alignment.to_host(r.start_ns)?;
                let (end_ns, b1) = self.alignment.to_host(r.end_ns)?;
                Some(PlacedRow { start_ns, end_ns, bound_ns: b0.max(b1) })
            })
            .collect()
    }

    /// The rows placed on the recording's clock, one layer per series set (none without a
    /// clock point: such rows cannot be placed).
    pub fn layers(&self) -> Vec<virtprof_model::guest::GuestLayer> {
        self.segments
            .iter()
            .filter_map(|segment| {
                let placed = self.placed(segment)?;
                let rows = segment
                    .rows
                    .iter()
                    .zip(placed)
                    .map(|(r, p)| virtprof_model::guest::LayerRow {
                        guest_start_ns: r.start_ns,
                        guest_end_ns: r.end_ns,
                        start_ns: p.start_ns,
                        end_ns: p.end_ns,
                        bound_ns: p.bound_ns,
                        values: r.values.clone(),
                    })
                    .collect();
                Some(virtprof_model::guest::GuestLayer {
                    agent: self.agent,
                    name: self.name(),
                    series: segment.series.clone(),
                    rows,
                })
            })
            .filter(|l| !l.rows.is_empty())
            .collect()
    }

    /// Each noise period's samples placed on the recording's clock (samples that cannot be
    /// placed, without a clock point, are left out), a period at a time.
    pub fn placed_noise(&self) -> impl Iterator<Item = virtprof_model::guest::PlacedNoise> + '_ {
        self.noise.iter().map(|b| {
            let placed = b.samples.iter().filter_map(|&(start, len)| Some((self.alignment.to_host(start)?.0, len)));
            virtprof_model::guest::PlacedNoise { agent: self.agent, cpu: b.cpu, samples: placed.collect() }
        })
    }

    /// The markers the guest wrote (`agent --marker-port`): guest times just before and after
    /// each write, one per row that carries them.
    pub fn markers(&self) -> Vec<(u64, u64)> {
        use virtprof_model::guest::{MARKER_AFTER, MARKER_BEFORE};
        use virtprof_model::units::saturating_u64;
        let mut out = Vec::new();
        for segment in &self.segments {
            let at = |name| segment.series.iter().position(|s| s.name == name);
            let (Some(b), Some(a)) = (at(MARKER_BEFORE), at(MARKER_AFTER)) else { continue };
            for r in &segment.rows {
                let (before, after) = (r.values[b], r.values[a]);
                if before.is_finite() && after >= before && before > 0.0 {
                    out.push((saturating_u64(before), saturating_u64(after)));
                }
            }
        }
        out
    }

    /// Each series' total over all rows (counters: the sum; gauges: the last value), by name.
    pub fn totals(&self) -> Vec<(GuestSeries, f64)> {
        use virtprof_model::guest::SeriesKind;
        // Names looked up through an index: a guest may send many, and this must stay linear.
        let mut out: Vec<(GuestSeries, f64)> = Vec::new();
        let mut at: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
        for segment in &self.segments {
            for (i, s) in segment.series.iter().enumerate() {
                let mut column =
                    segment.rows.iter().map(|r| r.values.get(i).copied().unwrap_or(0.0)).filter(|v| v.is_finite());
                let value = match s.kind {
                    SeriesKind::Counter => column.sum(),
                    SeriesKind::Gauge => column.next_back().unwrap_or(0.0),
                };
                match at.get(s.name.as_str()) {
                    Some(&j) if out[j].0.kind == SeriesKind::Counter => out[j].1 += value,
                    Some(&j) => out[j].1 = value,
                    None => {
                        at.insert(&s.name, out.len());
                        out.push((s.clone(), value));
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Totals over many names stay linear: 200 000 distinct names (a guest sending a new
    /// schema again and again) add up in one pass; looked up one by one in a list, as before,
    /// this took minutes.
    #[test]
    fn totals_over_many_names_add_up_by_name() {
        let segments = (0..2000)
            .map(|s| GuestSegment {
                series: (0..100).map(|i| GuestSeries::counter(format!("app.s{s}.c{i}"), "events")).collect(),
                rows: vec![GuestRow { start_ns: 0, end_ns: 1, values: vec![1.0; 100] }; 2],
            })
            .chain(std::iter::once(GuestSegment {
                series: vec![GuestSeries::counter("app.s0.c0", "events")],
                rows: vec![GuestRow { start_ns: 1, end_ns: 2, values: vec![5.0] }],
            }))
            .collect();
        let stream = GuestStream { segments, ..Default::default() };
        let totals = stream.totals();
        assert_eq!(totals.len(), 200_000);
        assert_eq!(totals[0], (GuestSeries::counter("app.s0.c0", "events"), 7.0), "a counter sums over segments");
        assert!(totals[1..].iter().all(|(_, v)| *v == 2.0));
    }
}
