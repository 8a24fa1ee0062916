// Package couplet turns a user's blessing word (or 上联) into well-formed
// couplets: it builds the prompt, applies the couplet rules as logits
// processors while the engine decodes, picks a 横批 and ranks candidates.
package couplet

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
