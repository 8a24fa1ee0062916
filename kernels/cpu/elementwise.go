package cpu

import (
	"fmt"
	"math"
	"sync"
)

// Row and elementwise kernels. Each has a plain-Go body; the *Impl variables
// are replaced by SIMD versions at init when the build has GOEXPERIMENT=simd
// and the CPU has AVX2+FMA (see elementwise_simd_amd64.go).

var (
	dotImpl      = dotGo
	axpyImpl     = axpyGo
	sumSqImpl    = sumSqGo
	scaleMulImpl = scaleMulGo
)

// Dot returns Σ a[i]·b[i] over len(a) (b must be at least as long).
func Dot(a, b []float32) float32 { return dotImpl(a, b[:len(a)]) }

// Axpy computes y[i] += alpha·x[i] over len(x) (y must be at least as long).
func Axpy(alpha float32, x, y []float32) { axpyImpl(alpha, x, y[:len(x)]) }

func axpyGo(alpha float32, x, y []float32) {
	y = y[:len(x)]
	for i, v := range x {
		y[i] += alpha * v
	}
}

func sumSqGo(x []float32) float32 { return dotGo(x, x) }

// scaleMulGo: out[i] = x[i]·s·w[i].
func scaleMulGo(out, x, w []float32, s float32) {
	x, w = x[:len(out)], w[:len(out)]
	for i := range out {
		out[i] = x[i] * s * w[i]
	}
}

// RMSNorm normalises each of rows rows of x[rows,d] into out[rows,d]:
// out = x / sqrt(mean(x²)+eps) * weight, weight is [d]. out may alias x.
func RMSNorm(out, x, weight []float32, rows, d int, eps float32) {
	if len(x) < rows*d || len(out) < rows*d || len(weight) < d {
		panic(fmt.Sprintf("cpu.RMSNorm: bad shapes rows=%d d=%d len(out)=%d len(x)=%d len(weight)=%d",
			rows, d, len(out), len(x), len(weight)))
	}
	j := rmsJob{out, x, weight[:d], rows, d, eps}
	parts := rowParts(rows, d)
	if parts <= 1 {
		j.rows0(0, rows)
		return
	}
	poolMu.Lock()
	theRMSJob = j
	runParts(&theRMSJob, parts)
	theRMSJob = rmsJob{}
	poolMu.Unlock()
}

// rmsJob is one RMSNorm call: out, x [rows,d], weight [d]. theRMSJob is
// guarded by poolMu.
type rmsJob struct {
	out, x, weight []float32
	rows, d        int
	eps            float32
}

var theRMSJob rmsJob

func (j *rmsJob) run(p, np int) {
	r0, r1 := split(j.rows, np, p, 1)
	j.rows0(r0, r1)
}

func (j *rmsJob) rows0(r0, r1 int) {
	d := j.d
	for r := r0; r < r1; r++ {
		xr := j.x[r*d : (r+1)*d]
		// The sum of squares is float32 (SIMD partial sums are accurate
		// enough for d up to a few thousand); the divide and sqrt are
		// float64.
		ms := float64(sumSqImpl(xr)) / float64(d)
		s := float32(1 / math.Sqrt(ms+float64(j.eps)))
		scaleMulImpl(j.out[r*d:(r+1)*d], xr, j.weight, s)
	}
}

// rowParts picks a thread count for a row-wise kernel over rows×d floats:
// below ~64k elements the hand-off costs more than it saves.
func rowParts(rows, d int) int {
	if rows*d < 1<<16 {
		return 1
	}
	return min(Threads(), rows)
}

// SiLUMul computes out[i] = silu(gate[i])·up[i] = gate/(1+e^-gate)·up over
// len(out). out may alias gate or up.
func SiLUMul(out, gate, up []float32) {
	gate, up = gate[:len(out)], up[:len(out)]
	if len(out) < 1<<15 || Threads() <= 1 {
		siluMulImpl(out, gate, up)
		return
	}
	poolMu.Lock()
	theSiLUJob = siluJob{out, gate, up}
	runParts(&theSiLUJob, Threads())
	theSiLUJob = siluJob{}
	poolMu.Unlock()
}

// siluJob is one SiLUMul call over equal-length out, gate, up; theSiLUJob
// is guarded by poolMu.
type siluJob struct{ out, gate, up []float32 }

var theSiLUJob siluJob

func (j *siluJob) run(p, np int) {
	lo, hi := split(len(j.out), np, p, 16)
	siluMulImpl(j.out[lo:hi], j.gate[lo:hi], j.up[lo:hi])
}

var siluMulImpl = siluMulGo

func siluMulGo(out, gate, up []float32) {
	gate, up = gate[:len(out)], up[:len(out)]
	for i, g := range gate {
		out[i] = g / (1 + float32(math.Exp(float64(-g)))) * up[i]
	}
}

// Add computes dst[i] += src[i] over len(dst).
func Add(dst, src []float32) {
	src = src[:len(dst)]
	addImpl(dst, src)
}

var addImpl = addGo

func addGo(dst, src []float32) {
	src = src[:len(dst)]
	for i, v := range src {
		dst[i] += v
	}
}

