package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
)

func TestParseProm(t *testing.T) {
	text := `# HELP process_cpu_seconds_total Total user and system CPU time.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 12.5
chunlian:gpu_utilization_perc{gpu="0"} 50
chunlian:gpu_utilization_perc{gpu="1"} 70
chunlian:gpu_memory_used_bytes{gpu="0"} 1e9
chunlian:gpu_memory_used_bytes{gpu="1"} 2e9
weird{label="a b } c"} 3 1700000000000
chunlian:e2e_request_latency_seconds_bucket{le="+Inf"} 17
bad line
nan_metric NaN
plain_no_value
chunlian:engine_step_seconds_total{phase="schedule",model_name="m"} 1.5
chunlian:engine_step_seconds_total{phase="schedule_wait",model_name="m"} 100
chunlian:engine_step_seconds_total{model_name="m", phase="schedule"} 0.5
chunlian:engine_step_seconds_total{phase="consume",model_name="m"} 2
`
	m := parseProm(strings.NewReader(text))
	tests := []struct {
		name   string
		sum    float64
		series int
	}{
		{"process_cpu_seconds_total", 12.5, 1},
		{"chunlian:gpu_utilization_perc", 120, 2},
		{"chunlian:gpu_memory_used_bytes", 3e9, 2},
		{"weird", 3, 1},
		{"chunlian:e2e_request_latency_seconds_bucket", 17, 1},
	}
	for _, tc := range tests {
		v, ok := m[tc.name]
		if !ok || v.Series != tc.series || v.Sum != tc.sum {
			t.Errorf("%s = %+v (present %v), want sum %g over %d series", tc.name, v, ok, tc.sum, tc.series)
		}
	}
	steps := m["chunlian:engine_step_seconds_total"]
	for _, tc := range []struct {
		value string
		sum   float64
		ok    bool
	}{{"schedule", 2, true}, {"consume", 2, true}, {"forward", 0, false}, {"schedule_wait", 100, true}} {
		if v, ok := steps.Label("phase", tc.value); ok != tc.ok || v != tc.sum {
			t.Errorf("phase=%q: %g (present %v), want %g (%v)", tc.value, v, ok, tc.sum, tc.ok)
		}
	}
	for _, absent := range []string{"bad", "nan_metric", "plain_no_value", "#"} {
		if _, ok := m[absent]; ok {
			t.Errorf("%q should have been skipped", absent)
		}
	}
}

func TestGPUFromProm(t *testing.T) {
	tests := []struct {
		name            string
		text            string
		util, mem       float64
		hasUtil, hasMem bool
	}{
		{"chunlian gauges, two GPUs", "chunlian:gpu_utilization_perc{gpu=\"0\"} 50\nchunlian:gpu_utilization_perc{gpu=\"1\"} 70\nchunlian:gpu_memory_used_bytes 3e9\n", 60, 3e9, true, true},
		{"percent 0-100", "chunlian:gpu_utilization_percent 87\n", 87, 0, true, false},
		{"DCGM exporter (MiB)", "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\"} 40\nDCGM_FI_DEV_FB_USED{gpu=\"0\"} 1024\n", 40, 1 << 30, true, true},
		{"no GPU", "process_cpu_seconds_total 1\n", 0, 0, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := gpuFromProm(parseProm(strings.NewReader(tc.text)))
			if g.hasUtil != tc.hasUtil || g.hasMem != tc.hasMem || g.memBytes != tc.mem ||
				(tc.hasUtil && (g.utilPct < tc.util-1e-9 || g.utilPct > tc.util+1e-9)) {
				t.Errorf("got %+v, want util %g (%v) mem %g (%v)", g, tc.util, tc.hasUtil, tc.mem, tc.hasMem)
			}
		})
	}
}

