"use strict";
(function () {
  const body = document.body;
  const base = body.dataset.base || "/";
  const config = JSON.parse(body.dataset.config || "{}");
  const SVG = "http://www.w3.org/2000/svg";
  const SERIES = [
    ["due", "due", "--due"],
    ["scheduled", "scheduled", "--scheduled"],
    ["in_work", "in work", "--in-work"],
    ["failed", "failed", "--failed"],
  ];
  const views = new Map();
  let tokenField = null;

  function el(tag, attrs, children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "text") node.textContent = v;
      else if (k === "class") node.className = v;
      else node.setAttribute(k, v);
    }
    for (const child of children || []) node.append(child);
    return node;
  }

  function svg(tag, attrs) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    return node;
  }

  function colour(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim() || "#888";
  }

  function api(path) {
    return base + "api/" + path;
  }

  function tablePath(name) {
    return "tables/" + encodeURIComponent(name);
  }

  function age(ms) {
    if (ms === null || ms === undefined) return "–";
    const s = ms / 1000;
    if (s < 1) return ms + " ms";
    if (s < 120) return s.toFixed(1) + " s";
    if (s < 7200) return (s / 60).toFixed(1) + " min";
    if (s < 172800) return (s / 3600).toFixed(1) + " h";
    return (s / 86400).toFixed(1) + " d";
  }

  function clock(ms) {
    return new Date(ms).toISOString().slice(11, 19);
  }

  function showStatus(text, isError) {
    const status = document.getElementById("status");
    status.textContent = text;
    status.className = text ? (isError ? "shown error" : "shown") : "";
  }

  function buildTable(name) {
    const counts = el("dl", { class: "counts" });
    const count = (key, label) => {
      const dd = el("dd", { "data-count": key, text: "–" });
      counts.append(el("div", { class: key }, [el("dt", { text: label }), dd]));
      return dd;
    };
    const cells = {
      due: count("due", "due"),
      scheduled: count("scheduled", "scheduled"),
      in_work: count("in_work", "in work"),
      failed: count("failed", "failed"),
      processed: count("processed", "processed"),
      oldest: count("oldest", "oldest due"),
    };
    const depth = svg("svg", { viewBox: "0 0 600 170", preserveAspectRatio: "none", class: "depth", role: "img" });
    const ages = svg("svg", { viewBox: "0 0 300 170", preserveAspectRatio: "none", class: "age", role: "img" });
    const legend = el("div", { class: "legend" }, SERIES.map(([, label, c]) => {
      const swatch = el("i");
      swatch.style.background = colour(c);
      return el("span", {}, [swatch, label]);
    }));
    const rates = svg("svg", { viewBox: "0 0 300 170", preserveAspectRatio: "none", class: "rates", role: "img" });
    const rateLegend = el("div", { class: "legend" }, [["processed/s", "--processed"], ["failed/s", "--failed"]].map(([label, c]) => {
      const swatch = el("i");
      swatch.style.background = colour(c);
      return el("span", {}, [swatch, label]);
    }));
    const ageSwatch = el("i");
    ageSwatch.style.background = colour("--age");
    const charts = el("div", { class: "charts" }, [
      el("div", { class: "chart" }, [el("div", { class: "title", text: "depth over time" }), depth, legend]),
      el("div", { class: "chart" }, [
        el("div", { class: "title", text: "oldest due row's age" }),
        ages,
        el("div", { class: "legend" }, [el("span", {}, [ageSwatch, "age"])]),
      ]),
      el("div", { class: "chart" }, [el("div", { class: "title", text: "rates" }), rates, rateLegend]),
    ]);
    const head = el("tr", {}, ["id", "attempt", "failed at", "error", "payload"].map((h) => el("th", { text: h })));
    if (config.writable) head.append(el("th", { text: "" }));
    const rows = el("tbody");
    const more = el("button", { class: "more", type: "button", text: "more", hidden: "" });
    const empty = el("p", { class: "muted none", text: "No failed rows." });
    const error = el("p", { class: "error-text", hidden: "" });
    const failed = el("table", { class: "failed" }, [el("thead", {}, [head]), rows]);
    const section = el("section", { class: "table", "data-table": name }, [
      el("h2", { text: name }),
      error,
      counts,
      charts,
      el("h3", { text: "Failed rows" }),
      failed,
      empty,
      more,
    ]);
    const view = { name, section, cells, depth, ages, rates, rows, more, empty, error, next: null, loaded: [] };
    more.addEventListener("click", () => loadFailed(view, true));
    return view;
  }

  function setCount(dd, count) {
    dd.textContent = count ? count.text : "–";
    if (count) dd.dataset.value = String(count.value);
  }

  function renderStats(view, stats) {
    if (stats.error) {
      view.error.hidden = false;
      view.error.textContent = stats.error;
      return;
    }
    view.error.hidden = true;
    setCount(view.cells.due, stats.due);
    setCount(view.cells.scheduled, stats.scheduled);
    setCount(view.cells.in_work, stats.in_work);
    setCount(view.cells.failed, stats.failed);
    setCount(view.cells.processed, stats.processed);
    view.cells.oldest.textContent = age(stats.oldest_due_age_ms);
  }

  function niceStep(raw, least) {
    if (!(raw > 0)) return Math.max(least, 1);
    const power = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 2.5, 5, 10]) {
      if (m * power >= raw) return Math.max(m * power, least);
    }
    return Math.max(10 * power, least);
  }

  function drawChart(node, width, samples, series) {
    node.replaceChildren();
    const left = 44, right = width - 8, top = 8, bottom = 146;
    node.append(svg("rect", { x: 0, y: 0, width, height: 170, fill: "#fbfcfd" }));
    let max = 0;
    for (const s of samples) for (const [key] of series) max = Math.max(max, s[key] || 0);
    const ceiling = niceStep(max / 4, series.formatter ? 0 : 1) * 4;
    for (let i = 0; i <= 4; i++) {
      const y = bottom - ((bottom - top) * i) / 4;
      node.append(svg("line", { x1: left, x2: right, y1: y, y2: y, stroke: "#e3e6eb", "stroke-width": 1 }));
      const label = svg("text", { x: left - 4, y: y + 4, "text-anchor": "end", "font-size": 10, fill: "#6b7280" });
      const value = (ceiling * i) / 4;
      label.textContent = series.formatter ? series.formatter(value) : String(Math.round(value * 100) / 100);
      node.append(label);
    }
    node.append(svg("line", { x1: left, x2: left, y1: top, y2: bottom, stroke: "#9ca3af" }));
    node.append(svg("line", { x1: left, x2: right, y1: bottom, y2: bottom, stroke: "#9ca3af" }));
    if (samples.length === 0) {
      const t = svg("text", { x: (left + right) / 2, y: 80, "text-anchor": "middle", "font-size": 12, fill: "#6b7280" });
      t.textContent = "no samples yet";
      node.append(t);
      return;
    }
    const t0 = samples[0].at_ms, t1 = samples[samples.length - 1].at_ms;
    const span = Math.max(t1 - t0, 1);
    const x = (s) => (samples.length === 1 ? right : left + ((right - left) * (s.at_ms - t0)) / span);
    const y = (v) => bottom - ((bottom - top) * v) / ceiling;
    for (const [key, , c] of series) {
      const points = samples.filter((s) => s[key] !== null && s[key] !== undefined);
      if (points.length === 0) continue;
      const stroke = colour(c);
      if (points.length > 1) {
        const area = points.map((s) => x(s).toFixed(1) + "," + y(s[key]).toFixed(1));
        node.append(svg("polygon", {
          points: x(points[0]).toFixed(1) + "," + bottom + " " + area.join(" ") + " " + x(points[points.length - 1]).toFixed(1) + "," + bottom,
          fill: stroke, "fill-opacity": 0.12, stroke: "none",
        }));
        node.append(svg("polyline", { points: area.join(" "), fill: "none", stroke, "stroke-width": 2, "stroke-linejoin": "round" }));
      }
      const last = points[points.length - 1];
      node.append(svg("circle", { cx: x(last), cy: y(last[key]), r: 3, fill: stroke, "data-series": key }));
    }
    for (const [at, anchor, px] of [[t0, "start", left], [t1, "end", right]]) {
      const label = svg("text", { x: px, y: 162, "text-anchor": anchor, "font-size": 10, fill: "#6b7280" });
      label.textContent = clock(at);
      node.append(label);
    }
  }

  function renderHistory(view, history) {
    const samples = history.samples || [];
    drawChart(view.depth, 600, samples, SERIES);
    const ageSeries = [["oldest_due_age_ms", "age", "--age"]];
    ageSeries.formatter = (v) => age(Math.round(v));
    drawChart(view.ages, 300, samples, ageSeries);
    const rateSeries = [["processed_per_s", "processed/s", "--processed"], ["failed_per_s", "failed/s", "--failed"]];
    rateSeries.formatter = (v) => (v >= 10 ? String(Math.round(v)) : v.toFixed(1));
    drawChart(view.rates, 300, perSecond(samples), rateSeries);
  }

  // Rows marked processed and failed per second between two samples; a count that fell
  // (rows redriven, deleted, or cleared by retention) reads as no rate.
  function perSecond(samples) {
    const out = [];
    for (let i = 1; i < samples.length; i++) {
      const a = samples[i - 1], b = samples[i];
      const seconds = (b.at_ms - a.at_ms) / 1000;
      if (!(seconds > 0)) continue;
      const rate = (key) => (a[key] === null || b[key] === null || a[key] === undefined || b[key] === undefined ? null : Math.max(b[key] - a[key], 0) / seconds);
      out.push({ at_ms: b.at_ms, processed_per_s: rate("processed"), failed_per_s: rate("failed") });
    }
    return out;
  }

  // The row's error, and its earlier attempts' errors where the table keeps them.
  function errorCell(row) {
    const td = el("td", { class: "error", text: row.error === null || row.error === undefined ? "–" : row.error });
    const errors = row.errors || [];
    if (errors.length > 0) {
      const items = errors.map((e) => {
        const at = e.at_ms === null || e.at_ms === undefined ? "" : " (" + new Date(e.at_ms).toISOString().replace("T", " ").slice(0, 19) + ")";
        const attempt = e.attempt === null || e.attempt === undefined ? "attempt ?" : "attempt " + e.attempt;
        return el("li", { text: attempt + at + ": " + e.error });
      });
      td.append(el("details", { class: "errors" }, [el("summary", { text: errors.length + " errors" }), el("ol", {}, items)]));
    }
    return td;
  }

  function failedRow(view, row) {
    const id = row.id;
    const when = row.failed_at_ms === null || row.failed_at_ms === undefined ? "–" : new Date(row.failed_at_ms).toISOString().replace("T", " ").slice(0, 19);
    const payload = row.payload === null || row.payload === undefined ? "–" : row.payload;
    const tr = el("tr", { "data-id": String(id) }, [
      el("td", { class: "id", text: String(id) }),
      el("td", { class: "attempt", text: row.attempt === null || row.attempt === undefined ? "–" : String(row.attempt) }),
      el("td", { class: "failed-at", text: when }),
      errorCell(row),
      el("td", { class: "payload" }, [el("pre", { text: payload.length > 4000 ? payload.slice(0, 4000) + "…" : payload })]),
    ]);
    if (config.writable) {
      const redrive = el("button", { class: "redrive", type: "button", text: "redrive" });
      const remove = el("button", { class: "delete", type: "button", text: "delete" });
      redrive.addEventListener("click", () => change(view, id, "redrive", [redrive, remove]));
      remove.addEventListener("click", () => change(view, id, "delete", [redrive, remove]));
      tr.append(el("td", { class: "actions" }, [redrive, remove]));
    }
    return tr;
  }

  async function loadFailed(view, append) {
    const pages = append ? view.next : null;
    const query = "?limit=50" + (pages !== null && pages !== undefined ? "&after=" + encodeURIComponent(String(pages)) : "");
    const response = await fetch(api(tablePath(view.name) + "/failed" + query), { cache: "no-store" });
    const answer = await response.json();
    if (!response.ok) {
      view.empty.hidden = false;
      view.empty.textContent = "Failed rows: " + (answer.error || response.status);
      return;
    }
    view.loaded = append ? view.loaded.concat(answer.rows) : answer.rows;
    view.next = answer.next_after;
    view.rows.replaceChildren(...view.loaded.map((row) => failedRow(view, row)));
    view.empty.hidden = view.loaded.length > 0;
    view.empty.textContent = "No failed rows.";
    view.more.hidden = view.next === null || view.next === undefined;
  }

  async function change(view, id, action, buttons) {
    const token = tokenField ? tokenField.value.trim() : "";
    try { sessionStorage.setItem("ruststream-token", token); } catch (_) { /* storage may be off */ }
    for (const b of buttons) b.disabled = true;
    const headers = {};
    if (token) headers["Authorization"] = "Bearer " + token;
    let response, answer;
    try {
      response = await fetch(api(tablePath(view.name) + "/failed/" + encodeURIComponent(String(id)) + "/" + action), { method: "POST", headers });
      answer = await response.json().catch(() => ({}));
    } catch (e) {
      showStatus(view.name + ": " + action + " of row " + id + " did not reach the server: " + e, true);
      for (const b of buttons) b.disabled = false;
      return;
    }
    if (response.ok) {
      showStatus(view.name + ": row " + id + (action === "redrive" ? " redriven" : " deleted"), false);
    } else {
      showStatus(view.name + ": " + action + " of row " + id + " refused (" + response.status + "): " + (answer.error || ""), true);
      for (const b of buttons) b.disabled = false;
    }
    await refresh();
  }

  async function refreshTable(view, stats) {
    renderStats(view, stats);
    const history = await fetch(api(tablePath(view.name) + "/history"), { cache: "no-store" }).then((r) => r.json());
    renderHistory(view, history);
    if (!stats.error) await loadFailed(view, false);
  }

  async function refresh() {
    try {
      const answer = await fetch(api("tables"), { cache: "no-store" }).then((r) => r.json());
      const main = document.getElementById("tables");
      const loading = document.getElementById("loading");
      if (loading) loading.remove();
      for (const stats of answer.tables) {
        let view = views.get(stats.table);
        if (!view) {
          view = buildTable(stats.table);
          views.set(stats.table, view);
          main.append(view.section);
        }
        await refreshTable(view, stats);
      }
      if (answer.tables.length === 0) main.replaceChildren(el("p", { class: "muted", text: "No table is registered." }));
      document.getElementById("updated").textContent = "updated " + new Date().toISOString().slice(11, 19) + " UTC";
      body.dataset.loaded = "true";
    } catch (e) {
      showStatus("The dashboard's API did not answer: " + e, true);
    }
  }

  async function loop() {
    await refresh();
    setTimeout(loop, config.refresh_ms || 5000);
  }

  if (config.writable) {
    document.getElementById("auth").hidden = false;
    tokenField = document.getElementById("token");
    try { tokenField.value = sessionStorage.getItem("ruststream-token") || ""; } catch (_) { /* storage may be off */ }
  } else {
    document.getElementById("readonly").hidden = false;
  }
  loop();
})();
