package cuda

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"chunlian/engine"
	"chunlian/forward"
	"chunlian/model"
	"chunlian/sampler"
)

// The GPU tests compare this backend with forward.NewCPU (the float32 CPU
// reference) on identical batches, block tables and slot mappings.
// Tolerances (max |Δlogit| relative to max(1, max |logit|) of the row):
//   - Precision "fp32": 1e-3 (float32 FMAs in a different order, plus the
//     GPU's expf/sqrtf; measured far below this)
//   - Precision "tf32": 3e-2 (TF32 keeps 10 mantissa bits in the GEMM
//     inputs, accumulation stays float32)
//   - Precision "bf16": 1e-1 (the GEMMs' input activations keep 8
//     significant bits; the weights are exact where the model is stored
//     in bf16, accumulation stays float32)
const (
	tolFP32 = 1e-3
	tolTF32 = 3e-2
	tolBF16 = 1e-1
)

// tolFor is the logits tolerance of a Precision.
func tolFor(prec string) float64 {
	switch prec {
	case "tf32":
		return tolTF32
	case "bf16":
		return tolBF16
	}
	return tolFP32
}

// gpuOrSkip skips the test when no CUDA device is usable, logging why.
func gpuOrSkip(t testing.TB) {
	t.Helper()
	if ok, err := Available(""); !ok {
		t.Skipf("no CUDA GPU: %v", err)
	}
}

func TestSearchDirs(t *testing.T) {
	for _, tc := range []struct {
		explicit, env string
		want          []string
	}{
		{"", "", []string{""}},
		{"/a", "", []string{"/a", ""}},
		{"/a", "/b:/c", []string{"/a", "/b", "/c", ""}},
		{"/a", "/a", []string{"/a", ""}},
	} {
		if got := searchDirs(tc.explicit, tc.env); !slices.Equal(got, tc.want) {
			t.Errorf("searchDirs(%q, %q) = %q, want %q", tc.explicit, tc.env, got, tc.want)
		}
	}
	got := candidates([]string{"/x", ""}, []string{"liba.so.1", "liba.so"})
	want := []string{"/x/liba.so.1", "/x/liba.so", "liba.so.1", "liba.so"}
	if !slices.Equal(got, want) {
		t.Errorf("candidates = %q, want %q", got, want)
	}
}

