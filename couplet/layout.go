package couplet

// Line-length policy. Length counts the Chinese characters of one line.
// Lines of up to 7 characters are a single clause; longer lines are split
// into clauses joined by "，" in the shapes most common in the spring
// couplet corpus (4，4 · 4，5 · 5，5 · 4，7 · 5，7 · 6，7 · 7，7, and
// beyond 14 characters further 7-character clauses appended: 15 = 4，4，7,
// 21 = 7，7，7 …). The model's length token counts tokens, i.e. the
// characters plus the commas, and must not exceed the model's
// max_line_length, which bounds Length (28 for max_line_length 32).
const (
	DefaultLength = 7
	MinLength     = 3 // a keyword plus one more character
	// DefaultTemperature: on the calibrated weights (training/calibrate.py)
	// blind readers marked the default pipeline's picks at 0.5 better than
	// at 0.7, with 2 and with 8 ranked samples (docs/DECISIONS.md,
	// "Sampling temperature"); constrained output passes the rules at any
	// setting.
	DefaultTemperature = 0.5
	DefaultTopP        = 0.95
)

// twoClause gives the clause sizes of lines of 8..14 characters.
var twoClause = map[int][]int{
	8: {4, 4}, 9: {4, 5}, 10: {5, 5}, 11: {4, 7}, 12: {5, 7}, 13: {6, 7}, 14: {7, 7},
}

// Clauses returns the clause sizes for a line of n Chinese characters (n ≥ 1).
func Clauses(n int) []int {
	switch {
	case n <= 7:
		return []int{n}
	case n <= 14:
		return append([]int(nil), twoClause[n]...)
	}
	return append(Clauses(n-7), 7)
}

// Layout returns the line template for n Chinese characters: one rune per
// token position, 0 for a character slot and '，' between clauses.
func Layout(n int) []rune {
	var out []rune
	for i, c := range Clauses(n) {
		if i > 0 {
			out = append(out, '，')
		}
		for range c {
			out = append(out, 0)
		}
	}
	return out
}
