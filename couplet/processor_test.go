package couplet

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"

	"chunlian/model"
	"chunlian/sampler"
)

// procTables are the vocabularies the processor tests run on: the random
// test model's synthetic one and, when embedded, the shipped model's (6294
// ids, the service's case).
func procTables(tb testing.TB) map[string]*tables {
	out := map[string]*tables{"test": newFakeGen(tb, &fakeEngine{vocab: testModel.Tok.Size()}).t}
	if m, err := model.Default(); err == nil {
		g, err := New(m, &fakeEngine{vocab: m.Tok.Size()}, WithBannerSources())
		if err != nil {
			tb.Fatal(err)
		}
		out["default"] = g.t
	}
	return out
}

// rowKind is one way of filling a random logits row.
type rowKind int

const (
	rowNormal  rowKind = iota // finite N(0, 3²)
	rowSpecial                // finite, with -Inf, +Inf, NaNs (two payloads), ±0 sprinkled
	rowSparse                 // all -Inf or NaN except a few finite entries (dead ends)
	rowDead                   // all -Inf
	numRowKinds
)

// randRow returns a row of n entries of the given kind.
func randRow(rng *rand.Rand, n int, kind rowKind) []float32 {
	row := make([]float32, n)
	nan2 := math.Float32frombits(0x7fc00001)
	for i := range row {
		switch kind {
		case rowNormal:
			row[i] = float32(rng.NormFloat64() * 3)
		case rowSpecial:
			switch rng.IntN(12) {
			case 0:
				row[i] = negInf
			case 1:
				row[i] = float32(math.NaN())
			case 2:
				row[i] = nan2
			case 3:
				row[i] = float32(math.Inf(1))
			case 4:
				row[i] = float32(math.Copysign(0, -1))
			default:
				row[i] = float32(rng.NormFloat64() * 3)
			}
		case rowSparse, rowDead:
			row[i] = negInf
			if rng.IntN(8) == 0 {
				row[i] = float32(math.NaN())
			}
		}
	}
	if kind == rowSparse && n > 0 {
		for range rng.IntN(4) {
			row[rng.IntN(n)] = float32(rng.NormFloat64())
		}
	}
	return row
}

// sameRow reports the first index where a and b differ bitwise, or -1.
func sameRow(a, b []float32) int {
	if len(a) != len(b) {
		return 0
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i
		}
	}
	return -1
}

// randPlan returns a random plan for t: half from prepare (a valid
// request), half built directly (any template, heads and 上联 ids,
// including non-Han ones, which prepare would reject).
func randPlan(rng *rand.Rand, t *tables) *plan {
	modes := []Mode{ModeKeyword, ModeAcrostic, ModeLower}
	han := func() int32 { return t.han[rng.IntN(len(t.han))] }
	anyID := func() int32 { return int32(rng.IntN(len(t.class))) }
	if rng.IntN(2) == 0 {
		for {
			req := Request{Mode: modes[rng.IntN(3)], Length: MinLength + rng.IntN(t.maxChars-MinLength+1), Seed: 1}
			n := 2
			if req.Mode == ModeLower {
				n = req.Length
			}
			var rs []rune
			pool := t.han
			if rng.IntN(2) == 0 { // a small alphabet: repeated characters
				pool = t.han[:min(len(t.han), 6)]
			}
			for range n {
				rs = append(rs, t.char[pool[rng.IntN(len(pool))]])
			}
			if req.Mode == ModeLower && len(rs) > 7 {
				lay := Layout(len(rs))
				var withPunct []rune
				k := 0
				for _, r := range lay {
					if r != 0 {
						withPunct = append(withPunct, r)
					} else {
						withPunct = append(withPunct, rs[k])
						k++
					}
				}
				rs = withPunct
			}
			req.Text = string(rs)
			if p, err := t.prepare(req, DefaultTemperature); err == nil {
				return p
			}
		}
	}
	var punct []int32
	for id, c := range t.class {
		if c == classPunct {
			punct = append(punct, int32(id))
		}
	}
	L := 1 + rng.IntN(16)
	p := &plan{mode: modes[rng.IntN(3)], lineLen: L, template: make([]int32, L)}
	for j := range p.template {
		p.template[j] = -1
		if rng.IntN(5) == 0 && len(punct) > 0 {
			p.template[j] = punct[rng.IntN(len(punct))]
		}
	}
	pick := func() int32 {
		if rng.IntN(4) == 0 {
			return anyID()
		}
		return han()
	}
	p.heads = [2]int32{pick(), pick()}
	if p.mode == ModeLower {
		small := rng.IntN(2) == 0
		for j := range L {
			id := pick()
			if small {
				id = t.han[rng.IntN(min(len(t.han), 4))]
			}
			if p.template[j] != -1 {
				id = p.template[j]
			}
			p.upper = append(p.upper, id)
		}
	}
	return p
}

