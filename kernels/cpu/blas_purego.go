//go:build linux || darwin

package cpu

import (
	"path/filepath"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// OpenBLAS, loaded at run time with purego (no cgo). Loading happens once, on
// the first call of blasAvailable; failures are silent and leave the Go paths
// in charge.

// The Fortran BLAS entry points are called rather than the CBLAS ones:
// every Fortran argument is a pointer, so the call goes through
// purego.SyscallN with integer-class arguments only. SyscallN cannot mix
// integer and float arguments (cblas_sgemm's alpha/beta), and
// purego.RegisterLibFunc's reflection-built wrapper costs ~10 heap
// allocations per call, which the engine would pay on every projection.
//
//	void sgemm_(const char *transa, const char *transb, const int *m,
//	            const int *n, const int *k, const float *alpha,
//	            const float *a, const int *lda, const float *b,
//	            const int *ldb, const float *beta, float *c, const int *ldc)
//	void sgemv_(const char *trans, const int *m, const int *n,
//	            const float *alpha, const float *a, const int *lda,
//	            const float *x, const int *incx, const float *beta, float *y,
//	            const int *incy)
//	void openblas_set_num_threads(int)
//
// Integer arguments are stored in int64 slots: Debian's libopenblas0 reads
// them as 32-bit (little-endian: the low half of the slot), an ILP64 build
// (libopenblas64, or a custom build under the same name) as 64-bit, and both
// see the right value. A self-test product at load time guards against any
// other ABI surprise.
var (
	blasOnce    sync.Once
	blasOK      bool // set once in loadBLAS, under blasMu
	blasLibPath string
	fnSgemm     uintptr
	fnSgemv     uintptr
	fnSetThr    uintptr

	// blasMu guards blasArgs, the memory the scalar arguments are passed
	// through (package-level, so it never moves and nothing is allocated per
	// call), and the variables above while loadBLAS sets them. It also
	// serialises OpenBLAS calls, which is no loss: each one already uses all
	// the threads.
	blasMu   sync.Mutex
	blasArgs struct {
		charN, charT  byte
		m, n, k       int64
		lda, ldb, ldc int64
		inc           int64
		alpha, beta   float32
	}
)

// blasCandidates lists library paths to try: the bare sonames (the
// dynamic loader's search, which honours LD_LIBRARY_PATH and covers
// Debian's /usr/lib/<triplet>/libopenblas.so.0 alternative), then
// Homebrew's directories on macOS.
func blasCandidates() []string {
	names := []string{"libopenblas.so.0", "libopenblas.so"}
	if isDarwin {
		names = []string{"libopenblas.0.dylib", "libopenblas.dylib"}
	}
	c := append([]string(nil), names...)
	if isDarwin {
		for _, dir := range []string{"/opt/homebrew/opt/openblas/lib", "/usr/local/opt/openblas/lib"} {
			for _, n := range names {
				c = append(c, filepath.Join(dir, n))
			}
		}
	}
	return c
}

func loadBLAS() {
	blasMu.Lock()
	defer blasMu.Unlock()
	for _, path := range blasCandidates() {
		h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
		if err != nil {
			continue
		}
		// A library without all three symbols (a reference BLAS lacks
		// openblas_set_num_threads) is skipped.
		var syms [3]uintptr
		ok := true
		for i, name := range []string{"sgemm_", "sgemv_", "openblas_set_num_threads"} {
			if syms[i], err = purego.Dlsym(h, name); err != nil || syms[i] == 0 {
				ok = false
			}
		}
		if !ok {
			purego.Dlclose(h)
			continue
		}
		fnSgemm, fnSgemv, fnSetThr = syms[0], syms[1], syms[2]
		blasArgs.charN, blasArgs.charT = 'N', 'T'
		purego.SyscallN(fnSetThr, uintptr(Threads()))
		if !blasSelfTest() {
			purego.Dlclose(h)
			continue
		}
		blasLibPath = path
		blasOK = true
		return
	}
}

// blasSelfTest checks one small sgemm and one sgemv against plain Go (called
// with blasMu held). A library that computes something else (wrong integer
// width, wrong argument convention) is not used.
func blasSelfTest() bool {
	const m, n, k = 3, 5, 7
	x, w := make([]float32, m*k), make([]float32, n*k)
	for i := range x {
		x[i] = float32(i%5) - 2
	}
	for i := range w {
		w[i] = float32(i%3) - 1
	}
	for _, mm := range []int{m, 1} {
		want, got := make([]float32, mm*n), make([]float32, mm*n)
		gemmRef(mm, n, k, x, w, want, false)
		blasCall(mm, n, k, x, w, got, false)
		for i := range want {
			if got[i] != want[i] { // small integers: exact in float32
				return false
			}
		}
	}
	return true
}

// blasAvailable loads OpenBLAS on first use and reports whether it loaded.
func blasAvailable() bool {
	blasOnce.Do(loadBLAS)
	return blasOK
}

// setBLASThreads forwards SetThreads to OpenBLAS if it is already loaded (if
// not, loadBLAS applies Threads() when it loads).
func setBLASThreads(n int) {
	blasMu.Lock()
	defer blasMu.Unlock()
	if blasOK {
		purego.SyscallN(fnSetThr, uintptr(n))
	}
}

// gemmBLAS: y[m,n] (+)= x[m,k]·w[n,k]ᵀ in one OpenBLAS call.
//
// Fortran is column-major: the row-major y[m,n] is the column-major n×m
// matrix yᵀ, and yᵀ = w·xᵀ where row-major w[n,k] read column-major is the
// k×n matrix wᵀ (so it is passed with trans='T') and row-major x[m,k] is the
// k×m matrix xᵀ (trans='N'). M=1 (decode of one sequence) goes to sgemv,
// y = w·x, a streaming kernel that skips GEMM's packing.
func gemmBLAS(m, n, k int, x, w, y []float32, acc bool) {
	blasMu.Lock()
	defer blasMu.Unlock()
	blasCall(m, n, k, x, w, y, acc)
}

// blasCall makes the OpenBLAS call for gemmBLAS; blasMu must be held.
func blasCall(m, n, k int, x, w, y []float32, acc bool) {
	a := &blasArgs
	a.m, a.n, a.k = int64(m), int64(n), int64(k)
	a.lda, a.ldb, a.ldc, a.inc = int64(k), int64(k), int64(n), 1
	a.alpha, a.beta = 1, 0
	if acc {
		a.beta = 1
	}
	p := func(v *int64) uintptr { return uintptr(unsafe.Pointer(v)) }
	if m == 1 {
		// sgemv_('T', k, n, 1, w, k, x, 1, beta, y, 1): the column-major
		// k×n matrix is wᵀ, transposed back to w.
		purego.SyscallN(fnSgemv, uintptr(unsafe.Pointer(&a.charT)), p(&a.k), p(&a.n),
			uintptr(unsafe.Pointer(&a.alpha)), uintptr(unsafe.Pointer(&w[0])), p(&a.lda),
			uintptr(unsafe.Pointer(&x[0])), p(&a.inc), uintptr(unsafe.Pointer(&a.beta)),
			uintptr(unsafe.Pointer(&y[0])), p(&a.inc))
		return
	}
	purego.SyscallN(fnSgemm, uintptr(unsafe.Pointer(&a.charT)), uintptr(unsafe.Pointer(&a.charN)),
		p(&a.n), p(&a.m), p(&a.k), uintptr(unsafe.Pointer(&a.alpha)),
		uintptr(unsafe.Pointer(&w[0])), p(&a.lda), uintptr(unsafe.Pointer(&x[0])), p(&a.ldb),
		uintptr(unsafe.Pointer(&a.beta)), uintptr(unsafe.Pointer(&y[0])), p(&a.ldc))
}
