package forward

import (
	"chunlian/internal/testenv"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"chunlian/kernels/cpu"
	"chunlian/model"
)

// refForward is the dead-simple dense reference: no cache, the whole
// sequence recomputed, float64 accumulation, its own loops (no kernels). It
// returns the logits of every position: [len(tokens)][vocab].
func refForward(m *model.Model, tokens []int32) [][]float32 {
	return refForwardX(m, tokens, false)
}

// refForwardX is refForward, with the input of every matrix product
// rounded to float32 and then to bf16 when roundX, and then the LM head's
// logits within headRefineMargin of the largest computed again from the
// unrounded input (the model that CPUOptions.BF16Dot computes).
func refForwardX(m *model.Model, tokens []int32, roundX bool) [][]float32 {
	cfg, w := m.Config, m.Weights
	T, d, hd := len(tokens), cfg.HiddenSize, cfg.HeadDim
	H, G, F, V := cfg.NumHeads, cfg.NumKVHeads, cfg.IntermediateSize, cfg.VocabSize
	matvec := func(W []float32, x []float64, out int) []float64 { // W: [out, len(x)]
		if roundX {
			xr := make([]float64, len(x))
			for j, xj := range x {
				xr[j] = float64(cpu.BF16ToFloat32(cpu.BF16Bits(float32(xj))))
			}
			x = xr
		}
		y := make([]float64, out)
		for i := range y {
			var s float64
			for j, xj := range x {
				s += float64(W[i*len(x)+j]) * xj
			}
			y[i] = s
		}
		return y
	}
	rmsnorm := func(x []float64, wt []float32) []float64 {
		var ss float64
		for _, v := range x {
			ss += v * v
		}
		r := 1 / math.Sqrt(ss/float64(len(x))+cfg.RMSNormEps)
		out := make([]float64, len(x))
		for i, v := range x {
			out[i] = v * r * float64(wt[i])
		}
		return out
	}
	rope := func(v []float64, pos int) { // one head, HF rotate_half
		half := hd / 2
		for i := 0; i < half; i++ {
			ang := float64(pos) * math.Pow(cfg.RopeTheta, -2*float64(i)/float64(hd))
			a, b := v[i], v[i+half]
			v[i] = a*math.Cos(ang) - b*math.Sin(ang)
			v[i+half] = b*math.Cos(ang) + a*math.Sin(ang)
		}
	}
	x := make([][]float64, T)
	for t, tok := range tokens {
		x[t] = make([]float64, d)
		for i := range x[t] {
			x[t][i] = float64(w.Embed[int(tok)*d+i])
		}
	}
	for _, L := range w.Layers {
		q, k, v := make([][]float64, T), make([][]float64, T), make([][]float64, T)
		for t := range x {
			xn := rmsnorm(x[t], L.AttnNorm)
			q[t], k[t], v[t] = matvec(L.Wq, xn, H*hd), matvec(L.Wk, xn, G*hd), matvec(L.Wv, xn, G*hd)
			for h := 0; h < H; h++ {
				rope(q[t][h*hd:(h+1)*hd], t)
			}
			for g := 0; g < G; g++ {
				rope(k[t][g*hd:(g+1)*hd], t)
			}
		}
		for t := range x {
			att := make([]float64, H*hd)
			for h := 0; h < H; h++ {
				g := h / (H / G)
				sc := make([]float64, t+1)
				mx := math.Inf(-1)
				for u := 0; u <= t; u++ {
					for i := 0; i < hd; i++ {
						sc[u] += q[t][h*hd+i] * k[u][g*hd+i]
					}
					sc[u] /= math.Sqrt(float64(hd))
					mx = math.Max(mx, sc[u])
				}
				var sum float64
				for u := range sc {
					sc[u] = math.Exp(sc[u] - mx)
					sum += sc[u]
				}
				for u := range sc {
					for i := 0; i < hd; i++ {
						att[h*hd+i] += sc[u] / sum * v[u][g*hd+i]
					}
				}
			}
			o := matvec(L.Wo, att, d)
			for i := range o {
				x[t][i] += o[i]
			}
			xn := rmsnorm(x[t], L.MLPNorm)
			gate, up := matvec(L.WGate, xn, F), matvec(L.WUp, xn, F)
			for i := range gate {
				gate[i] = gate[i] / (1 + math.Exp(-gate[i])) * up[i]
			}
			dn := matvec(L.WDown, gate, d)
			for i := range dn {
				x[t][i] += dn[i]
			}
		}
	}
	out := make([][]float32, T)
	for t := range x {
		h := rmsnorm(x[t], w.FinalNorm)
		lg := matvec(w.LMHead, h, V)
		if roundX { // the leading logits from the unrounded input (refineHead)
			roundX = false
			exact := matvec(w.LMHead, h, V)
			roundX = true
			m := slices.Max(lg)
			for i := range lg {
				if lg[i] > m-headRefineMargin {
					lg[i] = exact[i]
				}
			}
		}
		out[t] = make([]float32, V)
		for i, f := range lg {
			out[t][i] = float32(f)
		}
	}
	return out
}

