package server

import (
	"context"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"chunlian/buildinfo"
	"chunlian/engine"
)

// Metrics holds the Prometheus metrics. Names follow vLLM's (vllm:… →
// chunlian:…). Engine gauges and counters are read from engine.Stats at
// scrape time (engineCollector); latency histograms are observed per engine
// request by the engine decorator from InstrumentEngine, like vLLM's
// per-request metrics; HTTP metrics are observed by the request-log
// middleware.
type Metrics struct {
	reg *prometheus.Registry

	ttft, tpot, e2e, queue *prometheus.HistogramVec // model_name
	success                *prometheus.CounterVec   // finished_reason, model_name
	httpReqs               *prometheus.CounterVec   // path, code
	httpDur                *prometheus.HistogramVec // path
	rejected               *prometheus.CounterVec   // reason
	panics                 prometheus.Counter

	// modelName labels the engine metrics (vLLM's model_name), set by
	// Attach; "" until a model is attached.
	modelName atomic.Pointer[string]
}

// model is the model_name label value.
func (m *Metrics) model() string {
	if p := m.modelName.Load(); p != nil {
		return *p
	}
	return ""
}

var latencyBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}
var tpotBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5}

func newMetrics(reg *prometheus.Registry, s *Server) *Metrics {
	if reg == nil {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		reg.MustRegister(collectors.NewGoCollector())
	}
	m := &Metrics{reg: reg}
	h := func(name, help string, b []float64) *prometheus.HistogramVec {
		v := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: b}, []string{"model_name"})
		reg.MustRegister(v)
		return v
	}
	m.ttft = h("chunlian:time_to_first_token_seconds", "Engine request arrival to first generated token.", latencyBuckets)
	m.tpot = h("chunlian:time_per_output_token_seconds", "Mean time between generated tokens of an engine request (decode time / (tokens-1)).", tpotBuckets)
	m.e2e = h("chunlian:e2e_request_latency_seconds", "Engine request arrival to finish (one couplet request may issue several engine requests: candidates, retries, banner scoring).", latencyBuckets)
	m.queue = h("chunlian:request_queue_time_seconds", "Engine request time in the waiting queue.", latencyBuckets)
	m.success = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "chunlian:request_success_total", Help: "Finished engine samples by finish reason (stop, length, dead_end, abort)."}, []string{"finished_reason", "model_name"})
	m.httpReqs = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "chunlian:http_requests_total", Help: "HTTP requests by route and status code."}, []string{"path", "code"})
	m.httpDur = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "chunlian:http_request_duration_seconds", Help: "HTTP request duration by route (what clients see).", Buckets: latencyBuckets}, []string{"path"})
	m.rejected = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "chunlian:requests_rejected_total", Help: "Generation requests rejected before running, by reason (overloaded, queue_full, not_ready, shutting_down)."}, []string{"reason"})
	m.panics = prometheus.NewCounter(prometheus.CounterOpts{Name: "chunlian:handler_panics_total", Help: "Recovered handler panics."})
	for _, reason := range []string{codeOverloaded, codeQueueFull, codeNotReady, codeShuttingDown} {
		m.rejected.WithLabelValues(reason) // exported as 0 from the start, so rate() and alerts see the series
	}
	reg.MustRegister(m.success, m.httpReqs, m.httpDur, m.rejected, m.panics, &engineCollector{s: s})
	gauge := func(name, help string, f func(admissionState) float64) {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 { return f(s.adm.state()) }))
	}
	gauge("chunlian:admission_budget", "Admission's current budget, in default requests (one couplet of 7 characters, default samples).", func(a admissionState) float64 { return a.Budget })
	gauge("chunlian:admission_in_flight", "Cost of the admitted, unfinished requests, in default requests.", func(a admissionState) float64 { return a.InFlight })
	gauge("chunlian:admission_queued", "Cost of the requests waiting for admission, in default requests.", func(a admissionState) float64 { return a.Queued })
	gauge("chunlian:admission_queue_length", "Requests waiting for admission.", func(a admissionState) float64 { return float64(a.QueueLen) })
	gauge("chunlian:admission_overloaded", "1 while admission's overload detector holds (requests that do not fit are refused at once), else 0.", func(a admissionState) float64 {
		if a.Overloaded {
			return 1
		}
		return 0
	})
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "chunlian_build_info",
		Help:        "Always 1; the labels say which build serves (version, revision, goversion, build_date, platform).",
		ConstLabels: buildinfo.Read().Labels()}, func() float64 { return 1 }))
	return m
}

// Handler serves /metrics.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

func (m *Metrics) observeHTTP(path string, status int, d time.Duration) {
	m.httpReqs.WithLabelValues(path, strconv.Itoa(status)).Inc()
	if path != "static" && path != "other" {
		m.httpDur.WithLabelValues(path).Observe(d.Seconds())
	}
}

// engineCollector reads engine.Stats (and the GPU hook) at scrape time, so
// the engine keeps a single source of truth and no goroutine polls it.
type engineCollector struct{ s *Server }

