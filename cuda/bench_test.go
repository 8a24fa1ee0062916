package cuda

import (
	"fmt"
	"strings"
	"testing"

	"chunlian/forward"
	"chunlian/model"
)

// benchModel is the trained model when present, else a random model of a
// similar shape (d 512, 8 layers, vocab 6000).
func benchModel(tb testing.TB) *model.Model {
	if m, err := trainedModel(); err == nil {
		return m
	}
	c := model.TestConfig()
	c.HiddenSize, c.NumHeads, c.NumKVHeads, c.HeadDim = 512, 8, 8, 64
	c.IntermediateSize, c.NumLayers, c.VocabSize = 1376, 8, 6000
	return model.NewRandom(c, 1)
}

// decodeBatch builds one decode step for nSeq sequences with ctx tokens of
// context each (token ctx-1 is the new one); each sequence owns its blocks.
func decodeBatch(nSeq, ctx, bs int, withLogits bool) *forward.Batch {
	b := &forward.Batch{}
	per := (ctx + bs - 1) / bs
	for s := 0; s < nSeq; s++ {
		table := make([]int32, per)
		for i := range table {
			table[i] = int32(s*per + i)
		}
		pos := ctx - 1
		b.Tokens = append(b.Tokens, int32(10+s%50))
		b.Positions = append(b.Positions, int32(pos))
		b.SlotMapping = append(b.SlotMapping, table[pos/bs]*int32(bs)+int32(pos%bs))
		b.Seqs = append(b.Seqs, forward.SeqSpan{Start: s, Len: 1, CtxLen: ctx, BlockTable: table})
		if withLogits {
			b.LogitRows = append(b.LogitRows, s)
		}
	}
	return b
}

// fillToken is the token fillContext writes at position pos of sequence
// seq. It depends on the sequence too, so that an activation row left over
// from another sequence of an earlier step (same position, other token)
// shows in checkFillContext's logits.
func fillToken(seq, pos int) int32 { return int32(10 + (pos*7+seq*13)%50) }

// fillContext writes the KV cache positions that bt's decode step reads
// but does not write (0..CtxLen-2 of each sequence, tokens fillToken),
// by prefill steps of at most 64 sequences without logits. Without it the
// benchmarks attend over whatever the cache allocation held, which
// compute-sanitizer's initcheck reports as reads of uninitialised memory.
func fillContext(tb testing.TB, be forward.Backend, bt *forward.Batch) {
	tb.Helper()
	bs := be.BlockSize()
	for s0 := 0; s0 < len(bt.Seqs); s0 += 64 {
		p := &forward.Batch{}
		for i, sq := range bt.Seqs[s0:min(s0+64, len(bt.Seqs))] {
			n := sq.CtxLen - sq.Len
			if n == 0 {
				continue
			}
			p.Seqs = append(p.Seqs, forward.SeqSpan{Start: len(p.Tokens), Len: n, CtxLen: n, BlockTable: sq.BlockTable})
			for pos := range n {
				p.Tokens = append(p.Tokens, fillToken(s0+i, pos))
				p.Positions = append(p.Positions, int32(pos))
				p.SlotMapping = append(p.SlotMapping, sq.BlockTable[pos/bs]*int32(bs)+int32(pos%bs))
			}
		}
		if len(p.Seqs) == 0 {
			continue
		}
		if err := be.Forward(p, nil); err != nil {
			tb.Fatal(err)
		}
	}
}

