package server

import (
	"context"
	"encoding/base64"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/chromedp/chromedp"
)

// findChromium returns the browser to drive, or skips (outside CI) / fails
// (in CI, where .ci/run installs Debian's chromium).
func findChromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("Chromium not found in PATH, but CI is set: the browser test must run in CI (apt-get install chromium)")
	}
	t.Skip("Chromium not found in PATH; skipping the real-browser test (install it with: apt-get install -y chromium)")
	return ""
}

// artifactDir is $CHUNLIAN_ARTIFACTS (created if needed) or a test temp dir.
func artifactDir(t *testing.T) string {
	t.Helper()
	if d := os.Getenv("CHUNLIAN_ARTIFACTS"); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	return t.TempDir()
}

// startBrowser starts headless Chromium with a w×h viewport and returns a
// context bounding every step (90 s); it is closed at test cleanup.
func startBrowser(t *testing.T, chrome string, w, h int64) context.Context {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chrome),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("no-default-browser-check", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(int(w), int(h)),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	// Start the browser on a context without a deadline (see chromedp.Run),
	// then bound every later step.
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(w, h)); err != nil {
		cancel()
		cancelAlloc()
		t.Fatalf("starting Chromium (%s): %v", chrome, err)
	}
	step, stop := context.WithTimeout(ctx, 90*time.Second)
	t.Cleanup(func() { stop(); cancel(); cancelAlloc() })
	return step
}

// TestBrowserPage drives headless Chromium against the real stack on the
// random test model: it types 平安, clicks 生成 and waits for a couplet
// whose two lines have the same (non-zero) length; it also checks the
// as-you-type validation, the PNG export and that the dashboard draws its
// charts. Screenshots go to the artifact dir.
func TestBrowserPage(t *testing.T) {
	chrome := findChromium(t)
	if testing.Short() {
		t.Skip("browser test skipped in -short mode")
	}
	rs := newRealStack(t, stackOpts{})
	dir := artifactDir(t)

	step := startBrowser(t, chrome, 1200, 900)

	// Validation as you type: Latin input disables 生成.
	err := chromedp.Do(step,
		chromedp.Navigate(rs.base+"/"),
		chromedp.WaitVisible("#prompt"),
		chromedp.SendKeys("#prompt", "ab"),
	)
	if err != nil {
		t.Fatal(err)
	}
	invalid, err := chromedp.Run(step, chromedp.Evaluate[bool](`document.getElementById("generate").disabled && document.getElementById("hint").classList.contains("bad")`))
	if err != nil || !invalid {
		t.Fatalf("typing 'ab' did not disable 生成 / show the hint (err %v)", err)
	}

	// Type 平安 and generate.
	t.Log("typing 平安")
	if _, err := chromedp.Run(step, chromedp.Evaluate[bool](`(() => { const p = document.getElementById("prompt"); p.value = ""; p.dispatchEvent(new Event("input")); return true; })()`)); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(step, chromedp.SendKeys("#prompt", "平安")); err != nil {
		t.Fatal(err)
	}
	val, _ := chromedp.Run(step, chromedp.Evaluate[string](`document.getElementById("prompt").value + " | " + document.getElementById("hint").textContent`))
	t.Logf("input now: %s", val)
	if err := chromedp.Do(step, chromedp.WaitEnabled("#generate"), chromedp.Click("#generate")); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(step, chromedp.Poll[bool](`document.getElementById("upper").textContent.length > 0 && document.getElementById("latency").textContent.length > 0`,
		chromedp.WithPollingTimeout(60*time.Second))); err != nil {
		msg, _ := chromedp.Run(step, chromedp.TextContent("#error"))
		t.Fatalf("no couplet appeared: %v (page error: %q)", err, msg)
	}
	text := func(sel string) string {
		s, err := chromedp.Run(step, chromedp.Evaluate[string](`document.querySelector("`+sel+`").textContent`))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	upper, lower, banner := text("#upper"), text("#lower"), text("#banner")
	t.Logf("page shows 上联 %q 下联 %q 横批 %q; %s", upper, lower, banner, text("#latency"))
	if n := utf8.RuneCountInString(upper); n == 0 || n != utf8.RuneCountInString(lower) {
		t.Errorf("upper %q and lower %q differ in length", upper, lower)
	}
	if utf8.RuneCountInString(banner) != 4 {
		t.Errorf("banner %q is not 4 characters", banner)
	}
	// 上联 is drawn to the right of 下联, vertically.
	layout, err := chromedp.Run(step, chromedp.Evaluate[bool](`(() => {
		const u = document.getElementById("upper"), l = document.getElementById("lower");
		return u.getBoundingClientRect().left > l.getBoundingClientRect().right &&
			getComputedStyle(u).writingMode === "vertical-rl" && getComputedStyle(l).writingMode === "vertical-rl";
	})()`))
	if err != nil || !layout {
		t.Errorf("上联 not on the right in vertical text (err %v)", err)
	}
	// The 横批 follows the same convention: read right to left, its first
	// character rightmost, and the page says so.
	rtl, err := chromedp.Run(step, chromedp.Evaluate[bool](`(() => {
		const b = document.getElementById("banner"), r = document.createRange();
		const t = b.firstChild; if (!t || t.length < 2) return false;
		r.setStart(t, 0); r.setEnd(t, 1); const first = r.getBoundingClientRect();
		r.setStart(t, t.length - 1); r.setEnd(t, t.length); const last = r.getBoundingClientRect();
		return first.left > last.left && document.querySelector(".convention").textContent.includes("自右向左");
	})()`))
	if err != nil || !rtl {
		t.Errorf("横批 not drawn right to left, or the convention not stated (err %v)", err)
	}
	checkExportAndPick(t, step, dir)
	// 换一副 sends a new request (new request → new latency line).
	before := text("#latency")
	if err := chromedp.Do(step, chromedp.WaitEnabled("#another"), chromedp.Click("#another")); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(step, chromedp.Poll[bool](`document.getElementById("latency").textContent !== `+strconv.Quote(before)+` && !document.getElementById("generate").disabled`,
		chromedp.WithPollingTimeout(60*time.Second))); err != nil {
		t.Errorf("换一副 did not produce a new couplet: %v", err)
	}
	if u, l := text("#upper"), text("#lower"); utf8.RuneCountInString(u) == 0 || utf8.RuneCountInString(u) != utf8.RuneCountInString(l) {
		t.Errorf("after 换一副: upper %q lower %q", u, l)
	}
	shot, err := chromedp.Run(step, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "browser-page.png")
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)

	checkDashboard(t, step, rs.base, dir)
}

