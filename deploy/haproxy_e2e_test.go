package deploy

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// renderHAProxy is the shipped haproxy/haproxy.cfg with the compose
// server-template replaced by loopback replicas (named r0, r1, …) and the
// listen port moved.
func renderHAProxy(t *testing.T, dir string, listen int, upstreams []string) string {
	t.Helper()
	b, err := os.ReadFile("haproxy/haproxy.cfg")
	if err != nil {
		t.Fatal(err)
	}
	conf := string(b)
	var servers []string
	for i, u := range upstreams {
		servers = append(servers, fmt.Sprintf("server r%d %s check", i, u))
	}
	for _, r := range [][2]string{
		{"server-template chunlian 16 chunlian:8000 check resolvers docker init-addr none", strings.Join(servers, "\n    ")},
		{"bind :8080", fmt.Sprintf("bind 127.0.0.1:%d", listen)},
	} {
		if n := strings.Count(conf, r[0]); n != 1 {
			t.Fatalf("haproxy/haproxy.cfg: %q occurs %d times, want 1", r[0], n)
		}
		conf = strings.Replace(conf, r[0], r[1], 1)
	}
	path := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("haproxy", "-c", "-f", path).CombinedOutput(); err != nil {
		t.Fatalf("haproxy -c: %v\n%s", err, out)
	}
	return path
}

// haproxyLog collects HAProxy's stderr (health-check transitions and one
// line per request) so the test can wait for "Server chunlian/r1 is DOWN".
type haproxyLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *haproxyLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *haproxyLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// waitFor polls the log until it contains s (a hang fails after 60 s).
func (l *haproxyLog) waitFor(t *testing.T, s string, after int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(l.String()[after:], s) {
		if time.Now().After(deadline) {
			t.Fatalf("HAProxy never logged %q; log:\n%s", s, l.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// HAProxy with the shipped config follows /ready: once a replica says 503
// (here: draining, with a drain delay long enough that it keeps serving
// throughout), HAProxy sends it nothing more, no client request fails, and
// when the replica is back and ready it gets traffic again.
func TestHAProxyFollowsReady(t *testing.T) {
	e2e(t, "haproxy")
	dir := t.TempDir()
	modelDir := tinyModelDir(t)
	var reps []*replica
	var ups []string
	for i := range 2 {
		r := startReplica(t, modelDir, freePort(t), filepath.Join(dir, fmt.Sprintf("replica%d.log", i)), "--drain-delay", "10m")
		r.grace = 0 // the 10-minute delay: cleanup stops it with a second signal
		reps = append(reps, r)
		ups = append(ups, r.addr())
	}
	for _, r := range reps {
		waitHTTP(t, "http://"+r.addr()+"/ready", 200)
	}
	port := freePort(t)
	conf := renderHAProxy(t, dir, port, ups)
	hlog := &haproxyLog{}
	cmd := exec.Command("haproxy", "-db", "-f", conf)
	cmd.Stdout, cmd.Stderr = hlog, hlog
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGUSR1) // soft stop
		<-exited
	})
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	select {
	case err := <-exited:
		t.Fatalf("haproxy exited: %v\n%s", err, hlog.String())
	case <-time.After(500 * time.Millisecond): // not a timing assertion: lets an immediate failure show its log
	}
	waitHTTP(t, base+"/haproxy-health", 200)

	ld := startLoad([]string{base + "/generate"}, 4)
	defer ld.stop()
	if n := ld.during(time.Second); n == 0 {
		t.Fatalf("no request through HAProxy: %v", ld.failures)
	}
	b := reps[1]
	mark := len(hlog.String())
	b.cmd.Process.Signal(syscall.SIGTERM) // /ready 503, still serving for 10 min
	hlog.waitFor(t, "Server chunlian/r1 is DOWN", mark)
	ld.during(time.Second) // requests dispatched before DOWN finish (they take milliseconds)
	before := countGenerate(t, readLog(t, b.log))[200]
	whileDown := ld.during(3 * time.Second)
	after := countGenerate(t, readLog(t, b.log))[200]
	if whileDown == 0 {
		t.Error("no traffic while the replica was out of rotation")
	}
	if after != before {
		t.Errorf("HAProxy sent %d requests to a replica whose /ready was 503", after-before)
	}
	// A second signal ends it (exit 1); start it again and wait until
	// HAProxy sees it ready.
	b.cmd.Process.Signal(syscall.SIGTERM)
	b.waitExit(t, 30*time.Second)
	mark = len(hlog.String())
	b2 := startReplica(t, modelDir, b.port, filepath.Join(dir, "replica1-restarted.log"))
	hlog.waitFor(t, "Server chunlian/r1 is UP", mark)
	ld.during(2 * time.Second)
	ld.stop()
	if got := countGenerate(t, readLog(t, b2.log))[200]; got == 0 {
		t.Error("restarted replica got no traffic once ready")
	}
	if f := ld.failed.Load(); f > 0 {
		t.Errorf("%d of %d client requests failed: %v", f, f+ld.ok.Load(), ld.failures)
	}
	t.Logf("%d requests ok; the draining replica got %d of the %d answered while HAProxy had it DOWN",
		ld.ok.Load(), after-before, whileDown)
}
