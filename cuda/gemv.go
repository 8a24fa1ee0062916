package cuda

import (
	"errors"
	"math"
	"runtime"
	"unsafe"

	"chunlian/model"
)

// The small-batch path: steps of at most gemvUpTo tokens (single-sequence
// decode; the kernels take up to gemvMaxM) run through the hand-written
// GEMV kernels of kernels/llama.cu instead of cuBLAS plus separate
// element-wise kernels. Per decoder layer:
//
//	gemv_qkv_rope  RMSNorm + [q|k|v] projection + RoPE + K/V cache write
//	               (layer 0 also gathers the embeddings into the residual)
//	paged_attention_chunked
//	gemv           attention output projection, added to the residual
//	gemv_gu_silu   RMSNorm + gate/up projection + SiLU·up
//	gemv           down projection, added to the residual
//
// then one gemv for final RMSNorm + LM head over the sampled rows and
// row_lse when asked: 5 launches per layer instead of 8 (42 instead of 68
// for the 8-layer model). At M ≤ 8 a step is bound by launch latency and by
// reading the weights once, which these kernels do with float4 loads of
// each weight row shared by all M tokens; they multiply in exact float32
// (no TF32 rounding), so Options.Precision only affects larger batches.
// Weights: bf16 copies when the model's weights are exactly bf16 (the
// shipped model is stored in bf16: lossless, half the bytes, and the 33 MB
// of matrices fit the H200's 50 MB L2 across steps), else float32; see
// Options.GEMVWeights.

// gemvMaxM is the largest batch (tokens, and logits rows) the GEMV kernels
// take; it must equal GEMV_MAX_M in kernels/llama.cu.
const gemvMaxM = 8

// gemvUpTo is the largest step that runs on the GEMV path: from 2 tokens
// on, the GEMM path's step is faster (docs/DECISIONS.md, "GEMV path for
// one token").
const gemvUpTo = 1

// gemvThreads and gemvWarps: GEMV_THREADS and GEMV_WARPS in llama.cu.
const (
	gemvThreads = 128
	gemvWarps   = gemvThreads / 32
)

// gemvMaxShm is the dynamic shared memory a kernel may use without
// opting in through cuFuncSetAttribute.
const gemvMaxShm = 48 << 10

// gemvShapesOK reports whether a model with hidden size d, MLP size ffn and
// attention width nq = heads × head dim can use the GEMV path: float4 loads
// need every K to be a multiple of 4, and gemvMaxM input rows of the widest
// K must fit in shared memory.
func gemvShapesOK(d, ffn, nq int) bool {
	for _, k := range []int{d, ffn, nq} {
		if k < 4 || k%4 != 0 || gemvMaxM*k*4 > gemvMaxShm {
			return false
		}
	}
	return true
}

// useGEMV says whether a step of T tokens runs on the small-batch path.
func (b *Backend) useGEMV(T int) bool {
	return b.gemvOK && T >= 1 && T <= min(gemvUpTo, gemvMaxM)
}

// gemvBFWanted decides Options.GEMVWeights for model m: the bf16 kernels
// read 8 weights per 16-byte load, so every K must be a multiple of 8.
func (b *Backend) gemvBFWanted(m *model.Model) bool {
	c := m.Config
	for _, k := range []int{c.HiddenSize, c.IntermediateSize, c.NumHeads * b.hd} {
		if k%8 != 0 {
			return false
		}
	}
	switch b.opt.GEMVWeights {
	case "bf16":
		return true
	case "fp32":
		return false
	}
	w := m.Weights
	if !bf16Exact(w.LMHead) {
		return false
	}
	for _, L := range w.Layers {
		if !bf16Exact(L.Wq) || !bf16Exact(L.Wk) || !bf16Exact(L.Wv) || !bf16Exact(L.Wo) ||
			!bf16Exact(L.WGate) || !bf16Exact(L.WUp) || !bf16Exact(L.WDown) {
			return false
		}
	}
	return true
}

// bf16Exact reports whether every value of s is a bfloat16 (its low 16
// bits are zero), so that converting to bf16 loses nothing.
func bf16Exact(s []float32) bool {
	for _, v := range s {
		if math.Float32bits(v)&0xffff != 0 {
			return false
		}
	}
	return true
}

// toBF16 rounds to nearest even bfloat16 (exact for bf16Exact input; NaNs
// stay NaNs).
func toBF16(s []float32) []uint16 {
	out := make([]uint16, len(s))
	for i, v := range s {
		u := math.Float32bits(v)
		if v != v {
			out[i] = uint16(u>>16) | 0x40
			continue
		}
		out[i] = uint16((u + 0x7fff + (u>>16)&1) >> 16)
	}
	return out
}

// uploadBF16 copies s to a new device buffer as bfloat16.
func (b *Backend) uploadBF16(s []float32) (uintptr, error) {
	h := toBF16(s)
	p, err := b.alloc(int64(len(h)) * 2)
	if err != nil || len(h) == 0 {
		return p, err
	}
	d := &b.l.drv
	err = d.call("cuMemcpyHtoDAsync(bf16)", d.cuMemcpyHtoDAsync, p, uintptr(unsafe.Pointer(&h[0])), uintptr(len(h)*2), b.stream)
	if err == nil {
		err = b.sync()
	}
	runtime.KeepAlive(h)
	return p, err
}

