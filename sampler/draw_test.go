package sampler

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

var (
	inf32  = float32(math.Inf(1))
	nan32  = float32(math.NaN())
	ninf32 = float32(math.Inf(-1))
)

// allowBits returns the allowed bit set of V tokens where ok(t).
func allowBits(V int, ok func(t int) bool) []uint64 {
	a := make([]uint64, (V+63)/64)
	for t := range V {
		if ok(t) {
			a[t/64] |= 1 << (t % 64)
		}
	}
	return a
}

// TestDrawRowExact: greedy, dead ends, NaN, masks and a few draws whose
// token follows from the definition by hand (id-order pick, rounds).
func TestDrawRowExact(t *testing.T) {
	row70 := make([]float32, 70)
	row70[65] = 9 // outside 64·len(allowed) below
	row70[3] = 2
	row70[40] = 2
	for _, tc := range []struct {
		name    string
		row     []float32
		allowed []uint64
		exclude []int32
		p       DrawParams
		u       float64
		want    int32
	}{
		{"greedy lowest max", []float32{1, 3, 3, 2}, nil, nil, DrawParams{}, 0.5, 1},
		{"greedy NaN is -Inf", []float32{nan32, 1, nan32, 0}, nil, nil, DrawParams{}, 0.5, 1},
		{"greedy NaN only", []float32{nan32, nan32}, nil, nil, DrawParams{}, 0.5, -1},
		{"greedy all -Inf", []float32{ninf32, ninf32}, nil, nil, DrawParams{}, 0.5, -1},
		{"empty row", nil, nil, nil, DrawParams{Temperature: 1}, 0.5, -1},
		{"greedy +Inf", []float32{1, inf32, inf32}, nil, nil, DrawParams{}, 0.5, 1},
		{"greedy masked max", []float32{1, 3, 2, 2}, allowBits(4, func(t int) bool { return t != 1 }), nil, DrawParams{}, 0.5, 2},
		{"greedy excluded max", []float32{1, 3, 2, 2}, nil, []int32{1, -1, 99}, DrawParams{}, 0.5, 2},
		{"greedy ids past the mask", row70, []uint64{^uint64(0)}, nil, DrawParams{}, 0.5, 3},
		{"mask+exclude dead end", []float32{1, 3, 2}, allowBits(3, func(t int) bool { return t == 1 }), []int32{1}, DrawParams{}, 0.5, -1},
		{"sampled dead end", []float32{1, 3, 2}, allowBits(3, func(int) bool { return false }), nil, DrawParams{Temperature: 1, TopP: 0.9}, 0.5, -1},
		{"sampled NaN only", []float32{nan32}, nil, nil, DrawParams{Temperature: 1}, 0.5, -1},
		{"sampled one allowed", []float32{5, 3, 2}, allowBits(3, func(t int) bool { return t == 2 }), nil, DrawParams{Temperature: 1.3}, 0.999, 2},
		{"sampled +Inf max", []float32{1, inf32, 0, inf32}, nil, nil, DrawParams{Temperature: 1}, 0.999, 1},
		{"sampled 1/T overflows", []float32{1, 2, 2, 1.9999}, nil, nil, DrawParams{Temperature: 1e-45}, 0.999, 1},
		{"huge ties", []float32{3e9, 0, 3e9}, nil, nil, DrawParams{Temperature: 1}, 0.75, 2},
		// p = [e^-5, 1, e^-5, e^-5]: picked in id order, not sorted order.
		{"id order low u", []float32{0, 5, 0, 0}, nil, nil, DrawParams{Temperature: 1}, 1e-4, 0},
		{"id order high u", []float32{0, 5, 0, 0}, nil, nil, DrawParams{Temperature: 1}, 0.999, 3},
		{"id order mid u", []float32{0, 5, 0, 0}, nil, nil, DrawParams{Temperature: 1}, 0.5, 1},
		// Equal p: running sums 1, 2, 3, 4 against 4u.
		{"equal u .3", []float32{7, 7, 7, 7}, nil, nil, DrawParams{Temperature: 0.5}, 0.3, 1},
		{"equal u .75", []float32{7, 7, 7, 7}, nil, nil, DrawParams{Temperature: 0.5}, 0.75, 3},
		{"equal u 0", []float32{7, 7, 7, 7}, nil, nil, DrawParams{Temperature: 0.5}, 0, 0},
		// Round 0 picks 3, outside top-1 (ties by lower id): rounds until 0.
		{"rounds top-k 1", []float32{7, 7, 7, 7}, nil, nil, DrawParams{Temperature: 1, TopK: 1}, 0.9, 0},
		// Nucleus {0, 1} (above_2 = 2 ≥ 0.3·4): round 0 picks 3.
		{"rounds top-p tie cut", []float32{7, 7, 7, 7}, nil, nil, DrawParams{Temperature: 1, TopP: 0.3}, 0.9, -2},
		// min-p 0.5 keeps only the max (e^-5 < 0.5).
		{"min-p", []float32{0, 5, 0, 0}, nil, nil, DrawParams{Temperature: 1, MinP: 0.5}, 0.999, 1},
		{"min-p > 1: im", []float32{0, 5, 5, 0}, nil, nil, DrawParams{Temperature: 1, MinP: 1.5}, 0.999, 1},
		{"min-p NaN: im", []float32{0, 5, 5, 0}, nil, nil, DrawParams{Temperature: 1, MinP: nan32, TopP: 0.5}, 0.999, 1},
		{"min-p 1: ties of the max", []float32{0, 5, 5, 0}, nil, nil, DrawParams{Temperature: 1, MinP: 1}, 0.999, 2},
	} {
		got := DrawRow(tc.row, tc.allowed, tc.exclude, tc.p, tc.u)
		if tc.want == -2 { // either of tokens 0, 1
			if got != 0 && got != 1 {
				t.Errorf("%s: DrawRow = %d, want 0 or 1", tc.name, got)
			}
			continue
		}
		if got != tc.want {
			t.Errorf("%s: DrawRow = %d, want %d", tc.name, got, tc.want)
		}
	}
}