// BenchmarkDecodeStep times one engine decode step (Forward over nSeq
// single-token sequences with ~24 tokens of context, logits copied back
// for every row unless "nologits"). Modes: graph / eager (CUDA graphs or
// not), graph-gemm (the GEMM path at the GEMV path's sizes), graph-bs1
// (KV blocks of one token instead of DefaultBlockSize), graph-nospin
// (plain blocking channel hand-off to the CUDA worker,
// Options.HandoffSpin < 0), graph-fp32w (the GEMV path on float32 weights
// even where bf16 copies are exact), graph-lane / graph-grouped (one key
// per lane / grouped attention scoring at every size, to place
// DefaultGroupedAttentionFrom), graph-gu16 / graph-fmlp / graph-fnorm /
// graph-fall (Options.GateUpBF16 / FusedMLP / FusedMLPNorm / that and
// FusedQKVNorm). They run in the same process;
// -test.count N alternates them N times.
func BenchmarkDecodeStep(b *testing.B) {
	gpuOrSkip(b)
	m := benchModel(b)
	for _, mode := range []string{"graph", "graph-gemm", "graph-bs1", "graph-nospin", "graph-fp32w", "graph-lane", "graph-grouped", "graph-gu16", "graph-fmlp", "graph-fnorm", "graph-fall", "eager"} {
		o := Options{KVCacheBytes: 4 << 30, EagerOnly: strings.HasPrefix(mode, "eager")}
		switch mode {
		case "graph-bs1": // one-token KV blocks (every slot live) against the default
			o.BlockSize = 1
		case "graph-nospin":
			o.HandoffSpin = -1
		case "graph-fp32w":
			o.GEMVWeights = "fp32"
		case "graph-lane": // one key per lane at every size
			o.GroupedAttentionFrom = -1
		case "graph-grouped": // grouped attention scoring at every size
			o.GroupedAttentionFrom = 1
		case "graph-gu16":
			o.GateUpBF16 = true
		case "graph-fmlp":
			o.FusedMLP = true
		case "graph-fnorm":
			o.FusedMLPNorm = true
		case "graph-fall":
			o.FusedMLPNorm, o.FusedQKVNorm = true, true
		}
		g, err := New(m, o)
		if err != nil {
			b.Fatal(err)
		}
		b.Logf("device %+v", g.Info())
		sizes := []int{1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 64, 256, 512, 1024, 2048, 4096}
		switch mode {
		case "graph-gemm": // the GEMM path where the GEMV path would run
			g.gemvOK = false
			sizes = []int{1, 2, 3, 4, 5, 6, 7, 8}
		case "graph-bs1":
			sizes = []int{1, 16, 256, 1024, 4096}
		case "graph-lane", "graph-grouped": // where grouped scoring starts to pay
			sizes = []int{2, 4, 8, 16, 32, 64, 128, 256, 1024}
		case "graph-gu16", "graph-fmlp", "graph-fnorm", "graph-fall": // against "graph" at the same sizes
			sizes = []int{8, 64, 256, 1024, 2048}
		case "graph":
		default:
			sizes = []int{1, 8, 1024}
		}
		for _, n := range sizes {
			for _, withLogits := range []bool{true, false} {
				if !withLogits && (n > 1 && n < 512 || mode != "graph") {
					continue
				}
				name := fmt.Sprintf("%s/seqs=%d", mode, n)
				if !withLogits {
					name += "/nologits"
				}
				b.Run(name, func(b *testing.B) {
					bt := decodeBatch(n, 24, g.BlockSize(), withLogits)
					fillContext(b, g, bt)
					logits := make([]float32, len(bt.LogitRows)*m.Config.VocabSize)
					if err := g.Forward(bt, logits); err != nil {
						b.Fatal(err)
					}
					b.ResetTimer()
					for i := 0; i < b.N; i++ {
						if err := g.Forward(bt, logits); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tok/s")
				})
			}
		}
		b.Logf("%s: %+v", mode, g.GraphStats())
		g.Close()
	}
}

// BenchmarkPrefill times a prefill step of nSeq prompts of 16 tokens, one
// logits row each.
func BenchmarkPrefill(b *testing.B) {
	gpuOrSkip(b)
	m := benchModel(b)
	g, err := New(m, Options{KVCacheBytes: 4 << 30})
	if err != nil {
		b.Fatal(err)
	}
	defer g.Close()
	for _, n := range []int{1, 64, 512} {
		b.Run(fmt.Sprintf("seqs=%d", n), func(b *testing.B) {
			const L, bs = 16, 16
			bt := &forward.Batch{}
			for s := 0; s < n; s++ {
				table := []int32{int32(s)}
				start := len(bt.Tokens)
				for p := 0; p < L; p++ {
					bt.Tokens = append(bt.Tokens, int32(10+(s+p)%50))
					bt.Positions = append(bt.Positions, int32(p))
					bt.SlotMapping = append(bt.SlotMapping, int32(s*bs+p))
				}
				bt.Seqs = append(bt.Seqs, forward.SeqSpan{Start: start, Len: L, CtxLen: L, BlockTable: table})
				bt.LogitRows = append(bt.LogitRows, start+L-1)
			}
			logits := make([]float32, n*m.Config.VocabSize)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := g.Forward(bt, logits); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n*L)*float64(b.N)/b.Elapsed().Seconds(), "tok/s")
		})
	}
}

