//go:build amd64

package cpu

//go:generate sh -c "python3 bf16_amd64_gen.py > bf16_amd64.s"

import (
	"unsafe"

	xcpu "golang.org/x/sys/cpu"
)

// bf16 GEMM on hand-written amd64 assembly (bf16_amd64.s), the only
// vectorised bf16 kernel: batch-1 decode is a chain of GEMVs whose speed
// is the speed at which the weights stream through one core. The kernels
// need AVX2 and FMA (checked at run time with x/sys/cpu; OS support for
// the YMM/ZMM state included); where the CPU also has AVX-512F the 16-lane
// variants run instead.
//
// Each kernel computes a tile of R x rows × 4 weight rows over the first
// k32 = k &^ 31 weights of each row, for `tiles` consecutive tiles of 4
// weight rows, writing (or adding into) y. x must be in permuteX's layout
// (the kernels split 32 bf16 into even and odd float32 lanes with one
// shift and one AND; permuteX deinterleaves x to match once per call).
// bf16AsmRect does the rest in Go: the k tail (k - k32 < 32 weights) and
// the last (n mod 4) weight rows, both scalar and absent at the shipped
// model's shapes (k = 384 or 1024; n = 1152, 2048, 384, 6294 → 2 rows).
//
// Invariants of every kernel call (checked in bf16AsmRect before the
// pointers are taken): x rows 0..R-1 are readable for k32 floats from x,
// ldx bytes apart; weight rows 0..4·tiles-1 for k32 bf16 from w, ldw bytes
// apart; y rows 0..R-1 for 4·tiles floats, ldy bytes apart.

var (
	asmAVX2   = xcpu.X86.HasAVX2 && xcpu.X86.HasFMA
	asmAVX512 = asmAVX2 && xcpu.X86.HasAVX512F

	// asmWide selects the AVX-512 kernels. Set at init; tests and
	// benchmarks flip it (setAsmVariant) to cover both on an AVX-512
	// machine.
	asmWide = asmAVX512
)

//go:noescape
func bf16x1x4AVX2(x *float32, ldx int, w *uint16, ldw int, k32 int, y *float32, ldy int, tiles int, acc int)

//go:noescape
func bf16x2x4AVX2(x *float32, ldx int, w *uint16, ldw int, k32 int, y *float32, ldy int, tiles int, acc int)

//go:noescape
func bf16x1x4AVX512(x *float32, ldx int, w *uint16, ldw int, k32 int, y *float32, ldy int, tiles int, acc int)

//go:noescape
func bf16x2x4AVX512(x *float32, ldx int, w *uint16, ldw int, k32 int, y *float32, ldy int, tiles int, acc int)

//go:noescape
func bf16x4x4AVX512(x *float32, ldx int, w *uint16, ldw int, k32 int, y *float32, ldy int, tiles int, acc int)

func bf16AsmAvailable() bool { return asmAVX2 }

// asmName names the assembly variant the bf16 and int8 kernels run
// ("avx512" or "avx2"), or "" without AVX2+FMA.
func asmName() string {
	switch {
	case asmWide:
		return "avx512"
	case asmAVX2:
		return "avx2"
	}
	return ""
}

// asmVariants lists the assembly kernel variants usable here (tests).
func asmVariants() []string {
	switch {
	case asmAVX512:
		return []string{"avx2", "avx512"}
	case asmAVX2:
		return []string{"avx2"}
	}
	return nil
}

// setAsmVariant selects a variant and returns a func restoring the old one.
func setAsmVariant(v string) (restore func()) {
	old := asmWide
	asmWide = v == "avx512" && asmAVX512
	return func() { asmWide = old }
}

func bf16AsmImpl() bf16Impl { return bf16Impl{bf16AsmRect, true} }

// bf16AsmBlockBytes bounds the weight bytes one row block holds when more
// x rows than one tile covers sweep it (M > 4 on AVX-512, M > 2 on AVX2):
// the block is swept once per tile of x rows, so it should stay in L2.
const bf16AsmBlockBytes = 64 << 10

