package sampler

import (
	"chunlian/internal/testenv"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"chunlian/kernels/cpu"
)

var inf = float32(math.Inf(1))

// refAllowed computes, the slow and obvious way, the set of tokens that may
// be drawn and their renormalised probabilities, for rows without
// processors or penalties.
func refAllowed(row []float32, p Params) map[int32]float64 {
	type tp struct {
		t int32
		p float64
	}
	m := math.Inf(-1)
	for _, v := range row {
		m = math.Max(m, float64(v))
	}
	var all []tp
	var total float64
	for i, v := range row {
		q := math.Exp((float64(v) - m) / float64(p.Temperature))
		if q > 0 {
			all = append(all, tp{int32(i), q})
			total += q
		}
	}
	slices.SortStableFunc(all, func(a, b tp) int {
		if a.p > b.p {
			return -1
		}
		if a.p < b.p {
			return 1
		}
		return 0
	})
	if p.TopK > 0 && p.TopK < len(all) {
		all = all[:p.TopK]
	}
	if p.TopP > 0 && p.TopP < 1 {
		var kept float64
		for _, x := range all {
			kept += x.p
		}
		var cum float64
		for i, x := range all {
			cum += x.p
			if cum >= float64(p.TopP)*kept-1e-12 {
				all = all[:i+1]
				break
			}
		}
	}
	if p.MinP > 0 {
		thr := float64(p.MinP) * all[0].p
		var k []tp
		for _, x := range all {
			if x.p >= thr {
				k = append(k, x)
			}
		}
		all = k
	}
	out := map[int32]float64{}
	var sum float64
	for _, x := range all {
		sum += x.p
	}
	for _, x := range all {
		out[x.t] = x.p / sum
	}
	return out
}

// TestDistribution draws many samples with fixed seeds and checks that only
// allowed tokens appear and that their frequencies match the reference
// probabilities (a chi-square statistic far below what a wrong distribution
// gives; the seeds are fixed, so the test is deterministic).
func TestDistribution(t *testing.T) {
	row := []float32{2.0, 1.5, 1.0, 0.5, 0, -0.5, -1, -8, float32(math.Inf(-1)), 1.9}
	cases := []struct {
		name string
		p    Params
	}{
		{"temperature 1", Params{Temperature: 1}},
		{"temperature 0.5", Params{Temperature: 0.5}},
		{"temperature 2", Params{Temperature: 2}},
		{"top-k 3", Params{Temperature: 1, TopK: 3}},
		{"top-p 0.6", Params{Temperature: 1, TopP: 0.6}},
		{"top-p 0.99", Params{Temperature: 1, TopP: 0.99}},
		{"top-k 4 + top-p 0.8", Params{Temperature: 1, TopK: 4, TopP: 0.8}},
		{"min-p 0.3", Params{Temperature: 1, MinP: 0.3}},
		{"all", Params{Temperature: 0.8, TopK: 6, TopP: 0.9, MinP: 0.05}},
	}
	const draws = 20000
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.p.Seed = 12345
			s := New(tc.p, 0)
			want := refAllowed(row, tc.p)
			counts := map[int32]int{}
			for i := 0; i < draws; i++ {
				tok, _, err := s.Sample(row, nil, nil, nil)
				if err != nil {
					t.Fatal(err)
				}
				if _, ok := want[tok]; !ok {
					t.Fatalf("drew %d, allowed %v", tok, want)
				}
				counts[tok]++
			}
			var chi2 float64
			for tok, p := range want {
				e := p * draws
				d := float64(counts[tok]) - e
				chi2 += d * d / e
			}
			// With ≤ 9 degrees of freedom, chi² > 40 has p < 1e-5.
			if chi2 > 40 {
				t.Errorf("chi² = %.1f over %d tokens; counts %v, want probs %v", chi2, len(want), counts, want)
			}
		})
	}
}

