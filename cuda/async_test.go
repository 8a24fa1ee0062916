package cuda

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"chunlian/forward"
	"chunlian/model"
)

// drawResult is one step's results: the draws', the host rows' and the
// log-sum-exps.
type drawResult struct {
	out    []forward.Drawn
	logits []float32
	lse    []float32
}

// drawCase is one step to run both ways.
type drawCase struct {
	bt    *forward.Batch
	draws []forward.Draw
	host  []int32
}

// syncDraw runs c through ForwardDraw.
func syncDraw(t *testing.T, g *Backend, c drawCase) drawResult {
	t.Helper()
	V := g.VocabSize()
	res := drawResult{out: make([]forward.Drawn, len(c.draws)), logits: make([]float32, len(c.host)*V)}
	if err := g.ForwardDraw(c.bt, c.draws, res.out, c.host, res.logits); err != nil {
		t.Fatalf("ForwardDraw: %v", err)
	}
	res.lse = slices.Clone(g.LogSumExp())
	return res
}

// waitDraw waits for slot into fresh slices (poisoned, so that what is
// not written shows).
func waitDraw(t *testing.T, g *Backend, slot int, c drawCase) drawResult {
	t.Helper()
	V := g.VocabSize()
	res := drawResult{out: make([]forward.Drawn, len(c.draws)), logits: make([]float32, len(c.host)*V), lse: make([]float32, len(c.bt.LogitRows))}
	for i := range res.out {
		res.out[i] = forward.Drawn{Tok: -7, Logit: 12345}
	}
	for i := range res.logits {
		res.logits[i] = float32(math.NaN())
	}
	for i := range res.lse {
		res.lse[i] = float32(math.NaN())
	}
	if err := g.WaitDraw(slot, res.out, res.logits, res.lse); err != nil {
		t.Fatalf("WaitDraw(%d): %v", slot, err)
	}
	return res
}

// sameResult fails unless got equals want bit for bit.
func sameResult(t *testing.T, label string, got, want drawResult) {
	t.Helper()
	bits := func(x []float32) []uint32 {
		u := make([]uint32, len(x))
		for i, v := range x {
			u[i] = math.Float32bits(v)
		}
		return u
	}
	if len(got.out) != len(want.out) {
		t.Fatalf("%s: %d results, want %d", label, len(got.out), len(want.out))
	}
	for i := range want.out {
		if got.out[i].Tok != want.out[i].Tok || math.Float32bits(got.out[i].Logit) != math.Float32bits(want.out[i].Logit) {
			t.Fatalf("%s: draw %d: %+v, ForwardDraw %+v", label, i, got.out[i], want.out[i])
		}
	}
	if i := firstDiff(bits(got.logits), bits(want.logits)); i >= 0 {
		t.Fatalf("%s: host logits differ at %d of %d: %v, ForwardDraw %v", label, i, len(want.logits), got.logits[i], want.logits[i])
	}
	if i := firstDiff(bits(got.lse), bits(want.lse)); i >= 0 {
		t.Fatalf("%s: lse (%d, want %d rows) differs at %d", label, len(got.lse), len(want.lse), i)
	}
}

// firstDiff is the first index where a and b differ (-1: equal; a length
// difference counts at the shorter length).
func firstDiff(a, b []uint32) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// hostRowsFor picks the host rows of step si out of R as the draw test
// does: all in order, none, a reordered subset with a duplicate, the first.
func hostRowsFor(si, R int) []int32 {
	var host []int32
	switch si % 4 {
	case 0:
		for k := range R {
			host = append(host, int32(k))
		}
	case 2:
		for k := R - 1; k >= 0; k -= 2 {
			host = append(host, int32(k))
		}
		host = append(host, host[0])
	case 3:
		host = []int32{0}
	}
	return host
}

