package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"image/png"
	"math"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// tinyOptions is a 1-second bench at the given concurrencies, no warm-up, so
// every request the fake server sees is a counted one.
func tinyOptions(conc ...int) Options {
	return Options{
		Concurrency: conc,
		Duration:    time.Second,
		Modes:       []string{"keyword", "acrostic", "lower"},
		Seed:        3,
		N:           1,
		Timeout:     10 * time.Second,
	}
}

func TestRunClosedLoopGenerate(t *testing.T) {
	f := &fakeService{}
	srv := httptest.NewServer(f.handler())
	defer srv.Close()

	var progress bytes.Buffer
	rep, err := Run(context.Background(), Config{
		Options:  tinyOptions(1, 2),
		Targets:  []Target{{Name: "target", URL: srv.URL, API: APIGenerate}},
		Progress: &progress,
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Interrupted != "" || len(rep.Targets) != 1 {
		t.Fatalf("interrupted %q, %d targets", rep.Interrupted, len(rep.Targets))
	}
	tr := rep.Targets[0]
	if len(tr.Levels) != 2 || tr.Levels[0].Concurrency != 1 || tr.Levels[1].Concurrency != 2 {
		t.Fatalf("levels %+v, want closed 1 and 2", tr.Levels)
	}
	var completed, rejected, failed int
	for _, l := range tr.Levels {
		completed += l.Completed
		rejected += l.Rejected
		failed += l.Failed
		if l.Shape != "closed" || l.Partial {
			t.Errorf("level %v: shape %q partial %v", l.Level, l.Shape, l.Partial)
		}
		if l.Completed == 0 {
			t.Errorf("level %v completed nothing", l.Level)
		}
		// Duration mode: the window is exactly --duration, and throughput is
		// the completions inside it over the window.
		if l.WindowS != 1 || l.CompletedInWindow == 0 || l.CompletedInWindow > l.Completed ||
			l.ReqPerSec != float64(l.CompletedInWindow)/l.WindowS {
			t.Errorf("level %v: window %gs, %d completed in window of %d, %g req/s", l.Level, l.WindowS, l.CompletedInWindow, l.Completed, l.ReqPerSec)
		}
		if l.Sent != l.Completed+l.Failed+l.Rejected {
			t.Errorf("level %v: sent %d ≠ %d+%d+%d", l.Level, l.Sent, l.Completed, l.Failed, l.Rejected)
		}
		if l.Latency.N != l.Completed || l.OutputTokens != fakeCoupletHan*l.Completed || l.Couplets != l.Completed {
			t.Errorf("level %v: latency N %d, tokens %d, couplets %d for %d completed", l.Level, l.Latency.N, l.OutputTokens, l.Couplets, l.Completed)
		}
		if l.Failed > 0 && l.Errors["HTTP 500: internal"] != l.Failed {
			t.Errorf("level %v: errors %v for %d failed", l.Level, l.Errors, l.Failed)
		}
		if l.TTFT.N != 0 {
			t.Errorf("TTFT measured without streaming: %+v", l.TTFT)
		}
		if l.Server.N != l.Completed || l.Server.P50 != fakeServerMS || l.Server.Max != fakeServerMS {
			t.Errorf("level %v: server time %+v, want %d × %g ms", l.Level, l.Server, l.Completed, fakeServerMS)
		}
		if h := l.LatencyHistogram; len(h) == 0 || h[len(h)-1].Count != l.Completed {
			t.Errorf("histogram +Inf bucket %v, want %d", h, l.Completed)
		}
		if l.GPUUtilPct == nil || *l.GPUUtilPct != 50 || l.GPUMemBytes == nil || *l.GPUMemBytes != 1.5e9 {
			t.Errorf("GPU util %v mem %v, want 50%% and 1.5e9 from /metrics", l.GPUUtilPct, l.GPUMemBytes)
		}
		if l.ServerRSSBytes == nil || *l.ServerRSSBytes != fakeRSS {
			t.Errorf("server RSS %v, want %g from /metrics", l.ServerRSSBytes, fakeRSS)
		}
		if l.KVLiveSlots == nil || math.Abs(*l.KVLiveSlots-0.96) > 1e-9 {
			t.Errorf("KV slots live %v, want 0.96 from /metrics", l.KVLiveSlots)
		}
		if e := l.Engine; e == nil {
			t.Errorf("level %v: no engine counters from /metrics", l.Level)
		} else if e.Rows != 15*e.Steps || math.Abs(e.HostMSPerStep-1.5) > 1e-6 || math.Abs(e.ForwardMSPerStep-2) > 1e-6 || e.RowsPerCouplet <= 0 {
			t.Errorf("level %v: engine window %+v, want 15 rows a step, 1.5 ms host and 2 ms forward per step", l.Level, *e)
		}
		if l.CPUCores == nil || *l.CPUCores < 0 || l.CPUSource != "metrics" {
			t.Errorf("CPU %v from %q, want a value from /metrics", l.CPUCores, l.CPUSource)
		}
	}
	// The server's reasons for its 503s reach the report: the fake turns
	// requests away only for a full queue, and every one of them within
	// some level's window of scrapes.
	var byServer int
	for _, l := range tr.Levels {
		if _, ok := l.RejectedBy["connections"]; ok {
			t.Errorf("level %v: rejections by reason %v, want no reason that did not grow", l.Level, l.RejectedBy)
		}
		byServer += l.RejectedBy["queue_full"]
	}
	if byServer == 0 || byServer > int(f.rejected.Load()) {
		t.Errorf("%d rejections by the server's queue_full counter, want 1..%d", byServer, f.rejected.Load())
	}
	// Server-side counts equal client-side counts: nothing was lost or
	// double counted, and 503s are rejected, not failed.
	if int64(completed) != f.ok.Load() || int64(rejected) != f.rejected.Load() || int64(failed) != f.failed.Load() {
		t.Errorf("bench completed/rejected/failed %d/%d/%d, server %d/%d/%d",
			completed, rejected, failed, f.ok.Load(), f.rejected.Load(), f.failed.Load())
	}
	if f.badPrompts.Load() != 0 {
		t.Errorf("%d prompts not from the built-in lists", f.badPrompts.Load())
	}
	for _, m := range []string{"keyword", "acrostic", "lower"} {
		if f.modes[m] == 0 {
			t.Errorf("mode %s never sent (modes %v)", m, f.modes)
		}
	}

	var md bytes.Buffer
	rep.WriteMarkdown(&md)
	for _, want := range []string{
		"| | target |",
		"| Single-request latency (mean, 1 user) |",
		"| QPS at 10 users (couplets/s) | not measured |",
		"| Peak QPS (couplets/s) |",
		"| P99 latency at 20 users | not measured |",
		"| target | 1 user |",
		"| target | 2 users |",
		"HTTP 500: internal",
		"| GPU utilisation (at peak QPS) | 50%, 1.40 GiB used |",
		"Turned away, by the server's reason",
		" × queue_full",
	} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("markdown lacks %q:\n%s", want, md.String())
		}
	}
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatalf("JSON does not round-trip: %v", err)
	}
	if len(back.Targets) != 1 || back.Targets[0].Levels[1].Completed != tr.Levels[1].Completed {
		t.Errorf("JSON round trip lost data")
	}
	if !strings.Contains(progress.String(), "target 2 users done") {
		t.Errorf("no plain progress lines: %q", progress.String())
	}
}

