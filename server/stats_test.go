package server

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"chunlian/couplet"
	"chunlian/engine"
)

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newJSONLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func TestRollingStats(t *testing.T) {
	r := newRollingStats()
	base := time.Unix(1_000_000, 0)
	at := func(sec int64, ms int) time.Time {
		return base.Add(time.Duration(sec)*time.Second + time.Duration(ms)*time.Millisecond)
	}
	// Second 0: 4 ok (10, 20, 30, 40 ms), 1 failed (500), 1 rejected (503).
	for i, ms := range []int{10, 20, 30, 40} {
		r.record(at(0, i*100), time.Duration(ms)*time.Millisecond, 200)
	}
	r.record(at(0, 500), time.Second, 500)
	r.record(at(0, 600), time.Millisecond, 503)
	// Second 2: 2 ok (100, 200 ms); gauges sampled in seconds 0 and 2.
	r.record(at(2, 0), 100*time.Millisecond, 200)
	r.record(at(2, 1), 200*time.Millisecond, 200)
	r.sample(at(0, 900), gaugeSample{valid: true, running: 3, waiting: 1, kv: 0.25, genTokens: 100, prefixQ: 10, prefixH: 4})
	r.sample(at(2, 900), gaugeSample{valid: true, running: 1, waiting: 0, kv: 0.5, genTokens: 300, prefixQ: 20, prefixH: 10})

	sum, ser := r.snapshot(at(3, 500)) // series covers seconds -57..2
	n := len(ser.T)
	if n != statsWindow || ser.T[n-1] != base.Unix()+2 {
		t.Fatalf("series len %d last %d", n, ser.T[n-1])
	}
	i0, i1, i2 := n-3, n-2, n-1
	if ser.QPS[i0] != 4 || ser.QPS[i1] != 0 || ser.QPS[i2] != 2 || ser.Errors[i0] != 2 {
		t.Errorf("qps %v %v %v errors %v", ser.QPS[i0], ser.QPS[i1], ser.QPS[i2], ser.Errors[i0])
	}
	// Point 0 pools second 0 only: {10,20,30,40} → p50 20, p99 40.
	if *ser.P50[i0] != 20 || *ser.P99[i0] != 40 {
		t.Errorf("p50/p99 at second 0: %v %v", *ser.P50[i0], *ser.P99[i0])
	}
	// Point 2 pools seconds -2..2: {10,20,30,40,100,200} → p50 30, p90 200.
	if *ser.P50[i2] != 30 || *ser.P90[i2] != 200 {
		t.Errorf("p50/p90 at second 2: %v %v", *ser.P50[i2], *ser.P90[i2])
	}
	if ser.P50[0] != nil || ser.Running[i1] != nil {
		t.Error("empty seconds must be null")
	}
	if *ser.Running[i0] != 3 || *ser.KVUsagePerc[i2] != 50 {
		t.Errorf("gauges %v %v", *ser.Running[i0], *ser.KVUsagePerc[i2])
	}
	// Tokens/s between the samples at seconds 0 and 2: (300-100)/2.
	if ser.TokensPerSec[i2] == nil || *ser.TokensPerSec[i2] != 100 {
		t.Errorf("tokens/s %v", ser.TokensPerSec[i2])
	}
	if sum.QPS10s != 0.6 || sum.Latency60s.Count != 6 || *sum.Latency60s.Max != 200 || *sum.Latency60s.P50 != 30 {
		t.Errorf("summary %+v", sum)
	}
	if sum.RequestsOK != 6 || sum.RequestsFailed != 1 || sum.RequestsRejected != 1 {
		t.Errorf("totals %+v", sum)
	}
	if sum.PrefixHitRate == nil || *sum.PrefixHitRate != 0.5 || sum.Running != 1 || sum.KVUsagePerc != 50 {
		t.Errorf("current gauges %+v", sum)
	}
	// 200 s later everything has left the window (the ring is reused).
	sum, ser = r.snapshot(at(200, 0))
	if sum.Latency60s.Count != 0 || ser.QPS[len(ser.QPS)-1] != 0 {
		t.Errorf("stale data in the window: %+v", sum.Latency60s)
	}
}

// Reservoir sampling keeps at most maxLatSamples per second but counts all.
func TestRollingStatsBoundedMemory(t *testing.T) {
	r := newRollingStats()
	now := time.Unix(5000, 0)
	for i := range 3 * maxLatSamples {
		r.record(now, time.Duration(i)*time.Microsecond, 200)
	}
	b := r.peek(now.Unix())
	if len(b.lat) != maxLatSamples || b.ok != 3*maxLatSamples {
		t.Errorf("kept %d latencies, counted %d", len(b.lat), b.ok)
	}
}