// enqueueSmall is enqueue for T ≤ gemvMaxM tokens (see the file comment).
// Buffers as in enqueue: b.x [T,d] residual, b.qkv [T,qkvDim], b.attn
// [T,nH*hd], b.act [T,ffn], b.logitBuf [R,V], b.lseBuf [R].
func (b *Backend) enqueueSmall(T, R, stride int, off [6]int) error {
	mp := func(i int) uint64 { return uint64(b.meta + uintptr(off[i]*4)) }
	tokens, positions, slots, tokSeq, rows, tables := mp(0), mp(1), mp(2), mp(3), mp(4), mp(5)
	c := b.cfg
	dm, ffn, nH, nKV, V := c.HiddenSize, c.IntermediateSize, c.NumHeads, c.NumKVHeads, c.VocabSize
	nq := nH * b.hd
	eps := f32(float32(c.RMSNormEps))
	scale := float32(1 / math.Sqrt(float64(b.hd)))
	grid := func(units int) int { return (units + gemvWarps - 1) / gemvWarps }
	// Kernel names and weight pointers of the chosen weight format.
	kGemv, kQKV, kGU := "gemv", "gemv_qkv_rope", "gemv_gu_silu"
	lm := b.lmHead
	if b.gemvBF {
		kGemv, kQKV, kGU = "gemv_bf16", "gemv_qkv_rope_bf16", "gemv_gu_silu_bf16"
		lm = b.lmHeadBF
	}
	var errs error
	for l, L := range b.layers {
		kc, vc := b.kvSlab(l, 0), b.kvSlab(l, 1)
		wqkv, wo, wgu, down := L.wqkv, L.wo, L.wgu, L.down
		if b.gemvBF {
			wqkv, wo, wgu, down = L.wqkvBF, L.woBF, L.wguBF, L.downBF
		}
		// Layer 0's first kernel follows the metadata copy, not a kernel
		// of ours: no programmatic dependent launch there.
		qkvLaunch := b.launchPDL
		if l == 0 {
			qkvLaunch = b.launchShm
		}
		// Layer 0 reads the embedding table through the token ids and
		// writes the residual stream; later layers read the residual.
		src, ids := dptr(b.x), uint64(0)
		if l == 0 {
			src, ids = dptr(b.embed), tokens
		}
		errs = errors.Join(
			qkvLaunch(kQKV, grid(b.qkvDim/2), 1, gemvThreads, T*dm*4,
				dptr(b.qkv), src, ids, dptr(b.x), dptr(L.attnNorm), eps, dptr(wqkv), dptr(b.cosSin), positions, slots,
				dptr(kc), dptr(vc), i32(T), i32(dm), i32(nH), i32(nKV)),
			b.launchPDL(b.attnKernel("paged_attention_chunked", T), (T*nH+3)/4, 1, 128, 0, dptr(b.attn), dptr(b.qkv), dptr(kc), dptr(vc), tokSeq, positions,
				tables, i32(stride), i32(T), i32(nH), i32(nKV), i32(b.opt.BlockSize), f32(scale), 0),
			b.launchPDL(kGemv, grid(dm), 1, gemvThreads, T*nq*4,
				dptr(b.x), dptr(b.attn), 0, 0, 0, dptr(wo), i32(T), i32(dm), i32(nq), 1),
			b.launchPDL(kGU, grid(ffn), 1, gemvThreads, T*dm*4,
				dptr(b.act), dptr(b.x), dptr(L.mlpNorm), eps, dptr(wgu), i32(T), i32(dm), i32(ffn)),
			b.launchPDL(kGemv, grid(dm), 1, gemvThreads, T*ffn*4,
				dptr(b.x), dptr(b.act), 0, 0, 0, dptr(down), i32(T), i32(dm), i32(ffn), 1),
		)
		if errs != nil {
			return errs
		}
	}
	if R == 0 {
		return nil
	}
	if R <= gemvMaxM {
		errs = b.launchPDL(kGemv, grid(V), 1, gemvThreads, R*dm*4,
			dptr(b.logitBuf), dptr(b.x), rows, dptr(b.finalNorm), eps, dptr(lm), i32(R), i32(V), i32(dm), 0)
	} else { // duplicate logits rows can make R > T
		errs = errors.Join(
			b.rmsnorm(b.xs, b.x, b.finalNorm, rows, R, 0),
			b.gemm(b.logitBuf, b.xs, b.lmHead, R, V, dm, false),
		)
	}
	if errs == nil {
		lse := b.launchPDL // after the LM head's gemv
		if R > gemvMaxM {
			lse = b.launchShm // after cuBLAS
		}
		errs = lse("row_lse", R, 1, rowLSEThreads, 0, dptr(b.lseBuf), dptr(b.logitBuf), i32(V))
	}
	return errs
}

// rowLSEThreads is row_lse's block size (one block per logits row).
const rowLSEThreads = 1024
