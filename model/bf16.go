package model

import "math"

// BF16Weights are bf16 copies (bit patterns: the top 16 bits of the float32)
// of the weight matrices a forward pass streams, for backends whose small
// batch GEMMs are memory-bound: reading half the bytes per token is up to
// twice as fast. They hold exactly the values of the float32 matrices
// (Weights.BuildBF16 only builds them when that is true), so a backend may
// use either copy for any product and get the same model.
//
// Layouts are those of the float32 matrices ([out, in] row-major), with the
// projections stacked as Layer.Fused stacks them. Read-only, like all
// weights.
type BF16Weights struct {
	Layers []BF16Layer
	LMHead []uint16 // [vocab, d]; bf16 of Weights.LMHead (the embedding when tied)
}

// BF16Layer is one decoder layer's matrices in bf16.
type BF16Layer struct {
	QKV    []uint16 // [nHeads·hd + 2·nKVHeads·hd, d]: Wq; Wk; Wv
	GateUp []uint16 // [2·ffn, d]: WGate; WUp
	Wo     []uint16 // [d, nHeads·hd]
	WDown  []uint16 // [d, ffn]
}

// BuildBF16 sets w.BF16 to bf16 copies of the matrices when every one of
// them (the fused QKV and gate/up, Wo, WDown and the LM head) is exactly
// representable in bf16, as it is when the safetensors file stored bf16;
// otherwise it leaves w.BF16 nil. It reports whether w.BF16 is set. The
// check stops at the first inexact value, so it costs next to nothing for
// float32 weights. Cost: half the float32 matrices' memory (≈ 33 MB for the
// shipped model). Not safe concurrently with readers of w; Load calls it
// before the model is shared.
func (w *Weights) BuildBF16() bool {
	w.BF16 = nil
	b := &BF16Weights{}
	for i := range w.Layers {
		l := &w.Layers[i]
		qkv, gu := l.Fused()
		var bl BF16Layer
		var ok [4]bool
		bl.QKV, ok[0] = exactBF16(qkv)
		bl.GateUp, ok[1] = exactBF16(gu)
		bl.Wo, ok[2] = exactBF16(l.Wo)
		bl.WDown, ok[3] = exactBF16(l.WDown)
		if !ok[0] || !ok[1] || !ok[2] || !ok[3] {
			return false
		}
		b.Layers = append(b.Layers, bl)
	}
	var ok bool
	if b.LMHead, ok = exactBF16(w.LMHead); !ok {
		return false
	}
	w.BF16 = b
	return true
}

// RoundToBF16 rounds every weight matrix (embedding, projections, LM head;
// not the norm vectors) to the nearest bf16 value in place and then calls
// BuildBF16, so the model afterwards has bf16 weights as if loaded from a
// bf16 file. For tests and experiments on random models; it mutates the
// weights, so call it before the model is shared.
func (w *Weights) RoundToBF16() {
	round := func(s []float32) {
		for i, f := range s {
			s[i] = math.Float32frombits(uint32(bf16Round(f)) << 16)
		}
	}
	round(w.Embed)
	if &w.LMHead[0] != &w.Embed[0] {
		round(w.LMHead)
	}
	for i := range w.Layers {
		l := &w.Layers[i]
		for _, s := range [][]float32{l.Wq, l.Wk, l.Wv, l.Wo, l.WGate, l.WUp, l.WDown} {
			round(s)
		}
	}
	w.BuildBF16()
}

// exactBF16 returns the bf16 bit patterns of s, or false if some value has
// non-zero low 16 bits (is not exactly a bf16 value).
func exactBF16(s []float32) ([]uint16, bool) {
	if len(s) == 0 {
		return nil, false
	}
	out := make([]uint16, len(s))
	for i, f := range s {
		u := math.Float32bits(f)
		if u&0xffff != 0 {
			return nil, false
		}
		out[i] = uint16(u >> 16)
	}
	return out, true
}

// bf16Round returns the bf16 bit pattern nearest to f (ties to even; NaN
// stays NaN).
func bf16Round(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 {
		return uint16(u>>16) | 0x40
	}
	return uint16((u + 0x7fff + (u>>16)&1) >> 16)
}
