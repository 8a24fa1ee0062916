package deploy

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// renderNginx is the shipped compose/nginx.conf with the compose service
// name replaced by loopback replicas, the listen port and the file paths
// moved into dir. Each replaced line must exist exactly once, so that the
// test follows the shipped file rather than a copy of it.
func renderNginx(t *testing.T, dir string, listen int, upstreams []string) string {
	t.Helper()
	b, err := os.ReadFile("compose/nginx.conf")
	if err != nil {
		t.Fatal(err)
	}
	conf := string(b)
	var servers []string
	for _, u := range upstreams {
		servers = append(servers, fmt.Sprintf("server %s max_fails=1 fail_timeout=2s;", u))
	}
	for _, r := range [][2]string{
		{"server chunlian:8000 max_fails=1 fail_timeout=2s;", strings.Join(servers, "\n        ")},
		{"listen 80;", fmt.Sprintf("listen 127.0.0.1:%d;", listen)},
		{"access_log /dev/stdout upstreams;", "access_log " + dir + "/access.log upstreams;"},
	} {
		if n := strings.Count(conf, r[0]); n != 1 {
			t.Fatalf("compose/nginx.conf: %q occurs %d times, want 1", r[0], n)
		}
		conf = strings.Replace(conf, r[0], r[1], 1)
	}
	// The shipped config's pid file and temp folders (a container's) move
	// into the test's directory.
	conf = regexp.MustCompile(`(?m)^pid [^;]*;`).ReplaceAllString(conf, "pid "+dir+"/nginx.pid;")
	conf = regexp.MustCompile(`(_temp_path\s+)\S*/nginx-`).ReplaceAllString(conf, "${1}"+dir+"/nginx-")
	if os.Geteuid() == 0 { // workers would run as nobody and not reach dir
		conf = "user root;\n" + conf
	}
	path := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// startNginx runs nginx in the foreground on the rendered config.
func startNginx(t *testing.T, conf, dir string) {
	t.Helper()
	if out, err := exec.Command("nginx", "-t", "-c", conf, "-p", dir).CombinedOutput(); err != nil {
		t.Fatalf("nginx -t: %v\n%s", err, out)
	}
	startDaemon(t, exec.Command("nginx", "-c", conf, "-p", dir, "-g", "daemon off;"), filepath.Join(dir, "nginx.stderr"), syscall.SIGQUIT) // SIGQUIT: graceful stop
}

// attempt is one try of one client request at one replica, from nginx's
// access log (ua / us / uct list every try of a request).
type attempt struct {
	addr, status string
	connected    bool // uct is not "-": the connection was established
	final        bool // the try whose answer went to the client
}

var accessLine = regexp.MustCompile(`"POST /generate [^"]*" (\d+) \S+ ua="([^"]*)" us="([^"]*)" uct="([^"]*)"`)

// accessLog parses the nginx log bytes [from, to) into client statuses and
// attempts.
func accessLog(t *testing.T, path string, from, to int64) (clientStatus []string, tries []attempt) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if to < 0 || to > int64(len(b)) {
		to = int64(len(b))
	}
	for _, line := range strings.Split(string(b[from:to]), "\n") {
		m := accessLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		clientStatus = append(clientStatus, m[1])
		// Tries are separated by ", " (and " : " across upstream groups).
		split := func(s string) []string { return regexp.MustCompile(`\s*[,:]\s+`).Split(s, -1) }
		addrs, sts, ucts := split(m[2]), split(m[3]), split(m[4])
		for i, a := range addrs {
			at := attempt{addr: a, final: i == len(addrs)-1}
			if i < len(sts) {
				at.status = sts[i]
			}
			at.connected = i < len(ucts) && ucts[i] != "-"
			tries = append(tries, at)
		}
	}
	return clientStatus, tries
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

// countGenerate counts a replica's logged /generate responses by status.
func countGenerate(t *testing.T, entries []logEntry) map[int]int {
	out := map[int]int{}
	for _, e := range entries {
		if e.Msg == "http" && e.Path == "/generate" {
			out[e.Status]++
		}
	}
	return out
}

// Three replicas behind the shipped nginx config; one is stopped with
// SIGTERM under load and started again. No client request may fail, the
// stopped replica must finish every request it took in, traffic must move
// to the other two, and the restarted replica must get traffic again.
func TestNginxReplicaStopRestartUnderLoad(t *testing.T) {
	e2e(t, "nginx")
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	modelDir := tinyModelDir(t)
	var reps []*replica
	var ups []string
	for i := range 3 {
		r := startReplica(t, modelDir, freePort(t), filepath.Join(dir, fmt.Sprintf("replica%d.log", i)), "--drain-delay", "1s")
		reps = append(reps, r)
		ups = append(ups, r.addr())
	}
	for _, r := range reps {
		waitHTTP(t, "http://"+r.addr()+"/ready", 200)
	}
	port := freePort(t)
	startNginx(t, renderNginx(t, dir, port, ups), dir)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	waitHTTP(t, base+"/nginx-health", 200)
	access := filepath.Join(dir, "access.log")

	ld := startLoad([]string{base + "/generate"}, 6)
	if n := ld.during(2 * time.Second); n == 0 {
		ld.stop()
		t.Fatalf("no request succeeded before the stop: %v", ld.failures)
	}
	b := reps[1]
	b.cmd.Process.Signal(syscall.SIGTERM)
	code := b.waitExit(t, 60*time.Second)
	offExit := fileSize(t, access)
	moved := ld.during(2 * time.Second)
	offRestart := fileSize(t, access)
	b2 := startReplica(t, modelDir, b.port, filepath.Join(dir, "replica1-restarted.log"))
	waitHTTP(t, "http://"+b2.addr()+"/ready", 200)
	ld.during(4 * time.Second) // > fail_timeout 2s: nginx tries the peer again
	ld.stop()
	b2.stop(t)

	if f := ld.failed.Load(); f > 0 {
		t.Errorf("%d of %d client requests failed: %v", f, f+ld.ok.Load(), ld.failures)
	}
	if code != 0 {
		t.Errorf("stopped replica exited %d, want 0 (drained)", code)
	}
	checkDrainedReplica(t, b, access, offRestart)
	// Traffic moved: between the exit and the restart every request was
	// answered by the other two.
	clients, tries := accessLog(t, access, offExit, offRestart)
	if len(clients) == 0 || moved == 0 {
		t.Errorf("no traffic while the replica was down (%d log lines, %d ok)", len(clients), moved)
	}
	for _, a := range tries {
		if a.final && a.addr == b.addr() {
			t.Errorf("a request was answered by the stopped replica: %+v", a)
		}
	}
	// Restarted: it answers requests again, as its own log confirms.
	_, tries = accessLog(t, access, offRestart, -1)
	n := 0
	for _, a := range tries {
		if a.addr == b.addr() && a.status == "200" {
			n++
		}
	}
	got := countGenerate(t, readLog(t, b2.log))
	if n == 0 || got[200] != n {
		t.Errorf("restarted replica: nginx saw %d answers from it, its log %d (want equal and > 0)", n, got[200])
	}
	t.Logf("%d requests ok in all; %d answered by the other two while the replica was down; %d by the restarted replica",
		ld.ok.Load(), moved, n)
}

// checkDrainedReplica: every /generate request the stopped replica logged
// reached the client through nginx (its 200s equal nginx's 200s from it
// before the restart) or was a 503 that nginx retried elsewhere; it
// drained within the timeout and logged only JSON.
func checkDrainedReplica(t *testing.T, b *replica, access string, until int64) {
	t.Helper()
	entries := readLog(t, b.log)
	got := countGenerate(t, entries)
	_, tries := accessLog(t, access, 0, until)
	from := map[string]int{}
	for _, a := range tries {
		if a.addr == b.addr() && a.connected {
			from[a.status]++
		}
	}
	if got[200] == 0 || got[200] != from["200"] {
		t.Errorf("stopped replica logged %d answers of 200, nginx received %d from it: in-flight requests lost", got[200], from["200"])
	}
	for status, n := range got {
		if status != 200 && status != 503 {
			t.Errorf("stopped replica answered %d requests with %d", n, status)
		}
	}
	if got[503] != from["503"] {
		t.Errorf("stopped replica refused %d requests with 503, nginx saw %d", got[503], from["503"])
	}
	// Phases of its log: serving, the drain delay (/ready 503, still
	// serving), the drain (listener closed, in-flight requests finishing).
	phase, inDelay, afterClose := 0, 0, 0
	var stopped bool
	for _, e := range entries {
		switch {
		case strings.HasPrefix(e.Msg, "draining"):
			phase = 1
		case strings.HasPrefix(e.Msg, "closing the listener"):
			phase = 2
		case strings.HasPrefix(e.Msg, "drain timeout"):
			t.Errorf("stopped replica hit its drain timeout: %+v", e)
		case e.Msg == "stopped":
			stopped = true
		case e.Msg == "http" && e.Path == "/generate" && e.Status == 200 && phase == 1:
			inDelay++
		case e.Msg == "http" && e.Path == "/generate" && e.Status == 200 && phase == 2:
			afterClose++
		}
	}
	if !stopped {
		t.Error("stopped replica never logged \"stopped\"")
	}
	if inDelay == 0 {
		t.Error("stopped replica answered nothing during its drain delay (it should serve while /ready is 503)")
	}
	t.Logf("stopped replica: %d answered (%d during the drain delay, %d finished after the listener closed), %d refused with 503 and retried by nginx",
		got[200], inDelay, afterClose, got[503])
}

// A second SIGTERM during the drain delay exits at once, with status 1.
func TestSecondSignalForcesExit(t *testing.T) {
	e2e(t)
	dir := t.TempDir()
	r := startReplica(t, tinyModelDir(t), freePort(t), filepath.Join(dir, "replica.log"), "--drain-delay", "10m")
	waitHTTP(t, "http://"+r.addr()+"/ready", 200)
	r.cmd.Process.Signal(syscall.SIGTERM)
	waitHTTP(t, "http://"+r.addr()+"/ready", 503)
	waitHTTP(t, "http://"+r.addr()+"/health", 200) // still serving during the delay
	r.cmd.Process.Signal(syscall.SIGTERM)
	if code := r.waitExit(t, 30*time.Second); code != 1 {
		t.Errorf("exit code %d after a second signal, want 1", code)
	}
	found := false
	for _, e := range readLog(t, r.log) {
		found = found || strings.HasPrefix(e.Msg, "second signal")
	}
	if !found {
		t.Error("no \"second signal\" log line")
	}
}
