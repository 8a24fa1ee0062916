// Package engine schedules many generation requests onto one forward.Backend
// with continuous batching over a paged KV cache (package kvcache), in the
// manner of vLLM v1; it also holds the naive one-request-at-a-time baseline.
package engine

import (
	"context"
	"errors"
	"time"

	"chunlian/sampler"
)

// Request is one generation request: a prompt and N samples of it.
type Request struct {
	ID     string
	Prompt []int32
	Params sampler.Params
	// NewProcessor builds the logits processor of sample i (0 ≤ i < N);
	// nil means none. It is called on the engine goroutine; the processors
	// run on the engine's sampling workers: a sequence's processor is
	// called once per step, never concurrently with itself, and the engine
	// goroutine waits for every call of a step before it goes on. Calls for
	// different samples or requests may run at the same time, so a
	// processor shared between them must be safe for concurrent use
	// (read-only state is).
	NewProcessor func(i int) sampler.LogitsProcessor
	// PromptLogProbs asks for the log-probability of every prompt token after
	// the first (like vLLM's prompt_logprobs). With MaxTokens == 0 the request
	// only scores its prompt.
	PromptLogProbs bool
	// OnEvent, if set, is called on the engine goroutine for every generated
	// token and for each sample's end. It must not block.
	OnEvent func(Event)
	// Keep asks an engine that implements Keeper to hold each sample's
	// cache after the request completes (stopped or at MaxTokens) and
	// return a Handle for it in the Completion, so that a later request
	// can continue it (From) without the prefix cache; the caller gives
	// back every handle it does not continue (Keeper.Release). The
	// generated tokens of a kept request are not registered in the
	// prefix cache. Other engines ignore it.
	Keep bool
	// From continues a kept sample: Prompt must begin with that sample's
	// prompt and generated tokens; the kept cache becomes this request's
	// (the handle is used up). An unknown or spent handle, or a prompt
	// that does not extend the sample, falls back to the prefix cache.
	From Handle
	// FollowUp marks a request that continues work its caller already
	// has under way (a couplet's 下联s and 横批 after its 上联s): MaxQueue
	// neither counts nor refuses it. The bound sheds new work; refusing a
	// follow-up would throw away what its first request computed and fail
	// a request the service had accepted. A caller's follow-ups are
	// bounded by the first requests the queue let in.
	FollowUp bool
	// Final marks a request whose samples no later request continues (a
	// couplet's 横批): as for Keep, its generated tokens are not
	// registered in the prefix cache, so their blocks cost no hashing or
	// eviction and are reused first when freed. Its prompt is.
	Final bool
}

// Handle names a sample's cache held by Request.Keep (0: none).
type Handle uint64

// Keeper is implemented by engines that keep samples (Request.Keep).
type Keeper interface {
	// Release frees the caches of kept samples that will not be
	// continued; unknown and spent handles are ignored. It does not block.
	Release(hs ...Handle)
}

// FinishReason says why a sample ended.
type FinishReason string

const (
	FinishStop    FinishReason = "stop"     // emitted a stop token
	FinishLength  FinishReason = "length"   // reached MaxTokens
	FinishDeadEnd FinishReason = "dead_end" // a logits processor allowed no token
	FinishAbort   FinishReason = "abort"    // caller's context ended
)

// Event is one streamed step of one sample.
type Event struct {
	Index  int   // sample index 0..N-1
	Token  int32 // valid when !Done or when Done carries a last token
	Done   bool
	Finish FinishReason // set when Done
}

// Completion is one finished sample.
type Completion struct {
	Index  int
	Tokens []int32
	// LogProbs[i] is log softmax of the model's raw logits (before
	// processors, penalties and temperature) at Tokens[i].
	LogProbs []float32
	Finish   FinishReason
	// Handle is the sample's kept cache (Request.Keep), 0 when not kept.
	Handle Handle
}

// Timings of one request, measured by the engine.
type Timings struct {
	Queue      time.Duration // arrival → first scheduled
	Prefill    time.Duration // first scheduled → prompt fully computed
	FirstToken time.Duration // arrival → first generated token (TTFT)
	Decode     time.Duration // first token → last token
	Total      time.Duration // arrival → finished
}

// Result is a finished request.
type Result struct {
	Completions    []Completion // ordered by Index
	PromptLogProbs []float32    // len(Prompt)-1 entries when asked for
	PromptTokens   int
	CachedTokens   int // prompt tokens served from the prefix cache
	// ComputedTokens counts the token rows the forward pass ran for this
	// request: its prompt tokens not served from the cache, its fed-back
	// tokens (once for samples riding one sequence) and any recomputed
	// after a preemption.
	ComputedTokens int
	Timings        Timings
}

// Stats is a snapshot for metrics and the dashboard.
type Stats struct {
	Running, Waiting            int
	KVBlocksUsed, KVBlocksTotal int
	// KVSlotsLive counts KV slots holding a live token (a shared slot once);
	// KVSlotsAllocated = used blocks × block size, from the same count
	// (under load refreshed every 20 ms, so it may lag KVBlocksUsed, which
	// is exact). Their ratio is the memory-efficiency figure (vLLM: ≥ 96%).
	KVSlotsLive, KVSlotsAllocated int
	PrefixQueries, PrefixHits     int64 // in tokens, like vLLM
	Preemptions                   int64
	PromptTokens, GenTokens       int64
	Steps                         int64
	// ComputedTokens counts the token rows run through the model (prompt
	// tokens not served by the prefix cache, fed-back generated tokens,
	// recomputed ones after preemption): the forward pass's work.
	ComputedTokens int64
	// LogitRows counts the rows the LM head ran for (logits or device
	// draws); of the tokens generated, SampledTokens were drawn by a
	// sampler from their row and JumpTokens appended by jump-forward
	// (forced by the logits processor: scored, not sampled).
	LogitRows, SampledTokens, JumpTokens int64
	// Kept is the number of samples kept for a continuation now
	// (Request.Keep); KeptDropped counts those whose cache was freed
	// before their continuation took it over (more kept than MaxNumSeqs,
	// or blocks short), so that it computes its prompt instead.
	Kept        int
	KeptDropped int64
	// StepSeconds is the engine goroutine's wall time in each phase of its
	// steps, summed: schedule (batch and block tables), forward (the
	// backend's Forward, logits back on the host included) and consume
	// (sampling workers, processors, tokens to callers).
	StepSeconds StepPhases
}

// StepPhases is wall time per phase of an engine step, in seconds.
type StepPhases struct{ Schedule, Forward, Consume float64 }

// Engine is implemented by the paged continuous-batching engine and by the
// naive baseline, so the service and benchmarks can swap them.
type Engine interface {
	// Generate runs req to completion. It returns ErrQueueFull at once when
	// the waiting queue is full (unless req.FollowUp), and ctx.Err() (after
	// freeing the request's blocks at the next step) when ctx ends first.
	Generate(ctx context.Context, req *Request) (*Result, error)
	Stats() Stats
	// Close stops the engine loop; requests still running get ErrClosed.
	Close() error
}

var (
	ErrQueueFull = errors.New("engine: waiting queue is full")
	ErrClosed    = errors.New("engine: closed")
)
