package bench

import "testing"

// TestPair covers the column choice of every seed-shaped table, including
// a report of the engine alone (chunlian bench --spawn engine), which used
// to print "No target was measured" above its own results.
func TestPair(t *testing.T) {
	for _, tc := range []struct {
		targets   []string
		base, opt string // "" = nil
	}{
		{[]string{"naive", "engine"}, "naive", "engine"},
		{[]string{"engine", "naive"}, "naive", "engine"},
		{[]string{"engine"}, "engine", ""},
		{[]string{"naive"}, "naive", ""},
		{[]string{"vllm"}, "vllm", ""},
		{[]string{"vllm", "engine"}, "vllm", "engine"},
		{[]string{"a", "b", "c"}, "a", "b"},
		{nil, "", ""},
	} {
		r := &Report{}
		for _, n := range tc.targets {
			r.Targets = append(r.Targets, TargetResult{Name: n})
		}
		base, opt := r.Pair()
		name := func(x *TargetResult) string {
			if x == nil {
				return ""
			}
			return x.Name
		}
		if name(base) != tc.base || name(opt) != tc.opt {
			t.Errorf("Pair(%v) = %q, %q; want %q, %q", tc.targets, name(base), name(opt), tc.base, tc.opt)
		}
	}
}