func TestParseProcStat(t *testing.T) {
	// Fields after the comm: state(3) ppid pgrp session tty tpgid flags minflt
	// cminflt majflt cmajflt utime(14) stime(15) …
	tests := []struct {
		name    string
		line    string
		want    float64
		wantErr bool
	}{
		{"plain", "1234 (chunlian) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 100 1000 10", 3.0, false},
		{"comm with spaces and parens", "77 (my (weird) prog) R 1 77 77 0 -1 0 0 0 0 0 1 2 0 0 20 0 1 0", 0.03, false},
		{"no paren", "1234 chunlian S 1", 0, true},
		{"too short", "1 (x) S 1 2 3", 0, true},
		{"bad number", "1 (x) S 1 1 1 0 -1 0 0 0 0 0 abc 2", 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseProcStat([]byte(tc.line))
			if (err != nil) != tc.wantErr || (!tc.wantErr && (got < tc.want-1e-9 || got > tc.want+1e-9)) {
				t.Errorf("parseProcStat = %g, %v; want %g (error %v)", got, err, tc.want, tc.wantErr)
			}
		})
	}
	if _, err := os.Stat("/proc/self/stat"); err == nil {
		if v, err := procCPUSeconds(os.Getpid()); err != nil || v < 0 {
			t.Errorf("own /proc stat: %g, %v", v, err)
		}
	}
}

func TestCheckURL(t *testing.T) {
	tests := []struct {
		url    string
		remote bool
		ok     bool
	}{
		{"http://127.0.0.1:8000", false, true},
		{"http://127.5.5.5:80/", false, true}, // all of 127/8 is loopback
		{"http://localhost:1", false, true},
		{"http://LOCALHOST:1", false, true},
		{"http://[::1]:8000", false, true},
		{"https://127.0.0.1", false, true},
		{"http://10.0.0.1:8000", false, false},
		{"http://192.0.2.7", false, false},
		{"http://example.com", false, false},
		{"http://localhost.example.com", false, false},
		{"http://example.com", true, true},
		{"ftp://127.0.0.1", false, false},
		{"http://user:pw@127.0.0.1", false, false},
		{"http://", false, false},
		{"127.0.0.1:8000", false, false}, // no scheme
	}
	for _, tc := range tests {
		err := CheckURL(tc.url, tc.remote)
		if (err == nil) != tc.ok {
			t.Errorf("CheckURL(%q, remote=%v) = %v, want ok=%v", tc.url, tc.remote, err, tc.ok)
		}
	}
}

func TestAccum(t *testing.T) {
	// Each case is the sequence of JSON bodies/events of one response.
	tests := []struct {
		name             string
		chunks           []string
		tokens, couplets int
		carried          int // chunks that count as generated text (TTFT)
	}{
		{"generate final object", []string{`{"generated_text":"上联：春回大地\n下联：福满人间\n横批：吉祥","couplets":[{"upper":"春回大地","lower":"福满人间","banner":"吉祥","score":-1}]}`}, 10, 1, 0},
		{"generate text only, labels not counted", []string{`{"generated_text":"上联：春回大地\n下联：福满人间\n横批：吉祥"}`}, 10, 1, 0},
		{"two couplets", []string{`{"couplets":[{"upper":"一二三","lower":"四五六","banner":"七八"},{"upper":"甲乙丙","lower":"丁戊己","banner":"庚辛"}]}`}, 16, 2, 0},
		{"generate stream then final", []string{`{"token":"春"}`, `{"token":"回"}`, `{"couplets":[{"upper":"春回","lower":"福满","banner":"吉祥"}]}`}, 6, 1, 2},
		{"token ids only", []string{`{"token":5}`, `{"token":7}`, `{"token":9}`}, 3, 1, 3},
		{"openai stream with usage", []string{`{"choices":[{"index":0,"text":"春回"}]}`, `{"choices":[{"index":0,"text":"大地"}]}`, `{"choices":[],"usage":{"completion_tokens":17}}`}, 17, 1, 2},
		{"openai stream without usage", []string{`{"choices":[{"index":0,"text":"春回"}]}`, `{"choices":[{"index":0,"text":"大地"}]}`}, 4, 1, 2},
		{"openai n=2", []string{`{"choices":[{"index":0,"text":"春"}]}`, `{"choices":[{"index":1,"text":"福"}]}`}, 2, 2, 2},
		{"chat delta", []string{`{"choices":[{"index":0,"delta":{"content":"春回"}}]}`, `{"choices":[{"index":0,"delta":{"role":"assistant"}}]}`}, 2, 1, 1},
		{"chunlian SSE: start, token, result with usage", []string{`{"request_id":"r1","prompt":"平安","mode":"keyword"}`, `{"attempt":0,"sample":0,"part":"upper","text":"平"}`, `{"attempt":0,"sample":0,"part":"upper","text":"安"}`, `{"generated_text":"上联：平安\n下联：吉祥\n横批：如意","couplets":[{"upper":"平安","lower":"吉祥","banner":"如意"}],"usage":{"prompt_tokens":4,"completion_tokens":12,"total_tokens":16}}`}, 12, 1, 2},
		{"NDJSON wrapper", []string{`{"event":"start","data":{"request_id":"r1"}}`, `{"event":"token","data":{"text":"平"}}`, `{"event":"result","data":{"couplets":[{"upper":"平安","lower":"吉祥","banner":"如意"}]}}`}, 6, 1, 1},
		{"empty text is not a token", []string{`{"choices":[{"index":0,"text":""}]}`, `{"text":""}`, `{"token":null}`}, 0, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var a accum
			carried := 0
			for _, c := range tc.chunks {
				var ch chunk
				if err := json.Unmarshal([]byte(c), &ch); err != nil {
					t.Fatalf("unmarshal %s: %v", c, err)
				}
				if a.add(&ch) {
					carried++
				}
			}
			tok, cp := a.result()
			if tok != tc.tokens || cp != tc.couplets || carried != tc.carried {
				t.Errorf("tokens %d couplets %d carried %d; want %d %d %d", tok, cp, carried, tc.tokens, tc.couplets, tc.carried)
			}
		})
	}
}

