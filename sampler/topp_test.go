package sampler

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"chunlian/kernels/cpu"
)

// sortByProb sorts token ids by probability, descending, ties by id: the
// reference order (the comparison sort draw used before sortPrefix).
func sortByProb(k []int32, probs []float32) []int32 {
	slices.SortFunc(k, func(a, b int32) int {
		if probs[a] != probs[b] {
			if probs[a] > probs[b] {
				return -1
			}
			return 1
		}
		return int(a - b)
	})
	return k
}

// refKept is the reference of Sampler.kept: every candidate sorted by
// sortByProb, then top-k, top-p (a sequential sum in sorted order) and
// min-p, as draw did before the bucketed sort.
func refKept(p Params, probs []float32, total float64) []int32 {
	n := len(probs)
	useK := p.TopK > 0 && p.TopK < n
	topP := float64(p.TopP)
	useP := topP > 0 && topP < 1
	sel := make([]int32, n)
	for i := range sel {
		sel[i] = int32(i)
	}
	if useK || useP {
		sortByProb(sel, probs)
		if useK {
			sel = sel[:p.TopK]
		}
		if useP {
			kept := total
			if useK {
				kept = 0
				for _, j := range sel {
					kept += float64(probs[j])
				}
			}
			var cum float64
			for i, j := range sel {
				cum += float64(probs[j])
				if cum >= topP*kept {
					sel = sel[:i+1]
					break
				}
			}
		}
	}
	if p.MinP > 0 {
		k := sel[:0]
		for _, j := range sel {
			if probs[j] >= p.MinP {
				k = append(k, j)
			}
		}
		sel = k
	}
	return sel
}

// refDrawer is draw with refKept for one row and Params, prepared once:
// the token reference for a seeded stream.
type refDrawer struct {
	cand   []int32
	probs  []float32
	total  float64 // the candidates' ExpSum
	sel    []int32 // refKept
	kTotal float64 // draw's total over sel
	plain  bool    // no filter: draw picks over every candidate
	im     int32   // the max token, when no probability is finite
}

func newRefDrawer(p Params, w []float32) *refDrawer {
	m, im, _ := scanMax(w)
	T := p.Temperature
	invT := float32(1)
	if T != 1 {
		invT = 1 / T
	}
	thr := m + negligible*T
	if !(thr < m) {
		thr = math.Nextafter32(m, float32(math.Inf(-1)))
	}
	cand := make([]int32, len(w))
	vals := make([]float32, len(w))
	n := cpu.CompactGreaterVals(cand, vals, w, thr)
	r := &refDrawer{cand: cand[:n], probs: make([]float32, n), im: int32(im)}
	r.total = cpu.ExpSum(r.probs, vals[:n], invT, m*invT)
	if n == 0 || !(r.total >= 1) {
		r.cand = nil
		return r
	}
	useK := p.TopK > 0 && p.TopK < n
	useP := p.TopP > 0 && p.TopP < 1
	if !useK && !useP && !(p.MinP > 0) {
		r.plain = true
		return r
	}
	r.sel = refKept(p, r.probs, r.total)
	r.kTotal = r.total
	if len(r.sel) != n {
		r.kTotal = cpu.SumAt(r.probs, r.sel)
	}
	return r
}

func (r *refDrawer) draw(rng *rand.Rand) int32 {
	switch {
	case r.cand == nil:
		return r.im
	case r.plain:
		return r.cand[pick(r.probs, rng.Float64()*r.total)]
	}
	u := rng.Float64() * r.kTotal
	for _, j := range r.sel {
		u -= float64(r.probs[j])
		if u < 0 {
			return r.cand[j]
		}
	}
	return r.cand[r.sel[len(r.sel)-1]]
}