// seqState is one simulated sequence of the paged test: its full token list
// (prompt and "decoded" tokens alike, fixed in advance), how many are in the
// cache, and its block table.
type seqState struct {
	tokens []int32
	done   int
	table  []int32
	ref    [][]float32 // reference logits, [len(tokens)][V]
}

// freeList hands out physical blocks in a shuffled order so block tables are
// non-contiguous and unordered.
type freeList struct{ free []int32 }

func newFreeList(n int, rng *rand.Rand) *freeList {
	f := &freeList{}
	for _, i := range rng.Perm(n) {
		f.free = append(f.free, int32(i))
	}
	return f
}

func (f *freeList) take() int32 {
	b := f.free[len(f.free)-1]
	f.free = f.free[:len(f.free)-1]
	return b
}

// addStep appends n tokens of s to the batch, growing its block table, and
// returns the batch index of the last token.
func addStep(b *Batch, s *seqState, n, blockSize int, fl *freeList) int {
	start := len(b.Tokens)
	for j := 0; j < n; j++ {
		p := s.done + j
		if p/blockSize >= len(s.table) {
			s.table = append(s.table, fl.take())
		}
		b.Tokens = append(b.Tokens, s.tokens[p])
		b.Positions = append(b.Positions, int32(p))
		b.SlotMapping = append(b.SlotMapping, s.table[p/blockSize]*int32(blockSize)+int32(p%blockSize))
	}
	s.done += n
	b.Seqs = append(b.Seqs, SeqSpan{Start: start, Len: n, CtxLen: s.done, BlockTable: s.table})
	return len(b.Tokens) - 1
}

// lockstep runs seqs (all of one length) through c in lockstep, block
// tables drawn from fl: one prefill step of prompt tokens each, then one
// token per step. After each step it calls each with the step's number,
// its batch, its logits ([n·V]: row i is sequence i's last token, whose
// position is st[i].done-1) and the sequences' states; each returns false
// to stop early.
func lockstep(t *testing.T, c *CPU, seqs [][]int32, prompt, bs int, fl *freeList, each func(step int, b *Batch, logits []float32, st []*seqState) bool) {
	t.Helper()
	n, V := len(seqs), c.cfg.VocabSize
	st := make([]*seqState, n)
	for i := range st {
		st[i] = &seqState{tokens: seqs[i]}
	}
	for step := 0; st[0].done < len(seqs[0]); step++ {
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
		if !each(step, &b, logits, st) {
			return
		}
	}
}

func maxAbsDiff(a, b []float32) float64 {
	var m float64
	for i := range a {
		m = math.Max(m, math.Abs(float64(a[i]-b[i])))
	}
	return m
}

func randomTokens(rng *rand.Rand, n, vocab int) []int32 {
	t := make([]int32, n)
	for i := range t {
		t[i] = int32(rng.IntN(vocab))
	}
	return t
}

