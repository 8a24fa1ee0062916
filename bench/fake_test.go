package bench

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// fakeService mimics the chunlian HTTP contract the bench relies on:
// POST /generate, POST /v1/completions (SSE when "stream"), GET /metrics,
// GET /ready. It answers by a fixed cycle over its request sequence number k
// (0, 1, 2, …): k%5 == 3 → 503 (queue full), k%5 == 4 → 500 with an error
// body, otherwise a couplet. Counters are atomics (handlers run concurrently).
type fakeService struct {
	ok, rejected, failed atomic.Int64
	seq                  atomic.Int64
	badPrompts           atomic.Int64 // prompts not from the bench's built-in lists
	noErrors             bool         // answer every request with a couplet
	fast                 bool         // no simulated work (client benchmarks)
	// arrived, when set, receives one value per request (non-blocking).
	arrived chan struct{}
	// block makes /generate wait for the client to go away (interrupt test).
	block bool

	mu    sync.Mutex
	modes map[string]int // mode → requests seen
}

// The fake couplet: 4 + 4 + 2 = 10 Han characters of output.
var fakeCouplet = map[string]any{"upper": "春回大地", "lower": "福满人间", "banner": "吉祥", "score": -1.5}

const fakeCoupletHan = 10
const fakeRSS = 2e8       // process_resident_memory_bytes in the fake's /metrics
const fakeUsageTokens = 9 // what /v1/completions reports as completion_tokens

// fakeServerMS is the latency_ms every /generate answer reports (the
// server's own time; /v1/completions reports none, as OpenAI's API has
// no such field).
const fakeServerMS = 2.5

func (f *fakeService) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ready", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(200) })
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		// CPU grows with work done so the delta is > 0 after some requests.
		fmt.Fprintf(w, "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total %g\n", 0.001*float64(f.ok.Load()))
		fmt.Fprintf(w, "chunlian:gpu_utilization_perc{gpu=\"0\"} 50\nchunlian:gpu_memory_used_bytes{gpu=\"0\"} 1.5e9\n")
		fmt.Fprintf(w, "process_resident_memory_bytes %g\nchunlian:kv_cache_live_slots_perc{model_name=\"m\"} 0.96\n", fakeRSS)
		fmt.Fprintf(w, "chunlian:requests_rejected_total{reason=\"queue_full\"} %d\nchunlian:requests_rejected_total{reason=\"connections\"} 0\n", f.rejected.Load())
		// Engine counters as chunlian's: per completed request 2 steps,
		// 30 rows, 1 + 2 ms of host phases and 4 ms of forward pass.
		n := float64(f.ok.Load())
		fmt.Fprintf(w, "chunlian:engine_steps_total{model_name=\"m\"} %g\nchunlian:engine_computed_tokens_total{model_name=\"m\"} %g\n", 2*n, 30*n)
		for _, p := range []struct {
			phase string
			sec   float64
		}{{"schedule", 0.001}, {"forward", 0.004}, {"consume", 0.002}} {
			fmt.Fprintf(w, "chunlian:engine_step_seconds_total{phase=%q,model_name=\"m\"} %g\n", p.phase, p.sec*n)
		}
	})
	mux.HandleFunc("POST /generate", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Prompt string `json:"prompt"`
			Mode   string `json:"mode"`
			N      int    `json:"n"`
			Seed   uint64 `json:"seed"`
			Stream bool   `json:"stream"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			f.failed.Add(1)
			http.Error(w, `{"error":{"code":"bad_json","message":"bad"}}`, 400)
			return
		}
		f.note(req.Mode, req.Prompt)
		if f.arrived != nil {
			select {
			case f.arrived <- struct{}{}:
			default:
			}
		}
		if f.block {
			<-r.Context().Done()
			return
		}
		if !f.respondStatus(w, false) {
			return
		}
		if req.Stream {
			// chunlian's format: named SSE events start, token…, result.
			w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
			writeSSEEvent(w, "start", map[string]any{"request_id": "fake", "prompt": req.Prompt, "mode": req.Mode})
			for _, ch := range []string{"春", "回", "大", "地"} {
				writeSSEEvent(w, "token", map[string]any{"attempt": 0, "sample": 0, "part": "upper", "text": ch})
			}
			writeSSEEvent(w, "result", map[string]any{"generated_text": "上联：春回大地\n下联：福满人间\n横批：吉祥", "couplets": []any{fakeCouplet}, "latency_ms": fakeServerMS})
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{
			"generated_text": "上联：春回大地\n下联：福满人间\n横批：吉祥",
			"prompt":         req.Prompt,
			"couplets":       []any{fakeCouplet},
			"latency_ms":     fakeServerMS,
		})
	})
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Prompt string `json:"prompt"`
			Stream bool   `json:"stream"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			f.failed.Add(1)
			http.Error(w, `{"error":{"code":"bad_json","message":"bad"}}`, 400)
			return
		}
		f.note("keyword", req.Prompt)
		if !f.respondStatus(w, req.Stream) {
			return
		}
		usage := map[string]any{"prompt_tokens": 2, "completion_tokens": fakeUsageTokens, "total_tokens": 2 + fakeUsageTokens}
		if req.Stream {
			w.Header().Set("Content-Type", "text/event-stream")
			for _, ch := range []string{"春回", "大地"} {
				writeSSE(w, map[string]any{"object": "text_completion", "choices": []any{map[string]any{"index": 0, "text": ch}}})
			}
			writeSSE(w, map[string]any{"choices": []any{}, "usage": usage})
			fmt.Fprint(w, "data: [DONE]\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"choices": []any{map[string]any{"index": 0, "text": "春回大地"}}, "usage": usage})
	})
	return mux
}

