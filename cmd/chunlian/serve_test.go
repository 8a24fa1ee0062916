package main

import (
	"encoding/json"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"chunlian/engine"
	"chunlian/model"
	"chunlian/server"
)

// serveMain end to end: flags → listen → load a model dir → warm up →
// /ready 200 → a generation → SIGTERM → drained exit with a nil error.
func TestServeLifecycle(t *testing.T) {
	dir := t.TempDir()
	if err := model.WriteDir(model.NewRandom(model.TestConfig(), 11), dir); err != nil {
		t.Fatal(err)
	}
	sig := make(chan os.Signal, 1)
	addrc := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- serveMain([]string{"--addr", "127.0.0.1:0", "--model", dir, "--threads", "1",
			"--kv-cache-memory", "2MiB", "--log-level", "warn", "--drain-timeout", "20s"}, sig, func(a string) { addrc <- a })
	}()
	var base string
	select {
	case a := <-addrc:
		base = "http://" + a
	case err := <-done:
		t.Fatalf("serve exited before listening: %v", err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		res, err := http.Get(base + "/ready")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				break
			}
			if res.StatusCode != 503 {
				t.Fatalf("/ready = %d while loading", res.StatusCode)
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("never ready")
		}
		time.Sleep(20 * time.Millisecond)
	}
	res, err := http.Post(base+"/generate", "application/json", strings.NewReader(`{"prompt":"平安"}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	var out struct {
		GeneratedText string `json:"generated_text"`
	}
	if res.StatusCode != 200 || json.Unmarshal(body, &out) != nil || !strings.HasPrefix(out.GeneratedText, "上联：") {
		t.Fatalf("generate: %d %s", res.StatusCode, body)
	}
	sig <- syscall.SIGTERM
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve after SIGTERM: %v, want nil (exit 0)", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("serve did not exit after SIGTERM")
	}
	if _, err := http.Get(base + "/health"); err == nil {
		t.Error("still serving after exit")
	}
}

// Bad configuration fails at start with a message naming the flag.
func TestServeRejectsBadConfig(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--engine", "turbo"}, "--engine"},
		{[]string{"--addr", "nope"}, "--addr"},
		{[]string{"--addr", "127.0.0.1:99999"}, "--addr"},
		{[]string{"--request-timeout", "-1s"}, "--request-timeout"},
		{[]string{"--drain-timeout", "0s"}, "--drain-timeout"},
		{[]string{"--cors-origin", "example.com"}, "--cors-origin"},
		{[]string{"--log-level", "loud"}, "--log-level"},
		{[]string{"--log-format", "xml"}, "--log-format"},
		{[]string{"--max-in-flight", "-1"}, "--max-in-flight"},
		{[]string{"extra"}, "unexpected arguments"},
	} {
		err := serveMain(tc.args, make(chan os.Signal), nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error naming %s", tc.args, err, tc.want)
		}
	}
}

// TestServeDefaultsPerBackend: on the CUDA backend the HTTP layer's
// defaults step aside for the engine's limits (in-flight cap = seqs +
// queue, no latency-based admission) unless --admission is given; on the
// CPU they stay.
func TestServeDefaultsPerBackend(t *testing.T) {
	for _, tc := range []struct {
		backend      string
		admissionSet bool
		wantOff      bool
		wantInFlight bool // cap = seqs + queue
	}{
		{"cpu", false, false, false},
		{"cuda", false, true, true},
		{"cuda", true, false, true},
	} {
		var c serveConfig
		c.register(pflag.NewFlagSet("t", pflag.ContinueOnError))
		c.stack.Backend, c.admissionSet = tc.backend, tc.admissionSet
		c.stack.resolveLimits(tc.backend) // as serveRun does
		sc, err := c.serverConfig(slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		if sc.Admission.Disabled != tc.wantOff {
			t.Errorf("%s (flag set %v): admission disabled %v, want %v", tc.backend, tc.admissionSet, sc.Admission.Disabled, tc.wantOff)
		}
		if got := sc.MaxInFlight == c.stack.MaxNumSeqs+c.stack.MaxQueue; got != tc.wantInFlight {
			t.Errorf("%s: MaxInFlight %d", tc.backend, sc.MaxInFlight)
		}
		if tc.wantInFlight && sc.MaxInFlight != cudaDefaultMaxNumSeqs+engine.DefaultConfig().MaxQueue {
			t.Errorf("%s: MaxInFlight %d, want the GPU's step limit plus the queue", tc.backend, sc.MaxInFlight)
		}
	}
}

// TestServeMaxConns: --max-conns reaches the server as given (the open-file
// limit only lowers it), and without it the server's default applies.
func TestServeMaxConns(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want int
	}{{nil, maxConnsForFDs(server.DefaultMaxConns)}, {[]string{"--max-conns", "100"}, 100}} {
		var c serveConfig
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		c.register(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		c.stack.resolveLimits("cpu")
		sc, err := c.serverConfig(slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		if sc.MaxConns != tc.want {
			t.Errorf("%v: MaxConns %d, want %d", tc.args, sc.MaxConns, tc.want)
		}
	}
}

// TestGCPercent: --gc-percent resolves to off on CUDA and the runtime's
// on the CPU unless set, and is applied unless GOGC is in the environment.
func TestGCPercent(t *testing.T) {
	for _, tc := range []struct {
		backend    string
		flag, want int
	}{{"cpu", 0, 0}, {"cuda", 0, -1}, {"cuda", 400, 400}, {"cpu", 250, 250}, {"cuda", 150, 150}} {
		if got := gcPercentFor(tc.backend, tc.flag); got != tc.want {
			t.Errorf("gcPercentFor(%s, %d) = %d, want %d", tc.backend, tc.flag, got, tc.want)
		}
	}
	old := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(old) })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	t.Setenv("GOGC", "")
	setGCPercent(log, 250)
	if got := debug.SetGCPercent(100); got != 250 {
		t.Errorf("GC percent %d after setGCPercent(250)", got)
	}
	setGCPercent(log, 0)
	if got := debug.SetGCPercent(100); got != 100 {
		t.Errorf("GC percent %d after setGCPercent(0), want the 100 it was", got)
	}
	t.Setenv("GOGC", "150")
	setGCPercent(log, 250)
	if got := debug.SetGCPercent(100); got != 100 {
		t.Errorf("with GOGC set the GC percent changed to %d", got)
	}
}

func TestSetMemoryLimit(t *testing.T) {
	old := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(old) })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	t.Setenv("GOMEMLIMIT", "")

	setMemoryLimit(log, 3<<30, memLimitHeadroom)
	if got := debug.SetMemoryLimit(-1); got != 3<<30 {
		t.Errorf("explicit limit: %d, want %d", got, int64(3<<30))
	}

	keep := make([]byte, 64<<20) // live heap the limit must cover
	setMemoryLimit(log, 0, memLimitHeadroom)
	got := debug.SetMemoryLimit(-1)
	if got < int64(len(keep))+memLimitHeadroom || got == math.MaxInt64 {
		t.Errorf("automatic limit %d, want ≥ the 64 MiB kept live + %d", got, memLimitHeadroom)
	}
	setMemoryLimit(log, 0, headroomFor("cuda"))
	if got := debug.SetMemoryLimit(-1); got < int64(len(keep))+cudaMemLimitHeadroom || got == math.MaxInt64 {
		t.Errorf("automatic CUDA limit %d, want ≥ the 64 MiB kept live + %d", got, cudaMemLimitHeadroom)
	}
	if headroomFor("cpu") != memLimitHeadroom {
		t.Errorf("CPU headroom %d, want %d", headroomFor("cpu"), memLimitHeadroom)
	}
	runtime.KeepAlive(keep)

	debug.SetMemoryLimit(7 << 30)
	t.Setenv("GOMEMLIMIT", "7GiB")
	setMemoryLimit(log, 0, memLimitHeadroom)
	if got := debug.SetMemoryLimit(-1); got != 7<<30 {
		t.Errorf("with GOMEMLIMIT set the limit changed to %d", got)
	}
}
