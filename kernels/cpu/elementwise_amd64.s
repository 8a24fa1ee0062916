#include "textflag.h"

// AVX2/FMA inner loops of Dot and Axpy for every amd64 build (see
// elementwise_amd64.go). n is a multiple of 8; the caller does the rest.

// func dotAVX2(a, b *float32, n int) float32
TEXT ·dotAVX2(SB), NOSPLIT, $0-28
	MOVQ a+0(FP), SI
	MOVQ b+8(FP), DI
	MOVQ n+16(FP), CX
	SHLQ $2, CX // bytes
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	XORQ AX, AX
	MOVQ CX, DX
	ANDQ $-128, DX // bytes in whole 32-float blocks
	CMPQ AX, DX
	JGE tail
loop32:
	VMOVUPS (SI)(AX*1), Y4
	VMOVUPS 32(SI)(AX*1), Y5
	VMOVUPS 64(SI)(AX*1), Y6
	VMOVUPS 96(SI)(AX*1), Y7
	VFMADD231PS (DI)(AX*1), Y4, Y0
	VFMADD231PS 32(DI)(AX*1), Y5, Y1
	VFMADD231PS 64(DI)(AX*1), Y6, Y2
	VFMADD231PS 96(DI)(AX*1), Y7, Y3
	ADDQ $128, AX
	CMPQ AX, DX
	JLT loop32
tail:
	CMPQ AX, CX
	JGE reduce
	VMOVUPS (SI)(AX*1), Y4
	VFMADD231PS (DI)(AX*1), Y4, Y0
	ADDQ $32, AX
	JMP tail
reduce:
	VADDPS Y1, Y0, Y0
	VADDPS Y3, Y2, Y2
	VADDPS Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VHADDPS X0, X0, X0
	VHADDPS X0, X0, X0
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