// TestDrawRowMask: a token that is not allowed, excluded or NaN is never
// returned, and -1 only when nothing is left (random rows, masks, params).
func TestDrawRowMask(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	params := []DrawParams{
		{},
		{Temperature: 1},
		{Temperature: 0.8, TopP: 0.95},
		{Temperature: 1.3, TopK: 5},
		{Temperature: 0.7, MinP: 0.1},
		{Temperature: 1, TopP: 0.5, TopK: 3, MinP: 0.05},
	}
	for it := range 300 {
		V := 1 + rng.IntN(150)
		row := make([]float32, V)
		for i := range row {
			switch rng.IntN(20) {
			case 0:
				row[i] = nan32
			case 1:
				row[i] = ninf32
			default:
				row[i] = float32(rng.NormFloat64() * 2)
			}
		}
		var allowed []uint64
		density := []float64{0.02, 0.3, 0.9}[rng.IntN(3)]
		if it%4 != 0 {
			words := (V + 63) / 64
			if rng.IntN(3) == 0 {
				words = rng.IntN(words + 1) // may end before V
			}
			allowed = allowBits(words*64, func(int) bool { return rng.Float64() < density })
		}
		var exclude []int32
		for range rng.IntN(6) {
			exclude = append(exclude, int32(rng.IntN(V+20)-10))
		}
		ok := func(i int) bool {
			if row[i] != row[i] || slices.Contains(exclude, int32(i)) {
				return false
			}
			return allowed == nil || (i/64 < len(allowed) && allowed[i/64]>>(i%64)&1 == 1)
		}
		live := false // an allowed token above -Inf
		for i := range V {
			live = live || (ok(i) && row[i] > ninf32)
		}
		p := params[it%len(params)]
		for range 50 {
			tok := DrawRow(row, allowed, exclude, p, rng.Float64())
			switch {
			case tok == -1 && live:
				t.Fatalf("it %d: dead end with an allowed token (p %+v)", it, p)
			case tok == -1:
			case tok < 0 || int(tok) >= V || !ok(int(tok)) || row[tok] == ninf32:
				t.Fatalf("it %d: DrawRow = %d, not allowed (p %+v)", it, tok, p)
			case !live:
				t.Fatalf("it %d: DrawRow = %d, want a dead end", it, tok)
			}
		}
	}
}

// kept12 is a V = 12 row with a four-way tie at probability e^-1 (T = 1):
// sorted ids 1, 7, 2, 3, 4, 9, 0, 11, 6, 5, 10, 8.
var kept12 = []float32{0.5, 2, 1, 1, 1, -0.5, 0, 1.5, -3, 1, -1, 0.2}

