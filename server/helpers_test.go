package server

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"chunlian/couplet"
	"chunlian/engine"
	"chunlian/forward"
	"chunlian/model"
)

// testModel is the shared random test model (building it is cheap, but
// sharing keeps the tests fast). It is read-only.
var testModel = sync.OnceValue(func() *model.Model { return model.NewRandom(model.TestConfig(), 7) })

// slowBackend wraps a real backend: once armed, every Forward first reports
// that a step has begun (entered, closed once) and then sleeps delay, so
// tests can act while a request is certainly in flight.
type slowBackend struct {
	forward.Backend
	armed   atomic.Bool
	delay   time.Duration
	once    sync.Once
	entered chan struct{}
}

func (b *slowBackend) Forward(batch *forward.Batch, logits []float32) error {
	if b.armed.Load() {
		b.once.Do(func() { close(b.entered) })
		time.Sleep(b.delay)
	}
	return b.Backend.Forward(batch, logits)
}

// realStack is the real stack on the random model: CPU backend (wrapped in
// slowBackend, unarmed), paged engine, couplet generator, instrumented by
// the server's metrics.
type realStack struct {
	srv  *Server
	be   *slowBackend
	eng  engine.Engine // unwrapped, for Stats
	ts   *httptest.Server
	base string
}

type stackOpts struct {
	cfg      Config
	engCfg   engine.Config
	delay    time.Duration
	noServer bool // do not start an httptest server
}

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// newRealStack builds the stack, attaches it to a new Server, warms it up
// and (unless noServer) serves it with httptest. Everything is closed at
// test cleanup.
func newRealStack(t testing.TB, o stackOpts) *realStack {
	t.Helper()
	m := testModel()
	cpu, err := forward.NewCPU(m, forward.CPUOptions{BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	be := &slowBackend{Backend: cpu, delay: o.delay, entered: make(chan struct{})}
	ec := o.engCfg
	if ec == (engine.Config{}) {
		ec = engine.DefaultConfig()
	}
	eng, err := engine.New(be, ec)
	if err != nil {
		t.Fatal(err)
	}
	if o.cfg.Logger == nil {
		o.cfg.Logger = quietLogger()
	}
	srv, err := New(o.cfg)
	if err != nil {
		t.Fatal(err)
	}
	gen, err := couplet.New(m, srv.Metrics().InstrumentEngine(eng), couplet.WithBannerSources())
	if err != nil {
		t.Fatal(err)
	}
	srv.Attach(Backend{Generator: gen, Stats: eng.Stats, ModelName: "chunlian-test", EngineName: "paged"})
	if err := srv.Warmup(context.Background()); err != nil {
		t.Fatal(err)
	}
	rs := &realStack{srv: srv, be: be, eng: eng}
	t.Cleanup(func() {
		if rs.ts != nil {
			rs.ts.Close()
		}
		eng.Close()
		cpu.Close()
	})
	if !o.noServer {
		rs.ts = httptest.NewServer(srv.Handler())
		rs.base = rs.ts.URL
	}
	return rs
}

// waitIdle polls the engine until nothing runs or waits and no KV block is
// in use, or fails after 20 s (a hang, not a timing assertion).
func waitIdle(t *testing.T, eng engine.Engine) engine.Stats {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		st := eng.Stats()
		if st.Running == 0 && st.Waiting == 0 && st.KVBlocksUsed == 0 {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("engine not idle: %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// post sends a JSON (or raw string) body and returns status, headers, body.
func post(t *testing.T, url string, body any, hdr ...string) (int, http.Header, []byte) {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		js, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(js)
	}
	req, err := http.NewRequest(http.MethodPost, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	out, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, res.Header, out
}

func get(t *testing.T, url string, hdr ...string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	out, _ := io.ReadAll(res.Body)
	return res.StatusCode, res.Header, out
}

type errBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// checkError asserts a JSON error body with a code and a bilingual message
// (some Chinese, some Latin letters, separated by " / ").
func checkError(t *testing.T, body []byte, wantCode string) {
	t.Helper()
	var e errBody
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("error body is not JSON: %q", body)
	}
	if wantCode != "" && e.Error.Code != wantCode {
		t.Errorf("code = %q, want %q (message %q)", e.Error.Code, wantCode, e.Error.Message)
	}
	if !bilingual(e.Error.Message) {
		t.Errorf("message %q is not Chinese / English", e.Error.Message)
	}
}

func bilingual(msg string) bool {
	zh, en := false, false
	for _, r := range msg {
		if r >= 0x4e00 && r <= 0x9fff {
			zh = true
		}
		if (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') {
			en = true
		}
	}
	return zh && en && strings.Contains(msg, " / ")
}

// checkCoupletText checks the seed format "上联：U\n下联：L\n横批：B" with
// equal, non-zero line lengths and a 4-character banner, and returns the parts.
func checkCoupletText(t *testing.T, text string) (upper, lower, banner string) {
	t.Helper()
	lines := strings.Split(text, "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "上联：") || !strings.HasPrefix(lines[1], "下联：") || !strings.HasPrefix(lines[2], "横批：") {
		t.Fatalf("generated_text %q not in the seed format", text)
	}
	upper, lower, banner = strings.TrimPrefix(lines[0], "上联："), strings.TrimPrefix(lines[1], "下联："), strings.TrimPrefix(lines[2], "横批：")
	if n := utf8.RuneCountInString(upper); n == 0 || n != utf8.RuneCountInString(lower) {
		t.Errorf("upper %q and lower %q differ in length", upper, lower)
	}
	if utf8.RuneCountInString(banner) != 4 {
		t.Errorf("banner %q is not 4 characters", banner)
	}
	return
}

// fakeGen is a scripted generator for HTTP-layer tests that need no model.
type fakeGen struct {
	fn func(ctx context.Context, req couplet.Request) ([]couplet.Couplet, error)
}

func (f fakeGen) Generate(ctx context.Context, req couplet.Request) ([]couplet.Couplet, error) {
	return f.fn(ctx, req)
}

var fakeCouplet = couplet.Couplet{Upper: "春回大地千山秀", Lower: "福满人间万户欢", Banner: "国泰民安", Score: -1}

// fakeServer builds a server on a fake generator (nil fn: always
// fakeCouplet), attached and warmed up, not yet serving.
func fakeServer(t *testing.T, cfg Config, fn func(ctx context.Context, req couplet.Request) ([]couplet.Couplet, error)) *Server {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if fn == nil {
		fn = func(ctx context.Context, req couplet.Request) ([]couplet.Couplet, error) {
			return []couplet.Couplet{fakeCouplet}, nil
		}
	}
	srv.Attach(Backend{Generator: fakeGen{fn}, ModelName: "fake"})
	if err := srv.Warmup(context.Background()); err != nil {
		t.Fatal(err)
	}
	return srv
}

// newFakeServer serves a fake generator (ready at once).
func newFakeServer(t *testing.T, cfg Config, fn func(ctx context.Context, req couplet.Request) ([]couplet.Couplet, error)) (*Server, string) {
	t.Helper()
	srv := fakeServer(t, cfg, fn)
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	return srv, ts.URL
}