// TestAppendEchoes: a 上联 slot may repeat only the character right
// before it, and only if that one is not itself a repeat.
func TestAppendEchoes(t *testing.T) {
	for _, tc := range []struct {
		gen  []int32
		want []int32
	}{
		{nil, nil},
		{[]int32{1}, nil},              // 1 may follow itself (叠字)
		{[]int32{1, 2}, []int32{1}},    // 2 may double, 1 may not come back
		{[]int32{1, 1}, []int32{1, 1}}, // no third 1
		{[]int32{1, 2, 3}, []int32{1, 2}},
		{[]int32{1, 2, 2}, []int32{1, 2, 2}},
	} {
		got := appendEchoes(nil, tc.gen, len(tc.gen))
		for _, id := range tc.want {
			if !slices.Contains(got, id) {
				t.Errorf("after %v: %d not excluded (%v)", tc.gen, id, got)
			}
		}
		for _, id := range got {
			if !slices.Contains(tc.want, id) {
				t.Errorf("after %v: %d excluded (%v)", tc.gen, id, got)
			}
		}
		for id := int32(0); id < 5; id++ {
			if refEcho(tc.gen, len(tc.gen), id) != slices.Contains(got, id) {
				t.Errorf("after %v: refEcho(%d) disagrees with %v", tc.gen, id, got)
			}
		}
	}
}