// specKept is the test's own enumeration of DrawRow's kept set by the
// sorted-order definition (float64 arithmetic): mask, p = exp((w−m)/T),
// sort by p descending, ties by id, keep the prefix whose cumulative mass
// before the item is < TopP·Z and at most TopK items, then min-p. It
// returns each kept token's probability (normalised over the kept set)
// and the smallest relative distance of a cut to its boundary (a case
// closer than ~1e-4 would depend on rounding).
func specKept(row []float32, allowed []uint64, exclude []int32, p DrawParams) (map[int]float64, float64) {
	V := len(row)
	w := make([]float64, V)
	m := math.Inf(-1)
	for i, v := range row {
		w[i] = float64(v)
		if v != v || slices.Contains(exclude, int32(i)) ||
			(allowed != nil && (i/64 >= len(allowed) || allowed[i/64]>>(i%64)&1 == 0)) {
			w[i] = math.Inf(-1)
		}
		m = max(m, w[i])
	}
	T := float64(p.Temperature)
	pr := make([]float64, V)
	var Z float64
	for i := range w {
		if w[i]-m > -24*T {
			pr[i] = math.Exp((w[i] - m) / T)
		}
		Z += pr[i]
	}
	ids := make([]int, 0, V)
	for i := range pr {
		if pr[i] > 0 {
			ids = append(ids, i)
		}
	}
	slices.SortFunc(ids, func(a, b int) int {
		if pr[a] != pr[b] {
			if pr[a] > pr[b] {
				return -1
			}
			return 1
		}
		return a - b
	})
	margin := math.Inf(1)
	kept := map[int]float64{}
	var cum, sum float64
	for rank, i := range ids {
		in := true
		if p.TopP > 0 && p.TopP < 1 {
			margin = min(margin, math.Abs(cum-float64(p.TopP)*Z)/Z)
			in = cum < float64(p.TopP)*Z
		}
		if p.TopK > 0 && rank >= int(p.TopK) {
			in = false
		}
		if p.MinP > 0 {
			margin = min(margin, math.Abs(pr[i]-float64(p.MinP)))
			in = in && pr[i] >= float64(p.MinP)
		}
		cum += pr[i]
		if in {
			kept[i] = pr[i]
			sum += pr[i]
		}
	}
	for i := range kept {
		kept[i] /= sum
	}
	return kept, margin
}

