//! `--format parquet`: a directory of Parquet tables (schemas in docs/export.md) for DuckDB,
//! pandas, Polars or Spark:
//! - `events.parquet`: every trace event, one row each, streamed in row groups of 64 Ki rows;
//! - `exits.parquet`: one row per timed exit (reason, duration and its split);
//! - `intervals.parquet` (recordings with interval rows): the interval table in long form,
//!   one row per interval, entity and metric;
//! - `exit_reasons.parquet`, `sched.parquet`: `exits --json`'s reasons and `sched --json`'s
//!   vCPUs over the whole recording (the dataset's per-recording summaries).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use arrow_array::builder::{ArrayBuilder, BooleanBuilder, Float64Builder, StringBuilder, UInt32Builder, UInt64Builder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use virtprof_analysis::exits::{ExitRow, ReasonRow};
use virtprof_analysis::intervals::IntervalTable;
use virtprof_analysis::qos::{RoleRow, VcpuRow, VmRow, WindowReport};
use virtprof_analysis::{Analyzer, Names};
use virtprof_model::{Event, EventKind};

use virtprof_host::output::{OutputFile, Privacy};

use crate::{Result, SinkError};

/// Rows per row group (and per batch held in memory).
const BATCH: usize = 1 << 16;

fn writer(path: &Path, schema: &SchemaRef) -> Result<ArrowWriter<OutputFile>> {
    let file = OutputFile::create(path, Privacy::Shared)?;
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_row_count(Some(BATCH))
        .build();
    Ok(ArrowWriter::try_new(file, schema.clone(), Some(props))?)
}

fn field(name: &str, data_type: DataType, nullable: bool) -> Field {
    Field::new(name, data_type, nullable)
}

/// The last four columns of the long-form tables: metric, unit, kind and value (null when
/// unknown).
struct MetricColumns {
    metric: StringBuilder,
    unit: StringBuilder,
    kind: StringBuilder,
    value: Float64Builder,
}

impl MetricColumns {
    fn with_capacity(n: usize) -> MetricColumns {
        MetricColumns {
            metric: StringBuilder::new(),
            unit: StringBuilder::new(),
            kind: StringBuilder::new(),
            value: Float64Builder::with_capacity(n),
        }
    }

    fn fields() -> [Field; 4] {
        [
            field("metric", DataType::Utf8, false),
            field("unit", DataType::Utf8, false),
            field("kind", DataType::Utf8, false),
            field("value", DataType::Float64, true),
        ]
    }

    fn push(&mut self, metric: &str, unit: &str, kind: &str, value: f64) {
        self.metric.append_value(metric);
        self.unit.append_value(unit);
        self.kind.append_value(kind);
        self.value.append_option(value.is_finite().then_some(value));
    }

    fn finish(mut self) -> [ArrayRef; 4] {
        [
            Arc::new(self.metric.finish()),
            Arc::new(self.unit.finish()),
            Arc::new(self.kind.finish()),
            Arc::new(self.value.finish()),
        ]
    }
}

/// A reason to name: (0 for `kvm_exit`, 1 for `kvm_userspace_exit`, reason, isa).
type ReasonKey = (u8, u32, u32);

/// Streams events into `events.parquet`.
pub struct EventTable {
    schema: SchemaRef,
    writer: ArrowWriter<OutputFile>,
    ts: UInt64Builder,
    cpu: UInt32Builder,
    tid: UInt32Builder,
    event: StringBuilder,
    reason: StringBuilder,
    target_tid: UInt32Builder,
    value: UInt64Builder,
    /// Reason names by (kind, reason, isa), named once.
    reasons: HashMap<ReasonKey, String>,
    /// The first write error; later events are dropped once one happened.
    pub error: Option<SinkError>,
    /// Rows appended.
    pub rows: u64,
}