// keptRows are the rows of the kept-set tests (V = 6294): flat (every
// token within a narrow band), smooth (sin), Zipf-like, peaked (a few
// tokens hold most of the mass), tied (five distinct logits), all equal,
// a steep ramp, and a row with only a few tokens above -Inf.
func keptRows() map[string][]float32 {
	const V = 6294
	rng := rand.New(rand.NewPCG(11, 12))
	rows := map[string][]float32{}
	mk := func(name string, f func(i int) float32) {
		r := make([]float32, V)
		for i := range r {
			r[i] = f(i)
		}
		rows[name] = r
	}
	mk("flat", func(int) float32 { return float32(rng.NormFloat64() * 0.5) })
	mk("flat-wide", func(int) float32 { return float32(rng.NormFloat64() * 2) })
	mk("sin", func(i int) float32 { return float32(math.Sin(float64(i)*0.37)) * 4 })
	perm := rng.Perm(V)
	mk("zipf", func(i int) float32 {
		return float32(8 - 2.5*math.Log(1+float64(perm[i])) + 0.1*rng.NormFloat64())
	})
	mk("peaked", func(i int) float32 {
		if i%1000 == 7 {
			return 12 + float32(i%3)
		}
		return float32(rng.NormFloat64())
	})
	mk("tied", func(i int) float32 { return float32(i % 5) })
	mk("equal", func(int) float32 { return 1.5 })
	mk("steep", func(i int) float32 { return float32(-i) * 0.01 })
	mk("few", func(i int) float32 {
		if i%700 == 3 {
			return float32(i % 4)
		}
		return float32(math.Inf(-1))
	})
	// Wide: half the vocabulary tied at the top, the rest spread over 20
	// nats below: with top-p ≈ 1 the nucleus reaches probabilities too
	// small for drawBucketed's exact sums (it falls back to sorting).
	mk("wide", func(i int) float32 {
		if i%2 == 0 {
			return 0
		}
		return -20 * float32(i) / V
	})
	// Flat with ties: many tokens share each of 50 levels.
	mk("flat-tied", func(int) float32 { return float32(rng.IntN(50)) * 0.02 })
	return rows
}

// keptParams are the filter settings of the kept-set tests: top-p alone,
// top-k alone, both, min-p, and min-p with top-p.
var keptParams = []Params{
	{TopP: 0.3}, {TopP: 0.9}, {TopP: 0.95}, {TopP: 0.999}, {TopP: 0.99999}, {TopP: 0.9999999},
	{TopK: 1}, {TopK: 5}, {TopK: 50}, {TopK: 900}, {TopK: 5000}, {TopK: 6293},
	{TopK: 50, TopP: 0.9}, {TopK: 900, TopP: 0.95}, {TopK: 3, TopP: 0.5},
	{MinP: 0.05}, {MinP: 0.05, TopP: 0.95}, {MinP: 0.5, TopK: 50},
}

// TestKeptMatchesFullSort: on every row, temperature and filter setting,
// Sampler.kept returns exactly refKept's positions in the same order, so
// the kept tokens, their probabilities, the draw's total and walk are
// those of a full sort of the candidates; also with presort's threshold
// fast path disabled (only sortPrefix).
func TestKeptMatchesFullSort(t *testing.T) {
	levels := presortLevels
	defer func() { presortLevels = levels }()
	for name, row := range keptRows() {
		for _, T := range []float32{0.5, 0.8, 1, 1.5, 3} {
			m, _, _ := scanMax(row)
			cand := make([]int32, len(row))
			vals := make([]float32, len(row))
			n := cpu.CompactGreaterVals(cand, vals, row, m+negligible*T)
			probs := make([]float32, n)
			total := cpu.ExpSum(probs, vals[:n], 1/T, m*(1/T))
			for _, p := range keptParams {
				p.Temperature = T
				want := refKept(p, probs, total)
				for _, fast := range []bool{true, false} {
					presortLevels = levels
					if !fast {
						presortLevels = [len(levels)]float32{2, 2} // never enough
					}
					sc := NewScratch()
					sc.grow(len(row))
					got := New(p, 0).kept(sc, probs, total)
					if !slices.Equal(got, want) {
						t.Errorf("%s T=%v %+v fast=%v: kept %d tokens, want %d (first difference at %d)",
							name, T, p, fast, len(got), len(want), firstDiff(got, want))
					}
				}
			}
		}
	}
}

