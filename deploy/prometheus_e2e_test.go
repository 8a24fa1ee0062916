package deploy

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// renderPrometheus is the shipped prometheus.yml with the compose DNS
// discovery replaced by static loopback targets and 1 s intervals (so the
// test sees rates within seconds), next to copies of the shipped rules.
func renderPrometheus(t *testing.T, dir string, targets []string) string {
	t.Helper()
	b, err := os.ReadFile("prometheus/prometheus.yml")
	if err != nil {
		t.Fatal(err)
	}
	conf := string(b)
	start := strings.Index(conf, "    dns_sd_configs:")
	end := strings.Index(conf, "refresh_interval: 10s\n")
	if start < 0 || end < start {
		t.Fatal("prometheus.yml: no dns_sd_configs block to replace")
	}
	end += len("refresh_interval: 10s\n")
	static := fmt.Sprintf("    static_configs:\n      - targets: ['%s']\n", strings.Join(targets, "', '"))
	conf = conf[:start] + static + conf[end:]
	for _, r := range [][2]string{{"scrape_interval: 5s", "scrape_interval: 1s"}, {"evaluation_interval: 5s", "evaluation_interval: 1s"}} {
		if strings.Count(conf, r[0]) != 1 {
			t.Fatalf("prometheus.yml: %q not found once", r[0])
		}
		conf = strings.Replace(conf, r[0], r[1], 1)
	}
	for _, f := range []string{"rules.yml", "alerts.yml"} {
		rb, err := os.ReadFile(filepath.Join("prometheus", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), rb, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("promtool", "check", "config", path).CombinedOutput(); err != nil {
		t.Fatalf("promtool check config: %v\n%s", err, out)
	}
	return path
}

// promQuery runs an instant query and returns value by instance label
// ("" for a series without one).
func promQuery(t *testing.T, base, q string, at time.Time) (map[string]float64, error) {
	t.Helper()
	u := base + "/api/v1/query?query=" + url.QueryEscape(q) + "&time=" + strconv.FormatInt(at.Unix(), 10)
	res, err := http.Get(u)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	var out struct {
		Status string
		Error  string
		Data   struct {
			Result []struct {
				Metric map[string]string
				Value  [2]any
			}
		}
	}
	if err := json.NewDecoder(res.Body).Decode(&out); err != nil {
		return nil, err
	}
	if out.Status != "success" {
		return nil, fmt.Errorf("%s: %s", q, out.Error)
	}
	vals := map[string]float64{}
	for _, r := range out.Data.Result {
		s, _ := r.Value[1].(string)
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, err
		}
		vals[r.Metric["instance"]] = v
	}
	return vals, nil
}

// The shipped scrape config and rules on the real Prometheus, against two
// replicas under load: its HTTP API shows each replica's request rate and
// the sum (raw and through the recording rules), every target up and every
// rule healthy.
func TestPrometheusScrapesReplicas(t *testing.T) {
	e2e(t, "prometheus", "promtool")
	dir := t.TempDir()
	modelDir := tinyModelDir(t)
	var targets, urls []string
	for i := range 2 {
		r := startReplica(t, modelDir, freePort(t), filepath.Join(dir, fmt.Sprintf("replica%d.log", i)), "--log-level", "warn")
		waitHTTP(t, "http://"+r.addr()+"/ready", 200)
		targets = append(targets, r.addr())
		urls = append(urls, "http://"+r.addr()+"/generate")
	}
	port := freePort(t)
	conf := renderPrometheus(t, dir, targets)
	startDaemon(t, exec.Command("prometheus", "--config.file="+conf, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		fmt.Sprintf("--web.listen-address=127.0.0.1:%d", port), "--log.level=warn"), filepath.Join(dir, "prometheus.log"), syscall.SIGTERM)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	waitHTTP(t, base+"/-/ready", 200)

	ld := startLoad(urls, 2)
	defer ld.stop()
	const perReplica = `sum by (instance) (rate(chunlian:http_requests_total{job="chunlian",path="/generate"}[5s]))`
	const summed = `sum(rate(chunlian:http_requests_total{job="chunlian",path="/generate"}[5s]))`
	deadline := time.Now().Add(60 * time.Second)
	var last string
	for {
		now := time.Now()
		last = checkRates(t, base, now, targets, perReplica, summed)
		if last == "" {
			break
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(filepath.Join(dir, "prometheus.log"))
			t.Fatalf("Prometheus never showed the rates: %s\nprometheus log:\n%s", last, b)
		}
		time.Sleep(500 * time.Millisecond)
	}
	checkTargetsAndRules(t, base, len(targets))
}

// checkRates returns "" when at time now Prometheus has a positive rate for
// each target, their sum equals the summed query, and the recording rules
// show the same shape; otherwise what is missing.
func checkRates(t *testing.T, base string, now time.Time, targets []string, perReplica, summed string) string {
	per, err := promQuery(t, base, perReplica, now)
	if err != nil {
		return err.Error()
	}
	total := 0.0
	for _, tg := range targets {
		if per[tg] <= 0 {
			return fmt.Sprintf("no request rate for %s yet: %v", tg, per)
		}
		total += per[tg]
	}
	sum, err := promQuery(t, base, summed, now)
	if err != nil {
		return err.Error()
	}
	if len(sum) != 1 || math.Abs(sum[""]-total) > 1e-9*total {
		return fmt.Sprintf("summed rate %v, per replica %v (sum %g)", sum, per, total)
	}
	rec, err := promQuery(t, base, "instance:chunlian_generate_requests:rate1m", now)
	if err != nil || len(rec) != len(targets) {
		return fmt.Sprintf("recording rule per instance: %v %v", rec, err)
	}
	job, err := promQuery(t, base, "job:chunlian_generate_requests:rate1m", now)
	if err != nil || len(job) != 1 {
		return fmt.Sprintf("recording rule per job: %v %v", job, err)
	}
	for _, v := range job {
		if v <= 0 {
			return fmt.Sprintf("recorded job rate %v", job)
		}
	}
	t.Logf("per replica %v, summed %.1f requests/s, recorded job rate %v", per, sum[""], job)
	return ""
}

// checkTargetsAndRules: every scrape target up, every rule evaluated
// without error.
func checkTargetsAndRules(t *testing.T, base string, nTargets int) {
	t.Helper()
	var tg struct {
		Data struct {
			ActiveTargets []struct {
				Health    string
				LastError string
				Labels    map[string]string
			}
		}
	}
	getJSON(t, base+"/api/v1/targets", &tg)
	if len(tg.Data.ActiveTargets) != nTargets {
		t.Errorf("%d active targets, want %d", len(tg.Data.ActiveTargets), nTargets)
	}
	for _, a := range tg.Data.ActiveTargets {
		if a.Health != "up" {
			t.Errorf("target %v: %s %s", a.Labels, a.Health, a.LastError)
		}
	}
	var rl struct {
		Data struct {
			Groups []struct {
				Name  string
				Rules []struct {
					Name, Health, LastError string
				}
			}
		}
	}
	getJSON(t, base+"/api/v1/rules", &rl)
	n := 0
	for _, g := range rl.Data.Groups {
		for _, r := range g.Rules {
			n++
			if r.Health == "err" {
				t.Errorf("rule %s/%s: %s", g.Name, r.Name, r.LastError)
			}
		}
	}
	if n < 10 {
		t.Errorf("Prometheus loaded %d rules, want the shipped recording and alerting rules", n)
	}
}

func getJSON(t *testing.T, u string, v any) {
	t.Helper()
	res, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if err := json.NewDecoder(res.Body).Decode(v); err != nil {
		t.Fatalf("%s: %v", u, err)
	}
}