// respondStatus applies the 503/500 cycle; it returns true when the handler
// should go on to answer with a couplet. With sseOverload the queue-full slot
// is reported the way chunlian's OpenAI stream does once headers are out: a
// 200 stream whose only chunk is {"error":{"code":"queue_full"}}.
func (f *fakeService) respondStatus(w http.ResponseWriter, sseOverload bool) bool {
	k := f.seq.Add(1) - 1
	if !f.noErrors {
		switch k % 5 {
		case 3:
			if sseOverload {
				f.rejected.Add(1)
				w.Header().Set("Content-Type", "text/event-stream")
				writeSSE(w, map[string]any{"error": map[string]any{"code": "queue_full", "message": "busy"}})
				fmt.Fprint(w, "data: [DONE]\n\n")
				return false
			}
			f.rejected.Add(1)
			w.Header().Set("Retry-After", "0")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, `{"error":{"code":"queue_full","message":"busy"}}`)
			return false
		case 4:
			f.failed.Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprint(w, `{"error":{"code":"internal","message":"boom"}}`)
			return false
		}
	}
	// A little work so requests do not spin the test's CPU flat out.
	if !f.fast {
		time.Sleep(time.Millisecond)
	}
	f.ok.Add(1)
	return true
}

func (f *fakeService) note(mode, prompt string) {
	if !slices.Contains(BlessingWords, prompt) && !slices.Contains(UpperLines, prompt) {
		f.badPrompts.Add(1)
	}
	f.mu.Lock()
	if f.modes == nil {
		f.modes = map[string]int{}
	}
	f.modes[mode]++
	f.mu.Unlock()
}

func writeSSEEvent(w http.ResponseWriter, event string, v any) {
	fmt.Fprintf(w, "event: %s\n", event)
	writeSSE(w, v)
}

func writeSSE(w http.ResponseWriter, v any) {
	b, _ := json.Marshal(v)
	fmt.Fprintf(w, "data: %s\n\n", b)
	if fl, ok := w.(http.Flusher); ok {
		fl.Flush()
	}
}