impl EventTable {
    /// Start the table at `path`.
    pub fn create(path: &Path) -> Result<Self> {
        let schema = Arc::new(Schema::new(vec![
            field("ts_ns", DataType::UInt64, false),
            field("cpu", DataType::UInt32, false),
            field("tid", DataType::UInt32, false),
            field("event", DataType::Utf8, false),
            field("reason", DataType::Utf8, true),
            field("target_tid", DataType::UInt32, true),
            field("value", DataType::UInt64, true),
        ]));
        Ok(EventTable {
            writer: writer(path, &schema)?,
            schema,
            ts: UInt64Builder::with_capacity(BATCH),
            cpu: UInt32Builder::with_capacity(BATCH),
            tid: UInt32Builder::with_capacity(BATCH),
            event: StringBuilder::with_capacity(BATCH, BATCH * 12),
            reason: StringBuilder::with_capacity(BATCH, BATCH * 4),
            target_tid: UInt32Builder::with_capacity(BATCH),
            value: UInt64Builder::with_capacity(BATCH),
            reasons: HashMap::new(),
            error: None,
            rows: 0,
        })
    }

    /// Append one event (nothing after a write error).
    fn append(&mut self, e: &Event, names: &dyn Names) {
        if self.error.is_some() {
            return;
        }
        let untyped;
        let name = match e.kind {
            EventKind::Other { event }
            | EventKind::IrqVectorEntry { event, .. }
            | EventKind::IrqVectorExit { event, .. } => {
                untyped = names.event(event);
                untyped.as_str()
            }
            EventKind::Lost { .. } => "lost",
            kind => kind.typed_name().unwrap_or("unknown"),
        };
        let (reason, target, value): (Option<ReasonKey>, Option<u32>, Option<u64>) = match e.kind {
            EventKind::KvmExit { reason, isa, guest_rip, .. } => (Some((0, reason, isa)), None, Some(guest_rip)),
            EventKind::KvmUserspaceExit { reason, .. } => (Some((1, reason, 0)), None, None),
            EventKind::KvmEntry { rip, .. } => (None, None, Some(rip)),
            EventKind::KvmPio { port, .. } => (None, None, Some(u64::from(port))),
            EventKind::KvmMmio { gpa, .. } => (None, None, Some(gpa)),
            EventKind::KvmEmulateInsn { rip, .. } => (None, None, Some(rip)),
            EventKind::SchedSwitch { prev_state, next_tid, .. } => (None, Some(next_tid), Some(u64::from(prev_state))),
            EventKind::SchedWakeup { tid, target_cpu } => (None, Some(tid), Some(u64::from(target_cpu))),
            EventKind::SchedMigrate { tid, dest_cpu, .. } => (None, Some(tid), Some(u64::from(dest_cpu))),
            EventKind::SchedFork { parent_tid, child_tid } => (None, Some(child_tid), Some(u64::from(parent_tid))),
            EventKind::IrqEntry { irq } | EventKind::IrqExit { irq } => (None, None, Some(u64::from(irq))),
            EventKind::SoftirqEntry { vec } | EventKind::SoftirqExit { vec } | EventKind::SoftirqRaise { vec } => {
                (None, None, Some(u64::from(vec)))
            }
            EventKind::IrqVectorEntry { vector, .. } | EventKind::IrqVectorExit { vector, .. } => {
                (None, None, Some(u64::from(vector)))
            }
            EventKind::Lost { count } => (None, None, count),
            EventKind::KvmFpu { load } => (None, None, Some(u64::from(load))),
            EventKind::KvmVcpuWakeup { ns, .. } => (None, None, Some(ns)),
            EventKind::Nmi { handler_ns } => (None, None, Some(handler_ns)),
            EventKind::Other { .. } => (None, None, None),
        };
        self.ts.append_value(e.ts);
        self.cpu.append_value(e.cpu);
        self.tid.append_value(e.tid);
        self.event.append_value(name);
        match reason {
            Some(key) => {
                let text = self.reasons.entry(key).or_insert_with(|| match key {
                    (0, reason, isa) => names.exit_reason(reason, isa),
                    (_, reason, _) => names.userspace_reason(reason),
                });
                self.reason.append_value(text.as_str());
            }
            None => self.reason.append_null(),
        }
        self.target_tid.append_option(target);
        self.value.append_option(value);
        self.rows += 1;
        if self.ts.len() >= BATCH {
            if let Err(err) = self.flush() {
                self.error = Some(err);
            }
        }
    }