// bf16AsmRect is a bf16Kernel: y[i0:i1, j0:j1] (row stride n) = x·wᵀ (+ y
// if acc) over all of k, x in permuteX's layout [m, roundUp(k,32)].
func bf16AsmRect(i0, i1, j0, j1, n, k int, x []float32, w []uint16, y []float32, acc bool) {
	if i0 >= i1 || j0 >= j1 {
		return
	}
	kp := (k + 31) &^ 31
	k32 := k &^ 31
	// Bounds for the assembly's unchecked reads and writes (see the
	// invariants above): every x row < i1, weight row < j1, y element of
	// the rectangle.
	_ = x[i1*kp-1]
	_ = w[j1*k-1]
	_ = y[(i1-1)*n+j1-1]
	a := 0
	if acc {
		a = 1
	}
	wide := asmWide
	jt := j0 + (j1-j0)&^3 // rows [j0,jt) go to the kernels, whole tiles
	if jt > j0 {
		jb := jt - j0
		if rows := i1 - i0; (wide && rows > 4) || (!wide && rows > 2) {
			jb = max(4, (bf16AsmBlockBytes/(2*k))&^3)
		}
		for b0 := j0; b0 < jt; b0 += jb {
			b1 := min(jt, b0+jb)
			tiles := (b1 - b0) / 4
			wp := &w[b0*k]
			i := i0
			if wide {
				for ; i+4 <= i1; i += 4 {
					bf16x4x4AVX512(&x[i*kp], 4*kp, wp, 2*k, k32, &y[i*n+b0], 4*n, tiles, a)
				}
				for ; i+2 <= i1; i += 2 {
					bf16x2x4AVX512(&x[i*kp], 4*kp, wp, 2*k, k32, &y[i*n+b0], 4*n, tiles, a)
				}
				if i < i1 {
					bf16x1x4AVX512(&x[i*kp], 4*kp, wp, 2*k, k32, &y[i*n+b0], 4*n, tiles, a)
				}
			} else {
				for ; i+2 <= i1; i += 2 {
					bf16x2x4AVX2(&x[i*kp], 4*kp, wp, 2*k, k32, &y[i*n+b0], 4*n, tiles, a)
				}
				if i < i1 {
					bf16x1x4AVX2(&x[i*kp], 4*kp, wp, 2*k, k32, &y[i*n+b0], 4*n, tiles, a)
				}
			}
		}
		if k32 < k { // the last k-k32 < 32 weights of each kernel row
			for i := i0; i < i1; i++ {
				xr := x[i*kp : i*kp+kp]
				for j := j0; j < jt; j++ {
					y[i*n+j] += permDot(xr, w[j*k:j*k+k], k32)
				}
			}
		}
	}
	for j := jt; j < j1; j++ { // the last (j1-j0) mod 4 rows
		for i := i0; i < i1; i++ {
			s := permDot(x[i*kp:i*kp+kp], w[j*k:j*k+k], 0)
			if acc {
				s += y[i*n+j]
			}
			y[i*n+j] = s
		}
	}
}

// permDot returns Σ_{p0 ≤ p < len(wr)} x[p]·wr[p] where xr is x in
// permuteX's layout (x[p] sits at (p &^ 31) + (p&1)·16 + (p&31)>>1).
func permDot(xr []float32, wr []uint16, p0 int) float32 {
	var s float32
	for p := p0; p < len(wr); p++ {
		s += xr[p&^31+(p&1)*16+(p&31)>>1] * BF16ToFloat32(wr[p])
	}
	return s
}

// permuteAVX2 does permuteX's deinterleave for chunks whole 32-float
// chunks of one row (elementwise_amd64.s); permuteX calls it where
// permuteAsm is set and does the k tail in Go.
//
//go:noescape
func permuteAVX2(dst, src *float32, chunks int)

// permuteAsm: permuteX may use permuteAVX2 (AVX2 present). The permuting
// kernels exist only with AVX2, so the scalar loop remains for tests and
// other CPUs.
var permuteAsm = asmAVX2

// VDPBF16PS kernels (bf16_amd64.s, generated by bf16_amd64_gen.py): the
// bf16 kernels' tiles and frame with x as bf16 bits in natural order
// (roundX's layout, rows zero-padded to a multiple of 32), ldx in bytes.
// The invariants of bf16_amd64.go hold otherwise.

//go:noescape
func dpbf16x1x4AVX512(x *uint16, ldx int, w *uint16, ldw int, k32 int, y *float32, ldy int, tiles int, acc int)

