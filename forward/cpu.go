package forward

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"

	"chunlian/kernels/cpu"
	"chunlian/model"
)

// DefaultKVTokens is how many tokens the CPU backend's KV cache holds when
// CPUOptions.KVCacheBytes is 0: 8192 tokens is 256 running couplets of 32
// tokens (the engine's default MaxNumSeqs) and costs 2·layers·kvDim·4 bytes
// per token (e.g. 8 layers × 512 → 32 KiB/token → 256 MiB; 2 layers × 32 for
// the test model → 512 B/token → 4 MiB).
const DefaultKVTokens = 8192

// DefaultCPUBlockSize is the CPU backend's KV block size when
// CPUOptions.BlockSize is 0: one token, so that no slot of the cache is
// left empty (a couplet's sequences are 21–26 tokens, which leave most of
// a 16-token block unused) and more of each prompt is found in cached full
// blocks (docs/DECISIONS.md).
const DefaultCPUBlockSize = 1

// CPUOptions configure NewCPU.
type CPUOptions struct {
	BlockSize int // tokens per KV block; 0 means DefaultCPUBlockSize
	// KVCacheBytes is the memory budget for the K and V caches of all
	// layers together; 0 means DefaultKVTokens tokens' worth. The cache
	// gets floor(KVCacheBytes / bytes per block) blocks (at least one).
	KVCacheBytes int64
	// BF16MaxRows is the largest GEMM row count (tokens of the step, or
	// logit rows for the LM head) that runs on the model's bf16 weight
	// copies (model.Weights.BF16) instead of the float32 ones; 0 means
	// DefaultBF16MaxRows (every row count where the float32 GEMM is plain
	// Go, see defaultBF16Max), negative never. The bf16 path is used only where
	// the model has bf16 copies and cpu.HasFastBF16() is true.
	BF16MaxRows int
	// Int8 runs the GEMMs of 1..BF16MaxRows rows on int8
	// copies of the weights (per-output-row scales, cpu.QuantizeInt8)
	// instead of the bf16 or float32 ones: half the bytes of bf16, so a
	// decode step streams 16.6 MB instead of 33 MB for the shipped model.
	// Unlike bf16 this changes the numerics (each weight moves by up to
	// half a quantisation step, 1/254 of its row's largest |weight|).
	// The service sets it from --experimental=cpu-int8. Quantising costs
	// ~0.1 s and 17 MB at NewCPU.
	Int8 bool
	// BF16Dot rounds the input of every GEMM that runs on the bf16
	// weights to bf16 too (the LM head's with refineHead's correction of
	// the leading logits), so that it runs on
	// cpu.GemmBF16Dot (VDPBF16PS where the CPU has AVX512_BF16,
	// cpu.HasBF16Dot): 32 multiply-adds per instruction on the bits as
	// stored, no widening of the weights, so GEMMs of 4 rows or more run
	// about 1.5-2× faster. It changes the
	// numerics (each activation moves by up to 2⁻⁹ relative, as under the
	// bf16 autocast the model was trained with). Only where the bf16 path
	// is on (UsesBF16); ignored when Int8 is set.
	BF16Dot bool
}

// DefaultBF16MaxRows is the default CPUOptions.BF16MaxRows. A decode
// step's GEMMs are bound by the weight bytes they stream up to a dozen or
// so rows, where the bf16 (or int8) weights win by reading half (a
// quarter) of the bytes. Beyond that the assembly kernels (4×4 AVX-512
// tiles, split over the pool) still beat the float32 path on a small
// machine, whose OpenBLAS threads spin after every call and take the CPU
// from the engine's own goroutines. Steps of more rows (long prefill
// chunks) stay on float32, where OpenBLAS's blocking pays off. Figures:
// docs/DECISIONS.md, "bf16 row window".
const DefaultBF16MaxRows = 256