// TestProcessorEquivalence: the set-based processors leave exactly the
// rows the old per-token loop left (bitwise, NaN payloads included) and
// return the same errors, for random plans of every mode, random histories
// (mostly following the rules, sometimes not) and random rows of every
// kind and of the vocabulary's width or narrower or wider.
func TestProcessorEquivalence(t *testing.T) {
	for name, tb := range procTables(t) {
		// The shipped vocabulary is 15× the test one: fewer plans there.
		plans := map[string]int{"test": 200, "default": 40}[name]
		if testing.Short() {
			plans /= 5
		}
		t.Run(name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(11, uint64(len(tb.class))))
			V := len(tb.class)
			forcedSteps := 0 // check calls where Forced forced
			maskSteps := 0   // rows checked against Mask
			widths := []int{V, V - 1 - rng.IntN(V/2), V + 1 + rng.IntN(9)}
			// A pool of rows per width and kind, drawn once.
			pool := make([][numRowKinds][][]float32, len(widths))
			for w, n := range widths {
				for kind := range numRowKinds {
					for range 6 {
						pool[w][kind] = append(pool[w][kind], randRow(rng, n, kind))
					}
				}
			}
			// check runs both processors on rows of every kind at the
			// vocabulary's width and on one other random row, and returns
			// the ids allowed on a normal full-width row.
			check := func(what string, gen []int32, newP, oldP sampler.LogitsProcessor) (allowed []int32) {
				t.Helper()
				type variant struct{ w, kind int }
				vs := []variant{{1 + rng.IntN(len(widths)-1), rng.IntN(int(numRowKinds))}}
				for kind := range int(numRowKinds) {
					vs = append(vs, variant{0, kind})
				}
				for _, v := range vs {
					rows := pool[v.w][v.kind]
					row := rows[rng.IntN(len(rows))]
					want := append([]float32(nil), row...)
					wantErr := oldP.Process(gen, want)
					got := append([]float32(nil), row...)
					gotErr := newP.Process(gen, got)
					if gotErr != wantErr || (gotErr != nil && !errors.Is(gotErr, sampler.ErrDeadEnd)) {
						t.Fatalf("%s gen=%v width %d kind %d: err %v, want %v", what, gen, len(row), v.kind, gotErr, wantErr)
					}
					if i := sameRow(got, want); i >= 0 {
						t.Fatalf("%s gen=%v width %d kind %d: row[%d] = %v, want %v", what, gen, len(row), v.kind, i, got[i], want[i])
					}
					// Forced must name exactly the steps the old code
					// forces: sampler.Force(its id) leaves the old row and error;
					// where it says nothing, a normal row keeps more than
					// one token (on these vocabularies no restriction
					// leaves a single one).
					id, forced := newP.(sampler.Forcer).Forced(gen, row)
					if forced {
						f := append([]float32(nil), row...)
						if err := sampler.Force(f, id); err != wantErr || sameRow(f, want) >= 0 {
							t.Fatalf("%s gen=%v width %d kind %d: Forced says %d, but force gives err %v (want %v), row differs at %d", what, gen, len(row), v.kind, id, err, wantErr, sameRow(f, want))
						}
						forcedSteps++
					} else if rowKind(v.kind) == rowNormal && len(row) >= V && wantErr == nil {
						n := 0
						for _, x := range want {
							if x > negInf {
								n++
							}
						}
						if n == 1 {
							t.Fatalf("%s gen=%v: the old code forces one token, Forced says nothing", what, gen)
						}
					}
					// Mask (the device draw's description of the step) must
					// give the old row and error on every full-width row.
					if mk, ok := newP.(sampler.Masker); ok && v.w == 0 {
						var m sampler.Mask
						if !mk.Mask(gen, &m) {
							t.Fatalf("%s gen=%v: Mask declines a step", what, gen)
						}
						f := append([]float32(nil), row...)
						err := m.Apply(f)
						if (err == nil) != (wantErr == nil) {
							t.Fatalf("%s gen=%v kind %d: Mask %+v gives err %v, want %v", what, gen, v.kind, m, err, wantErr)
						}
						if i := sameRow(f, want); err == nil && i >= 0 {
							t.Fatalf("%s gen=%v kind %d: Mask %+v: row[%d] = %v, want %v", what, gen, v.kind, m, i, f[i], want[i])
						}
						maskSteps++
					}
					if v.w == 0 && rowKind(v.kind) == rowNormal && wantErr == nil {
						for i, x := range want {
							if x > negInf {
								allowed = append(allowed, int32(i))
							}
						}
					}
				}
				return allowed
			}
			var steps, deadEnds int
			for pi := range plans {
				p := randPlan(rng, tb)
				c := newConstraint(tb, p, rng.IntN(2) == 0)
				what := fmt.Sprintf("plan %d (%s, L=%d, heads %v, template %v, upper %v)", pi, p.mode, p.lineLen, p.heads, p.template, p.upper)
				var gen []int32
				for len(gen) <= c.genLen()+1 {
					allowed := check(what, gen, c, refProc{c})
					steps++
					next := int32(rng.IntN(V))
					switch {
					case len(allowed) > 0 && rng.IntN(10) != 0:
						next = allowed[rng.IntN(len(allowed))]
					case len(allowed) == 0:
						deadEnds++
					}
					gen = append(gen, next)
				}
			}
			for range plans {
				var gen []int32
				for range 7 {
					check("banner", gen, bannerProc{tb}, refBanner{tb})
					gen = append(gen, tb.han[rng.IntN(len(tb.han))])
				}
			}
			t.Logf("%d plans, %d steps (%d with nothing allowed on a normal row), %d rows forced", plans, steps, deadEnds, forcedSteps)
			if forcedSteps == 0 {
				t.Fatal("no step was forced")
			}
			if maskSteps == 0 {
				t.Fatal("no row was checked against Mask")
			}
		})
	}
}

