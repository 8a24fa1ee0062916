// Package cpu holds the float32 CPU kernels of the chunlian forward pass:
// matrix multiply (Gemm, GemmAcc) and the row/elementwise kernels a
// Llama-layout transformer needs (RMSNorm, RoPE, SiLUMul, Add, Softmax, Dot,
// Axpy).
//
// All matrices are dense, row-major float32. Weights keep the Hugging Face
// [out_features, in_features] layout, so a projection is y = x · Wᵀ and Gemm
// takes W as stored in the checkpoint, untransposed.
//
// # GEMM paths
//
// Gemm picks one of three paths once, at first use; Path reports it:
//
//   - "openblas": a system OpenBLAS (Debian package libopenblas0-pthread),
//     loaded at run time with github.com/ebitengine/purego. M=1 (one decode
//     token) goes to sgemv; larger M to sgemm, except that where the SIMD
//     path is also compiled in, 2 ≤ M < 16 goes to the SIMD kernel (OpenBLAS
//     sgemm is slow for a handful of rows), and on AVX-512 CPUs every M ≥ 2
//     does (the AVX-512 kernel measured 8-27% faster than OpenBLAS 0.3.21
//     sgemm at the model's shapes).
//   - "simd": pure Go with simd/archsimd, compiled only with
//     GOEXPERIMENT=simd on amd64 and used only if the CPU reports AVX2 and
//     FMA at run time. A 2×4 dot-product microkernel on 8-lane vectors, or on
//     16-lane vectors where the CPU has AVX-512F (about twice as fast per
//     core).
//   - "go": blocked plain Go (2×2 tiles); always available.
//
// The order of preference is openblas, simd, go. CHUNLIAN_GEMM=openblas|simd|go
// forces a path; a forced path that is unavailable falls back to the next
// one in that order. CHUNLIAN_GEMM=go also keeps the elementwise kernels on
// plain Go. CHUNLIAN_OPENBLAS=/path/to/libopenblas.so.0 names the library
// explicitly; otherwise LD_LIBRARY_PATH's directories and then the dynamic
// loader's default search are tried for libopenblas.so.0 and libopenblas.so.
//
// The elementwise kernels use AVX2 (archsimd) under the same conditions as
// the SIMD GEMM, else plain Go; exp is a float32 polynomial (relative error
// ~1e-7) in both.
//
// # bf16 weights
//
// GemmBF16 and GemmBF16Acc take the weights as bf16 bit patterns ([]uint16,
// same [out,in] layout) and x, y in float32, for small M (decode), where a
// GEMM is bound by the bytes of W it streams. bf16 → float32 is exact, so
// the products equal Gemm's on the widened weights up to summation order.
// With GOEXPERIMENT=simd on AVX-512 the kernel reads 32 weights per 64-byte
// load and splits each pair into even and odd float32 vectors with one
// shift and one AND (x is deinterleaved to match once per call); AVX2 widens
// 8 at a time; otherwise plain Go. HasFastBF16 tells whether a SIMD kernel
// is in use. Products under 1 MiB of weights run on the caller (pool
// hand-off measured slower than the work); see bf16.go.
//
// # Threads
//
// SetThreads/Threads set the parallelism (default GOMAXPROCS). The Go and
// SIMD kernels split work over a small persistent pool of goroutines (the
// caller runs one part itself); parallel calls are serialised, and nothing
// allocates per call. GEMMs are split by columns (weight rows) so that each
// weight byte crosses the memory bus once; tiny products and short rows run
// inline on the caller. OpenBLAS uses its own threads, set to the same count.
//
// # Why OpenBLAS through purego and not cgo
//
// The service ships as one static binary built with CGO_ENABLED=0: no C
// toolchain in the build, trivial cross-compilation, no libc version coupling.
// purego calls C functions from pure Go by dlopen'ing a shared library at run
// time, so OpenBLAS becomes an optional accelerator: where libopenblas.so.0
// is installed the binary uses it, where it is missing the binary still runs
// on the Go kernels, silently. Nothing about the build changes either way.
// The calls use the Fortran entry points (sgemm_, sgemv_), whose arguments
// are all pointers, through purego.SyscallN: no reflection, one small
// allocation per call.
package cpu
