package sampler

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// forceProc forces tok the way a Forcer promises to (see Forcer): ErrDeadEnd
// if tok is outside the row or its entry is -Inf/NaN (the sampler already
// turned NaNs into -Inf), else every other entry becomes -Inf.
type forceProc struct{ tok int32 }

func (f forceProc) Process(_ []int32, l []float32) error {
	if f.tok < 0 || int(f.tok) >= len(l) || !(l[f.tok] > float32(math.Inf(-1))) {
		return ErrDeadEnd
	}
	v := l[f.tok]
	for i := range l {
		l[i] = float32(math.Inf(-1))
	}
	l[f.tok] = v
	return nil
}

func (f forceProc) Forced([]int32, []float32) (int32, bool) { return f.tok, true }

// processOnly hides a processor's Forced method: the sampler takes the full
// path (copy, processor, scans, draw).
type processOnly struct{ p LogitsProcessor }

func (p processOnly) Process(g []int32, l []float32) error { return p.p.Process(g, l) }

// notForced is a Forcer that never forces (Process must then run).
type notForced struct{ calls *int }

func (n notForced) Process([]int32, []float32) error        { *n.calls++; return nil }
func (n notForced) Forced([]int32, []float32) (int32, bool) { return 0, false }

// TestForcedMatchesFullPath: on forced rows, the Forcer path gives the full
// path's token, log-prob bits and error, and leaves the random stream in
// the same state, for every parameter set, row shape, known or unknown LSE
// and penalty history; then a free row sampled by both samplers gives the
// same token (the streams stayed in step).
func TestForcedMatchesFullPath(t *testing.T) {
	const V = 300
	ninf, nan := float32(math.Inf(-1)), float32(math.NaN())
	rng := rand.New(rand.NewPCG(1, 2))
	zipf := func() []float32 {
		r := make([]float32, V)
		for i := range r {
			r[i] = float32(8 - 3*math.Log(float64(i+1)) + rng.NormFloat64())
		}
		return r
	}
	const tok = 37
	type rowCase struct {
		name string
		row  func() []float32
		tok  int32
	}
	set := func(kv ...float32) func() []float32 { // zipf row with row[int(kv[2i])] = kv[2i+1]
		return func() []float32 {
			r := zipf()
			for i := 0; i < len(kv); i += 2 {
				r[int(kv[i])] = kv[i+1]
			}
			return r
		}
	}
	rows := []rowCase{
		{"zipf", zipf, tok},
		{"zipf/first", zipf, 0},
		{"zipf/last", zipf, V - 1},
		{"zipf/top", set(tok, 50), tok},
		{"nan-elsewhere", set(3, nan, 200, nan), tok},
		{"tok-nan", set(tok, nan), tok},
		{"tok-neginf", set(tok, ninf), tok},
		{"tok-posinf", set(tok, inf), tok},
		{"posinf-elsewhere", set(5, inf), tok},
		{"neg-zero", set(tok, float32(math.Copysign(0, -1))), tok},
		{"tok-80", set(tok, 80.3), tok},   // m/T rounding: exp of the FMA residue
		{"tok-3e8", set(tok, 3.3e8), tok}, // 24·T below the rounding of m
		{"tok-1e30", set(tok, 1e30), tok},
		{"tok-maxfloat", set(tok, math.MaxFloat32), tok},
		{"tok-minfloat", set(tok, -math.MaxFloat32), tok},
		{"tok-denormal", set(tok, 1e-44), tok},
		{"out-of-range-neg", zipf, -1},
		{"out-of-range-V", zipf, V},
		{"all-neginf-but-tok", func() []float32 {
			r := make([]float32, V)
			for i := range r {
				r[i] = ninf
			}
			r[tok] = -3
			return r
		}, tok},
	}
	params := []Params{
		{},
		{Temperature: 0.8, TopP: 0.95},
		{Temperature: 1},
		{Temperature: 0.8, TopK: 50},
		{Temperature: 0.8, TopK: 1},
		{Temperature: 0.7, MinP: 0.1},
		{Temperature: 0.7, MinP: 1},
		{Temperature: 0.9, TopP: 0.9999999, TopK: 40, MinP: 0.05},
		{Temperature: 1e-30, TopP: 0.9},
		{Temperature: float32(math.Inf(1))},
		{Temperature: 0.8, TopP: 0.95, RepetitionPenalty: 1.3},
		{Temperature: 0.8, RepetitionPenalty: 0.5},
		{RepetitionPenalty: 2},
		{Temperature: 1, RepetitionPenalty: 1e30},
	}
	histories := []struct {
		name              string
		prompt, generated []int32
	}{
		{"none", nil, nil},
		{"tok-in-prompt", []int32{1, tok, 2, tok}, nil},
		{"tok-generated", []int32{4}, []int32{tok, 9, tok}},
		{"others", []int32{1, 2, V + 5, -3}, []int32{3, 4}},
	}
	var drew, skipped, dead int
	for _, rc := range rows {
		for pi, p := range params {
			for _, h := range histories {
				for _, knownLSE := range []bool{false, true} {
					name := fmt.Sprintf("%s/p%d/%s/lse=%v", rc.name, pi, h.name, knownLSE)
					row := rc.row()
					lse := math.NaN()
					if knownLSE {
						lse = LogSumExp(row)
					}
					seed := uint64(pi + 1)
					fast, full := &Sampler{p: p}, &Sampler{p: p}
					fast.rng.Seed(seed, 3)
					full.rng.Seed(seed, 3)
					before, _ := full.rng.MarshalBinary()
					proc := forceProc{rc.tok}
					tf, lf, ef := fast.SampleWith(NewScratch(), row, lse, h.prompt, h.generated, proc)
					tw, lw, ew := full.SampleWith(NewScratch(), row, lse, h.prompt, h.generated, processOnly{proc})
					if ef != ew {
						t.Errorf("%s: error %v, full path %v", name, ef, ew)
						continue
					}
					if ew == nil && (tf != tw || math.Float32bits(lf) != math.Float32bits(lw)) {
						t.Errorf("%s: (%d, %v), full path (%d, %v)", name, tf, lf, tw, lw)
					}
					sf, _ := fast.rng.MarshalBinary()
					sw, _ := full.rng.MarshalBinary()
					if string(sf) != string(sw) {
						t.Errorf("%s: random stream differs after the forced row", name)
					}
					switch {
					case ew != nil:
						dead++
					case string(sw) != string(before):
						drew++
					default:
						skipped++
					}
					// A free row after it: the same token from both.
					free := zipf()
					a, la, _ := fast.SampleWith(NewScratch(), free, math.NaN(), h.prompt, h.generated, nil)
					b, lb, _ := full.SampleWith(NewScratch(), free, math.NaN(), h.prompt, h.generated, nil)
					if a != b || math.Float32bits(la) != math.Float32bits(lb) {
						t.Errorf("%s: next free row gave %d vs %d", name, a, b)
					}
				}
			}
		}
	}
	// The table must reach every branch: dead ends, forced rows that draw
	// from the stream and forced rows that do not (greedy, or no finite
	// probability: w/T overflow, +Inf).
	t.Logf("forced rows: %d drew, %d did not, %d dead ends", drew, skipped, dead)
	if drew == 0 || skipped == 0 || dead == 0 {
		t.Fatalf("table misses a branch: %d drew, %d did not, %d dead ends", drew, skipped, dead)
	}
}

