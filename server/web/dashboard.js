// chunlian dashboard: polls GET /api/stats once a second and redraws uPlot
// charts from its columnar series (server-side rolling window, no PromQL).
// With an API key set on the server, /api/stats needs it: the dashboard
// asks for it once and keeps it in localStorage (shared with the page).
(function () {
  "use strict";
  const $ = (id) => document.getElementById(id);
  // Each chart takes its own container's width (the grid decides it); no
  // minimum wider than a phone.
  const width = (id) => Math.max(200, ($(id).clientWidth || 520) - 4);
  const charts = {};
  const KEY = "chunlian.apikey";

  function make(id, series, yLabel, yMax) {
    if (charts[id]) { charts[id].destroy(); $(id).innerHTML = ""; }
    const opts = {
      width: width(id), height: 200,
      scales: { x: { time: true }, y: { range: (u, min, max) => [0, yMax || Math.max(1, max * 1.1)] } },
      axes: [{}, { label: yLabel, size: 56 }],
      series: [{}].concat(series.map((s) => Object.assign({ width: 2, spanGaps: true, points: { size: 4 } }, s))),
      legend: { live: true },
    };
    charts[id] = new uPlot(opts, [[]].concat(series.map(() => [])), $(id));
  }
  make("c-qps", [{ label: "ok req/s", stroke: "#c8102e", fill: "rgba(200,16,46,.08)" }, { label: "server errors + rejected /s", stroke: "#555" }], "req/s");
  // Latency has no value in seconds without requests: show gaps, not lines across them.
  make("c-lat", [{ label: "p50", stroke: "#2b7a2b", spanGaps: false }, { label: "p90", stroke: "#d08c00", spanGaps: false }, { label: "p99", stroke: "#c8102e", spanGaps: false }], "ms");
  make("c-req", [{ label: "running", stroke: "#1f5fbf" }, { label: "waiting", stroke: "#c8102e" }], "requests");
  // KV (and, on a GPU backend, GPU) usage in percent 0–100; the GPU series
  // exist only once the server reports a GPU, so a CPU server shows no GPU
  // legend.
  const kvSeries = [{ label: "KV cache %", stroke: "#7b2fbf", fill: "rgba(123,47,191,.08)" }];
  const gpuSeries = [{ label: "GPU util %", stroke: "#2b7a2b" }, { label: "GPU mem %", stroke: "#d08c00" }];
  let gpu = false;
  make("c-kv", kvSeries, "%", 100);
  make("c-tok", [{ label: "tokens/s", stroke: "#1f5fbf", fill: "rgba(31,95,191,.08)" }], "tokens/s");

  const fmt = (v, d) => (v === null || v === undefined ? "–" : Number(v).toFixed(d));
  const pct = (v) => (v === null || v === undefined ? "–" : Number(v).toFixed(1) + " %");

  function askKey() {
    const row = $("key-row");
    row.hidden = false;
    $("apikey").focus();
  }
  $("apikey").addEventListener("change", () => { localStorage.setItem(KEY, $("apikey").value); tick(); });

  async function tick() {
    try {
      const headers = {};
      const key = localStorage.getItem(KEY);
      if (key) headers["Authorization"] = "Bearer " + key;
      const res = await fetch("/api/stats", { cache: "no-store", headers });
      if (res.status === 401) {
        askKey();
        $("status").textContent = "需要 API 密钥 · API key required";
        $("status").classList.add("bad");
        return;
      }
      $("key-row").hidden = true;
      const s = await res.json();
      const x = s.series, t = x.t, m = s.summary;
      if (m.gpu && !gpu) {
        gpu = true;
        make("c-kv", kvSeries.concat(gpuSeries), "%", 100);
        $("gpu-title").hidden = false;
      }
      charts["c-qps"].setData([t, x.qps, x.errors]);
      charts["c-lat"].setData([t, x.p50_ms, x.p90_ms, x.p99_ms]);
      charts["c-req"].setData([t, x.running, x.waiting]);
      charts["c-kv"].setData(gpu ? [t, x.kv_cache_usage_perc, x.gpu_util_perc, x.gpu_mem_perc] : [t, x.kv_cache_usage_perc]);
      charts["c-tok"].setData([t, x.tokens_per_s]);
      $("t-qps").textContent = fmt(m.qps_10s, 1);
      $("t-p50").textContent = fmt(m.latency_60s.p50_ms, 1);
      $("t-p99").textContent = fmt(m.latency_60s.p99_ms, 1);
      $("t-run").textContent = m.running;
      $("t-wait").textContent = m.waiting;
      $("t-kv").textContent = pct(m.kv_cache_usage_perc); // already 0–100
      // the hit rate is a fraction 0–1: shown as a percentage
      $("t-hit").textContent = m.prefix_cache_hit_rate === null ? "–" : pct(100 * m.prefix_cache_hit_rate);
      $("t-tot").textContent = m.requests_ok_total + "/" + m.requests_failed_total + "/" + m.requests_rejected_total;
      $("t-client").textContent = m.requests_client_error_total;
      if (m.gpu) {
        $("tile-gpu").hidden = false;
        $("t-gpu").textContent = fmt(m.gpu.utilization_perc, 0) + " % · " + fmt(m.gpu.memory_used_bytes / 2 ** 30, 1) + " GiB";
      }
      const st = $("status");
      st.textContent = (s.ready ? "就绪 ready" : "未就绪 not ready") + " · " + (s.model || "?") + " · " + (s.engine || "?");
      st.classList.toggle("bad", !s.ready);
    } catch (e) {
      $("status").textContent = "离线 offline: " + e.message;
      $("status").classList.add("bad");
    }
  }
  // Follow the grid's column width (window resizes, and the scrollbar that
  // appears once the charts are drawn).
  const fit = () => Object.entries(charts).forEach(([id, c]) => {
    const w = width(id);
    if (Math.abs(c.width - w) > 1) c.setSize({ width: w, height: 200 });
  });
  if (window.ResizeObserver) new ResizeObserver(fit).observe(document.querySelector(".charts"));
  window.addEventListener("resize", fit);
  $("apikey").value = localStorage.getItem(KEY) || "";
  tick();
  setInterval(tick, 1000);
})();