// TestDrawRowDistribution: the frequencies of N = 200k draws with
// uniforms from a fixed PCG match the kept set's probabilities, computed
// here by the sorted-order definition (5σ), and nothing outside the kept
// set is ever drawn.
func TestDrawRowDistribution(t *testing.T) {
	notTop := allowBits(12, func(t int) bool { return t != 1 })
	for _, tc := range []struct {
		name    string
		allowed []uint64
		exclude []int32
		p       DrawParams
		want    []int // the kept set, as a check of the case itself
	}{
		{"plain T=1", nil, nil, DrawParams{Temperature: 1}, []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}},
		{"top-p .6 tie cut", nil, nil, DrawParams{Temperature: 1, TopP: 0.6}, []int{1, 7, 2, 3}},
		{"top-p .5 tie cut", nil, nil, DrawParams{Temperature: 1, TopP: 0.5}, []int{1, 7, 2}},
		{"top-k 3 tie cut", nil, nil, DrawParams{Temperature: 1, TopK: 3}, []int{1, 7, 2}},
		{"top-k 8", nil, nil, DrawParams{Temperature: 1, TopK: 8}, []int{1, 7, 2, 3, 4, 9, 0, 11}},
		{"top-k 5 top-p .9", nil, nil, DrawParams{Temperature: 1, TopK: 5, TopP: 0.9}, []int{1, 7, 2, 3, 4}},
		{"top-k 4 top-p .7", nil, nil, DrawParams{Temperature: 1, TopK: 4, TopP: 0.7}, []int{1, 7, 2, 3}},
		{"min-p .3", nil, nil, DrawParams{Temperature: 1, MinP: 0.3}, []int{1, 7, 2, 3, 4, 9}},
		{"min-p .3 top-p .6", nil, nil, DrawParams{Temperature: 1, MinP: 0.3, TopP: 0.6}, []int{1, 7, 2, 3}},
		{"T .7 top-p .9", nil, nil, DrawParams{Temperature: 0.7, TopP: 0.9}, []int{1, 7, 2, 3, 4, 9, 0}},
		{"T 1.3 top-k 6 top-p .9", nil, nil, DrawParams{Temperature: 1.3, TopK: 6, TopP: 0.9}, []int{1, 7, 2, 3, 4, 9}},
		{"T 1.3 min-p .12", nil, nil, DrawParams{Temperature: 1.3, MinP: 0.12}, []int{1, 7, 2, 3, 4, 9, 0, 11, 6, 5}},
		{"T 1.3 top-p .95", nil, nil, DrawParams{Temperature: 1.3, TopP: 0.95}, []int{1, 7, 2, 3, 4, 9, 0, 11, 6, 5}},
		// Without 1 and 7 the tied four lead: top-k 2 keeps the lower ids.
		{"mask top-k 2", notTop, []int32{7, 40}, DrawParams{Temperature: 1, TopK: 2}, []int{2, 3}},
		{"mask top-p .45 tie cut", notTop, []int32{7, -3}, DrawParams{Temperature: 1, TopP: 0.45}, []int{2, 3, 4}},
	} {
		kept, margin := specKept(kept12, tc.allowed, tc.exclude, tc.p)
		got := make([]int, 0, len(kept))
		for i := range kept {
			got = append(got, i)
		}
		slices.Sort(got)
		want := slices.Sorted(slices.Values(tc.want))
		if !slices.Equal(got, want) || margin < 1e-3 {
			t.Fatalf("%s: the case's kept set is %v (margin %.2g), want %v (margin ≥ 1e-3)", tc.name, got, margin, want)
		}
		const N = 200_000
		rng := rand.New(rand.NewPCG(5, 6))
		counts := make([]int, len(kept12))
		for range N {
			tok := DrawRow(kept12, tc.allowed, tc.exclude, tc.p, rng.Float64())
			if tok < 0 || int(tok) >= len(kept12) {
				t.Fatalf("%s: DrawRow = %d", tc.name, tok)
			}
			counts[tok]++
		}
		for i, c := range counts {
			q := kept[i]
			if q == 0 {
				if c != 0 {
					t.Errorf("%s: token %d drawn %d times, outside the kept set %v", tc.name, i, c, want)
				}
				continue
			}
			mean, sd := N*q, math.Sqrt(N*q*(1-q))
			if math.Abs(float64(c)-mean) > 5*sd+1 {
				t.Errorf("%s: token %d drawn %d times, want %.0f ± %.0f (5σ)", tc.name, i, c, mean, 5*sd)
			}
		}
	}
}

// hostKept is the host sampler's kept set for the masked row w (-Inf for
// forbidden tokens) and p: refKept (the reference of Sampler.kept, the
// sorted walk) mapped to token ids.
func hostKept(p Params, w []float32) map[int32]bool {
	r := newRefDrawer(p, w)
	k := map[int32]bool{}
	switch {
	case r.cand == nil:
		k[r.im] = true
	case r.plain:
		for _, c := range r.cand {
			k[c] = true
		}
	default:
		for _, j := range r.sel {
			k[r.cand[j]] = true
		}
	}
	return k
}