func TestIsOverload(t *testing.T) {
	tests := []struct {
		class string
		want  bool
	}{
		{"error event: queue_full", true},
		{"HTTP 500: overloaded", true},
		{"error event: unknown_char", false},
		{"HTTP 500: internal", false},
		{"client timeout", false},
	}
	for _, tc := range tests {
		if got := isOverload(tc.class); got != tc.want {
			t.Errorf("isOverload(%q) = %v, want %v", tc.class, got, tc.want)
		}
	}
}

func TestErrCode(t *testing.T) {
	tests := []struct{ body, want string }{
		{`{"error":{"code":"queue_full","message":"x"}}`, ": queue_full"},
		{`{"error":"plain"}`, ""},
		{`not json`, ""},
	}
	for _, tc := range tests {
		if got := errCode([]byte(tc.body)); got != tc.want {
			t.Errorf("errCode(%s) = %q, want %q", tc.body, got, tc.want)
		}
	}
}

func TestRejectedFromProm(t *testing.T) {
	scrape := func(connections, queue float64) map[string]promValue {
		return parseProm(strings.NewReader(fmt.Sprintf(`# TYPE chunlian:requests_rejected_total counter
chunlian:requests_rejected_total{reason="connections"} %g
chunlian:requests_rejected_total{model_name="a",reason="queue_full"} %g
chunlian:requests_rejected_total{model_name="b",reason="queue_full"} 1
chunlian:requests_rejected_total{xreason="overloaded",reason="not_ready"} 0
chunlian:requests_rejected_total{reason="say \"hi\""} 2
`, connections, queue)))
	}
	before := rejectedFromProm(scrape(3, 4))
	if before["queue_full"] != 5 || before["connections"] != 3 || before["not_ready"] != 0 || before[`say "hi"`] != 2 {
		t.Fatalf("by reason %v", before)
	}
	if _, ok := before["overloaded"]; ok {
		t.Errorf("xreason read as reason: %v", before)
	}
	got := rejectedSince(before, rejectedFromProm(scrape(10, 4)))
	if len(got) != 1 || got["connections"] != 7 {
		t.Errorf("grew by %v, want connections 7 only", got)
	}
	if got := rejectedSince(before, before); got != nil {
		t.Errorf("no growth gave %v, want nil", got)
	}
	if got := rejectedSince(nil, before); got != nil {
		t.Errorf("without a first reading: %v, want nil", got)
	}
	if rejectedFromProm(parseProm(strings.NewReader("process_cpu_seconds_total 1\n"))) != nil {
		t.Error("a server without the counter gave reasons")
	}
}
