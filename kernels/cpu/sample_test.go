package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

var (
	negInf = float32(math.Inf(-1))
	posInf = float32(math.Inf(1))
	nan32  = float32(math.NaN())
)

// sampleRows are the inputs of the sampler-kernel tests: for every length
// 0..70 and 6294 (the vocabulary), rows of each kind below. Lengths up to
// 70 put the special entries in the assembly body, its 16- and 8-float
// blocks and the Go tail.
func sampleRows() []struct {
	name string
	x    []float32
} {
	var rows []struct {
		name string
		x    []float32
	}
	add := func(name string, x []float32) {
		rows = append(rows, struct {
			name string
			x    []float32
		}{fmt.Sprintf("%s/n=%d", name, len(x)), x})
	}
	r := rand.New(rand.NewPCG(7, 8))
	lengths := []int{6294}
	for n := 0; n <= 70; n++ {
		lengths = append(lengths, n)
	}
	for _, n := range lengths {
		base := randSlice(r, n)
		for i := range base {
			base[i] *= 6
		}
		add("normal", base)
		if n == 0 {
			continue
		}
		mod := func(f func(x []float32)) []float32 {
			x := slices.Clone(base)
			f(x)
			return x
		}
		pos := func() int { return r.IntN(n) }
		add("neginf", mod(func(x []float32) {
			for i := range x {
				if r.IntN(3) == 0 {
					x[i] = negInf
				}
			}
		}))
		add("allneginf", mod(func(x []float32) {
			for i := range x {
				x[i] = negInf
			}
		}))
		add("nan", mod(func(x []float32) { x[pos()] = nan32 }))
		add("nanfirst", mod(func(x []float32) { x[0] = nan32 }))
		add("nanlast", mod(func(x []float32) { x[n-1] = nan32 }))
		add("allnan", mod(func(x []float32) {
			for i := range x {
				x[i] = nan32
			}
		}))
		add("nan+neginf", mod(func(x []float32) {
			for i := range x {
				x[i] = []float32{nan32, negInf}[i%2]
			}
		}))
		add("huge", mod(func(x []float32) { x[pos()], x[pos()] = 1e30, -1e30 }))
		add("posinf", mod(func(x []float32) { x[pos()] = posInf }))
		add("ties", mod(func(x []float32) { x[pos()], x[pos()], x[n-1] = 50, 50, 50 }))
		add("tailmax", mod(func(x []float32) { x[n-1] = 60 }))
		add("zeros", mod(func(x []float32) {
			for i := range x {
				if r.IntN(2) == 0 {
					x[i] = float32(math.Copysign(0, -1))
				} else {
					x[i] = 0
				}
			}
		}))
		add("steep", mod(func(x []float32) { // exp arguments down to ~-1000
			for i := range x {
				x[i] *= 30
			}
		}))
	}
	return rows
}

func sameBits(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) }

// Every implementation of ScanMax returns exactly what the plain-Go
// reference does, the sign of a zero max included.
func TestScanMax(t *testing.T) {
	forEachElem(t, func(t *testing.T) {
		for _, row := range sampleRows() {
			m, im, nan := ScanMax(row.x)
			wm, wim, wnan := scanMaxGo(row.x)
			if !sameBits(m, wm) || im != wim || nan != wnan {
				t.Fatalf("%s: ScanMax = (%v, %d, %v), want (%v, %d, %v)", row.name, m, im, nan, wm, wim, wnan)
			}
		}
	})
}