// /metrics after real traffic: vLLM-style names, non-zero token counters
// and histogram counts, process and Go collectors.
func TestMetricsEndpoint(t *testing.T) {
	rs := newRealStack(t, stackOpts{})
	for i := range 3 {
		if code, _, body := post(t, rs.base+"/generate", map[string]any{"prompt": "平安", "seed": i + 2}); code != 200 {
			t.Fatalf("%d: %s", code, body)
		}
	}
	code, hdr, body := get(t, rs.base+"/metrics")
	if code != 200 || !strings.HasPrefix(hdr.Get("Content-Type"), "text/plain") {
		t.Fatalf("status %d type %q", code, hdr.Get("Content-Type"))
	}
	text := string(body)
	value := func(name string) float64 {
		m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` ([0-9.e+-]+)$`).FindStringSubmatch(text)
		if m == nil {
			t.Errorf("metric %s missing", name)
			return -1
		}
		v, _ := strconv.ParseFloat(m[1], 64)
		return v
	}
	const mn = `{model_name="chunlian-test"}` // the engine metrics carry the model's name, as vLLM's do
	for _, name := range []string{"chunlian:prompt_tokens_total" + mn, "chunlian:generation_tokens_total" + mn,
		"chunlian:time_to_first_token_seconds_count" + mn, "chunlian:e2e_request_latency_seconds_count" + mn,
		"chunlian:request_queue_time_seconds_count" + mn, "chunlian:time_per_output_token_seconds_count" + mn,
		"chunlian:prefix_cache_queries_total" + mn, "chunlian:engine_steps_total" + mn, "chunlian:engine_computed_tokens_total" + mn,
		"chunlian:engine_logit_rows_total" + mn, "chunlian:engine_sampled_tokens_total" + mn, "chunlian:engine_jump_tokens_total" + mn,
		`chunlian:engine_step_seconds_total{model_name="chunlian-test",phase="forward"}`, `chunlian:engine_step_seconds_total{model_name="chunlian-test",phase="consume"}`,
		"chunlian:ready", "process_cpu_seconds_total"} {
		if v := value(name); v <= 0 {
			t.Errorf("%s = %v, want > 0", name, v)
		}
	}
	for _, name := range []string{"chunlian:num_requests_running" + mn, "chunlian:num_requests_waiting" + mn, "chunlian:kv_cache_usage_perc" + mn,
		"chunlian:prefix_cache_hits_total" + mn, "chunlian:num_preemptions_total" + mn,
		"chunlian:kept_samples" + mn, "chunlian:kept_samples_dropped_total" + mn} {
		if v := value(name); v < 0 {
			t.Errorf("%s = %v", name, v)
		}
	}
	for _, s := range []string{`chunlian:request_success_total{finished_reason="`, `chunlian:http_requests_total{code="200",path="/generate"} 3`,
		"go_goroutines", `chunlian:time_to_first_token_seconds_bucket{model_name="chunlian-test",le="`,
		`chunlian_build_info{build_date="`, `,goversion="` + runtime.Version() + `",platform="`} {
		if !strings.Contains(text, s) {
			t.Errorf("/metrics lacks %s", s)
		}
	}
	if !regexp.MustCompile(`(?m)^chunlian_build_info\{.*revision=".+".*\} 1$`).MatchString(text) {
		t.Error("chunlian_build_info is not 1 with a revision label")
	}
	if strings.Contains(text, "chunlian:gpu_utilization_perc") {
		t.Error("GPU metrics without a GPU hook")
	}
}

// The live-slot share is the engine's KVSlotsLive / KVSlotsAllocated.
func TestKVLiveSlotsMetric(t *testing.T) {
	for _, tc := range []struct {
		live, alloc int
		want        string
	}{
		{30, 40, `chunlian:kv_cache_live_slots_perc{model_name="fake"} 0.75`},
		{0, 0, "chunlian:kv_cache_live_slots_perc{model_name=\"fake\"} 0\n"},
	} {
		srv, base := newFakeServer(t, Config{}, nil)
		b := *srv.backend.Load()
		b.Stats = func() engine.Stats {
			return engine.Stats{KVBlocksUsed: 10, KVBlocksTotal: 20, KVSlotsLive: tc.live, KVSlotsAllocated: tc.alloc}
		}
		srv.Attach(b)
		_, _, body := get(t, base+"/metrics")
		if !strings.Contains(string(body), tc.want) {
			t.Errorf("live %d of %d: /metrics lacks %q", tc.live, tc.alloc, tc.want)
		}
	}
}

func TestGPUHook(t *testing.T) {
	srv, base := newFakeServer(t, Config{}, nil)
	b := *srv.backend.Load()
	b.GPU = func() (GPUStats, bool) {
		return GPUStats{UtilizationPerc: 87, MemoryUsedBytes: 3 << 30, MemoryTotalBytes: 12 << 30}, true
	}
	srv.Attach(b)
	_, _, body := get(t, base+"/metrics")
	if !strings.Contains(string(body), `chunlian:gpu_utilization_perc{model_name="fake"} 87`) {
		t.Errorf("GPU utilisation missing from /metrics")
	}
	_, _, body = get(t, base+"/api/stats")
	var snap statsSnapshot
	if err := json.Unmarshal(body, &snap); err != nil || snap.Summary.GPU == nil || snap.Summary.GPU.UtilizationPerc != 87 {
		t.Errorf("GPU missing from /api/stats: %s", body)
	}
}

