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
func benchModel(b *testing.B) *model.Model {
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

// BenchmarkDecodeStep times one engine decode step (Forward over nSeq
// single-token sequences with ~24 tokens of context, logits copied back
// for every row unless "nologits"). Modes: graph / eager (CUDA graphs or
// not) × fused (the GEMV path for ≤ 8 tokens, the default) / unfused
// (Options.NoFusedGEMV: cuBLAS + separate kernels, the path before it),
// graph-lse (the default with Options.RowLogSumExp), graph-nospin (plain
// blocking channel hand-off to the CUDA worker, Options.HandoffSpin < 0),
// graph-fp32w (the GEMV path on float32 weights even where bf16 copies are
// exact), graph-pdl / eager-pdl (Options.PDL). Old and new run in the same process; -test.count N alternates
// them N times.
func BenchmarkDecodeStep(b *testing.B) {
	gpuOrSkip(b)
	m := benchModel(b)
	for _, mode := range []string{"graph", "graph-unfused", "graph-lse", "graph-nospin", "graph-fp32w", "graph-pdl", "eager", "eager-unfused", "eager-pdl"} {
		o := Options{KVCacheBytes: 4 << 30, EagerOnly: strings.HasPrefix(mode, "eager"),
			NoFusedGEMV: strings.HasSuffix(mode, "-unfused"), RowLogSumExp: mode == "graph-lse"}
		switch mode {
		case "graph-nospin":
			o.HandoffSpin = -1
		case "graph-fp32w":
			o.GEMVWeights = "fp32"
		case "graph-pdl", "eager-pdl":
			o.PDL = true
		}
		g, err := New(m, o)
		if err != nil {
			b.Fatal(err)
		}
		b.Logf("device %+v", g.Info())
		sizes := []int{1, 2, 4, 8, 16, 64, 256, 1024}
		if mode != "graph" && mode != "graph-unfused" {
			sizes = []int{1, 8, 1024}
		}
		for _, n := range sizes {
			for _, withLogits := range []bool{true, false} {
				if !withLogits && (n > 1 && n < 1024 || mode != "graph" && mode != "graph-unfused") {
					continue
				}
				name := fmt.Sprintf("%s/seqs=%d", mode, n)
				if !withLogits {
					name += "/nologits"
				}
				b.Run(name, func(b *testing.B) {
					bt := decodeBatch(n, 24, g.BlockSize(), withLogits)
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
