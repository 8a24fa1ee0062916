package bench

import (
	"context"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The test binary doubles as a fake `chunlian serve` for the spawn tests:
// with fakeServeEnv set it serves the fake service on --addr until SIGTERM,
// then records its arguments in $fakeServeEnv/<engine>.exited and exits 0.
const fakeServeEnv = "CHUNLIAN_BENCH_FAKE_SERVE_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(fakeServeEnv); dir != "" {
		fakeServe(dir, os.Args[1:])
		return
	}
	os.Exit(m.Run())
}

func fakeServe(dir string, args []string) {
	var addr, engine string
	for i := 0; i+1 < len(args); i++ {
		switch args[i] {
		case "--addr":
			addr = args[i+1]
		case "--engine":
			engine = args[i+1]
		}
	}
	if len(args) == 0 || args[0] != "serve" || addr == "" || engine == "" {
		os.Stderr.WriteString("fake serve: bad args " + strings.Join(args, " ") + "\n")
		os.Exit(2)
	}
	if engine == "broken" {
		os.Stderr.WriteString("fake serve: cannot start\n")
		os.Exit(1)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	f := &fakeService{noErrors: true}
	srv := &http.Server{Addr: addr, Handler: f.handler()}
	go func() { _ = srv.ListenAndServe() }()
	<-sig
	_ = srv.Close()
	_ = os.WriteFile(filepath.Join(dir, engine+".exited"), []byte(strings.Join(args, " ")), 0o644)
	os.Exit(0)
}

func TestRunSpawn(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("spawn test reads /proc")
	}
	dir := t.TempDir()
	t.Setenv(fakeServeEnv, dir)
	o := tinyOptions(1, 2)
	o.Duration = 300 * time.Millisecond
	rep, err := Run(context.Background(), Config{
		Options:      o,
		Spawn:        []string{"engine", "naive"},
		ServerBin:    os.Args[0],
		ServerFlags:  []string{"--extra-flag", "x"},
		ReadyTimeout: 30 * time.Second,
		ServerLogDir: dir,
	})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Spawned || len(rep.Targets) != 2 {
		t.Fatalf("spawned %v, %d targets", rep.Spawned, len(rep.Targets))
	}
	for i, want := range []struct{ name, engine string }{{"engine", "paged"}, {"naive", "naive"}} {
		tr := rep.Targets[i]
		if tr.Name != want.name || tr.Engine != want.engine || tr.Error != "" {
			t.Errorf("target %d = %s/%s (error %q), want %s/%s", i, tr.Name, tr.Engine, tr.Error, want.name, want.engine)
		}
		if !strings.HasPrefix(tr.URL, "http://127.0.0.1:") {
			t.Errorf("spawned URL %q is not loopback", tr.URL)
		}
		if len(tr.Levels) != 2 {
			t.Fatalf("%s: %d levels", tr.Name, len(tr.Levels))
		}
		for _, l := range tr.Levels {
			if l.BenchCPUCores == nil {
				t.Errorf("%s %v: no bench CPU figure", tr.Name, l.Level)
			}
			if l.Completed == 0 || l.CPUSource != "proc" || l.CPUCores == nil {
				t.Errorf("%s %v: completed %d, CPU %v from %q (want /proc)", tr.Name, l.Level, l.Completed, l.CPUCores, l.CPUSource)
			}
		}
		// The server got SIGTERM and the pass-through flags, and has exited.
		b, err := os.ReadFile(filepath.Join(dir, want.engine+".exited"))
		if err != nil {
			t.Errorf("%s server did not exit cleanly: %v", want.name, err)
		} else if !strings.Contains(string(b), "--extra-flag x") {
			t.Errorf("%s server args %q lack the --server-flags", want.name, b)
		}
	}
	base, opt := rep.Pair()
	if base == nil || opt == nil || base.Name != "naive" || opt.Name != "engine" {
		t.Errorf("Pair() = %v, %v; want naive baseline, engine optimised", base, opt)
	}
}

func TestSpawnFailureIsReported(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("spawn test needs Linux process attributes")
	}
	dir := t.TempDir()
	t.Setenv(fakeServeEnv, dir)
	// "broken" is not a --spawn name, so fake a config whose server exits.
	saved := spawnEngines["naive"]
	spawnEngines["naive"] = "broken"
	defer func() { spawnEngines["naive"] = saved }()
	o := tinyOptions(1)
	o.Duration = 200 * time.Millisecond
	rep, err := Run(context.Background(), Config{Options: o, Spawn: []string{"naive"}, ServerBin: os.Args[0], ServerLogDir: dir, ReadyTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Targets) != 1 || !strings.Contains(rep.Targets[0].Error, "exited before ready") || !strings.Contains(rep.Targets[0].Error, "cannot start") {
		t.Errorf("want the exit and the log tail in the target error, got %+v", rep.Targets)
	}
}
