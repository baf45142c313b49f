// Shared by every virtprof page (`report --html`, `boot --html`, `compare --html`): error trapping, DOM and
// chart helpers, and the run() wrapper that sets data-charts (charts drawn) and data-ready
// ("ok" or "errors") on <body> so headless tests can check a page without a debugger.
const vp = (function () {
  "use strict";
  const errors = [];
  const showErrors = () => {
    const box = document.getElementById("errors");
    box.hidden = errors.length === 0;
    box.textContent = errors.join("\n");
  };
  window.addEventListener("error", (e) => { errors.push("error: " + e.message); showErrors(); });
  const consoleError = console.error.bind(console);
  console.error = (...args) => { errors.push("console.error: " + args.join(" ")); showErrors(); consoleError(...args); };

  const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
  const main = document.getElementById("main");
  let charts = 0;

  const el = (tag, attrs, ...children) => {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    for (const c of children) node.append(c);
    return node;
  };
  const section = (title, note) => {
    const s = el("section", {});
    s.append(el("h2", {}, title));
    if (note) s.append(el("p", { class: "note" }, note));
    main.append(s);
    return s;
  };
  // A figure the source has no evidence for (null in the JSON): a greyed "unknown" cell whose
  // title says where the reason is; "unknown" as text.
  const UNKNOWN = { toString: () => "unknown" };
  const fmt = (v, digits) => (v === null || v === undefined ? UNKNOWN : Number(v).toLocaleString("en-US", { maximumFractionDigits: digits ?? 1 }));
  const us = (ns) => (ns === null || ns === undefined ? UNKNOWN : fmt(ns / 1000, 2));
  const cell = (c) => c === UNKNOWN
    ? el("td", { class: "unknown", title: "unknown: the source lacks the events this figure needs (see \"Not available\")" }, "unknown")
    : el("td", {}, String(c));
  const table = (cls, header, rows) => {
    const t = el("table", { class: cls });
    if (header) t.append(el("tr", {}, ...header.map((h) => el("th", {}, h))));
    for (const r of rows) t.append(el("tr", {}, ...r.map(cell)));
    return t;
  };
  // Axis ticks in SI units, so big counts and nanosecond sums fit the axis.
  const si = (v) => {
    const a = Math.abs(v);
    for (const [d, unit] of [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]]) if (a >= d) return +(v / d).toFixed(1) + unit;
    return String(+v.toFixed(2));
  };
  const siAxis = (label) => ({ label, size: 56, values: (u, ticks) => ticks.map(si) });
  // A matrix over named metrics as a table of coloured cells: blue −1, white 0, red +1, grey
  // where a value is null (undefined); each cell's title says the pair and its value.
  const heat = (names, rows) => {
    const t = el("table", { class: "heat" });
    names.forEach((name, i) => {
      const tr = el("tr", {}, el("th", {}, name));
      rows[i].forEach((r, j) => {
        const td = el("td", { title: `${name} ~ ${names[j]}: ${r === null ? "undefined" : r.toFixed(2)}` });
        const a = Math.min(1, Math.abs(r ?? 0));
        td.style.background = r === null ? "#ddd" : r >= 0 ? `rgba(214,39,40,${a})` : `rgba(31,119,180,${a})`;
        tr.append(td);
      });
      t.append(tr);
    });
    return t;
  };
  const plot = (parent, title, opts, data) => {
    const box = el("div", { class: "chart" });
    parent.append(box);
    new uPlot(Object.assign({ title, width: opts.width || 560, height: opts.height || 220 }, opts), data, box);
    charts++;
  };

  // Read the embedded JSON and draw it with `draw`; failures show on the page.
  const run = (draw) => {
    try {
      draw(JSON.parse(document.getElementById("data").textContent));
    } catch (e) {
      errors.push("exception: " + (e && e.stack ? e.stack : e));
    }
    showErrors();
    document.body.dataset.charts = String(charts);
    document.body.dataset.ready = errors.length ? "errors" : "ok";
  };
  return { COLORS, el, section, fmt, us, table, si, siAxis, heat, plot, run };
})();