// defaultBF16Max is the bf16 row limit when CPUOptions.BF16MaxRows is 0,
// given the GEMM path (cpu.Path). Where the float32 GEMM is plain Go
// ("asm": a machine without OpenBLAS, or "go") the bf16 assembly beats it
// at every row count (docs/DECISIONS.md, "bf16 kernels without
// OpenBLAS"), so every GEMM uses the bf16 kernels where they are fast
// (cpu.HasFastBF16).
func defaultBF16Max(gemmPath string) int {
	switch gemmPath {
	case "asm", "go":
		return math.MaxInt
	}
	return DefaultBF16MaxRows
}

// CPU is the float32 CPU backend. The KV cache of layer l is two slices,
// kc[l] and vc[l], each laid out as
//
//	[numBlocks, blockSize, nKVHeads, headDim] float32
//
// so slot s = block·blockSize + offset holds token K/V at
// kc[l][(s·nKVHeads + h)·headDim : +headDim] for KV head h. One token's K (or
// V) for all heads is contiguous, which makes the per-token cache write one
// copy and a block copy one contiguous copy.
//
// Ownership: a CPU is used by one goroutine at a time (the engine loop); the
// scratch buffers below belong to that goroutine between calls. During the
// attention phase of Forward the kernel pool's workers read q and the caches and
// each writes only the att rows of the (sequence, head) items it claimed.
type CPU struct {
	m         *model.Model
	cfg       model.Config
	blockSize int
	numBlocks int
	kc, vc    [][]float32 // per layer: [numBlocks, blockSize, nKVHeads, headDim]
	closed    bool
	// Per layer, the stacked projection matrices (model.Layer.Fused: views
	// of the model's weights when it was packed at load time, so no extra
	// memory): one GEMM computes q, k and v, another gate and up.
	wqkv [][]float32 // [H·hd + 2·G·hd, d]
	wgu  [][]float32 // [2·F, d]
	// bf16 is the model's bf16 copy of the same matrices when the bf16
	// path is enabled (see CPUOptions.BF16MaxRows), else nil; GEMMs with
	// at most bf16Max rows use it.
	bf16    *model.BF16Weights
	bf16Max int
	// bf16Dot: GEMMs on bf16 round x and run cpu.GemmBF16Dot
	// (CPUOptions.BF16Dot).
	bf16Dot bool
	// q8 holds int8 copies of the same matrices (per layer, and the LM
	// head) when CPUOptions.Int8 is on, else nil; it takes precedence over
	// bf16 for GEMMs of 1..bf16Max rows.
	q8     []q8Layer
	q8Head *q8Mat

	// Scratch, grown on demand and reused across steps (no per-step
	// garbage in steady state). T = len(batch.Tokens), R = len(LogitRows).
	x     []float32 // [T, d] residual stream
	xn    []float32 // [T, d] normalised input of a sublayer
	qkv   []float32 // [T, H·hd + 2·G·hd] fused projection output
	gu    []float32 // [T, 2·F] fused gate|up projection output
	att   []float32 // [T, nHeads·headDim] attention output before Wo
	gate  []float32 // [T, ffn] silu(gate)·up of gu
	rows  []float32 // [R, d] final-normed hidden states of the logit rows
	owner []int32   // [T] which span owns each token (batch validation)
	hidx  []int32   // [V] indices of the logits refineHead recomputes

	// Attention runs in workers parts on the kernel pool (cpu.Parallel:
	// the caller and workers-1 pool workers).
	workers int
	scores  [][]float32  // per part: [max CtxLen] attention weights
	offs    [][]int      // per part: [max CtxLen] cache offsets of one item's K/V rows
	next    atomic.Int64 // next unclaimed (sequence, head) item
	// The current attention job, set by the caller before cpu.Parallel
	// (which orders these writes before the workers' reads).
	jobBatch *Batch
	jobLayer int
	// attnInline is attnInlineMACs (tests change it to cover both ways).
	attnInline int
}

var _ Backend = (*CPU)(nil)

