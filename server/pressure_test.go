package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"chunlian/couplet"
	"chunlian/engine"
)

func newHTTPTest(t testing.TB, srv *Server) string {
	t.Helper()
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	return ts.URL
}

// The HTTP layer's in-flight bound: with MaxInFlight requests busy the next
// one is rejected at once with 503 + Retry-After, and accepted again after.
func TestInFlightBound(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 8)
	_, base := newFakeServer(t, Config{MaxInFlight: 2}, func(ctx context.Context, req couplet.Request) ([]couplet.Couplet, error) {
		if req.Seed == 1 { // warm-up
			return []couplet.Couplet{fakeCouplet}, nil
		}
		started <- struct{}{}
		<-release
		return []couplet.Couplet{fakeCouplet}, nil
	})
	var wg sync.WaitGroup
	codes := make(chan int, 2)
	for range 2 {
		wg.Go(func() {
			code, _, _ := post(t, base+"/generate", `{"prompt":"平安","seed":7}`)
			codes <- code
		})
	}
	<-started
	<-started
	code, hdr, body := post(t, base+"/generate", `{"prompt":"平安","seed":7}`)
	if code != http.StatusServiceUnavailable || hdr.Get("Retry-After") == "" {
		t.Fatalf("third request: status %d Retry-After %q", code, hdr.Get("Retry-After"))
	}
	checkError(t, body, codeOverloaded)
	close(release)
	wg.Wait()
	for range 2 {
		if c := <-codes; c != 200 {
			t.Errorf("in-flight request: %d", c)
		}
	}
	if code, _, _ := post(t, base+"/generate", `{"prompt":"平安","seed":7}`); code != 200 {
		t.Errorf("after release: %d", code)
	}
}

// The engine's bounded queue (--max-queue): while the engine is busy, only
// MaxQueue requests may wait; the rest get 503 + Retry-After at once.
func TestEngineQueueFull(t *testing.T) {
	ec := engine.DefaultConfig()
	ec.MaxQueue = 1
	rs := newRealStack(t, stackOpts{engCfg: ec, delay: 30 * time.Millisecond})
	rs.be.armed.Store(true)
	first := make(chan int, 1)
	go func() {
		code, _, _ := post(t, rs.base+"/generate", `{"prompt":"平安","seed":5}`)
		first <- code
	}()
	<-rs.be.entered // the engine loop is now stepping the first request
	const extra = 6
	codes := make(chan int, extra)
	var wg sync.WaitGroup
	for i := range extra {
		wg.Go(func() {
			code, hdr, body := post(t, rs.base+"/generate", fmt.Sprintf(`{"prompt":"吉祥","seed":%d}`, 10+i))
			if code == http.StatusServiceUnavailable {
				if hdr.Get("Retry-After") == "" {
					t.Error("503 without Retry-After")
				}
				checkError(t, body, codeQueueFull)
			}
			codes <- code
		})
	}
	wg.Wait()
	close(codes)
	ok, rejected := 0, 0
	for c := range codes {
		switch c {
		case 200:
			ok++
		case 503:
			rejected++
		default:
			t.Errorf("unexpected status %d", c)
		}
	}
	if rejected == 0 {
		t.Errorf("no request rejected with MaxQueue=1 (%d ok)", ok)
	}
	if c := <-first; c != 200 {
		t.Errorf("first request: %d", c)
	}
	_, _, m := get(t, rs.base+"/metrics")
	if !strings.Contains(string(m), `chunlian:requests_rejected_total{reason="queue_full"}`) {
		t.Error("queue_full rejections not in /metrics")
	}
	waitIdle(t, rs.eng)
}

