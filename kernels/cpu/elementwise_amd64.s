#include "textflag.h"

// AVX2/FMA inner loops of Dot, Axpy, DotsAt and AxpysAt for every amd64
// build (see elementwise_amd64.go). n is a multiple of 8; the caller does
// the rest.

// DOT_BODY leaves in X0 the dot product of the CX bytes at SI and DI
// (CX a multiple of 32, DX = CX rounded down to 128), four accumulators
// over 32-float blocks, then 8-float steps, then one reduction: the order
// of operations Dot's contract fixes. Clobbers AX and Y0-Y7.
#define DOT_BODY \
	VXORPS Y0, Y0, Y0 \
	VXORPS Y1, Y1, Y1 \
	VXORPS Y2, Y2, Y2 \
	VXORPS Y3, Y3, Y3 \
	XORQ AX, AX \
	CMPQ AX, DX \
	JGE dot_tail \
dot_loop32: \
	VMOVUPS (SI)(AX*1), Y4 \
	VMOVUPS 32(SI)(AX*1), Y5 \
	VMOVUPS 64(SI)(AX*1), Y6 \
	VMOVUPS 96(SI)(AX*1), Y7 \
	VFMADD231PS (DI)(AX*1), Y4, Y0 \
	VFMADD231PS 32(DI)(AX*1), Y5, Y1 \
	VFMADD231PS 64(DI)(AX*1), Y6, Y2 \
	VFMADD231PS 96(DI)(AX*1), Y7, Y3 \
	ADDQ $128, AX \
	CMPQ AX, DX \
	JLT dot_loop32 \
dot_tail: \
	CMPQ AX, CX \
	JGE dot_reduce \
	VMOVUPS (SI)(AX*1), Y4 \
	VFMADD231PS (DI)(AX*1), Y4, Y0 \
	ADDQ $32, AX \
	JMP dot_tail \
dot_reduce: \
	VADDPS Y1, Y0, Y0 \
	VADDPS Y3, Y2, Y2 \
	VADDPS Y2, Y0, Y0 \
	VEXTRACTF128 $1, Y0, X1 \
	VADDPS X1, X0, X0 \
	VHADDPS X0, X0, X0 \
	VHADDPS X0, X0, X0

// func dotAVX2(a, b *float32, n int) float32
TEXT ·dotAVX2(SB), NOSPLIT, $0-28
	MOVQ a+0(FP), SI
	MOVQ b+8(FP), DI
	MOVQ n+16(FP), CX
	SHLQ $2, CX // bytes
	MOVQ CX, DX
	ANDQ $-128, DX // bytes in whole 32-float blocks
	DOT_BODY
	VZEROUPPER
	MOVSS X0, ret+24(FP)
	RET

// func axpyAVX2(alpha float32, x, y *float32, n int)
TEXT ·axpyAVX2(SB), NOSPLIT, $0-32
	VBROADCASTSS alpha+0(FP), Y0
	MOVQ x+8(FP), SI
	MOVQ y+16(FP), DI
	MOVQ n+24(FP), CX
	SHLQ $2, CX
	XORQ AX, AX
	MOVQ CX, DX
	ANDQ $-64, DX // bytes in whole 16-float blocks
	CMPQ AX, DX
	JGE tail
loop16:
	VMOVUPS (DI)(AX*1), Y1
	VMOVUPS 32(DI)(AX*1), Y2
	VFMADD231PS (SI)(AX*1), Y0, Y1
	VFMADD231PS 32(SI)(AX*1), Y0, Y2
	VMOVUPS Y1, (DI)(AX*1)
	VMOVUPS Y2, 32(DI)(AX*1)
	ADDQ $64, AX
	CMPQ AX, DX
	JLT loop16
tail:
	CMPQ AX, CX
	JGE done
	VMOVUPS (DI)(AX*1), Y1
	VFMADD231PS (SI)(AX*1), Y0, Y1
	VMOVUPS Y1, (DI)(AX*1)
	ADDQ $32, AX
	JMP tail
done:
	VZEROUPPER
	RET

// func dotsAVX2(q, base *float32, offs *int, out *float32, n, cnt int)
// out[i] = dotAVX2(q, base+offs[i], n) for i < cnt, in the same order of
// operations. A head of 64 floats (the shipped model's) keeps q in
// Y8-Y15.
TEXT ·dotsAVX2(SB), NOSPLIT, $0-48
	MOVQ q+0(FP), SI
	MOVQ base+8(FP), R8
	MOVQ offs+16(FP), R9
	MOVQ out+24(FP), R10
	MOVQ n+32(FP), CX
	MOVQ cnt+40(FP), R11
	SHLQ $2, CX // bytes
	MOVQ CX, DX
	ANDQ $-128, DX // bytes in whole 32-float blocks
	CMPQ CX, $256
	JEQ d64
dnext:
	MOVQ (R9), DI
	LEAQ (R8)(DI*4), DI
	DOT_BODY
	VMOVSS X0, (R10)
	ADDQ $8, R9
	ADDQ $4, R10
	DECQ R11
	JNZ dnext
	VZEROUPPER
	RET
