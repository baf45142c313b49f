//! The interval table (VrtProf): rows = intervals, columns = series. Sampled columns come from
//! the recording's interval rows; [`TraceBinner`] adds columns counted from the event stream
//! (exits by reason, I/O, scheduling) into the same rows, so every layer lines up in time.

use rustc_hash::FxHashMap as HashMap;
use virtprof_model::guest::{GuestLayer, SeriesKind as GuestKind};
use virtprof_model::interval::{Entity, Series, SeriesKind};
use virtprof_model::{Event, EventKind};

use crate::Names;

/// One column.
#[derive(Debug, Clone, PartialEq)]
pub struct Column {
    /// What it is.
    pub series: Series,
    /// One value per row; NaN where unknown (the column did not exist yet, or its source
    /// could not be read).
    pub values: Vec<f64>,
}

impl Column {
    /// Sum over rows, NaN skipped.
    pub fn total(&self) -> f64 {
        self.values.iter().filter(|v| !v.is_nan()).sum()
    }
}

/// Rows of intervals and their columns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IntervalTable {
    /// Nominal interval width.
    pub interval_ns: u64,
    /// Global interval number of each row (gaps are missed intervals).
    pub index: Vec<u64>,
    /// Row start (trace clock).
    pub start_ns: Vec<u64>,
    /// Row end (trace clock).
    pub end_ns: Vec<u64>,
    /// Columns.
    pub columns: Vec<Column>,
    /// Metrics the host could not count, with reasons.
    pub unavailable: Vec<(String, String)>,
    by_key: HashMap<(Entity, String), usize>,
}

impl IntervalTable {
    /// An empty table of `interval_ns` intervals.
    pub fn new(interval_ns: u64) -> Self {
        IntervalTable { interval_ns, ..Default::default() }
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.index.len()
    }

    /// The column of `series`, created (NaN-filled so far) if new.
    pub fn column_of(&mut self, series: &Series) -> usize {
        let key = (series.entity, series.metric.clone());
        if let Some(&i) = self.by_key.get(&key) {
            return i;
        }
        self.columns.push(Column { series: series.clone(), values: vec![f64::NAN; self.rows()] });
        self.by_key.insert(key, self.columns.len() - 1);
        self.columns.len() - 1
    }

    /// Look a column up.
    pub fn find(&self, entity: Entity, metric: &str) -> Option<&Column> {
        self.by_key.get(&(entity, metric.to_string())).map(|&i| &self.columns[i])
    }

    /// Append a row; `values` pairs column numbers with values, other columns get NaN.
    pub fn push_row(&mut self, index: u64, start_ns: u64, end_ns: u64, values: impl IntoIterator<Item = (usize, f64)>) {
        self.index.push(index);
        self.start_ns.push(start_ns);
        self.end_ns.push(end_ns);
        for c in &mut self.columns {
            c.values.push(f64::NAN);
        }
        let row = self.rows() - 1;
        for (col, v) in values {
            self.columns[col].values[row] = v;
        }
    }

    /// The row whose span holds `ts` (None before the first or after the last).
    pub fn row_at(&self, ts: u64) -> Option<usize> {
        let after = self.start_ns.partition_point(|&s| s <= ts);
        let row = after.checked_sub(1)?;
        (ts <= self.end_ns[row]).then_some(row)
    }

    /// Add per-VM columns: for every vCPU delta metric, the sum over the VM's vCPUs.
    pub fn add_vm_sums(&mut self) {
        let mut sums: Vec<(Series, Vec<f64>)> = Vec::new();
        let mut at: HashMap<(u32, String), usize> = HashMap::default();
        for c in &self.columns {
            let Entity::Vcpu { pid, .. } = c.series.entity else { continue };
            if c.series.kind != SeriesKind::Delta {
                continue;
            }
            let i = *at.entry((pid, c.series.metric.clone())).or_insert_with(|| {
                let series = Series { entity: Entity::Vm(pid), ..c.series.clone() };
                sums.push((series, vec![f64::NAN; c.values.len()]));
                sums.len() - 1
            });
            for (s, &v) in sums[i].1.iter_mut().zip(&c.values) {
                if !v.is_nan() {
                    *s = if s.is_nan() { v } else { *s + v };
                }
            }
        }
        for (series, values) in sums {
            let col = self.column_of(&series);
            self.columns[col].values = values;
        }
    }
}