    fn flush(&mut self) -> Result<()> {
        if self.ts.is_empty() {
            return Ok(());
        }
        let columns: Vec<ArrayRef> = vec![
            Arc::new(self.ts.finish()),
            Arc::new(self.cpu.finish()),
            Arc::new(self.tid.finish()),
            Arc::new(self.event.finish()),
            Arc::new(self.reason.finish()),
            Arc::new(self.target_tid.finish()),
            Arc::new(self.value.finish()),
        ];
        self.writer.write(&RecordBatch::try_new(self.schema.clone(), columns)?)?;
        Ok(())
    }

    /// Write what is buffered and the file footer.
    pub fn finish(mut self) -> Result<u64> {
        if let Some(err) = self.error.take() {
            return Err(err);
        }
        self.flush()?;
        self.writer.into_inner()?.commit()?;
        Ok(self.rows)
    }
}

/// Write `exits.parquet`; returns the rows written.
pub fn write_exits(path: &Path, rows: &[ExitRow]) -> Result<u64> {
    let schema = Arc::new(Schema::new(vec![
        field("exit_ts_ns", DataType::UInt64, false),
        field("tid", DataType::UInt32, false),
        field("reason", DataType::Utf8, false),
        field("exit_cpu", DataType::UInt32, false),
        field("entry_cpu", DataType::UInt32, false),
        field("duration_ns", DataType::UInt64, false),
        // Null where the source did not record what the figure needs (kvm_userspace_exit,
        // sched_switch): unknown, not zero.
        field("heavyweight", DataType::Boolean, true),
        field("vmm_ns", DataType::UInt64, true),
        field("preempted_ns", DataType::UInt64, true),
        field("blocked_ns", DataType::UInt64, true),
        field("overhead_ns", DataType::UInt64, true),
        field("irqs", DataType::UInt64, true),
        field("softirqs", DataType::UInt64, true),
    ]));
    let mut w = writer(path, &schema)?;
    for chunk in rows.chunks(BATCH) {
        let u64s = |f: fn(&ExitRow) -> u64| -> ArrayRef {
            let mut b = UInt64Builder::with_capacity(chunk.len());
            chunk.iter().for_each(|r| b.append_value(f(r)));
            Arc::new(b.finish())
        };
        let u32s = |f: fn(&ExitRow) -> u32| -> ArrayRef {
            let mut b = UInt32Builder::with_capacity(chunk.len());
            chunk.iter().for_each(|r| b.append_value(f(r)));
            Arc::new(b.finish())
        };
        let known = |f: fn(&ExitRow) -> Option<u64>| -> ArrayRef {
            let mut b = UInt64Builder::with_capacity(chunk.len());
            chunk.iter().for_each(|r| b.append_option(f(r)));
            Arc::new(b.finish())
        };
        let mut reason = StringBuilder::new();
        chunk.iter().for_each(|r| reason.append_value(&r.reason));
        let mut heavy = BooleanBuilder::with_capacity(chunk.len());
        chunk.iter().for_each(|r| heavy.append_option(r.heavyweight));
        let columns: Vec<ArrayRef> = vec![
            u64s(|r| r.exit_ts),
            u32s(|r| r.tid),
            Arc::new(reason.finish()),
            u32s(|r| r.exit_cpu),
            u32s(|r| r.entry_cpu),
            u64s(|r| r.duration_ns),
            Arc::new(heavy.finish()),
            known(|r| r.vmm_ns),
            known(|r| r.preempted_ns),
            known(|r| r.blocked_ns),
            known(|r| r.overhead_ns),
            known(|r| r.irqs),
            known(|r| r.softirqs),
        ];
        w.write(&RecordBatch::try_new(schema.clone(), columns)?)?;
    }
    w.into_inner()?.commit()?;
    Ok(rows.len() as u64)
}