var (
	descRunning   = prometheus.NewDesc("chunlian:num_requests_running", "Sequences in the running batch.", []string{"model_name"}, nil)
	descWaiting   = prometheus.NewDesc("chunlian:num_requests_waiting", "Requests waiting to be scheduled.", []string{"model_name"}, nil)
	descKVUsage   = prometheus.NewDesc("chunlian:kv_cache_usage_perc", "KV cache usage, 0..1 (used blocks / total blocks).", []string{"model_name"}, nil)
	descKVBlocks  = prometheus.NewDesc("chunlian:kv_cache_blocks", "KV cache blocks by state.", []string{"state", "model_name"}, nil)
	descKVLive    = prometheus.NewDesc("chunlian:kv_cache_live_slots_perc", "Share of the allocated KV slots (used blocks × block size) that hold a live token, 0..1 (a shared slot counted once; 0 when none is allocated). PagedAttention's memory-efficiency figure.", []string{"model_name"}, nil)
	descPrefixQ   = prometheus.NewDesc("chunlian:prefix_cache_queries_total", "Prefix cache queries, in tokens.", []string{"model_name"}, nil)
	descPrefixH   = prometheus.NewDesc("chunlian:prefix_cache_hits_total", "Prefix cache hits, in tokens.", []string{"model_name"}, nil)
	descPreempt   = prometheus.NewDesc("chunlian:num_preemptions_total", "Sequences preempted (recompute) for lack of KV blocks.", []string{"model_name"}, nil)
	descPromptTok = prometheus.NewDesc("chunlian:prompt_tokens_total", "Prompt tokens processed.", []string{"model_name"}, nil)
	descGenTok    = prometheus.NewDesc("chunlian:generation_tokens_total", "Tokens generated.", []string{"model_name"}, nil)
	descSteps     = prometheus.NewDesc("chunlian:engine_steps_total", "Engine steps (forward passes).", []string{"model_name"}, nil)
	descComputed  = prometheus.NewDesc("chunlian:engine_computed_tokens_total", "Token rows run through the model (prompt tokens not served by the prefix cache, fed-back and recomputed tokens).", []string{"model_name"}, nil)
	descLogitRows = prometheus.NewDesc("chunlian:engine_logit_rows_total", "Rows the LM head ran for (logits or device draws): sampled rows and rows that only score a known token.", []string{"model_name"}, nil)
	descSampled   = prometheus.NewDesc("chunlian:engine_sampled_tokens_total", "Tokens drawn by a sampler from their row.", []string{"model_name"}, nil)
	descJumped    = prometheus.NewDesc("chunlian:engine_jump_tokens_total", "Tokens the logits processor forced, appended by jump-forward without a step of their own (scored, not sampled).", []string{"model_name"}, nil)
	descKept      = prometheus.NewDesc("chunlian:kept_samples", "Samples whose cache is kept for a continuation (kept samples; 0 where the couplet rules continue through the prefix cache).", []string{"model_name"}, nil)
	descKeptDrop  = prometheus.NewDesc("chunlian:kept_samples_dropped_total", "Kept samples whose cache was freed before their continuation took it over (more kept than --max-num-seqs, or KV blocks short): the continuation computes its prompt instead.", []string{"model_name"}, nil)
	descStepSec   = prometheus.NewDesc("chunlian:engine_step_seconds_total", "Engine goroutine wall time by step phase: schedule, forward (logits on the host included), consume (sampling, rules, delivery).", []string{"phase", "model_name"}, nil)
	descReady     = prometheus.NewDesc("chunlian:ready", "1 when the model is loaded and warmed up and the server is not draining.", nil, nil)
	descGPUUtil   = prometheus.NewDesc("chunlian:gpu_utilization_perc", "GPU utilisation, 0..100 (only on a GPU backend).", []string{"model_name"}, nil)
	descGPUMem    = prometheus.NewDesc("chunlian:gpu_memory_used_bytes", "GPU memory used (only on a GPU backend).", []string{"model_name"}, nil)
	descGPUMemTot = prometheus.NewDesc("chunlian:gpu_memory_total_bytes", "GPU memory total (only on a GPU backend).", []string{"model_name"}, nil)
)

func (c *engineCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRunning, descWaiting, descKVUsage, descKVBlocks, descKVLive, descPrefixQ, descPrefixH,
		descPreempt, descPromptTok, descGenTok, descSteps, descComputed, descLogitRows, descSampled, descJumped, descKept, descKeptDrop, descStepSec, descReady, descGPUUtil, descGPUMem, descGPUMemTot} {
		ch <- d
	}
}