// NewCPU allocates the paged KV cache for m. Attention runs on the kernel
// pool (cpu.Parallel); Close drops the cache.
func NewCPU(m *model.Model, o CPUOptions) (*CPU, error) {
	if m == nil || m.Weights == nil {
		return nil, errors.New("forward: nil model")
	}
	// Shapes must match the config before any kernel indexes the weights
	// (Validate also checks the tokenizer and chunlian.json).
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("forward: %w", err)
	}
	if o.BlockSize == 0 {
		o.BlockSize = DefaultCPUBlockSize
	}
	if o.BlockSize < 1 {
		return nil, fmt.Errorf("forward: BlockSize %d must be positive", o.BlockSize)
	}
	if o.KVCacheBytes < 0 {
		return nil, fmt.Errorf("forward: KVCacheBytes %d must not be negative", o.KVCacheBytes)
	}
	cfg := m.Config
	perToken := KVBytesPerToken(cfg)
	if o.KVCacheBytes == 0 {
		o.KVCacheBytes = DefaultKVTokens * perToken
	}
	numBlocks := int(o.KVCacheBytes / (perToken * int64(o.BlockSize)))
	if numBlocks < 1 {
		return nil, fmt.Errorf("forward: KVCacheBytes %d is less than one block (%d bytes)", o.KVCacheBytes, perToken*int64(o.BlockSize))
	}
	c := &CPU{m: m, cfg: cfg, blockSize: o.BlockSize, numBlocks: numBlocks, attnInline: attnInlineMACs}
	c.bf16Max = o.BF16MaxRows
	if c.bf16Max == 0 {
		c.bf16Max = defaultBF16Max(cpu.Path())
	}
	if c.bf16Max > 0 && m.Weights.BF16 != nil && cpu.HasFastBF16() {
		c.bf16 = m.Weights.BF16
	}
	for i := range m.Weights.Layers {
		qkv, gu := m.Weights.Layers[i].Fused()
		c.wqkv, c.wgu = append(c.wqkv, qkv), append(c.wgu, gu)
	}
	if c.bf16Max > 0 && o.Int8 {
		c.quantize()
	}
	c.bf16Dot = o.BF16Dot && c.bf16 != nil && c.q8 == nil
	n := numBlocks * o.BlockSize * cfg.KVDim()
	for range cfg.NumLayers {
		c.kc = append(c.kc, make([]float32, n))
		c.vc = append(c.vc, make([]float32, n))
	}
	c.workers = cpu.Threads()
	c.scores = make([][]float32, c.workers)
	c.offs = make([][]int, c.workers)
	return c, nil
}

// UsesBF16 reports whether GEMMs of up to BF16MaxRows rows run on the
// model's bf16 weights.
func (c *CPU) UsesBF16() bool { return c.bf16 != nil }

// UsesBF16Dot reports whether the GEMMs on bf16 weights round their input
// to bf16 and run cpu.GemmBF16Dot (CPUOptions.BF16Dot).
func (c *CPU) UsesBF16Dot() bool { return c.bf16Dot }

// UsesInt8 reports whether GEMMs of up to BF16MaxRows rows run on int8
// weights (CPUOptions.Int8).
func (c *CPU) UsesInt8() bool { return c.q8 != nil }

// Kernels describes what this backend computes with, for the service's
// start-up log: cpu.Kernels() and the weight copy its small GEMMs read
// (int8, bf16 or fp32), e.g. "gemm=openblas bf16=asm-avx512 int8=asm-avx512
// elementwise=asm weights=bf16". With CPUOptions.BF16Dot it ends in
// "weights=bf16 bf16dot=vdpbf16ps", or "bf16dot=emulated" where the CPU
// lacks the instruction (x rounded, then the bf16 kernels).
func (c *CPU) Kernels() string {
	w := "fp32"
	switch {
	case c.UsesInt8():
		w = "int8"
	case c.UsesBF16Dot() && cpu.HasBF16Dot():
		w = "bf16 bf16dot=vdpbf16ps"
	case c.UsesBF16Dot():
		w = "bf16 bf16dot=emulated"
	case c.UsesBF16():
		w = "bf16"
	}
	return cpu.Kernels() + " weights=" + w
}

