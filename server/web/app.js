// chunlian web page: validates the input as you type, calls POST /generate,
// draws the chosen couplet (上联 right, 下联 left, 横批 on top) and can
// export it as a PNG drawn on a <canvas>. No libraries, works offline.
(function () {
  "use strict";
  const $ = (id) => document.getElementById(id);
  const form = $("form"), prompt = $("prompt"), mode = $("mode"), length = $("length"), nSel = $("n");
  const btnGen = $("generate"), btnAnother = $("another"), btnPNG = $("download");
  const hint = $("hint"), errBox = $("error"), stage = $("stage");
  const elUpper = $("upper"), elLower = $("lower"), elBanner = $("banner");
  const elLatency = $("latency"), cands = $("candidates"), candsPanel = $("cands-panel"), loading = $("loading");
  const keyRow = $("key-row"), apikey = $("apikey");

  const HAN = /^\p{Script=Han}+$/u;
  const LOWER_OK = /^[\p{Script=Han}，、；：！？·]+$/u;
  const PUNCT = /[，、；：！？·]/u;
  let last = null;      // last successful request body (for 换一副)
  let couplets = [];    // candidates of the last answer
  let current = -1;     // index shown
  let busy = false;

  apikey.value = localStorage.getItem("chunlian.apikey") || "";
  if (apikey.value) keyRow.hidden = false;

  // The placeholder is a real example per mode, and an empty field means
  // "use the placeholder": 生成 works at once on a fresh page.
  const PLACEHOLDER = { keyword: "平安", acrostic: "吉祥", lower: "春回大地千山秀" };
  const text = () => prompt.value.trim() || prompt.placeholder;

  // validate returns [ok, message] for the current input and mode.
  function validate() {
    const v = text();
    const chars = Array.from(v);
    switch (mode.value) {
      case "lower":
        if (chars.length === 0) return [false, "请输入上联，例如：春回大地千山秀 · Enter an upper line"];
        if (!LOWER_OK.test(v)) return [false, "上联只能包含汉字和，、；：！？· · Chinese characters and couplet punctuation only"];
        if (chars.length > 32) return [false, "上联最多 32 字 · At most 32 characters"];
        if (PUNCT.test(chars[0]) || PUNCT.test(chars[chars.length - 1])) return [false, "首尾不能是标点 · No punctuation at the start or end"];
        return [true, "✓ 上联 " + chars.length + " 字 · " + chars.length + " characters"];
      default:
        if (chars.length === 0) return [false, "输入吉祥词，例如：福、平安、万事如意 · A blessing word"];
        if (!HAN.test(v)) return [false, "只能输入汉字 · Chinese characters only"];
        if (mode.value === "acrostic" && chars.length !== 2) return [false, "藏头需要恰好两个汉字（现在 " + chars.length + " 个）· Exactly two characters (now " + chars.length + ")"];
        if (mode.value !== "acrostic" && ![1, 2, 4].includes(chars.length)) return [false, "请输入一个、两个或四个汉字（现在 " + chars.length + " 个）· One, two or four characters (now " + chars.length + ")"];
        if (mode.value === "acrostic" && chars[0] === chars[1]) return [false, "藏头的两个字须不同 · The two head characters must differ"];
        return [true, mode.value === "acrostic" ? "✓ 上联以「" + chars[0] + "」开头，下联以「" + chars[1] + "」开头" : "✓ 可以生成 · Ready"];
    }
  }

  function refresh() {
    prompt.placeholder = PLACEHOLDER[mode.value] || "平安";
    const empty = prompt.value.trim() === "";
    let [ok, msg] = validate();
    if (ok && empty) msg = "✓ 将用示例「" + prompt.placeholder + "」生成 · Empty: the example is used";
    prompt.classList.toggle("invalid", !ok && !empty);
    prompt.classList.toggle("valid", ok);
    hint.textContent = msg;
    hint.classList.toggle("bad", !ok && !empty);
    btnGen.disabled = !ok || busy;
    btnAnother.disabled = !last || busy;
    length.disabled = mode.value === "lower";
    $("prompt-label-en").textContent = mode.value === "lower" ? "上联 Upper line" : (mode.value === "acrostic" ? "Head characters" : "Blessing word");
    document.querySelector('label[for=prompt]').firstChild.textContent = mode.value === "lower" ? "上联 " : (mode.value === "acrostic" ? "藏头字 " : "吉祥词 ");
    return ok;
  }
  // Editing the input or the mode makes an old error stale: clear it.
  prompt.addEventListener("input", () => { showError(""); refresh(); });
  mode.addEventListener("change", () => { showError(""); refresh(); });
  apikey.addEventListener("change", () => localStorage.setItem("chunlian.apikey", apikey.value));

  function showError(msg) {
    errBox.textContent = msg;
    errBox.hidden = !msg;
  }

  function show(i) {
    const c = couplets[i];
    if (!c) return;
    current = i;
    elUpper.textContent = c.upper;
    elLower.textContent = c.lower;
    elBanner.textContent = c.banner;
    elBanner.dataset.empty = c.banner ? "0" : "1";
    Array.from(cands.children).forEach((li, k) => li.classList.toggle("active", k === i));
    btnPNG.disabled = false;
  }

  // run sends one request as an NDJSON stream: token events of sample 0 are
  // drawn into the scrolls as the engine decodes them (a preview: ranking
  // may pick another sample), then the "result" event replaces them.
  async function run(body) {
    busy = true; refresh(); stage.classList.add("busy"); showError("");
    loading.hidden = false; stage.setAttribute("aria-busy", "true");
    const t0 = performance.now();
    try {
      const headers = { "Content-Type": "application/json", "Accept": "application/x-ndjson" };
      if (apikey.value) headers["Authorization"] = "Bearer " + apikey.value;
      const res = await fetch("/generate", { method: "POST", headers, body: JSON.stringify(Object.assign({}, body, { stream: true })) });
      if (!res.ok) {
        let data = null;
        try { data = await res.json(); } catch (e) { /* non-JSON error */ }
        if (res.status === 401) keyRow.hidden = false;
        showError(data && data.error ? data.error.message : "HTTP " + res.status);
        return;
      }
      let data = null, failure = null, attempt = -1;
      const preview = { upper: "", lower: "", banner: "" };
      const onEvent = (ev) => {
        if (ev.event === "token") {
          const d = ev.data;
          if (d.sample !== 0 || d.attempt < attempt) return;
          if (d.attempt > attempt) { attempt = d.attempt; preview.upper = preview.lower = preview.banner = ""; }
          preview[d.part] += d.text;
          elUpper.textContent = preview.upper; elLower.textContent = preview.lower; elBanner.textContent = preview.banner;
        } else if (ev.event === "result") {
          data = ev.data;
        } else if (ev.event === "error") {
          failure = ev.data.error;
        }
      };
      const reader = res.body.getReader(), dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let nl;
        while ((nl = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, nl).trim();
          buf = buf.slice(nl + 1);
          if (line) onEvent(JSON.parse(line));
        }
      }
      const rtt = performance.now() - t0;
      if (failure || !data) {
        if (current >= 0) show(current); // put the last couplet back
        showError(failure ? failure.message : "响应不完整 · incomplete response");
        return;
      }
      last = body;
      couplets = data.couplets || [];
      cands.innerHTML = "";
      couplets.forEach((c, k) => {
        const li = document.createElement("li");
        // Candidates come ranked best first; the raw score means nothing
        // to a reader, so only the rank is shown.
        li.innerHTML = '<div class="l"></div><div class="l"></div><div class="l"></div>';
        li.children[0].textContent = "上联：" + c.upper;
        li.children[1].textContent = "下联：" + c.lower;
        li.children[2].textContent = "横批：" + c.banner;
        li.addEventListener("click", () => show(k));
        cands.appendChild(li);
      });
      candsPanel.hidden = couplets.length < 2;
      show(0);
      elLatency.textContent = "耗时 Latency: 服务端 server " + data.latency_ms.toFixed(1) + " ms · 往返 round-trip " + rtt.toFixed(1) + " ms";
    } catch (e) {
      showError("网络错误 · Network error: " + e.message);
    } finally {
      busy = false; stage.classList.remove("busy"); refresh();
      loading.hidden = true; stage.removeAttribute("aria-busy");
    }
  }

  function requestBody(seed) {
    const body = { prompt: text(), mode: mode.value, n: parseInt(nSel.value, 10) };
    if (mode.value !== "lower") body.length = parseInt(length.value, 10);
    if (seed !== undefined) body.seed = seed;
    return body;
  }

  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    if (!refresh() || busy) return;
    run(requestBody());
  });
  btnAnother.addEventListener("click", () => {
    if (!last || busy) return;
    // Same request without a seed: the server draws a fresh one (and an
    // idle GPU server more samples, which it does only for unseeded
    // requests).
    const body = Object.assign({}, last);
    delete body.seed;
    run(body);
  });

  // PNG export: draw the couplet on a canvas ourselves (no libraries).
  btnPNG.addEventListener("click", () => {
    const c = couplets[current];
    if (!c) return;
    const a = document.createElement("a");
    a.href = drawPNG(c).toDataURL("image/png");
    a.download = "chunlian-" + (c.banner || "couplet") + ".png";
    document.body.appendChild(a); a.click(); a.remove();
  });

  function drawPNG(c) {
    const up = Array.from(c.upper), low = Array.from(c.lower), ban = Array.from(c.banner);
    const cell = 64, pad = 24, colW = 96;
    const lines = Math.max(up.length, low.length, 1);
    const W = Math.max(560, ban.length * cell + 200), bannerH = 100;
    const H = bannerH + 40 + lines * cell + 2 * pad + 40;
    const cv = document.createElement("canvas");
    cv.width = W; cv.height = H;
    const g = cv.getContext("2d");
    const font = getComputedStyle(elUpper).fontFamily;
    g.fillStyle = "#f3e4c8"; g.fillRect(0, 0, W, H);
    const paper = (x, y, w, h) => {
      const grd = g.createLinearGradient(x, y, x + w, y + h);
      grd.addColorStop(0, "#e0243f"); grd.addColorStop(1, "#b10d27");
      g.fillStyle = grd; g.fillRect(x, y, w, h);
      g.strokeStyle = "rgba(246,201,69,.8)"; g.lineWidth = 3; g.strokeRect(x + 4, y + 4, w - 8, h - 8);
    };
    g.textAlign = "center"; g.textBaseline = "middle";
    g.font = "bold 48px " + font;
    // 横批 across the top, read right to left like the scrolls below
    // (上联 on the right): its first character is the rightmost.
    const bw = ban.length * cell + 60, bx = (W - bw) / 2;
    paper(bx, 20, bw, bannerH - 10);
    g.fillStyle = "#141414";
    ban.forEach((ch, i) => g.fillText(ch, bx + 30 + cell * (ban.length - 1 - i) + cell / 2, 20 + (bannerH - 10) / 2));
    // 上联 on the right, 下联 on the left, top to bottom.
    const top = bannerH + 40, colH = lines * cell + 2 * pad;
    const vertical = (chars, x) => {
      paper(x, top, colW, colH);
      g.fillStyle = "#141414";
      chars.forEach((ch, i) => g.fillText(ch, x + colW / 2, top + pad + cell * i + cell / 2));
    };
    vertical(up, W - 60 - colW);
    vertical(low, 60);
    // 福 diamond in the middle.
    g.save();
    g.translate(W / 2, top + 110); g.rotate(Math.PI / 4);
    paper(-48, -48, 96, 96);
    g.rotate(-Math.PI / 4);
    g.fillStyle = "#141414"; g.font = "bold 56px " + font;
    g.fillText("福", 0, 0);
    g.restore();
    return cv;
  }

  // For the browser test and the console: draw any couplet as a canvas.
  window.chunlian = { drawPNG, current: () => couplets[current] };

  // Pre-fill from ?prompt=… for links; otherwise leave empty.
  // A link like /?prompt=平安 (optionally &mode=acrostic&length=5) fills the
  // form and generates at once, so couplets can be shared as links.
  const q = new URLSearchParams(location.search);
  if (q.get("mode")) mode.value = q.get("mode");
  if (q.get("length")) length.value = q.get("length");
  if (q.get("n")) nSel.value = q.get("n");
  if (q.get("prompt")) prompt.value = q.get("prompt");
  if (refresh() && q.get("prompt")) run(requestBody(q.get("seed") ? parseInt(q.get("seed"), 10) : undefined));
})();