func (c *engineCollector) Collect(ch chan<- prometheus.Metric) {
	var st engine.Stats
	b := c.s.backend.Load()
	if b != nil && b.Stats != nil {
		st = b.Stats()
	}
	model := c.s.metrics.model()
	g := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append(l, model)...)
	}
	cn := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, model)
	}
	g(descRunning, float64(st.Running))
	g(descWaiting, float64(st.Waiting))
	usage := 0.0
	if st.KVBlocksTotal > 0 {
		usage = float64(st.KVBlocksUsed) / float64(st.KVBlocksTotal)
	}
	g(descKVUsage, usage)
	g(descKVBlocks, float64(st.KVBlocksUsed), "used")
	g(descKVBlocks, float64(st.KVBlocksTotal-st.KVBlocksUsed), "free")
	live := 0.0
	if st.KVSlotsAllocated > 0 {
		live = float64(st.KVSlotsLive) / float64(st.KVSlotsAllocated)
	}
	g(descKVLive, live)
	cn(descPrefixQ, float64(st.PrefixQueries))
	cn(descPrefixH, float64(st.PrefixHits))
	cn(descPreempt, float64(st.Preemptions))
	cn(descPromptTok, float64(st.PromptTokens))
	cn(descGenTok, float64(st.GenTokens))
	cn(descSteps, float64(st.Steps))
	cn(descComputed, float64(st.ComputedTokens))
	cn(descLogitRows, float64(st.LogitRows))
	cn(descSampled, float64(st.SampledTokens))
	g(descKept, float64(st.Kept))
	cn(descKeptDrop, float64(st.KeptDropped))
	cn(descJumped, float64(st.JumpTokens))
	for _, ph := range []struct {
		name string
		v    float64
	}{{"schedule", st.StepSeconds.Schedule}, {"forward", st.StepSeconds.Forward}, {"consume", st.StepSeconds.Consume}} {
		ch <- prometheus.MustNewConstMetric(descStepSec, prometheus.CounterValue, ph.v, ph.name, model)
	}
	ready := 0.0
	if c.s.Ready() {
		ready = 1
	}
	ch <- prometheus.MustNewConstMetric(descReady, prometheus.GaugeValue, ready)
	if b != nil && b.GPU != nil {
		if gs, ok := b.GPU(); ok {
			g(descGPUUtil, gs.UtilizationPerc)
			g(descGPUMem, float64(gs.MemoryUsedBytes))
			g(descGPUMemTot, float64(gs.MemoryTotalBytes))
		}
	}
}

// usage accumulates the engine work of one HTTP request (all its engine
// requests). The engine decorator adds to it from the handler's goroutine
// tree, so fields are atomic.
type usage struct {
	prompt, completion atomic.Int64
	engineRequests     atomic.Int64
}

func withUsage(ctx context.Context, u *usage) context.Context {
	return context.WithValue(ctx, keyUsage, u)
}

// InstrumentEngine decorates e so that every engine request is observed in
// the histograms and success counters, and its token counts are added to the
// calling HTTP request's usage (found in ctx).
// The decorator keeps e's engine.Keeper: the couplet generator keeps
// samples only through an engine that says it can.
func (m *Metrics) InstrumentEngine(e engine.Engine) engine.Engine {
	ie := &instrumentedEngine{Engine: e, m: m}
	if k, ok := e.(engine.Keeper); ok {
		return &instrumentedKeeper{ie, k}
	}
	return ie
}

// instrumentedKeeper is instrumentedEngine over an engine.Keeper.
type instrumentedKeeper struct {
	*instrumentedEngine
	k engine.Keeper
}

var _ engine.Keeper = (*instrumentedKeeper)(nil)

func (ik *instrumentedKeeper) Release(hs ...engine.Handle) { ik.k.Release(hs...) }

type instrumentedEngine struct {
	engine.Engine
	m *Metrics
}

func (ie *instrumentedEngine) Generate(ctx context.Context, req *engine.Request) (*engine.Result, error) {
	res, err := ie.Engine.Generate(ctx, req)
	u, _ := ctx.Value(keyUsage).(*usage)
	if err != nil {
		if ctx.Err() != nil {
			n := req.Params.N
			if n < 1 {
				n = 1
			}
			ie.m.success.WithLabelValues(string(engine.FinishAbort), ie.m.model()).Add(float64(n))
		}
		return res, err
	}
	gen, longest := 0, 0
	for _, c := range res.Completions {
		ie.m.success.WithLabelValues(string(c.Finish), ie.m.model()).Inc()
		gen += len(c.Tokens)
		longest = max(longest, len(c.Tokens))
	}
	t := res.Timings
	model := ie.m.model()
	ie.m.e2e.WithLabelValues(model).Observe(t.Total.Seconds())
	ie.m.queue.WithLabelValues(model).Observe(t.Queue.Seconds())
	if longest > 0 { // score-only requests (MaxTokens 0) have no first token
		ie.m.ttft.WithLabelValues(model).Observe(t.FirstToken.Seconds())
		if longest > 1 {
			ie.m.tpot.WithLabelValues(model).Observe(t.Decode.Seconds() / float64(longest-1))
		}
	}
	if u != nil {
		u.prompt.Add(int64(res.PromptTokens))
		u.completion.Add(int64(gen))
		u.engineRequests.Add(1)
	}
	return res, nil
}