func TestStatsEndpoint(t *testing.T) {
	rs := newRealStack(t, stackOpts{})
	for i := range 3 {
		post(t, rs.base+"/generate", map[string]any{"prompt": "吉祥", "seed": i + 1})
	}
	post(t, rs.base+"/generate", `{"prompt":"x"}`) // a 400 is not a generation: not counted
	code, _, body := get(t, rs.base+"/api/stats")
	var snap statsSnapshot
	if code != 200 || json.Unmarshal(body, &snap) != nil {
		t.Fatalf("status %d: %s", code, body)
	}
	if !snap.Ready || snap.Model != "chunlian-test" || snap.Window != statsWindow || len(snap.Series.T) != statsWindow {
		t.Errorf("snapshot header %+v", snap)
	}
	// The warm-up is not an HTTP request; the three generations are.
	if snap.Summary.RequestsOK != 3 || snap.Summary.Latency60s.Count != 3 || snap.Summary.GenerationTokens <= 0 {
		t.Errorf("summary %+v", snap.Summary)
	}
	for name, l := range map[string]int{"qps": len(snap.Series.QPS), "p99": len(snap.Series.P99), "running": len(snap.Series.Running),
		"kv": len(snap.Series.KVUsagePerc), "tokens": len(snap.Series.TokensPerSec), "gpu": len(snap.Series.GPUUtilPerc)} {
		if l != statsWindow {
			t.Errorf("series %s has %d points", name, l)
		}
	}
}

// The pages are embedded and reference only local assets (offline).
func TestWebAssetsOffline(t *testing.T) {
	_, base := newFakeServer(t, Config{}, nil)
	for _, tc := range []struct{ path, want, ctype string }{
		{"/", "生成", "text/html"},
		{"/", `id="upper"`, "text/html"},
		{"/dashboard", "uPlot.iife.min.js", "text/html"},
		{"/static/app.js", "drawPNG", "text/javascript"},
		{"/static/style.css", "vertical-rl", "text/css"},
		{"/static/vendor/uPlot.iife.min.js", "uPlot", ""},
		{"/static/vendor/uPlot.min.css", ".uplot", "text/css"},
		{"/static/dashboard.js", "/api/stats", ""},
	} {
		code, hdr, body := get(t, base+tc.path)
		if code != 200 || !strings.Contains(string(body), tc.want) || !strings.HasPrefix(hdr.Get("Content-Type"), tc.ctype) {
			t.Errorf("%s: status %d type %q, contains %q: %v", tc.path, code, hdr.Get("Content-Type"), tc.want, strings.Contains(string(body), tc.want))
		}
	}
	if code, _, _ := get(t, base+"/static/vendor/"); code != 404 {
		t.Errorf("directory listing: %d", code)
	}
	ext := regexp.MustCompile(`(?i)(src|href)\s*=\s*["']?(https?:)?//`)
	for _, p := range []string{"web/index.html", "web/dashboard.html"} {
		b, err := web.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ext.FindAllIndex(b, -1) {
			line := string(b[m[0]:min(len(b), m[1]+60)])
			if !strings.Contains(line, "github.com/leeoniya/uPlot") { // the footer's credit link is not an asset
				t.Errorf("%s references a remote asset: %s", p, line)
			}
		}
	}
}

// Client errors (4xx) are counted apart, not as failures of the service;
// refusals (503) as rejected.
func TestStatsClientErrorsNotFailures(t *testing.T) {
	_, base := newFakeServer(t, Config{}, func(ctx context.Context, req couplet.Request) ([]couplet.Couplet, error) {
		if req.Text == "吉祥" { // an input error found by the generator while running
			return nil, &couplet.InputError{Code: couplet.CodeUnknownChar, Message: "模型不认识 / unknown"}
		}
		return []couplet.Couplet{fakeCouplet}, nil
	})
	post(t, base+"/generate", `{"prompt":"吉祥"}`)
	post(t, base+"/generate", `{"prompt":"ab"}`)
	post(t, base+"/generate", `{"prompt":"平安"}`)
	_, _, body := get(t, base+"/api/stats")
	var s struct {
		Summary struct {
			OK     int64 `json:"requests_ok_total"`
			Failed int64 `json:"requests_failed_total"`
			Client int64 `json:"requests_client_error_total"`
		} `json:"summary"`
	}
	if err := json.Unmarshal(body, &s); err != nil {
		t.Fatal(err)
	}
	if s.Summary.OK != 1 || s.Summary.Failed != 0 || s.Summary.Client != 2 {
		t.Errorf("ok/failed/client = %d/%d/%d, want 1/0/2", s.Summary.OK, s.Summary.Failed, s.Summary.Client)
	}
}
