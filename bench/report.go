package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"chunlian/stats"
)

// LevelResult is everything measured at one level. Latency, TTFT and TPOT
// cover completed requests only; rejected (503) and failed ones are counted
// separately.
type LevelResult struct {
	Level
	// WindowS is the measured window [t0, stop] in seconds, and
	// CompletedInWindow the successful completions of any request inside it:
	// the throughput figures are CompletedInWindow (and its couplets and
	// tokens) / WindowS. See the counting rules in load.go.
	WindowS           float64        `json:"window_s"`
	CompletedInWindow int            `json:"completed_in_window"`
	Sent              int            `json:"sent"` // counted requests: sent inside the window
	Completed         int            `json:"completed"`
	Failed            int            `json:"failed"`
	Rejected          int            `json:"rejected"`          // HTTP 503, or a queue_full/overloaded error event in a stream
	Dropped           int            `json:"dropped,omitempty"` // open loop: not sent, client in-flight cap
	Errors            map[string]int `json:"errors,omitempty"`  // failure class → count
	OutputTokens      int            `json:"output_tokens"`     // of counted completed requests
	Couplets          int            `json:"couplets"`          // of counted completed requests
	ReqPerSec         float64        `json:"req_per_s"`
	CoupletsPerSec    float64        `json:"couplets_per_s"`
	TokensPerSec      float64        `json:"tokens_per_s"`
	Latency           Summary        `json:"latency"`
	TTFT              Summary        `json:"ttft"` // N = 0 without --stream
	TPOT              Summary        `json:"tpot"` // time per output token after the first
	// Server is the time the server reported spending on each completed
	// request (chunlian's latency_ms: generation only, no network or HTTP
	// handling); N = 0 when the target does not report it. Latency minus
	// Server is what the transport and the server's HTTP layer add.
	Server Summary `json:"server"`
	// LatencyHistogram: cumulative buckets over DefaultBucketsMS, then +Inf.
	LatencyHistogram []Bucket `json:"latency_histogram"`
	// CPUCores is the server's CPU-seconds per wall-second over the window
	// (1.0 = one core busy); nil when unknown. CPUSource: "proc" or "metrics".
	CPUCores  *float64 `json:"cpu_cores,omitempty"`
	CPUSource string   `json:"cpu_source,omitempty"`
	// BenchCPUCores is the load generator's own CPU over the window: on a
	// small machine shared with the server it is load the server did not get.
	BenchCPUCores *float64 `json:"bench_cpu_cores,omitempty"`
	GPUUtilPct    *float64 `json:"gpu_util_pct,omitempty"`
	GPUMemBytes   *float64 `json:"gpu_mem_bytes,omitempty"`
	// ServerRSSBytes is the server's resident memory (its /metrics
	// process_resident_memory_bytes), the maximum over the window's scrapes.
	ServerRSSBytes *float64 `json:"server_rss_bytes,omitempty"`
	// KVLiveSlots is chunlian's kv_cache_live_slots_perc (0..1: the share
	// of allocated KV slots holding a live token), the mean over the
	// window's scrapes that found any slot allocated.
	KVLiveSlots *float64 `json:"kv_live_slots,omitempty"`
	// RejectedBy is chunlian's requests_rejected_total over the window by
	// reason (connections, overloaded, queue_full, …): why the server
	// turned requests away, which a 503's body does not always say. Nil
	// for other servers, or when none was turned away.
	RejectedBy map[string]int `json:"rejected_by,omitempty"`
	// Engine is chunlian's own engine counters over the window; nil for
	// other servers.
	Engine  *EngineWindow `json:"engine,omitempty"`
	Partial bool          `json:"partial,omitempty"` // cut short by Ctrl-C or the run cap
	// unreachable: the level stopped because its first refusedAbort
	// requests were refused at connect (not part of the report).
	unreachable bool
}

// EngineWindow is what chunlian's engine counters (its /metrics) moved by
// between the first and the last scrape of a level: from the window's
// start until its last counted request finished.
type EngineWindow struct {
	Steps float64 `json:"steps"` // forward passes, summed over engine loops
	Rows  float64 `json:"rows"`  // token rows run through the model
	// RowsPerCouplet is Rows over the level's counted couplets: requests
	// running when the window opened make it slightly high.
	RowsPerCouplet float64 `json:"rows_per_couplet"`
	// HostMSPerStep is an engine loop's wall time per step outside the
	// forward pass (scheduling, sampling, rules, delivery); ForwardMSPerStep
	// the forward pass's, waiting for the device included.
	HostMSPerStep    float64 `json:"host_ms_per_step"`
	ForwardMSPerStep float64 `json:"forward_ms_per_step"`
}