// TestForcedDrawsOnlyIfFullPathDoes pins the rows where the full path's draw
// consumes no random number although T > 0 (the probability total is not
// ≥ 1) and those where it does, so that the table above covers both at T > 0.
func TestForcedDrawsOnlyIfFullPathDoes(t *testing.T) {
	for _, c := range []struct {
		v    float32
		p    Params
		draw bool
	}{
		{1.5, Params{Temperature: 0.8, TopP: 0.95}, true},
		{1e10, Params{Temperature: 1e-30}, false}, // w/T overflows
		{inf, Params{Temperature: 0.8}, false},    // exp(Inf − Inf)
		{1.5, Params{}, false},                    // greedy
	} {
		row := make([]float32, 64)
		row[9] = c.v
		s := &Sampler{p: c.p}
		s.rng.Seed(5, 6)
		before, _ := s.rng.MarshalBinary()
		tok, _, err := s.SampleWith(NewScratch(), row, math.NaN(), nil, nil, processOnly{forceProc{9}})
		after, _ := s.rng.MarshalBinary()
		if err != nil || tok != 9 {
			t.Fatalf("%v %+v: %d, %v", c.v, c.p, tok, err)
		}
		if drew := string(before) != string(after); drew != c.draw {
			t.Errorf("%v %+v: full path drew %v, want %v", c.v, c.p, drew, c.draw)
		}
	}
}

// TestForcerFallsBack: a Forcer answering ok = false gets its Process run,
// and an error from it ends the sample as before.
func TestForcerFallsBack(t *testing.T) {
	calls := 0
	s := New(Params{Temperature: 0.8, Seed: 1}, 0)
	row := []float32{0, 1, 2, 3}
	if _, _, err := s.Sample(row, nil, nil, notForced{&calls}); err != nil || calls != 1 {
		t.Fatalf("err %v, %d Process calls; want nil, 1", err, calls)
	}
	if _, _, err := s.Sample(row, nil, nil, forceProc{4}); !errors.Is(err, ErrDeadEnd) {
		t.Fatalf("forced out of range: %v, want ErrDeadEnd", err)
	}
	if _, _, err := s.Sample(nil, nil, nil, forceProc{0}); err == nil || errors.Is(err, ErrDeadEnd) {
		t.Fatalf("empty row: %v, want the empty-row error", err)
	}
}
