package server

import (
	"context"
	"net/http"
	"slices"
	"sync"
	"time"

	"chunlian/stats"
)

// Rolling per-second statistics for the dashboard (GET /api/stats), computed
// server-side so the page needs no PromQL.
//
// Memory is bounded: a ring of statsRing one-second buckets, each keeping at
// most maxLatSamples latencies (reservoir sampling beyond that), so the cost
// does not grow with QPS.

const (
	statsRing     = 120 // seconds kept in the ring
	statsWindow   = 60  // seconds returned as series
	pctWindow     = 5   // trailing seconds pooled for each series percentile point
	maxLatSamples = 1024
)

// gaugeSample is one reading of the engine (and GPU) gauges.
type gaugeSample struct {
	valid                   bool
	running, waiting        int
	kv                      float64 // 0..1
	genTokens, promptTokens int64   // cumulative
	prefixQ, prefixH        int64   // cumulative, tokens
	gpu                     GPUStats
	gpuOK                   bool
}

// secBucket is one second of the ring; sec says which unix second it holds
// (a bucket whose sec is not the asked one is stale and gets reset).
type secBucket struct {
	sec                  int64
	ok, failed, rejected int
	lat                  []float64 // ms of successful requests; len ≤ maxLatSamples
	offered              int       // successful latencies offered (reservoir denominator)
	g                    gaugeSample
}

// rollingStats is shared by all handler goroutines and the ticker; mu guards
// everything in it.
type rollingStats struct {
	mu                   sync.Mutex
	ring                 [statsRing]secBucket
	totalOK, totalFailed int64
	totalRejected        int64
	totalClientErr       int64  // 4xx: the client's fault, not the service's
	rng                  uint64 // xorshift state for reservoir sampling
	lastG                gaugeSample
}

func newRollingStats() *rollingStats { return &rollingStats{rng: 0x9e3779b97f4a7c15} }

// slot returns the bucket for unix second sec, resetting a stale one.
// Caller holds mu.
func (r *rollingStats) slot(sec int64) *secBucket {
	b := &r.ring[((sec%statsRing)+statsRing)%statsRing]
	if b.sec != sec {
		lat := b.lat[:0]
		*b = secBucket{sec: sec, lat: lat}
	}
	return b
}

// peek returns the bucket for sec only if it holds that second. Caller holds mu.
func (r *rollingStats) peek(sec int64) *secBucket {
	b := &r.ring[((sec%statsRing)+statsRing)%statsRing]
	if b.sec != sec {
		return nil
	}
	return b
}

func (r *rollingStats) rand() uint64 {
	r.rng ^= r.rng << 13
	r.rng ^= r.rng >> 7
	r.rng ^= r.rng << 17
	return r.rng
}

// record counts one finished generation request: status 2xx = ok (its
// latency kept), 503 = rejected, 4xx = a client error (bad input, a client
// that went away: not a failure of the service), anything else = failed.
func (r *rollingStats) record(now time.Time, lat time.Duration, status int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.slot(now.Unix())
	switch {
	case status >= 200 && status < 300:
		b.ok++
		r.totalOK++
		ms := float64(lat.Nanoseconds()) / 1e6
		b.offered++
		if len(b.lat) < maxLatSamples {
			b.lat = append(b.lat, ms)
		} else if j := r.rand() % uint64(b.offered); j < maxLatSamples {
			b.lat[j] = ms
		}
	case status == http.StatusServiceUnavailable:
		b.rejected++
		r.totalRejected++
	case status >= 400 && status < 500:
		r.totalClientErr++
	default:
		b.failed++
		r.totalFailed++
	}
}

// sample stores the gauges for the second of now (last write wins).
func (r *rollingStats) sample(now time.Time, g gaugeSample) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.slot(now.Unix()).g = g
	r.lastG = g
}