/// Write `intervals.parquet` in long form (unknown values as nulls); returns the rows written.
pub fn write_intervals(path: &Path, table: &IntervalTable) -> Result<u64> {
    let schema = Arc::new(Schema::new(
        vec![
            field("interval", DataType::UInt64, false),
            field("start_ns", DataType::UInt64, false),
            field("end_ns", DataType::UInt64, false),
            field("entity", DataType::Utf8, false),
        ]
        .into_iter()
        .chain(MetricColumns::fields())
        .collect::<Vec<_>>(),
    ));
    let mut w = writer(path, &schema)?;
    let mut written = 0u64;
    for c in &table.columns {
        let entity = c.series.entity.to_string();
        let kind = format!("{:?}", c.series.kind).to_lowercase();
        for first in (0..table.rows()).step_by(BATCH) {
            let rows = first..(first + BATCH).min(table.rows());
            let n = rows.len();
            let (mut index, mut start, mut end) =
                (UInt64Builder::with_capacity(n), UInt64Builder::with_capacity(n), UInt64Builder::with_capacity(n));
            let mut ent = StringBuilder::new();
            let mut metrics = MetricColumns::with_capacity(n);
            for r in rows {
                index.append_value(table.index[r]);
                start.append_value(table.start_ns[r]);
                end.append_value(table.end_ns[r]);
                ent.append_value(&entity);
                metrics.push(&c.series.metric, &c.series.unit, &kind, c.values[r]);
            }
            let mut columns: Vec<ArrayRef> = vec![
                Arc::new(index.finish()),
                Arc::new(start.finish()),
                Arc::new(end.finish()),
                Arc::new(ent.finish()),
            ];
            columns.extend(metrics.finish());
            w.write(&RecordBatch::try_new(schema.clone(), columns)?)?;
            written += n as u64;
        }
    }
    w.into_inner()?.commit()?;
    Ok(written)
}

/// Write `guests.parquet` in long form: one row per guest row and series, with its guest and
/// host (recording clock) times and the alignment's bound; returns the rows written.
pub fn write_guests(path: &Path, layers: &[virtprof_model::guest::GuestLayer]) -> Result<u64> {
    let schema = Arc::new(Schema::new(
        vec![
            field("agent", DataType::UInt64, false),
            field("guest", DataType::Utf8, false),
            field("guest_start_ns", DataType::UInt64, false),
            field("guest_end_ns", DataType::UInt64, false),
            field("start_ns", DataType::UInt64, false),
            field("end_ns", DataType::UInt64, false),
            field("bound_ns", DataType::UInt64, false),
        ]
        .into_iter()
        .chain(MetricColumns::fields())
        .collect::<Vec<_>>(),
    ));
    let mut w = writer(path, &schema)?;
    let mut written = 0u64;
    for layer in layers {
        for (i, s) in layer.series.iter().enumerate() {
            let kind = format!("{:?}", s.kind).to_lowercase();
            let n = layer.rows.len();
            let mut times: Vec<UInt64Builder> = (0..6).map(|_| UInt64Builder::with_capacity(n)).collect();
            let mut guest = StringBuilder::new();
            let mut metrics = MetricColumns::with_capacity(n);
            for r in &layer.rows {
                let words =
                    [u64::from(layer.agent), r.guest_start_ns, r.guest_end_ns, r.start_ns, r.end_ns, r.bound_ns];
                for (b, v) in times.iter_mut().zip(words) {
                    b.append_value(v);
                }
                guest.append_value(&layer.name);
                metrics.push(&s.name, &s.unit, &kind, r.values.get(i).copied().unwrap_or(f64::NAN));
            }
            let mut columns: Vec<ArrayRef> = times.iter_mut().map(|b| Arc::new(b.finish()) as ArrayRef).collect();
            columns.insert(1, Arc::new(guest.finish()));
            columns.extend(metrics.finish());
            w.write(&RecordBatch::try_new(schema.clone(), columns)?)?;
            written += n as u64;
        }
    }
    w.into_inner()?.commit()?;
    Ok(written)
}