d64:
	VMOVUPS (SI), Y8
	VMOVUPS 32(SI), Y9
	VMOVUPS 64(SI), Y10
	VMOVUPS 96(SI), Y11
	VMOVUPS 128(SI), Y12
	VMOVUPS 160(SI), Y13
	VMOVUPS 192(SI), Y14
	VMOVUPS 224(SI), Y15
d64next:
	MOVQ (R9), DI
	LEAQ (R8)(DI*4), DI
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VFMADD231PS (DI), Y8, Y0
	VFMADD231PS 32(DI), Y9, Y1
	VFMADD231PS 64(DI), Y10, Y2
	VFMADD231PS 96(DI), Y11, Y3
	VFMADD231PS 128(DI), Y12, Y0
	VFMADD231PS 160(DI), Y13, Y1
	VFMADD231PS 192(DI), Y14, Y2
	VFMADD231PS 224(DI), Y15, Y3
	VADDPS Y1, Y0, Y0
	VADDPS Y3, Y2, Y2
	VADDPS Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VHADDPS X0, X0, X0
	VHADDPS X0, X0, X0
	VMOVSS X0, (R10)
	ADDQ $8, R9
	ADDQ $4, R10
	DECQ R11
	JNZ d64next
	VZEROUPPER
	RET

// func axpysAVX2(alpha, base *float32, offs *int, y *float32, n, cnt int)
// y += alpha[i]·(base+offs[i]) for i = 0 … cnt-1, each element's FMAs in
// order of i as in cnt axpyAVX2 calls. y is walked in blocks of 64 floats
// (then one of 32, 16, 8 as needed), each held in registers over all i.
TEXT ·axpysAVX2(SB), NOSPLIT, $0-48
	MOVQ alpha+0(FP), SI
	MOVQ base+8(FP), R8
	MOVQ offs+16(FP), R9
	MOVQ y+24(FP), DI
	MOVQ n+32(FP), CX
	MOVQ cnt+40(FP), R11
	SHLQ $2, CX // bytes
	XORQ AX, AX // byte offset of the block in y and in each vector
	MOVQ CX, DX
	ANDQ $-256, DX // bytes in whole 64-float blocks
a64:
	CMPQ AX, DX
	JGE a32
	VMOVUPS 0(DI)(AX*1), Y0
	VMOVUPS 32(DI)(AX*1), Y1
	VMOVUPS 64(DI)(AX*1), Y2
	VMOVUPS 96(DI)(AX*1), Y3
	VMOVUPS 128(DI)(AX*1), Y4
	VMOVUPS 160(DI)(AX*1), Y5
	VMOVUPS 192(DI)(AX*1), Y6
	VMOVUPS 224(DI)(AX*1), Y7
	XORQ BX, BX
a64k:
	VBROADCASTSS (SI)(BX*4), Y15
	MOVQ (R9)(BX*8), R12
	LEAQ (R8)(R12*4), R12
	VFMADD231PS 0(R12)(AX*1), Y15, Y0
	VFMADD231PS 32(R12)(AX*1), Y15, Y1
	VFMADD231PS 64(R12)(AX*1), Y15, Y2
	VFMADD231PS 96(R12)(AX*1), Y15, Y3
	VFMADD231PS 128(R12)(AX*1), Y15, Y4
	VFMADD231PS 160(R12)(AX*1), Y15, Y5
	VFMADD231PS 192(R12)(AX*1), Y15, Y6
	VFMADD231PS 224(R12)(AX*1), Y15, Y7
	INCQ BX
	CMPQ BX, R11
	JLT a64k
	VMOVUPS Y0, 0(DI)(AX*1)
	VMOVUPS Y1, 32(DI)(AX*1)
	VMOVUPS Y2, 64(DI)(AX*1)
	VMOVUPS Y3, 96(DI)(AX*1)
	VMOVUPS Y4, 128(DI)(AX*1)
	VMOVUPS Y5, 160(DI)(AX*1)
	VMOVUPS Y6, 192(DI)(AX*1)
	VMOVUPS Y7, 224(DI)(AX*1)
	ADDQ $256, AX
	JMP a64
a32:
	MOVQ CX, DX
	SUBQ AX, DX // bytes left, < 256
	CMPQ DX, $128
	JLT a16
	VMOVUPS 0(DI)(AX*1), Y0
	VMOVUPS 32(DI)(AX*1), Y1
	VMOVUPS 64(DI)(AX*1), Y2
	VMOVUPS 96(DI)(AX*1), Y3
	XORQ BX, BX
a32k:
	VBROADCASTSS (SI)(BX*4), Y15
	MOVQ (R9)(BX*8), R12
	LEAQ (R8)(R12*4), R12
	VFMADD231PS 0(R12)(AX*1), Y15, Y0
	VFMADD231PS 32(R12)(AX*1), Y15, Y1
	VFMADD231PS 64(R12)(AX*1), Y15, Y2
	VFMADD231PS 96(R12)(AX*1), Y15, Y3
	INCQ BX
	CMPQ BX, R11
	JLT a32k
	VMOVUPS Y0, 0(DI)(AX*1)
	VMOVUPS Y1, 32(DI)(AX*1)
	VMOVUPS Y2, 64(DI)(AX*1)
	VMOVUPS Y3, 96(DI)(AX*1)
	ADDQ $128, AX
