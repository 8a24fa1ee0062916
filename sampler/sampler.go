// Package sampler turns a row of logits into the next token, per request:
// temperature (0 = greedy), top-k, top-p, min-p, repetition penalty, and a
// per-request seed so that the same seed and prompt give the same output.
//
// Every per-vocabulary loop of a Sample call runs on the vectorised
// kernels of chunlian/kernels/cpu (AVX2/FMA assembly on amd64, plain Go
// elsewhere or after cpu.SetGEMMPath("go")): the max scan (cpu.ScanMax), the
// gathering of the candidates (logit above max + negligible·T) with their
// logits (cpu.CompactGreaterVals), their temperature-scaled exponentials
// and total (cpu.ExpSum: draw works on exp(w/T − m/T) of the candidates
// only, the softmax times its sum, never normalised) and the log-sum-exp
// (m + log cpu.ExpSum over the row). top-k/top-p first gather the
// candidates above pmax·2^-6 or 2^-14 (presort) and sort only those when
// they suffice; otherwise (flat rows: a line's first character, a 横批
// the model writes itself, whose nucleus is thousands of tokens) the
// candidates are bucketed by probability (packed (probability bits, id)
// keys, ~n/4 buckets of equal width in bit space) with each bucket's
// mass. For top-p or top-k alone, where every probability down to the
// cut bucket is ≥ 2^E and the total < 2^(E+29), every float64 sum of them
// is exact in any order, so the draw (drawBucketed) sorts only the cut
// bucket and the bucket its random number falls in; otherwise (min-p,
// both top-k and top-p, tiny probabilities in the nucleus) the buckets
// down to the cut are sorted (sortPrefix). Either way the kept set, its
// walk order (probability descending, ties by lower id), the totals and
// so the seeded tokens are exactly those of a full sort
// (TestKeptMatchesFullSort, TestDrawMatchesFullSort), at a fraction of
// a full sort's cost on flat rows, whose nucleus holds thousands of
// tokens (BenchmarkSampleRow; docs/DECISIONS.md, "top-p without a full
// sort"). The same
// seed gives the same tokens on one kernel set; between sets (or versus
// the scalar code before) draws may differ where float rounding moves a
// boundary.
//
// A processor that also implements Forcer can say, before the row is
// touched, that a step allows exactly one token (a couplet's template
// punctuation, <sep>, a forced 横批 candidate): the Sampler then returns
// that token with its raw log-prob without copying, processing or
// scanning the row (only the log-sum-exp remains when it is not given),
// with bit-identical results and random stream. Most of a couplet's rows
// are forced, so this path matters (BenchmarkSampleRow forced/lse vs
// forced/lse/full).
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

// Forcer is an optional interface of a LogitsProcessor that can tell,
// before the row is copied or edited, that a step allows exactly one token.
// Forced returns (tok, true) only where Process would behave exactly like
// "force tok": return ErrDeadEnd (and change nothing else) if tok is
// outside the row or its entry is -Inf or NaN, else set every other entry
// to -Inf and leave row[tok] as it is. Otherwise it returns ok = false and
// the Sampler runs Process as usual. logits is the step's raw row, shared
// with other samples: Forced must not modify it (NaN entries are what
// Process would see as -Inf). Forced may have the side effects Process
// would have on its first call (state derived from the row); they must not
// depend on which of the two is called.
//
// On ok the Sampler skips the copy, the processor and every pass over the
// row (only the log-sum-exp remains, when it is not given) and returns
// what the full path returns for that row, bit for bit: tok, its raw
// log-prob log softmax(row)[tok], ErrDeadEnd in the same cases (the
// repetition penalty included: it may overflow row[tok] to -Inf), and the
// same use of the random stream (one Float64 per draw at T > 0 where the
// full path draws one), so every later token of a seeded sample is
// unchanged.
type Forcer interface {
	Forced(generated []int32, logits []float32) (tok int32, ok bool)
}

// LogitsProcessorFunc adapts a function to LogitsProcessor.
type LogitsProcessorFunc func(generated []int32, logits []float32) error

func (f LogitsProcessorFunc) Process(g []int32, l []float32) error { return f(g, l) }

// ErrDeadEnd reports that a processor left no token allowed.
var ErrDeadEnd = errors.New("sampler: no allowed token (dead end)")
