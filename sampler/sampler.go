// Package sampler turns a row of logits into the next token, per request:
// temperature (0 = greedy), top-k, top-p, min-p, repetition penalty, and a
// per-request seed so that the same seed and prompt give the same output.
//
// Every per-vocabulary loop of a Sample call runs on the vectorised
// kernels of chunlian/kernels/cpu (AVX2/FMA assembly on amd64, plain Go
// elsewhere or with CHUNLIAN_GEMM=go): the max scan (cpu.ScanMax), the
// gathering of the candidates (logit above max + negligible·T) with their
// logits (cpu.CompactGreaterVals), their temperature-scaled exponentials
// and total (cpu.ExpSum: draw works on exp(w/T − m/T) of the candidates
// only, the softmax times its sum, never normalised) and the log-sum-exp
// (m + log cpu.ExpSum over the row). top-k/top-p first gather the
// candidates above pmax·2^-6 or 2^-14 (presort) and sort only those when
// they suffice. A couplet row (V = 6294, T 0.8, top-p 0.95, processor,
// LSE known) went from ~62 µs to ~4 µs of CPU (BenchmarkSampleRow). The same
// seed gives the same tokens on one kernel set; between sets (or versus
// the scalar code before) draws may differ where float rounding moves a
// boundary.
package sampler

import "errors"

// Params are the sampling parameters of one request.
type Params struct {
	Temperature       float32 // 0 = greedy
	TopK              int     // 0 = off
	TopP              float32 // 1 = off
	MinP              float32 // 0 = off
	RepetitionPenalty float32 // 1 = off
	MaxTokens         int
	StopTokens        []int32 // generation ends after emitting one of these
	Seed              uint64  // 0 = random
	N                 int     // number of parallel samples sharing the prompt (≥1)
}

// LogitsProcessor is the per-sequence hook run on each step's logits before
// sampling. generated holds the tokens this sequence has produced so far
// (not the prompt). It may set entries of logits to -Inf to forbid tokens.
// Returning ErrDeadEnd (or an error wrapping it) ends the sequence with
// finish reason "dead_end" instead of sampling; the caller may then retry.
type LogitsProcessor interface {
	Process(generated []int32, logits []float32) error
}

// LogitsProcessorFunc adapts a function to LogitsProcessor.
type LogitsProcessorFunc func(generated []int32, logits []float32) error

func (f LogitsProcessorFunc) Process(g []int32, l []float32) error { return f(g, l) }

// ErrDeadEnd reports that a processor left no token allowed.
var ErrDeadEnd = errors.New("sampler: no allowed token (dead end)")