// q8Mat is an int8 weight matrix [n,k] with per-row scales [n] (see
// cpu.QuantizeInt8); q8Layer holds one layer's, stacked like the float32
// ones (wqkv, wgu).
type q8Mat struct {
	q []int8
	s []float32
}

type q8Layer struct{ qkv, gu, wo, down q8Mat }

func quantizeMat(n, k int, w []float32) q8Mat {
	q, s := cpu.QuantizeInt8(n, k, w)
	return q8Mat{q, s}
}

// quantize fills c.q8 and c.q8Head from the float32 weights.
func (c *CPU) quantize() {
	cfg, w := c.cfg, c.m.Weights
	d, F, qd := cfg.HiddenSize, cfg.IntermediateSize, cfg.QDim()
	W := qd + 2*cfg.KVDim()
	c.q8 = make([]q8Layer, len(w.Layers))
	for l := range w.Layers {
		L := &w.Layers[l]
		c.q8[l] = q8Layer{
			qkv:  quantizeMat(W, d, c.wqkv[l]),
			gu:   quantizeMat(2*F, d, c.wgu[l]),
			wo:   quantizeMat(d, qd, L.Wo),
			down: quantizeMat(d, F, L.WDown),
		}
	}
	h := quantizeMat(cfg.VocabSize, d, w.LMHead)
	c.q8Head = &h
}

// gemm computes y[m,n] = x[m,k]·wᵀ (+ y if acc) with w the float32 matrix
// w32 [n,k] or, for 1 ≤ m ≤ bf16Max, its int8 copy q8 when the int8
// path is on, else its exact bf16 copy w16 when the bf16 path is on (nil
// copies select w32 always), with x rounded to bf16 (GemmBF16Dot) when
// dot is set (c.bf16Dot for the layers' GEMMs).
func (c *CPU) gemm(m, n, k int, x, w32 []float32, w16 []uint16, q8 *q8Mat, y []float32, acc, dot bool) {
	small := m >= 1 && m <= c.bf16Max
	use8 := small && q8 != nil && q8.q != nil
	use16 := small && c.bf16 != nil && w16 != nil
	switch {
	case use8 && acc:
		cpu.GemmInt8Acc(m, n, k, x, q8.q, q8.s, y)
	case use8:
		cpu.GemmInt8(m, n, k, x, q8.q, q8.s, y)
	case use16 && dot && acc:
		cpu.GemmBF16DotAcc(m, n, k, x, w16, y)
	case use16 && dot:
		cpu.GemmBF16Dot(m, n, k, x, w16, y)
	case use16 && acc:
		cpu.GemmBF16Acc(m, n, k, x, w16, y)
	case use16:
		cpu.GemmBF16(m, n, k, x, w16, y)
	case acc:
		cpu.GemmAcc(m, n, k, x, w32, y)
	default:
		cpu.Gemm(m, n, k, x, w32, y)
	}
}

// KVBytesPerToken is the cache memory one token costs: K and V, every layer.
func KVBytesPerToken(cfg model.Config) int64 {
	return int64(2 * cfg.NumLayers * cfg.KVDim() * 4)
}

// NumBlocks is the number of KV blocks in the cache.
func (c *CPU) NumBlocks() int { return c.numBlocks }

// BlockSize is the number of tokens per KV block.
func (c *CPU) BlockSize() int { return c.blockSize }

// VocabSize is the width of one logits row.
func (c *CPU) VocabSize() int { return c.cfg.VocabSize }

// Model is the model the backend runs (shared, read-only).
func (c *CPU) Model() *model.Model { return c.m }

// KVCacheBytes is the memory the K and V caches take (all layers).
func (c *CPU) KVCacheBytes() int64 { return int64(c.numBlocks*c.blockSize) * KVBytesPerToken(c.cfg) }

// Close drops the cache. It must not race
// with Forward (same single owner).
func (c *CPU) Close() error {
	if c.closed {
		return nil
	}
	c.closed = true
	c.kc, c.vc = nil, nil
	return nil
}

