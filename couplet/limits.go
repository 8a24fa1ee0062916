package couplet

import "math"

// RequestLimits are the ranges of a request's fields: the one definition
// shared by every front end (HTTP API, command line) and by the generator
// itself, so that a value is accepted everywhere or nowhere. The
// generator checks the model-specific rules (vocabulary, the model's
// max_line_length) on top.
type RequestLimits struct {
	MinN, MaxN           int     // candidates per request
	MinLength, MaxLength int     // Chinese characters per line (keyword, acrostic)
	MaxTemperature       float64 // temperature is in [0, MaxTemperature]; below GreedyBelow it is greedy
	MaxTopK              int     // top-k is in [0, MaxTopK]; 0 = off
	MaxTextRunes         int     // characters of the request text
}

// Limits are the request limits. MaxN bounds the work of one request
// (n couplets of n × oversample samples); MaxLength is what a model with
// max_line_length 32 can write (28 characters and their 4 commas);
// MaxTemperature is the OpenAI API's range.
var Limits = RequestLimits{
	MinN: 1, MaxN: 10,
	MinLength: MinLength, MaxLength: 28,
	MaxTemperature: 2,
	MaxTopK:        100000,
	MaxTextRunes:   64,
}

// GreedyBelow is the temperature under which sampling is greedy (top-k 1):
// temperature 0 means greedy everywhere, and so does any temperature too
// small to divide logits by without overflow.
const GreedyBelow = 1e-6

// Greedy reports whether temperature t asks for greedy decoding.
func Greedy(t float64) bool { return t < GreedyBelow }

// Validate checks req's numeric fields against l (zero N, Length and TopP
// mean their defaults; Temperature is checked as given). Every rejection
// is an *InputError.
func (l RequestLimits) Validate(req Request) error {
	if req.N != 0 && (req.N < l.MinN || req.N > l.MaxN) {
		return inputErr(CodeBadN, "候选数 n 必须在 %d 到 %d 之间", "n must be between %d and %d", l.MinN, l.MaxN)
	}
	if req.Mode != ModeLower && req.Length != 0 && (req.Length < l.MinLength || req.Length > l.MaxLength) {
		return inputErr(CodeBadLength, "字数必须在 %d 到 %d 之间", "length must be between %d and %d characters", l.MinLength, l.MaxLength)
	}
	if t := float64(req.Temperature); math.IsNaN(t) || t < 0 || t > l.MaxTemperature {
		return inputErr(CodeBadSampling, "temperature 必须在 0 到 %g 之间（0 = 贪心）", "temperature must be between 0 and %g (0 = greedy)", l.MaxTemperature)
	}
	if p := req.TopP; math.IsNaN(float64(p)) || p < 0 || p > 1 {
		return inputErr(CodeBadSampling, "top_p 必须在 (0, 1] 之间", "top_p must be in (0, 1]")
	}
	if req.TopK < 0 || req.TopK > l.MaxTopK {
		return inputErr(CodeBadSampling, "top_k 必须在 0 到 %d 之间（0 = 关闭）", "top_k must be between 0 and %d (0 = off)", l.MaxTopK)
	}
	return nil
}

// SetTemperature sets the sampling temperature a user asked for: in
// [0, GreedyBelow) it is greedy (top-k 1), else t (a negative or NaN t is
// kept for Validate to reject). Every front end
// uses it, so that temperature 0 means greedy everywhere.
func (r *Request) SetTemperature(t float64) {
	if t >= 0 && Greedy(t) {
		r.Temperature, r.TopK = 1, 1
		return
	}
	r.Temperature = float32(t)
}