func TestGreedyAndLogProb(t *testing.T) {
	cases := []struct {
		name string
		row  []float32
		p    Params
		proc LogitsProcessor
		gen  []int32
		want int32
	}{
		{"argmax", []float32{0, 3, 1, 2}, Params{}, nil, nil, 1},
		{"tie takes lowest id", []float32{5, 1, 5}, Params{}, nil, nil, 0},
		{"NaN ignored", []float32{float32(math.NaN()), 1, 0}, Params{}, nil, nil, 1},
		{"processor mask", []float32{0, 3, 1, 2}, Params{}, LogitsProcessorFunc(func(_ []int32, l []float32) error { l[1] = -inf; return nil }), nil, 3},
		{"top-k 1 is greedy", []float32{0, 3, 1, 2}, Params{Temperature: 5, TopK: 1, Seed: 3}, nil, nil, 1},
		{"tiny top-p is greedy", []float32{0, 3, 1, 2.9}, Params{Temperature: 5, TopP: 1e-6, Seed: 3}, nil, nil, 1},
		{"min-p 1 is greedy", []float32{0, 3, 1, 2.9}, Params{Temperature: 5, MinP: 1, Seed: 3}, nil, nil, 1},
		// Positive logits are divided: 3/2 = 1.5 < 2.
		{"penalty positive", []float32{0, 3, 1, 2}, Params{RepetitionPenalty: 2}, nil, []int32{1}, 3},
		// Negative logits are multiplied: -1·2 = -2 < -1.5.
		{"penalty negative", []float32{-1, -1.5, -3, -4}, Params{RepetitionPenalty: 2}, nil, []int32{0}, 1},
		// A token repeated in prompt and output is penalised once: 3/2=1.5 > 1.4.
		{"penalty once", []float32{0, 3, 1.4, 1}, Params{RepetitionPenalty: 2}, nil, []int32{1, 1, 1}, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := New(tc.p, 0)
			orig := slices.Clone(tc.row)
			tok, lp, err := s.Sample(tc.row, tc.gen, tc.gen, tc.proc)
			if err != nil {
				t.Fatal(err)
			}
			if tok != tc.want {
				t.Errorf("token %d, want %d", tok, tc.want)
			}
			if !slices.EqualFunc(orig, tc.row, func(a, b float32) bool { return a == b || (a != a && b != b) }) {
				t.Errorf("row modified: %v → %v", orig, tc.row)
			}
			// The log-prob is of the raw row, whatever the processors did.
			var z float64
			for _, v := range orig {
				if v == v {
					z += math.Exp(float64(v))
				}
			}
			want := float64(orig[tok]) - math.Log(z)
			if math.Abs(float64(lp)-want) > 1e-5 {
				t.Errorf("logprob %v, want %v", lp, want)
			}
		})
	}
}

func TestDeadEndAndErrors(t *testing.T) {
	myErr := errors.New("boom")
	cases := []struct {
		name string
		row  []float32
		proc LogitsProcessor
		want error
	}{
		{"all masked", []float32{1, 2}, LogitsProcessorFunc(func(_ []int32, l []float32) error {
			l[0], l[1] = -inf, -inf
			return nil
		}), ErrDeadEnd},
		{"all -Inf from the model", []float32{-inf, -inf}, nil, ErrDeadEnd},
		{"processor says dead end", []float32{1, 2}, LogitsProcessorFunc(func([]int32, []float32) error { return ErrDeadEnd }), ErrDeadEnd},
		{"processor error passes through", []float32{1, 2}, LogitsProcessorFunc(func([]int32, []float32) error { return myErr }), myErr},
	}
	for _, tc := range cases {
		for _, temp := range []float32{0, 1} {
			_, _, err := New(Params{Temperature: temp, Seed: 1}, 0).Sample(tc.row, nil, nil, tc.proc)
			if !errors.Is(err, tc.want) {
				t.Errorf("%s (T=%v): err %v, want %v", tc.name, temp, err, tc.want)
			}
		}
	}
}

