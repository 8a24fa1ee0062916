package couplet

import "strings"

// RuleReport says which couplet rules a (上联, 下联, 横批) triple satisfies.
// It is computed from the text alone, so it judges constrained and
// unconstrained output alike (tests and `chunlian eval`).
type RuleReport struct {
	// Rule 1: the 下联 has the 上联's length, punctuation at the same
	// positions, and only Chinese characters elsewhere (both lines non-empty,
	// neither starts or ends with punctuation).
	SameLength    bool
	PunctMirrored bool
	OnlyHan       bool
	// Rule 2 (仄起平收): 上联 ends on 仄, 下联 on 平 (primary modern reading).
	UpperZe   bool
	LowerPing bool
	// Rule 3: no identical character at the same position, and repetition
	// mirrored: u[j]==u[k] ⇔ l[j]==l[k] (character positions only).
	NoSameChar         bool
	RepetitionMirrored bool
	// Rule 4: the 横批 is exactly four Chinese characters.
	Banner4 bool
}

func (r RuleReport) Rule1() bool { return r.SameLength && r.PunctMirrored && r.OnlyHan }
func (r RuleReport) Rule2() bool { return r.UpperZe && r.LowerPing }
func (r RuleReport) Rule3() bool { return r.NoSameChar && r.RepetitionMirrored }
func (r RuleReport) Rule4() bool { return r.Banner4 }

// OK reports whether all four rules hold.
func (r RuleReport) OK() bool { return r.Rule1() && r.Rule2() && r.Rule3() && r.Rule4() }

// Failed lists the names of the rules that do not hold ("rule1"…), for
// error messages and logs.
func (r RuleReport) Failed() []string {
	var out []string
	for i, ok := range []bool{r.Rule1(), r.Rule2(), r.Rule3(), r.Rule4()} {
		if !ok {
			out = append(out, "rule"+string(rune('1'+i)))
		}
	}
	return out
}

// lineOK reports whether a line is non-empty, made of Chinese characters and
// couplet punctuation, and neither starts nor ends with punctuation nor holds
// two marks in a row.
func lineOK(l []rune) bool {
	if len(l) == 0 || !IsHan(l[0]) || !IsHan(l[len(l)-1]) {
		return false
	}
	for i, r := range l {
		switch {
		case IsHan(r):
		case IsPunct(r):
			if IsPunct(l[i-1]) {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// Check judges a couplet against rules 1–4. It is pure and never panics.
func Check(upper, lower, banner string) RuleReport {
	u, l := []rune(upper), []rune(lower)
	var r RuleReport
	r.SameLength = len(u) == len(l) && len(u) > 0
	r.OnlyHan = lineOK(u) && lineOK(l)
	if r.SameLength {
		r.PunctMirrored = true
		r.NoSameChar = true
		r.RepetitionMirrored = true
		for j := range u {
			pu, pl := IsPunct(u[j]), IsPunct(l[j])
			if pu != pl {
				r.PunctMirrored = false
			}
			if pu || pl {
				continue
			}
			if u[j] == l[j] {
				r.NoSameChar = false
			}
			for k := j + 1; k < len(u); k++ {
				if IsPunct(u[k]) || IsPunct(l[k]) {
					continue
				}
				if (u[j] == u[k]) != (l[j] == l[k]) {
					r.RepetitionMirrored = false
				}
			}
		}
	}
	if len(u) > 0 {
		r.UpperZe = CharTone(u[len(u)-1]) == ToneZe
	}
	if len(l) > 0 {
		r.LowerPing = CharTone(l[len(l)-1]) == TonePing
	}
	b := []rune(banner)
	r.Banner4 = len(b) == 4
	for _, c := range b {
		if !IsHan(c) {
			r.Banner4 = false
		}
	}
	return r
}

// ContainsKeyword reports whether the keyword appears (as a contiguous
// word) in the 上联, the 下联 or the 横批: how Generate writes every
// keyword, a four-character phrase included (it opens the 上联).
func ContainsKeyword(c Couplet, keyword string) bool {
	if keyword == "" {
		return false
	}
	return strings.Contains(c.Upper, keyword) || strings.Contains(c.Lower, keyword) || strings.Contains(c.Banner, keyword)
}