// TestPagedMatchesDense drives the paged forward with mixed batches (several
// sequences joining at different steps, prefill chunks split across steps,
// single decode tokens, shuffled non-contiguous block tables, random logit
// rows) and compares every requested row with the dense reference.
func TestPagedMatchesDense(t *testing.T) {
	cases := []struct {
		name      string
		cfg       func() model.Config
		blockSize int
		seqs      int
		maxLen    int
		seed      uint64
	}{
		{"gqa bs16", model.TestConfig, 16, 6, 70, 1},
		{"gqa bs4", model.TestConfig, 4, 5, 40, 2},
		{"gqa bs1", model.TestConfig, 1, 3, 20, 3},
		{"mha tied bs8", func() model.Config {
			c := model.TestConfig()
			c.NumKVHeads, c.TieWordEmbeddings = 4, true
			return c
		}, 8, 4, 50, 4},
		{"mqa bs5", func() model.Config {
			c := model.TestConfig()
			c.NumKVHeads = 1
			return c
		}, 5, 4, 33, 5},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg()
			m := model.NewRandom(cfg, int64(tc.seed))
			rng := rand.New(rand.NewPCG(tc.seed, 99))
			totalBlocks := tc.seqs*(tc.maxLen/tc.blockSize+1) + 7
			c, err := NewCPU(m, CPUOptions{BlockSize: tc.blockSize, KVCacheBytes: int64(totalBlocks*tc.blockSize) * KVBytesPerToken(cfg)})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if c.NumBlocks() != totalBlocks {
				t.Fatalf("NumBlocks %d, want %d", c.NumBlocks(), totalBlocks)
			}
			fl := newFreeList(totalBlocks, rng)
			var seqs []*seqState
			for i := 0; i < tc.seqs; i++ {
				toks := randomTokens(rng, 1+rng.IntN(tc.maxLen), cfg.VocabSize)
				seqs = append(seqs, &seqState{tokens: toks, ref: refForward(m, toks)})
			}
			checked, worst := 0, 0.0
			for step := 0; ; step++ {
				var b Batch
				var rowPos []int // position of each logit row
				var rowSeq []*seqState
				active := 0
				for _, si := range rng.Perm(len(seqs)) {
					s := seqs[si]
					// Sequence i joins at step i; some skip a step.
					if si > step || s.done == len(s.tokens) || rng.IntN(5) == 0 {
						continue
					}
					active++
					n := 1
					if rem := len(s.tokens) - s.done; rem > 1 && rng.IntN(2) == 0 {
						n = 1 + rng.IntN(min(rem, 24))
					}
					first := len(b.Tokens)
					last := addStep(&b, s, n, tc.blockSize, fl)
					// Always the last token; sometimes an earlier one too.
					rows := []int{last}
					if n > 1 && rng.IntN(2) == 0 {
						rows = append([]int{first + rng.IntN(n-1)}, rows...)
					}
					for _, r := range rows {
						b.LogitRows = append(b.LogitRows, r)
						rowPos = append(rowPos, int(b.Positions[r]))
						rowSeq = append(rowSeq, s)
					}
				}
				if active == 0 {
					if step > len(seqs) && allDone(seqs) {
						break
					}
					continue
				}
				logits := make([]float32, len(b.LogitRows)*cfg.VocabSize)
				if err := c.Forward(&b, logits); err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				for i := range b.LogitRows {
					got := logits[i*cfg.VocabSize : (i+1)*cfg.VocabSize]
					diff := maxAbsDiff(got, rowSeq[i].ref[rowPos[i]])
					worst = math.Max(worst, diff)
					if diff > 1e-4 {
						t.Fatalf("step %d row %d (pos %d): max |Δ| = %g", step, i, rowPos[i], diff)
					}
					checked++
				}
			}
			if checked < tc.seqs {
				t.Fatalf("only %d rows checked", checked)
			}
			t.Logf("%d logit rows checked, max |Δ| = %.2g", checked, worst)
		})
	}
}

func allDone(seqs []*seqState) bool {
	for _, s := range seqs {
		if s.done < len(s.tokens) {
			return false
		}
	}
	return true
}

