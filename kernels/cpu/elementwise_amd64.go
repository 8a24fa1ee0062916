//go:build amd64

package cpu

// Dot and Axpy, and their batched forms DotsAt and AxpysAt, in assembly
// (elementwise_amd64.s; AVX2+FMA, checked at run time) in place of the
// plain-Go loops: attention runs them on head-sized vectors (64 floats for
// the shipped model), once per query head and token for the batched forms,
// where plain Go is a visible share of a decode step. SwiGLU's SiLU·mul
// loop is assembly too (siluMulAsm, sample_amd64.s, on the sampler's
// vector exp): it runs serially on the engine goroutine. RoPE's rotation
// is assembly too (ropeAsm, bit for bit ropeGo). RMSNorm's sum of squares
// and scale and Add stay plain Go here: they barely show in a server
// profile (docs/DECISIONS.md, "Elementwise kernels in assembly").

//go:noescape
func dotAVX2(a, b *float32, n int) float32

//go:noescape
func axpyAVX2(alpha float32, x, y *float32, n int)

// dotsAVX2 is dotAVX2 for each of the cnt vectors at base+offs[i], writing
// out[i]; axpysAVX2 adds alpha[i]·(the vector at base+offs[i]) to y for
// i < cnt, keeping y in registers. n is a multiple of 8, cnt ≥ 1, and the
// offsets were checked.
//
//go:noescape
func dotsAVX2(q, base *float32, offs *int, out *float32, n, cnt int)

//go:noescape
func axpysAVX2(alpha, base *float32, offs *int, y *float32, n, cnt int)

// ropeAVX2 is ropeGo on the first n elements, n a positive multiple of 8.
//
//go:noescape
func ropeAVX2(a, b, cos, sin *float32, n int)

var asmElem = func() elemKernels {
	e := goElem
	e.name, e.dot, e.axpy = "asm", dotAsm, axpyAsm
	e.dotsAt, e.axpysAt = dotsAtAsm, axpysAtAsm
	e.softmax, e.scanMax, e.expSum, e.exp, e.compact = softmaxAsm, scanMaxAsm, expSumAsm, expAsm, compactAsm
	e.compactVals = compactValsAsm
	e.siluMul = siluMulAsm
	e.rope = ropeAsm
	return e
}()

func init() {
	if !asmAVX2 {
		return
	}
	elemSets = append(elemSets, asmElem)
	if !goForced {
		elem = asmElem
	}
}

// dotAsm is dotGo with the first len(a)&^7 terms in assembly.
func dotAsm(a, b []float32) float32 {
	b = b[:len(a)]
	n8 := len(a) &^ 7
	var s float32
	if n8 > 0 {
		s = dotAVX2(&a[0], &b[0], n8)
	}
	for i := n8; i < len(a); i++ {
		s += a[i] * b[i]
	}
	return s
}

// ropeAsm is ropeGo with the first len(a)&^7 pairs in assembly.
func ropeAsm(a, b, cos, sin []float32) {
	b, cos, sin = b[:len(a)], cos[:len(a)], sin[:len(a)]
	n8 := len(a) &^ 7
	if n8 > 0 {
		ropeAVX2(&a[0], &b[0], &cos[0], &sin[0], n8)
	}
	ropeGo(a[n8:], b[n8:], cos[n8:], sin[n8:])
}

// axpyAsm is axpyGo with the first len(x)&^7 elements in assembly.
func axpyAsm(alpha float32, x, y []float32) {
	y = y[:len(x)]
	n8 := len(x) &^ 7
	if n8 > 0 {
		axpyAVX2(alpha, &x[0], &y[0], n8)
	}
	for i := n8; i < len(x); i++ {
		y[i] += alpha * x[i]
	}
}

// dotsAtAsm is dotAsm for every offset: the first len(q)&^7 terms in
// assembly, the rest added in the same order.
func dotsAtAsm(q, base []float32, offs []int, out []float32) {
	if len(offs) == 0 {
		return
	}
	out = out[:len(offs)]
	n8 := len(q) &^ 7
	if n8 > 0 {
		dotsAVX2(&q[0], &base[0], &offs[0], &out[0], n8, len(offs))
	} else {
		clear(out)
	}
	if n8 == len(q) {
		return
	}
	qt := q[n8:]
	for i, o := range offs {
		s := out[i]
		bt := base[o+n8 : o+len(q)]
		for j, v := range qt {
			s += v * bt[j]
		}
		out[i] = s
	}
}

// axpysAtAsm is axpyAsm for every offset in turn: the first len(y)&^7
// elements in assembly, the rest adding the terms in the same order.
func axpysAtAsm(alpha, base []float32, offs []int, y []float32) {
	if len(offs) == 0 {
		return
	}
	alpha = alpha[:len(offs)]
	n8 := len(y) &^ 7
	if n8 > 0 {
		axpysAVX2(&alpha[0], &base[0], &offs[0], &y[0], n8, len(offs))
	}
	for j := n8; j < len(y); j++ {
		s := y[j]
		for i, o := range offs {
			s += alpha[i] * base[o+j]
		}
		y[j] = s
	}
}