// TestForce: force's cases, including the row left untouched on a dead end.
func TestForce(t *testing.T) {
	nan := float32(math.NaN())
	for _, tc := range []struct {
		row  []float32
		id   int32
		dead bool
	}{
		{[]float32{1, 2, 3}, 1, false},
		{[]float32{1, 2, 3}, 0, false},
		{[]float32{1, 2, 3}, 2, false},
		{[]float32{5}, 0, false},
		{[]float32{1, float32(math.Inf(1)), 3}, 1, false},
		{[]float32{1, 2, 3}, 3, true},
		{[]float32{1, 2, 3}, -1, true},
		{[]float32{}, 0, true},
		{[]float32{1, negInf, 3}, 1, true},
		{[]float32{1, nan, 3}, 1, true},
		{make([]float32, 1000), 999, false},
		{make([]float32, 1025), 0, false},
	} {
		got := append([]float32(nil), tc.row...)
		want := append([]float32(nil), tc.row...)
		err, wantErr := sampler.Force(got, tc.id), refForce(want, tc.id)
		if (err != nil) != tc.dead || err != wantErr {
			t.Errorf("sampler.Force(%v, %d) = %v, want dead end %v (old: %v)", tc.row, tc.id, err, tc.dead, wantErr)
		}
		if i := sameRow(got, want); i >= 0 {
			t.Errorf("sampler.Force(%v, %d): row[%d] = %v, want %v", tc.row, tc.id, i, got[i], want[i])
		}
	}
}

// benchConstraint is the setting of the per-row benchmarks: the shipped
// model's tables (the test model's without it), the plan of the service's
// default request (keyword 平安, seed 1) and its constraint.
func benchConstraint(b *testing.B) (*tables, *plan, *constraint) {
	tbs := procTables(b)
	tb := tbs["default"]
	if tb == nil {
		tb = tbs["test"]
	}
	p, err := tb.prepare(Request{Text: "平安", Seed: 1}, DefaultTemperature)
	if err != nil {
		b.Fatal(err)
	}
	return tb, p, newConstraint(tb, p)
}

// BenchmarkProcessRow is the cost of one processor call on one row of the
// shipped vocabulary (the test one without it), old (processor_ref_test.go)
// against new in the same run, per step kind of the service's default
// request (keyword 平安, 7 characters): "upper" cycles through the 上联's
// slots, "lower" through the 下联's, "banner" through the 横批 request's
// four free slots, "force" is a forced step (<sep>). Each op copies a
// fresh row first, as the sampler does (the "copy" case is that alone).
func BenchmarkProcessRow(b *testing.B) {
	tb, p, c := benchConstraint(b)
	rng := rand.New(rand.NewPCG(3, 4))
	V := len(tb.class)
	row := randRow(rng, V, rowNormal)
	// One rule-abiding history: the 上联, <sep>, the 下联.
	var gen []int32
	for len(gen) < c.linesLen() {
		w := append([]float32(nil), randRow(rng, V, rowNormal)...)
		if err := c.Process(gen, w); err != nil {
			b.Fatal(err)
		}
		var ok []int32
		for i, v := range w {
			if v > negInf {
				ok = append(ok, int32(i))
			}
		}
		gen = append(gen, ok[rng.IntN(len(ok))])
	}
	L := p.lineLen
	var upperPos, lowerPos, bannerPos [][]int32 // histories of each kind
	for j := 0; j < L; j++ {
		upperPos = append(upperPos, gen[:j])
		lowerPos = append(lowerPos, gen[:L+1+j])
	}
	for j := 0; j < 4; j++ {
		bannerPos = append(bannerPos, tb.han[:j])
	}
	w := make([]float32, V)
	run := func(name string, hists [][]int32, old, cur sampler.LogitsProcessor) {
		for _, impl := range []struct {
			name string
			p    sampler.LogitsProcessor
		}{{"old", old}, {"new", cur}} {
			b.Run(name+"/"+impl.name, func(b *testing.B) {
				i := 0
				for b.Loop() {
					copy(w, row)
					if err := impl.p.Process(hists[i], w); err != nil {
						b.Fatal(err)
					}
					if i++; i == len(hists) {
						i = 0
					}
				}
			})
		}
	}
	run("upper", upperPos, refProc{c}, c)
	run("lower", lowerPos, refProc{c}, c)
	run("banner", bannerPos, refBanner{tb}, bannerProc{tb})
	run("force", [][]int32{gen[:L]}, refProc{c}, c)
	b.Run("copy", func(b *testing.B) {
		for b.Loop() {
			copy(w, row)
		}
	})
}