func TestReproducible(t *testing.T) {
	row := make([]float32, 300)
	for i := range row {
		row[i] = float32(math.Sin(float64(i)))
	}
	draw := func(seed uint64, index int) []int32 {
		s := New(Params{Temperature: 1, TopP: 0.95, Seed: seed}, index)
		var out []int32
		for i := 0; i < 50; i++ {
			tok, _, _ := s.Sample(row, nil, out, nil)
			out = append(out, tok)
		}
		return out
	}
	if !slices.Equal(draw(7, 0), draw(7, 0)) {
		t.Error("same seed and index differ")
	}
	if slices.Equal(draw(7, 0), draw(7, 1)) {
		t.Error("sample indices share a stream")
	}
	if slices.Equal(draw(7, 0), draw(8, 0)) {
		t.Error("seeds share a stream")
	}
	if slices.Equal(draw(0, 0), draw(0, 0)) {
		t.Error("seed 0 is not random")
	}
}

// TestTopPFastPathMatchesFullSort checks the pre-filter of draw: on a long
// row where the filter applies and on one where it cannot (flat row), the
// drawn tokens are those of the reference nucleus.
func TestTopPFastPathMatchesFullSort(t *testing.T) {
	steep := make([]float32, 5000)
	flat := make([]float32, 5000)
	for i := range steep {
		steep[i] = float32(-i) * 0.01
		flat[i] = float32(i%7) * 1e-4
	}
	for _, row := range [][]float32{steep, flat} {
		for _, p := range []Params{{Temperature: 1, TopP: 0.5, Seed: 2}, {Temperature: 1, TopK: 40, Seed: 2}, {Temperature: 0.7, TopK: 900, TopP: 0.9, Seed: 2}} {
			want := refAllowed(row, p)
			s := New(p, 0)
			for i := 0; i < 300; i++ {
				tok, _, err := s.Sample(row, nil, nil, nil)
				if err != nil {
					t.Fatal(err)
				}
				if _, ok := want[tok]; !ok {
					t.Fatalf("%+v: drew %d outside the nucleus of %d tokens", p, tok, len(want))
				}
			}
		}
	}
}

func TestValidate(t *testing.T) {
	cases := []struct {
		p  Params
		ok bool
	}{
		{Params{}, true},
		{Params{Temperature: 0.7, TopP: 1, TopK: 50, MinP: 0.1, RepetitionPenalty: 1.2, MaxTokens: 10, N: 4}, true},
		{Params{Temperature: -0.1}, false},
		{Params{Temperature: float32(math.NaN())}, false},
		{Params{TopP: -0.5}, false},
		{Params{MinP: 1.5}, false},
		{Params{RepetitionPenalty: -1}, false},
		{Params{TopK: -1}, false},
		{Params{MaxTokens: -1}, false},
		{Params{N: -2}, false},
	}
	for _, tc := range cases {
		if err := Validate(tc.p); (err == nil) != tc.ok {
			t.Errorf("Validate(%+v) = %v", tc.p, err)
		}
	}
}

func TestExpNeg(t *testing.T) {
	worst := 0.0
	for x := float32(-87); x <= 0; x += 0.0013 {
		want := math.Exp(float64(x))
		got := float64(expNeg(x))
		if rel := math.Abs(got-want) / want; rel > worst {
			worst = rel
		}
	}
	if worst > 5e-7 {
		t.Errorf("worst relative error %g", worst)
	}
	if expNeg(0) != 1 || expNeg(-100) != 0 || expNeg(float32(math.Inf(-1))) != 0 {
		t.Errorf("edge values %v %v %v", expNeg(0), expNeg(-100), expNeg(float32(math.Inf(-1))))
	}
}

func TestSampleLSEMatchesSample(t *testing.T) {
	row := make([]float32, 500)
	for i := range row {
		row[i] = float32(math.Cos(float64(i) * 0.3))
	}
	for _, p := range []Params{{}, {Temperature: 1, TopP: 0.9, Seed: 5}} {
		a, b := New(p, 0), New(p, 0)
		for i := 0; i < 20; i++ {
			ta, la, _ := a.Sample(row, nil, nil, nil)
			tb, lb, _ := b.SampleLSE(row, LogSumExp(row), nil, nil, nil)
			if ta != tb || math.Abs(float64(la-lb)) > 1e-6 {
				t.Fatalf("%+v step %d: Sample %d %v, SampleLSE %d %v", p, i, ta, la, tb, lb)
			}
		}
	}
}