impl IntervalTable {
    /// Add a guest's rows (placed on the recording's clock) as `guestN` columns of these
    /// intervals: a counter's increase is shared among the intervals its row overlaps, in
    /// proportion to the overlap; a gauge gives each interval the level of the row its end
    /// falls in. Intervals no guest row reaches stay NaN (unknown, not zero).
    pub fn add_guest_layer(&mut self, layer: &GuestLayer) {
        let columns: Vec<usize> = layer
            .series
            .iter()
            .map(|s| {
                let kind = match s.kind {
                    GuestKind::Counter => SeriesKind::Delta,
                    GuestKind::Gauge => SeriesKind::Gauge,
                };
                self.column_of(&Series {
                    entity: Entity::Guest(layer.agent),
                    metric: s.name.clone(),
                    unit: s.unit.clone(),
                    kind,
                })
            })
            .collect();
        for r in &layer.rows {
            let (from, to) = (r.start_ns, r.end_ns.max(r.start_ns + 1));
            let first = self.end_ns.partition_point(|&e| e <= from);
            for row in first..self.rows() {
                let (start, end) = (self.start_ns[row], self.end_ns[row]);
                if start >= to {
                    break;
                }
                let overlap = end.min(to).saturating_sub(start.max(from));
                let share = overlap as f64 / (to - from) as f64;
                let holds_end = from < end && end <= to;
                for ((s, &col), &v) in layer.series.iter().zip(&columns).zip(&r.values) {
                    let cell = &mut self.columns[col].values[row];
                    match s.kind {
                        GuestKind::Counter if overlap > 0 && v.is_finite() => {
                            *cell = if cell.is_nan() { v * share } else { *cell + v * share };
                        }
                        GuestKind::Gauge if holds_end => *cell = v,
                        _ => {}
                    }
                }
            }
        }
    }

    /// Every delta metric summed over all vCPUs and all CPUs: one host-level series per metric
    /// name, comparable between runs whose VMs have other pids (VrtProf's native vs VM view).
    pub fn host_metrics(&self) -> Vec<(String, Vec<f64>)> {
        let mut out: Vec<(String, Vec<f64>)> = Vec::new();
        for c in &self.columns {
            if c.series.kind != SeriesKind::Delta || !matches!(c.series.entity, Entity::Vcpu { .. } | Entity::Cpu(_)) {
                continue;
            }
            let i = match out.iter().position(|(m, _)| *m == c.series.metric) {
                Some(i) => i,
                None => {
                    out.push((c.series.metric.clone(), vec![f64::NAN; self.rows()]));
                    out.len() - 1
                }
            };
            for (s, &v) in out[i].1.iter_mut().zip(&c.values) {
                if !v.is_nan() {
                    *s = if s.is_nan() { v } else { *s + v };
                }
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Seconds covered by the rows.
    pub fn seconds(&self) -> f64 {
        match (self.start_ns.first(), self.end_ns.last()) {
            (Some(&a), Some(&b)) => b.saturating_sub(a) as f64 / 1e9,
            _ => 0.0,
        }
    }
}

/// What a trace column counts; reasons stay numeric until a column is first created, so
/// binning an event allocates nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Counted {
    Irq,
    Softirq,
    LostPages,
    SwitchIn,
    Wakeup,
    Exit { reason: u32, isa: u32 },
    UserspaceExit { reason: u32 },
    Pio,
    Mmio,
    EmulateInsn,
}

impl Counted {
    fn metric(self, names: &dyn Names) -> String {
        match self {
            Counted::Irq => "trace.irq".into(),
            Counted::Softirq => "trace.softirq".into(),
            Counted::LostPages => "trace.lost_pages".into(),
            Counted::SwitchIn => "trace.switch_in".into(),
            Counted::Wakeup => "trace.wakeup".into(),
            Counted::Exit { reason, isa } => format!("trace.exit.{}", names.exit_reason(reason, isa)),
            Counted::UserspaceExit { reason } => format!("trace.userspace_exit.{}", names.userspace_reason(reason)),
            Counted::Pio => "trace.pio".into(),
            Counted::Mmio => "trace.mmio".into(),
            Counted::EmulateInsn => "trace.emulate_insn".into(),
        }
    }
}

/// Counts events into the rows of an [`IntervalTable`], as `trace.*` columns per vCPU (by
/// thread) and per CPU.
pub struct TraceBinner<'t> {
    table: &'t mut IntervalTable,
    vcpus: HashMap<u32, Entity>,
    cells: HashMap<(Entity, Counted), usize>,
    /// Events that fell outside every row (before the first interval or after the last).
    pub outside: u64,
}

impl<'t> TraceBinner<'t> {
    /// Bin into `table`; `vcpus` maps vCPU thread ids to their entities.
    pub fn new(table: &'t mut IntervalTable, vcpus: HashMap<u32, Entity>) -> Self {
        TraceBinner { table, vcpus, cells: HashMap::default(), outside: 0 }
    }

    fn add(&mut self, entity: Entity, what: Counted, row: usize, names: &dyn Names) {
        let table = &mut *self.table;
        let col = *self.cells.entry((entity, what)).or_insert_with(|| {
            let series = Series { entity, metric: what.metric(names), unit: "count".into(), kind: SeriesKind::Delta };
            let c = table.column_of(&series);
            // Counted columns are exact zeros where nothing happened.
            table.columns[c].values.iter_mut().for_each(|v| *v = 0.0);
            c
        });
        table.columns[col].values[row] += 1.0;
    }