// TestFillContext: on the CPU backend, a decode step after fillContext
// gives the logits of the same sequences prefilled whole (fill tokens,
// then the decode token) on a fresh cache, so fillContext writes exactly
// the positions the decode step reads. No GPU needed.
func TestFillContext(t *testing.T) {
	m := model.NewRandom(model.TestConfig(), 3)
	const nSeq, ctx = 70, 11 // more than one fill step of 64 sequences
	for _, bs := range []int{1, 4} {
		be, err := forward.NewCPU(m, forward.CPUOptions{BlockSize: bs, KVCacheBytes: fillCacheBytes(m, nSeq, ctx, bs)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { be.Close() })
		checkFillContext(t, m, be, nSeq, ctx, 1e-4)
	}
}

// TestFillContextGPU is TestFillContext on the GPU backend at the
// benchmarks' size: each fill step is one prefill of 64 sequences × 23
// tokens (1,472 rows, the cuBLAS path), where initcheck reported 4-byte
// reads of qkv rows by the kernel after the cuBLAS TF32 GEMM that writes
// them (its tensor-core stores are invisible to initcheck; at fp32 it
// reports nothing). A row the GEMM left unwritten would put garbage
// keys and values in the cache, and the decode logits would differ from
// the CPU's whole prefill far beyond the precision's tolerance.
func TestFillContextGPU(t *testing.T) {
	gpuOrSkip(t)
	const nSeq, ctx, bs = 70, 24, 16
	// The test config, and the benchmarks' model (the shipped weights, or
	// a random model of about their shape where they are stubbed out, as
	// in the device binaries): cuBLAS picks its GEMM kernels by shape.
	for _, mc := range []struct {
		name string
		m    *model.Model
	}{{"test-config", model.NewRandom(model.TestConfig(), 3)}, {"bench-model", benchModel(t)}} {
		for _, tc := range []struct {
			prec string
			tol  float64
		}{{"fp32", tolFP32}, {"tf32", tolTF32}} {
			t.Run(mc.name+"/"+tc.prec, func(t *testing.T) {
				m := mc.m
				g, err := New(m, Options{Precision: tc.prec, BlockSize: bs, KVCacheBytes: fillCacheBytes(m, nSeq, ctx, bs)})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { g.Close() })
				checkFillContext(t, m, g, nSeq, ctx, tc.tol)
			})
		}
	}
}

// fillCacheBytes is a KV cache for nSeq sequences of ctx tokens in blocks
// of bs, as decodeBatch lays them out.
func fillCacheBytes(m *model.Model, nSeq, ctx, bs int) int64 {
	return int64(nSeq*((ctx+bs-1)/bs)*bs) * forward.KVBytesPerToken(m.Config)
}

// checkFillContext runs fillContext and then decodeBatch's step on be,
// and compares every sequence's logits with a whole prefill of the same
// tokens on a fresh CPU backend (relative to the row's largest logit, as
// compareLogits).
func checkFillContext(t *testing.T, m *model.Model, be forward.Backend, nSeq, ctx int, tol float64) {
	t.Helper()
	V, bs := m.Config.VocabSize, be.BlockSize()
	bt := decodeBatch(nSeq, ctx, bs, true)
	fillContext(t, be, bt)
	got := make([]float32, nSeq*V)
	if err := be.Forward(bt, got); err != nil {
		t.Fatal(err)
	}
	ref, err := forward.NewCPU(m, forward.CPUOptions{BlockSize: bs, KVCacheBytes: fillCacheBytes(m, nSeq, ctx, bs)})
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	for s, sq := range bt.Seqs {
		p := &forward.Batch{Seqs: []forward.SeqSpan{{Start: 0, Len: ctx, CtxLen: ctx, BlockTable: sq.BlockTable}}, LogitRows: []int{ctx - 1}}
		for pos := range ctx {
			tok := fillToken(s, pos)
			if pos == ctx-1 {
				tok = bt.Tokens[s]
			}
			p.Tokens = append(p.Tokens, tok)
			p.Positions = append(p.Positions, int32(pos))
			p.SlotMapping = append(p.SlotMapping, sq.BlockTable[pos/bs]*int32(bs)+int32(pos%bs))
		}
		want := make([]float32, V)
		if err := ref.Forward(p, want); err != nil {
			t.Fatal(err)
		}
		if worst, _ := compareLogits(got[s*V:(s+1)*V], want, V); worst > tol {
			t.Fatalf("block size %d, sequence %d: decode after fillContext differs from a whole prefill by %g (tolerance %g)", bs, s, worst, tol)
		}
	}
}