// TestMissingLibraryError checks the message a machine without CUDA gets:
// it names the library and the flag/variable to set.
func TestMissingLibraryError(t *testing.T) {
	dir := t.TempDir()
	_, _, err := openFirst("libdoesnotexist", searchDirs(dir, ""), []string{"libchunlian-none.so.9"})
	if err == nil {
		t.Fatal("opening a library that does not exist succeeded")
	}
	for _, want := range []string{"libdoesnotexist", dir + "/libchunlian-none.so.9 (absent)", "--cuda-lib-dir", "CHUNLIAN_CUDA_LIB_DIR"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if ok, err := Available(""); !ok && (err == nil || err.Error() == "") {
		t.Error("Available is false without an explanation")
	}
}

func TestOptionsDefaults(t *testing.T) {
	for _, tc := range []struct {
		o       Options
		wantErr bool
	}{
		{Options{}, false},
		{Options{BlockSize: -1}, true},
		{Options{MemoryFraction: 1.5}, true},
		{Options{Precision: "bf16"}, false},
		{Options{Precision: "int8"}, true},
		{Options{KVCacheBytes: -5}, true},
		{Options{Precision: "fp32", BlockSize: 32}, false},
	} {
		o := tc.o
		err := o.defaults()
		if (err != nil) != tc.wantErr {
			t.Errorf("%+v: err = %v, wantErr %v", tc.o, err, tc.wantErr)
		}
		if err == nil && (o.BlockSize < 1 || o.MemoryFraction <= 0 || o.MaxBatchTokens < 1 || o.GroupedAttentionFrom == 0) {
			t.Errorf("%+v: defaults left %+v", tc.o, o)
		}
	}
}

// TestFusedPaths: which fused kernels a backend runs for each option set,
// and the requests it must refuse (no GPU needed).
func TestFusedPaths(t *testing.T) {
	shipped := model.Config{HiddenSize: 384, IntermediateSize: 1024}
	odd := model.Config{HiddenSize: 72, IntermediateSize: 90}
	for _, tc := range []struct {
		o       Options
		c       model.Config
		qkv     int
		want    fused
		wantErr string
	}{
		{Options{Precision: "bf16"}, shipped, 1152, fused{}, ""},
		{Options{Precision: "fp32"}, shipped, 1152, fused{}, ""},
		{Options{Precision: "bf16", GateUpBF16: true}, shipped, 1152, fused{gu16: true}, ""},
		{Options{Precision: "bf16", GateUpBF16: true, FusedMLP: true}, shipped, 1152, fused{mlp: true}, ""},
		{Options{Precision: "bf16", FusedMLPNorm: true}, shipped, 1152, fused{mlp: true, mlpNorm: true}, ""},
		{Options{Precision: "bf16", FusedMLPNorm: true, FusedQKVNorm: true}, shipped, 1152, fused{mlp: true, mlpNorm: true, qkv: true}, ""},
		{Options{Precision: "tf32", FusedMLP: true}, shipped, 1152, fused{}, "Precision bf16"},
		{Options{Precision: "bf16", GateUpBF16: true}, odd, 216, fused{}, "multiple of 8"},
		{Options{Precision: "bf16", FusedQKVNorm: true}, odd, 216, fused{}, "multiple of 32"},
		{Options{Precision: "bf16", FusedQKVNorm: true}, shipped, 1151, fused{}, "even QKV width"},
	} {
		got, err := fusedPaths(tc.o, tc.c, tc.qkv)
		switch {
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%+v, d %d: err %v, want one saying %q", tc.o, tc.c.HiddenSize, err, tc.wantErr)
		case tc.wantErr == "" && (err != nil || got != tc.want):
			t.Errorf("%+v, d %d: %+v, %v; want %+v", tc.o, tc.c.HiddenSize, got, err, tc.want)
		}
	}
}

// TestAttnKernel: which attention kernel a step of T tokens runs, by
// Options.GroupedAttentionFrom (no GPU needed).
func TestAttnKernel(t *testing.T) {
	for _, tc := range []struct {
		from, T int
		want    string
	}{
		{DefaultGroupedAttentionFrom, DefaultGroupedAttentionFrom - 1, "paged_attention_rope"},
		{DefaultGroupedAttentionFrom, DefaultGroupedAttentionFrom, "paged_attention_rope_g"},
		{1, 1, "paged_attention_rope_g"},
		{-1, 1 << 20, "paged_attention_rope"},
	} {
		b := &Backend{opt: Options{GroupedAttentionFrom: tc.from}}
		if got := b.attnKernel("paged_attention_rope", tc.T); got != tc.want {
			t.Errorf("from %d, %d tokens: %s, want %s", tc.from, tc.T, got, tc.want)
		}
		want := strings.Replace(tc.want, "rope", "chunked", 1)
		if got := b.attnKernel("paged_attention_chunked", tc.T); got != want {
			t.Errorf("from %d, %d tokens: %s, want %s", tc.from, tc.T, got, want)
		}
	}
	for _, n := range []string{"paged_attention_rope_g", "paged_attention_chunked_g"} {
		if !slices.Contains(kernelNames, n) {
			t.Errorf("kernelNames lacks %s", n)
		}
	}
}

// testConfigs are model shapes covering head dims below, at and above one
// warp, GQA and MHA, and tied embeddings.
func testConfigs() map[string]model.Config {
	small := model.TestConfig() // hd 16, 4 heads / 2 KV heads, untied
	mid := model.TestConfig()
	mid.HiddenSize, mid.NumHeads, mid.NumKVHeads, mid.HeadDim = 256, 4, 4, 64
	mid.IntermediateSize, mid.NumLayers, mid.VocabSize = 688, 3, 1000
	mid.TieWordEmbeddings = true
	wide := model.TestConfig()
	wide.HiddenSize, wide.NumHeads, wide.NumKVHeads, wide.HeadDim = 384, 3, 1, 128
	wide.IntermediateSize, wide.NumLayers, wide.VocabSize = 1024, 2, 700
	// An MLP width that is not a multiple of 4 keeps every batch size off
	// the GEMV path (gemvShapesOK): the cuBLAS path at one token.
	odd := model.TestConfig()
	odd.IntermediateSize = 90
	return map[string]model.Config{"small": small, "mid-tied": mid, "wide-hd128": wide, "odd-ffn": odd}
}

// seqSim is one test sequence: its tokens so far and its block table,
// mirrored identically into both backends.
type seqSim struct {
	tokens []int32
	table  []int32
	cached int // tokens whose K/V are in the cache
}

// blockPool hands out blocks in a scrambled order so block tables are not
// contiguous.
type blockPool struct{ free []int32 }

func newBlockPool(n int, r *rand.Rand) *blockPool {
	p := &blockPool{}
	for i := range n {
		p.free = append(p.free, int32(i))
	}
	r.Shuffle(len(p.free), func(i, j int) { p.free[i], p.free[j] = p.free[j], p.free[i] })
	return p
}

func (p *blockPool) get() int32 { b := p.free[0]; p.free = p.free[1:]; return b }

// step describes one batch: for each sequence, how many new tokens it
// schedules (0 = not in this step).
type chunk struct {
	seq  int
	n    int
	want []int // offsets within the chunk whose logits are asked for
}

// buildBatch appends new random tokens to each scheduled sequence and builds
// the forward.Batch.
func buildBatch(seqs []*seqSim, chunks []chunk, bs int, pool *blockPool, r *rand.Rand, vocab int) *forward.Batch {
	b := &forward.Batch{}
	for _, c := range chunks {
		s := seqs[c.seq]
		start := len(b.Tokens)
		for i := 0; i < c.n; i++ {
			pos := s.cached + i
			if pos >= len(s.tokens) {
				s.tokens = append(s.tokens, int32(r.IntN(vocab)))
			}
			for pos/bs >= len(s.table) {
				s.table = append(s.table, pool.get())
			}
			b.Tokens = append(b.Tokens, s.tokens[pos])
			b.Positions = append(b.Positions, int32(pos))
			b.SlotMapping = append(b.SlotMapping, s.table[pos/bs]*int32(bs)+int32(pos%bs))
		}
		s.cached += c.n
		b.Seqs = append(b.Seqs, forward.SeqSpan{Start: start, Len: c.n, CtxLen: s.cached, BlockTable: slices.Clone(s.table)})
		for _, w := range c.want {
			b.LogitRows = append(b.LogitRows, start+w)
		}
	}
	return b
}

// compareLogits returns the worst |Δ| / max(1, max|ref|) over rows and the
// number of rows whose argmax differs.
func compareLogits(got, ref []float32, V int) (worst float64, argmaxDiff int) {
	for r := 0; r < len(ref)/V; r++ {
		g, w := got[r*V:(r+1)*V], ref[r*V:(r+1)*V]
		scale, d := 1.0, 0.0
		for i := range w {
			scale = math.Max(scale, math.Abs(float64(w[i])))
			if math.IsNaN(float64(g[i])) {
				return math.Inf(1), argmaxDiff + 1
			}
			d = math.Max(d, math.Abs(float64(g[i]-w[i])))
		}
		worst = math.Max(worst, d/scale)
		if argmax(g) != argmax(w) {
			argmaxDiff++
		}
	}
	return worst, argmaxDiff
}

// checkLSE compares the GPU's row log-sum-exp with sampler.LogSumExp (the
// host computation it replaces in the engine) of the same GPU logits rows.
func checkLSE(t *testing.T, label string, lse, logits []float32, V int) {
	t.Helper()
	R := len(logits) / V
	if len(lse) != R {
		t.Errorf("%s: LogSumExp has %d rows, want %d", label, len(lse), R)
		return
	}
	for r := 0; r < R; r++ {
		if want := sampler.LogSumExp(logits[r*V : (r+1)*V]); !lseClose(lse[r], want) {
			t.Errorf("%s: row %d log-sum-exp %g, host %g", label, r, lse[r], want)
		}
	}
}

func argmax(x []float32) int {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return best
}

func newPair(t *testing.T, m *model.Model, precision string, bs int, eager bool) (*Backend, *forward.CPU) {
	return newPairOpt(t, m, Options{Precision: precision, BlockSize: bs, EagerOnly: eager})
}

// newPairOpt is newPair with more options (KV cache and batch size are
// set here).
func newPairOpt(t *testing.T, m *model.Model, o Options) (*Backend, *forward.CPU) {
	t.Helper()
	bs := o.BlockSize
	o.KVCacheBytes, o.MaxBatchTokens = 64<<20, 64
	g, err := New(m, o)
	if err != nil {
		t.Fatalf("cuda.New: %v", err)
	}
	t.Cleanup(func() { g.Close() })
	c, err := forward.NewCPU(m, forward.CPUOptions{BlockSize: bs, KVCacheBytes: int64(g.NumBlocks()) * int64(bs) * forward.KVBytesPerToken(m.Config)})
	if err != nil {
		t.Fatalf("forward.NewCPU: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	if c.NumBlocks() < 64 || g.NumBlocks() < 64 {
		t.Fatalf("caches too small: cpu %d gpu %d blocks", c.NumBlocks(), g.NumBlocks())
	}
	return g, c
}

// TestForwardMatchesCPU runs prefill, chunked prefill, mixed decode steps
// and a copy-on-write fork on both backends and compares every requested
// logits row.
func TestForwardMatchesCPU(t *testing.T) {
	gpuOrSkip(t)
	for name, cfg := range testConfigs() {
		// -eager: no CUDA graphs (batches of 3 and 5 tokens then run
		// unpadded); -bf16w: the model's weight matrices rounded to bf16
		// first, so the GEMV path reads its bf16 copies (lossless, like
		// the shipped model). Programmatic dependent launches are on
		// wherever the device supports them.
		// -attg: the grouped attention kernels at every step (the
		// default takes them from 64 tokens, more than any step here).
		// -gu16: the gate/up GEMM writes bf16 (Options.GateUpBF16);
		// -fmlp: gate/up and SiLU·up in one kernel (Options.FusedMLP);
		// -fnorm: RMSNorm as well (Options.FusedMLPNorm); -fqkv: RMSNorm
		// and the QKV projection in one kernel (Options.FusedQKVNorm).
		// -bsN (last): N-token KV blocks instead of 16 (the CUDA default is 2).
		for _, variant := range []string{"fp32", "tf32", "fp32-eager", "fp32-bf16w", "tf32-eager-bf16w", "bf16", "bf16-eager-bf16w", "bf16-bf16w-bs4", "fp32-bs1", "fp32-eager-bs1",
			"fp32-attg", "fp32-eager-attg-bs1", "bf16-bf16w-attg-bs2", "bf16-gu16", "bf16-eager-bf16w-fmlp-bs2", "bf16-bf16w-fqkv-fnorm-bs2", "bf16-eager-fqkv-fnorm"} {
			prec, _, _ := strings.Cut(variant, "-")
			eager, bf16w := strings.Contains(variant, "-eager"), strings.Contains(variant, "-bf16w")
			grouped := 0
			if strings.Contains(variant, "-attg") {
				grouped = 1
			}
			if strings.Contains(variant, "-gu16") && cfg.IntermediateSize%8 != 0 {
				continue // New refuses it (TestFusedPaths)
			}
			bs := 16
			if _, n, ok := strings.Cut(variant, "-bs"); ok {
				bs, _ = strconv.Atoi(n)
			}
			t.Run(name+"/"+variant, func(t *testing.T) {
				tol := tolFor(prec)
				m := model.NewRandom(cfg, 7)
				if cfg.TieWordEmbeddings {
					m.Weights.LMHead = m.Weights.Embed
				}
				if bf16w {
					roundModelBF16(m)
				}
				g, c := newPairOpt(t, m, Options{Precision: prec, BlockSize: bs, EagerOnly: eager, GroupedAttentionFrom: grouped,
					GateUpBF16: strings.Contains(variant, "-gu16"), FusedMLP: strings.Contains(variant, "-fmlp"),
					FusedMLPNorm: strings.Contains(variant, "-fnorm"), FusedQKVNorm: strings.Contains(variant, "-fqkv")})
				t.Logf("device %+v", g.Info())
				wantPath := "gemv-fp32"
				switch {
				case name == "odd-ffn":
					wantPath = "cublas"
				case bf16w:
					wantPath = "gemv-bf16"
				}
				if got := g.Info().SmallBatchPath; got != wantPath {
					t.Fatalf("small-batch path %q, want %q", got, wantPath)
				}
				r := rand.New(rand.NewPCG(1, 2))
				pool := newBlockPool(max(64, 1024/bs), r) // the steps below hold about 150 tokens
				seqs := []*seqSim{{}, {}, {}, {}}
				V := cfg.VocabSize
				steps := [][]chunk{
					// prefill: a 20-token prompt, a 5-token one, one over 3 blocks
					{{0, 20, []int{19, 3}}, {1, 5, []int{4}}, {2, 37, []int{0, 16, 36}}},
					// decode 0 and 2, chunked prefill of 1 continues, 3 starts
					{{0, 1, []int{0}}, {1, 12, []int{11}}, {2, 1, []int{0}}, {3, 1, []int{0}}},
					{{0, 1, []int{0}}, {1, 1, []int{0}}, {2, 1, []int{0}}, {3, 30, []int{29}}},
				}
				for i := 0; i < 6; i++ { // steady decode
					steps = append(steps, []chunk{{0, 1, []int{0}}, {1, 1, []int{0}}, {2, 1, []int{0}}, {3, 1, []int{0}}})
				}
				run := func(label string, b *forward.Batch) {
					R := len(b.LogitRows)
					got, ref := make([]float32, R*V), make([]float32, R*V)
					for i := range got {
						got[i] = float32(math.NaN()) // poison: every value must be written
					}
					if err := g.Forward(b, got); err != nil {
						t.Fatalf("%s: cuda Forward: %v", label, err)
					}
					if err := c.Forward(b, ref); err != nil {
						t.Fatalf("%s: cpu Forward: %v", label, err)
					}
					checkLSE(t, label, g.LogSumExp(), got, V)
					worst, diff := compareLogits(got, ref, V)
					t.Logf("%s: %d tokens, %d rows, worst rel |Δ| %.2e, argmax differs in %d", label, len(b.Tokens), R, worst, diff)
					if worst > tol {
						t.Errorf("%s: worst relative |Δlogit| %.3e > %.0e", label, worst, tol)
					}
					if prec == "fp32" && diff > 0 {
						t.Errorf("%s: argmax differs in %d rows", label, diff)
					}
				}
				for i, st := range steps {
					run(fmt.Sprintf("step %d", i), buildBatch(seqs, st, bs, pool, r, V))
				}
				// Fork sequence 0 (its last block is partial): copy the block
				// on both backends, then let parent and child diverge.
				parent := seqs[0]
				last := parent.table[len(parent.table)-1]
				filled := int32(parent.cached - (len(parent.table)-1)*bs) // slots of the last block holding tokens
				nb := pool.get()
				for _, be := range []forward.Backend{g, c} {
					if err := be.CopyBlocks([]int32{last}, []int32{nb}, []int32{filled}); err != nil {
						t.Fatalf("CopyBlocks: %v", err)
					}
				}
				child := &seqSim{tokens: slices.Clone(parent.tokens), table: slices.Clone(parent.table), cached: parent.cached}
				child.table[len(child.table)-1] = nb
				seqs = append(seqs, child)
				for i := 0; i < 3; i++ {
					run(fmt.Sprintf("fork %d", i), buildBatch(seqs, []chunk{{0, 1, []int{0}}, {4, 1, []int{0}}}, bs, pool, r, V))
				}
				// One sequence alone: a one-token step (the GEMV path).
				run("decode 1", buildBatch(seqs, []chunk{{4, 1, []int{0}}}, bs, pool, r, V))
				// Batches of 3 and 5 tokens pad to graph buckets 4 and 8;
				// logits rows only for some of them.
				run("decode 3", buildBatch(seqs, []chunk{{1, 1, []int{0}}, {2, 1, nil}, {3, 1, []int{0}}}, bs, pool, r, V))
				run("decode 5", buildBatch(seqs, []chunk{{0, 1, []int{0}}, {1, 1, []int{0}}, {2, 1, []int{0}}, {3, 1, nil}, {4, 1, []int{0}}}, bs, pool, r, V))
				gs := g.GraphStats()
				t.Logf("graphs: %+v", gs)
				if eager && gs.Launches != 0 {
					t.Errorf("EagerOnly backend replayed %d graphs", gs.Launches)
				}
				if !eager && (gs.Err != nil || gs.Launches == 0) {
					t.Errorf("steps did not run as graphs: %+v", gs)
				}
			})
		}
	}
}

// roundModelBF16 rounds every weight matrix of m to bfloat16 in place (the
// norms stay float32, as they do in the backend).
func roundModelBF16(m *model.Model) {
	round := func(s []float32) {
		for i, h := range toBF16(s) {
			s[i] = math.Float32frombits(uint32(h) << 16)
		}
	}
	w := m.Weights
	round(w.Embed)
	if len(w.LMHead) > 0 && &w.LMHead[0] != &w.Embed[0] {
		round(w.LMHead)
	}
	for _, L := range w.Layers {
		for _, s := range [][]float32{L.Wq, L.Wk, L.Wv, L.Wo, L.WGate, L.WUp, L.WDown} {
			round(s)
		}
	}
}

// tinyBackend is a backend over the small random test model with a 1 MiB
// cache (skipping without a GPU), closed when the test ends, and its
// vocabulary size.
func tinyBackend(t *testing.T, o Options) (*Backend, int) {
	t.Helper()
	gpuOrSkip(t)
	m := model.NewRandom(model.TestConfig(), 3)
	o.KVCacheBytes = 1 << 20
	g, err := New(m, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g, m.Config.VocabSize
}

// twoTokens is a batch of one sequence of two tokens in block 0, with
// logits for the given rows (indices into its two tokens).
func twoTokens(rows ...int) *forward.Batch {
	return &forward.Batch{Tokens: []int32{1, 2}, Positions: []int32{0, 1}, SlotMapping: []int32{0, 1},
		Seqs: []forward.SeqSpan{{Start: 0, Len: 2, CtxLen: 2, BlockTable: []int32{0}}}, LogitRows: rows}
}

// TestForwardRejectsBadBatches checks that malformed batches fail with an
// error instead of reading or writing out of bounds on the device.
func TestForwardRejectsBadBatches(t *testing.T) {
	g, V := tinyBackend(t, Options{})
	ok := func() *forward.Batch { return twoTokens(1) }
	if err := g.Forward(ok(), make([]float32, V)); err != nil {
		t.Fatalf("valid batch failed: %v", err)
	}
	for name, mut := range map[string]func(b *forward.Batch){
		"token":    func(b *forward.Batch) { b.Tokens[0] = int32(V) },
		"slot":     func(b *forward.Batch) { b.SlotMapping[1] = int32(g.NumBlocks() * g.BlockSize()) },
		"block":    func(b *forward.Batch) { b.Seqs[0].BlockTable[0] = int32(g.NumBlocks()) },
		"position": func(b *forward.Batch) { b.Positions[1] = 16 }, // needs a second block
		"row":      func(b *forward.Batch) { b.LogitRows[0] = 2 },
		"orphan":   func(b *forward.Batch) { b.Seqs[0].Len = 1 },
		"lengths":  func(b *forward.Batch) { b.Positions = b.Positions[:1] },
	} {
		b := ok()
		mut(b)
		if err := g.Forward(b, make([]float32, V)); err == nil {
			t.Errorf("%s: malformed batch accepted", name)
		}
	}
	if err := g.CopyBlocks([]int32{0}, []int32{int32(g.NumBlocks())}, []int32{1}); err == nil {
		t.Error("CopyBlocks out of range accepted")
	}
	if err := g.CopyBlocks([]int32{0}, []int32{1}, []int32{int32(g.BlockSize() + 1)}); err == nil {
		t.Error("CopyBlocks of more slots than a block accepted")
	}
}

// TestEngineGreedyMatchesCPU runs the real continuous-batching engine on
// both backends (fp32 GEMMs) and expects identical greedy outputs.
func TestEngineGreedyMatchesCPU(t *testing.T) {
	gpuOrSkip(t)
	m := model.NewRandom(model.TestConfig(), 11)
	g, c := newPair(t, m, "fp32", 16, false)
	eg, err := engine.New(g, engine.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer eg.Close()
	ec, err := engine.New(c, engine.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer ec.Close()
	r := rand.New(rand.NewPCG(5, 6))
	type out struct {
		toks [][]int32
		lps  [][]float32
		err  error
	}
	gen := func(e engine.Engine, prompts [][]int32) out {
		res := make([][]int32, len(prompts))
		lps := make([][]float32, len(prompts))
		errs := make(chan error, len(prompts))
		for i, p := range prompts {
			go func() {
				rr, err := e.Generate(context.Background(), &engine.Request{ID: fmt.Sprint(i), Prompt: p,
					Params: sampler.Params{Temperature: 0, MaxTokens: 12, N: 1, TopP: 1, RepetitionPenalty: 1}})
				if err == nil {
					res[i], lps[i] = rr.Completions[0].Tokens, rr.Completions[0].LogProbs
				}
				errs <- err
			}()
		}
		var first error
		for range prompts {
			if err := <-errs; err != nil && first == nil {
				first = err
			}
		}
		return out{res, lps, first}
	}
	var prompts [][]int32
	for i := 0; i < 8; i++ {
		p := make([]int32, 3+r.IntN(20))
		for j := range p {
			p[j] = int32(r.IntN(m.Config.VocabSize))
		}
		prompts = append(prompts, p)
	}
	compare := func(round string, prompts [][]int32) out {
		og, oc := gen(eg, prompts), gen(ec, prompts)
		if og.err != nil || oc.err != nil {
			t.Fatalf("%s: generate: cuda %v, cpu %v", round, og.err, oc.err)
		}
		for i := range prompts {
			if !slices.Equal(og.toks[i], oc.toks[i]) {
				t.Errorf("%s prompt %d: cuda %v, cpu %v", round, i, og.toks[i], oc.toks[i])
				continue
			}
			// The cuda engine's log-probs come from the GPU's row
			// log-sum-exp (forward.RowLSEBackend), the CPU engine's from
			// the host's.
			for j := range og.lps[i] {
				if d := math.Abs(float64(og.lps[i][j] - oc.lps[i][j])); !(d <= 1e-3) {
					t.Errorf("%s prompt %d token %d: log-prob cuda %v, cpu %v", round, i, j, og.lps[i][j], oc.lps[i][j])
				}
			}
		}
		return og
	}
	og := compare("first round", prompts)
	// A second round served partly from the blocks the first one left in
	// the prefix cache, partial ones included (copied on the GPU by
	// CopyBlocks): each prompt again, and each prompt continued by its
	// completion (the freed last block of its first-round sequence).
	var round2 [][]int32
	for i, p := range prompts {
		round2 = append(round2, p, append(slices.Clone(p), og.toks[i]...))
	}
	hits0 := eg.Stats().PrefixHits
	compare("second round", round2)
	if eg.Stats().PrefixHits == hits0 {
		t.Error("second round: no prefix-cache hits on the cuda engine")
	}
}

// TestDefaultModelMatchesCPU compares the trained model's logits on a
// realistic prompt batch (fp32, TF32 and bf16 GEMMs).
func TestDefaultModelMatchesCPU(t *testing.T) {
	gpuOrSkip(t)
	m, err := trainedModel()
	if err != nil {
		t.Skipf("no trained model: %v", err)
	}
	for _, prec := range []string{"fp32", "tf32", "bf16"} {
		t.Run(prec, func(t *testing.T) {
			tol := tolFor(prec)
			g, c := newPair(t, m, prec, 16, false)
			t.Logf("small-batch path %s", g.Info().SmallBatchPath)
			if bf16Exact(m.Weights.LMHead) && g.Info().SmallBatchPath != "gemv-bf16" {
				t.Errorf("bf16-stored model runs small batches on %q, want gemv-bf16", g.Info().SmallBatchPath)
			}
			r := rand.New(rand.NewPCG(9, 9))
			pool := newBlockPool(64, r)
			seqs := []*seqSim{{}, {}, {}}
			V := m.Config.VocabSize
			for i, st := range [][]chunk{
				{{0, 12, []int{11}}, {1, 25, []int{24}}, {2, 7, []int{6}}},
				{{0, 1, []int{0}}, {1, 1, []int{0}}, {2, 1, []int{0}}},
				{{0, 1, []int{0}}, {1, 1, []int{0}}, {2, 1, []int{0}}},
			} {
				b := buildBatch(seqs, st, 16, pool, r, V)
				got, ref := make([]float32, len(b.LogitRows)*V), make([]float32, len(b.LogitRows)*V)
				if err := g.Forward(b, got); err != nil {
					t.Fatal(err)
				}
				if err := c.Forward(b, ref); err != nil {
					t.Fatal(err)
				}
				worst, diff := compareLogits(got, ref, V)
				t.Logf("step %d: worst rel |Δ| %.2e, argmax differs in %d of %d rows", i, worst, diff, len(b.LogitRows))
				if worst > tol {
					t.Errorf("step %d: worst relative |Δlogit| %.3e > %.0e", i, worst, tol)
				}
			}
		})
	}
}

// trainedModel returns the embedded default model or, in a build that
// embeds none (the GPU machine gets binaries built without the weights to
// fit its transfer limit), the one in the repository's weights directory.
func trainedModel() (*model.Model, error) {
	m, err := model.Default()
	if err == nil {
		return m, nil
	}
	for _, dir := range []string{"../weights/chunlian-base", "weights/chunlian-base"} {
		if m, err2 := model.Load(dir); err2 == nil {
			return m, nil
		}
	}
	return nil, err
}

func TestNVML(t *testing.T) {
	gpuOrSkip(t)
	n, err := OpenNVML("")
	if err != nil {
		t.Skipf("NVML: %v", err)
	}
	s, err := n.Sample(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", s)
	if s.MemTotal <= 0 || s.MemUsed < 0 || s.UtilGPU < 0 || s.UtilGPU > 100 {
		t.Errorf("implausible sample %+v", s)
	}
}

func TestGraphBucket(t *testing.T) {
	for _, tc := range []struct {
		T, want int
		fine    bool
	}{
		{0, 0, false}, {1, 1, false}, {2, 2, false}, {3, 4, false}, {5, 8, false}, {8, 8, false}, {9, 16, false}, {16, 16, false}, {17, 32, false},
		{256, 256, false}, {257, 384, false}, {2048, 2048, false}, {2049, 2560, false}, {8192, 8192, false}, {8193, 0, false},
		{0, 0, true}, {3, 4, true}, {9, 16, true}, {257, 272, true}, {1024, 1024, true}, {1025, 1088, true},
		{4096, 4096, true}, {4097, 4352, true}, {8192, 8192, true}, {8193, 0, true},
	} {
		if got := graphBucket(tc.T, tc.fine); got != tc.want {
			t.Errorf("graphBucket(%d, fine %v) = %d, want %d", tc.T, tc.fine, got, tc.want)
		}
	}
	// Every bucket holds its batch, and finer buckets never pad more.
	for T := 1; T <= maxGraphTokens; T++ {
		c, f := graphBucket(T, false), graphBucket(T, true)
		if c < T || f < T || f > c {
			t.Fatalf("T %d: buckets %d (coarse), %d (fine)", T, c, f)
		}
	}
}

// TestPadMeta checks the padded layout a decode graph reads: real entries
// first, then padding that points at the reserved block and dummy sequence.
func TestPadMeta(t *testing.T) {
	b := hostOnlyBackend() // BlockSize 4, 8 blocks: reserved block 8, dummy slot 32
	bt := twoSeqBatch()
	bt.Tokens, bt.Positions, bt.SlotMapping = []int32{13, 14}, []int32{2, 5}, []int32{22, 29}
	bt.Seqs[0].Start, bt.Seqs[0].Len, bt.Seqs[1].Start = 0, 1, 1
	bt.LogitRows = []int{1}
	off, stride, err := b.prepare(bt, make([]float32, b.cfg.VocabSize))
	if err != nil {
		t.Fatal(err)
	}
	p, po := b.padMeta(off, 2, 1, 2, stride, 4)
	for _, tc := range []struct {
		name      string
		got, want []int32
	}{
		{"tokens", p[po[0]:po[1]], []int32{13, 14, 0, 0}},
		{"positions", p[po[1]:po[2]], []int32{2, 5, 0, 0}},
		{"slots", p[po[2]:po[3]], []int32{22, 29, 32, 32}},
		{"tokSeq", p[po[3]:po[4]], []int32{0, 1, 2, 2}},
		{"rows", p[po[4]:po[5]], []int32{1, 0, 0, 0}},
		{"tables", p[po[5]:], []int32{5, 0, 2, 7, 8, 8}},
	} {
		if !slices.Equal(tc.got, tc.want) {
			t.Errorf("%s = %v, want %v", tc.name, tc.got, tc.want)
		}
	}
}

// TestKernelsCompile compiles the embedded kernels with whatever NVRTC is
// found (no GPU needed), for several head sizes, so a syntax error shows up
// on any machine that has NVRTC. It skips when NVRTC is absent (CPU CI).
func TestKernelsCompile(t *testing.T) {
	f, path, err := loadNVRTCOnly("")
	if err != nil {
		t.Skipf("NVRTC not available: %v", err)
	}
	maj, min := f.Version()
	t.Logf("NVRTC %d.%d from %s", maj, min, path)
	for _, tc := range []struct {
		headDim int
		arch    string
	}{
		{64, "compute_80"},
		{32, "compute_80"},
		{16, "compute_80"},
		{48, "compute_80"},
		{128, "sm_80"},
		// CHUNLIAN_CUDA_TEST_ARCH (e.g. sm_90) adds the device's own CUBIN
		// target: run it alone first to learn whether the device's NVRTC
		// compiles the kernels natively.
		{64, os.Getenv("CHUNLIAN_CUDA_TEST_ARCH")},
	} {
		if tc.arch == "" {
			continue
		}
		res, err := f.compileSource("llama.cu", kernelSource, tc.arch, kernelOptions(tc.headDim))
		if err != nil {
			t.Fatalf("headDim %d arch %s: %v", tc.headDim, tc.arch, err)
		}
		if len(res.image) < 100 {
			t.Fatalf("headDim %d: image only %d bytes", tc.headDim, len(res.image))
		}
		if !res.cubin {
			ptx := string(res.image)
			for _, k := range kernelNames {
				if !strings.Contains(ptx, ".entry "+k) {
					t.Errorf("headDim %d: PTX has no entry %s", tc.headDim, k)
				}
			}
		}
		if res.log != "" {
			t.Logf("headDim %d log: %s", tc.headDim, res.log)
		}
	}
}
