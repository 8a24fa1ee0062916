package cpu

import (
	"fmt"
	"math"
	"sync"
)

// Row and elementwise kernels. The public functions check shapes and split
// work across the pool; the inner loops come from elem, the elemKernels set
// in use: plain Go, or on amd64 with AVX2+FMA the assembly set (see
// elementwise_amd64.go), unless SetGEMMPath("go") was called. elem is set
// during package init and by SetGEMMPath, and swapped otherwise only by
// tests.

// elemKernels is one implementation of the inner loops. In every function
// all slices have the length of the first one (callers reslice).
type elemKernels struct {
	name string
	dot  func(a, b []float32) float32
	axpy func(alpha float32, x, y []float32) // y += alpha·x
	// dotsAt and axpysAt are DotsAt and AxpysAt after their checks.
	dotsAt   func(q, base []float32, offs []int, out []float32)
	axpysAt  func(alpha, base []float32, offs []int, y []float32)
	sumSq    func(x []float32) float32            // Σ x²
	scaleMul func(out, x, w []float32, s float32) // out = x·s·w
	siluMul  func(out, gate, up []float32)        // out = silu(gate)·up
	add      func(dst, src []float32)             // dst += src
	rope     func(a, b, cos, sin []float32)       // rotate pairs (a[i], b[i])
	softmax  func(x []float32)                    // in place, len(x) ≥ 1
	// The sampler's kernels (sample.go): ScanMax, ExpSum, Exp,
	// CompactGreater, CompactGreaterVals.
	scanMax     func(x []float32) (float32, int, bool)
	expSum      func(dst, src []float32, scale, shift float32) float64
	exp         func(dst, src []float32, scale, shift float32)
	compactVals func(idx []int32, vals, x []float32, thr float32) int
	compact     func(idx []int32, x []float32, thr float32) (int, float64)
}

var goElem = elemKernels{
	name: "go", dot: dotGo, axpy: axpyGo, dotsAt: dotsAtGo, axpysAt: axpysAtGo, sumSq: sumSqGo, scaleMul: scaleMulGo,
	siluMul: siluMulGo, add: addGo, rope: ropeGo, softmax: softmaxGo,
	scanMax: scanMaxGo, expSum: expSumGo, exp: expGo, compact: compactGo, compactVals: compactValsGo,
}

var (
	elem     = goElem                // the set in use
	elemSets = []elemKernels{goElem} // every set usable on this CPU (tests)
)

// Dot returns Σ a[i]·b[i] over len(a) (b must be at least as long).
func Dot(a, b []float32) float32 { return elem.dot(a, b[:len(a)]) }

// Axpy computes y[i] += alpha·x[i] over len(x) (y must be at least as long).
func Axpy(alpha float32, x, y []float32) { elem.axpy(alpha, x, y[:len(x)]) }

func axpyGo(alpha float32, x, y []float32) {
	y = y[:len(x)]
	for i, v := range x {
		y[i] += alpha * v
	}
}

// DotsAt sets out[i] = Σ_j q[j]·base[offs[i]+j] (j < len(q)) for every i:
// the dot products of q with len(offs) vectors stored in base (attention's
// scores against cached keys, one call per query instead of one per key).
// len(out) must equal len(offs) and every offset must lie in
// [0, len(base)-len(q)]; otherwise it panics. Each out[i] equals
// Dot(q, base[offs[i]:]) under the assembly and plain-Go sets.
func DotsAt(q, base []float32, offs []int, out []float32) {
	if len(out) != len(offs) {
		panic(fmt.Sprintf("cpu.DotsAt: len(out)=%d, len(offs)=%d", len(out), len(offs)))
	}
	checkOffs("cpu.DotsAt", offs, len(q), len(base))
	elem.dotsAt(q, base, offs, out)
}