// TestLaunchDrawMatchesForwardDraw: (a) every step through ForwardDraw and
// then LaunchDraw + WaitDraw (alternating slots) gives bit-identical
// draws, host rows and log-sum-exps; (b) the same steps over two disjoint
// groups of sequences run again pipelined — launch step k, then wait for
// step k−1, as the engine does — each equal to its ForwardDraw result.
// Graph and eager; the GEMV and cuBLAS LM heads (prefill and decode).
func TestLaunchDrawMatchesForwardDraw(t *testing.T) {
	gpuOrSkip(t)
	v6189 := model.TestConfig()
	v6189.VocabSize = 6189
	models := map[string]func() *model.Model{
		"random":       func() *model.Model { return model.NewRandom(model.TestConfig(), 5) },
		"random-v6189": func() *model.Model { return model.NewRandom(v6189, 6) },
	}
	for _, name := range []string{"random", "random-v6189"} {
		for _, eager := range []bool{false, true} {
			label := name
			if eager {
				label += "-eager"
			}
			t.Run(label, func(t *testing.T) {
				m := models[name]()
				g, err := New(m, Options{KVCacheBytes: 64 << 20, MaxBatchTokens: 64, EagerOnly: eager, BlockSize: 16}) // the steps below lay out 16-token blocks
				if err != nil {
					t.Fatal(err)
				}
				defer g.Close()
				V := m.Config.VocabSize
				r := rand.New(rand.NewPCG(4, uint64(V)))
				masks := drawTestMasks(V, r)
				for _, mk := range masks {
					if _, err := g.RegisterMask(mk); err != nil {
						t.Fatal(err)
					}
				}
				pool := newBlockPool(64, r)
				seqs := []*seqSim{{}, {}, {}, {}}
				// Group A: sequences 0 and 1; group B: 2 and 3; steps alternate.
				steps := [][]chunk{
					{{0, 20, []int{19, 3}}, {1, 5, []int{4}}},
					{{2, 37, []int{0, 16, 36}}, {3, 12, []int{11}}},
					{{0, 1, []int{0}}, {1, 12, []int{11, 11}}},
					{{2, 1, []int{0}}, {3, 1, nil}},
				}
				for range 6 {
					steps = append(steps, []chunk{{0, 1, []int{0}}, {1, 1, []int{0}}}, []chunk{{2, 1, []int{0}}, {3, 1, []int{0}}})
				}
				var cases []drawCase
				var refs []drawResult
				for si, st := range steps {
					bt := buildBatch(seqs, st, 16, pool, r, V)
					R := len(bt.LogitRows)
					ref := make([]float32, R*V)
					if err := g.Forward(bt, ref); err != nil {
						t.Fatalf("step %d: Forward: %v", si, err)
					}
					c := drawCase{bt: bt, draws: makeDraws(r, ref, V, 20, len(masks)), host: hostRowsFor(si, R)}
					want := syncDraw(t, g, c)
					// (a) the same step again, launched and waited for.
					slot := si % 2
					if err := g.LaunchDraw(slot, c.bt, c.draws, c.host); err != nil {
						t.Fatalf("step %d: LaunchDraw: %v", si, err)
					}
					sameResult(t, fmt.Sprintf("step %d (slot %d)", si, slot), waitDraw(t, g, slot, c), want)
					cases, refs = append(cases, c), append(refs, want)
				}
				// (b) pipelined: two launches outstanding.
				for k, c := range cases {
					if err := g.LaunchDraw(k%2, c.bt, c.draws, c.host); err != nil {
						t.Fatalf("pipelined step %d: LaunchDraw: %v", k, err)
					}
					if k > 0 {
						sameResult(t, fmt.Sprintf("pipelined step %d", k-1), waitDraw(t, g, (k-1)%2, cases[k-1]), refs[k-1])
					}
				}
				last := len(cases) - 1
				sameResult(t, fmt.Sprintf("pipelined step %d", last), waitDraw(t, g, last%2, cases[last]), refs[last])
				// The waits saw the device's done word (the fallback to the
				// worker's event sync is for errors and very long steps).
				if fast, slow := g.WaitStats(); fast == 0 || fast+slow != int64(2*len(cases)) {
					t.Errorf("WaitStats: %d by the done word, %d by the event, want %d waits, most by the word", fast, slow, 2*len(cases))
				} else {
					t.Logf("WaitStats: %d by the done word, %d by the event", fast, slow)
				}
				// Back to the synchronous style.
				sameResult(t, "ForwardDraw after the launches", syncDraw(t, g, cases[last]), refs[last])
			})
		}
	}
}

