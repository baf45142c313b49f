// Draws `virtprof report --html` from the JSON embedded in the page (the same document
// `virtprof report --json` prints), with the helpers of page.js.
(function () {
  "use strict";
  const { COLORS, el, section, fmt, us, table, siAxis, heat, plot } = vp;
  const STATE_COLORS = { running: "#2ca02c", waiting: "#ff7f0e", blocked: "#9e9e9e" };

  function summary(D) {
    document.getElementById("subtitle").textContent = `${D.recording} — ${D.origin}, trace clock ${D.trace_clock}`;
    const s = section("Summary");
    const rows = [
      ["duration", D.duration_s === null ? "unknown" : fmt(D.duration_s, 3) + " s"],
      ["CPUs", D.cpus],
      ["trace events", fmt(D.events, 0)],
      ["lost events", D.lost_events_text + (D.truncated_at !== null ? ` (file cut short at byte ${D.truncated_at})` : "")],
      ["exits", `${fmt(D.exits.totals.exits, 0)} (${fmt(D.exits.totals.lightweight, 0)} lightweight, ${fmt(D.exits.totals.heavyweight, 0)} heavyweight), source ${D.exits.source.path}`],
    ];
    if (D.clock) rows.push(["clock", D.clock]);
    for (const [k, v] of Object.entries(D.host)) rows.push(["host " + k, v]);
    for (const vm of D.vms) rows.push([`VM ${vm.pid}`, `${vm.name} (${vm.kind}), ${vm.vcpus.length} vCPUs`]);
    s.append(table("facts", null, rows));
  }

  function exits(D) {
    const s = section("Exits", "Most frequent reasons; durations where the host emits them. " +
      D.exits.source.unavailable.map((u) => "Not available: " + u + ".").join(" "));
    s.append(table("grid", ["reason", "count", "count %", "time %", "total µs", "avg µs", "p50 µs", "p99 µs", "max µs", "light", "heavy"],
      D.exits.by_reason.map((r) => [r.reason, fmt(r.count, 0), fmt(r.count_pct, 2), fmt(r.time_pct, 2), us(r.total_ns),
        us(r.avg_ns), us(r.p50_ns), us(r.p99_ns), us(r.max_ns), fmt(r.lightweight, 0), fmt(r.heavyweight, 0)])));
    if (D.exits.histograms.length === 0) return;
    s.append(el("h3", {}, "Exit latency histograms (4 bins per octave, log scale)"));
    const box = el("div", { class: "charts" });
    s.append(box);
    D.exits.histograms.forEach((h, i) => {
      const bins = new Map();
      for (const [lo, n] of h.buckets) {
        const b = Math.floor(Math.log2(Math.max(lo, 1)) * 4);
        bins.set(b, (bins.get(b) || 0) + n);
      }
      const keys = [...bins.keys()].sort((a, b) => a - b);
      const x = keys.map((b) => Math.pow(2, b / 4) / 1000);
      const y = keys.map((b) => bins.get(b));
      plot(box, h.reason, {
        width: 370, height: 200,
        scales: { x: { time: false, distr: 3 }, y: { range: (u, lo, hi) => [0, hi * 1.05] } },
        axes: [{ label: "duration (µs)" }, siAxis("exits")],
        series: [{ label: "µs" }, { label: "exits", stroke: COLORS[i % COLORS.length], fill: COLORS[i % COLORS.length] + "88", paths: uPlot.paths.bars({ size: [0.8, 40] }) }],
      }, [x, y]);
    });
  }

  function accounting(D) {
    const drawn = D.timeline && D.timeline.vcpus.length > 0;
    if (!drawn && !D.accounting) return;
    const missing = D.accounting ? D.accounting.unavailable.map((u) => "Not available: " + u + ".").join(" ") : "";
    const s = section("vCPU run / wait / blocked" + (drawn ? " over time" : ""),
      (drawn ? `Percent of each ${fmt(D.timeline.bucket_ns / 1e6, 0)} ms bucket a vCPU thread spent running, waiting runnable (steal) and blocked, stacked. ` : "") + missing);
    if (D.accounting) {
      const rows = [];
      for (const vm of D.accounting.vms) for (const v of vm.vcpus)
        rows.push([`${vm.name} vCPU ${v.index}`, v.tid, fmt(v.running_pct, 1), fmt(v.waiting_pct, 1), fmt(v.blocked_pct, 1), fmt(v.exits, 0), fmt(v.exits_per_s, 0)]);
      s.append(table("grid", ["vCPU", "tid", "run %", "wait %", "blocked %", "exits", "exits/s"], rows));
      const roles = [];
      for (const vm of D.accounting.vms) for (const r of vm.roles)
        roles.push([vm.name, r.role, r.threads, fmt(r.cpus, 2), fmt(r.running_pct, 1), fmt(r.waiting_pct, 1), fmt(r.blocked_pct, 1),
          fmt(r.exec_count, 0), fmt(r.execs_per_s, 0), fmt(r.cpu_per_exec_us, 1), r.io_per_exec === null ? "unknown" : fmt(r.io_per_exec, 2)]);
      if (roles.some((r) => r[1] !== "vcpu")) {
        s.append(el("h3", {}, "Work for each VM by role: its vCPUs and the VMM's own threads (I/O thread, main loop, vhost worker)"));
        s.append(table("grid", ["VM", "role", "threads", "CPUs", "run %", "wait %", "blocked %", "executions", "executions/s", "CPU µs / execution", "VM I/O / execution"], roles));
      }
    }
    if (!drawn) return;
    const box = el("div", { class: "charts" });
    s.append(box);
    const t = D.timeline.t_s;
    for (const v of D.timeline.vcpus) {
      const rw = v.running_pct.map((r, i) => r + v.waiting_pct[i]);
      const rwb = rw.map((x, i) => x + v.blocked_pct[i]);
      plot(box, `VM ${v.vm} vCPU ${v.index} (tid ${v.tid})`, {
        width: 560, height: 200,
        scales: { x: { time: false }, y: { range: [0, 100] } },
        axes: [{ label: "s" }, { label: "%" }],
        series: [{ label: "s" },
          { label: "blocked", stroke: STATE_COLORS.blocked, fill: STATE_COLORS.blocked + "aa", value: (u, x, si, i) => fmt(v.blocked_pct[i]) },
          { label: "waiting", stroke: STATE_COLORS.waiting, fill: STATE_COLORS.waiting + "cc", value: (u, x, si, i) => fmt(v.waiting_pct[i]) },
          { label: "running", stroke: STATE_COLORS.running, fill: STATE_COLORS.running + "cc" }],
      }, [t, rwb, rw, v.running_pct]);
    }
  }

  function phases(D, I) {
    const p = I.phases;
    const s = section("Phases", `${p.k} phase(s) found by k-means over the interval vectors (silhouette ${fmt(p.silhouette, 2)}); ` +
      `changes at ${p.boundaries_ns.map((ns) => fmt(ns / 1e9, 3) + " s").join(", ") || "–"}.`);
    const strip = el("div", { class: "phases" });
    const ids = p.ids;
    let start = 0;
    for (let i = 1; i <= ids.length; i++) {
      if (i === ids.length || ids[i] !== ids[start]) {
        const seg = el("div", { title: `phase ${ids[start]}: rows ${start}–${i - 1}` });
        seg.style.flex = String(i - start);
        seg.style.background = COLORS[ids[start] % COLORS.length];
        strip.append(seg);
        start = i;
      }
    }
    s.append(strip);
    const legend = el("div", { class: "legend-row" });
    for (let k = 0; k < p.k; k++) {
      const sw = el("span", {}, el("i", { class: "swatch" }), `phase ${k}`);
      sw.firstChild.style.background = COLORS[k % COLORS.length];
      legend.append(sw);
    }
    s.append(legend);
  }

  function timelines(D, I) {
    const s = section("Metrics over time", `All vCPUs and CPUs summed, per second; ${fmt(I.rows, 0)} intervals of ${fmt(I.interval_ns / 1e6, 2)} ms.`);
    const box = el("div", { class: "charts" });
    s.append(box);
    const t = I.series.t_s;
    I.series.metrics.forEach((m, i) => {
      plot(box, m.name, {
        width: 370, height: 170,
        scales: { x: { time: false } },
        axes: [{ label: "s" }, siAxis("")],
        series: [{ label: "s" }, { label: "per s", stroke: COLORS[i % COLORS.length] }],
        legend: { show: false },
      }, [t, m.per_s]);
    });
  }

  function heatmap(D, I) {
    const M = I.matrix;
    const s = section("Correlation", `${M.method} correlation between host-level metrics over the intervals (blue −1, white 0, red +1; grey: undefined).`);
    if (I.correlations.length) {
      s.append(table("grid", ["r", "metric", "metric"], I.correlations.map((c) => [fmt(c.r, 2), c.a, c.b])));
    }
    s.append(heat(M.names, M.r));
    if (I.unavailable.length) {
      s.append(el("h3", {}, "Not counted on this host"));
      s.append(table("grid", ["counter", "reason"], I.unavailable));
    }
  }

  // perf counters per VM and CPU: how much of each was measured (a counter taking turns on
  // the PMU is scaled up from its share), and those this host could not count.
  function counters(I) {
    const m = I.metrics.filter((x) => x.metric.startsWith("perf."));
    if (!m.length && !I.unavailable.length) return;
    const s = section("Counters", "perf counters over the run; measured: the share of the time a counter that took turns on the PMU was counting (its total is scaled up from it), – where it always counted.");
    s.append(table("grid", ["entity", "counter", "unit", "total", "per s", "measured"],
      m.map((x) => [x.entity, x.metric, x.unit, fmt(x.total, 0), fmt(x.per_second, 1), x.measured === null || x.measured === undefined ? "–" : fmt(100 * x.measured, 0) + " %"])));
  }

  function guests(D) {
    for (const g of D.guests) {
      const c = g.clock;
      const s = section(`Guest ${g.name} (inside view)`,
        `agent ${g.agent} at ${g.address}: ${g.rows} rows of ${fmt(g.interval_ns / 1e6, 0)} ms placed on this recording's clock.`);
      const rows = [
        ["kernel", g.kernel], ["CPUs", g.cpus], ["clocksource", g.clocksource + (g.ptp_kvm ? `, ptp_kvm ${g.ptp_kvm}` : "")],
        ["clock", c.offset_ns === null ? "never measured" :
          `guest − host ${fmt(c.offset_ns / 1e6, 3)} ms, drift ${fmt(c.drift_ppm, 2)} ppm, bound ±${fmt(c.median_bound_ns / 1e3, 1)} µs (median), ±${fmt(c.max_bound_ns / 1e3, 1)} µs (max), ${c.points} points from ${c.source}`],
      ];
      if (g.link) rows.push(["exchanges", `${g.link.exchanges_checked} checked, ${g.link.exchanges_outside} outside their bound; ${g.link.garbage_bytes} garbage bytes, ${g.link.bad_frames} bad frames`]);
      if (g.markers) {
        const m = g.markers;
        rows.push(["markers", `${m.written} written to port 0x${m.port.toString(16)}, ${m.matched} traced (kvm_pio), ${m.outside} outside their bound; largest error ${fmt(m.max_error_ns / 1e3, 1)} µs against ±${fmt(m.max_bound_ns / 1e3, 1)} µs`]);
      }
      for (const n of g.noise) {
        rows.push([`noise CPU ${n.cpu}`, `${n.samples} samples in ${n.periods} periods (${fmt(n.measured_ns / 1e9, 3)} s), ${fmt(n.measured_ns ? 100 * n.noise_ns / n.measured_ns : 0, 3)} % of the time, largest ${fmt(n.max_single_ns / 1e3, 1)} µs`]);
      }
      s.append(table("facts", null, rows));
      if (g.gaps.length) s.append(table("grid", ["from s", "to s", "gap"], g.gaps.map((x) => [fmt(x.from_s, 3), fmt(x.to_s, 3), x.cause])));
      const T = g.timeline;
      if (T.t_s.length > 1) {
        const fields = ["user", "system", "iowait", "irq", "softirq", "steal", "idle"];
        const box = el("div", { class: "charts" });
        s.append(box);
        plot(box, "guest CPU time (% of all its CPUs)", {
          width: 760, height: 220,
          scales: { x: { time: false }, y: { range: [0, 100] } },
          axes: [{ label: "s" }, { label: "%" }],
          series: [{ label: "s" }].concat(fields.map((f, i) => ({ label: f, stroke: COLORS[i % COLORS.length] }))),
        }, [T.t_s].concat(fields.map((f) => T.cpu_pct[f])));
      }
      const m = g.metrics.filter((x) => x.total !== 0);
      s.append(table("grid", ["metric", "unit", "total", "per s"], m.map((x) => [x.metric, x.unit, fmt(x.total, 0), x.per_second === null ? "level" : fmt(x.per_second, 1)])));
      if (g.unavailable.length) s.append(table("grid", ["not sampled", "reason"], g.unavailable));
    }
  }

  function guestTrace(D) {
    const g = D.guest_trace;
    if (!g) return;
    const s = section(`Guest ${g.name} (its own trace)`,
      `${g.placement}. ${fmt(g.events, 0)} events, lost events: ${g.lost_events_text}. Busy: a guest task ran (steal it suffered included, as the guest's clock runs on). ` +
      g.unavailable.map((u) => `Not available: ${u.figure}: ${u.reason}.`).join(" "));
    s.append(table("grid", ["guest CPU", "host thread", "observed s", "busy %", "busy s", "idle s", "switches", "IRQs", "softirqs", "longest tasks"],
      g.cpus.map((c) => [c.guest_cpu, c.host_tid === null ? "–" : c.host_tid, fmt(c.observed_ns === null ? null : c.observed_ns / 1e9, 3),
        fmt(c.busy_pct, 1), fmt(c.busy_ns === null ? null : c.busy_ns / 1e9, 3), fmt(c.idle_ns === null ? null : c.idle_ns / 1e9, 3),
        fmt(c.switches, 0), fmt(c.irqs, 0), fmt(c.softirqs, 0),
        c.top_tasks === null ? fmt(null) : c.top_tasks.map((t) => `${t.name}[${t.tid}] ${fmt(t.ns / 1e6, 1)} ms`).join(", ")])));
  }

  vp.run((D) => {
    summary(D);
    exits(D);
    accounting(D);
    if (D.intervals) {
      phases(D, D.intervals);
      timelines(D, D.intervals);
      heatmap(D, D.intervals);
      counters(D.intervals);
    }
    guests(D);
    guestTrace(D);
  });
})();