impl Analyzer for EventTable {
    fn on_event(&mut self, event: &Event, names: &dyn Names) {
        self.append(event, names);
    }
}

/// Build one column from rows.
fn column<R, B: ArrayBuilder + Default>(rows: &[R], mut push: impl FnMut(&mut B, &R)) -> ArrayRef {
    let mut b = B::default();
    rows.iter().for_each(|r| push(&mut b, r));
    ArrayBuilder::finish(&mut b)
}

/// Write `exit_reasons.parquet`: one row per exit reason, as `exits --json` lists them (so a
/// dataset sums to the same counts); returns the rows written.
pub fn write_exit_reasons(path: &Path, rows: &[ReasonRow]) -> Result<u64> {
    // Null where unknown: a split the source did not record, a reason without durations.
    let u64s = ["count", "lightweight", "heavyweight", "descheduled"];
    let timed = ["total_ns", "min_ns", "p50_ns", "p99_ns", "max_ns", "vmm_ns"];
    let schema = Arc::new(Schema::new(
        std::iter::once(field("reason", DataType::Utf8, false))
            .chain(u64s.iter().map(|n| field(n, DataType::UInt64, *n != "count")))
            .chain(timed.iter().map(|n| field(n, DataType::UInt64, true)))
            .chain(std::iter::once(field("guest_idle", DataType::Boolean, false)))
            .collect::<Vec<_>>(),
    ));
    let counts: [fn(&ReasonRow) -> Option<u64>; 4] =
        [|r| Some(r.count), |r| r.lightweight, |r| r.heavyweight, |r| r.descheduled];
    let times: [fn(&ReasonRow) -> Option<u64>; 6] =
        [|r| r.total_ns, |r| r.min_ns, |r| r.p50_ns, |r| r.p99_ns, |r| r.max_ns, |r| r.vmm_ns];
    let mut columns = vec![column(rows, |b: &mut StringBuilder, r: &ReasonRow| b.append_value(&r.reason))];
    columns.extend(counts.iter().map(|f| column(rows, |b: &mut UInt64Builder, r| b.append_option(f(r)))));
    columns.extend(times.iter().map(|f| column(rows, |b: &mut UInt64Builder, r| b.append_option(f(r)))));
    columns.push(column(rows, |b: &mut BooleanBuilder, r: &ReasonRow| b.append_value(r.guest_idle)));
    let mut w = writer(path, &schema)?;
    w.write(&RecordBatch::try_new(schema, columns)?)?;
    w.into_inner()?.commit()?;
    Ok(rows.len() as u64)
}

/// The VM's identity columns (name, VMM kind, uuid, libvirt domain, pod, container) of rows
/// that each belong to a VM: what `sched.parquet` and `roles.parquet` both start with.
fn vm_identity<R>(rows: &[R], vm: fn(&R) -> &VmRow) -> (Vec<Field>, Vec<ArrayRef>) {
    let names = ["vm", "vmm", "uuid", "libvirt_domain", "pod_uid", "container_id"];
    let texts: [fn(&VmRow) -> Option<String>; 6] = [
        |v| Some(v.name.clone()),
        |v| Some(v.kind.clone()),
        |v| v.owner.uuid.clone(),
        |v| v.owner.libvirt_domain.clone(),
        |v| v.owner.pod_uid.clone(),
        |v| v.owner.container_id.clone(),
    ];
    let fields = names.iter().enumerate().map(|(i, n)| field(n, DataType::Utf8, i >= 2)).collect();
    let columns = texts.iter().map(|f| column(rows, |b: &mut StringBuilder, r| b.append_option(f(vm(r))))).collect();
    (fields, columns)
}