// TestDrawRowMatchesSampler: on random rows (logits on a grid, so with
// ties, and a mask), DrawRow's kept set is the host Sampler's: the test's
// enumeration equals refKept's set; DrawRow and Sampler.Sample never draw
// outside it, and both draw every kept token of probability ≥ 0.4%.
// With both top-k and top-p the definitions differ (Sampler takes top-p
// over the top-k mass, DrawRow over Z: TestDrawRowTopKTopP), so there the
// host's set must be a subset of DrawRow's, and the draws are checked
// against each one's own set.
func TestDrawRowMatchesSampler(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	params := []DrawParams{
		{Temperature: 1},
		{Temperature: 0.8, TopP: 0.83},
		{Temperature: 1.3, TopP: 0.61},
		{Temperature: 0.7, TopK: 7},
		{Temperature: 1, TopK: 40},
		{Temperature: 0.9, MinP: 0.07},
		{Temperature: 1.2, TopP: 0.77, MinP: 0.11},
		{Temperature: 1, TopK: 9, MinP: 0.2},
		{Temperature: 0.8, TopK: 12, TopP: 0.71},
		{Temperature: 1.1, TopK: 30, TopP: 0.57, MinP: 0.03},
	}
	const draws = 5000
	for it := range 40 {
		V := []int{20, 64, 130}[it%3]
		row := make([]float32, V)
		for i := range row {
			row[i] = float32(rng.IntN(40))/8 - 2.5
		}
		allowed := allowBits(V, func(int) bool { return rng.IntN(5) != 0 })
		exclude := []int32{int32(rng.IntN(V)), int32(V + 3)}
		w := make([]float32, V) // the row as the host sees it after a processor
		for i, v := range row {
			w[i] = v
			if allowed[i/64]>>(i%64)&1 == 0 || slices.Contains(exclude, int32(i)) {
				w[i] = ninf32
			}
		}
		for pi, dp := range params {
			hp := Params{Temperature: dp.Temperature, TopP: dp.TopP, TopK: int(dp.TopK), MinP: dp.MinP, Seed: uint64(100*it + pi + 1)}
			host := hostKept(hp, w)
			spec, margin := specKept(row, allowed, exclude, dp)
			if margin < 1e-6 {
				continue // a cut on its boundary: rounding decides
			}
			both := dp.TopK > 0 && dp.TopP > 0 && dp.TopP < 1
			for id := range host {
				if _, ok := spec[int(id)]; !ok {
					t.Fatalf("it %d %+v: host keeps %d, the definition does not", it, dp, id)
				}
			}
			if !both && len(spec) != len(host) {
				t.Fatalf("it %d %+v: kept sets differ: host %d tokens, definition %d", it, dp, len(host), len(spec))
			}
			s := New(hp, 0)
			dCount, hCount := map[int32]int{}, map[int32]int{}
			for range draws {
				tok := DrawRow(row, allowed, exclude, dp, rng.Float64())
				if _, ok := spec[int(tok)]; !ok || (!both && !host[tok]) {
					t.Fatalf("it %d %+v: DrawRow = %d, outside the kept set", it, dp, tok)
				}
				dCount[tok]++
				ht, _, err := s.Sample(w, nil, nil, nil)
				if err != nil || !host[ht] {
					t.Fatalf("it %d %+v: Sample = %d, %v: outside the host's kept set", it, dp, ht, err)
				}
				hCount[ht]++
			}
			hostSum := 0.0
			for id := range host {
				hostSum += spec[int(id)] // spec is normalised over its own set
			}
			for id, q := range spec {
				if q >= 0.004 && dCount[int32(id)] == 0 {
					t.Errorf("it %d %+v: DrawRow never drew %d (q %.3f)", it, dp, id, q)
				}
				if host[int32(id)] && q/hostSum >= 0.004 && hCount[int32(id)] == 0 {
					t.Errorf("it %d %+v: Sample never drew %d", it, dp, id)
				}
			}
		}
	}
}

// TestDrawRowTopKTopP documents where DrawRow's definition and Sampler
// differ: with both top-k and top-p, Sampler cuts top-p over the top-k
// mass, DrawRow over the whole Z. kept12, T = 1, top-k 4, top-p 0.7: the
// top 4 (1, 7, 2, 3) hold 0.63·Z; Sampler's nucleus is 0.7 of that (1, 7,
// 2), DrawRow's is 0.7·Z cut at 4 tokens (1, 7, 2, 3).
func TestDrawRowTopKTopP(t *testing.T) {
	dp := DrawParams{Temperature: 1, TopK: 4, TopP: 0.7}
	hp := Params{Temperature: 1, TopK: 4, TopP: 0.7, Seed: 9}
	host := hostKept(hp, kept12)
	if len(host) != 3 || !host[1] || !host[7] || !host[2] {
		t.Fatalf("host kept set %v, want {1, 7, 2}", host)
	}
	rng := rand.New(rand.NewPCG(7, 8))
	n3 := 0
	for range 2000 {
		if DrawRow(kept12, nil, nil, dp, rng.Float64()) == 3 {
			n3++
		}
	}
	if n3 == 0 { // q = 0.157
		t.Errorf("DrawRow never drew 3: its definition cuts top-p over Z, not the top-k mass")
	}
}