// TestLaunchDrawCopyBlocks: (c) a CopyBlocks issued between a launch and
// its wait runs after the launched step, and a step launched after it
// reads the copied block: a sequence prefilled, its second block copied,
// a fork decoding on the copy — first synchronously, then on fresh
// blocks with the fork launched before the prefill is waited for — gives
// identical results.
//
// With noPoll, every WaitDraw takes the fallback (the worker's event
// sync) instead of the done word; the results must not change.
func TestLaunchDrawCopyBlocks(t *testing.T) {
	gpuOrSkip(t)
	for _, tc := range []struct{ eager, noPoll bool }{{false, false}, {true, false}, {false, true}} {
		t.Run(fmt.Sprintf("eager=%v,noPoll=%v", tc.eager, tc.noPoll), func(t *testing.T) {
			m := model.NewRandom(model.TestConfig(), 7)
			g, err := New(m, Options{KVCacheBytes: 16 << 20, EagerOnly: tc.eager, BlockSize: 16}) // two blocks hold the prefill
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			g.noPoll = tc.noPoll
			V, bs := m.Config.VocabSize, g.BlockSize()
			if g.NumBlocks() < 8 {
				t.Fatalf("%d blocks", g.NumBlocks())
			}
			r := rand.New(rand.NewPCG(9, 9))
			const n = 20 // prefill length: blocks 0 and 1 (16 + 4 tokens)
			toks := make([]int32, n+1)
			for i := range toks {
				toks[i] = int32(r.IntN(V))
			}
			prefill := func(b0, b1 int32) *forward.Batch {
				bt := &forward.Batch{LogitRows: []int{n - 1, 3}}
				table := []int32{b0, b1}
				for p := range n {
					bt.Tokens = append(bt.Tokens, toks[p])
					bt.Positions = append(bt.Positions, int32(p))
					bt.SlotMapping = append(bt.SlotMapping, table[p/bs]*int32(bs)+int32(p%bs))
				}
				bt.Seqs = []forward.SeqSpan{{Start: 0, Len: n, CtxLen: n, BlockTable: table}}
				return bt
			}
			fork := func(b0, c int32) *forward.Batch {
				return &forward.Batch{Tokens: []int32{toks[n]}, Positions: []int32{n}, SlotMapping: []int32{c*int32(bs) + n%int32(bs)},
					Seqs: []forward.SeqSpan{{Start: 0, Len: 1, CtxLen: n + 1, BlockTable: []int32{b0, c}}}, LogitRows: []int{0}}
			}
			draws := func(R int) []forward.Draw {
				var ds []forward.Draw
				for row := range R {
					ds = append(ds, forward.Draw{Row: int32(row), Force: -1, Mask: -1, Temperature: 0.8, TopP: 0.95, U: r.Float64()},
						forward.Draw{Row: int32(row), Force: -1, Mask: -1})
				}
				return ds
			}
			pc := drawCase{bt: prefill(0, 1), draws: draws(2), host: []int32{1, 0}}
			fc := drawCase{bt: fork(0, 2), draws: draws(1), host: []int32{0}}
			wantP := syncDraw(t, g, pc)
			tail := []int32{int32(n - bs)} // block 1's filled slots
			if err := g.CopyBlocks([]int32{1}, []int32{2}, tail); err != nil {
				t.Fatal(err)
			}
			wantF := syncDraw(t, g, fc)

			pc.bt, fc.bt = prefill(4, 5), fork(4, 6)
			if err := g.LaunchDraw(0, pc.bt, pc.draws, pc.host); err != nil {
				t.Fatal(err)
			}
			if err := g.CopyBlocks([]int32{5}, []int32{6}, tail); err != nil {
				t.Fatal(err)
			}
			if err := g.LaunchDraw(1, fc.bt, fc.draws, fc.host); err != nil {
				t.Fatal(err)
			}
			sameResult(t, "prefill", waitDraw(t, g, 0, pc), wantP)
			sameResult(t, "fork on the copied block", waitDraw(t, g, 1, fc), wantF)
			if fast, slow := g.WaitStats(); tc.noPoll && (fast != 0 || slow != 2) {
				t.Errorf("noPoll: WaitStats %d fast, %d slow; want 0, 2", fast, slow)
			}
		})
	}
}

