// Package couplet turns a user's blessing word (or 上联) into well-formed
// couplets: it builds the prompt, applies the couplet rules as logits
// processors while the engine decodes, picks a 横批 and ranks candidates.
package couplet

import "time"

// Mode selects the task.
type Mode string

const (
	ModeKeyword  Mode = "keyword"  // two-character blessing word → 上联, 下联, 横批
	ModeAcrostic Mode = "acrostic" // 藏头: 上联 starts with Text[0], 下联 with Text[1]
	ModeLower    Mode = "lower"    // given 上联 → 下联 + 横批
)

// Couplet is one result.
type Couplet struct {
	Upper  string  `json:"upper"`
	Lower  string  `json:"lower"`
	Banner string  `json:"banner"`
	Score  float64 `json:"score"`
}

// Request is one couplet request. Zero values mean defaults (see Generate).
type Request struct {
	Mode Mode // "" = ModeKeyword
	// Text is the two-character blessing word (keyword), the two head
	// characters (acrostic) or the 上联 (lower).
	Text string
	// Length is the number of Chinese characters per line (keyword and
	// acrostic; 0 = DefaultLength). Lines of 8 or more characters are split
	// into clauses with "，" (see Layout). Ignored in lower mode, where the
	// 上联 fixes the form.
	Length int
	N      int // candidates to return (0 = 1; at most Limits.MaxN)
	// Sampling. Temperature 0 = unset: the generator's (WithTemperature,
	// else DefaultTemperature; a user's
	// temperature goes through SetTemperature, where 0 is greedy); a
	// temperature below GreedyBelow is greedy. TopP 0 = DefaultTopP, TopK
	// 0 = off.
	Temperature float32
	TopP        float32
	TopK        int
	Seed        uint64 // 0 = random
	// Unconstrained turns the couplet rules off: the raw model output is
	// parsed and returned as is, possibly malformed, without banner ranking.
	// It exists for evaluation (constraints on vs off).
	Unconstrained bool
	// OnToken, if set, streams the tokens of every sample as they are
	// decoded. It is called on the engine goroutine and must not block.
	// Samples may later be dropped by ranking, and the returned 横批 may be a
	// retrieved one rather than the streamed one.
	OnToken func(TokenEvent)
	// Trace, if set, receives a per-stage breakdown of this call (for
	// benchmarks and debugging). Generate writes it before returning; it
	// must not be shared between concurrent calls.
	Trace *Trace
}

// Stage names in a Trace.
const (
	StageCandidates      = "candidates"       // constrained sampling of the couplet candidates (all rounds)
	StageRank            = "rank"             // rule re-check, scoring and diverse selection
	StageBannerRetrieval = "banner_retrieval" // lexical prefilter of the retrieval lists
	StageBannerScoring   = "banner_scoring"   // engine scoring of the 横批 candidates
)

// Trace is the per-stage breakdown of one Generate call.
type Trace struct {
	Stages []StageTrace
	// Explain asks Generate to compute every ranking feature (the reverse
	// score too, whatever its weight) and list the candidates in
	// Candidates, best first.
	Explain    bool
	Candidates []Scored
}

// StageTrace is one stage of Generate. Engine counters cover this call's
// engine requests only, except EngineSteps, which is the engine-wide step
// counter's advance during the stage (exact when the call runs alone).
type StageTrace struct {
	Name           string
	Wall           time.Duration
	EngineRequests int
	PromptTokens   int   // prompt tokens submitted
	CachedTokens   int   // of those, served from the prefix cache
	GenTokens      int   // tokens generated, all samples
	ComputedTokens int   // token rows the forward pass ran: uncached prompt + generated tokens fed back
	EngineSteps    int64 // see StageTrace
}

// Stage returns the named stage (zero if absent).
func (t *Trace) Stage(name string) StageTrace {
	for _, s := range t.Stages {
		if s.Name == name {
			return s
		}
	}
	return StageTrace{Name: name}
}

// Part names the piece of a couplet a streamed token belongs to.
type Part string

const (
	PartUpper  Part = "upper"
	PartLower  Part = "lower"
	PartBanner Part = "banner"
)

// TokenEvent is one streamed token of one sample.
type TokenEvent struct {
	Attempt int // retry round (0 first); samples of a new round restart
	Sample  int // sample index within the round
	Part    Part
	Text    string // the token's text (one character)
}

// Text renders the couplet in the seed service's format.
func (c Couplet) Text() string {
	return "上联：" + c.Upper + "\n下联：" + c.Lower + "\n横批：" + c.Banner
}
