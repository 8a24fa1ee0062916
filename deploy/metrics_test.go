package deploy

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"chunlian/couplet"
	"chunlian/engine"
	"chunlian/forward"
	"chunlian/model"
	"chunlian/server"
)

// promExprs returns every PromQL expression the bundle ships, keyed by
// where it comes from: the Grafana dashboard's targets and variables, the
// recording and alerting rules, and the Prometheus adapter's series query
// the GPU HPA scales on. It also returns the names the recording rules
// define (they exist in Prometheus, not in /metrics).
func promExprs(t *testing.T) (exprs map[string]string, recorded map[string]bool) {
	t.Helper()
	exprs, recorded = map[string]string{}, map[string]bool{}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	readJSON(t, "grafana/chunlian.json", &dash)
	for _, p := range dash.Panels {
		for i, tg := range p.Targets {
			exprs["grafana "+p.Title+" #"+string(rune('A'+i))] = tg.Expr
		}
	}
	for _, v := range dash.Templating.List {
		if v.Definition != "" {
			exprs["grafana variable "+v.Name] = v.Definition
		}
	}
	for _, f := range []string{"prometheus/rules.yml", "prometheus/alerts.yml"} {
		var rf struct {
			Groups []struct {
				Rules []struct {
					Record, Alert, Expr string
				}
			}
		}
		readYAML(t, f, &rf)
		for _, g := range rf.Groups {
			for _, r := range g.Rules {
				exprs[f+" "+r.Record+r.Alert] = r.Expr
				if r.Record != "" {
					recorded[r.Record] = true
				}
			}
		}
	}
	var ad struct {
		Rules []struct {
			SeriesQuery string `yaml:"seriesQuery"`
			Name        struct{ As string }
		}
	}
	readYAML(t, "k8s/gpu/prometheus-adapter-rules.yaml", &ad)
	for _, r := range ad.Rules {
		exprs["adapter "+r.Name.As] = r.SeriesQuery
	}
	if len(exprs) < 20 {
		t.Fatalf("only %d expressions found: the bundle's layout changed?", len(exprs))
	}
	return exprs, recorded
}

var (
	quoted = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'[^']*'|<<[^>]*>>`)
	ident  = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
)

// metricNames lists the chunlian metric names an expression reads (label
// values and template placeholders removed).
func metricNames(expr string) []string {
	var out []string
	for _, id := range ident.FindAllString(quoted.ReplaceAllString(expr, `""`), -1) {
		if strings.HasPrefix(id, "chunlian:") || strings.HasPrefix(id, "chunlian_") {
			out = append(out, id)
		}
	}
	return out
}

// TestQueriedMetricsExist: every chunlian metric that the dashboard, the
// rules, the alerts and the HPA's adapter query is exported by a real
// server (the tiny random model, after a few requests so the histograms
// have series, with a GPU reading as the CUDA backend gives), and the GPU
// HPA scales on the metric the adapter exposes.
func TestQueriedMetricsExist(t *testing.T) {
	exprs, recorded := promExprs(t)
	have := scrapeRealServer(t)
	var missing []string
	seen := 0
	for where, e := range exprs {
		for _, name := range metricNames(e) {
			seen++
			if !have[name] && !recorded[name] {
				missing = append(missing, name+" (in "+where+")")
			}
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("queried but not in /metrics nor recorded:\n  %s", strings.Join(missing, "\n  "))
	}
	if seen < 30 {
		t.Errorf("only %d metric references found", seen)
	}
	var hpa struct {
		Kind string
		Spec struct {
			Metrics []struct {
				Pods struct{ Metric struct{ Name string } }
			}
		}
	}
	found := false
	for _, doc := range yamlDocs(t, "k8s/gpu/chunlian-gpu.yaml") {
		if err := doc.Decode(&hpa); err != nil {
			t.Fatal(err)
		}
		if hpa.Kind == "HorizontalPodAutoscaler" {
			for _, m := range hpa.Spec.Metrics {
				if n := m.Pods.Metric.Name; n != "" {
					found = true
					if _, ok := exprs["adapter "+n]; !ok {
						t.Errorf("GPU HPA scales on %q, which the adapter rules do not expose", n)
					}
				}
			}
		}
	}
	if !found {
		t.Error("GPU HPA has no pods metric")
	}
}

// The checker itself: a name absent from /metrics is reported.
func TestMetricNames(t *testing.T) {
	got := metricNames(`sum by (le) (rate(chunlian:http_request_duration_seconds_bucket{path="/generate",x="chunlian:fake"}[1m])) / chunlian_build_info{<<.LabelMatchers>>}`)
	want := []string{"chunlian:http_request_duration_seconds_bucket", "chunlian_build_info"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("metricNames = %v, want %v", got, want)
	}
}

// scrapeRealServer serves the random model through the real stack, sends a
// few generations and returns the sample names of /metrics.
func scrapeRealServer(t *testing.T) map[string]bool {
	t.Helper()
	m := model.NewRandom(model.TestConfig(), 7)
	cpu, err := forward.NewCPU(m, forward.CPUOptions{BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer cpu.Close()
	eng, err := engine.New(cpu, engine.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	srv, err := server.New(server.Config{})
	if err != nil {
		t.Fatal(err)
	}
	gen, err := couplet.New(m, srv.Metrics().InstrumentEngine(eng), couplet.WithBannerSources())
	if err != nil {
		t.Fatal(err)
	}
	srv.Attach(server.Backend{Generator: gen, Stats: eng.Stats, ModelName: "test", EngineName: "paged",
		GPU: func() (server.GPUStats, bool) {
			return server.GPUStats{UtilizationPerc: 50, MemoryUsedBytes: 1, MemoryTotalBytes: 2}, true
		}})
	if err := srv.Warmup(context.Background()); err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	for _, body := range []string{`{"prompt":"平安"}`, `{"prompt":"如意","mode":"acrostic","n":2}`} {
		res, err := http.Post(ts.URL+"/generate", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Fatalf("generate: %d", res.StatusCode)
		}
	}
	res, err := http.Get(ts.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	have := map[string]bool{}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			have[line[:i]] = true
		}
	}
	if !have["chunlian:num_requests_running"] || !have["chunlian:time_to_first_token_seconds_bucket"] {
		t.Fatalf("/metrics incomplete: %d names", len(have))
	}
	return have
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	docs := yamlDocs(t, path)
	if len(docs) != 1 {
		t.Fatalf("%s: %d YAML documents, want 1", path, len(docs))
	}
	if err := docs[0].Decode(v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// yamlDocs parses every document of a YAML file.
func yamlDocs(t *testing.T, path string) []*yaml.Node {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	var out []*yaml.Node
	for {
		var n yaml.Node
		err := dec.Decode(&n)
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, &n)
	}
}