// TestLaunchDrawErrors: (d) bad slots, a wait without a launch, a second
// launch on a busy slot, wrong result lengths (the launch stays
// outstanding) and the synchronous calls while a launch is outstanding
// fail; the backend stays usable.
func TestLaunchDrawErrors(t *testing.T) {
	g, V := tinyBackend(t, Options{})
	bt := twoTokens(1, 0)
	good := []forward.Draw{{Row: 0, Force: -1, Mask: -1, Temperature: 1, U: 0.5}, {Row: 1, Force: -1, Mask: -1}}
	host := []int32{1}
	out, logits, lse := make([]forward.Drawn, 2), make([]float32, V), make([]float32, 2)
	mustFail := func(what string, err error) {
		t.Helper()
		if err == nil {
			t.Errorf("%s: no error", what)
		}
	}
	mustFail("WaitDraw without a launch", g.WaitDraw(0, out, logits, lse))
	mustFail("WaitDraw slot 2", g.WaitDraw(2, out, logits, lse))
	mustFail("LaunchDraw slot -1", g.LaunchDraw(-1, bt, good, host))
	// A launch's own errors come back from its WaitDraw, which ends it.
	if err := g.LaunchDraw(0, bt, []forward.Draw{{Row: 2, Force: -1, Mask: -1}}, nil); err != nil {
		t.Fatalf("LaunchDraw of a bad draw: %v (want the error at WaitDraw)", err)
	}
	mustFail("WaitDraw of a bad draw's launch", g.WaitDraw(0, out[:1], logits, lse))
	mustFail("WaitDraw after a failed launch", g.WaitDraw(0, out, logits, lse))

	if err := g.LaunchDraw(0, bt, good, host); err != nil {
		t.Fatal(err)
	}
	mustFail("second LaunchDraw on slot 0", g.LaunchDraw(0, bt, good, host))
	mustFail("ForwardDraw while launched", g.ForwardDraw(bt, good, out, host, logits))
	mustFail("Forward while launched", g.Forward(bt, make([]float32, 2*V)))
	mustFail("WaitDraw short out", g.WaitDraw(0, out[:1], logits, lse))
	mustFail("WaitDraw long out", g.WaitDraw(0, make([]forward.Drawn, 3), logits, lse))
	mustFail("WaitDraw short logits", g.WaitDraw(0, out, logits[:V-1], lse))
	mustFail("WaitDraw short lse", g.WaitDraw(0, out, logits, lse[:1]))
	mustFail("WaitDraw other slot", g.WaitDraw(1, out, logits, lse))
	if err := g.WaitDraw(0, out, logits, lse); err != nil {
		t.Fatalf("WaitDraw after the length errors: %v", err)
	}
	if out[0].Tok < 0 || out[1].Tok < 0 || lse[0] != lse[0] {
		t.Errorf("results %+v, lse %v", out, lse)
	}
	mustFail("second WaitDraw", g.WaitDraw(0, out, logits, lse))
	// An error the worker kept (an earlier CopyBlocks' enqueueing) comes
	// back once, from the next call that reports errors; a WaitDraw that
	// reports it ends its launch.
	if err := g.LaunchDraw(1, bt, good, host); err != nil {
		t.Fatal(err)
	}
	g.deferErr(errors.New("injected"))
	mustFail("WaitDraw with a kept error", g.WaitDraw(1, out, logits, lse))
	mustFail("WaitDraw after it", g.WaitDraw(1, out, logits, lse))
	g.deferErr(errors.New("injected"))
	mustFail("Forward with a kept error", g.Forward(bt, make([]float32, 2*V)))
	want := make([]forward.Drawn, 2)
	wantLogits := make([]float32, V)
	if err := g.ForwardDraw(bt, good, want, host, wantLogits); err != nil {
		t.Fatalf("ForwardDraw after the wait: %v", err)
	}
	if !slices.Equal(out, want) || firstDiffF(logits, wantLogits) >= 0 {
		t.Errorf("LaunchDraw %+v, ForwardDraw %+v", out, want)
	}
}

func firstDiffF(a, b []float32) int {
	for i := range min(len(a), len(b)) {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// busy spins for d: the engine's host work (scheduling, consuming) that
// the asynchronous launch overlaps with the device.
func busy(d time.Duration) {
	for t0 := time.Now(); time.Since(t0) < d; {
	}
}

// BenchmarkLaunchDraw times a decode step of n sequences with one draw
// per row and ~1 ms of host work per step, in the same process: "sync" —
// ForwardDraw, then the host work; "async" — LaunchDraw, the host work,
// WaitDraw (the host work overlaps the device's); "pipelined" — the
// engine's pattern: launch step k on slot k%2, wait for step k−1, then the
// host work. Lower ns/op than sync = the overlap.
func BenchmarkLaunchDraw(b *testing.B) {
	g, V := benchDrawBackend(b)
	const work = time.Millisecond
	for _, n := range []int{64, 2048} {
		bt := decodeBatch(n, 24, g.BlockSize(), true)
		fillContext(b, g, bt)
		draws := serviceDraws(n)
		host := []int32{int32(n - 1)}
		out, logits, lse := make([]forward.Drawn, n), make([]float32, V), make([]float32, n)
		for _, mode := range []string{"sync", "async", "pipelined"} {
			b.Run(fmt.Sprintf("seqs=%d/%s", n, mode), func(b *testing.B) {
				if err := g.ForwardDraw(bt, draws, out, host, logits); err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					var err error
					switch mode {
					case "sync":
						err = g.ForwardDraw(bt, draws, out, host, logits)
						busy(work)
					case "async":
						if err = g.LaunchDraw(0, bt, draws, host); err == nil {
							busy(work)
							err = g.WaitDraw(0, out, logits, lse)
						}
					default:
						if err = g.LaunchDraw(i%2, bt, draws, host); err == nil && i > 0 {
							err = g.WaitDraw((i-1)%2, out, logits, lse)
						}
						busy(work)
					}
					if err != nil {
						b.Fatal(err)
					}
				}
				if mode == "pipelined" && b.N > 0 {
					if err := g.WaitDraw((b.N-1)%2, out, logits, lse); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tok/s")
			})
		}
	}
}