func TestRunOpenLoopOpenAIStream(t *testing.T) {
	f := &fakeService{}
	srv := httptest.NewServer(f.handler())
	defer srv.Close()
	o := tinyOptions()
	o.Rates = []float64{40}
	o.Requests = 12
	o.Duration = time.Minute // a cap only: the level ends after 12 requests
	o.Stream = true
	rep, err := Run(context.Background(), Config{
		Options: o,
		Targets: []Target{{Name: "oa", URL: srv.URL, API: APIOpenAI, Model: "chunlian"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	l := rep.Targets[0].Levels[0]
	if l.Shape != "open" || l.Rate != 40 {
		t.Fatalf("level %+v", l.Level)
	}
	if l.Sent != 12 || f.seq.Load() != 12 {
		t.Errorf("sent %d, server saw %d; want 12 each", l.Sent, f.seq.Load())
	}
	if int64(l.Completed) != f.ok.Load() || int64(l.Rejected) != f.rejected.Load() || int64(l.Failed) != f.failed.Load() {
		t.Errorf("bench %d/%d/%d vs server %d/%d/%d", l.Completed, l.Rejected, l.Failed, f.ok.Load(), f.rejected.Load(), f.failed.Load())
	}
	// Sequence numbers 3 and 8 are queue_full error events inside a 200
	// stream: rejected, not failed; 4 and 9 are HTTP 500s.
	if l.Rejected != 2 || l.Failed != 2 {
		t.Errorf("rejected %d failed %d, want 2 and 2", l.Rejected, l.Failed)
	}
	if l.TTFT.N != l.Completed || l.TPOT.N != l.Completed {
		t.Errorf("TTFT N %d, TPOT N %d, want %d", l.TTFT.N, l.TPOT.N, l.Completed)
	}
	if l.OutputTokens != fakeUsageTokens*l.Completed {
		t.Errorf("output tokens %d, want usage %d × %d", l.OutputTokens, fakeUsageTokens, l.Completed)
	}
	if l.TTFT.Max > l.Latency.Max {
		t.Errorf("TTFT max %g > latency max %g", l.TTFT.Max, l.Latency.Max)
	}
	if l.Server.N != 0 {
		t.Errorf("server time from a target that reports none: %+v", l.Server)
	}
}

func TestRunGenerateStream(t *testing.T) {
	f := &fakeService{noErrors: true}
	srv := httptest.NewServer(f.handler())
	defer srv.Close()
	o := tinyOptions(2)
	o.Requests = 6
	o.Stream = true
	rep, err := Run(context.Background(), Config{Options: o, Targets: []Target{{Name: "g", URL: srv.URL, API: APIGenerate}}})
	if err != nil {
		t.Fatal(err)
	}
	l := rep.Targets[0].Levels[0]
	// Token events first, then the final object: TTFT from the first token,
	// tokens from the final couplets.
	if l.Completed != 6 || l.TTFT.N != 6 || l.OutputTokens != 6*fakeCoupletHan {
		t.Errorf("completed %d TTFT N %d tokens %d", l.Completed, l.TTFT.N, l.OutputTokens)
	}
	// The stream's result event carries latency_ms as the plain answer does.
	if l.Server.N != 6 || l.Server.P50 != fakeServerMS {
		t.Errorf("server time %+v, want 6 × %g ms", l.Server, fakeServerMS)
	}
	var b strings.Builder
	rep.WriteLevelTable(&b)
	if !strings.Contains(b.String(), "| server p50 |") || !strings.Contains(b.String(), fmtMS(fakeServerMS)) {
		t.Errorf("level table lacks the server time:\n%s", b.String())
	}
}

func TestRunInterrupt(t *testing.T) {
	f := &fakeService{block: true, arrived: make(chan struct{}, 1)}
	srv := httptest.NewServer(f.handler())
	defer srv.Close()
	o := tinyOptions(2, 4)
	o.Duration = time.Minute
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-f.arrived; cancel() }() // Ctrl-C once the server is busy
	rep, err := Run(ctx, Config{Options: o, Targets: []Target{{Name: "t", URL: srv.URL, API: APIGenerate}}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Interrupted != "interrupted" {
		t.Errorf("Interrupted = %q", rep.Interrupted)
	}
	lv := rep.Targets[0].Levels
	if len(lv) != 1 || !lv[0].Partial {
		t.Fatalf("want one partial level, got %+v", lv)
	}
	// Requests cut by our own cancellation are neither failed nor completed.
	if lv[0].Failed != 0 || lv[0].Completed != 0 || lv[0].Sent != 0 {
		t.Errorf("aborted requests counted: %+v", lv[0])
	}
	var md bytes.Buffer
	rep.WriteMarkdown(&md)
	if !strings.Contains(md.String(), "Partial report: interrupted") || !strings.Contains(md.String(), "2 users (partial)") {
		t.Errorf("markdown does not flag the partial run:\n%s", md.String())
	}
}

func TestRunRefusesRemote(t *testing.T) {
	tests := []struct {
		url    string
		remote bool
		ok     bool
	}{
		{"http://192.0.2.1:8000", false, false},
		{"http://example.com", false, false},
	}
	for _, tc := range tests {
		_, err := Run(context.Background(), Config{Options: tinyOptions(1), Targets: []Target{{Name: "x", URL: tc.url, API: APIGenerate}}, AllowRemote: tc.remote})
		if (err == nil) != tc.ok || (err != nil && !strings.Contains(err.Error(), "not loopback")) {
			t.Errorf("Run(%s) err = %v, want refusal", tc.url, err)
		}
	}
}

func TestOptionsValidate(t *testing.T) {
	base := tinyOptions(1)
	tests := []struct {
		name string
		mod  func(*Options)
		ok   bool
	}{
		{"fine", func(*Options) {}, true},
		{"no levels", func(o *Options) { o.Concurrency = nil }, false},
		{"concurrency 0", func(o *Options) { o.Concurrency = []int{0} }, false},
		{"concurrency above cap", func(o *Options) { o.Concurrency = []int{MaxConcurrency + 1} }, false},
		{"rate 0", func(o *Options) { o.Rates = []float64{0} }, false},
		{"rate above cap", func(o *Options) { o.Rates = []float64{MaxRate * 2} }, false},
		{"duration above cap", func(o *Options) { o.Duration = MaxLevelDuration + time.Second }, false},
		{"zero duration", func(o *Options) { o.Duration = 0 }, false},
		{"requests above cap", func(o *Options) { o.Requests = MaxRequests + 1 }, false},
		{"timeout above cap", func(o *Options) { o.Timeout = time.Hour }, false},
		{"bad mode", func(o *Options) { o.Modes = []string{"poem"} }, false},
		{"too many levels", func(o *Options) { o.Concurrency = make([]int, MaxLevels+1) }, false},
	}
	for _, tc := range tests {
		o := base
		tc.mod(&o)
		if err := o.Validate(); (err == nil) != tc.ok {
			t.Errorf("%s: Validate() = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}

// synthReport is a two-target report with hand-picked figures.
func synthReport() *Report {
	lvl := func(c int, mean, p50, p99, qps float64) LevelResult {
		return LevelResult{Level: Level{Shape: "closed", Concurrency: c}, Completed: 10, Sent: 10,
			Latency: Summary{N: 10, Mean: mean, P50: p50, P99: p99}, ReqPerSec: qps, CoupletsPerSec: qps}
	}
	cpu := 1.5
	rep := &Report{Spawned: true, Machine: Machine{Cores: 2}, Options: Options{Modes: []string{"keyword"}, N: 1}}
	rep.Targets = []TargetResult{
		{Name: "engine", Levels: []LevelResult{lvl(1, 100, 90, 150, 10), lvl(10, 300, 280, 500, 40), lvl(20, 600, 550, 900, 50), {Level: Level{Shape: "open", Rate: 5}, Sent: 5, Completed: 5, ReqPerSec: 5, CoupletsPerSec: 5, Latency: Summary{N: 5, P50: 80, P99: 120}}}},
		{Name: "naive", Levels: []LevelResult{lvl(1, 400, 390, 500, 2.5), lvl(10, 4000, 3900, 4200, 2.5), lvl(20, 8000, 7900, 9000, 2.5)}},
	}
	rep.Targets[0].Levels[2].CPUCores = &cpu
	return rep
}

func TestMarkdownWarnsEmptyLevel(t *testing.T) {
	rep := synthReport()
	rep.Targets[1].Levels = append(rep.Targets[1].Levels, LevelResult{Level: Level{Shape: "closed", Concurrency: 50}})
	var b bytes.Buffer
	rep.WriteMarkdown(&b)
	if !strings.Contains(b.String(), "No request was sent inside the window at naive 50 users:") {
		t.Errorf("no warning for a level without requests:\n%s", b.String())
	}
}

func TestSeedTable(t *testing.T) {
	var b bytes.Buffer
	synthReport().WriteSeedTable(&b)
	got := b.String()
	// Gains by hand: latency 400/100 = 4; QPS@10 40/2.5 = 16; peak 50 vs 2.5
	// = 20; P99@20 9000/900 = 10.
	for _, want := range []string{
		"| | naive (baseline) | engine (optimised) | gain |",
		"| Single-request latency (mean, 1 user) | 400 ms | 100 ms | 4.0× |",
		"| QPS at 10 users (couplets/s) | 2.50 | 40.0 | 16.0× |",
		"| Peak QPS (couplets/s) | 2.50 (at 1 user) | 50.0 (at 20 users) | 20.0× |",
		"| P99 latency at 20 users | 9.00 s | 900 ms | 10.0× |",
		"| Server CPU (at peak QPS) | not measured | 1.50 cores (75% of 2) | — |",
		"| GPU utilisation | n/a (no GPU metrics) |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("seed table lacks %q:\n%s", want, got)
		}
	}
}

func TestWritePlots(t *testing.T) {
	dir := t.TempDir()
	files, err := synthReport().WritePlots(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"closed_latency.png", "closed_latency.svg", "closed_throughput.png", "closed_throughput.svg",
		"open_latency.png", "open_latency.svg", "open_throughput.png", "open_throughput.svg"}
	if len(files) != len(want) {
		t.Errorf("files %v, want %v", files, want)
	}
	for _, name := range want {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if len(b) == 0 {
			t.Errorf("%s is empty", name)
		}
		switch filepath.Ext(name) {
		case ".png":
			img, err := png.Decode(bytes.NewReader(b))
			if err != nil {
				t.Errorf("%s: not a PNG: %v", name, err)
			} else if r := img.Bounds(); r.Dx() < 100 || r.Dy() < 100 {
				t.Errorf("%s: tiny image %v", name, r)
			}
		case ".svg":
			var root struct{ XMLName xml.Name }
			if err := xml.Unmarshal(b, &root); err != nil || root.XMLName.Local != "svg" {
				t.Errorf("%s: not an SVG document (%v, root %q)", name, err, root.XMLName.Local)
			}
		}
	}
}

// A target that stops answering (every connection refused, nothing ever
// answered) ends the run after refusedAbort refusals, with an error on
// the target, instead of a level full of refused requests.
func TestRefusedTargetStops(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	ln.Close() // every connection is now refused
	o := tinyOptions(2, 4)
	o.Duration = time.Minute
	levels, err := measureTarget(context.Background(), Target{Name: "t", URL: url, API: APIGenerate}, o, newProgress(nil, false))
	if err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("measureTarget on a closed port: %v, want a refused error", err)
	}
	if len(levels) != 1 || levels[0].Failed > 10*refusedAbort || levels[0].Completed != 0 {
		t.Errorf("want one level stopped after ~%d refusals, got %+v", refusedAbort, levels)
	}
}

// TestPair covers the column choice of every seed-shaped table, including
// a report of the engine alone (chunlian bench --spawn engine), which used
// to print "No target was measured" above its own results.
func TestPair(t *testing.T) {
	for _, tc := range []struct {
		targets   []string
		base, opt string // "" = nil
	}{
		{[]string{"naive", "engine"}, "naive", "engine"},
		{[]string{"engine", "naive"}, "naive", "engine"},
		{[]string{"engine"}, "engine", ""},
		{[]string{"naive"}, "naive", ""},
		{[]string{"vllm"}, "vllm", ""},
		{[]string{"vllm", "engine"}, "vllm", "engine"},
		{[]string{"a", "b", "c"}, "a", "b"},
		{nil, "", ""},
	} {
		r := &Report{}
		for _, n := range tc.targets {
			r.Targets = append(r.Targets, TargetResult{Name: n})
		}
		base, opt := r.Pair()
		name := func(x *TargetResult) string {
			if x == nil {
				return ""
			}
			return x.Name
		}
		if name(base) != tc.base || name(opt) != tc.opt {
			t.Errorf("Pair(%v) = %q, %q; want %q, %q", tc.targets, name(base), name(opt), tc.base, tc.opt)
		}
	}
}

// BenchmarkSummarize: cost of the per-level statistics for 100k samples.
func BenchmarkSummarize(b *testing.B) {
	ds := make([]time.Duration, 100_000) // synthetic latencies, 0–100 ms
	for i := range ds {
		ds[i] = time.Duration((i*7919)%100_000) * time.Microsecond
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		_ = Summarize(ds)
		_ = Histogram(ds, DefaultBucketsMS)
	}
}

// BenchmarkClient measures the load generator's own ceiling: requests/s it
// can drive through HTTP against a fake service that does no work, so a
// server measured near this figure is limited by the bench, not itself.
func BenchmarkClient(b *testing.B) {
	for _, tc := range []struct {
		name   string
		api    string
		stream bool
	}{{"generate", APIGenerate, false}, {"generate-stream", APIGenerate, true}, {"openai-stream", APIOpenAI, true}} {
		b.Run(tc.name, func(b *testing.B) {
			f := &fakeService{noErrors: true, fast: true}
			srv := httptest.NewServer(f.handler())
			defer srv.Close()
			o := Options{N: 1, Stream: tc.stream}
			cl := newClient(Target{URL: srv.URL, API: tc.api}, o, 64)
			defer cl.close()
			src := newPromptSource(1, []string{"keyword"})
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if s := cl.do(context.Background(), src.next(), 10*time.Second); s.outcome != outcomeOK {
						b.Errorf("request failed: %s", s.err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
		})
	}
}

// TestUnseededBody: --unseeded leaves the sampling seed out of both APIs'
// requests; by default every request carries its prompt's seed.
func TestUnseededBody(t *testing.T) {
	p := Prompt{Text: "平安", Mode: "keyword", Seed: 42}
	for _, api := range []string{APIGenerate, APIOpenAI} {
		for _, unseeded := range []bool{false, true} {
			c := newClient(Target{URL: "http://127.0.0.1:1", API: api}, Options{N: 1, Unseeded: unseeded}, 1)
			b, _ := c.body(p)
			var m map[string]any
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatal(err)
			}
			if _, has := m["seed"]; has == unseeded {
				t.Errorf("%s, unseeded %v: body %s", api, unseeded, b)
			}
		}
	}
}
