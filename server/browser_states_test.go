package server

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestBrowserPageStates checks the page as a visitor meets it: 生成 works
// with the placeholder word on an empty field, a loading state shows while
// the couplet is written, no raw score is shown, and an error disappears
// once the input is edited.
func TestBrowserPageStates(t *testing.T) {
	chrome := findChromium(t)
	if testing.Short() {
		t.Skip("browser test skipped in -short mode")
	}
	rs := newRealStack(t, stackOpts{delay: 20 * time.Millisecond})
	step := startBrowser(t, chrome, 1200, 900)
	check := func(js, what string) {
		t.Helper()
		ok, err := chromedp.Run(step, chromedp.Evaluate[bool](js))
		if err != nil || !ok {
			t.Errorf("%s (err %v)", what, err)
		}
	}
	if err := chromedp.Do(step, chromedp.Navigate(rs.base+"/"), chromedp.WaitVisible("#prompt")); err != nil {
		t.Fatal(err)
	}
	check(`document.getElementById("prompt").value === "" && !document.getElementById("generate").disabled`,
		"生成 is disabled on an empty field although the placeholder 平安 is a valid word")
	rs.be.armed.Store(true) // slow steps: the loading state is certainly visible
	if err := chromedp.Do(step, chromedp.Click("#generate")); err != nil {
		t.Fatal(err)
	}
	check(`!document.getElementById("loading").hidden && document.getElementById("stage").getAttribute("aria-busy") === "true"`,
		"no visible loading state while generating")
	if _, err := chromedp.Run(step, chromedp.Poll[bool](`document.getElementById("loading").hidden && document.getElementById("upper").textContent.length > 0`,
		chromedp.WithPollingTimeout(60*time.Second))); err != nil {
		msg, _ := chromedp.Run(step, chromedp.TextContent("#error"))
		t.Fatalf("no couplet from the placeholder word: %v (page error %q)", err, msg)
	}
	rs.be.armed.Store(false)
	check(`!/score|得分|-?\d+\.\d{3}/.test(document.body.innerText)`, "a raw score is shown to the user")
	// A server-side error (a character the model does not know), then an edit.
	if _, err := chromedp.Run(step, chromedp.Evaluate[bool](`(() => { const p = document.getElementById("prompt"); p.value = "龘龘"; p.dispatchEvent(new Event("input")); return true; })()`)); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(step, chromedp.WaitEnabled("#generate"), chromedp.Click("#generate")); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(step, chromedp.Poll[bool](`!document.getElementById("error").hidden`, chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		t.Fatalf("no error shown for an unknown character: %v", err)
	}
	check(`!document.getElementById("error").textContent.includes("[")`, "the error shows an internal code")
	if err := chromedp.Do(step, chromedp.SendKeys("#prompt", "\b")); err != nil {
		t.Fatal(err)
	}
	check(`document.getElementById("error").hidden`, "the old error stays after the input changed")
}

// TestBrowserDashboardPhone opens the dashboard on a 390 px wide phone
// viewport: nothing overflows horizontally, a CPU server shows no GPU
// legend, percentages are labelled as such, and a screenshot is saved.
func TestBrowserDashboardPhone(t *testing.T) {
	chrome := findChromium(t)
	if testing.Short() {
		t.Skip("browser test skipped in -short mode")
	}
	rs := newRealStack(t, stackOpts{})
	post(t, rs.base+"/generate", `{"prompt":"平安"}`)
	post(t, rs.base+"/generate", `{"prompt":"ab"}`) // a client error: not a failure
	step := startBrowser(t, chrome, 390, 844)
	if err := chromedp.Do(step, chromedp.Navigate(rs.base+"/dashboard"), chromedp.WaitVisible("#c-qps .uplot")); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(step, chromedp.Poll[bool](`document.getElementById("t-tot").textContent === "1/0/0" && document.getElementById("t-client").textContent === "1"`,
		chromedp.WithPollingTimeout(20*time.Second))); err != nil {
		got, _ := chromedp.Run(step, chromedp.Evaluate[string](`document.getElementById("t-tot").textContent + " client " + document.getElementById("t-client").textContent`))
		t.Errorf("tiles ok/fail/reject + client = %q, want 1/0/0 and 1: %v", got, err)
	}
	time.Sleep(1500 * time.Millisecond) // a second tick: charts resized to the phone
	res, err := chromedp.Run(step, chromedp.Evaluate[string](`(() => {
		const de = document.documentElement, out = [];
		if (de.scrollWidth > de.clientWidth) out.push("page " + de.scrollWidth + " > " + de.clientWidth);
		document.querySelectorAll(".chart, .tile, .uplot").forEach((el) => {
			const r = el.getBoundingClientRect();
			if (r.right > de.clientWidth + 0.5) out.push(el.className + " ends at " + r.right);
		});
		if (/GPU/.test(document.querySelector(".charts").innerText)) out.push("GPU legend on a CPU server");
		if (!document.getElementById("key-row").hidden || document.getElementById("key-row").offsetHeight > 0) out.push("API key field shown on a server without a key");
		if (!/%$/.test(document.getElementById("t-kv").textContent)) out.push("KV tile " + document.getElementById("t-kv").textContent + " without %");
		return out.join("; ");
	})()`))
	if err != nil || res != "" {
		t.Errorf("dashboard at 390 px: %s (err %v)", res, err)
	}
	shot, err := chromedp.Run(step, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(artifactDir(t), "browser-dashboard-390.png")
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
}
