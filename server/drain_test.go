package server

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"chunlian/couplet"
)

// drainServer serves a fake generator on a real listener with a drain delay
// whose end the test controls (gate), and returns the base URL, the
// context cancel that starts the drain and Serve's result.
func drainServer(t *testing.T, cfg Config, fn func(ctx context.Context, req couplet.Request) ([]couplet.Couplet, error)) (*Server, string, chan time.Time, context.CancelFunc, chan error) {
	t.Helper()
	srv := fakeServer(t, cfg, fn)
	gate := make(chan time.Time)
	srv.after = func(d time.Duration) <-chan time.Time {
		if d != cfg.DrainDelay {
			t.Errorf("drain delay %v, want %v", d, cfg.DrainDelay)
		}
		return gate
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()
	return srv, "http://" + ln.Addr().String(), gate, stop, served
}

// waitReadyCode polls /ready until it answers want (a hang fails after 10 s).
func waitReadyCode(t *testing.T, base string, want int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, err := http.Get(base + "/ready")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == want {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/ready never answered %d", want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// During the drain delay /ready says 503 "draining" while generation
// requests on new connections are still served; when the delay ends the
// listener closes and Serve returns nil.
func TestDrainDelayServesWhileUnready(t *testing.T) {
	srv, base, gate, stop, served := drainServer(t, Config{DrainDelay: time.Hour}, nil)
	waitReadyCode(t, base, 200)
	stop() // "SIGTERM"
	waitReadyCode(t, base, 503)
	if code, _, body := get(t, base+"/ready"); !strings.Contains(string(body), "draining") {
		t.Errorf("/ready during the delay: %d %s", code, body)
	}
	if !srv.Draining() || srv.Ready() {
		t.Errorf("Draining() = %v, Ready() = %v during the delay", srv.Draining(), srv.Ready())
	}
	// A fresh connection (the default client may reuse one; force a new one).
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	res, err := c.Post(base+"/generate", "application/json", strings.NewReader(`{"prompt":"平安"}`))
	if err != nil {
		t.Fatalf("generation during the drain delay: %v", err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Errorf("generation during the drain delay: %d, want 200", res.StatusCode)
	}
	select {
	case err := <-served:
		t.Fatalf("Serve returned before the delay ended: %v", err)
	default:
	}
	gate <- time.Now() // the delay ends
	if err := <-served; err != nil {
		t.Errorf("Serve = %v, want nil", err)
	}
	if _, err := c.Get(base + "/health"); err == nil {
		t.Error("still accepting connections after the drain")
	}
}

// A second signal (Close) during the delay stops at once with ErrForced.
func TestDrainForcedDuringDelay(t *testing.T) {
	srv, base, _, stop, served := drainServer(t, Config{DrainDelay: time.Hour}, nil)
	waitReadyCode(t, base, 200)
	stop()
	waitReadyCode(t, base, 503)
	srv.Close()
	srv.Close() // idempotent
	if err := <-served; !errors.Is(err, ErrForced) {
		t.Errorf("Serve = %v, want ErrForced", err)
	}
}

// A second signal while an in-flight request holds the drain open (drain
// timeout 1 h) cuts it off: its context is cancelled and Serve returns
// ErrForced.
func TestDrainForcedDuringShutdown(t *testing.T) {
	entered, cancelled := make(chan struct{}), make(chan struct{})
	srv, base, _, stop, served := drainServer(t, Config{DrainTimeout: time.Hour}, func(ctx context.Context, req couplet.Request) ([]couplet.Couplet, error) {
		if req.Seed == 1 { // warm-up
			return []couplet.Couplet{fakeCouplet}, nil
		}
		close(entered)
		<-ctx.Done()
		close(cancelled)
		return nil, ctx.Err()
	})
	go func() {
		res, err := http.Post(base+"/generate", "application/json", strings.NewReader(`{"prompt":"平安","seed":9}`))
		if err == nil {
			res.Body.Close()
		}
	}()
	<-entered
	stop()
	for !srv.Draining() {
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-served:
		t.Fatalf("Serve returned with a request in flight: %v", err)
	case <-time.After(50 * time.Millisecond): // not a timing assertion: only gives a wrong early return a chance to show
	}
	srv.Close()
	if err := <-served; !errors.Is(err, ErrForced) {
		t.Errorf("Serve = %v, want ErrForced", err)
	}
	<-cancelled
}

// Close before any signal stops a serving server too.
func TestCloseWhileServing(t *testing.T) {
	srv, base, _, _, served := drainServer(t, Config{}, nil)
	waitReadyCode(t, base, 200)
	srv.Close()
	if err := <-served; !errors.Is(err, ErrForced) {
		t.Errorf("Serve = %v, want ErrForced", err)
	}
}

func TestDrainDelayValidated(t *testing.T) {
	if _, err := New(Config{DrainDelay: -time.Second}); err == nil || !strings.Contains(err.Error(), "--drain-delay") {
		t.Errorf("New with a negative drain delay: %v", err)
	}
}
