package forward

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
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
			name string
			max  int
		}{{"all", 1 << 20}, {"default", 0}, {"off", -1}} {
			t.Run(fmt.Sprintf("n=%d/%s", n, mode.name), func(t *testing.T) {
				c, err := NewCPU(m, CPUOptions{BlockSize: bs, BF16MaxRows: mode.max})
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				if want := mode.max >= 0 && cpu.HasFastBF16(); c.UsesBF16() != want {
					t.Fatalf("UsesBF16() = %v, want %v", c.UsesBF16(), want)
				}
				V := m.Config.VocabSize
				lockstep(t, c, seqs, prompt, bs, newFreeList(c.NumBlocks(), rng), func(step int, _ *Batch, logits []float32, st []*seqState) bool {
					for i, s := range st {
						if d := maxAbsDiff(logits[i*V:(i+1)*V], refs[i][s.done-1]); d > 1e-4 {
							t.Fatalf("step %d seq %d: max |Δlogit| = %g", step, i, d)
						}
					}
					return true
				})
			})
		}
	}
}

// TestDefaultBF16Max: the bf16 (and int8) kernels take every GEMM where
// the float32 one is plain Go, and up to DefaultBF16MaxRows rows beside a
// fast float32 GEMM.
func TestDefaultBF16Max(t *testing.T) {
	for _, tc := range []struct {
		path string
		want int
	}{{"openblas", DefaultBF16MaxRows}, {"asm", math.MaxInt}, {"go", math.MaxInt}} {
		if got := defaultBF16Max(tc.path); got != tc.want {
			t.Errorf("defaultBF16Max(%q) = %d, want %d", tc.path, got, tc.want)
		}
	}
}