// TestFastPathMatchesCopyPath: a row nothing edits takes the no-copy path
// (and, at T = 1, reads its log-sum-exp off the draw's softmax); a no-op
// processor forces the copying path. Both must give bit-identical tokens
// and log-probs, with and without a known lse.
func TestFastPathMatchesCopyPath(t *testing.T) {
	row := make([]float32, 3001)
	for i := range row {
		row[i] = float32(math.Sin(float64(i)*0.71)) * 5
	}
	row[17] = float32(math.Inf(-1))
	noop := LogitsProcessorFunc(func([]int32, []float32) error { return nil })
	for _, p := range []Params{{}, {Temperature: 1, Seed: 4}, {Temperature: 1, TopP: 0.8, Seed: 4}, {Temperature: 0.6, TopK: 30, Seed: 4}, {Temperature: 1.3, MinP: 0.05, Seed: 4}} {
		for _, known := range []bool{false, true} {
			lse := math.NaN()
			if known {
				lse = LogSumExp(row)
			}
			fast, slow := New(p, 0), New(p, 0)
			for i := 0; i < 30; i++ {
				tf, lf, ef := fast.SampleLSE(row, lse, nil, nil, nil)
				ts, ls, es := slow.SampleLSE(row, lse, nil, nil, noop)
				if ef != nil || es != nil || tf != ts || lf != ls {
					t.Fatalf("%+v known=%v draw %d: fast %d %v %v, copying %d %v %v", p, known, i, tf, lf, ef, ts, ls, es)
				}
				if want := float32(float64(row[tf]) - LogSumExp(row)); lf != want {
					t.Fatalf("%+v known=%v draw %d: log-prob %v, want %v", p, known, i, lf, want)
				}
			}
		}
	}
}

// TestScratchShared: samplers that take turns on one Scratch (as the
// engine's workers do) draw exactly what they draw with their own buffers,
// including the repetition penalty's dedup marks and rows of different
// lengths.
func TestScratchShared(t *testing.T) {
	rows := [][]float32{make([]float32, 400), make([]float32, 900)}
	for k, row := range rows {
		for i := range row {
			row[i] = float32(math.Cos(float64(i*(k+2)) * 0.13))
		}
	}
	params := []Params{{}, {RepetitionPenalty: 1.5}, {Temperature: 0.9, TopP: 0.9, RepetitionPenalty: 1.2, Seed: 8}, {Temperature: 1, TopK: 7, Seed: 8}}
	sc := NewScratch()
	for _, p := range params {
		own, shared := New(p, 1), New(p, 1)
		var genOwn, genShared []int32
		for i := 0; i < 40; i++ {
			row := rows[i%2]
			to, lo, eo := own.Sample(row, []int32{3, 4}, genOwn, nil)
			// Another sampler's call in between dirties the shared scratch.
			New(Params{Temperature: 1, RepetitionPenalty: 2, Seed: 1}, 0).SampleWith(sc, rows[(i+1)%2], math.NaN(), []int32{1}, []int32{2, 2}, nil)
			ts, ls, es := shared.SampleWith(sc, row, math.NaN(), []int32{3, 4}, genShared, nil)
			if eo != nil || es != nil || to != ts || lo != ls {
				t.Fatalf("%+v step %d: own %d %v %v, shared %d %v %v", p, i, to, lo, eo, ts, ls, es)
			}
			genOwn, genShared = append(genOwn, to), append(genShared, ts)
		}
	}
}