// CopyBlocks copies the first slots[i] slots of block src[i] → dst[i] in
// every layer's K and V cache (forward.Backend's contract).
func (c *CPU) CopyBlocks(src, dst, slots []int32) error {
	if c.closed {
		return errors.New("forward: backend closed")
	}
	if len(src) != len(dst) || len(src) != len(slots) {
		return fmt.Errorf("forward: CopyBlocks: %d sources, %d destinations, %d slot counts", len(src), len(dst), len(slots))
	}
	for i := range src {
		if !c.validBlock(src[i]) || !c.validBlock(dst[i]) {
			return fmt.Errorf("forward: CopyBlocks: block %d → %d out of range [0,%d)", src[i], dst[i], c.numBlocks)
		}
		if slots[i] < 1 || int(slots[i]) > c.blockSize {
			return fmt.Errorf("forward: CopyBlocks: %d slots of a %d-slot block", slots[i], c.blockSize)
		}
	}
	kvd := c.cfg.KVDim()
	bl := c.blockSize * kvd // floats per block per layer
	for l := range c.kc {
		for i := range src {
			s, d, n := int(src[i])*bl, int(dst[i])*bl, int(slots[i])*kvd
			copy(c.kc[l][d:d+n], c.kc[l][s:s+n])
			copy(c.vc[l][d:d+n], c.vc[l][s:s+n])
		}
	}
	return nil
}

func (c *CPU) validBlock(b int32) bool { return b >= 0 && int(b) < c.numBlocks }

// validate checks the batch against the contract in forward.go before any
// cache write, so a scheduler bug is an error instead of a corrupted cache:
// every token belongs to exactly one span, positions run CtxLen-Len..CtxLen-1,
// each slot is the one the block table gives for that position, and blocks,
// token ids and logit rows are in range. It returns the longest CtxLen.
func (c *CPU) validate(b *Batch, logits []float32) (maxCtx int, err error) {
	T := len(b.Tokens)
	if T == 0 {
		return 0, errors.New("forward: empty batch")
	}
	if len(b.Positions) != T || len(b.SlotMapping) != T {
		return 0, fmt.Errorf("forward: %d tokens, %d positions, %d slots", T, len(b.Positions), len(b.SlotMapping))
	}
	if need := len(b.LogitRows) * c.cfg.VocabSize; len(logits) < need {
		return 0, fmt.Errorf("forward: logits buffer holds %d floats, need %d", len(logits), need)
	}
	for _, r := range b.LogitRows {
		if r < 0 || r >= T {
			return 0, fmt.Errorf("forward: logit row %d outside [0,%d)", r, T)
		}
	}
	for i, tok := range b.Tokens {
		if tok < 0 || int(tok) >= c.cfg.VocabSize {
			return 0, fmt.Errorf("forward: token %d at %d outside vocabulary [0,%d)", tok, i, c.cfg.VocabSize)
		}
	}
	c.owner = grow32(c.owner, T)
	for i := range c.owner {
		c.owner[i] = -1
	}
	bs := c.blockSize
	for si, s := range b.Seqs {
		if s.Len < 1 || s.Start < 0 || s.Start+s.Len > T || s.CtxLen < s.Len {
			return 0, fmt.Errorf("forward: seq %d: start %d len %d ctx %d invalid for %d tokens", si, s.Start, s.Len, s.CtxLen, T)
		}
		if len(s.BlockTable)*bs < s.CtxLen {
			return 0, fmt.Errorf("forward: seq %d: block table of %d blocks cannot hold %d tokens", si, len(s.BlockTable), s.CtxLen)
		}
		for _, blk := range s.BlockTable[:(s.CtxLen+bs-1)/bs] {
			if !c.validBlock(blk) {
				return 0, fmt.Errorf("forward: seq %d: block %d outside [0,%d)", si, blk, c.numBlocks)
			}
		}
		first := s.CtxLen - s.Len
		for j := 0; j < s.Len; j++ {
			t := s.Start + j
			if c.owner[t] >= 0 {
				return 0, fmt.Errorf("forward: token %d in seqs %d and %d", t, c.owner[t], si)
			}
			c.owner[t] = int32(si)
			p := first + j
			if int(b.Positions[t]) != p {
				return 0, fmt.Errorf("forward: seq %d token %d has position %d, want %d", si, t, b.Positions[t], p)
			}
			if want := s.BlockTable[p/bs]*int32(bs) + int32(p%bs); b.SlotMapping[t] != want {
				return 0, fmt.Errorf("forward: seq %d token %d (pos %d) slot %d, block table gives %d", si, t, p, b.SlotMapping[t], want)
			}
		}
		maxCtx = max(maxCtx, s.CtxLen)
	}
	for t, o := range c.owner {
		if o < 0 {
			return 0, fmt.Errorf("forward: token %d belongs to no sequence", t)
		}
	}
	return maxCtx, nil
}

