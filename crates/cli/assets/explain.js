// Draws `virtprof explain --html` from the JSON embedded in the page (the same document
// `virtprof explain --json` prints), with the helpers of page.js.
(function () {
  "use strict";
  const { COLORS, el, section, fmt, table, plot } = vp;
  const ms = (ns) => (ns === null || ns === undefined ? fmt(null) : fmt(ns / 1e6, 1) + " ms");

  function vm(D, v) {
    const window = v.seconds === null ? "duration unknown" : fmt(v.seconds, 3) + " s";
    const s = section(`VM ${v.name} (pid ${v.pid}): ${v.verdict}`,
      `${v.vcpus} vCPUs over ${window}; lost ${ms(v.lost_ns)} (${v.lost_pct === null ? "unknown" : fmt(v.lost_pct, 1) + " %"} of its vCPU time).`);
    const t = v.time;
    s.append(table("facts", null, [
      ["running", ms(t.running_ns)], ["of which in exits", ms(t.exits_ns)], ["of which in host interrupts", ms(t.host_irq_ns)],
      ["waiting for a CPU", ms(t.waiting_ns)], ["blocked", ms(t.blocked_ns)],
    ]));
    if (v.causes.length) {
      s.append(table("grid", ["#", "cause", "share of lost", "of vCPU time", "what", "evidence", "rules out", "try", "see"],
        v.causes.map((c, i) => [i + 1, c.kind, c.share_pct === null ? fmt(null) : fmt(c.share_pct, 0) + " %",
          c.vcpu_time_pct === null ? fmt(null) : fmt(c.vcpu_time_pct, 1) + " %", c.summary, c.evidence.join("; "),
          c.rules_out.join("; "), c.fix, c.see.join("; ")])));
    }
    if (v.cannot_tell.length) {
      s.append(table("grid", ["cannot tell", "why", "to tell"], v.cannot_tell.map((c) => [c.what, c.why, c.record])));
    }
    const T = v.timeline;
    if (!T || !T.series.length || v.verdict === "nothing to explain") return;
    const box = el("div", { class: "charts" });
    s.append(box);
    plot(box, `lost time per ${fmt(T.bin_ns / 1e6, 1)} ms, by cause (ms, summed over vCPUs)`, {
      width: 760, height: 240,
      scales: { x: { time: false } },
      axes: [{ label: "s" }, { label: "ms" }],
      series: [{ label: "s" }].concat(T.series.map((x, i) => ({ label: x.label, stroke: COLORS[i % COLORS.length] }))),
    }, [T.t_s].concat(T.series.map((x) => x.ms)));
  }

  function guest(g) {
    const pct = (p) => (p === null ? fmt(null) : fmt(p, 1) + " %");
    const s = section(`Guest ${g.name} (agent ${g.agent}, its own view): ${g.verdict}`,
      `Steal its kernel counted: ${pct(g.steal_pct)} of its CPU time; noise its loop measured: ${pct(g.noise_pct)}.`);
    if (g.causes.length) {
      s.append(table("grid", ["#", "cause", "share", "what", "evidence", "try", "see"],
        g.causes.map((c, i) => [i + 1, c.kind, c.share_pct === null ? fmt(null) : fmt(c.share_pct, 0) + " %", c.summary,
          c.evidence.join("; "), c.fix, c.see.join("; ")])));
    }
    if (g.cannot_tell.length) s.append(table("grid", ["cannot tell", "why", "to tell"], g.cannot_tell.map((c) => [c.what, c.why, c.record])));
  }

  vp.run((D) => {
    document.getElementById("subtitle").textContent = `${D.source}; lost events: ${D.lost_events_text}` + (D.clock ? `; clock: ${D.clock}` : "");
    for (const v of D.vms) vm(D, v);
    for (const g of D.guests) guest(g);
  });
})();