// ExpSum against float64 math.Exp entry by entry (relative 3e-7, as
// expf's own test), its sum against the float64 sum of the reference
// entries, and the exact cases: the max entry with shift = fl(max·scale)
// is 1, -Inf (and anything below expMin) 0, NaN NaN; in place as well.
func TestExpSum(t *testing.T) {
	forEachElem(t, func(t *testing.T) {
		for _, row := range sampleRows() {
			for _, scale := range []float32{1, 1 / 0.8, 1 / 1.3} {
				m, im, hasNaN := scanMaxGo(row.x)
				shift := m * scale
				if m == negInf {
					shift = 0
				}
				dst := make([]float32, len(row.x)+1)
				dst[len(row.x)] = 12345
				sum := ExpSum(dst, row.x, scale, shift)
				if dst[len(row.x)] != 12345 {
					t.Fatalf("%s: ExpSum wrote past len(src)", row.name)
				}
				var want float64
				for i, v := range row.x {
					arg := float32(v*scale) - shift
					w := math.Exp(float64(arg))
					if arg < expMin {
						w = 0
					}
					want += float64(dst[i])
					switch got := float64(dst[i]); {
					case v != v:
						if got == got {
							t.Fatalf("%s scale %v: exp(NaN) = %v", row.name, scale, got)
						}
					case w == 0 || math.IsInf(w, 1):
						if got != w && !(w > math.MaxFloat32 && math.IsInf(got, 1)) {
							t.Fatalf("%s scale %v: [%d] exp(%v) = %v, want %v", row.name, scale, i, arg, got, w)
						}
					case arg < expFlush && got == 0: // the assembly's range
					case math.Abs(got-w) > 3e-7*w:
						t.Fatalf("%s scale %v: [%d] exp(%v) = %v, want %v", row.name, scale, i, arg, got, w)
					}
				}
				if m > negInf && m < posInf && dst[im] != 1 {
					t.Fatalf("%s scale %v: max entry gives %v, want exactly 1", row.name, scale, dst[im])
				}
				switch {
				case hasNaN:
					if sum == sum {
						t.Fatalf("%s: sum %v with a NaN entry", row.name, sum)
					}
				case math.IsInf(want, 0) || want != want:
					if sum != want && !(sum != sum && want != want) {
						t.Fatalf("%s: sum %v, want %v", row.name, sum, want)
					}
				case math.Abs(sum-want) > 6e-8*want: // pairs are added in float32
					t.Fatalf("%s scale %v: sum %v, want %v", row.name, scale, sum, want)
				}
				// Exp gives the same entries.
				ex := make([]float32, len(row.x))
				Exp(ex, row.x, scale, shift)
				for i := range ex {
					if !sameBits(ex[i], dst[i]) && !(ex[i] != ex[i] && dst[i] != dst[i]) {
						t.Fatalf("%s: Exp [%d] = %v, ExpSum's %v", row.name, i, ex[i], dst[i])
					}
				}
				// In place gives the same entries and sum.
				in := slices.Clone(row.x)
				if s2 := ExpSum(in, in, scale, shift); !sameBits(float32(s2), float32(sum)) && !(s2 != s2 && sum != sum) {
					t.Fatalf("%s: in place sum %v, want %v", row.name, s2, sum)
				}
				for i := range in {
					if !sameBits(in[i], dst[i]) && !(in[i] != in[i] && dst[i] != dst[i]) {
						t.Fatalf("%s: in place [%d] = %v, want %v", row.name, i, in[i], dst[i])
					}
				}
			}
		}
	})
}

// expFlush: the assembly exp gives 0 below about −86.99 (e^x < 2.4e-38),
// expf only below expMin.
const expFlush = -86.98

// TestExpRange: ExpSum (scale 1, shift 0) is e^x over expf's whole range,
// 0 below it (from expFlush in the assembly) and +Inf above.
func TestExpRange(t *testing.T) {
	forEachElem(t, func(t *testing.T) {
		var x []float32
		for v := -100.0; v < 100; v += 0.0137 {
			x = append(x, float32(v))
		}
		x = append(x, expMin, expMax, 0, -0.34657359, 0.34657359, negInf, posInf)
		dst := make([]float32, len(x))
		ExpSum(dst, x, 1, 0)
		for i, v := range x {
			w := math.Exp(float64(v))
			got := float64(dst[i])
			switch {
			case v < expMin:
				if got != 0 {
					t.Fatalf("exp(%v) = %v, want 0", v, got)
				}
			case v < expFlush && got == 0:
			case v > expMax:
				if !math.IsInf(got, 1) {
					t.Fatalf("exp(%v) = %v, want +Inf", v, got)
				}
			case math.Abs(got-w) > 3e-7*w:
				t.Fatalf("exp(%v) = %v, want %v", v, got, w)
			}
		}
	})
}

// CompactGreater keeps exactly the reference's indices; the sum agrees
// to float64 rounding.
func TestCompactGreater(t *testing.T) {
	forEachElem(t, func(t *testing.T) {
		for _, row := range sampleRows() {
			// Unnormalised probabilities as the sampler has them, and the
			// raw row (negative, -Inf and NaN entries).
			probs := make([]float32, len(row.x))
			m, _, _ := scanMaxGo(row.x)
			expSumGo(probs, row.x, 1, m)
			for _, x := range [][]float32{probs, row.x} {
				for _, thr := range []float32{0, 1e-11, 0.3, -2, negInf} {
					idx := make([]int32, len(x)+8)
					for i := range idx {
						idx[i] = -7
					}
					n, sum := CompactGreater(idx[:len(x)], x, thr)
					var want []int32
					var wsum, abs float64
					for i, v := range x {
						if v > thr {
							want = append(want, int32(i))
							wsum += float64(v)
							abs += math.Abs(float64(v))
						}
					}
					if !slices.Equal(idx[:n], want) {
						t.Fatalf("%s thr %v: kept %d indices, want %d; first difference at %d", row.name, thr, n, len(want),
							firstDiff(idx[:n], want))
					}
					for _, v := range idx[len(x):] {
						if v != -7 {
							t.Fatalf("%s: CompactGreater wrote past len(x)", row.name)
						}
					}
					vals := make([]float32, len(x)+8)
					idx2 := make([]int32, len(x)+8)
					for i := range vals {
						vals[i], idx2[i] = -5, -7
					}
					n2 := CompactGreaterVals(idx2[:len(x)], vals[:len(x)], x, thr)
					if !slices.Equal(idx2[:n2], want) {
						t.Fatalf("%s thr %v: CompactGreaterVals kept %d indices, want %d; first difference at %d", row.name, thr, n2, len(want),
							firstDiff(idx2[:n2], want))
					}
					for j, i := range want {
						if !sameBits(vals[j], x[i]) {
							t.Fatalf("%s thr %v: vals[%d] = %v, want x[%d] = %v", row.name, thr, j, vals[j], i, x[i])
						}
					}
					for i := len(x); i < len(vals); i++ {
						if vals[i] != -5 || idx2[i] != -7 {
							t.Fatalf("%s: CompactGreaterVals wrote past len(x)", row.name)
						}
					}
					if !(math.Abs(sum-wsum) <= 6e-8*abs) && !(sum == wsum) { // pairs in float32
						t.Fatalf("%s thr %v: sum %v, want %v", row.name, thr, sum, wsum)
					}
				}
			}
		}
	})
}