// AxpysAt computes y[j] += Σ_i alpha[i]·base[offs[i]+j] over j < len(y),
// adding the terms in order of i (attention's weighted sum of cached
// values). len(alpha) must equal len(offs) and every offset must lie in
// [0, len(base)-len(y)]; otherwise it panics. The result equals calling
// Axpy(alpha[i], base[offs[i]:offs[i]+len(y)], y) for i = 0, 1, … under
// the assembly and plain-Go sets.
func AxpysAt(alpha, base []float32, offs []int, y []float32) {
	if len(alpha) != len(offs) {
		panic(fmt.Sprintf("cpu.AxpysAt: len(alpha)=%d, len(offs)=%d", len(alpha), len(offs)))
	}
	checkOffs("cpu.AxpysAt", offs, len(y), len(base))
	elem.axpysAt(alpha, base, offs, y)
}

// checkOffs panics unless every offset o has base[o:o+n] in range, which
// is all the assembly relies on.
func checkOffs(fn string, offs []int, n, lenBase int) {
	last := lenBase - n // the largest valid offset
	for i, o := range offs {
		if o < 0 || o > last {
			panic(fmt.Sprintf("%s: offs[%d]=%d outside [0,%d] (vector length %d, len(base)=%d)", fn, i, o, last, n, lenBase))
		}
	}
}

func dotsAtGo(q, base []float32, offs []int, out []float32) {
	out = out[:len(offs)]
	for i, o := range offs {
		out[i] = dotGo(q, base[o:o+len(q)])
	}
}