// TargetResult is one service's levels.
type TargetResult struct {
	Name   string        `json:"name"`
	URL    string        `json:"url,omitempty"`
	API    string        `json:"api,omitempty"`
	Engine string        `json:"engine,omitempty"` // serve --engine value when spawned
	Error  string        `json:"error,omitempty"`  // the target could not be measured
	Levels []LevelResult `json:"levels"`
}

// Report is a whole run.
type Report struct {
	Date        string         `json:"date"`
	Machine     Machine        `json:"machine"`
	Command     string         `json:"command,omitempty"`
	Options     Options        `json:"options"`
	Spawned     bool           `json:"spawned"` // servers ran on this machine
	Targets     []TargetResult `json:"targets"`
	Interrupted string         `json:"interrupted,omitempty"`
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(r)
}

// level finds the closed-loop level with c users, or nil.
func (tr *TargetResult) level(c int) *LevelResult {
	for i := range tr.Levels {
		if l := &tr.Levels[i]; l.Shape == "closed" && l.Concurrency == c && l.Completed > 0 {
			return l
		}
	}
	return nil
}

// peak returns the level with the highest completed req/s, or nil.
func (tr *TargetResult) peak() *LevelResult {
	var best *LevelResult
	for i := range tr.Levels {
		l := &tr.Levels[i]
		if l.Completed > 0 && (best == nil || l.ReqPerSec > best.ReqPerSec) {
			best = l
		}
	}
	return best
}

// Pair picks the comparison columns: the baseline is the target named
// "naive" (else the first), the optimised one the target named "engine"
// (else the next other one). opt is nil with a single target.
func (r *Report) Pair() (base, opt *TargetResult) {
	idx := func(name string) int {
		for i := range r.Targets {
			if r.Targets[i].Name == name {
				return i
			}
		}
		return -1
	}
	b, o := idx("naive"), idx("engine")
	if b < 0 {
		for i := range r.Targets {
			if i != o {
				b = i
				break
			}
		}
	}
	if o < 0 {
		for i := range r.Targets {
			if i != b {
				o = i
				break
			}
		}
	}
	if b < 0 {
		// A single target named "engine": it is the only column. (The loop
		// above found no other target to be the baseline.)
		b, o = o, -1
	}
	if b >= 0 {
		base = &r.Targets[b]
	}
	if o >= 0 && o != b {
		opt = &r.Targets[o]
	}
	return base, opt
}

// seedRow is one row of the seed-shaped table: value extracts the figure
// (ok=false: not measured), better says which direction is a gain.
type seedRow struct {
	label  string
	value  func(*TargetResult) (v float64, text string, ok bool)
	better int // +1 higher is better, -1 lower is better, 0 no gain column
}

func (r *Report) seedRows() []seedRow {
	atLevel := func(c int, f func(*LevelResult) float64, format func(float64) string) func(*TargetResult) (float64, string, bool) {
		return func(tr *TargetResult) (float64, string, bool) {
			l := tr.level(c)
			if l == nil {
				return 0, "", false
			}
			v := f(l)
			return v, format(v), true
		}
	}
	rows := []seedRow{
		{"Single-request latency (mean, 1 user)", atLevel(1, func(l *LevelResult) float64 { return l.Latency.Mean }, fmtMS), -1},
		{"QPS at 10 users (couplets/s)", atLevel(10, func(l *LevelResult) float64 { return l.CoupletsPerSec }, fmtRate), +1},
		{"Peak QPS (couplets/s)", func(tr *TargetResult) (float64, string, bool) {
			l := tr.peak()
			if l == nil {
				return 0, "", false
			}
			return l.CoupletsPerSec, fmt.Sprintf("%s (at %s)", fmtRate(l.CoupletsPerSec), l.Level), true
		}, +1},
		{"P99 latency at 20 users", atLevel(20, func(l *LevelResult) float64 { return l.Latency.P99 }, fmtMS), -1},
		{"Server CPU (at peak QPS)", func(tr *TargetResult) (float64, string, bool) {
			l := tr.peak()
			if l == nil || l.CPUCores == nil {
				return 0, "", false
			}
			s := fmt.Sprintf("%.2f cores", *l.CPUCores)
			if r.Spawned && r.Machine.Cores > 0 {
				s += fmt.Sprintf(" (%.0f%% of %d)", 100**l.CPUCores/float64(r.Machine.Cores), r.Machine.Cores)
			}
			return *l.CPUCores, s, true
		}, 0},
	}
	hasGPU := false
	for i := range r.Targets {
		for _, l := range r.Targets[i].Levels {
			hasGPU = hasGPU || l.GPUUtilPct != nil || l.GPUMemBytes != nil
		}
	}
	gpuRow := seedRow{"GPU utilisation (at peak QPS)", func(tr *TargetResult) (float64, string, bool) {
		l := tr.peak()
		if l == nil || (l.GPUUtilPct == nil && l.GPUMemBytes == nil) {
			return 0, "", false
		}
		var parts []string
		if l.GPUUtilPct != nil {
			parts = append(parts, fmt.Sprintf("%.0f%%", *l.GPUUtilPct))
		}
		if l.GPUMemBytes != nil {
			parts = append(parts, fmt.Sprintf("%.2f GiB used", *l.GPUMemBytes/(1<<30)))
		}
		return 0, strings.Join(parts, ", "), true
	}, 0}
	if hasGPU {
		rows = append(rows, gpuRow)
	} else {
		rows = append(rows, seedRow{"GPU utilisation", func(*TargetResult) (float64, string, bool) {
			return 0, "n/a (no GPU metrics)", true
		}, 0})
	}
	return rows
}