// BenchmarkSampleRow is one sampler call (the service's defaults:
// temperature 0.8, top-p 0.95, the row's log-sum-exp known, or not: /nolse) on a row the
// processors restrict to the Han characters ("han", a 横批 slot) or force
// to one token ("forced", <sep>, through sampler.Forcer; "forced-full" with
// Forced hidden: the sampler copies the row, runs Process' force and scans
// the row; "forced-old" likewise with the old force).
func BenchmarkSampleRow(b *testing.B) {
	tb, p, c := benchConstraint(b)
	rng := rand.New(rand.NewPCG(3, 4))
	row := randRow(rng, len(tb.class), rowNormal)
	lse := sampler.LogSumExp(row)
	upper := make([]int32, p.lineLen)
	for i := range upper {
		upper[i] = tb.han[i]
	}
	for _, tc := range []struct {
		name string
		gen  []int32
		proc sampler.LogitsProcessor
		lse  float64
	}{
		{"han", nil, bannerProc{tb}, lse},
		{"forced", upper, c, lse},
		{"forced-full", upper, processOnly{c}, lse},
		{"forced-old", upper, refProc{c}, lse},
		// The LSE left to the sampler (CPU backend, one sample per row).
		{"han/nolse", nil, bannerProc{tb}, math.NaN()},
		{"forced/nolse", upper, c, math.NaN()},
		{"forced-full/nolse", upper, processOnly{c}, math.NaN()},
	} {
		b.Run(tc.name, func(b *testing.B) {
			s := sampler.New(sampler.Params{Temperature: DefaultTemperature, TopP: DefaultTopP, Seed: 1}, 0)
			sc := sampler.NewScratch()
			for b.Loop() {
				if _, _, err := s.SampleWith(sc, row, tc.lse, nil, tc.gen, tc.proc); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// rowCounter runs after a sample's own processor and counts the rows it
// sees and those left with exactly one entry above -Inf (forced).
type rowCounter struct{ rows, forced *atomic.Int64 }

func (c rowCounter) Process(_ []int32, logits []float32) error {
	n := 0
	for _, v := range logits {
		if v > negInf {
			n++
		}
	}
	c.rows.Add(1)
	if n == 1 {
		c.forced.Add(1)
	}
	return nil
}

// BenchmarkDefaultRowKinds reports how many rows the sampler draws from per
// couplet with the service's defaults (one sample per couplet, 横批
// ranking) and how many of them the processors force to one token (the
// forced 横批 samples, the keyword's second character, <sep>, mirrored
// repetitions): the rows a forced-token fast path in the sampler would
// skip.
func BenchmarkDefaultRowKinds(b *testing.B) {
	m := defaultModel(b)
	var rows, forced atomic.Int64
	g, err := New(m, extraProc{realStack(b, m), rowCounter{&rows, &forced}}, WithOversample(1), WithBannerSources(testBannerSources()...))
	if err != nil {
		b.Fatal(err)
	}
	words := []string{"平安", "富贵", "吉祥", "如意", "福寿", "康宁", "兴旺", "团圆", "和顺", "安康"}
	n := 0
	for b.Loop() {
		if _, err := g.Generate(context.Background(), Request{Text: words[n%len(words)], Seed: uint64(n + 1)}); err != nil {
			b.Fatal(err)
		}
		n++
	}
	b.ReportMetric(float64(rows.Load())/float64(n), "rows/couplet")
	b.ReportMetric(float64(forced.Load())/float64(n), "forced-rows/couplet")
}