    /// Count one event.
    pub fn on_event(&mut self, e: &Event, names: &dyn Names) {
        let Some(row) = self.table.row_at(e.ts) else {
            self.outside += 1;
            return;
        };
        let (entity, what) = match e.kind {
            EventKind::IrqEntry { .. } | EventKind::IrqVectorEntry { .. } => (Entity::Cpu(e.cpu), Counted::Irq),
            EventKind::SoftirqEntry { .. } => (Entity::Cpu(e.cpu), Counted::Softirq),
            EventKind::Lost { .. } => (Entity::Cpu(e.cpu), Counted::LostPages),
            EventKind::SchedSwitch { next_tid, .. } => match self.vcpus.get(&next_tid) {
                Some(&v) => (v, Counted::SwitchIn),
                None => return,
            },
            EventKind::SchedWakeup { tid, .. } => match self.vcpus.get(&tid) {
                Some(&v) => (v, Counted::Wakeup),
                None => return,
            },
            _ => {
                let Some(&v) = self.vcpus.get(&e.tid) else { return };
                let what = match e.kind {
                    EventKind::KvmExit { reason, isa, .. } => Counted::Exit { reason, isa },
                    EventKind::KvmUserspaceExit { reason, .. } => Counted::UserspaceExit { reason },
                    EventKind::KvmPio { .. } => Counted::Pio,
                    EventKind::KvmMmio { .. } => Counted::Mmio,
                    EventKind::KvmEmulateInsn { .. } => Counted::EmulateInsn,
                    _ => return,
                };
                (v, what)
            }
        };
        self.add(entity, what, row, names);
    }
}

impl crate::Analyzer for TraceBinner<'_> {
    fn on_event(&mut self, event: &Event, names: &dyn Names) {
        TraceBinner::on_event(self, event, names);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(entity: Entity, metric: &str) -> Series {
        Series { entity, metric: metric.into(), unit: "count".into(), kind: SeriesKind::Delta }
    }

    #[test]
    fn guest_rows_are_shared_among_the_intervals_they_overlap() {
        use virtprof_model::guest::{GuestSeries, LayerRow};
        let mut t = IntervalTable::new(100);
        for k in 0..4 {
            t.push_row(k, k * 100, (k + 1) * 100, []);
        }
        let row = |start_ns, end_ns, values: Vec<f64>| LayerRow {
            guest_start_ns: 0,
            guest_end_ns: 0,
            start_ns,
            end_ns,
            bound_ns: 0,
            values,
        };
        let layer = GuestLayer {
            agent: 2,
            name: "g".into(),
            series: vec![
                GuestSeries::counter("irq.LOC", "events"),
                GuestSeries::gauge("vmstat.nr_free_pages", "pages"),
            ],
            // 150..250 holds 10 ticks, half in row 1 and half in row 2; 250..400 holds 30.
            rows: vec![row(150, 250, vec![10.0, 7.0]), row(250, 400, vec![30.0, 9.0])],
        };
        t.add_guest_layer(&layer);
        let ticks = &t.find(Entity::Guest(2), "irq.LOC").unwrap().values;
        assert!(ticks[0].is_nan(), "before the guest: unknown, not 0");
        assert_eq!(&ticks[1..], &[5.0, 5.0 + 10.0, 20.0]);
        assert_eq!(t.find(Entity::Guest(2), "irq.LOC").unwrap().total(), 40.0, "nothing lost or made up");
        // Row 1 ends at 200 inside the first guest row; rows 2 and 3 end in the second.
        let free = &t.find(Entity::Guest(2), "vmstat.nr_free_pages").unwrap().values;
        assert!(free[0].is_nan());
        assert_eq!(&free[1..], &[7.0, 9.0, 9.0]);
    }

    #[test]
    fn rows_are_found_by_time_and_vm_sums_add_vcpus() {
        let mut t = IntervalTable::new(10);
        let a = t.column_of(&series(Entity::Vcpu { pid: 1, index: 0 }, "x"));
        t.push_row(0, 0, 10, [(a, 1.0)]);
        let b = t.column_of(&series(Entity::Vcpu { pid: 1, index: 1 }, "x"));
        t.push_row(1, 10, 20, [(a, 2.0), (b, 5.0)]);
        assert_eq!((t.row_at(0), t.row_at(15), t.row_at(21)), (Some(0), Some(1), None));
        assert!(t.columns[b].values[0].is_nan(), "a column that did not exist yet is unknown there");
        t.add_vm_sums();
        assert_eq!(t.find(Entity::Vm(1), "x").unwrap().values, vec![1.0, 7.0]);
    }
}