// Forward runs the model over b (see Backend). Reads top to bottom like
// llama2.c; shapes in comments use T tokens, R logit rows, d hidden,
// H query heads, G KV heads, hd head_dim, F ffn width, V vocab.
func (c *CPU) Forward(b *Batch, logits []float32) error {
	if c.closed {
		return errors.New("forward: backend closed")
	}
	maxCtx, err := c.validate(b, logits)
	if err != nil {
		return err
	}
	cfg, w := c.cfg, c.m.Weights
	T, d, F, V := len(b.Tokens), cfg.HiddenSize, cfg.IntermediateSize, cfg.VocabSize
	qd, kvd := cfg.QDim(), cfg.KVDim()
	eps := float32(cfg.RMSNormEps)
	c.x, c.xn = grow(c.x, T*d), grow(c.xn, T*d)
	W := qd + 2*kvd
	c.qkv, c.gu = grow(c.qkv, T*W), grow(c.gu, T*2*F)
	c.att = grow(c.att, T*qd)
	c.gate = grow(c.gate, T*F)
	for i := range c.scores {
		c.scores[i] = grow(c.scores[i], maxCtx)
		c.offs[i] = growInt(c.offs[i], maxCtx)
	}

	// Embedding lookup: x[t] = Embed[token t].                       x: [T,d]
	for t, tok := range b.Tokens {
		copy(c.x[t*d:(t+1)*d], w.Embed[int(tok)*d:])
	}
	for l := range w.Layers {
		L := &w.Layers[l]
		var B model.BF16Layer // zero (nil views) when the bf16 path is off
		if c.bf16 != nil {
			B = c.bf16.Layers[l]
		}
		var Q q8Layer // zero (nil) when the int8 path is off
		if c.q8 != nil {
			Q = c.q8[l]
		}
		// Attention sublayer.
		// xn[T,d] = RMSNorm(x); qkv[T,W] = xn·Wqkvᵀ, each row
		// q[H·hd] | k[G·hd] | v[G·hd] (W = (H+2G)·hd); RoPE rotates the
		// q and k heads in place.
		cpu.RMSNorm(c.xn, c.x, L.AttnNorm, T, d, eps)
		c.gemm(T, W, d, c.xn, c.wqkv[l], B.QKV, &Q.qkv, c.qkv, false, c.bf16Dot)
		cpu.RoPEStrided(c.qkv, W, b.Positions, T, cfg.NumHeads+cfg.NumKVHeads, cfg.HeadDim, cfg.RopeTheta)
		// Write this step's K/V into their slots before attention, so a
		// token sees itself and the earlier tokens of its own chunk.
		// kc, vc: [numBlocks·blockSize slots, G·hd].
		kc, vc := c.kc[l], c.vc[l]
		for t, slot := range b.SlotMapping {
			row := c.qkv[t*W : (t+1)*W]
			copy(kc[int(slot)*kvd:(int(slot)+1)*kvd], row[qd:qd+kvd])
			copy(vc[int(slot)*kvd:(int(slot)+1)*kvd], row[qd+kvd:])
		}
		c.attention(b, l)                                                // att[T,H·hd]
		c.gemm(T, d, qd, c.att, L.Wo, B.Wo, &Q.wo, c.x, true, c.bf16Dot) // x[T,d] += att·Woᵀ
		// MLP sublayer (SwiGLU).
		// xn[T,d] = RMSNorm(x); gu[T,2F] = xn·[Wgate;Wup]ᵀ (gate then up
		// in each row); gate[T,F] = silu(gu[:, :F])·gu[:, F:].
		cpu.RMSNorm(c.xn, c.x, L.MLPNorm, T, d, eps)
		c.gemm(T, 2*F, d, c.xn, c.wgu[l], B.GateUp, &Q.gu, c.gu, false, c.bf16Dot)
		cpu.SwiGLU(c.gate, c.gu, T, F)
		c.gemm(T, d, F, c.gate, L.WDown, B.WDown, &Q.down, c.x, true, c.bf16Dot) // x[T,d] += gate·Wdownᵀ
	}
	// Final norm and LM head only for the rows that will be sampled.
	R := len(b.LogitRows)
	if R == 0 {
		return nil
	}
	c.rows = grow(c.rows, R*d) //                                       rows: [R,d]
	for i, r := range b.LogitRows {
		copy(c.rows[i*d:(i+1)*d], c.x[r*d:(r+1)*d])
	}
	cpu.RMSNorm(c.rows, c.rows, w.FinalNorm, R, d, eps)
	var head16 []uint16
	if c.bf16 != nil {
		head16 = c.bf16.LMHead
	}
	// Under BF16Dot the LM head rounds its input to bf16 too, and then
	// recomputes each row's leading logits from the float32 input.
	c.gemm(R, V, d, c.rows, w.LMHead, head16, c.q8Head, logits[:R*V], false, c.bf16Dot) // logits: [R,V]
	if c.bf16Dot && head16 != nil && R <= c.bf16Max {
		c.refineHead(R, logits[:R*V])
	}
	return nil
}

