package forward

import (
	"fmt"
	"testing"

	"chunlian/kernels/cpu"
	"chunlian/model"
)

// bf16Model is the random test model with its matrices rounded to bf16, so
// it has bf16 copies (model.Weights.BF16) like a model loaded from a bf16
// file.
func bf16Model(t *testing.T, seed int64) *model.Model {
	t.Helper()
	m := model.NewRandom(model.TestConfig(), seed)
	m.Weights.RoundToBF16()
	if m.Weights.BF16 == nil {
		t.Fatal("RoundToBF16 left no bf16 weights")
	}
	return m
}

// TestBF16MatchesDense runs n sequences in lockstep (one prefill step of a
// few tokens each, then single-token decode steps, so the GEMMs see T = n…
// and the LM head R = n rows) with the bf16 path on for every row count,
// on by default, and off, and checks every position's logits against the
// dense float64 reference. The bf16 copies hold the same values as the
// float32 weights, so all three must agree with the reference as closely
// as the float32 path does.
func TestBF16MatchesDense(t *testing.T) {
	m := bf16Model(t, 31)
	const bs, steps, prompt = 8, 12, 3
	rng := newRNG(31)
	for _, n := range []int{1, 2, 3, 5, 9} {
		seqs := make([][]int32, n)
		refs := make([][][]float32, n)
		for i := range seqs {
			seqs[i] = randomTokens(rng, prompt+steps, m.Config.VocabSize)
			refs[i] = refForward(m, seqs[i])
		}
		for _, mode := range []struct {
			name     string
			min, max int
		}{{"all", 1, 1 << 20}, {"default", 0, 0}, {"off", 0, -1}} {
			t.Run(fmt.Sprintf("n=%d/%s", n, mode.name), func(t *testing.T) {
				c, err := NewCPU(m, CPUOptions{BlockSize: bs, BF16MinRows: mode.min, BF16MaxRows: mode.max})
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				if want := mode.max >= 0 && cpu.HasFastBF16(); c.UsesBF16() != want {
					t.Fatalf("UsesBF16() = %v, want %v", c.UsesBF16(), want)
				}
				fl := newFreeList(c.NumBlocks(), rng)
				st := make([]*seqState, n)
				for i := range st {
					st[i] = &seqState{tokens: seqs[i]}
				}
				V := m.Config.VocabSize
				for step := 0; step <= steps; step++ {
					k := 1
					if step == 0 {
						k = prompt
					}
					var b Batch
					for _, s := range st {
						b.LogitRows = append(b.LogitRows, addStep(&b, s, k, bs, fl))
					}
					logits := make([]float32, n*V)
					if err := c.Forward(&b, logits); err != nil {
						t.Fatal(err)
					}
					for i, s := range st {
						want := refs[i][s.done-1]
						if d := maxAbsDiff(logits[i*V:(i+1)*V], want); d > 1e-4 {
							t.Fatalf("step %d seq %d: max |Δlogit| = %g", step, i, d)
						}
					}
				}
			})
		}
	}
}

// TestBF16EnvOff checks the CHUNLIAN_BF16=0 switch and that a model without
// bf16 copies never takes the bf16 path.
func TestBF16EnvOff(t *testing.T) {
	m := bf16Model(t, 32)
	t.Setenv("CHUNLIAN_BF16", "0")
	c, err := NewCPU(m, CPUOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.UsesBF16() {
		t.Error("UsesBF16 with CHUNLIAN_BF16=0")
	}
	t.Setenv("CHUNLIAN_BF16", "")
	c2, err := NewCPU(model.NewRandom(model.TestConfig(), 32), CPUOptions{BF16MaxRows: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if c2.UsesBF16() {
		t.Error("UsesBF16 on a model without bf16 weights")
	}
}

// BenchmarkDecodeBF16 compares, in one run, a decode step of the shipped
// model at small batches with every GEMM on the bf16 weights ("bf16") and
// on the float32 ones ("fp32"), 32 tokens of context each. ms/token is per
// sequence-token of the step.
// GOEXPERIMENT=simd go test ./forward -run '^$' -bench DecodeBF16 -benchtime 200x
func BenchmarkDecodeBF16(b *testing.B) {
	m, err := model.Default()
	if err != nil {
		b.Skipf("default model: %v", err)
	}
	if m.Weights.BF16 == nil || !cpu.HasFastBF16() {
		b.Skip("no bf16 weights or no fast bf16 kernel (build with GOEXPERIMENT=simd on amd64)")
	}
	for _, batch := range []int{1, 2, 3, 4, 6, 8} {
		for _, mode := range []struct {
			name     string
			min, max int
		}{{"bf16", 1, 1 << 20}, {"fp32", 0, -1}} {
			b.Run(fmt.Sprintf("batch=%d/%s", batch, mode.name), func(b *testing.B) {
				const ctx = 32
				c, err := NewCPU(m, CPUOptions{BlockSize: 16, BF16MinRows: mode.min, BF16MaxRows: mode.max,
					KVCacheBytes: int64(batch*ctx) * KVBytesPerToken(m.Config)})
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				bt := decodeBatch(batch, ctx, 16)
				logits := make([]float32, batch*m.Config.VocabSize)
				for b.Loop() {
					if err := c.Forward(bt, logits); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(b.Elapsed().Seconds()*1e3/float64(b.N), "ms/step")
				b.ReportMetric(b.Elapsed().Seconds()*1e3/float64(b.N*batch), "ms/token")
			})
		}
	}
}