func firstDiff(a, b []int32) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestDrawMatchesFullSort: seeded draws through SampleWith give the same
// tokens as refDraw (the full-sort draw) with the same random stream, on
// every row and filter setting, through drawBucketed (counted by its
// hook) or the sorted path; both paths must be taken where expected.
func TestDrawMatchesFullSort(t *testing.T) {
	var bucketed int
	testHookBucketed = func() { bucketed++ }
	defer func() { testHookBucketed = nil }()
	for name, row := range keptRows() {
		for _, T := range []float32{0.8, 1} {
			for _, p := range keptParams {
				p.Temperature = T
				p.Seed = 7
				s := New(p, 0)
				rng := rand.New(rand.NewPCG(7, 0))
				ref := newRefDrawer(p, row)
				sc := NewScratch()
				bucketed = 0
				const draws = 200
				for i := range draws {
					got, _, err := s.SampleWith(sc, row, math.NaN(), nil, nil, nil)
					if err != nil {
						t.Fatal(err)
					}
					if want := ref.draw(rng); got != want {
						t.Fatalf("%s T=%v %+v draw %d: token %d, full sort gives %d", name, T, p, i, got, want)
					}
				}
				switch {
				case name == "flat" && p.TopP == 0.95 && p.TopK == 0 && p.MinP == 0 || name == "sin" && p.TopK == 900 && p.TopP == 0:
					if bucketed != draws {
						t.Errorf("%s T=%v %+v: %d of %d draws bucketed, want all", name, T, p, bucketed, draws)
					}
				case name == "wide" && p.TopP == 0.9999999 && T == 1 || p.MinP > 0 || p.TopK > 0 && p.TopP > 0:
					if bucketed != 0 {
						t.Errorf("%s T=%v %+v: %d draws bucketed, want none", name, T, p, bucketed)
					}
				}
			}
		}
	}
}

// TestSortPrefix checks sortPrefix against sortByProb on its own: random
// probabilities with many ties and zeros, ids in any order, every size
// around its thresholds, k and mass bounds.
func TestSortPrefix(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int{0, 1, 2, 3, sortSmall - 1, sortSmall, sortSmall + 1, 100, 257, 1000, 6294} {
		for _, kind := range []string{"uniform", "log", "ties", "one", "zeros"} {
			V := 6294
			probs := make([]float32, V)
			for i := range probs {
				switch kind {
				case "uniform":
					probs[i] = rng.Float32()
				case "log":
					probs[i] = float32(math.Exp(-24 * rng.Float64()))
				case "ties":
					probs[i] = float32(rng.IntN(4)) / 3
				case "one":
					probs[i] = 0.25
				case "zeros":
					if rng.IntN(3) == 0 {
						probs[i] = rng.Float32()
					}
				}
			}
			cand := make([]int32, n)
			for i, t := range rng.Perm(V)[:n] {
				cand[i] = int32(t)
			}
			ref := sortByProb(slices.Clone(cand), probs)
			var all float64
			for _, t := range cand {
				all += float64(probs[t])
			}
			for _, tc := range []struct {
				k    int
				mass float64
			}{{0, math.Inf(1)}, {1, math.Inf(1)}, {n / 2, math.Inf(1)}, {n, math.Inf(1)}, {0, 0.5 * all}, {0, 0.99 * all}, {0, 2 * all}} {
				sc := NewScratch()
				sc.grow(V)
				got := sc.sortPrefix(slices.Clone(cand), probs, tc.k, tc.mass)
				name := fmt.Sprintf("n=%d %s k=%d mass=%v", n, kind, tc.k, tc.mass)
				if len(got) > len(ref) || !slices.Equal(got, ref[:len(got)]) {
					t.Fatalf("%s: not a prefix of the sorted candidates (%d of %d)", name, len(got), len(ref))
				}
				if len(got) < min(tc.k, n) {
					t.Fatalf("%s: %d < k", name, len(got))
				}
				var mass float64
				for _, t := range got {
					mass += float64(probs[t])
				}
				if !math.IsInf(tc.mass, 1) && len(got) < n && mass < tc.mass {
					t.Fatalf("%s: mass %v < %v with tokens left", name, mass, tc.mass)
				}
			}
		}
	}
}
