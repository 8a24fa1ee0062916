package server

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"chunlian/couplet"
)

// serveReal serves srv on a loopback listener through Serve (so the
// connection cap and write deadlines apply) until the test ends.
func serveReal(t *testing.T, srv *Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { srv.Serve(ctx, ln); close(done) }()
	t.Cleanup(func() { stop(); <-done })
	return ln.Addr().String()
}

func newReadyServer(t *testing.T, cfg Config, gen Generator) *Server {
	t.Helper()
	cfg.Logger = quietLogger()
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv.Attach(Backend{Generator: gen, ModelName: "fake"})
	if err := srv.Warmup(context.Background()); err != nil {
		t.Fatal(err)
	}
	return srv
}

var okGen = fakeGen{func(ctx context.Context, req couplet.Request) ([]couplet.Couplet, error) {
	return []couplet.Couplet{fakeCouplet}, nil
}}

// statusLine sends raw on a new connection and returns the first response
// line.
func statusLine(t *testing.T, c net.Conn, raw string) string {
	t.Helper()
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("reading the status line: %v", err)
	}
	return strings.TrimSpace(line)
}

// A client announcing a 1 GiB body with Expect: 100-continue is refused at
// once with 413, not invited to send it (100 Continue).
func TestExpectContinueTooLarge(t *testing.T) {
	addr := serveReal(t, newReadyServer(t, Config{}, okGen))
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got := statusLine(t, c, "POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"+
		"Content-Length: 1073741824\r\nExpect: 100-continue\r\n\r\n")
	if !strings.HasPrefix(got, "HTTP/1.1 413") {
		t.Errorf("status line %q, want 413", got)
	}
}

// JSON endpoints take only JSON media types: text/plain and form bodies
// (what a foreign page can send without a preflight) and a missing type get
// 415.
func TestJSONMediaTypeRequired(t *testing.T) {
	_, base := newFakeServer(t, Config{}, nil)
	bodies := map[string]string{
		"/generate":            `{"prompt":"平安"}`,
		"/v1/completions":      `{"prompt":"平安"}`,
		"/v1/chat/completions": `{"messages":[{"role":"user","content":"平安"}]}`,
	}
	for path, body := range bodies {
		for _, ct := range []string{"text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", ""} {
			req, _ := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
			if ct != "" {
				req.Header.Set("Content-Type", ct)
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != http.StatusUnsupportedMediaType {
				t.Errorf("%s with Content-Type %q: %d, want 415", path, ct, res.StatusCode)
				continue
			}
			checkError(t, b, codeUnsupportedType)
		}
		if code, _, b := post(t, base+path, body, "Content-Type", "application/json; charset=utf-8"); code != 200 {
			t.Errorf("%s with application/json: %d %s", path, code, b)
		}
	}
}

func TestSecurityHeaders(t *testing.T) {
	_, base := newFakeServer(t, Config{}, nil)
	for _, path := range []string{"/", "/dashboard", "/static/app.js", "/health", "/nope"} {
		_, h, _ := get(t, base+path)
		if h.Get("X-Content-Type-Options") != "nosniff" || h.Get("X-Frame-Options") != "DENY" {
			t.Errorf("%s: nosniff %q, frame options %q", path, h.Get("X-Content-Type-Options"), h.Get("X-Frame-Options"))
		}
		if csp := h.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
			t.Errorf("%s: CSP %q", path, csp)
		}
	}
	_, h, _ := post(t, base+"/generate", `{"prompt":"平安"}`)
	if h.Get("X-Content-Type-Options") != "nosniff" {
		t.Errorf("/generate: no nosniff")
	}
}

// With MaxConns connections open, a further connection is a reserve one:
// /health and /ready answer on it, anything else gets 503.
func TestConnectionCapReserve(t *testing.T) {
	addr := serveReal(t, newReadyServer(t, Config{MaxConns: 2, ProbeReserveConns: 1}, okGen))
	dial := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	const health = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
	for i := 0; i < 2; i++ { // the ordinary slots, kept open (keep-alive)
		if got := statusLine(t, dial(), health); !strings.HasPrefix(got, "HTTP/1.1 200") {
			t.Fatalf("connection %d: %q", i, got)
		}
	}
	body := `{"prompt":"平安"}`
	gen := fmt.Sprintf("POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	if got := statusLine(t, dial(), gen); !strings.HasPrefix(got, "HTTP/1.1 503") {
		t.Errorf("/generate on a reserve connection: %q, want 503", got)
	}
	// That connection was closed by the server; its reserve slot is free
	// again for a probe.
	if got := statusLine(t, dial(), health); !strings.HasPrefix(got, "HTTP/1.1 200") {
		t.Errorf("/health on a reserve connection: %q", got)
	}
}

// A streaming client that never reads loses its request once a write
// cannot complete within WriteTimeout: the generation's context is
// cancelled (before, it ran until the client closed the connection).
func TestStalledReaderIsCancelled(t *testing.T) {
	cancelled := make(chan struct{})
	big := strings.Repeat("福", 4000)
	gen := fakeGen{func(ctx context.Context, req couplet.Request) ([]couplet.Couplet, error) {
		if req.OnToken == nil { // warm-up
			return []couplet.Couplet{fakeCouplet}, nil
		}
		for {
			select {
			case <-ctx.Done():
				close(cancelled)
				return nil, ctx.Err()
			case <-time.After(time.Millisecond):
				req.OnToken(couplet.TokenEvent{Text: big})
			}
		}
	}}
	addr := serveReal(t, newReadyServer(t, Config{WriteTimeout: 200 * time.Millisecond}, gen))
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetReadBuffer(4096)
	}
	body := `{"prompt":"平安","stream":true}`
	fmt.Fprintf(c, "POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	select { // a hang guard, not a timing assertion
	case <-cancelled:
	case <-time.After(30 * time.Second):
		t.Fatal("the generation of a client that never reads was not cancelled")
	}
}

// Serving on a non-loopback address without an API key logs a warning;
// loopback, or a key, does not.
func TestWarnExposedWithoutKey(t *testing.T) {
	for _, tc := range []struct {
		addr, key string
		warn      bool
	}{
		{"0.0.0.0:0", "", true},
		{"127.0.0.1:0", "", false},
		{"0.0.0.0:0", "k", false},
	} {
		var buf syncBuffer
		cfg := Config{APIKey: tc.key, Logger: slog.New(slog.NewTextHandler(&buf, nil))}
		srv, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", tc.addr)
		if err != nil {
			t.Skipf("cannot listen on %s: %v", tc.addr, err)
		}
		ctx, stop := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { srv.Serve(ctx, ln); close(done) }()
		for i := 0; i < 200 && !strings.Contains(buf.String(), "listening"); i++ {
			time.Sleep(5 * time.Millisecond)
		}
		stop()
		<-done
		if got := strings.Contains(buf.String(), "without an API key"); got != tc.warn {
			t.Errorf("%s key %q: warning %v, want %v\n%s", tc.addr, tc.key, got, tc.warn, buf.String())
		}
	}
}