// A client that disconnects cancels its request: the engine aborts it and
// frees its KV blocks.
func TestClientDisconnectFreesBlocks(t *testing.T) {
	rs := newRealStack(t, stackOpts{delay: 20 * time.Millisecond})
	rs.be.armed.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, rs.base+"/generate", strings.NewReader(`{"prompt":"平安","n":4}`))
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err == nil {
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
		}
		done <- err
	}()
	<-rs.be.entered
	// Wait until the engine's published stats show the request holding blocks.
	for deadline := time.Now().Add(10 * time.Second); ; {
		if st := rs.eng.Stats(); st.KVBlocksUsed > 0 && st.Running > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("request never seen running: %+v", rs.eng.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("client: %v (the request finished before the cancel?)", err)
	}
	st := waitIdle(t, rs.eng)
	if st.KVBlocksUsed != 0 {
		t.Errorf("KV blocks still used: %+v", st)
	}
	// The abort is visible in metrics.
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, _, m := get(t, rs.base+"/metrics")
		if strings.Contains(string(m), `chunlian:request_success_total{finished_reason="abort",model_name=`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no abort counted in chunlian:request_success_total")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// --request-timeout: a generation that outlives it gets 504 with a clear
// error, and the engine frees the request.
func TestRequestTimeout(t *testing.T) {
	rs := newRealStack(t, stackOpts{cfg: Config{RequestTimeout: 60 * time.Millisecond}, delay: 25 * time.Millisecond})
	rs.be.armed.Store(true)
	code, _, body := post(t, rs.base+"/generate", `{"prompt":"平安"}`)
	if code != http.StatusGatewayTimeout {
		t.Fatalf("status %d: %s", code, body)
	}
	checkError(t, body, codeTimeout)
	if !strings.Contains(string(body), "60ms") {
		t.Errorf("timeout message does not name the limit: %s", body)
	}
	waitIdle(t, rs.eng)
}

// Graceful shutdown: cancelling Serve's context (what SIGTERM does in
// `chunlian serve`) closes the listener, lets the in-flight request finish
// with 200, and Serve returns nil.
func TestGracefulDrain(t *testing.T) {
	rs := newRealStack(t, stackOpts{noServer: true, delay: 15 * time.Millisecond})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + ln.Addr().String()
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- rs.srv.Serve(ctx, ln) }()
	if code, _, _ := get(t, base+"/ready"); code != 200 {
		t.Fatalf("/ready = %d", code)
	}
	rs.be.armed.Store(true)
	inflight := make(chan int, 1)
	go func() {
		code, _, body := post(t, base+"/generate", `{"prompt":"平安"}`)
		if code == 200 {
			var res generateResponse
			if err := jsonUnmarshal(body, &res); err == nil {
				checkCoupletText(t, res.GeneratedText)
			}
		}
		inflight <- code
	}()
	<-rs.be.entered
	stop() // "SIGTERM"
	// New connections are refused once the listener closes.
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatal("listener still accepting after shutdown began")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if rs.srv.Ready() {
		t.Error("still ready while draining")
	}
	if code := <-inflight; code != 200 {
		t.Errorf("in-flight request during drain: %d", code)
	}
	if err := <-served; err != nil {
		t.Errorf("Serve returned %v, want nil", err)
	}
	// Requests that reach a draining server's handler: /ready 503, generation refused.
	h := newHTTPTest(t, rs.srv)
	if code, _, body := get(t, h+"/ready"); code != 503 || !strings.Contains(string(body), "draining") {
		t.Errorf("/ready while draining: %d %s", code, body)
	}
	code, _, body := post(t, h+"/generate", `{"prompt":"平安"}`)
	if code != 503 {
		t.Errorf("draining server accepted a request: %d", code)
	}
	checkError(t, body, codeShuttingDown)
}

// Drain timeout: a request longer than DrainTimeout is cut off and Serve
// still returns (nil) instead of hanging.
func TestDrainTimeoutCutsOff(t *testing.T) {
	block := make(chan struct{})
	defer close(block)
	entered := make(chan struct{})
	srv := fakeServer(t, Config{DrainTimeout: 50 * time.Millisecond}, func(ctx context.Context, req couplet.Request) ([]couplet.Couplet, error) {
		if req.Seed == 1 {
			return []couplet.Couplet{fakeCouplet}, nil
		}
		close(entered)
		select { // a generator that ignores nothing: it ends with its context
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-block:
			return []couplet.Couplet{fakeCouplet}, nil
		}
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()
	go http.Post("http://"+ln.Addr().String()+"/generate", "application/json", strings.NewReader(`{"prompt":"平安","seed":9}`))
	<-entered
	stop()
	if err := <-served; err != nil {
		t.Errorf("Serve: %v", err)
	}
}

func TestAPIKey(t *testing.T) {
	_, base := newFakeServer(t, Config{APIKey: "s3cret"}, nil)
	for _, tc := range []struct {
		method, path, auth string
		want               int
	}{
		{"POST", "/generate", "", 401},
		{"POST", "/generate", "Bearer wrong", 401},
		{"POST", "/generate", "s3cret", 401},
		{"POST", "/generate", "Bearer s3cret", 200},
		{"POST", "/v1/completions", "", 401},
		{"POST", "/v1/completions", "Bearer s3cret", 200},
		{"POST", "/v1/chat/completions", "", 401},
		{"GET", "/v1/models", "", 401},
		{"GET", "/v1/models", "Bearer s3cret", 200},
		{"GET", "/", "", 200},
		{"GET", "/dashboard", "", 200},
		{"GET", "/static/app.js", "", 200},
		{"GET", "/health", "", 200},
		{"GET", "/ready", "", 200},
		{"GET", "/metrics", "", 401},
		{"GET", "/metrics", "Bearer s3cret", 200},
		{"GET", "/api/stats", "", 401},
		{"GET", "/api/stats", "Bearer s3cret", 200},
	} {
		var code int
		var body []byte
		hdr := []string{}
		if tc.auth != "" {
			hdr = []string{"Authorization", tc.auth}
		}
		if tc.method == "POST" {
			b := `{"prompt":"平安"}`
			if strings.Contains(tc.path, "chat") {
				b = `{"messages":[{"role":"user","content":"平安"}]}`
			}
			code, _, body = post(t, base+tc.path, b, hdr...)
		} else {
			code, _, body = get(t, base+tc.path, hdr...)
		}
		if code != tc.want {
			t.Errorf("%s %s auth %q: %d, want %d", tc.method, tc.path, tc.auth, code, tc.want)
		}
		if tc.want == 401 {
			checkError(t, body, codeUnauthorized)
		}
	}
}

func TestCORS(t *testing.T) {
	preflight := func(base, origin string) *http.Response {
		req, _ := http.NewRequest(http.MethodOptions, base+"/generate", nil)
		req.Header.Set("Origin", origin)
		req.Header.Set("Access-Control-Request-Method", "POST")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res
	}
	t.Run("off by default", func(t *testing.T) {
		_, base := newFakeServer(t, Config{}, nil)
		res := preflight(base, "https://example.com")
		if res.Header.Get("Access-Control-Allow-Origin") != "" || res.StatusCode != 405 {
			t.Errorf("preflight without CORS config: %d %v", res.StatusCode, res.Header)
		}
		_, hdr, _ := post(t, base+"/generate", `{"prompt":"平安"}`, "Origin", "https://example.com")
		if hdr.Get("Access-Control-Allow-Origin") != "" {
			t.Error("CORS header sent although CORS is off")
		}
	})
	t.Run("configured", func(t *testing.T) {
		_, base := newFakeServer(t, Config{CORSOrigins: []string{"https://ok.example"}}, nil)
		res := preflight(base, "https://ok.example")
		if res.StatusCode != 204 || res.Header.Get("Access-Control-Allow-Origin") != "https://ok.example" ||
			!strings.Contains(res.Header.Get("Access-Control-Allow-Headers"), "Authorization") {
			t.Errorf("preflight: %d %v", res.StatusCode, res.Header)
		}
		_, hdr, _ := post(t, base+"/generate", `{"prompt":"平安"}`, "Origin", "https://ok.example")
		if hdr.Get("Access-Control-Allow-Origin") != "https://ok.example" {
			t.Error("allowed origin got no CORS header")
		}
		_, hdr, _ = post(t, base+"/generate", `{"prompt":"平安"}`, "Origin", "https://evil.example")
		if hdr.Get("Access-Control-Allow-Origin") != "" {
			t.Error("disallowed origin got a CORS header")
		}
	})
	if _, err := New(Config{CORSOrigins: []string{"example.com"}}); err == nil {
		t.Error("origin without scheme accepted")
	}
}

func TestPanicInHandlerIsRecovered(t *testing.T) {
	srv, base := newFakeServer(t, Config{}, func(ctx context.Context, req couplet.Request) ([]couplet.Couplet, error) {
		if req.Text == "吉祥" {
			panic("boom")
		}
		return []couplet.Couplet{fakeCouplet}, nil
	})
	code, _, body := post(t, base+"/generate", `{"prompt":"吉祥"}`)
	if code != 500 {
		t.Fatalf("panic: status %d", code)
	}
	checkError(t, body, codeInternal)
	// In a stream the generation runs on its own goroutine: still recovered.
	code, _, body = post(t, base+"/generate", `{"prompt":"吉祥","stream":true}`)
	evs, datas := sseEvents(t, body)
	if code != 200 || len(evs) == 0 || evs[len(evs)-1] != "error" {
		t.Fatalf("stream panic: status %d events %v", code, evs)
	}
	checkError(t, []byte(datas[len(datas)-1]), codeInternal)
	if code, _, _ := post(t, base+"/generate", `{"prompt":"平安"}`); code != 200 {
		t.Errorf("after a panic: %d", code)
	}
	// The in-flight slot of the panicking request was released.
	if n := len(srv.inflight); n != 0 {
		t.Errorf("%d in-flight slots leaked", n)
	}
}

func TestGeneratorErrorMapping(t *testing.T) {
	for _, tc := range []struct {
		err    error
		status int
		code   string
	}{
		{engine.ErrQueueFull, 503, codeQueueFull},
		{fmt.Errorf("wrapped: %w", engine.ErrQueueFull), 503, codeQueueFull},
		{engine.ErrClosed, 503, codeShuttingDown},
		{couplet.ErrNoCouplet, 500, codeNoCouplet},
		{&couplet.InputError{Code: couplet.CodeUnknownChar, Message: "模型不认识 / unknown"}, 400, couplet.CodeUnknownChar},
		{errors.New("disk on fire"), 500, codeInternal},
	} {
		_, base := newFakeServer(t, Config{}, func(ctx context.Context, req couplet.Request) ([]couplet.Couplet, error) {
			if req.Seed == 1 {
				return []couplet.Couplet{fakeCouplet}, nil
			}
			return nil, tc.err
		})
		code, hdr, body := post(t, base+"/generate", `{"prompt":"平安","seed":2}`)
		if code != tc.status {
			t.Errorf("%v: status %d, want %d", tc.err, code, tc.status)
			continue
		}
		if code == 503 && hdr.Get("Retry-After") == "" {
			t.Errorf("%v: 503 without Retry-After", tc.err)
		}
		checkError(t, body, tc.code)
	}
}

func TestRequestIDAndLogs(t *testing.T) {
	var buf syncBuffer
	_, base := newFakeServer(t, Config{Logger: newJSONLogger(&buf)}, nil)
	_, hdr, _ := post(t, base+"/generate", `{"prompt":"平安"}`)
	id := hdr.Get("X-Request-ID")
	if len(id) != 16 {
		t.Fatalf("generated X-Request-ID %q", id)
	}
	_, hdr, _ = post(t, base+"/generate", `{"prompt":"平安"}`, "X-Request-ID", "bad id with spaces")
	if hdr.Get("X-Request-ID") == "bad id with spaces" {
		t.Error("invalid client request id echoed")
	}
	if !strings.Contains(buf.String(), `"request_id":"`+id+`"`) || !strings.Contains(buf.String(), `"path":"/generate"`) {
		t.Errorf("access log lacks the request id: %s", buf.String())
	}
}

// The body read is bounded in time, but the deadline is lifted once the
// body is in: a generation longer than bodyReadTimeout still succeeds, and a
// client that stalls mid-body is cut off.
func TestBodyReadDeadline(t *testing.T) {
	old := bodyReadTimeout
	bodyReadTimeout = 100 * time.Millisecond
	defer func() { bodyReadTimeout = old }()
	slow := make(chan struct{})
	srv, err := New(Config{Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	srv.Attach(Backend{Generator: fakeGen{func(ctx context.Context, req couplet.Request) ([]couplet.Couplet, error) {
		if req.Seed == 2 {
			select { // outlive the body deadline several times
			case <-time.After(4 * bodyReadTimeout):
			case <-ctx.Done():
				close(slow)
				return nil, ctx.Err()
			}
		}
		return []couplet.Couplet{fakeCouplet}, nil
	}}})
	if err := srv.Warmup(context.Background()); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go srv.Serve(ctx, ln)
	base := "http://" + ln.Addr().String()
	if code, _, body := post(t, base+"/generate", `{"prompt":"平安","seed":2}`); code != 200 {
		t.Fatalf("long generation after the body deadline: %d %s", code, body)
	}
	select {
	case <-slow:
		t.Fatal("the generation's context was cancelled by the read deadline")
	default:
	}
	// A client that sends half a body and stalls gets an error, not a hang.
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\":")
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := io.ReadAll(c)
	if err != nil && !strings.Contains(err.Error(), "reset") {
		t.Fatalf("stalled client: %v", err)
	}
	if !strings.HasPrefix(string(resp), "HTTP/1.1 408") {
		t.Errorf("stalled client got %q, want a 408", resp)
	}
	if strings.Contains(string(resp), "127.0.0.1") {
		t.Errorf("the 408 reveals socket addresses: %q", resp)
	}
}
