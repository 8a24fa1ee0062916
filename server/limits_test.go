package server

import (
	"testing"

	"chunlian/couplet"
)

// The HTTP layer applies couplet.Limits, the table the command line
// shares: a length the generator cannot write is a 400 before any
// streaming, and temperature 0 or a tiny one is greedy, never the default.
func TestSharedLimits(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	for _, tc := range []struct {
		p  genParams
		ok bool
	}{
		{genParams{Prompt: "平安", N: couplet.Limits.MaxN, Length: couplet.Limits.MaxLength}, true},
		{genParams{Prompt: "平安", N: 1, Length: couplet.Limits.MaxLength + 1}, false},
		{genParams{Prompt: "平安", N: 1, Length: 2}, false},
		{genParams{Prompt: "平安", N: couplet.Limits.MaxN + 1}, false},
		{genParams{Prompt: "平安", N: 1, Temperature: f(couplet.Limits.MaxTemperature + 0.1)}, false},
	} {
		_, e := tc.p.validate()
		if (e == nil) != tc.ok {
			t.Errorf("%+v: error %v, want ok=%v", tc.p, e, tc.ok)
		}
	}
	for _, temp := range []float64{0, 1e-45, 1e-9} {
		p := genParams{Prompt: "平安", N: 1, Temperature: f(temp)}
		req, e := p.validate()
		if e != nil || req.TopK != 1 {
			t.Errorf("temperature %g: %+v, %v; want greedy (top-k 1)", temp, req, e)
		}
	}
}
