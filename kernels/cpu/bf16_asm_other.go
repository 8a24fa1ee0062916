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