// run calls sampleFn once a second until ctx ends.
func (r *rollingStats) run(ctx context.Context, sampleFn func(time.Time)) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			sampleFn(now)
		}
	}
}

// statsSeries is columnar (one slice per series, index = point) so the
// dashboard can hand it to uPlot as is. nil entries mean "no data".
type statsSeries struct {
	T            []int64    `json:"t"` // unix seconds
	QPS          []float64  `json:"qps"`
	Errors       []float64  `json:"errors"` // failed + rejected per second
	P50          []*float64 `json:"p50_ms"` // over the trailing pctWindow seconds
	P90          []*float64 `json:"p90_ms"`
	P99          []*float64 `json:"p99_ms"`
	Running      []*float64 `json:"running"`
	Waiting      []*float64 `json:"waiting"`
	KVUsagePerc  []*float64 `json:"kv_cache_usage_perc"` // 0..100
	TokensPerSec []*float64 `json:"tokens_per_s"`
	GPUUtilPerc  []*float64 `json:"gpu_util_perc"`
	GPUMemPerc   []*float64 `json:"gpu_mem_perc"`
}

type latencySummary struct {
	Count int      `json:"count"`
	P50   *float64 `json:"p50_ms"`
	P90   *float64 `json:"p90_ms"`
	P99   *float64 `json:"p99_ms"`
	Max   *float64 `json:"max_ms"`
}

type statsSummary struct {
	QPS10s            float64        `json:"qps_10s"` // successful requests/s over the last 10 complete seconds
	Latency60s        latencySummary `json:"latency_60s"`
	Running           int            `json:"running"`
	Waiting           int            `json:"waiting"`
	KVUsagePerc       float64        `json:"kv_cache_usage_perc"`
	PrefixHitRate     *float64       `json:"prefix_cache_hit_rate"` // hits/queries since start, nil before any query
	PromptTokens      int64          `json:"prompt_tokens_total"`
	GenerationTokens  int64          `json:"generation_tokens_total"`
	RequestsOK        int64          `json:"requests_ok_total"`
	RequestsFailed    int64          `json:"requests_failed_total"`
	RequestsRejected  int64          `json:"requests_rejected_total"`
	RequestsClientErr int64          `json:"requests_client_error_total"` // 4xx, not counted as failed
	GPU               *GPUStats      `json:"gpu"`                         // nil without a GPU
}

type statsSnapshot struct {
	Now     int64        `json:"now"`
	Ready   bool         `json:"ready"`
	Model   string       `json:"model"`
	Engine  string       `json:"engine"`
	UptimeS float64      `json:"uptime_s"`
	Window  int          `json:"window_s"`
	Summary statsSummary `json:"summary"`
	Series  statsSeries  `json:"series"`
}

func fp(v float64) *float64 { return &v }

