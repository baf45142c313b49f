// Draws `virtprof boot --html` from the JSON embedded in the page (the document
// `virtprof boot --json` prints), with the helpers of page.js: the realm split over time as a
// stacked area, the top symbols as bars, per-symbol timelines, sequences, and the differential.
(function () {
  "use strict";
  const { COLORS, el, section, fmt, table, siAxis, plot } = vp;
  const REALM_COLORS = { hypervisor: "#d62728", firmware: "#8c564b", kernel: "#1f77b4", user: "#2ca02c" };
  const pct = (f) => fmt(100 * f, 2) + "%";

  function summary(D) {
    document.getElementById("subtitle").textContent = D.source;
    const s = section("Summary", D.note);
    const rows = [
      ["samples", fmt(D.samples, 0)],
      ["rate", D.rate_hz === null ? "exit-driven" : D.rate_hz + " Hz"],
      ["duration", fmt(D.duration_ns / 1e9, 3) + " s"],
      ["KASLR offset", D.kaslr_offset],
    ];
    if (D.truth) rows.push(["guest run time (ground truth)", fmt(D.truth.boot_s, 3) + " s"]);
    s.append(table("facts", null, rows));
    const realms = Object.keys(D.realm_counts).map((r) => [r, fmt(D.realm_counts[r], 0), pct(D.realms[r]), r in D.resolved ? pct(D.resolved[r]) : "–"]);
    s.append(table("grid", ["realm", "samples", "share", "resolved"], realms));
  }

  // Stacked area: each series is the running sum of the realms below it, filled.
  function realmsOverTime(D) {
    const s = section("Realms over time", `samples per ${fmt(D.bins.bin_ns / 1e6, 1)} ms bin, stacked`);
    const names = Object.keys(D.bins.realms).filter((r) => D.bins.realms[r].some((v) => v > 0));
    const acc = D.bins.t_s.map(() => 0);
    const stacked = names.map((r) => D.bins.realms[r].map((v, i) => (acc[i] += v)));
    const series = [{ label: "s" }].concat(
      names.map((r, i) => ({ label: r, stroke: REALM_COLORS[r], fill: REALM_COLORS[r] + "aa", value: (u, x, si, j) => fmt(j === null ? null : D.bins.realms[r][j], 0) })).reverse(),
    );
    plot(s, "realm split", { width: 1100, height: 260, series, axes: [{}, siAxis("samples")] }, [D.bins.t_s].concat(stacked.reverse()));
  }

  function topSymbols(D) {
    const s = section("Top symbols", "count, share of all samples and rank (the seed's Table 1)");
    const top = D.symbols.slice(0, 25);
    const max = top.length ? top[0].count : 1;
    const t = el("table", { class: "grid" });
    t.append(el("tr", {}, ...["rank", "realm", "symbol", "count", "fraction", ""].map((h) => el("th", {}, h))));
    for (const r of top) {
      const bar = el("div", { class: "bar" });
      bar.style.width = (300 * r.count) / max + "px";
      bar.style.background = REALM_COLORS[r.realm];
      t.append(el("tr", {}, el("td", {}, String(r.rank)), el("td", {}, r.realm), el("td", {}, r.name), el("td", {}, fmt(r.count, 0)), el("td", {}, r.fraction.toFixed(5)), el("td", {}, bar)));
    }
    s.append(t);
    document.body.dataset.topSymbols = String(top.length);
  }

  function timelines(D) {
    const s = section("Symbol profiles over time", "samples per bin of the top symbols and every --symbol");
    const box = el("div", { class: "charts" });
    s.append(box);
    D.bins.symbols.forEach((t, i) => {
      const color = COLORS[i % COLORS.length];
      plot(box, t.name, { series: [{ label: "s" }, { label: "samples", stroke: color, fill: color + "44" }], axes: [{}, siAxis("samples")] }, [D.bins.t_s, t.counts]);
    });
  }

  function sequences(D) {
    const s = section("Sequences", "consecutive samples per vCPU, repeats collapsed");
    s.append(table("grid", ["count", "symbol pair"], D.bigrams.map((q) => [fmt(q.count, 0), q.symbols.join(" → ")])));
    s.append(table("grid", ["count", "symbol triple"], D.trigrams.map((q) => [fmt(q.count, 0), q.symbols.join(" → ")])));
  }

  function compare(D) {
    if (!D.compare) return;
    const C = D.compare;
    const s = section("Differential profile", `against ${C.other} (${C.other_source}); top-20 rank correlation ${C.rank_correlation_top20 === null ? "–" : C.rank_correlation_top20.toFixed(3)}`);
    const rank = (r) => (r === null ? "–" : r);
    s.append(table("grid", ["symbol", "realm", "share", "other", "Δ pp", "rank", "other rank"], C.rows.map((r) => [r.name, r.realm, pct(r.fraction), pct(r.other_fraction), (r.delta_pp >= 0 ? "+" : "") + r.delta_pp.toFixed(2), rank(r.rank), rank(r.other_rank)])));
  }

  vp.run((D) => {
    summary(D);
    realmsOverTime(D);
    topSymbols(D);
    timelines(D);
    sequences(D);
    compare(D);
  });
})();