// checkDashboard opens the dashboard after two requests: charts exist, the
// tiles fill from /api/stats, nothing overflows; a screenshot is saved.
func checkDashboard(t *testing.T, step context.Context, base, dir string) {
	t.Helper()
	// Dashboard: charts exist and the tiles fill from /api/stats.
	err := chromedp.Do(step, chromedp.Navigate(base+"/dashboard"), chromedp.WaitVisible("#c-qps .uplot"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(step, chromedp.Poll[bool](`document.getElementById("t-tot").textContent.startsWith("2/")`,
		chromedp.WithPollingTimeout(20*time.Second))); err != nil {
		t.Errorf("dashboard tiles did not show the request: %v", err)
	}
	fits, err := chromedp.Run(step, chromedp.Evaluate[bool](`document.documentElement.scrollWidth <= document.documentElement.clientWidth`))
	if err != nil || !fits {
		t.Errorf("dashboard overflows horizontally (err %v)", err)
	}
	charts, err := chromedp.Run(step, chromedp.Evaluate[int](`document.querySelectorAll(".uplot canvas").length`))
	if err != nil || charts != 5 {
		t.Errorf("dashboard has %d chart canvases, want 5 (err %v)", charts, err)
	}
	shot, err := chromedp.Run(step, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "browser-dashboard.png")
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
}

// checkExportAndPick checks the PNG export (saved as an artifact) and that
// clicking the second candidate shows it.
func checkExportAndPick(t *testing.T, step context.Context, dir string) {
	t.Helper()
	// PNG export draws a real image (saved as an artifact too).
	dataURL, err := chromedp.Run(step, chromedp.Evaluate[string](`window.chunlian.drawPNG(window.chunlian.current()).toDataURL("image/png")`))
	const prefix = "data:image/png;base64,"
	png, derr := base64.StdEncoding.DecodeString(strings.TrimPrefix(dataURL, prefix))
	if err != nil || derr != nil || !strings.HasPrefix(dataURL, prefix) || len(png) < 4000 || string(png[1:4]) != "PNG" {
		t.Errorf("PNG export: %d bytes (err %v, %v)", len(png), err, derr)
	} else {
		path := filepath.Join(dir, "browser-export.png")
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("exported PNG: %s", path)
	}
	// Picking another candidate shows it.
	picked, err := chromedp.Run(step, chromedp.Evaluate[bool](`(() => {
		const li = document.querySelectorAll("#candidates li");
		if (li.length < 2) return false;
		li[1].click();
		const c = window.chunlian.current();
		return li[1].classList.contains("active") && document.getElementById("upper").textContent === c.upper &&
			li[1].textContent.includes(c.upper);
	})()`))
	if err != nil || !picked {
		t.Errorf("clicking the second candidate did not show it (err %v)", err)
	}
}