// Softmax of every implementation agrees with softmaxGo to float rounding,
// and both give all NaN where the row has a NaN or no finite max.
func TestSoftmaxMatchesGo(t *testing.T) {
	forEachElem(t, func(t *testing.T) {
		for _, row := range sampleRows() {
			if len(row.x) == 0 {
				continue
			}
			got := slices.Clone(row.x)
			want := slices.Clone(row.x)
			Softmax(got)
			softmaxGo(want)
			for i := range got {
				g, w := float64(got[i]), float64(want[i])
				if w != w {
					if g == g {
						t.Fatalf("%s: [%d] = %v, want NaN", row.name, i, g)
					}
					continue
				}
				if math.Abs(g-w) > 1e-6*w+1e-30 {
					t.Fatalf("%s: [%d] = %v, want %v", row.name, i, g, w)
				}
			}
		}
	})
}

func firstDiff(a, b []int32) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// BenchmarkSampleKernels runs Softmax and the sampler's kernels of every
// implementation set usable here on one row of the vocabulary's size
// (Zipf-like logits as engine's BenchmarkSampleRows): go vs asm in one
// run.
func BenchmarkSampleKernels(b *testing.B) {
	const V = 6294
	r := rand.New(rand.NewPCG(3, 4))
	row := make([]float32, V)
	for rank, tok := range r.Perm(V) {
		row[tok] = float32(8 - 2.5*math.Log(1+float64(rank)) + 0.1*r.NormFloat64())
	}
	m, _, _ := scanMaxGo(row)
	probs := make([]float32, V)
	expSumGo(probs, row, 1/0.8, m/0.8)
	idx := make([]int32, V)
	x := make([]float32, V)
	for _, set := range elemSets {
		b.Run("softmax/"+set.name, func(b *testing.B) {
			for b.Loop() {
				copy(x, row)
				set.softmax(x)
			}
		})
		b.Run("scanMax/"+set.name, func(b *testing.B) {
			for b.Loop() {
				set.scanMax(row)
			}
		})
		b.Run("expSum/"+set.name, func(b *testing.B) {
			for b.Loop() {
				set.expSum(x, row, 1/0.8, m/0.8)
			}
		})
		b.Run("exp/"+set.name, func(b *testing.B) {
			for b.Loop() {
				set.exp(x, row, 1/0.8, m/0.8)
			}
		})
		b.Run("compact/"+set.name, func(b *testing.B) {
			for b.Loop() {
				set.compact(idx, probs, 3.8e-11)
			}
		})
		b.Run("compactVals/"+set.name, func(b *testing.B) { // sampler's candidates, in the logit domain
			for b.Loop() {
				set.compactVals(idx, x, row, m-24*0.8)
			}
		})
		b.Run("compact-sparse/"+set.name, func(b *testing.B) { // presort's first level
			for b.Loop() {
				set.compact(idx, probs, 1.0/64)
			}
		})
	}
}

// SumAt adds x over idx in four interleaved float64 partial sums; the
// reference spells that order out, so the results must be bit-identical.
func TestSumAt(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	x := make([]float32, 300)
	for i := range x {
		x[i] = rng.Float32() * float32(1+i%7)
	}
	for _, n := range []int{0, 1, 3, 4, 5, 8, 9, 63, 64, 65, 300} {
		idx := make([]int32, n)
		for i := range idx {
			idx[i] = int32(rng.IntN(len(x)))
		}
		var s [4]float64
		for i, j := range idx {
			r := i % 4
			if i >= n&^3 {
				r = 0
			}
			s[r] += float64(x[j])
		}
		want := (s[0] + s[1]) + (s[2] + s[3])
		if got := SumAt(x, idx); got != want {
			t.Errorf("n=%d: SumAt = %v, want %v", n, got, want)
		}
	}
}
