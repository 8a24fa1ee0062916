package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// parseProm reads Prometheus text exposition format and returns, per metric
// name, the sum over its label sets and the number of series. Comments, and
// lines that do not parse, are skipped: the bench must survive any /metrics.
// Histogram/summary series (_bucket, _sum, _count) are kept under their own
// names like any other sample.
func parseProm(r io.Reader) map[string]promValue {
	out := map[string]promValue{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		var name, rest, labels string
		if i := strings.IndexByte(line, '{'); i >= 0 {
			j := strings.LastIndexByte(line, '}')
			if j < i {
				continue
			}
			name, labels, rest = line[:i], line[i+1:j], line[j+1:]
		} else {
			k := strings.IndexAny(line, " \t")
			if k < 0 {
				continue
			}
			name, rest = line[:k], line[k:]
		}
		fields := strings.Fields(rest) // value [timestamp]
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil || math.IsNaN(v) {
			continue
		}
		pv := out[name]
		pv.Sum += v
		pv.Series++
		if labels != "" {
			if pv.labels == nil {
				pv.labels = map[string]float64{}
			}
			pv.labels[labels] += v
		}
		out[name] = pv
	}
	return out
}

type promValue struct {
	Sum    float64
	Series int
	// labels holds each series' value by its label text (between the
	// braces); nil for a metric without labels.
	labels map[string]float64
}

// Label sums the series whose labels include name="value".
func (p promValue) Label(name, value string) (float64, bool) {
	sum, ok := 0.0, false
	for ls, v := range p.labels {
		if got, found := labelValue(ls, name); found && got == value {
			sum, ok = sum+v, true
		}
	}
	return sum, ok
}

// Mean is the average over the series (e.g. utilisation of several GPUs).
func (p promValue) Mean() float64 {
	if p.Series == 0 {
		return 0
	}
	return p.Sum / float64(p.Series)
}

// engineCounters are the engine's cumulative counters in one scrape of
// chunlian's /metrics; ok=false when the server exports none (another
// server, or an older chunlian).
type engineCounters struct {
	steps, rows, hostSec, fwdSec float64
	ok                           bool
}

func engineFromProm(m map[string]promValue) engineCounters {
	st, ok1 := m["chunlian:engine_steps_total"]
	rows, ok2 := m["chunlian:engine_computed_tokens_total"]
	sec, ok3 := m["chunlian:engine_step_seconds_total"]
	if !ok1 || !ok2 || !ok3 {
		return engineCounters{}
	}
	sched, _ := sec.Label("phase", "schedule")
	cons, _ := sec.Label("phase", "consume")
	fwd, _ := sec.Label("phase", "forward")
	return engineCounters{steps: st.Sum, rows: rows.Sum, hostSec: sched + cons, fwdSec: fwd, ok: true}
}

// rejectedFromProm returns chunlian's requests_rejected_total by its
// reason label; nil when the server exports none.
func rejectedFromProm(m map[string]promValue) map[string]float64 {
	v, ok := m["chunlian:requests_rejected_total"]
	if !ok {
		return nil
	}
	out := map[string]float64{}
	for ls, n := range v.labels {
		if r, ok := labelValue(ls, "reason"); ok {
			out[r] += n
		}
	}
	return out
}

// rejectedSince is what each reason's counter grew by from before to
// after; nil when none grew, or when either scrape had no counter (a
// failed first scrape must not count the server's whole history).
func rejectedSince(before, after map[string]float64) map[string]int {
	if before == nil || after == nil {
		return nil
	}
	var out map[string]int
	for r, v := range after {
		if d := int(math.Round(v - before[r])); d > 0 {
			if out == nil {
				out = map[string]int{}
			}
			out[r] = d
		}
	}
	return out
}