func axpysAtGo(alpha, base []float32, offs []int, y []float32) {
	alpha = alpha[:len(offs)]
	for i, o := range offs {
		axpyGo(alpha[i], base[o:o+len(y)], y)
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
		// The sum of squares is float32 (accurate enough for d up to a
		// few thousand); the divide and sqrt are float64.
		ms := float64(elem.sumSq(xr)) / float64(d)
		s := float32(1 / math.Sqrt(ms+float64(j.eps)))
		elem.scaleMul(j.out[r*d:(r+1)*d], xr, j.weight, s)
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

// SwiGLU computes out[r, i] = silu(gu[r, i])·gu[r, f+i] for rows r and
// i < f: the SwiGLU of a fused gate/up projection gu [rows, 2f] (gate
// then up in each row) into out [rows, f], without splitting gu first.
// out must not overlap gu.
func SwiGLU(out, gu []float32, rows, f int) {
	out, gu = out[:rows*f], gu[:rows*2*f]
	if rows*f < 1<<15 || Threads() <= 1 || rows < 2 {
		swiGLURows(out, gu, 0, rows, f)
		return
	}
	poolMu.Lock()
	theSwiGLUJob = swiGLUJob{out, gu, rows, f}
	runParts(&theSwiGLUJob, min(Threads(), rows))
	theSwiGLUJob = swiGLUJob{}
	poolMu.Unlock()
}

func swiGLURows(out, gu []float32, r0, r1, f int) {
	for r := r0; r < r1; r++ {
		g := gu[r*2*f : r*2*f+2*f]
		elem.siluMul(out[r*f:(r+1)*f], g[:f], g[f:])
	}
}

// swiGLUJob is one SwiGLU call split by rows; theSwiGLUJob is guarded by
// poolMu.
type swiGLUJob struct {
	out, gu []float32
	rows, f int
}

var theSwiGLUJob swiGLUJob

func (j *swiGLUJob) run(p, np int) {
	r0, r1 := split(j.rows, np, p, 1)
	swiGLURows(j.out, j.gu, r0, r1, j.f)
}

func siluMulGo(out, gate, up []float32) {
	gate, up = gate[:len(out)], up[:len(out)]
	for i, g := range gate {
		out[i] = g / (1 + expf(-g)) * up[i]
	}
}

// Add computes dst[i] += src[i] over len(dst).
func Add(dst, src []float32) {
	elem.add(dst, src[:len(dst)])
}

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
	elem.softmax(x)
}

func softmaxGo(x []float32) {
	mx := x[0]
	for _, v := range x[1:] {
		if v > mx {
			mx = v
		}
	}
	var sum float64
	for i, v := range x {
		e := expf(v - mx)
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
	RoPEStrided(x, nHeads*headDim, positions, rows, nHeads, headDim, theta)
}

// RoPEStrided is RoPE on the first nHeads heads of each row of x [rows,
// stride] (stride ≥ nHeads·headDim): the q and k heads at the start of a
// fused q|k|v projection's rows, rotated where they are.
func RoPEStrided(x []float32, stride int, positions []int32, rows, nHeads, headDim int, theta float64) {
	if headDim%2 != 0 || stride < nHeads*headDim || len(positions) < rows || (rows > 0 && len(x) < (rows-1)*stride+nHeads*headDim) {
		panic(fmt.Sprintf("cpu.RoPE: bad shapes rows=%d stride=%d nHeads=%d headDim=%d len(x)=%d len(positions)=%d",
			rows, stride, nHeads, headDim, len(x), len(positions)))
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
	j := ropeJob{x, positions, ropeTable(headDim, theta, int(maxPos)+1), rows, stride, nHeads, headDim}
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

// ropeJob is one RoPE call: x [rows, stride], positions [rows];
// theRoPEJob is guarded by poolMu.
type ropeJob struct {
	x                             []float32
	positions                     []int32
	tab                           *ropeTab
	rows, stride, nHeads, headDim int
}

var theRoPEJob ropeJob

func (j *ropeJob) run(p, np int) {
	r0, r1 := split(j.rows, np, p, 1)
	j.rows0(r0, r1)
}

func (j *ropeJob) rows0(r0, r1 int) {
	hd := j.headDim
	half := hd / 2
	stride := j.stride
	for r := r0; r < r1; r++ {
		pos := int(j.positions[r])
		cos := j.tab.cos[pos*half : (pos+1)*half]
		sin := j.tab.sin[pos*half : (pos+1)*half]
		for h := 0; h < j.nHeads; h++ {
			v := j.x[r*stride+h*hd : r*stride+(h+1)*hd]
			elem.rope(v[:half], v[half:], cos, sin)
		}
	}
}

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

// Single-precision exp: exp(x) = 2^n·e^r with n = round(x/ln2) and
// |r| ≤ ln2/2, e^r from the Cephes expf polynomial (relative error ~1e-7).
// 2^n is applied as two factors 2^(n/2)·2^(n-n/2) so that every n in range
// has a normal-float factor. It is ~5× faster than float64 math.Exp.
const (
	expLog2e = 1.44269504088896341
	expLn2Hi = 0.693359375
	expLn2Lo = -2.12194440e-4
	expMin   = -87.33654 // below: exp underflows float32's normal range; 0
	expMax   = 88.72283  // above: +Inf
	expP0    = 1.9875691500e-4
	expP1    = 1.3981999507e-3
	expP2    = 8.3334519073e-3
	expP3    = 4.1665795894e-2
	expP4    = 1.6666665459e-1
	expP5    = 5.0000001201e-1
)

func expf(x float32) float32 {
	switch {
	case x != x: // NaN
		return x
	case x < expMin:
		return 0
	case x > expMax:
		return float32(math.Inf(1))
	}
	t := x * expLog2e
	if t >= 0 {
		t += 0.5
	} else {
		t -= 0.5
	}
	ni := int32(t) // round half away from zero
	n := float32(ni)
	r := x - n*expLn2Hi - n*expLn2Lo
	p := ((((expP0*r+expP1)*r+expP2)*r+expP3)*r+expP4)*r + expP5
	e := p*r*r + r + 1
	n1 := ni >> 1
	n2 := ni - n1
	return e * math.Float32frombits(uint32(n1+127)<<23) * math.Float32frombits(uint32(n2+127)<<23)
}