a16:
	MOVQ CX, DX
	SUBQ AX, DX
	CMPQ DX, $64
	JLT a8
	VMOVUPS 0(DI)(AX*1), Y0
	VMOVUPS 32(DI)(AX*1), Y1
	XORQ BX, BX
a16k:
	VBROADCASTSS (SI)(BX*4), Y15
	MOVQ (R9)(BX*8), R12
	LEAQ (R8)(R12*4), R12
	VFMADD231PS 0(R12)(AX*1), Y15, Y0
	VFMADD231PS 32(R12)(AX*1), Y15, Y1
	INCQ BX
	CMPQ BX, R11
	JLT a16k
	VMOVUPS Y0, 0(DI)(AX*1)
	VMOVUPS Y1, 32(DI)(AX*1)
	ADDQ $64, AX
a8:
	CMPQ AX, CX
	JGE adone
	VMOVUPS 0(DI)(AX*1), Y0
	XORQ BX, BX
a8k:
	VBROADCASTSS (SI)(BX*4), Y15
	MOVQ (R9)(BX*8), R12
	LEAQ (R8)(R12*4), R12
	VFMADD231PS 0(R12)(AX*1), Y15, Y0
	INCQ BX
	CMPQ BX, R11
	JLT a8k
	VMOVUPS Y0, 0(DI)(AX*1)
	ADDQ $32, AX
adone:
	VZEROUPPER
	RET

// func permuteAVX2(dst, src *float32, chunks int)
// permuteX's deinterleave of chunks whole 32-float chunks: dst[c+l] =
// src[c+2l], dst[c+16+l] = src[c+2l+1] (l < 16). VSHUFPS picks the even
// (0x88) or odd (0xDD) floats of two vectors per 128-bit lane and VPERMPD
// puts the lanes' pairs in order.
TEXT ·permuteAVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ chunks+16(FP), CX
	TESTQ CX, CX
	JLE pmdone
pmloop:
	VMOVUPS (SI), Y0
	VMOVUPS 32(SI), Y1
	VMOVUPS 64(SI), Y2
	VMOVUPS 96(SI), Y3
	VSHUFPS $0x88, Y1, Y0, Y4 // x0 x2 x8 x10 | x4 x6 x12 x14
	VSHUFPS $0xDD, Y1, Y0, Y5 // x1 x3 x9 x11 | x5 x7 x13 x15
	VSHUFPS $0x88, Y3, Y2, Y6
	VSHUFPS $0xDD, Y3, Y2, Y7
	VPERMPD $0xD8, Y4, Y4 // x0 x2 x4 … x14
	VPERMPD $0xD8, Y5, Y5
	VPERMPD $0xD8, Y6, Y6
	VPERMPD $0xD8, Y7, Y7
	VMOVUPS Y4, (DI)
	VMOVUPS Y6, 32(DI)
	VMOVUPS Y5, 64(DI)
	VMOVUPS Y7, 96(DI)
	ADDQ $128, SI
	ADDQ $128, DI
	DECQ CX
	JNZ pmloop
	VZEROUPPER
pmdone:
	RET

// func ropeAVX2(a, b, cos, sin *float32, n int)
// (a[i], b[i]) ← (a[i]·cos[i] − b[i]·sin[i], b[i]·cos[i] + a[i]·sin[i]) for
// i < n, n a positive multiple of 8; separate multiplies and adds, as
// ropeGo rounds them, so the results are ropeGo's bit for bit.
TEXT ·ropeAVX2(SB), NOSPLIT, $0-40
	MOVQ a+0(FP), DI
	MOVQ b+8(FP), SI
	MOVQ cos+16(FP), DX
	MOVQ sin+24(FP), R8
	MOVQ n+32(FP), CX
	SHLQ $2, CX
	XORQ AX, AX
ropeloop:
	VMOVUPS (DI)(AX*1), Y0 // x0
	VMOVUPS (SI)(AX*1), Y1 // x1
	VMOVUPS (DX)(AX*1), Y2 // cos
	VMOVUPS (R8)(AX*1), Y3 // sin
	VMULPS Y2, Y0, Y4      // x0·cos
	VMULPS Y3, Y1, Y5      // x1·sin
	VSUBPS Y5, Y4, Y4      // x0·cos − x1·sin
	VMULPS Y2, Y1, Y6      // x1·cos
	VMULPS Y3, Y0, Y7      // x0·sin
	VADDPS Y7, Y6, Y6      // x1·cos + x0·sin
	VMOVUPS Y4, (DI)(AX*1)
	VMOVUPS Y6, (SI)(AX*1)
	ADDQ $32, AX
	CMPQ AX, CX
	JLT ropeloop
	VZEROUPPER
	RET
