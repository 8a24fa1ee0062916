// Package deploy holds no code: its tests check the deployment bundle in
// this folder (nginx, compose, Prometheus, Grafana, Kubernetes, systemd)
// against the real server. metrics_test.go runs in every `go test`; the
// end-to-end tests drive the built binary behind the real nginx, HAProxy
// and Prometheus and run only with CHUNLIAN_DEPLOY_E2E=1 (.ci/run sets
// it). The Kubernetes manifests are validated by the separate module in
// k8s/validate.
package deploy

// Helpers of the end-to-end tests: the chunlian binary, replicas as child
// processes, a closed-loop load generator, free ports.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"chunlian/model"
)

// e2e skips unless CHUNLIAN_DEPLOY_E2E=1, and when a tool is missing.
func e2e(t *testing.T, tools ...string) {
	t.Helper()
	if os.Getenv("CHUNLIAN_DEPLOY_E2E") != "1" {
		t.Skip("end-to-end deploy test: set CHUNLIAN_DEPLOY_E2E=1 to run it (.ci/run does, after installing nginx and prometheus)")
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed (Debian: apt-get install nginx-light prometheus): %v", tool, err)
		}
	}
}

var (
	binOnce sync.Once
	binPath string
	binErr  error
	binDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// chunlianBinary is $CHUNLIAN_BIN, or the binary built once from ../cmd/chunlian.
func chunlianBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		if p := os.Getenv("CHUNLIAN_BIN"); p != "" {
			binPath = p
			return
		}
		binDir, binErr = os.MkdirTemp("", "chunlian-e2e-bin")
		if binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "chunlian")
		out, err := exec.Command("go", "build", "-o", binPath, "../cmd/chunlian").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// tinyModelDir writes the random test model (fast to load and to run).
func tinyModelDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := model.WriteDir(model.NewRandom(model.TestConfig(), 11), dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// replica is one `chunlian serve` child process.
type replica struct {
	port int
	cmd  *exec.Cmd
	log  string // its stderr (JSON log lines)
	done chan struct{}
	err  error // cmd.Wait's result, once done is closed
	// grace is how long stop waits after SIGTERM before a second SIGTERM
	// (which skips the drain); 0 = send both at once.
	grace time.Duration
}

func (r *replica) addr() string { return fmt.Sprintf("127.0.0.1:%d", r.port) }

// startDaemon starts cmd with stdout and stderr into logPath and, at the
// test's end, stops it with stop and waits for it.
func startDaemon(t *testing.T, cmd *exec.Cmd, logPath string, stop os.Signal) {
	t.Helper()
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(stop)
		cmd.Wait()
		logf.Close()
	})
}

// startReplica runs `chunlian serve` on port with JSON logs into logPath.
func startReplica(t *testing.T, modelDir string, port int, logPath string, extra ...string) *replica {
	t.Helper()
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"serve", "--addr", fmt.Sprintf("127.0.0.1:%d", port), "--model", modelDir,
		"--threads", "1", "--kv-cache-memory", "4MiB", "--log-format", "json", "--log-level", "info",
		// The balancer's behaviour is under test, not load shedding: with
		// admission on, a replica that takes a stopped one's share may
		// refuse (503) what the closed loop sends it on two cores.
		"--admission=false"}, extra...)
	cmd := exec.Command(chunlianBinary(t), args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &replica{port: port, cmd: cmd, log: logPath, done: make(chan struct{}), grace: 30 * time.Second}
	go func() {
		r.err = cmd.Wait()
		f.Close()
		close(r.done)
	}()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop sends SIGTERM (a no-op once exited), a second one after r.grace,
// and kills the process if it is still there 30 s later.
func (r *replica) stop(t *testing.T) {
	select {
	case <-r.done:
		return
	default:
	}
	r.cmd.Process.Signal(syscall.SIGTERM)
	if r.grace == 0 {
		// Two signals sent back to back can merge into one (POSIX does not
		// queue them): send the second once the first has turned /ready.
		c := &http.Client{Timeout: time.Second}
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			res, err := c.Get("http://" + r.addr() + "/ready")
			if err != nil {
				break
			}
			res.Body.Close()
			if res.StatusCode != 200 {
				break
			}
		}
	}
	select {
	case <-r.done:
		return
	case <-time.After(r.grace):
	}
	r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(30 * time.Second):
		r.cmd.Process.Kill()
		t.Errorf("replica %s ignored two SIGTERMs for 30 s", r.addr())
	}
}

// waitExit waits for the process to exit and returns its exit code.
func (r *replica) waitExit(t *testing.T, within time.Duration) int {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(within):
		t.Fatalf("replica %s still running %v after the signal", r.addr(), within)
	}
	if r.err == nil {
		return 0
	}
	if ee, ok := r.err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	t.Fatalf("replica %s: %v", r.addr(), r.err)
	return -1
}

// waitHTTP polls url until it answers want, failing after 60 s (a hang,
// not a timing assertion).
func waitHTTP(t *testing.T, url string, want int) {
	t.Helper()
	c := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(60 * time.Second)
	for {
		res, err := c.Get(url)
		if err == nil {
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if res.StatusCode == want {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never answered %d (last: %v)", url, want, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// logEntry is one JSON log line of chunlian serve.
type logEntry struct {
	Msg    string `json:"msg"`
	Level  string `json:"level"`
	Path   string `json:"path"`
	Status int    `json:"status"`
}

// readLog parses a replica's log, failing on any line that is not JSON
// (--log-format json must give JSON only).
func readLog(t *testing.T, path string) []logEntry {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []logEntry
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		var e logEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Errorf("%s: a line that is not JSON with --log-format json: %q", filepath.Base(path), sc.Text())
			continue
		}
		out = append(out, e)
	}
	return out
}

// load is a closed-loop client: workers POST /generate back to back.
type load struct {
	ok, failed atomic.Int64
	mu         sync.Mutex
	failures   []string // the first few, for the report
	wg         sync.WaitGroup
	cancel     context.CancelFunc
}

// startLoad runs workers against each of urls (workers per url).
func startLoad(urls []string, workers int) *load {
	ctx, cancel := context.WithCancel(context.Background())
	l := &load{cancel: cancel}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	for _, u := range urls {
		for w := 0; w < workers; w++ {
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				for i := 0; ctx.Err() == nil; i++ {
					l.one(ctx, client, u, fmt.Sprintf(`{"prompt":"平安","seed":%d}`, i))
				}
			}()
		}
	}
	return l
}

func (l *load) one(ctx context.Context, c *http.Client, url, body string) {
	req, _ := http.NewRequestWithContext(context.WithoutCancel(ctx), http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	res, err := c.Do(req)
	if err == nil {
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode == 200 {
			l.ok.Add(1)
			return
		}
		err = fmt.Errorf("HTTP %d: %.200s", res.StatusCode, b)
	}
	l.failed.Add(1)
	l.mu.Lock()
	if len(l.failures) < 10 {
		l.failures = append(l.failures, err.Error())
	}
	l.mu.Unlock()
}

// stop ends the load and waits for the requests in flight.
func (l *load) stop() {
	l.cancel()
	l.wg.Wait()
}

// during keeps the load running for d, then reports the requests done.
func (l *load) during(d time.Duration) int64 {
	n := l.ok.Load()
	time.Sleep(d)
	return l.ok.Load() - n
}
