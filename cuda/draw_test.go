package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"chunlian/forward"
	"chunlian/model"
	"chunlian/sampler"
)

// TestPackDraws checks the draw specs' device layout and the validation
// ForwardDraw runs before any CUDA call (no GPU needed).
func TestPackDraws(t *testing.T) {
	const R, V, nMasks = 3, 100, 2
	u := 0.7234567890123
	draws := []forward.Draw{
		{Row: 2, Force: -1, Mask: 1, Exclude: []int32{5, -3, 200}, Temperature: 0.8, TopP: 0.95, MinP: 0.05, TopK: 50, U: u},
		{Row: 0, Force: 99, Mask: -1},
		{Row: 1, Force: -1, Mask: -1, Exclude: []int32{7}, Temperature: 0, U: math.NaN()}, // greedy: U unused
	}
	prefix := []int32{-9, -9} // packDraws appends after what dst holds
	got, err := packDraws(prefix, draws, []int32{2, 0, 2}, R, V, nMasks)
	if err != nil {
		t.Fatal(err)
	}
	ub := math.Float64bits(u)
	f := func(x float32) int32 { return int32(math.Float32bits(x)) }
	want := []int32{-9, -9,
		2, -1, 1, f(0.8), f(0.95), f(0.05), 50, int32(uint32(ub)), int32(uint32(ub >> 32)), 0, 3,
		0, 99, -1, 0, 0, 0, 0, 0, 0, 3, 0,
		1, -1, -1, 0, 0, 0, 0, int32(uint32(math.Float64bits(math.NaN()))), int32(uint32(math.Float64bits(math.NaN()) >> 32)), 3, 1,
		2, 0, 2, // host rows
		5, -3, 200, 7, // exclude lists
	}
	if !slices.Equal(got, want) {
		t.Fatalf("packed\n%v\nwant\n%v", got, want)
	}
	if h := math.Float64frombits(uint64(uint32(got[2+7])) | uint64(uint32(got[2+8]))<<32); h != u {
		t.Errorf("U round trip %v, want %v", h, u)
	}

	ok := forward.Draw{Row: 1, Force: -1, Mask: -1, Temperature: 1, U: 0.5}
	long := make([]int32, forward.MaxDrawExclude+1)
	for name, tc := range map[string]struct {
		d    func(d *forward.Draw)
		host []int32
	}{
		"row -1":           {d: func(d *forward.Draw) { d.Row = -1 }},
		"row R":            {d: func(d *forward.Draw) { d.Row = R }},
		"force V":          {d: func(d *forward.Draw) { d.Force = V }},
		"mask -2":          {d: func(d *forward.Draw) { d.Mask = -2 }},
		"mask nMasks":      {d: func(d *forward.Draw) { d.Mask = nMasks }},
		"exclude too long": {d: func(d *forward.Draw) { d.Exclude = long }},
		"U 1":              {d: func(d *forward.Draw) { d.U = 1 }},
		"U negative":       {d: func(d *forward.Draw) { d.U = -0.1 }},
		"U NaN":            {d: func(d *forward.Draw) { d.U = math.NaN() }},
		"temperature < 0":  {d: func(d *forward.Draw) { d.Temperature = -1 }},
		"temperature NaN":  {d: func(d *forward.Draw) { d.Temperature = float32(math.NaN()) }},
		"top-p NaN":        {d: func(d *forward.Draw) { d.TopP = float32(math.NaN()) }},
		"min-p > 1":        {d: func(d *forward.Draw) { d.MinP = 1.5 }},
		"host row R":       {host: []int32{0, R}},
		"host row -1":      {host: []int32{-1}},
	} {
		d := ok
		if tc.d != nil {
			tc.d(&d)
		}
		if _, err := packDraws(nil, []forward.Draw{ok, d}, tc.host, R, V, nMasks); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// Valid corner cases: a forced draw ignores the sampling parameters,
	// exactly MaxDrawExclude exclusions, U just below 1, min-p 1.
	for name, d := range map[string]forward.Draw{
		"forced, odd params": {Row: 0, Force: 0, Mask: -1, Temperature: -1, U: 7},
		"max exclude":        {Row: 0, Force: -1, Mask: 0, Exclude: long[:forward.MaxDrawExclude], Temperature: 1, U: 0.5},
		"U max":              {Row: 2, Force: -1, Mask: -1, Temperature: 1, U: math.Nextafter(1, 0)},
		"min-p 1":            {Row: 2, Force: -1, Mask: -1, Temperature: 1, MinP: 1, U: 0},
	} {
		if _, err := packDraws(nil, []forward.Draw{d}, nil, R, V, nMasks); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	for _, tc := range []struct {
		rows []int32
		want bool
	}{{nil, true}, {[]int32{0}, true}, {[]int32{0, 1, 2}, true}, {[]int32{1}, false}, {[]int32{0, 2}, false}, {[]int32{0, 0}, false}} {
		if got := isPrefix(tc.rows); got != tc.want {
			t.Errorf("isPrefix(%v) = %v", tc.rows, got)
		}
	}
	if drawShmOK(6189) != true || drawShmOK(12032) != true || drawShmOK(12033) || drawShmOK(0) {
		t.Error("drawShmOK limits")
	}
}

// TestDrawConstantsMatchKernels keeps the Go launch constants and
// kernels/draw.cu's macros in step.
func TestDrawConstantsMatchKernels(t *testing.T) {
	for _, want := range []string{
		fmt.Sprintf("#define DRAW_THREADS %d\n", drawThreads),
		fmt.Sprintf("#define DRAW_WORDS %d\n", drawWords),
	} {
		if !strings.Contains(drawSource, want) {
			t.Errorf("kernels/draw.cu lacks %q", strings.TrimSpace(want))
		}
	}
}

// drawTestMasks are the allowed sets registered on the device for the
// draw tests: dense and sparse random sets, three tokens, a short slice
// (the tokens past it are not allowed), nothing (every draw a dead end),
// and a slice longer than the vocabulary's words (extra words ignored).
func drawTestMasks(V int, r *rand.Rand) [][]uint64 {
	W := (V + 63) / 64
	dense, sparse, few, short, none, long := make([]uint64, W), make([]uint64, W), make([]uint64, W), make([]uint64, W/2), make([]uint64, W), make([]uint64, W+3)
	for i := range W {
		dense[i] = r.Uint64()
		sparse[i] = r.Uint64() & r.Uint64() & r.Uint64() & r.Uint64()
	}
	for range 3 {
		t := r.IntN(V)
		few[t/64] |= 1 << (t % 64)
	}
	for i := range short {
		short[i] = ^uint64(0)
	}
	for i := range long {
		long[i] = ^uint64(0)
	}
	return [][]uint64{dense, sparse, few, short, none, long}
}

func allowedBy(mask []uint64, t int32) bool {
	return mask == nil || (int(t/64) < len(mask) && mask[t/64]>>(t%64)&1 == 1)
}

// makeDraws builds n draws per logits row of ref ([R, V]) over the
// parameter grid the engine uses: greedy, T 0.8/1/1.3, top-p 0.95/0.5,
// top-k 5/50, min-p 0.05, registered masks, exclude lists holding the
// row's best tokens, and forced tokens (the row's argmax, random ones).
func makeDraws(r *rand.Rand, ref []float32, V, perRow, nMasks int) []forward.Draw {
	R := len(ref) / V
	var ds []forward.Draw
	Ts := []float32{0, 0.8, 1, 1.3}
	Ps := []float32{0, 0.95, 0.5}
	Ks := []int32{0, 5, 50}
	Ms := []float32{0, 0.05}
	for row := range R {
		x := ref[row*V : (row+1)*V]
		order := make([]int32, V)
		for i := range order {
			order[i] = int32(i)
		}
		slices.SortStableFunc(order, func(a, b int32) int {
			switch {
			case x[a] > x[b]:
				return -1
			case x[a] < x[b]:
				return 1
			}
			return 0
		})
		for k := 0; k < perRow; k++ {
			d := forward.Draw{Row: int32(row), Force: -1, Mask: -1,
				Temperature: Ts[r.IntN(len(Ts))], TopP: Ps[r.IntN(len(Ps))], TopK: Ks[r.IntN(len(Ks))], MinP: Ms[r.IntN(len(Ms))],
				U: r.Float64()}
			if r.IntN(3) == 0 {
				d.Mask = int32(r.IntN(nMasks))
			}
			switch r.IntN(12) {
			case 0:
				d.Force = order[0]
			case 1:
				d.Force = int32(r.IntN(V))
			}
			if r.IntN(3) == 0 {
				n := r.IntN(forward.MaxDrawExclude + 1)
				for range n {
					switch r.IntN(3) {
					case 0:
						d.Exclude = append(d.Exclude, order[r.IntN(min(V, 8))])
					case 1:
						d.Exclude = append(d.Exclude, int32(r.IntN(V+20)-10)) // some out of range: ignored
					default:
						d.Exclude = append(d.Exclude, int32(r.IntN(V)))
					}
				}
			}
			if r.IntN(40) == 0 {
				d.U = math.Nextafter(1, 0)
			}
			ds = append(ds, d)
		}
	}
	return ds
}

// TestForwardDrawMatchesDrawRow runs steps (prefill, chunked prefill,
// decode, duplicate rows; graph and eager; the GEMV and cuBLAS LM heads)
// through Forward and then ForwardDraw on the same batch, and checks:
// the host rows ForwardDraw returns equal Forward's rows bit for bit (all
// rows, subsets, reordered, duplicated, none), LogSumExp equals Forward's,
// and every draw against sampler.DrawRow on the same row — forced, greedy
// and dead-end results and every logit exactly, sampled tokens in ≥ 99 %
// of the draws (the device sums in another order), and never a token the
// mask, the exclude list or a NaN forbids.
func TestForwardDrawMatchesDrawRow(t *testing.T) {
	gpuOrSkip(t)
	v6189 := model.TestConfig()
	v6189.VocabSize = 6189 // the shipped model's vocabulary
	models := map[string]func() (*model.Model, error){
		"random":       func() (*model.Model, error) { return model.NewRandom(model.TestConfig(), 5), nil },
		"random-v6189": func() (*model.Model, error) { return model.NewRandom(v6189, 6), nil },
		"trained":      trainedModel,
	}
	var sampled, differ int
	for _, name := range []string{"random", "random-v6189", "trained"} {
		for _, eager := range []bool{false, true} {
			label := name
			if eager {
				label += "-eager"
			}
			t.Run(label, func(t *testing.T) {
				m, err := models[name]()
				if err != nil {
					t.Skipf("no trained model: %v", err)
				}
				g, err := New(m, Options{KVCacheBytes: 64 << 20, MaxBatchTokens: 64, EagerOnly: eager, BlockSize: 16}) // the steps below lay out 16-token blocks
				if err != nil {
					t.Fatal(err)
				}
				defer g.Close()
				V := m.Config.VocabSize
				if !g.DrawVocab() {
					t.Fatalf("DrawVocab false for V %d", V)
				}
				r := rand.New(rand.NewPCG(3, uint64(V)))
				masks := drawTestMasks(V, r)
				for i, mk := range masks {
					idx, err := g.RegisterMask(mk)
					if err != nil || idx != int32(i) {
						t.Fatalf("RegisterMask #%d = %d, %v", i, idx, err)
					}
				}
				pool := newBlockPool(64, r)
				seqs := []*seqSim{{}, {}, {}, {}}
				steps := [][]chunk{
					{{0, 20, []int{19, 3}}, {1, 5, []int{4}}, {2, 37, []int{0, 16, 36}}},
					{{0, 1, []int{0}}, {1, 12, []int{11}}, {2, 1, []int{0}}, {3, 1, []int{0}}},
					{{0, 1, []int{0}}, {1, 1, []int{0}}, {2, 1, []int{0}}, {3, 30, []int{29, 29, 5}}}, // a duplicate row
					{{0, 1, []int{0}}},
					{{2, 1, []int{0}}, {3, 1, nil}},
				}
				for range 4 {
					steps = append(steps, []chunk{{0, 1, []int{0}}, {1, 1, []int{0}}, {2, 1, []int{0}}, {3, 1, []int{0}}})
				}
				for si, st := range steps {
					bt := buildBatch(seqs, st, 16, pool, r, V)
					R := len(bt.LogitRows)
					ref := make([]float32, R*V)
					if err := g.Forward(bt, ref); err != nil {
						t.Fatalf("step %d: Forward: %v", si, err)
					}
					refLSE := slices.Clone(g.LogSumExp())
					draws := makeDraws(r, ref, V, 60, len(masks))
					out := make([]forward.Drawn, len(draws))
					for i := range out {
						out[i] = forward.Drawn{Tok: -7, Logit: 12345}
					}
					host := hostRowsFor(si, R)
					got := make([]float32, (len(host)+1)*V)
					for i := range got {
						got[i] = float32(math.NaN())
					}
					if err := g.ForwardDraw(bt, draws, out, host, got); err != nil {
						t.Fatalf("step %d: ForwardDraw: %v", si, err)
					}
					for k, hr := range host {
						a, b := got[k*V:(k+1)*V], ref[int(hr)*V:(int(hr)+1)*V]
						for i := range a {
							if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
								t.Fatalf("step %d: host row %d (row %d) token %d: %v, Forward %v", si, k, hr, i, a[i], b[i])
							}
						}
					}
					if tail := got[len(host)*V:]; slices.ContainsFunc(tail, func(x float32) bool { return x == x }) {
						t.Errorf("step %d: ForwardDraw wrote past its %d host rows", si, len(host))
					}
					lse := g.LogSumExp()
					if len(lse) != R {
						t.Fatalf("step %d: LogSumExp has %d rows, want %d", si, len(lse), R)
					}
					for k := range R {
						if math.Float32bits(lse[k]) != math.Float32bits(refLSE[k]) {
							t.Errorf("step %d: LogSumExp[%d] %v, Forward's %v", si, k, lse[k], refLSE[k])
						}
					}
					for i, d := range draws {
						row := ref[int(d.Row)*V : (int(d.Row)+1)*V]
						want := refDraw(row, masks, d)
						o := out[i]
						desc := fmt.Sprintf("step %d draw %d (row %d, %+v)", si, i, d.Row, d)
						if o.Tok < -1 || int(o.Tok) >= V {
							t.Fatalf("%s: token %d out of range", desc, o.Tok)
						}
						if o.Tok >= 0 && math.Float32bits(o.Logit) != math.Float32bits(row[o.Tok]) {
							t.Errorf("%s: logit %v, row holds %v", desc, o.Logit, row[o.Tok])
						}
						exact := d.Force >= 0 || d.Temperature == 0 || want == -1 || o.Tok == -1
						if exact {
							if o.Tok != want {
								t.Errorf("%s: token %d, DrawRow %d", desc, o.Tok, want)
							}
							continue
						}
						if (d.Mask >= 0 && !allowedBy(masks[d.Mask], o.Tok)) || slices.Contains(d.Exclude, o.Tok) || row[o.Tok] != row[o.Tok] {
							t.Errorf("%s: drew forbidden token %d", desc, o.Tok)
						}
						sampled++
						if o.Tok != want {
							differ++
							t.Logf("%s: token %d, DrawRow %d (p %g vs %g of the max)", desc, o.Tok, want,
								math.Exp(float64(row[o.Tok]-slices.Max(row))), math.Exp(float64(row[max(want, 0)]-slices.Max(row))))
						}
					}
				}
			})
		}
	}
	t.Logf("%d sampled draws, %d differ from DrawRow", sampled, differ)
	if sampled < 1000 {
		t.Errorf("only %d sampled draws checked", sampled)
	}
	if float64(differ) > 0.01*float64(sampled) {
		t.Errorf("%d of %d sampled draws differ from DrawRow (> 1 %%)", differ, sampled)
	}
}

// TestForwardDrawErrors: bad draws fail before anything runs, the backend
// stays usable, and RegisterMask refuses a 65th set.
func TestForwardDrawErrors(t *testing.T) {
	g, V := tinyBackend(t, Options{})
	bt := func() *forward.Batch { return twoTokens(1) }
	good := forward.Draw{Row: 0, Force: -1, Mask: -1, Temperature: 1, U: 0.5}
	out := make([]forward.Drawn, 1)
	for name, d := range map[string]forward.Draw{
		"row":   {Row: 1, Force: -1, Mask: -1},
		"force": {Row: 0, Force: int32(V), Mask: -1},
		"mask":  {Row: 0, Force: -1, Mask: 0}, // none registered yet
		"U":     {Row: 0, Force: -1, Mask: -1, Temperature: 1, U: 1},
	} {
		if err := g.ForwardDraw(bt(), []forward.Draw{d}, out, nil, nil); err == nil {
			t.Errorf("%s: bad draw accepted", name)
		}
	}
	if err := g.ForwardDraw(bt(), []forward.Draw{good}, make([]forward.Drawn, 2), nil, nil); err == nil {
		t.Error("len(out) != len(draws) accepted")
	}
	if err := g.ForwardDraw(bt(), []forward.Draw{good}, out, []int32{0}, make([]float32, V-1)); err == nil {
		t.Error("short logits buffer accepted")
	}
	if err := g.ForwardDraw(bt(), []forward.Draw{good}, out, nil, nil); err != nil || out[0].Tok < 0 {
		t.Fatalf("good draw after errors: %+v, %v", out[0], err)
	}
	for i := range maxMasks {
		if idx, err := g.RegisterMask([]uint64{uint64(i)}); err != nil || idx != int32(i) {
			t.Fatalf("RegisterMask #%d = %d, %v", i, idx, err)
		}
	}
	if _, err := g.RegisterMask([]uint64{1}); err == nil {
		t.Error("65th mask accepted")
	}
	// Mask 5 allows tokens 0 and 2 only (bits of 5).
	for _, u := range []float64{0, 0.3, 0.6, 0.99} {
		d := forward.Draw{Row: 0, Force: -1, Mask: 5, Temperature: 1, U: u}
		if err := g.ForwardDraw(bt(), []forward.Draw{d}, out, nil, nil); err != nil || (out[0].Tok != 0 && out[0].Tok != 2) {
			t.Errorf("mask {0, 2}, u %v: %+v, %v", u, out[0], err)
		}
	}
}

// BenchmarkForwardDraw times a decode step of n sequences (one logits row
// each, ~24 tokens of context) three ways, in the same process (-count N
// alternates them): "forward" — Forward with every logits row copied back
// (what the engine's host sampling needs); "draw" — ForwardDraw with one
// draw per row (T 0.8, top-p 0.95, the couplet service's defaults) and no
// host rows; "draw-host1" — the same plus one row copied back through
// gather_rows. The host sampling that "forward" leaves to the engine is
// not in its figure.
func BenchmarkForwardDraw(b *testing.B) {
	g, V := benchDrawBackend(b)
	b.Logf("device %+v, DrawVocab %v", g.Info(), g.DrawVocab())
	for _, n := range []int{1, 64, 2048} {
		bt := decodeBatch(n, 24, g.BlockSize(), true)
		fillContext(b, g, bt)
		logits := make([]float32, n*V)
		draws := serviceDraws(n)
		out := make([]forward.Drawn, n)
		for _, mode := range []string{"forward", "draw", "draw-host1"} {
			step := func() error {
				switch mode {
				case "forward":
					return g.Forward(bt, logits)
				case "draw":
					return g.ForwardDraw(bt, draws, out, nil, logits)
				default:
					return g.ForwardDraw(bt, draws, out, []int32{int32(n - 1)}, logits)
				}
			}
			b.Run(fmt.Sprintf("seqs=%d/%s", n, mode), func(b *testing.B) {
				if err := step(); err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if err := step(); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tok/s")
			})
		}
	}
}

// refDraw is draw d's result by the definition (sampler.DrawRow; a Force
// draw returns its token) on its row, masks[i] being mask i's bits.
func refDraw(row []float32, masks [][]uint64, d forward.Draw) int32 {
	if d.Force >= 0 {
		return d.Force
	}
	var allowed []uint64
	if d.Mask >= 0 {
		allowed = masks[d.Mask]
	}
	return sampler.DrawRow(row, allowed, d.Exclude, sampler.DrawParams{Temperature: d.Temperature, TopP: d.TopP, MinP: d.MinP, TopK: d.TopK}, d.U)
}

// benchDrawBackend is a backend over the benchmark model (4 GiB cache,
// row log-sum-exps on: what draws need), closed at the end, and its
// vocabulary size.
func benchDrawBackend(b *testing.B) (*Backend, int) {
	gpuOrSkip(b)
	m := benchModel(b)
	g, err := New(m, Options{KVCacheBytes: 4 << 30})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { g.Close() })
	return g, m.Config.VocabSize
}

// serviceDraws is one sampled draw per logits row of n, at the couplet
// service's defaults (T 0.8, top-p 0.95), with seeded uniforms.
func serviceDraws(n int) []forward.Draw {
	r := rand.New(rand.NewPCG(1, 1))
	draws := make([]forward.Draw, n)
	for i := range draws {
		draws[i] = forward.Draw{Row: int32(i), Force: -1, Mask: -1, Temperature: 0.8, TopP: 0.95, U: r.Float64()}
	}
	return draws
}