// TestDistributionSparse is TestDistribution on a long, steep row where
// only a few percent of the tokens are within e^negligible of the top
// (35 of 400 at T = 1), as in a confident model's rows, with exact
// log-probs on the no-copy path.
func TestDistributionSparse(t *testing.T) {
	row := make([]float32, 400)
	perm := []int{}
	for i := range row {
		perm = append(perm, (i*157)%400) // a fixed shuffle (157 is prime to 400)
	}
	for r, tok := range perm {
		row[tok] = 2 - 0.7*float32(r)
	}
	cases := []Params{
		{Temperature: 1},
		{Temperature: 0.7},
		{Temperature: 1, TopP: 0.9},
		{Temperature: 0.8, TopK: 5},
		{Temperature: 1.2, TopP: 0.95, MinP: 0.01},
	}
	const draws = 20000
	for _, p := range cases {
		p.Seed = 99
		s := New(p, 0)
		want := refAllowed(row, p)
		counts := map[int32]int{}
		for i := 0; i < draws; i++ {
			tok, lp, err := s.Sample(row, nil, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := want[tok]; !ok {
				t.Fatalf("%+v: drew %d, outside the allowed set", p, tok)
			}
			if want := float32(float64(row[tok]) - LogSumExp(row)); lp != want {
				t.Fatalf("%+v: log-prob %v, want %v", p, lp, want)
			}
			counts[tok]++
		}
		var chi2 float64
		for tok, q := range want {
			e := q * draws
			d := float64(counts[tok]) - e
			chi2 += d * d / e
		}
		// Tokens with a reference probability ≥ 1e-3 number ≤ 12 here;
		// the rest add about their expected count each. chi² > 45 has
		// p < 1e-5 at 12 degrees of freedom.
		if chi2 > 45 {
			t.Errorf("%+v: chi² = %.1f; counts %v", p, chi2, counts)
		}
	}
}

// TestPresort checks presort's contract on both its paths (threshold fast
// path and histogram): the result is a prefix of the candidates sorted by
// probability (descending, ties by id) holding at least k tokens (top-k)
// or topP of the candidates' mass (top-p), on rows where each fast-path
// level succeeds, where it succeeds with more tokens than it sorts
// directly, and where it fails.
func TestPresort(t *testing.T) {
	const V = 6294
	rows := map[string][]float32{}
	zipf := make([]float32, V)
	sin := make([]float32, V)
	ties := make([]float32, V)
	steep := make([]float32, V)
	for i := range zipf {
		zipf[i] = float32(8 - 2.5*math.Log(1+float64((i*7919)%V)))
		sin[i] = float32(math.Sin(float64(i)*0.37)) * 4
		ties[i] = float32(i % 5)
		steep[i] = float32(-i) * 0.01
	}
	rows["zipf"], rows["sin"], rows["ties"], rows["steep"] = zipf, sin, ties, steep
	levels := presortLevels
	defer func() { presortLevels = levels }()
	for name, row := range rows {
		for _, T := range []float32{0.5, 0.8, 1.5} {
			sc := NewScratch()
			sc.grow(V)
			probs := sc.probs[:V]
			m, _, _ := scanMax(row)
			cpu.ExpSum(probs, row, 1/T, m*(1/T))
			n, total := cpu.CompactGreater(sc.cand[:V], probs, float32(math.Exp(negligible)))
			ref := sortByProb(slices.Clone(sc.cand[:n]), probs)
			for _, tc := range []struct {
				useK bool
				k    int
				p    float64
			}{{true, 1, 0}, {true, 5, 0}, {true, 50, 0}, {true, 900, 0}, {false, 0, 0.3}, {false, 0, 0.9}, {false, 0, 0.95}, {false, 0, 0.999}} {
				for _, fast := range []bool{true, false} {
					presortLevels = levels
					if !fast {
						presortLevels = [len(levels)]float32{2, 2} // above every prob: never enough
					}
					cand := slices.Clone(sc.cand[:n])
					got := sc.presort(cand, probs, 1, total, tc.useK, tc.k, tc.p)
					if len(got) > len(ref) || !slices.Equal(got, ref[:len(got)]) {
						t.Fatalf("%s T=%v %+v fast=%v: %d tokens, not a prefix of the sorted candidates", name, T, tc, fast, len(got))
					}
					if tc.useK && len(got) < min(tc.k, len(ref)) {
						t.Fatalf("%s T=%v %+v fast=%v: %d tokens < k", name, T, tc, fast, len(got))
					}
					if !tc.useK {
						var mass float64
						for _, tok := range got {
							mass += float64(probs[tok])
						}
						if mass < tc.p*total*(1-1e-9) {
							t.Fatalf("%s T=%v %+v fast=%v: mass %v < %v", name, T, tc, fast, mass, tc.p*total)
						}
					}
				}
			}
		}
	}
}

// TestInfiniteScaledRows: a +Inf logit, or logits that overflow once
// divided by a tiny temperature, leave no finite probability; the max
// token is drawn instead of failing.
func TestInfiniteScaledRows(t *testing.T) {
	for _, tc := range []struct {
		name string
		row  []float32
		p    Params
		want int32
	}{
		{"+Inf logit", []float32{0, 1, inf, 2, inf}, Params{Temperature: 0.8, TopP: 0.9, Seed: 1}, 2},
		{"tiny T", []float32{1e10, -3e10, 2e10, 0}, Params{Temperature: 1e-30, Seed: 1}, 2},
	} {
		for _, proc := range []LogitsProcessor{nil, LogitsProcessorFunc(func([]int32, []float32) error { return nil })} {
			tok, _, err := New(tc.p, 0).Sample(tc.row, nil, nil, proc)
			if err != nil || tok != tc.want {
				t.Errorf("%s (processor %v): token %d, err %v; want %d", tc.name, proc != nil, tok, err, tc.want)
			}
		}
	}
}

// TestPick: pick returns the first index whose prefix sum exceeds u, for
// u at and around every boundary, over lengths around the block size.
func TestPick(t *testing.T) {
	for n := 1; n <= 40; n++ {
		probs := make([]float32, n)
		for i := range probs {
			probs[i] = float32(1 + i%3) // prefix sums are small integers: exact
		}
		var cum float64
		for j, p := range probs {
			lo := cum
			cum += float64(p)
			for _, u := range []float64{lo, lo + 0.5, math.Nextafter(cum, 0)} {
				if got := pick(probs, u); got != j {
					t.Fatalf("n=%d u=%v: pick = %d, want %d", n, u, got, j)
				}
			}
		}
		if got := pick(probs, cum); got != n-1 {
			t.Fatalf("n=%d u=total: pick = %d, want the last index", n, got)
		}
	}
}

// TestHugeTies: tied maxima stay candidates when the logits are so large
// that max + negligible·T rounds to the max itself.
func TestHugeTies(t *testing.T) {
	row := []float32{3e9, 0, 3e9, -5, 1}
	for _, proc := range []LogitsProcessor{nil, LogitsProcessorFunc(func([]int32, []float32) error { return nil })} {
		s := New(Params{Temperature: 1, Seed: 7}, 0)
		counts := map[int32]int{}
		for i := 0; i < 2000; i++ {
			tok, _, err := s.Sample(row, nil, nil, proc)
			if err != nil {
				t.Fatal(err)
			}
			counts[tok]++
		}
		if counts[0]+counts[2] != 2000 || counts[0] < 800 || counts[2] < 800 {
			t.Errorf("processor %v: counts %v, want tokens 0 and 2 about equally", proc != nil, counts)
		}
	}
}

// TestMain applies CHUNLIAN_GEMM (openblas | asm | go) to the kernels, as
// the command line's --cpu-gemm does: CI runs this package's tests on each
// path (with -count=1: go test's cache does not see an environment
// read before m.Run). The library itself reads no environment.
func TestMain(m *testing.M) { testenv.Main(m, cpu.SetGEMMPath) }

// TestUniformStream: a Sampler's uniforms are math/rand/v2's
// rand.New(rand.NewPCG(seed, index)).Float64() stream, so that seeded
// requests draw what they drew when the Sampler held a *rand.Rand.
func TestUniformStream(t *testing.T) {
	for _, index := range []int{0, 1, 7} {
		s := New(Params{Seed: 12345, Temperature: 1}, index)
		ref := rand.New(rand.NewPCG(12345, uint64(index)))
		for i := range 1000 {
			if got, want := s.Uniform(), ref.Float64(); got != want {
				t.Fatalf("index %d, draw %d: %v, want %v", index, i, got, want)
			}
		}
	}
}
