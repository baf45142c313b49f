// `balance --html` and `balance bench --html`: per-core energy gap and temperature over time,
// the replay's gap with and without the policy, and the bench's overhead table and plots.
vp.run((d) => {
  const gapChart = (parent, title, series) => {
    const xs = series[0].points.map((p) => p[0]);
    vp.plot(parent, title, {
      width: 760,
      scales: { x: { time: false } },
      axes: [{ label: "seconds" }, vp.siAxis("energy gap (J)")],
      series: [{}].concat(series.map((s, i) => ({ label: s.label, stroke: vp.COLORS[i], width: 2 }))),
    }, [xs].concat(series.map((s) => s.points.map((p) => p[1]))));
  };
  const coreChart = (parent, title, label, periods, cpus, pick) => {
    vp.plot(parent, title, {
      width: 760,
      scales: { x: { time: false } },
      axes: [{ label: "seconds" }, vp.siAxis(label)],
      series: [{}].concat(cpus.map((cpu, i) => ({ label: "CPU " + cpu, stroke: vp.COLORS[i % 10], width: 2 }))),
    }, [periods.map((p) => p.t_s)].concat(cpus.map((_, c) => periods.map((p) => pick(p.cores[c])))));
  };

  if (d.kind === "run") {
    const s = vp.section("Per-core energy", d.mode + ", " + d.swap_count + " swaps (" + vp.fmt(d.swaps_per_s, 2) + "/s), final gap " + vp.fmt(d.gap_j, 3) + " J, seed bound " + vp.fmt(d.bound_j, 3) + " J");
    s.append(vp.table("summary", ["CPU", "energy J", "mean W", "temp °C"], d.cores.map((c) => [c.cpu, vp.fmt(c.total_j, 2), vp.fmt(c.mean_w, 2), vp.fmt(c.temp_c, 1)])));
    gapChart(s, "Largest per-core energy difference", [{ label: "gap", points: d.periods.map((p) => [p.t_s, p.gap_j]) }]);
    coreChart(s, "Energy since start", "J", d.periods, d.cpus, (c) => c.total_j);
    coreChart(s, "Temperature estimate (RC model)", "°C", d.periods, d.cpus, (c) => c.temp_c);
  } else if (d.kind === "replay") {
    const s = vp.section("Replay of " + d.file, d.vcpus.length + " vCPUs on " + d.cores + " cores, k " + d.k + ", " + vp.fmt(d.swaps_per_s, 2) + " swaps/s; seed bound " + vp.fmt(d.bound_j, 3) + " J");
    gapChart(s, "Per-core energy gap", [
      { label: "mapping kept", points: d.points.map((p) => [p.t_s, p.gap_without_j]) },
      { label: "policy", points: d.points.map((p) => [p.t_s, p.gap_with_j]) },
    ]);
  } else if (d.kind === "bench") {
    if (d.overhead.length) {
      const s = vp.section("(a) Forced-swap overhead", "two compute vCPUs on CPUs " + d.cpus.join(",") + "; throughput from the guests' own counters (median of repetitions)");
      s.append(vp.table("summary", ["freq Hz", "swaps/s", "missed/due", "iterations/s", "loss %"], d.overhead.map((o) => [o.freq_hz, vp.fmt(o.swaps_per_s, 1), o.ticks_missed + "/" + o.ticks_due, vp.fmt(o.throughput, 0), vp.fmt(o.loss_pct, 2)])));
      const xs = d.overhead.map((_, i) => i);
      vp.plot(s, "Performance loss against swap frequency", {
        width: 760,
        scales: { x: { time: false } },
        axes: [{ label: "swap frequency (Hz)", values: (u, ticks) => ticks.map((t) => (Number.isInteger(t) && d.overhead[t] ? d.overhead[t].freq_hz : "")) }, { label: "loss %" }],
        series: [{}, { label: "loss %", stroke: vp.COLORS[3], width: 2, points: { size: 7 } }],
      }, [xs, d.overhead.map((o) => o.loss_pct)]);
    }
    if (d.policy) {
      const p = d.policy;
      const s = vp.section("(b) Hot and cold vCPU", "k " + p.k + ", period " + vp.fmt(p.period_s * 1000, 0) + " ms: gap " + vp.fmt(p.gap_without_j, 2) + " J without (+" + vp.fmt(p.slope_without_j_per_s, 3) + " J/s), " + vp.fmt(p.gap_with_j, 3) + " J with the policy (bound " + vp.fmt(p.bound_j, 3) + " J), " + vp.fmt(p.swaps_per_s, 2) + " swaps/s");
      gapChart(s, "Per-core energy gap over time", [
        { label: "mapping kept", points: p.without },
        { label: "policy", points: p.with.length === p.without.length ? p.with : p.without.map((q, i) => [q[0], (p.with[i] || p.with[p.with.length - 1])[1]]) },
      ]);
    }
  }
});
