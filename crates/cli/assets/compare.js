// Draws `virtprof compare --html` from the JSON embedded in the page (what `compare --json
// --matrix` prints), with the helpers of page.js: the runs of each side, the rates with their
// spread, the largest correlation changes, and the sides' mean matrices and their difference.
(function () {
  "use strict";
  const { COLORS, section, fmt, table, heat, siAxis, plot } = vp;
  const spread = (mean, sd, runs) =>
    mean === null ? "–" : fmt(mean, 1) + (sd === null ? "" : " ± " + fmt(sd, 1)) + (runs > 1 ? ` (${runs})` : "");
  const r = (v, sd) => (v === null ? "n/a" : v.toFixed(2) + (sd === null ? "" : " ± " + sd.toFixed(2)));

  vp.run((D) => {
    document.getElementById("subtitle").textContent = `A: ${D.a.length} run(s), B: ${D.b.length} run(s)`;
    const runs = section("Runs", "Each side's recordings and the events their traces lost.");
    runs.append(table("grid", ["side", "recording", "lost events"], [
      ...D.a.map((p, i) => ["A", p, D.a_lost_events[i]]),
      ...D.b.map((p, i) => ["B", p, D.b_lost_events[i]]),
    ]));
    const rates = section("Rates", "Per second: the mean over the side's runs that have the metric ± their sample standard deviation (runs in brackets); – where no run of the side has it (unknown, not zero).");
    rates.append(table("grid", ["metric", "A", "B", "B/A"], D.rates.map((x) => [
      x.metric,
      spread(x.a_per_second, x.a_sd, x.a_runs),
      spread(x.b_per_second, x.b_sd, x.b_runs),
      x.a_per_second && x.b_per_second !== null ? fmt(x.b_per_second / x.a_per_second, 2) : "–",
    ])));
    const changes = section("Largest correlation changes (A → B)", "The mean correlation of each side over its runs ± the spread; a change larger than both spreads together is beyond the runs' own noise.");
    changes.append(table("grid", ["change", "metric", "metric", "A", "B", ""], D.changes.map((c) => [
      (c.change >= 0 ? "+" : "") + c.change.toFixed(2), c.a, c.b, r(c.r_in_a, c.a_sd), r(c.r_in_b, c.b_sd),
      c.beyond_spread ? "beyond spread" : "",
    ])));
    const timelines = D.exit_rates;
    if (timelines[0].length + timelines[1].length) {
      const s = section("Exit rate over time", "Each run's exits per second per interval (kvm_exit reasons summed, or the exits to userspace where the trace has no kvm_exit).");
      const box = s.appendChild(document.createElement("div"));
      box.className = "charts";
      timelines.forEach((side, k) => side.forEach((x) => plot(box, `${"AB"[k]}: ${x.path}`, {
        width: 380, height: 180,
        axes: [{ label: "s" }, siAxis(x.counts + " /s")],
        series: [{ label: "s" }, { label: "exits/s", stroke: COLORS[k] }],
        legend: { show: false },
      }, [x.t, x.per_s])));
    }
    const M = D.matrices;
    for (const [title, rows, note] of [
      ["Correlation, A", M.a_mean, `Mean over ${D.a.length} run(s) (blue −1, white 0, red +1; grey: undefined).`],
      ["Correlation, B", M.b_mean, `Mean over ${D.b.length} run(s).`],
      ["Difference, B − A", M.difference, "Red: the pair correlates more in B; blue: less; grey: undefined on a side."],
    ]) {
      section(title, note).append(heat(M.names, rows));
    }
  });
})();