//go:noescape
func dpbf16x2x4AVX512(x *uint16, ldx int, w *uint16, ldw int, k32 int, y *float32, ldy int, tiles int, acc int)

//go:noescape
func dpbf16x4x4AVX512(x *uint16, ldx int, w *uint16, ldw int, k32 int, y *float32, ldy int, tiles int, acc int)

// roundBF16AVX512 writes the bf16 of src[0:32·n32) to dst (VCVTNEPS2BF16:
// round to nearest even, subnormals to zero, NaN stays NaN).
//
//go:noescape
func roundBF16AVX512(dst *uint16, src *float32, n32 int)

var (
	// asmBF16Dot: the CPU runs VDPBF16PS and VCVTNEPS2BF16 (AVX-512F and
	// AVX512_BF16, OS support for the ZMM state included).
	asmBF16Dot = asmAVX512 && xcpu.X86.HasAVX512BF16

	// useBF16Dot selects the VDPBF16PS kernels for GemmBF16Dot and
	// roundBF16Asm the assembly rounding in roundX; tests clear both
	// (setBF16DotAsm) to cover the fallback.
	useBF16Dot   = asmBF16Dot
	roundBF16Asm = asmBF16Dot
)

// setBF16DotAsm turns the VDPBF16PS path on (where the CPU has it) or off
// and returns a func restoring the old setting (tests).
func setBF16DotAsm(on bool) (restore func()) {
	od, or := useBF16Dot, roundBF16Asm
	useBF16Dot, roundBF16Asm = on && asmBF16Dot, on && asmBF16Dot
	return func() { useBF16Dot, roundBF16Asm = od, or }
}

// bf16DotRect is a bf16Kernel over the VDPBF16PS tiles: y[i0:i1, j0:j1]
// (row stride n) = x·wᵀ (+ y if acc) where xf is really bf16 bits [m, kp]
// (kp = roundUp(k,32), roundX's layout) viewed as float32. The k tail
// (k mod 32) and the last (j1-j0) mod 4 rows run in Go, as in bf16AsmRect.
func bf16DotRect(i0, i1, j0, j1, n, k int, xf []float32, w []uint16, y []float32, acc bool) {
	if i0 >= i1 || j0 >= j1 {
		return
	}
	x := unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(xf))), 2*len(xf))
	kp := (k + 31) &^ 31
	k32 := k &^ 31
	// Bounds for the assembly's unchecked reads and writes.
	_ = x[i1*kp-1]
	_ = w[j1*k-1]
	_ = y[(i1-1)*n+j1-1]
	a := 0
	if acc {
		a = 1
	}
	jt := j0 + (j1-j0)&^3 // rows [j0,jt) go to the kernels, whole tiles
	if jt > j0 {
		jb := jt - j0
		if i1-i0 > 4 { // several x tiles sweep each block: keep it in L2
			jb = max(4, (bf16AsmBlockBytes/(2*k))&^3)
		}
		for b0 := j0; b0 < jt; b0 += jb {
			b1 := min(jt, b0+jb)
			tiles := (b1 - b0) / 4
			wp := &w[b0*k]
			i := i0
			for ; i+4 <= i1; i += 4 {
				dpbf16x4x4AVX512(&x[i*kp], 2*kp, wp, 2*k, k32, &y[i*n+b0], 4*n, tiles, a)
			}
			for ; i+2 <= i1; i += 2 {
				dpbf16x2x4AVX512(&x[i*kp], 2*kp, wp, 2*k, k32, &y[i*n+b0], 4*n, tiles, a)
			}
			if i < i1 {
				dpbf16x1x4AVX512(&x[i*kp], 2*kp, wp, 2*k, k32, &y[i*n+b0], 4*n, tiles, a)
			}
		}
		if k32 < k { // the last k-k32 < 32 weights of each kernel row
			for i := i0; i < i1; i++ {
				xr := x[i*kp+k32 : i*kp+k]
				for j := j0; j < jt; j++ {
					y[i*n+j] += dotBF16(xr, w[j*k+k32:j*k+k])
				}
			}
		}
	}
	for j := jt; j < j1; j++ { // the last (j1-j0) mod 4 rows
		for i := i0; i < i1; i++ {
			s := dotBF16(x[i*kp:i*kp+k], w[j*k:j*k+k])
			if acc {
				s += y[i*n+j]
			}
			y[i*n+j] = s
		}
	}
}