// Softmax replaces x by softmax(x), subtracting the max first for stability.
// Entries of -Inf become 0. At least one entry must be finite (attention
// always has the current token's own score); otherwise the result is NaN.
func Softmax(x []float32) {
	if len(x) == 0 {
		return
	}
	mx := x[0]
	for _, v := range x[1:] {
		if v > mx {
			mx = v
		}
	}
	var sum float64
	for i, v := range x {
		e := float32(math.Exp(float64(v - mx)))
		x[i] = e
		sum += float64(e)
	}
	inv := float32(1 / sum)
	for i := range x {
		x[i] *= inv
	}
}

// RoPE rotates, in place, the nHeads heads of each of rows rows of
// x[rows, nHeads*headDim] by the position positions[r], using the Hugging
// Face Llama rotate_half convention: for i < headDim/2 the pair
// (x[i], x[i+headDim/2]) is rotated by angle pos·theta^(-2i/headDim).
// headDim must be even.
func RoPE(x []float32, positions []int32, rows, nHeads, headDim int, theta float64) {
	if headDim%2 != 0 || len(positions) < rows || len(x) < rows*nHeads*headDim {
		panic(fmt.Sprintf("cpu.RoPE: bad shapes rows=%d nHeads=%d headDim=%d len(x)=%d len(positions)=%d",
			rows, nHeads, headDim, len(x), len(positions)))
	}
	if rows == 0 {
		return
	}
	maxPos := int32(0)
	for _, p := range positions[:rows] {
		if p < 0 {
			panic("cpu.RoPE: negative position")
		}
		maxPos = max(maxPos, p)
	}
	j := ropeJob{x, positions, ropeTable(headDim, theta, int(maxPos)+1), rows, nHeads, headDim}
	parts := rowParts(rows, nHeads*headDim)
	if parts <= 1 {
		j.rows0(0, rows)
		return
	}
	poolMu.Lock()
	theRoPEJob = j
	runParts(&theRoPEJob, parts)
	theRoPEJob = ropeJob{}
	poolMu.Unlock()
}

// ropeJob is one RoPE call: x [rows, nHeads*headDim], positions [rows];
// theRoPEJob is guarded by poolMu.
type ropeJob struct {
	x                     []float32
	positions             []int32
	tab                   *ropeTab
	rows, nHeads, headDim int
}

var theRoPEJob ropeJob

func (j *ropeJob) run(p, np int) {
	r0, r1 := split(j.rows, np, p, 1)
	j.rows0(r0, r1)
}

func (j *ropeJob) rows0(r0, r1 int) {
	hd := j.headDim
	half := hd / 2
	stride := j.nHeads * hd
	for r := r0; r < r1; r++ {
		pos := int(j.positions[r])
		cos := j.tab.cos[pos*half : (pos+1)*half]
		sin := j.tab.sin[pos*half : (pos+1)*half]
		for h := 0; h < j.nHeads; h++ {
			v := j.x[r*stride+h*hd : r*stride+(h+1)*hd]
			ropeImpl(v[:half], v[half:], cos, sin)
		}
	}
}

var ropeImpl = ropeGo

// ropeGo: (a,b) ← (a·cos − b·sin, b·cos + a·sin), elementwise over len(a).
func ropeGo(a, b, cos, sin []float32) {
	b, cos, sin = b[:len(a)], cos[:len(a)], sin[:len(a)]
	for i := range a {
		x0, x1 := a[i], b[i]
		a[i] = x0*cos[i] - x1*sin[i]
		b[i] = x1*cos[i] + x0*sin[i]
	}
}

// ropeTab holds cos/sin of pos·inv_freq[i] for pos < n, i < headDim/2, laid
// out [n, headDim/2]. Tables are immutable once published; a bigger one
// replaces a smaller one under ropeMu.
type ropeTab struct {
	n        int
	cos, sin []float32
}

type ropeKey struct {
	headDim int
	theta   float64
}

var (
	ropeMu   sync.RWMutex
	ropeTabs = map[ropeKey]*ropeTab{}
)

func ropeTable(headDim int, theta float64, need int) *ropeTab {
	key := ropeKey{headDim, theta}
	ropeMu.RLock()
	t := ropeTabs[key]
	ropeMu.RUnlock()
	if t != nil && t.n >= need {
		return t
	}
	ropeMu.Lock()
	defer ropeMu.Unlock()
	if t = ropeTabs[key]; t != nil && t.n >= need {
		return t
	}
	n := 4096
	for n < need {
		n *= 2
	}
	half := headDim / 2
	t = &ropeTab{n: n, cos: make([]float32, n*half), sin: make([]float32, n*half)}
	invFreq := make([]float64, half)
	for i := range invFreq {
		// HF computes inv_freq in float32: 1/(theta^(arange(0,d,2)/d)).
		invFreq[i] = float64(float32(1 / math.Pow(theta, float64(2*i)/float64(headDim))))
	}
	for p := 0; p < n; p++ {
		for i, f := range invFreq {
			// HF: freqs = pos(float32) * inv_freq(float32) in float32, then
			// cos/sin. Compute the angle in float32 to match it.
			ang := float64(float32(p) * float32(f))
			t.cos[p*half+i] = float32(math.Cos(ang))
			t.sin[p*half+i] = float32(math.Sin(ang))
		}
	}
	ropeTabs[key] = t
	return t
}
