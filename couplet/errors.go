package couplet

import (
	"errors"
	"fmt"
)

// InputError is a problem with the caller's request (HTTP 400). Message holds
// Chinese then English, separated by " / ".
type InputError struct {
	Code    string // stable machine-readable code, e.g. "bad_keyword"
	Message string
}

func (e *InputError) Error() string { return e.Code + ": " + e.Message }

// Input error codes.
const (
	CodeBadMode     = "bad_mode"
	CodeBadKeyword  = "bad_keyword"  // keyword/acrostic text is not two Chinese characters
	CodeSameHeads   = "same_heads"   // acrostic heads are identical (would break rule 3)
	CodeTabooWord   = "taboo_word"   // keyword/acrostic text holds an ill-omened word (Judge.Taboo)
	CodeBadChar     = "bad_char"     // a character that is neither Chinese nor couplet punctuation
	CodeUnknownChar = "unknown_char" // a Chinese character the model does not know
	CodeBadPunct    = "bad_punct"    // punctuation at a line end or doubled
	CodeBadLength   = "bad_length"   // line length out of range
	CodeBadN        = "bad_n"        // candidate count out of range
	CodeBadSampling = "bad_sampling" // temperature / top-p / top-k out of range
	CodeEmpty       = "empty"        // no text
	CodeUnsupported = "unsupported"  // a request the model cannot serve (e.g. upper tone)
)

func inputErr(code, zh, en string, args ...any) *InputError {
	return &InputError{Code: code, Message: fmt.Sprintf(zh, args...) + " / " + fmt.Sprintf(en, args...)}
}

// ErrNoCouplet is returned when every attempt ended in a dead end (a rule
// could not be met); it is a server-side failure, not an input error.
var ErrNoCouplet = errors.New("couplet: no well-formed couplet found within the attempt budget")
