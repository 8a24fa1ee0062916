//go:build !amd64

package cpu

// Not amd64: no assembly bf16 kernels.
func bf16AsmAvailable() bool                { return false }
func bf16AsmImpl() bf16Impl                 { return bf16Impl{gemmBF16GoRect, false} }
func asmVariants() []string                 { return nil }
func setAsmVariant(string) (restore func()) { return func() {} }

// No assembly permute (permuteX stays scalar).
const permuteAsm = false

func permuteAVX2(dst, src *float32, chunks int) { panic("unreachable") }

// asmName: no assembly variant here.
func asmName() string { return "" }

// No VDPBF16PS kernels: GemmBF16Dot rounds x and runs GemmBF16's kernel.
const (
	useBF16Dot   = false
	roundBF16Asm = false
)

func setBF16DotAsm(bool) (restore func()) { return func() {} }

func bf16DotRect(i0, i1, j0, j1, n, k int, x []float32, w []uint16, y []float32, acc bool) {
	panic("unreachable")
}

func roundBF16AVX512(dst *uint16, src *float32, n32 int) { panic("unreachable") }
