//go:build !amd64

package cpu

// Not amd64: no assembly int8 kernels.
func int8AsmAvailable() bool    { return false }
func int8AsmKernel() int8Kernel { return gemmInt8GoRect }
