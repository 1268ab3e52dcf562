// The jumpahead live dashboard: polls dashboard.json and draws it with plotly.js
// (served by this server from the plotly package; nothing comes from elsewhere).
"use strict";
(function () {
  const POLL_MS = 1000;
  const QUEUE_SAMPLES = 300;
  const KINDS = ["sampled", "strict", "echo", "ngram", "draft", "jump", "scripted"];
  const COLORS = {sampled: "#9aa5b1", strict: "#3b82f6", echo: "#10b981", ngram: "#14b8a6",
                  draft: "#a855f7", jump: "#f59e0b", scripted: "#ef4444"};
  const CONFIG = {displayModeBar: false, responsive: true};
  const queue = {t: [], running: [], waiting: []};
  let key = null;
  let lastSeq = -1;
  let polls = 0;

  function $(id) { return document.getElementById(id); }

  // The API key comes from the URL fragment (never sent to the server) or the form,
  // and stays in this tab's sessionStorage; the fragment is dropped from the address.
  function readKey() {
    const fromHash = new URLSearchParams(location.hash.slice(1)).get("key");
    if (fromHash) {
      sessionStorage.setItem("jumpahead-key", fromHash);
      history.replaceState(null, "", location.pathname + location.search);
    }
    key = sessionStorage.getItem("jumpahead-key");
  }

  function setStatus(text, cls) {
    const s = $("status");
    s.textContent = text;
    s.className = "status " + cls;
  }

  const int = (n) => (n == null ? "–" : Math.round(n).toLocaleString("en-US"));
  const pct = (x) => (x == null ? "–" : (100 * x).toFixed(1) + "%");
  const secs = (s) => (s == null ? "–" : s < 10 ? s.toFixed(2) + " s" : s.toFixed(1) + " s");
  const ago = (now, t) => secs(Math.max(0, now - t)) + " ago";

  function layout(title, extra) {
    return Object.assign({
      title: {text: title, font: {size: 12}, x: 0.02, y: 0.97},
      margin: {l: 44, r: 10, t: 28, b: 28}, font: {size: 10},
      paper_bgcolor: "#fff", plot_bgcolor: "#fff",
      legend: {orientation: "h", x: 0, y: -0.18, font: {size: 9}},
      xaxis: {automargin: true}, yaxis: {automargin: true, rangemode: "tozero"},
    }, extra || {});
  }

  function turnAxis(turns) { return turns.map((t) => "#" + t.seq); }

  function drawTurns(data) {
    const turns = data.turns;
    const x = turnAxis(turns);
    const axis = {type: "category", automargin: true, nticks: 12};
    Plotly.react("chart-prompt", [
      {type: "bar", name: "cached", x, y: turns.map((t) => t.cached_tokens), marker: {color: "#10b981"}},
      {type: "bar", name: "not cached", x, y: turns.map((t) => t.prompt_tokens - t.cached_tokens),
       marker: {color: "#cbd2d9"}},
    ], layout("Prompt tokens per turn", {barmode: "stack", xaxis: axis}), CONFIG);
    const used = KINDS.filter((k) => turns.some((t) => (t.by_kind[k] || 0) > 0));
    Plotly.react("chart-turn-kinds", (used.length ? used : ["sampled"]).map((k) => ({
      type: "bar", name: k, x, y: turns.map((t) => t.by_kind[k] || 0), marker: {color: COLORS[k]},
    })), layout("Generated tokens per turn, by provenance", {barmode: "stack", xaxis: axis}), CONFIG);
    const totals = data.totals.by_kind;
    const kinds = KINDS.filter((k) => k in totals).concat(Object.keys(totals).filter((k) => !KINDS.includes(k)));
    Plotly.react("chart-provenance", [{
      type: "bar", orientation: "h", y: kinds, x: kinds.map((k) => totals[k]),
      marker: {color: kinds.map((k) => COLORS[k] || "#616e7c")}, text: kinds.map((k) => int(totals[k])),
      textposition: "auto", hoverinfo: "y+x",
    }], layout("Tokens by provenance (all turns)", {xaxis: {automargin: true, rangemode: "tozero"},
                                                     yaxis: {automargin: true, autorange: "reversed"}}), CONFIG);
    let actual = 0, ordinary = 0;
    const cumActual = [], cumOrdinary = [];
    for (const t of turns) {
      actual += t.decode_s; ordinary += t.ordinary_s;
      cumActual.push(actual); cumOrdinary.push(ordinary);
    }
    Plotly.react("chart-time", [
      {type: "scatter", mode: "lines", name: "ordinary decoding (estimate)", x, y: cumOrdinary,
       line: {color: "#9aa5b1", dash: "dot"}},
      {type: "scatter", mode: "lines", name: "actual decode", x, y: cumActual, line: {color: "#3b82f6"},
       fill: "tonexty", fillcolor: "rgba(16,185,129,0.15)"},
    ], layout("Decode seconds, cumulative (shaded: saved)", {xaxis: axis}), CONFIG);
    Plotly.react("chart-cache", [{
      type: "scatter", mode: "lines+markers", name: "cached share of prompt", x,
      y: turns.map((t) => (t.prompt_tokens ? t.cached_tokens / t.prompt_tokens : 0)),
      line: {color: "#10b981"}, marker: {size: 4},
    }], layout("Prefix cache: cached share of each prompt",
               {xaxis: axis, yaxis: {range: [0, 1.05], tickformat: ".0%", automargin: true}}), CONFIG);
  }

  function drawQueue(data) {
    const q = data.engine.queue || {};
    queue.t.push(new Date(data.now * 1000));
    queue.running.push(q.rows_running || 0);
    queue.waiting.push(q.rows_waiting || 0);
    for (const k of ["t", "running", "waiting"]) if (queue[k].length > QUEUE_SAMPLES) queue[k].shift();
    Plotly.react("chart-queue", [
      // copies: Plotly.react redraws only data it sees change (new arrays)
      {type: "scatter", mode: "lines", name: "running", x: queue.t.slice(), y: queue.running.slice(),
       line: {shape: "hv", color: "#3b82f6"}},
      {type: "scatter", mode: "lines", name: "waiting", x: queue.t.slice(), y: queue.waiting.slice(),
       line: {shape: "hv", color: "#f59e0b"}},
    ], layout("Engine rows (max batch " + (q.max_batch == null ? "?" : q.max_batch) + ")",
              {xaxis: {type: "date", automargin: true, tickformat: "%H:%M:%S"}, yaxis: {rangemode: "tozero", dtick: 1, automargin: true}}), CONFIG);
  }

  function table(id, head, rows) {
    const t = $(id);
    t.replaceChildren();
    const tr = document.createElement("tr");
    for (const h of head) { const th = document.createElement("th"); th.textContent = h; tr.appendChild(th); }
    t.appendChild(tr);
    if (!rows.length) {
      const r = document.createElement("tr"); const td = document.createElement("td");
      td.colSpan = head.length; td.className = "muted"; td.textContent = "none";
      r.appendChild(td); t.appendChild(r);
    }
    for (const row of rows) {
      const r = document.createElement("tr");
      row.forEach((cell, i) => {
        const td = document.createElement("td"); td.textContent = String(cell);
        if (i === 0) td.title = String(cell);
        r.appendChild(td);
      });
      t.appendChild(r);
    }
  }

  function effect(iv) {
    if (iv.emitted) return int(iv.emitted) + " tokens supplied";
    if (iv.tokens_before != null && iv.tokens_after != null) {
      return "prompt " + int(iv.tokens_before) + " → " + int(iv.tokens_after);
    }
    return iv.decision || "";
  }

  function drawTables(data) {
    const now = data.now;
    table("table-flight", ["session", "running", "prompt", "cached", "generated"],
          data.in_flight.map((f) => [f.session, secs(f.elapsed_s), int(f.prompt_tokens),
                                     int(f.cached_tokens), int(f.generated)]));
    table("table-sessions", ["session", "protocol", "turns", "in flight", "last turn", "last prompt", "cached",
                             "generated", "supplied", "saved", "interventions"],
          data.sessions.slice(0, 30).map((s) => [
            s.session, s.protocol, int(s.turns), int(s.in_flight), s.last_seen ? ago(now, s.last_seen) : "running",
            int(s.last_prompt_tokens), int(s.last_cached_tokens), int(s.completion_tokens),
            s.completion_tokens ? pct(s.supplied_tokens / s.completion_tokens) : "–", secs(s.saved_s),
            int(s.interventions)]));
    table("table-interventions", ["session", "policy", "effect", "when"],
          data.interventions.slice(0, 20).map((iv) => [iv.session, iv.policy + " (" + iv.kind + ")", effect(iv),
                                                       ago(now, iv.ended)]));
  }

  function drawTiles(data) {
    const t = data.totals, q = data.engine.queue || {}, cache = data.engine.prefix_cache;
    const sampled = t.by_kind.sampled || 0;
    $("model").textContent = data.engine.model || "";
    $("in-flight").textContent = int(data.in_flight.length);
    $("queue").textContent = int(q.rows_running) + " / " + int(q.rows_waiting);
    $("turns").textContent = int(t.turns);
    $("generated").textContent = int(t.completion_tokens);
    $("supplied").textContent = t.completion_tokens ? pct((t.completion_tokens - sampled) / t.completion_tokens) : "–";
    $("saved").textContent = secs(t.saved_s);
    $("saved").title = int(t.rounds_saved) + " decode rounds saved; " + secs(t.decode_s) + " decoding, " +
      secs(t.ordinary_s) + " estimated for ordinary decoding";
    $("cache").textContent = cache ? pct(cache.hit_rate) : (t.prompt_tokens ? pct(t.cached_tokens / t.prompt_tokens) : "–");
    $("cache").title = cache ? int(cache.hits) + " of " + int(cache.lookups) + " lookups; " +
      pct(cache.token_hit_rate) + " of prompt tokens" : "";
    $("interventions").textContent = int(t.interventions);
  }

  function render(data) {
    drawTiles(data);
    drawTables(data);
    drawQueue(data);
    if (data.seq !== lastSeq) {
      drawTurns(data);
      lastSeq = data.seq;
      document.body.dataset.seq = String(data.seq);
    }
    document.body.dataset.polls = String(++polls);
  }

  async function poll() {
    try {
      const headers = key ? {Authorization: "Bearer " + key} : {};
      const r = await fetch("dashboard.json", {headers, cache: "no-store"});
      if (r.status === 401) {
        $("keybox").hidden = false;
        setStatus("API key needed", "bad");
        return;  // the form restarts polling
      }
      if (!r.ok) throw new Error("HTTP " + r.status);
      render(await r.json());
      setStatus("live", "ok");
    } catch (e) {
      setStatus("disconnected (" + e.message + ")", "bad");
    }
    setTimeout(poll, POLL_MS);
  }

  $("keybox").addEventListener("submit", (ev) => {
    ev.preventDefault();
    key = $("key").value.trim();
    sessionStorage.setItem("jumpahead-key", key);
    $("keybox").hidden = true;
    poll();
  });
  readKey();
  poll();
})();
