package model

// packLayers re-lays each layer's Wq, Wk, Wv into one contiguous array
// [nHeads·hd + 2·nKVHeads·hd, d] and WGate, WUp into one [2·ffn, d], keeping
// the separate fields as views into them (uncapped, so the first view's
// capacity reaches the whole group; weights are never appended to). The matrices are row-major
// [out, in], so stacking along out is plain concatenation, and a backend can
// run one fused GEMM per group (fewer, larger calls: better for small
// batches) without a second copy of the weights; see Fused.
func packLayers(w *Weights) {
	for i := range w.Layers {
		l := &w.Layers[i]
		if qkv := concat(l.Wq, l.Wk, l.Wv); qkv != nil {
			nq, nk := len(l.Wq), len(l.Wk)
			l.Wq, l.Wk, l.Wv = qkv[:nq], qkv[nq:nq+nk], qkv[nq+nk:]
		}
		if gu := concat(l.WGate, l.WUp); gu != nil {
			ng := len(l.WGate)
			l.WGate, l.WUp = gu[:ng], gu[ng:]
		}
	}
}

func concat(parts ...[]float32) []float32 {
	n := 0
	for _, p := range parts {
		if p == nil {
			return nil
		}
		n += len(p)
	}
	out := make([]float32, 0, n)
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// Fused returns the layer's stacked QKV [q+2kv, d] and gate/up [2ffn, d]
// matrices: views when the layer was packed at load time (Load, LoadFS and
// NewRandom do this), fresh copies otherwise. The views are read-only like
// all weights.
func (l *Layer) Fused() (qkv, gateUp []float32) {
	if qkv = adjacent(l.Wq, l.Wk, l.Wv); qkv == nil {
		qkv = concat(l.Wq, l.Wk, l.Wv)
	}
	if gateUp = adjacent(l.WGate, l.WUp); gateUp == nil {
		gateUp = concat(l.WGate, l.WUp)
	}
	return qkv, gateUp
}

// adjacent returns parts as one slice when they are consecutive views of
// one backing array (each starts where the previous ends, and the first
// one's capacity covers them all), else nil.
func adjacent(parts ...[]float32) []float32 {
	n := 0
	for _, p := range parts {
		if len(p) == 0 {
			return nil
		}
		n += len(p)
	}
	first := parts[0]
	if cap(first) < n {
		return nil
	}
	all := first[:n]
	off := 0
	for _, p := range parts {
		if &all[off] != &p[0] {
			return nil
		}
		off += len(p)
	}
	return all
}
