package couplet

import (
	"unicode"
	"unicode/utf8"
)

// Punctuation is the set of marks allowed inside a couplet line (the same set
// the training data uses). Everything else in a line must be a Chinese
// character.
const Punctuation = "，、；：！？·"

// IsPunct reports whether r is couplet punctuation (a rune of Punctuation;
// a switch, because the rules ask for every character of every candidate).
func IsPunct(r rune) bool {
	switch r {
	case '，', '、', '；', '：', '！', '？', '·':
		return true
	}
	return false
}

// IsHan reports whether r is a Chinese character: a CJK ideograph (Unicode
// property Ideographic, which also covers 〇 but not radicals or 々).
func IsHan(r rune) bool { return unicode.Is(unicode.Ideographic, r) }

// singleRune returns the only rune of s, or false if s is not exactly one
// valid rune.
func singleRune(s string) (rune, bool) {
	r, n := utf8.DecodeRuneInString(s)
	if n == 0 || n != len(s) || r == utf8.RuneError {
		return 0, false
	}
	return r, true
}
