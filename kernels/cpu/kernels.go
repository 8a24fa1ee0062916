package cpu

import "fmt"

// Kernels describes the kernels this process runs, for a start-up log
// line: the GEMM path (Path: openblas, asm or go), the bf16 and int8 GEMM
// kernels (asm with its variant, or go) and the elementwise set, e.g.
// "gemm=openblas bf16=asm-avx512 int8=asm-avx512 elementwise=asm", or
// "gemm=asm …" where OpenBLAS is missing. A slow machine is then one log
// line away from its cause (bf16=go where assembly was expected, for
// instance).
func Kernels() string {
	bf16, int8 := "go", "go"
	if HasFastBF16() {
		bf16 = "asm-" + asmName()
	}
	if HasFastInt8() {
		int8 = "asm-" + asmName()
	}
	return fmt.Sprintf("gemm=%s bf16=%s int8=%s elementwise=%s", Path(), bf16, int8, elem.name)
}