// Gain returns how many times better opt is than base for the direction
// better (+1: opt/base, -1: base/opt); ok=false when undefined.
func Gain(base, opt float64, better int) (float64, bool) {
	switch {
	case better > 0 && base > 0:
		return opt / base, true
	case better < 0 && opt > 0:
		return base / opt, true
	}
	return 0, false
}

// WriteSeedTable writes the table shaped like the seed's: rows = single
// latency, QPS at 10 users, peak QPS, P99 at 20 users, CPU/GPU; columns =
// baseline, optimised, gain.
func (r *Report) WriteSeedTable(w io.Writer) {
	base, opt := r.Pair()
	if base == nil {
		fmt.Fprintln(w, "_No target was measured._")
		return
	}
	if opt == nil {
		fmt.Fprintf(w, "| | %s |\n|---|---|\n", base.Name)
	} else {
		fmt.Fprintf(w, "| | %s (baseline) | %s (optimised) | gain |\n|---|---|---|---|\n", base.Name, opt.Name)
	}
	for _, row := range r.seedRows() {
		bv, bt, bok := row.value(base)
		if !bok {
			bt = "not measured"
		}
		if opt == nil {
			fmt.Fprintf(w, "| %s | %s |\n", row.label, bt)
			continue
		}
		ov, ot, ook := row.value(opt)
		if !ook {
			ot = "not measured"
		}
		gain := "—"
		if bok && ook && row.better != 0 {
			if g, ok := Gain(bv, ov, row.better); ok {
				gain = fmt.Sprintf("%.1f×", g)
			}
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", row.label, bt, ot, gain)
	}
}

// WriteLevelTable writes one row per target and level.
func (r *Report) WriteLevelTable(w io.Writer) {
	fmt.Fprintln(w, "| target | load | sent | ok | failed | 503 | req/s | couplets/s | tokens/s | mean | p50 | p90 | p99 | max | server p50 | TTFT p50 | TPOT p50 | server CPU | bench CPU | GPU | server RSS | KV slots live | rows/couplet | host / forward ms per step |")
	fmt.Fprintln(w, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	for _, tr := range r.Targets {
		if tr.Error != "" {
			first, _, _ := strings.Cut(tr.Error, "\n")
			fmt.Fprintf(w, "| %s | — | not measured: %s |||||||||||||||||||||\n", tr.Name, mdEscape(first))
			continue
		}
		for _, l := range tr.Levels {
			load := l.Level.String()
			if l.Partial {
				load += " (partial)"
			}
			failed := fmt.Sprint(l.Failed)
			if l.Dropped > 0 {
				failed += fmt.Sprintf(" (+%d dropped)", l.Dropped)
			}
			server, ttft, tpot := "—", "—", "—"
			if l.Server.N > 0 {
				server = fmtMS(l.Server.P50)
			}
			if l.TTFT.N > 0 {
				ttft = fmtMS(l.TTFT.P50)
			}
			if l.TPOT.N > 0 {
				tpot = fmtMS(l.TPOT.P50)
			}
			cpu, self, gpu := "—", "—", "—"
			if l.CPUCores != nil {
				cpu = fmt.Sprintf("%.2f cores", *l.CPUCores)
			}
			if l.BenchCPUCores != nil {
				self = fmt.Sprintf("%.2f cores", *l.BenchCPUCores)
			}
			if l.GPUUtilPct != nil {
				gpu = fmt.Sprintf("%.0f%%", *l.GPUUtilPct)
			}
			if l.GPUMemBytes != nil {
				if gpu == "—" {
					gpu = ""
				} else {
					gpu += ", "
				}
				gpu += fmt.Sprintf("%.2f GiB", *l.GPUMemBytes/(1<<30))
			}
			lat := func(v float64) string {
				if l.Latency.N == 0 {
					return "—"
				}
				return fmtMS(v)
			}
			rss, live, rows, step := "—", "—", "—", "—"
			if l.KVLiveSlots != nil {
				live = fmt.Sprintf("%.1f%%", 100**l.KVLiveSlots)
			}
			if l.ServerRSSBytes != nil {
				rss = fmt.Sprintf("%.0f MiB", *l.ServerRSSBytes/(1<<20))
			}
			if e := l.Engine; e != nil {
				if e.RowsPerCouplet > 0 {
					rows = fmt.Sprintf("%.1f", e.RowsPerCouplet)
				}
				step = fmt.Sprintf("%.3f / %.3f", e.HostMSPerStep, e.ForwardMSPerStep)
			}
			fmt.Fprintf(w, "| %s | %s | %d | %d | %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
				tr.Name, load, l.Sent, l.Completed, failed, l.Rejected,
				fmtRate(l.ReqPerSec), fmtRate(l.CoupletsPerSec), fmtRate(l.TokensPerSec),
				lat(l.Latency.Mean), lat(l.Latency.P50), lat(l.Latency.P90), lat(l.Latency.P99), lat(l.Latency.Max),
				server, ttft, tpot, cpu, self, gpu, rss, live, rows, step)
		}
	}
}

// WriteMarkdown writes the whole human report: header, seed table, level
// table and failure classes.
func (r *Report) WriteMarkdown(w io.Writer) {
	fmt.Fprintf(w, "## chunlian bench — %s\n\n", r.Date)
	fmt.Fprintf(w, "- Machine (bench client%s): %s, %d cores, %s/%s, %s\n", map[bool]string{true: " and servers", false: ""}[r.Spawned],
		r.Machine.CPUModel, r.Machine.Cores, r.Machine.OS, r.Machine.Arch, r.Machine.Go)
	if r.Command != "" {
		fmt.Fprintf(w, "- Command: `%s`\n", r.Command)
	}
	o := r.Options
	by := fmt.Sprintf("%v per level", o.Duration)
	if o.Requests > 0 {
		by = fmt.Sprintf("%d requests per level (cap %v)", o.Requests, o.Duration)
	}
	fmt.Fprintf(w, "- Load: %s after a %v warm-up; modes %s; n=%d; seed %d; stream=%v\n",
		by, o.Warmup, strings.Join(o.Modes, ","), o.N, o.Seed, o.Stream)
	for _, tr := range r.Targets {
		if tr.URL != "" {
			fmt.Fprintf(w, "- Target %s: %s (api %s)\n", tr.Name, tr.URL, tr.API)
		}
	}
	if r.Interrupted != "" {
		fmt.Fprintf(w, "- **Partial report: %s.**\n", r.Interrupted)
	}
	fmt.Fprintln(w)
	r.WriteSeedTable(w)
	fmt.Fprintln(w)
	fmt.Fprintln(w, "QPS counts completed couplets per second; latency is send → last byte, completed requests only; 503 = rejected for load (HTTP 503, or a queue_full/overloaded error event inside a stream); CPU is server CPU-seconds per second.")
	fmt.Fprintln(w)
	r.WriteLevelTable(w)
	var errs []string
	for _, tr := range r.Targets {
		for _, l := range tr.Levels {
			keys := make([]string, 0, len(l.Errors))
			for k := range l.Errors {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				errs = append(errs, fmt.Sprintf("- %s %s: %d × %s", tr.Name, l.Level, l.Errors[k], mdEscape(k)))
			}
		}
	}
	var short []string
	for _, tr := range r.Targets {
		for _, l := range tr.Levels {
			if l.Sent == 0 && !l.Partial {
				short = append(short, fmt.Sprintf("%s %s", tr.Name, l.Level))
			}
		}
	}
	if len(short) > 0 {
		fmt.Fprintf(w, "\nNo request was sent inside the window at %s: every user was still waiting for a warm-up request when it closed. Use a longer --duration, or --requests N.\n", strings.Join(short, ", "))
	}
	for _, tr := range r.Targets {
		if tr.Error != "" {
			fmt.Fprintf(w, "\n%s could not be measured:\n\n```\n%s\n```\n", tr.Name, strings.TrimRight(tr.Error, "\n"))
		}
	}
	var refused []string
	for _, tr := range r.Targets {
		for _, l := range tr.Levels {
			for _, k := range slices.Sorted(maps.Keys(l.RejectedBy)) {
				refused = append(refused, fmt.Sprintf("- %s %s: %d × %s", tr.Name, l.Level, l.RejectedBy[k], mdEscape(k)))
			}
		}
	}
	if len(refused) > 0 {
		fmt.Fprintln(w, "\nTurned away, by the server's reason (its requests_rejected_total over the window):")
		for _, e := range refused {
			fmt.Fprintln(w, e)
		}
	}
	if len(errs) > 0 {
		fmt.Fprintln(w, "\nFailures:")
		for _, e := range errs {
			fmt.Fprintln(w, e)
		}
	}
}

func fmtMS(v float64) string {
	switch {
	case math.IsNaN(v):
		return "—"
	case v >= 10000:
		return fmt.Sprintf("%.1f s", v/1000)
	case v >= 1000:
		return fmt.Sprintf("%.2f s", v/1000)
	case v >= 100:
		return fmt.Sprintf("%.0f ms", v)
	case v >= 10:
		return fmt.Sprintf("%.1f ms", v)
	default:
		return fmt.Sprintf("%.2f ms", v)
	}
}

func fmtRate(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func mdEscape(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

// Summary describes a set of durations in milliseconds. The zero value (N ==
// 0) means "no samples"; every field is then 0 and the report prints "—".
type Summary struct {
	N    int     `json:"n"`
	Mean float64 `json:"mean_ms"`
	Min  float64 `json:"min_ms"`
	P50  float64 `json:"p50_ms"`
	P90  float64 `json:"p90_ms"`
	P99  float64 `json:"p99_ms"`
	Max  float64 `json:"max_ms"`
}

// Summarize computes the summary of ds. It does not modify ds.
func Summarize(ds []time.Duration) Summary {
	if len(ds) == 0 {
		return Summary{}
	}
	ms := make([]float64, len(ds)) // ms[i] = ds[i] in milliseconds, then sorted
	for i, d := range ds {
		ms[i] = float64(d) / float64(time.Millisecond)
	}
	return summarizeMS(ms)
}

// summarizeMS summarises millisecond values; it sorts ms in place.
func summarizeMS(ms []float64) Summary {
	if len(ms) == 0 {
		return Summary{}
	}
	sort.Float64s(ms)
	sum := 0.0
	for _, v := range ms {
		sum += v
	}
	return Summary{
		N:    len(ms),
		Mean: sum / float64(len(ms)),
		Min:  ms[0],
		P50:  stats.Percentile(ms, 50),
		P90:  stats.Percentile(ms, 90),
		P99:  stats.Percentile(ms, 99),
		Max:  ms[len(ms)-1],
	}
}

// Rate returns count/elapsed in events per second, 0 when elapsed ≤ 0.
func Rate(count int, elapsed time.Duration) float64 {
	if elapsed <= 0 {
		return 0
	}
	return float64(count) / elapsed.Seconds()
}

// Bucket is one cumulative histogram bucket, like Prometheus: Count samples
// were ≤ LeMS milliseconds. The last bucket has LeMS = +Inf, written to JSON
// as the string "+Inf" by the Inf flag because JSON has no infinity.
type Bucket struct {
	LeMS  float64 `json:"le_ms"`
	Inf   bool    `json:"inf,omitempty"`
	Count int     `json:"count"`
}

// DefaultBucketsMS are the latency histogram bounds in milliseconds: they cover
// a sub-millisecond GPU step up to a multi-second CPU queue.
var DefaultBucketsMS = []float64{1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000}

// Histogram returns cumulative buckets for ds over the ascending bounds (ms)
// plus a final +Inf bucket holding len(ds). A sample equal to a bound falls in
// that bound's bucket (le = "less or equal").
func Histogram(ds []time.Duration, boundsMS []float64) []Bucket {
	out := make([]Bucket, len(boundsMS)+1) // one per bound, then +Inf
	for i, b := range boundsMS {
		out[i].LeMS = b
	}
	out[len(boundsMS)].Inf = true
	out[len(boundsMS)].LeMS = 0 // JSON cannot carry +Inf; Inf flags it
	for _, d := range ds {
		ms := float64(d) / float64(time.Millisecond)
		// First bound ≥ ms; every later bucket counts it too (cumulative).
		i := sort.SearchFloat64s(boundsMS, ms)
		for j := i; j < len(boundsMS); j++ {
			out[j].Count++
		}
	}
	out[len(boundsMS)].Count = len(ds)
	return out
}
