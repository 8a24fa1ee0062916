// Package cpu holds the float32 CPU kernels of the chunlian forward pass:
// matrix multiply (Gemm, GemmAcc) and the elementwise/row kernels a
// Llama-layout transformer needs (RMSNorm, RoPE, SiLUMul, Add, Softmax, Dot,
// Axpy).
//
// All matrices are dense, row-major float32. Weights keep the Hugging Face
// [out_features, in_features] layout, so a projection is y = x · Wᵀ and Gemm
// takes W untransposed as stored in the checkpoint.
//
// # GEMM paths
//
// Gemm picks one of three implementations once, at first use:
//
//   - "openblas": cblas_sgemm from a system OpenBLAS (Debian package
//     libopenblas0-pthread), loaded at run time with github.com/ebitengine/purego.
//     This is the fastest path by a wide margin (a tuned assembly microkernel).
//   - "simd": a pure-Go AVX2/FMA microkernel written with simd/archsimd. It is
//     compiled only with GOEXPERIMENT=simd on amd64 and used only when the CPU
//     reports AVX2 and FMA at run time.
//   - "go": blocked, unrolled plain Go; always available.
//
// Every path splits work across the package's persistent worker pool (see
// SetThreads), except OpenBLAS, which uses its own threads (set to the same
// count through openblas_set_num_threads).
//
// The environment variable CHUNLIAN_GEMM=openblas|simd|go forces a path (if
// the forced path is unavailable the next one in the order above that is
// available is used, and Path reports what is actually in use).
//
// # Why OpenBLAS through purego and not cgo
//
// The service is shipped as one static binary built with CGO_ENABLED=0: no C
// toolchain in the build, trivial cross-compilation, no libc version coupling.
// purego calls C functions from pure Go by dlopen'ing a shared library at run
// time, so OpenBLAS becomes an optional accelerator: where libopenblas.so.0 is
// installed the binary uses it, where it is missing the binary still runs on
// the Go kernels. Nothing about the build changes either way.
package cpu