// TestDrawRowDeterminism: the same inputs give the same token;
// DrawUniform is u for round 0, in [0, 1), different for every round, and
// splitmix64's known outputs for u = 0.
func TestDrawRowDeterminism(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	row := make([]float32, 500)
	for i := range row {
		row[i] = float32(rng.NormFloat64() * 1.5)
	}
	p := DrawParams{Temperature: 0.8, TopP: 0.9, TopK: 100, MinP: 0.01}
	for range 200 {
		u := rng.Float64()
		a, b := DrawRow(row, nil, []int32{3}, p, u), DrawRow(row, nil, []int32{3}, p, u)
		if a != b {
			t.Fatalf("u %v: DrawRow = %d then %d", u, a, b)
		}
	}
	// splitmix64 seeded with 0: its first outputs are mix(k·γ), k = 1, 2.
	for _, g := range []struct {
		r    int
		bits uint64
	}{{1, 0xE220A8397B1DCDAF}, {2, 0x6E789E6AA1B965F4}} {
		if got, want := DrawUniform(0, g.r), float64(g.bits>>11)*0x1p-53; got != want {
			t.Errorf("DrawUniform(0, %d) = %v, want %v", g.r, got, want)
		}
	}
	for _, u := range []float64{0, 1e-300, 0.25, 0.5, 0.9, math.Nextafter(1, 0)} {
		if got := DrawUniform(u, 0); got != u {
			t.Errorf("DrawUniform(%v, 0) = %v", u, got)
		}
		seen := map[float64]int{u: 0}
		for r := 1; r < 64; r++ {
			v := DrawUniform(u, r)
			if !(v >= 0 && v < 1) {
				t.Errorf("DrawUniform(%v, %d) = %v, outside [0, 1)", u, r, v)
			}
			if r0, ok := seen[v]; ok {
				t.Errorf("DrawUniform(%v, %d) = DrawUniform(%v, %d) = %v", u, r, u, r0, v)
			}
			seen[v] = r
		}
	}
}

// BenchmarkDrawRow: one DrawRow call on a V = 6189 row with the couplet
// parameters (T 0.8, top-p 0.95): peaked (Zipf-like logits, a few tokens
// hold most of the mass) and flat (normal logits, σ 1.5: the nucleus is
// most of the vocabulary).
func BenchmarkDrawRow(b *testing.B) {
	const V, nrows = 6189, 16
	rng := rand.New(rand.NewPCG(3, 4))
	peaked := make([][]float32, nrows)
	flat := make([][]float32, nrows)
	for i := range nrows {
		peaked[i] = make([]float32, V)
		for r, tok := range rng.Perm(V) {
			peaked[i][tok] = float32(8 - 2.5*math.Log(1+float64(r)) + 0.1*rng.NormFloat64())
		}
		flat[i] = make([]float32, V)
		for tok := range flat[i] {
			flat[i][tok] = float32(1.5 * rng.NormFloat64())
		}
	}
	p := DrawParams{Temperature: 0.8, TopP: 0.95}
	for _, tc := range []struct {
		name string
		rows [][]float32
	}{{"peaked", peaked}, {"flat", flat}} {
		b.Run(tc.name, func(b *testing.B) {
			ur := rand.New(rand.NewPCG(1, 2))
			i := 0
			for b.Loop() {
				DrawRow(tc.rows[i%nrows], nil, nil, p, ur.Float64())
				i++
			}
		})
	}
}

// TestDrawRowRounds follows step 6 by hand on four equal logits whose
// nucleus is {0, 1} (top-p 0.5 reaches 0.5·Z exactly at token 1; top-k 2):
// S_r is {0, …, n−1}, round r picks floor(n·u_r) (running sums 1, 2, …),
// accepts it if it is 0 or 1 and otherwise shrinks S to the tokens below it.
func TestDrawRowRounds(t *testing.T) {
	row := []float32{-3, -3, -3, -3}
	rng := rand.New(rand.NewPCG(41, 42))
	for _, p := range []DrawParams{{Temperature: 1, TopP: 0.5}, {Temperature: 0.6, TopK: 2}, {Temperature: 2, TopK: 3, TopP: 0.5}} {
		rounds := 0
		for k := range 2000 {
			u := rng.Float64()
			if k == 0 {
				u = math.Nextafter(1, 0)
			}
			want := int32(-1)
			n := 4
			for r := 0; r < 64 && want < 0; r++ {
				j := min(int(float64(n)*DrawUniform(u, r)), n-1)
				if j < 2 {
					want = int32(j)
				} else {
					n = j
					rounds++
				}
			}
			if got := DrawRow(row, nil, nil, p, u); got != want {
				t.Fatalf("%+v u %v: DrawRow = %d, want %d", p, u, got, want)
			}
		}
		if rounds < 500 {
			t.Errorf("%+v: only %d rejections in 2000 draws", p, rounds)
		}
	}
}