// labelValue returns the value of label name in the label text ls
// (a="x",b="y"), unescaped.
func labelValue(ls, name string) (string, bool) {
	key := name + "=\""
	for off := 0; off < len(ls); {
		i := strings.Index(ls[off:], key)
		if i < 0 {
			return "", false
		}
		i += off
		if i > 0 && ls[i-1] != ',' && ls[i-1] != ' ' {
			off = i + 1
			continue
		}
		v, err := strconv.QuotedPrefix(ls[i+len(name)+1:])
		if err != nil {
			return "", false
		}
		u, err := strconv.Unquote(v)
		return u, err == nil
	}
	return "", false
}

// gpuReading is one scrape's GPU view; ok=false when /metrics has no GPU gauge.
type gpuReading struct {
	utilPct  float64 // 0–100, mean over GPUs
	memBytes float64 // summed over GPUs
	hasUtil  bool
	hasMem   bool
}

// gpuFromProm recognises GPU gauges. Conventions:
//   - chunlian's chunlian:gpu_utilization_perc holds 0–100 (see
//     server/metrics.go), as does any "gpu_util…_perc" or "…_percent" gauge;
//   - DCGM exporter's DCGM_FI_DEV_GPU_UTIL (0–100) and DCGM_FI_DEV_FB_USED (MiB);
//   - memory gauges whose name contains "gpu_memory_used" and ends in "_bytes".
//
// Several series (GPUs) are averaged for utilisation and summed for memory.
func gpuFromProm(m map[string]promValue) gpuReading {
	var g gpuReading
	for name, v := range m {
		lname := strings.ToLower(name)
		switch {
		case strings.Contains(lname, "gpu_util") && (strings.HasSuffix(lname, "_perc") || strings.HasSuffix(lname, "_percent")):
			g.utilPct, g.hasUtil = v.Mean(), true
		case name == "DCGM_FI_DEV_GPU_UTIL":
			g.utilPct, g.hasUtil = v.Mean(), true
		case strings.Contains(lname, "gpu_memory_used") && strings.HasSuffix(lname, "_bytes"):
			g.memBytes, g.hasMem = v.Sum, true
		case name == "DCGM_FI_DEV_FB_USED":
			g.memBytes, g.hasMem = v.Sum*(1<<20), true
		}
	}
	return g
}

// scrape fetches and parses base+"/metrics". A missing endpoint is not an
// error worth reporting per level; the caller just gets nil.
func scrape(ctx context.Context, hc *http.Client, base string) map[string]promValue {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return nil
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	return parseProm(io.LimitReader(resp.Body, 16<<20))
}

// clockTicks is USER_HZ, the unit of utime/stime in /proc/PID/stat. It is 100
// on every Linux architecture Go supports (the kernel ABI fixes it; procfs
// libraries hard-code it too), so no cgo sysconf call is needed.
const clockTicks = 100

// parseProcStat returns utime+stime in seconds from the content of
// /proc/PID/stat. The command name (field 2) is in parentheses and may itself
// contain spaces and parentheses, so fields are counted after the LAST ')'.
func parseProcStat(b []byte) (float64, error) {
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("proc stat: no ')'")
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); utime is field 14 → f[11], stime field 15 → f[12].
	if len(f) < 13 {
		return 0, fmt.Errorf("proc stat: %d fields after comm", len(f))
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("proc stat: bad utime/stime %q %q", f[11], f[12])
	}
	return float64(ut+st) / clockTicks, nil
}

// procCPUSeconds reads the CPU time used so far by process pid.
func procCPUSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseProcStat(b)
}

// Machine describes where the bench ran (the client side; with --spawn also
// the server side).
type Machine struct {
	CPUModel string `json:"cpu_model"`
	Cores    int    `json:"cores"`
	OS       string `json:"os"`
	Arch     string `json:"arch"`
	Go       string `json:"go"`
}

func thisMachine() Machine {
	m := Machine{Cores: runtime.NumCPU(), OS: runtime.GOOS, Arch: runtime.GOARCH, Go: runtime.Version()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if m.CPUModel == "" {
		m.CPUModel = "unknown"
	}
	return m
}