// headRefineMargin is how far below a row's largest logit refineHead
// recomputes logits exactly. Rounding the LM head's input to bf16 moves a
// logit of the shipped model by about 0.01 (at most ~0.05 with the layers'
// rounding below), so every logit that could be the row's largest after
// recomputing lies within 0.1 of the largest rounded one; 0.5 leaves a
// margin of 5 (docs/DECISIONS.md, "LM head on bf16 inputs").
const headRefineMargin = 0.5

// refineHead replaces, in each of the R rows of logits ([R,V], computed
// by the LM head from bf16-rounded hidden states c.rows), every logit
// within headRefineMargin of the row's largest by its float32 value
// rows[i]·LMHead[v]. A row's largest logit, and so a greedy choice, is
// then the float32 path's (up to float32 summation order); the logits far
// below it keep the rounding's error of about 0.01, which moves no
// sampled token's probability by more than a few percent at the service's
// temperatures. Rows with NaNs are left as they are.
func (c *CPU) refineHead(R int, logits []float32) {
	d, V := c.cfg.HiddenSize, c.cfg.VocabSize
	head := c.m.Weights.LMHead
	c.hidx = grow32(c.hidx, V)
	for i := range R {
		row, h := logits[i*V:(i+1)*V], c.rows[i*d:(i+1)*d]
		m, _, nan := cpu.ScanMax(row)
		if nan || math.IsInf(float64(m), 0) {
			continue
		}
		n, _ := cpu.CompactGreater(c.hidx, row, m-headRefineMargin)
		for _, v := range c.hidx[:n] {
			row[v] = cpu.Dot(h, head[int(v)*d:(int(v)+1)*d])
		}
	}
}

// attnInlineMACs is the attention work (multiply-adds: 2·headDim per
// query head and context position) below which attention runs on the
// caller alone: waking the attention workers can cost more than a decode
// step's attention at a small batch takes (batch 1 at 40 tokens of
// context, 6 heads of 64: 31k multiply-adds, a few µs). Set for
// channel-woken workers and not re-tuned for the spinning pool
// (docs/DECISIONS.md, "Attention inline below attnInlineMACs").
const attnInlineMACs = 1 << 16