/// Write `sched.parquet`: one row per vCPU over the whole recording (what `sched --json`
/// shows), with its VM's identity; returns the rows written.
pub fn write_sched(path: &Path, window: &WindowReport) -> Result<u64> {
    type Row<'a> = (&'a VmRow, &'a VcpuRow);
    let rows: Vec<Row> = window.vms.iter().flat_map(|vm| vm.vcpus.iter().map(move |v| (vm, v))).collect();
    let ids = ["pid", "vcpu", "tid"];
    // Null where the source lacks the events a figure needs (`window.unavailable` says why).
    let times = ["run_ns", "wait_ns", "blocked_ns", "exec_count", "exits", "io_count"];
    let (mut fields, mut columns) = vm_identity(&rows, |r| r.0);
    fields.extend(ids.iter().map(|n| field(n, DataType::UInt32, false)));
    fields.extend(times.iter().map(|n| field(n, DataType::UInt64, true)));
    let schema = Arc::new(Schema::new(fields));
    let id_of: [fn(&Row) -> u32; 3] = [|r| r.0.pid, |r| r.1.index, |r| r.1.tid];
    let time_of: [fn(&Row) -> Option<u64>; 6] =
        [|r| r.1.run_ns, |r| r.1.wait_ns, |r| r.1.blocked_ns, |r| r.1.exec_count, |r| r.1.exits, |r| r.1.io_count];
    columns.extend(id_of.iter().map(|f| column(&rows, |b: &mut UInt32Builder, r| b.append_value(f(r)))));
    columns.extend(time_of.iter().map(|f| column(&rows, |b: &mut UInt64Builder, r| b.append_option(f(r)))));
    let mut w = writer(path, &schema)?;
    w.write(&RecordBatch::try_new(schema, columns)?)?;
    w.into_inner()?.commit()?;
    Ok(rows.len() as u64)
}

/// Write `roles.parquet`: one row per thread role of each VM over the whole recording (the
/// vCPUs, the VMM's main loop, its I/O threads, vhost workers, ...: `sched --json`'s `roles`),
/// with its VM's identity; returns the rows written.
pub fn write_roles(path: &Path, window: &WindowReport) -> Result<u64> {
    type Row<'a> = (&'a VmRow, &'a RoleRow);
    let rows: Vec<Row> = window.vms.iter().flat_map(|vm| vm.roles.iter().map(move |r| (vm, r))).collect();
    let times = ["run_ns", "wait_ns", "blocked_ns", "exec_count"];
    let (mut fields, mut columns) = vm_identity(&rows, |r| r.0);
    fields.push(field("pid", DataType::UInt32, false));
    fields.push(field("role", DataType::Utf8, false));
    fields.push(field("threads", DataType::UInt64, false));
    fields.extend(times.iter().map(|n| field(n, DataType::UInt64, true)));
    fields.push(field("cpus", DataType::Float64, true));
    fields.push(field("io_per_exec", DataType::Float64, true));
    let schema = Arc::new(Schema::new(fields));
    columns.push(column(&rows, |b: &mut UInt32Builder, r: &Row| b.append_value(r.0.pid)));
    columns.push(column(&rows, |b: &mut StringBuilder, r: &Row| b.append_value(r.1.role.to_string())));
    columns.push(column(&rows, |b: &mut UInt64Builder, r: &Row| b.append_value(r.1.threads as u64)));
    let time_of: [fn(&Row) -> Option<u64>; 4] =
        [|r| r.1.run_ns, |r| r.1.wait_ns, |r| r.1.blocked_ns, |r| r.1.exec_count];
    columns.extend(time_of.iter().map(|f| column(&rows, |b: &mut UInt64Builder, r| b.append_option(f(r)))));
    columns.push(column(&rows, |b: &mut Float64Builder, r: &Row| b.append_option(r.1.cpus)));
    columns.push(column(&rows, |b: &mut Float64Builder, r: &Row| b.append_option(r.1.io_per_exec)));
    let mut w = writer(path, &schema)?;
    w.write(&RecordBatch::try_new(schema, columns)?)?;
    w.into_inner()?.commit()?;
    Ok(rows.len() as u64)
}
