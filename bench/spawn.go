package bench

import (
	"bytes"
	"context"

	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// spawnEngines maps --spawn names to `chunlian serve --engine` values.
var spawnEngines = map[string]string{"engine": "paged", "naive": "naive"}

// spawned is a server process started by the bench. stop is idempotent in
// effect: it signals, waits, and kills if the drain takes too long.
type spawned struct {
	url     string
	pid     int
	logPath string
	stop    func()
}

// freeLoopbackPort asks the kernel for a free port on 127.0.0.1. The port is
// released before the server binds it, so another process could take it in
// between; spawnServer retries on an early exit for that reason.
func freeLoopbackPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// spawnServer starts `ServerBin serve --addr 127.0.0.1:PORT --engine E
// ServerFlags…`, waits until GET /ready answers 200, and returns it. The
// server's output goes to a log file, whose tail is quoted when it fails.
func spawnServer(ctx context.Context, cfg Config, name string) (*spawned, error) {
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		sp, retry, err := trySpawn(ctx, cfg, name)
		if err == nil {
			return sp, nil
		}
		lastErr = err
		if !retry || ctx.Err() != nil {
			break
		}
	}
	return nil, lastErr
}

func trySpawn(ctx context.Context, cfg Config, name string) (sp *spawned, retry bool, err error) {
	port, err := freeLoopbackPort()
	if err != nil {
		return nil, false, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	dir := cfg.ServerLogDir
	if dir == "" {
		dir = os.TempDir()
	}
	logf, err := os.CreateTemp(dir, "chunlian-bench-"+name+"-*.log")
	if err != nil {
		return nil, false, err
	}
	args := append([]string{"serve", "--addr", addr, "--engine", spawnEngines[name]}, cfg.ServerFlags...)
	cmd := exec.Command(cfg.ServerBin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, false, fmt.Errorf("start %s: %w", cfg.ServerBin, err)
	}
	exited := make(chan error, 1) // cmd.Wait's result; owned by this goroutine
	go func() { exited <- cmd.Wait(); logf.Close() }()

	var once bool
	stop := func() {
		if once {
			return
		}
		once = true
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second): // longer than any sane drain
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	url := "http://" + addr
	fail := func(err error) (*spawned, bool, error) {
		return nil, false, fmt.Errorf("%w; server log %s:\n%s", err, logf.Name(), logTail(logf.Name()))
	}
	deadline := time.NewTimer(cfg.ReadyTimeout)
	defer deadline.Stop()
	poll := time.NewTicker(200 * time.Millisecond)
	defer poll.Stop()
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{Proxy: nil}}
	defer hc.CloseIdleConnections()
	for {
		select {
		case err := <-exited:
			exited <- err // let stop's receive see it too
			tail := logTail(logf.Name())
			// Only the port race (someone took the port between our probe
			// and the server's bind) is worth another try.
			retry := strings.Contains(tail, "address already in use")
			return nil, retry, fmt.Errorf("%s server exited before ready (%v); server log %s:\n%s", name, err, logf.Name(), tail)
		case <-deadline.C:
			stop()
			return fail(fmt.Errorf("%s server not ready after %v", name, cfg.ReadyTimeout))
		case <-ctx.Done():
			stop()
			return fail(fmt.Errorf("%s server: %w", name, ctx.Err()))
		case <-poll.C:
			if ready(ctx, hc, url) {
				return &spawned{url: url, pid: cmd.Process.Pid, logPath: logf.Name(), stop: stop}, false, nil
			}
		}
	}
}

func ready(ctx context.Context, hc *http.Client, url string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/ready", nil)
	if err != nil {
		return false
	}
	resp, err := hc.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// logTail returns the last lines of a log file (for error messages).
func logTail(path string) string {
	b, err := os.ReadFile(filepath.Clean(path))
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	if len(b) == 0 {
		return "(empty log)"
	}
	return string(b)
}