// TestCopyBlocks forks a sequence: its blocks are copied to fresh blocks,
// the full blocks whole and the partial last one for its filled slots only;
// the copied slots must be bit-identical in every layer and the rest of the
// last destination block untouched, decoding the next token through the
// copied table must match the dense reference, and the original must be
// untouched by writes to the copy.
func TestCopyBlocks(t *testing.T) {
	cfg := model.TestConfig()
	m := model.NewRandom(cfg, 11)
	const bs = 4
	c, err := NewCPU(m, CPUOptions{BlockSize: bs, KVCacheBytes: 32 * bs * KVBytesPerToken(cfg)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rng := rand.New(rand.NewPCG(5, 5))
	fl := newFreeList(c.NumBlocks(), rng)
	toks := randomTokens(rng, 11, cfg.VocabSize) // 10 prompt tokens + 1 decode: partial last block
	parent := &seqState{tokens: toks[:10]}
	var b Batch
	addStep(&b, parent, 10, bs, fl)
	if err := c.Forward(&b, nil); err != nil {
		t.Fatal(err)
	}
	child := &seqState{tokens: toks, done: 10}
	slots := make([]int32, len(parent.table))
	for i := range parent.table {
		child.table = append(child.table, fl.take())
		slots[i] = int32(min(bs, 10-i*bs)) // 4, 4, 2
	}
	kvd := cfg.KVDim()
	const mark = float32(-7.5) // what the unfilled slots of the last copy hold before and after
	for l := range c.kc {
		for _, cache := range [][]float32{c.kc[l], c.vc[l]} {
			d := int(child.table[2])*bs*kvd + 2*kvd
			for j := d; j < d+2*kvd; j++ {
				cache[j] = mark
			}
		}
	}
	if err := c.CopyBlocks(parent.table, child.table, slots); err != nil {
		t.Fatal(err)
	}
	for l := range c.kc {
		for i := range parent.table {
			for _, cache := range [][]float32{c.kc[l], c.vc[l]} {
				n := int(slots[i]) * kvd
				src := cache[int(parent.table[i])*bs*kvd:][:n]
				dst := cache[int(child.table[i])*bs*kvd:][:bs*kvd]
				if maxAbsDiff(src, dst[:n]) != 0 {
					t.Fatalf("layer %d block %d: copy differs", l, i)
				}
				for j, v := range dst[n:] {
					if v != mark {
						t.Fatalf("layer %d block %d: unfilled slot element %d = %g, want it untouched", l, i, n+j, v)
					}
				}
			}
		}
	}
	parentK := append([]float32(nil), c.kc[0][int(parent.table[2])*bs*kvd:int(parent.table[2]+1)*bs*kvd]...)
	b = Batch{}
	last := addStep(&b, child, 1, bs, fl)
	b.LogitRows = []int{last}
	logits := make([]float32, cfg.VocabSize)
	if err := c.Forward(&b, logits); err != nil {
		t.Fatal(err)
	}
	if d := maxAbsDiff(logits, refForward(m, toks)[10]); d > 1e-4 {
		t.Errorf("decode through copied blocks: max |Δ| = %g", d)
	}
	if d := maxAbsDiff(parentK, c.kc[0][int(parent.table[2])*bs*kvd:int(parent.table[2]+1)*bs*kvd]); d != 0 {
		t.Error("writing the child's partial block changed the parent's block")
	}

	for _, bad := range []struct {
		name            string
		src, dst, slots []int32
	}{
		{"length mismatch", []int32{0, 1}, []int32{2}, []int32{1, 1}},
		{"slot counts missing", []int32{0}, []int32{2}, nil},
		{"src out of range", []int32{int32(c.NumBlocks())}, []int32{0}, []int32{1}},
		{"dst negative", []int32{0}, []int32{-1}, []int32{1}},
		{"no slots", []int32{0}, []int32{1}, []int32{0}},
		{"more slots than a block", []int32{0}, []int32{1}, []int32{bs + 1}},
	} {
		if err := c.CopyBlocks(bad.src, bad.dst, bad.slots); err == nil {
			t.Errorf("%s: CopyBlocks accepted it", bad.name)
		}
	}
}

// TestForwardRejectsBadBatches checks that contract violations are errors
// and not silent cache corruption.
func TestForwardRejectsBadBatches(t *testing.T) {
	cfg := model.TestConfig()
	c, err := NewCPU(model.NewRandom(cfg, 1), CPUOptions{BlockSize: 4, KVCacheBytes: 8 * 4 * KVBytesPerToken(cfg)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	good := func() *Batch {
		return &Batch{
			Tokens: []int32{5, 6, 7}, Positions: []int32{0, 1, 2}, SlotMapping: []int32{12, 13, 14},
			Seqs: []SeqSpan{{Start: 0, Len: 3, CtxLen: 3, BlockTable: []int32{3}}}, LogitRows: []int{2},
		}
	}
	V := cfg.VocabSize
	if err := c.Forward(good(), make([]float32, V)); err != nil {
		t.Fatalf("good batch: %v", err)
	}
	cases := []struct {
		name   string
		edit   func(b *Batch)
		logits int
		want   string
	}{
		{"empty", func(b *Batch) { *b = Batch{} }, V, "empty"},
		{"short positions", func(b *Batch) { b.Positions = b.Positions[:2] }, V, "positions"},
		{"small logits buffer", func(b *Batch) {}, V - 1, "logits buffer"},
		{"logit row out of range", func(b *Batch) { b.LogitRows = []int{3} }, V, "logit row"},
		{"token out of vocab", func(b *Batch) { b.Tokens[1] = int32(V) }, V, "vocabulary"},
		{"wrong position", func(b *Batch) { b.Positions[1] = 5 }, V, "position"},
		{"slot disagrees with table", func(b *Batch) { b.SlotMapping[2] = 15 }, V, "slot"},
		{"block out of range", func(b *Batch) { b.Seqs[0].BlockTable = []int32{8} }, V, "block"},
		{"table too short", func(b *Batch) { b.Seqs[0].CtxLen = 5; b.Positions = []int32{2, 3, 4} }, V, "block table"},
		{"token in no sequence", func(b *Batch) { b.Seqs[0].Len = 2; b.Seqs[0].CtxLen = 2 }, V, "no sequence"},
		{"overlapping spans", func(b *Batch) {
			b.Seqs = append(b.Seqs, SeqSpan{Start: 2, Len: 1, CtxLen: 3, BlockTable: []int32{3}})
		}, V, "in seqs"},
	}
	for _, tc := range cases {
		b := good()
		tc.edit(b)
		err := c.Forward(b, make([]float32, tc.logits))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want mention of %q", tc.name, err, tc.want)
		}
	}
}

func TestNewCPUOptions(t *testing.T) {
	cfg := model.TestConfig()
	m := model.NewRandom(cfg, 1)
	per := KVBytesPerToken(cfg)
	cases := []struct {
		o          CPUOptions
		wantBlocks int
		wantBS     int
		wantErr    bool
	}{
		{CPUOptions{}, DefaultKVTokens / DefaultCPUBlockSize, DefaultCPUBlockSize, false},
		{CPUOptions{BlockSize: 8, KVCacheBytes: 10*8*per + 5}, 10, 8, false},
		{CPUOptions{BlockSize: 8, KVCacheBytes: 8*per - 1}, 0, 0, true},
		{CPUOptions{BlockSize: -1}, 0, 0, true},
		{CPUOptions{KVCacheBytes: -1}, 0, 0, true},
	}
	broken := model.NewRandom(cfg, 1)
	broken.Weights.Layers[1].WUp = broken.Weights.Layers[1].WUp[:10]
	if c, err := NewCPU(broken, CPUOptions{}); err == nil || !strings.Contains(err.Error(), "up_proj") {
		t.Errorf("NewCPU on a model with a short up_proj: %v", err)
		if c != nil {
			c.Close()
		}
	}
	for _, tc := range cases {
		c, err := NewCPU(m, tc.o)
		if tc.wantErr {
			if err == nil {
				c.Close()
				t.Errorf("%+v: want error", tc.o)
			}
			continue
		}
		if err != nil {
			t.Errorf("%+v: %v", tc.o, err)
			continue
		}
		if c.NumBlocks() != tc.wantBlocks || c.BlockSize() != tc.wantBS || c.VocabSize() != cfg.VocabSize {
			t.Errorf("%+v: %d blocks of %d, vocab %d", tc.o, c.NumBlocks(), c.BlockSize(), c.VocabSize())
		}
		c.Close()
		if err := c.Forward(&Batch{}, nil); err == nil || !strings.Contains(err.Error(), "closed") {
			t.Errorf("Forward after Close: %v", err)
		}
	}
}

// TestForwardSteadyStateNoAlloc checks the "no per-step garbage" invariant
// for a repeated decode step once buffers have grown.
func TestForwardSteadyStateNoAlloc(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under the race detector")
	}
	cfg := model.TestConfig()
	c, err := NewCPU(model.NewRandom(cfg, 1), CPUOptions{BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b := decodeBatch(8, 20, 16)
	logits := make([]float32, len(b.LogitRows)*cfg.VocabSize)
	if err := c.Forward(b, logits); err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(5, func() {
		if err := c.Forward(b, logits); err != nil {
			t.Fatal(err)
		}
	})
	// The kernels may allocate per call (the OpenBLAS path through purego
	// does); this package must add nothing on top of the same kernel calls.
	kernelAllocs := testing.AllocsPerRun(5, func() { kernelCalls(c, b, logits) })
	if allocs > kernelAllocs {
		t.Errorf("steady-state Forward allocates %.1f times per step, its kernel calls alone %.1f", allocs, kernelAllocs)
	}
	t.Logf("allocations per step: Forward %.1f, kernels alone %.1f (path %s)", allocs, kernelAllocs, cpu.Path())
}

// kernelCalls makes the same kernel calls as one Forward step of b (without
// attention), on the backend's own scratch buffers.
func kernelCalls(c *CPU, b *Batch, logits []float32) {
	cfg := c.cfg
	T, d, F, V := len(b.Tokens), cfg.HiddenSize, cfg.IntermediateSize, cfg.VocabSize
	qd, kvd, eps := cfg.QDim(), cfg.KVDim(), float32(cfg.RMSNormEps)
	for l, L := range c.m.Weights.Layers {
		cpu.RMSNorm(c.xn, c.x, L.AttnNorm, T, d, eps)
		cpu.Gemm(T, qd+2*kvd, d, c.xn, c.wqkv[l], c.qkv)
		cpu.RoPEStrided(c.qkv, qd+2*kvd, b.Positions, T, cfg.NumHeads+cfg.NumKVHeads, cfg.HeadDim, cfg.RopeTheta)
		cpu.GemmAcc(T, d, qd, c.att, L.Wo, c.x)
		cpu.RMSNorm(c.xn, c.x, L.MLPNorm, T, d, eps)
		cpu.Gemm(T, 2*F, d, c.xn, c.wgu[l], c.gu)
		cpu.SwiGLU(c.gate, c.gu, T, F)
		cpu.GemmAcc(T, d, F, c.gate, L.WDown, c.x)
	}
	R := len(b.LogitRows)
	cpu.RMSNorm(c.rows, c.rows, c.m.Weights.FinalNorm, R, d, eps)
	cpu.Gemm(R, V, d, c.rows, c.m.Weights.LMHead, logits[:R*V])
}

// decodeBatch is a decode step of n sequences, each with ctx tokens of
// context (the last one new), in disjoint contiguous blocks.
func decodeBatch(n, ctx, bs int) *Batch {
	b := &Batch{}
	per := (ctx + bs - 1) / bs
	for i := 0; i < n; i++ {
		table := make([]int32, per)
		for j := range table {
			table[j] = int32(i*per + j)
		}
		p := ctx - 1
		b.Tokens = append(b.Tokens, int32(100+i%50))
		b.Positions = append(b.Positions, int32(p))
		b.SlotMapping = append(b.SlotMapping, table[p/bs]*int32(bs)+int32(p%bs))
		b.Seqs = append(b.Seqs, SeqSpan{Start: i, Len: 1, CtxLen: ctx, BlockTable: table})
		b.LogitRows = append(b.LogitRows, i)
	}
	return b
}

// baseShape is the shape training/train.py gives the shipped model by
// default (d 384, 8 layers, 6 heads of 64, ffn 1024, tied, ~6k vocab), so
// the forward pass can be measured before the trained weights exist.
func baseShape() model.Config {
	c := model.TestConfig()
	c.VocabSize, c.HiddenSize, c.IntermediateSize = 6000, 384, 1024
	c.NumLayers, c.NumHeads, c.NumKVHeads, c.HeadDim = 8, 6, 6, 64
	c.TieWordEmbeddings = true
	return c
}

// BenchmarkDecode measures a decode step at batch 1, 8, 32, 128 with 32
// tokens of context each (a couplet's length) on the random test model, on
// a random model of the shipped model's shape and on the shipped model
// ("default"), with bf16 GEMM inputs where the CPU has VDPBF16PS, as the
// service's --cpu-precision auto.
func BenchmarkDecode(b *testing.B) {
	models := []struct {
		name string
		m    func() *model.Model
	}{
		{"random-test", func() *model.Model { return model.NewRandom(model.TestConfig(), 1) }},
		{"random-base-shape", func() *model.Model { return model.NewRandom(baseShape(), 1) }},
	}
	if dm, err := model.Default(); err == nil {
		models = append(models, struct {
			name string
			m    func() *model.Model
		}{"default", func() *model.Model { return dm }})
	}
	for _, mm := range models {
		m := mm.m()
		for _, batch := range []int{1, 8, 32, 128} {
			b.Run(fmt.Sprintf("%s/batch=%d", mm.name, batch), func(b *testing.B) {
				const ctx = 32
				c, err := NewCPU(m, CPUOptions{BlockSize: 16, BF16Dot: cpu.HasBF16Dot(), KVCacheBytes: int64(batch*ctx) * KVBytesPerToken(m.Config)})
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				bt := decodeBatch(batch, ctx, 16)
				logits := make([]float32, batch*m.Config.VocabSize)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if err := c.Forward(bt, logits); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(batch*b.N)/b.Elapsed().Seconds(), "tokens/s")
			})
		}
	}
}

// BenchmarkAttention times the attention phase alone (every layer's, on
// filled caches) of a decode step at batch 8 and 32 on a random model of
// the shipped model's shape, with the CPU default block size (1) and the
// 16 that BenchmarkDecode uses.
func BenchmarkAttention(b *testing.B) {
	m := model.NewRandom(baseShape(), 1)
	for _, batch := range []int{8, 32} {
		for _, ctx := range []int{32, 128} {
			for _, bs := range []int{1, 16} {
				b.Run(fmt.Sprintf("batch=%d/ctx=%d/bs=%d", batch, ctx, bs), func(b *testing.B) {
					blocks := (ctx + bs - 1) / bs
					c, err := NewCPU(m, CPUOptions{BlockSize: bs, KVCacheBytes: int64(batch*blocks*bs) * KVBytesPerToken(m.Config)})
					if err != nil {
						b.Fatal(err)
					}
					defer c.Close()
					r := newRNG(1)
					for l := range c.kc {
						for i := range c.kc[l] {
							c.kc[l][i], c.vc[l][i] = float32(r.NormFloat64()), float32(r.NormFloat64())
						}
					}
					bt := decodeBatch(batch, ctx, bs)
					logits := make([]float32, batch*m.Config.VocabSize)
					if err := c.Forward(bt, logits); err != nil { // sizes the scratch, fills q
						b.Fatal(err)
					}
					for b.Loop() {
						for l := range c.kc {
							c.attention(bt, l)
						}
					}
				})
			}
		}
	}
}

func newRNG(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed^0x5bd1e995)) }

// BenchmarkPrefill measures one step of n prompts of 12 tokens (a keyword
// couplet prompt's length) prefilled together.
func BenchmarkPrefill(b *testing.B) {
	m := model.NewRandom(baseShape(), 1)
	if dm, err := model.Default(); err == nil {
		m = dm
	}
	for _, n := range []int{1, 16} {
		b.Run(fmt.Sprintf("%s/prompts=%d", m.Name, n), func(b *testing.B) {
			const plen, bs = 12, 16
			c, err := NewCPU(m, CPUOptions{BlockSize: bs, KVCacheBytes: int64(n*bs) * KVBytesPerToken(m.Config)})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			bt := &Batch{}
			for i := 0; i < n; i++ {
				s := &seqState{tokens: randomTokens(newRNG(uint64(i)), plen, m.Config.VocabSize)}
				fl := &freeList{free: []int32{int32(i)}}
				bt.LogitRows = append(bt.LogitRows, addStep(bt, s, plen, bs, fl))
			}
			logits := make([]float32, n*m.Config.VocabSize)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := c.Forward(bt, logits); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n*plen*b.N)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}

// TestBackendsShareModel runs two backends on one model from two
// goroutines (as the engine and the naive baseline do in one process): the
// model must be read-only and each backend's state its own (run with -race).
func TestBackendsShareModel(t *testing.T) {
	m := model.NewRandom(model.TestConfig(), 31)
	toks := randomTokens(newRNG(31), 20, m.Config.VocabSize)
	ref := refForward(m, toks)
	errs := make(chan error, 2)
	for g := 0; g < 2; g++ {
		go func() {
			c, err := NewCPU(m, CPUOptions{BlockSize: 4, KVCacheBytes: 8 * 4 * KVBytesPerToken(m.Config)})
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			for rep := 0; rep < 3; rep++ {
				s := &seqState{tokens: toks}
				fl := newFreeList(c.NumBlocks(), newRNG(uint64(g*10+rep)))
				var b Batch
				b.LogitRows = []int{addStep(&b, s, len(toks), 4, fl)}
				logits := make([]float32, m.Config.VocabSize)
				if err := c.Forward(&b, logits); err != nil {
					errs <- err
					return
				}
				if d := maxAbsDiff(logits, ref[len(toks)-1]); d > 1e-4 {
					errs <- fmt.Errorf("goroutine %d rep %d: max |Δ| = %g", g, rep, d)
					return
				}
			}
			errs <- nil
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// TestAttentionInlineAndPooled runs the same lockstep batches (a prefill
// of 20 tokens per sequence, then decode steps) with attention always on
// the caller and always spread over the attention workers, and checks
// both against the dense reference: the inline shortcut for small steps
// (attnInlineMACs) must not change results.
func TestAttentionInlineAndPooled(t *testing.T) {
	m := model.NewRandom(model.TestConfig(), 51)
	const bs, prompt, steps, n = 8, 20, 6, 3
	rng := newRNG(51)
	seqs := make([][]int32, n)
	refs := make([][][]float32, n)
	for i := range seqs {
		seqs[i] = randomTokens(rng, prompt+steps, m.Config.VocabSize)
		refs[i] = refForward(m, seqs[i])
	}
	for _, inline := range []int{0, 1 << 40} {
		t.Run(fmt.Sprintf("inline<%d", inline), func(t *testing.T) {
			c, err := NewCPU(m, CPUOptions{BlockSize: bs})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.attnInline = inline
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

// TestMain applies CHUNLIAN_GEMM (openblas | asm | go) to the kernels, as
// the command line's --cpu-gemm does: CI runs this package's tests on each
// path (with -count=1: go test's cache does not see an environment
// read before m.Run). The library itself reads no environment.
func TestMain(m *testing.M) { testenv.Main(m, cpu.SetGEMMPath) }
