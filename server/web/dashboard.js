// chunlian dashboard: polls GET /api/stats once a second and redraws uPlot
// charts from its columnar series (server-side rolling window, no PromQL).
(function () {
  "use strict";
  const $ = (id) => document.getElementById(id);
  // Each chart takes its own container's width (the grid decides it).
  const width = (id) => Math.max(300, ($(id).clientWidth || 520) - 4);
  const charts = {};

  function make(id, series, yLabel) {
    const opts = {
      width: width(id), height: 200,
      scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(1, max * 1.1)] } },
      axes: [{}, { label: yLabel, size: 56 }],
      series: [{}].concat(series.map((s) => Object.assign({ width: 2, spanGaps: true, points: { size: 4 } }, s))),
      legend: { live: true },
    };
    charts[id] = new uPlot(opts, [[]].concat(series.map(() => [])), $(id));
  }
  make("c-qps", [{ label: "ok req/s", stroke: "#c8102e", fill: "rgba(200,16,46,.08)" }, { label: "errors/s", stroke: "#555" }], "req/s");
  // Latency has no value in seconds without requests: show gaps, not lines across them.
  make("c-lat", [{ label: "p50", stroke: "#2b7a2b", spanGaps: false }, { label: "p90", stroke: "#d08c00", spanGaps: false }, { label: "p99", stroke: "#c8102e", spanGaps: false }], "ms");
  make("c-req", [{ label: "running", stroke: "#1f5fbf" }, { label: "waiting", stroke: "#c8102e" }], "requests");
  make("c-kv", [{ label: "KV cache %", stroke: "#7b2fbf", fill: "rgba(123,47,191,.08)" }, { label: "GPU util %", stroke: "#2b7a2b" }, { label: "GPU mem %", stroke: "#d08c00" }], "%");
  make("c-tok", [{ label: "tokens/s", stroke: "#1f5fbf", fill: "rgba(31,95,191,.08)" }], "tokens/s");

  const fmt = (v, d) => (v === null || v === undefined ? "–" : Number(v).toFixed(d));

  async function tick() {
    try {
      const res = await fetch("/api/stats", { cache: "no-store" });
      const s = await res.json();
      const x = s.series, t = x.t;
      charts["c-qps"].setData([t, x.qps, x.errors]);
      charts["c-lat"].setData([t, x.p50_ms, x.p90_ms, x.p99_ms]);
      charts["c-req"].setData([t, x.running, x.waiting]);
      charts["c-kv"].setData([t, x.kv_cache_usage_perc, x.gpu_util_perc, x.gpu_mem_perc]);
      charts["c-tok"].setData([t, x.tokens_per_s]);
      const m = s.summary;
      $("t-qps").textContent = fmt(m.qps_10s, 1);
      $("t-p50").textContent = fmt(m.latency_60s.p50_ms, 1);
      $("t-p99").textContent = fmt(m.latency_60s.p99_ms, 1);
      $("t-run").textContent = m.running;
      $("t-wait").textContent = m.waiting;
      $("t-kv").textContent = fmt(m.kv_cache_usage_perc, 1);
      $("t-hit").textContent = m.prefix_cache_hit_rate === null ? "–" : fmt(100 * m.prefix_cache_hit_rate, 1);
      $("t-tot").textContent = m.requests_ok_total + "/" + m.requests_failed_total + "/" + m.requests_rejected_total;
      if (m.gpu) {
        $("tile-gpu").hidden = false; $("gpu-title").hidden = false;
        $("t-gpu").textContent = fmt(m.gpu.utilization_perc, 0) + "% · " + fmt(m.gpu.memory_used_bytes / 2 ** 30, 1) + " GiB";
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
  tick();
  setInterval(tick, 1000);
})();