// TestBF16Off: BF16MaxRows < 0 turns the bf16 path off, and a model
// without bf16 copies never takes it.
func TestBF16Off(t *testing.T) {
	m := bf16Model(t, 32)
	c, err := NewCPU(m, CPUOptions{BF16MaxRows: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.UsesBF16() {
		t.Error("UsesBF16 with BF16MaxRows -1")
	}
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
// model at small batches with every GEMM on the bf16 weights ("bf16"),
// the same with x rounded to bf16 (CPUOptions.BF16Dot, "bf16dot") and
// on the float32 ones ("fp32"), 32 tokens of context each. ms/token is per
// sequence-token of the step.
//
//	go test ./forward -run '^$' -bench DecodeBF16 -benchtime 200x
func BenchmarkDecodeBF16(b *testing.B) {
	m, err := model.Default()
	if err != nil {
		b.Skipf("default model: %v", err)
	}
	if m.Weights.BF16 == nil || !cpu.HasFastBF16() {
		b.Skip("no bf16 weights or no fast bf16 kernel (needs amd64 with AVX2+FMA, not CHUNLIAN_GEMM=go)")
	}
	for _, batch := range []int{1, 2, 3, 4, 6, 8} {
		for _, mode := range []struct {
			name string
			max  int
			dot  bool
		}{{"bf16", 1 << 20, false}, {"bf16dot", 1 << 20, true}, {"fp32", -1, false}} {
			b.Run(fmt.Sprintf("batch=%d/%s", batch, mode.name), func(b *testing.B) {
				const ctx = 32
				c, err := NewCPU(m, CPUOptions{BlockSize: 16, BF16MaxRows: mode.max, BF16Dot: mode.dot,
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

// dequantized returns a copy of m whose LM head and, if layers, projection
// matrices are replaced by their int8 quantisation widened back (scale·q,
// per output row, as cpu.QuantizeInt8 rounds them). The embedding lookup
// keeps the float32 table, as the int8 path does. For refForward only (the
// copy has no fused or bf16 views).
func dequantized(m *model.Model, layers bool) *model.Model {
	deq := func(n int, w []float32) []float32 {
		k := len(w) / n
		q, s := cpu.QuantizeInt8(n, k, w)
		out := make([]float32, len(w))
		for j := 0; j < n; j++ {
			for p := 0; p < k; p++ {
				out[j*k+p] = s[j] * float32(q[j*k+p])
			}
		}
		return out
	}
	cfg := m.Config
	w := *m.Weights
	w.BF16 = nil
	w.Layers = append([]model.Layer(nil), w.Layers...)
	for i := range w.Layers {
		if !layers {
			break
		}
		L := &w.Layers[i]
		L.Wq, L.Wk, L.Wv = deq(cfg.QDim(), L.Wq), deq(cfg.KVDim(), L.Wk), deq(cfg.KVDim(), L.Wv)
		L.Wo = deq(cfg.HiddenSize, L.Wo)
		L.WGate, L.WUp = deq(cfg.IntermediateSize, L.WGate), deq(cfg.IntermediateSize, L.WUp)
		L.WDown = deq(cfg.HiddenSize, L.WDown)
	}
	w.LMHead = deq(cfg.VocabSize, w.LMHead)
	m2 := *m
	m2.Weights = &w
	return &m2
}

// TestInt8MatchesDequantized runs n sequences in lockstep (a prefill of a
// few tokens each, then decode steps; GEMMs of T = 3n and n rows) with
// CPUOptions.Int8 and checks every position's logits against the dense
// reference on the dequantised weights: the int8 path must compute exactly
// that model (up to float32 summation order). With BF16MaxRows 4, a
// prefill of more than 4 tokens runs its layers on the float32 weights and
// only its LM head on int8 when n ≤ 4 (else float32 too), so it is
// compared with a reference that quantises only the head (or nothing); the
// decode steps after such a
// mixed prefill match neither model and are not compared.
func TestInt8MatchesDequantized(t *testing.T) {
	m := model.NewRandom(model.TestConfig(), 41)
	mq, mh := dequantized(m, true), dequantized(m, false)
	const bs, steps, prompt = 8, 10, 3
	rng := newRNG(41)
	for _, n := range []int{1, 2, 3, 5} {
		seqs := make([][]int32, n)
		refs, refsQ, refsH := make([][][]float32, n), make([][][]float32, n), make([][][]float32, n)
		for i := range seqs {
			seqs[i] = randomTokens(rng, prompt+steps, m.Config.VocabSize)
			refs[i], refsQ[i], refsH[i] = refForward(m, seqs[i]), refForward(mq, seqs[i]), refForward(mh, seqs[i])
		}
		for _, maxRows := range []int{1 << 20, 4} {
			t.Run(fmt.Sprintf("n=%d/max=%d", n, maxRows), func(t *testing.T) {
				c, err := NewCPU(m, CPUOptions{BlockSize: bs, BF16MaxRows: maxRows, Int8: true})
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				if !c.UsesInt8() {
					t.Fatal("UsesInt8() = false with Int8 set")
				}
				V := m.Config.VocabSize
				lockstep(t, c, seqs, prompt, bs, newFreeList(c.NumBlocks(), rng), func(step int, b *Batch, logits []float32, st []*seqState) bool {
					mixed := step == 0 && len(b.Tokens) > maxRows
					for i, s := range st {
						want := refsQ[i][s.done-1]
						if mixed && n <= maxRows {
							want = refsH[i][s.done-1]
						} else if mixed {
							want = refs[i][s.done-1] // all float32
						}
						if d := maxAbsDiff(logits[i*V:(i+1)*V], want); d > 1e-4 {
							t.Fatalf("step %d seq %d (mixed %v): max |Δlogit| vs dequantised reference = %g", step, i, mixed, d)
						}
					}
					return !mixed
				})
			})
		}
		// The quantisation is not a no-op: the dequantised model's logits
		// differ from the float32 model's (else this test proves nothing).
		if d := maxAbsDiff(refs[0][prompt], refsQ[0][prompt]); d == 0 {
			t.Fatal("dequantised reference equals the float32 one")
		}
	}
}

// TestInt8Option: CPUOptions.Int8 alone decides whether the small GEMMs
// run on int8 copies.
func TestInt8Option(t *testing.T) {
	m := model.NewRandom(model.TestConfig(), 42)
	for _, opt := range []bool{false, true} {
		be, err := NewCPU(m, CPUOptions{Int8: opt})
		if err != nil {
			t.Fatal(err)
		}
		if be.UsesInt8() != opt {
			t.Errorf("Int8=%v: UsesInt8() = %v", opt, be.UsesInt8())
		}
		be.Close()
	}
}

func argmax(row []float32) int {
	best := 0
	for i, v := range row {
		if v > row[best] {
			best = i
		}
	}
	return best
}

// TestInt8PyTorchReference measures the int8 path's error on the shipped
// model against the PyTorch fixture (forward/testdata/reference.json):
// every position decoded one token at a time after a one-token prefill,
// so every GEMM but the first prefill's runs on int8. It logs max
// |Δlogit| against PyTorch and against the default (bf16/float32) path,
// and how often the top token agrees, and fails if the top token
// disagrees where PyTorch's top-2 margin is clear (> 0.5) or at more than
// 5% of positions overall.
func TestInt8PyTorchReference(t *testing.T) {
	raw, err := os.ReadFile("testdata/reference.json")
	if errors.Is(err, os.ErrNotExist) {
		t.Skip("forward/testdata/reference.json not present")
	}
	if err != nil {
		t.Fatal(err)
	}
	var fx referenceFixture
	if err := json.Unmarshal(raw, &fx); err != nil {
		t.Fatalf("reference.json: %v", err)
	}
	m, err := model.Default()
	if errors.Is(err, model.ErrNoDefault) {
		t.Skip("default model not embedded")
	}
	if err != nil {
		t.Fatal(err)
	}
	var worstPT, worstDef float64
	positions, agree := 0, 0
	for ci, cs := range fx.Cases {
		q := runSplitOpts(t, m, cs.Tokens, 1, CPUOptions{Int8: true})
		def := runSplitOpts(t, m, cs.Tokens, 1, CPUOptions{})
		for i, pos := range cs.Rows {
			worstPT = math.Max(worstPT, maxAbsDiff(q[pos], cs.Logits[i]))
		}
		for pos, want := range cs.Argmax {
			worstDef = math.Max(worstDef, maxAbsDiff(q[pos], def[pos]))
			positions++
			got := argmax(q[pos])
			if int32(got) == want {
				agree++
				continue
			}
			// A disagreement is acceptable only between near-ties of the
			// unquantised model.
			if margin := def[pos][want] - def[pos][got]; margin > 0.5 {
				t.Errorf("case %d position %d: int8 top token %d, PyTorch %d (float margin %.3g)", ci, pos, got, want, margin)
			}
		}
	}
	t.Logf("int8: max |Δlogit| vs PyTorch %.3g, vs default path %.3g; top token agrees at %d/%d positions", worstPT, worstDef, agree, positions)
	if agree*20 < positions*19 {
		t.Errorf("top token agrees at only %d/%d positions", agree, positions)
	}
}

// lockstepLogits runs seqs in lockstep on a CPU with options o (one
// prefill step of prompt tokens each, then single-token decode steps, so
// the GEMMs see T = prompt·n and n rows) and returns every position's
// logits after the prompt: [seq][position] → [vocab].
func lockstepLogits(t *testing.T, m *model.Model, seqs [][]int32, prompt int, o CPUOptions) [][][]float32 {
	t.Helper()
	const bs = 8
	o.BlockSize = bs
	c, err := NewCPU(m, o)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	V := m.Config.VocabSize
	out := make([][][]float32, len(seqs))
	for i := range out {
		out[i] = make([][]float32, len(seqs[i]))
	}
	lockstep(t, c, seqs, prompt, bs, newFreeList(c.NumBlocks(), newRNG(1)), func(_ int, _ *Batch, logits []float32, st []*seqState) bool {
		for i, s := range st {
			out[i][s.done-1] = logits[i*V : (i+1)*V]
		}
		return true
	})
	return out
}

// TestBF16DotLogits runs n sequences in lockstep (GEMMs of 3n and n rows:
// every x tile and leftover of the kernels; the test model's k = 176 has
// a k tail) with CPUOptions.BF16Dot and the bf16 path on for every row
// count, and compares every position's logits with three others:
//
//   - The default path (BF16Dot off): within 0.1, and not equal. Rounding
//     x moves each GEMM input by ≤ 2⁻⁹ relative; on the LM head alone
//     that moves a logit by about 2⁻⁹·‖h‖·‖w_v‖/√d ≈ 0.01 (normed hidden
//     state h and head row w_v both of norm ≈ √d·their std), the layers
//     below add as much again; measured ≈ 0.02 over 7 seeds.
//   - The dense float64 reference whose matrix products round their
//     input to bf16 (refForwardX, the model BF16Dot computes): ≥ 80% of
//     logits within 1e-4 (float32 summation, as in TestBF16MatchesDense),
//     all within 0.05. Not all within 1e-4: an activation whose float32
//     and float64 values lie on either side of a bf16 rounding boundary
//     rounds one bf16 step apart (2⁻⁸ relative), which moves the logits
//     downstream by up to ≈ 0.01; measured: 0-6% of logits beyond 1e-4,
//     max 0.011 over 7 seeds.
//   - The unrounded reference: ≤ 20% of logits within 1e-4 (measured
//     ~2.5%), or the test could not tell the two models apart.
func TestBF16DotLogits(t *testing.T) {
	if !cpu.HasFastBF16() {
		t.Skip("no fast bf16 kernels: the bf16 path (and BF16Dot) is off")
	}
	m := bf16Model(t, 33)
	const steps, prompt = 10, 3
	rng := newRNG(33)
	var maxDef, maxR float64
	var total, nearR, nearU int
	for _, n := range []int{1, 2, 3, 5, 9} {
		seqs := make([][]int32, n)
		for i := range seqs {
			seqs[i] = randomTokens(rng, prompt+steps, m.Config.VocabSize)
		}
		dot := lockstepLogits(t, m, seqs, prompt, CPUOptions{BF16MaxRows: 1 << 20, BF16Dot: true})
		def := lockstepLogits(t, m, seqs, prompt, CPUOptions{BF16MaxRows: 1 << 20})
		for i := range seqs {
			refR, refU := refForwardX(m, seqs[i], true), refForward(m, seqs[i])
			for p := prompt - 1; p < len(seqs[i]); p++ {
				got := dot[i][p]
				maxDef = math.Max(maxDef, maxAbsDiff(got, def[i][p]))
				maxR = math.Max(maxR, maxAbsDiff(got, refR[p]))
				for v, g := range got {
					total++
					if math.Abs(float64(g-refR[p][v])) <= 1e-4 {
						nearR++
					}
					if math.Abs(float64(g-refU[p][v])) <= 1e-4 {
						nearU++
					}
				}
			}
		}
	}
	t.Logf("HasBF16Dot %v: max |Δlogit| vs default %.3g, vs bf16-x reference %.3g; within 1e-4 of the bf16-x reference %d/%d, of the unrounded one %d/%d",
		cpu.HasBF16Dot(), maxDef, maxR, nearR, total, nearU, total)
	if maxDef > 0.1 || maxDef == 0 {
		t.Errorf("max |Δlogit| vs the default path %.3g, want in (0, 0.1]", maxDef)
	}
	if maxR > 0.05 {
		t.Errorf("max |Δlogit| vs the bf16-x reference %.3g > 0.05", maxR)
	}
	if nearR*5 < total*4 {
		t.Errorf("only %d/%d logits within 1e-4 of the bf16-x reference, want ≥ 80%%", nearR, total)
	}
	if nearU*5 > total {
		t.Errorf("%d/%d logits within 1e-4 of the unrounded reference, want ≤ 20%%", nearU, total)
	}
}

// TestRefineHead: under BF16Dot, each LM head row's logits within
// headRefineMargin of its largest rounded one equal a float64 dot product
// of the unrounded final hidden state (c.rows) with the head, and the
// others the same product of the bf16-rounded state, both within 1e-4.
// Rounding alone must move some leading logit by more than that, or the
// test could not tell whether refineHead ran.
func TestRefineHead(t *testing.T) {
	if !cpu.HasFastBF16() {
		t.Skip("no fast bf16 kernels: the bf16 path (and BF16Dot) is off")
	}
	m := bf16Model(t, 35)
	const bs = 8
	c, err := NewCPU(m, CPUOptions{BlockSize: bs, BF16MaxRows: 1 << 20, BF16Dot: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rng, fl := newRNG(35), newFreeList(c.NumBlocks(), newRNG(35))
	d, V := m.Config.HiddenSize, m.Config.VocabSize
	var b Batch
	for range 6 {
		s := &seqState{tokens: randomTokens(rng, 5, V)}
		b.LogitRows = append(b.LogitRows, addStep(&b, s, 5, bs, fl))
	}
	logits := make([]float32, len(b.LogitRows)*V)
	if err := c.Forward(&b, logits); err != nil {
		t.Fatal(err)
	}
	head := m.Weights.LMHead
	var leading, moved, checked int
	for i := range b.LogitRows {
		h := c.rows[i*d : (i+1)*d]
		exact, rounded := make([]float64, V), make([]float64, V)
		for v := range V {
			for j, x := range h {
				w := float64(head[v*d+j])
				exact[v] += w * float64(x)
				rounded[v] += w * float64(cpu.BF16ToFloat32(cpu.BF16Bits(x)))
			}
		}
		thr := slices.Max(rounded) - headRefineMargin
		for v, got := range logits[i*V : (i+1)*V] {
			if math.Abs(rounded[v]-thr) < 1e-3 {
				continue // the kernel's float32 may fall on either side
			}
			want, what := rounded[v], "rounded"
			if rounded[v] > thr {
				want, what = exact[v], "exact"
				leading++
				if math.Abs(rounded[v]-exact[v]) > 1e-4 {
					moved++
				}
			}
			checked++
			if math.Abs(float64(got)-want) > 1e-4 {
				t.Fatalf("row %d logit %d = %g, want the %s %g", i, v, got, what, want)
			}
		}
	}
	t.Logf("%d logits checked, %d leading, %d of them moved by rounding", checked, leading, moved)
	if moved == 0 {
		t.Error("rounding moved no leading logit by more than 1e-4: the test cannot see the refinement")
	}
}

// TestBF16DotOption: BF16Dot needs the bf16 path and yields to Int8, and
// the backend's description names it.
func TestBF16DotOption(t *testing.T) {
	m := bf16Model(t, 34)
	for _, tc := range []struct {
		o    CPUOptions
		want bool
	}{
		{CPUOptions{BF16Dot: true}, cpu.HasFastBF16()},
		{CPUOptions{}, false},
		{CPUOptions{BF16Dot: true, BF16MaxRows: -1}, false},
		{CPUOptions{BF16Dot: true, Int8: true}, false},
	} {
		c, err := NewCPU(m, tc.o)
		if err != nil {
			t.Fatal(err)
		}
		if c.UsesBF16Dot() != tc.want {
			t.Errorf("%+v: UsesBF16Dot() = %v, want %v", tc.o, c.UsesBF16Dot(), tc.want)
		}
		k := c.Kernels()
		if has := strings.Contains(k, " bf16dot="); has != tc.want {
			t.Errorf("%+v: Kernels() = %q", tc.o, k)
		}
		if tc.want && cpu.HasBF16Dot() && !strings.HasSuffix(k, " weights=bf16 bf16dot=vdpbf16ps") {
			t.Errorf("%+v: Kernels() = %q, want weights=bf16 bf16dot=vdpbf16ps", tc.o, k)
		}
		if tc.o.Int8 && !strings.HasSuffix(k, " weights=int8") {
			t.Errorf("%+v: Kernels() = %q, want weights=int8", tc.o, k)
		}
		c.Close()
	}
	c, err := NewCPU(model.NewRandom(model.TestConfig(), 34), CPUOptions{BF16Dot: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.UsesBF16Dot() {
		t.Error("UsesBF16Dot on a model without bf16 weights")
	}
}