// snapshot builds the series for the statsWindow complete seconds before
// now and the summary.
func (r *rollingStats) snapshot(now time.Time) (statsSummary, statsSeries) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var sum statsSummary
	var ser statsSeries
	cur := now.Unix()
	first := cur - statsWindow // series covers [first, cur-1]
	var prevG *gaugeSample
	var prevSec int64
	if b := r.peek(first - 1); b != nil && b.g.valid {
		prevG, prevSec = &b.g, first-1
	}
	var pool []float64
	for sec := first; sec < cur; sec++ {
		b := r.peek(sec)
		ser.T = append(ser.T, sec)
		if b == nil {
			b = &secBucket{}
		}
		ser.QPS = append(ser.QPS, float64(b.ok))
		ser.Errors = append(ser.Errors, float64(b.failed+b.rejected))
		pool = pool[:0]
		for k := sec - pctWindow + 1; k <= sec; k++ {
			if pb := r.peek(k); pb != nil {
				pool = append(pool, pb.lat...)
			}
		}
		if len(pool) > 0 {
			slices.Sort(pool)
			ser.P50 = append(ser.P50, fp(stats.Percentile(pool, 50)))
			ser.P90 = append(ser.P90, fp(stats.Percentile(pool, 90)))
			ser.P99 = append(ser.P99, fp(stats.Percentile(pool, 99)))
		} else {
			ser.P50, ser.P90, ser.P99 = append(ser.P50, nil), append(ser.P90, nil), append(ser.P99, nil)
		}
		if b.g.valid {
			g := b.g
			ser.Running = append(ser.Running, fp(float64(g.running)))
			ser.Waiting = append(ser.Waiting, fp(float64(g.waiting)))
			ser.KVUsagePerc = append(ser.KVUsagePerc, fp(100*g.kv))
			if prevG != nil && sec > prevSec {
				ser.TokensPerSec = append(ser.TokensPerSec, fp(float64(g.genTokens-prevG.genTokens)/float64(sec-prevSec)))
			} else {
				ser.TokensPerSec = append(ser.TokensPerSec, nil)
			}
			prevG, prevSec = &b.g, sec
		} else {
			ser.Running, ser.Waiting = append(ser.Running, nil), append(ser.Waiting, nil)
			ser.KVUsagePerc, ser.TokensPerSec = append(ser.KVUsagePerc, nil), append(ser.TokensPerSec, nil)
		}
		if b.g.gpuOK {
			ser.GPUUtilPerc = append(ser.GPUUtilPerc, fp(b.g.gpu.UtilizationPerc))
			memPerc := 0.0
			if b.g.gpu.MemoryTotalBytes > 0 {
				memPerc = 100 * float64(b.g.gpu.MemoryUsedBytes) / float64(b.g.gpu.MemoryTotalBytes)
			}
			ser.GPUMemPerc = append(ser.GPUMemPerc, fp(memPerc))
		} else {
			ser.GPUUtilPerc, ser.GPUMemPerc = append(ser.GPUUtilPerc, nil), append(ser.GPUMemPerc, nil)
		}
	}
	ok10 := 0
	for sec := cur - 10; sec < cur; sec++ {
		if b := r.peek(sec); b != nil {
			ok10 += b.ok
		}
	}
	sum.QPS10s = float64(ok10) / 10
	var all []float64
	for sec := first; sec <= cur; sec++ {
		if b := r.peek(sec); b != nil {
			all = append(all, b.lat...)
		}
	}
	sum.Latency60s.Count = len(all)
	if len(all) > 0 {
		slices.Sort(all)
		sum.Latency60s.P50 = fp(stats.Percentile(all, 50))
		sum.Latency60s.P90 = fp(stats.Percentile(all, 90))
		sum.Latency60s.P99 = fp(stats.Percentile(all, 99))
		sum.Latency60s.Max = fp(all[len(all)-1])
	}
	g := r.lastG
	sum.Running, sum.Waiting, sum.KVUsagePerc = g.running, g.waiting, 100*g.kv
	if g.prefixQ > 0 {
		sum.PrefixHitRate = fp(float64(g.prefixH) / float64(g.prefixQ))
	}
	sum.PromptTokens, sum.GenerationTokens = g.promptTokens, g.genTokens
	sum.RequestsOK, sum.RequestsFailed, sum.RequestsRejected = r.totalOK, r.totalFailed, r.totalRejected
	sum.RequestsClientErr = r.totalClientErr
	if g.gpuOK {
		gs := g.gpu
		sum.GPU = &gs
	}
	return sum, ser
}

// handleStats serves GET /api/stats.
func (s *Server) handleStats(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	s.sampleGauges(now)
	sum, ser := s.stats.snapshot(now)
	snap := statsSnapshot{
		Now: now.Unix(), Ready: s.Ready(), UptimeS: time.Since(s.started).Seconds(),
		Window: statsWindow, Summary: sum, Series: ser,
	}
	if b := s.backend.Load(); b != nil {
		snap.Model, snap.Engine = b.ModelName, b.EngineName
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, snap)
}