// attention fills att for every token of b in layer l, one work item per
// (sequence, query head), spread over the worker pool when there is enough
// work (attnInlineMACs).
func (c *CPU) attention(b *Batch, l int) {
	c.jobBatch, c.jobLayer = b, l
	c.next.Store(0)
	var macs int
	for _, s := range b.Seqs {
		macs += s.Len * s.CtxLen // an upper bound (a prefill chunk sees less)
	}
	if macs*c.cfg.NumHeads*2*c.cfg.HeadDim < c.attnInline {
		c.attnItems(0)
		c.jobBatch = nil
		return
	}
	// On the kernel pool's workers, which spin between the GEMMs: with
	// attention workers of its own (woken through channels) the two sets
	// competed for the second core, and the woken ones waited for it.
	cpu.Parallel((*attnJob)(c), c.workers)
	c.jobBatch = nil
}

// attnJob is a CPU seen as a cpu.Job: part w claims attention items with
// worker w's scratch (c.scores[w], c.offs[w]).
type attnJob CPU

func (j *attnJob) Run(part, _ int) { (*CPU)(j).attnItems(part) }

// attnItems claims (sequence, head) items until none are left. For query
// head h of a token at position p it computes
//
//	att[t, h] = Σ_{u ≤ p} softmax_u(q[t,h]·K[u,g]/√hd) · V[u,g],  g = h/(H/G)
//
// reading K[u,g] and V[u,g] from the cache slot that the sequence's block
// table gives for position u. The item's cache offsets are listed once, so
// that each token's scores and weighted sum are one cpu.DotsAt and one
// cpu.AxpysAt call instead of a call per position.
func (c *CPU) attnItems(w int) {
	b, l := c.jobBatch, c.jobLayer
	cfg := c.cfg
	H, hd, kvd, bs := cfg.NumHeads, cfg.HeadDim, cfg.KVDim(), c.blockSize
	group := H / cfg.NumKVHeads
	qd, W := cfg.QDim(), cfg.QDim()+2*cfg.KVDim()
	scale := float32(1 / math.Sqrt(float64(hd)))
	kc, vc := c.kc[l], c.vc[l]
	n := int64(len(b.Seqs) * H)
	for {
		item := c.next.Add(1) - 1
		if item >= n {
			return
		}
		s := &b.Seqs[item/int64(H)]
		h := int(item % int64(H))
		g := h / group
		// offs[u] is where K[u,g] (in kc) and V[u,g] (in vc) start. Walk
		// the block table: positions i·bs … i·bs+bs-1 live in slots
		// BlockTable[i]·bs + 0 … bs-1.
		offs := c.offs[w][:s.CtxLen] // [CtxLen]
		for u0 := 0; u0 < s.CtxLen; u0 += bs {
			off := (int(s.BlockTable[u0/bs])*bs*cfg.NumKVHeads + g) * hd
			for u := u0; u < min(u0+bs, s.CtxLen); u, off = u+1, off+kvd {
				offs[u] = off
			}
		}
		first := s.CtxLen - s.Len
		for j := 0; j < s.Len; j++ {
			t, p := s.Start+j, first+j
			q := c.qkv[t*W+h*hd : t*W+(h+1)*hd] // [hd], rotated in place
			sc := c.scores[w][:p+1]             // [p+1]
			cpu.DotsAt(q, kc, offs[:p+1], sc)
			for u := range sc {
				sc[u] *= scale
			}
			cpu.Softmax(sc)
			out := c.att[t*qd+h*hd : t*qd+(h+1)*hd] // [hd]
			clear(out)
			cpu.AxpysAt(sc, vc, offs[:p+1], out)
		}
	}
}

// grow returns buf resliced to n floats, reallocating only when its
// capacity is short (so steady-state steps allocate nothing).
func grow(buf []float32, n int) []float32 {
	if cap(buf) < n {
		return make([]float32, n, n+n/4)
	}
	return buf[:n]
}

func growInt(buf []int, n int) []int {
	if cap(buf) < n {
		return make([]int, n, n+n/4)
	}
	return buf[:n]
}

func grow32(buf []int32, n int) []int32 {
	if cap(buf) < n {
		return make([]int32, n, n+n/4)
	}
	return buf[:n]
}
