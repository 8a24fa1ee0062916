//go:build linux || darwin || freebsd

package cpu

import (
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/ebitengine/purego"
)

// OpenBLAS, loaded at run time with purego (no cgo). Loading happens once, on
// the first call of blasAvailable; failures are silent and leave the Go paths
// in charge.

// CBLAS enum values (cblas.h).
const (
	cblasRowMajor = 101
	cblasNoTrans  = 111
	cblasTrans    = 112
)

// C signatures (blasint is 32-bit in Debian's libopenblas0; the 64-bit
// variant ships as libopenblas64 and is not searched for):
//
//	void cblas_sgemm(order, transA, transB, M, N, K int, alpha float,
//	                 const float *A, int lda, const float *B, int ldb,
//	                 float beta, float *C, int ldc)
//	void cblas_sgemv(order, trans, M, N int, alpha float, const float *A,
//	                 int lda, const float *x, int incx, float beta, float *y,
//	                 int incy)
//	void openblas_set_num_threads(int)
var (
	blasOnce    sync.Once
	blasOK      bool
	blasLibPath string
	cblasSgemm  func(order, ta, tb, m, n, k int32, alpha float32, a *float32, lda int32,
		b *float32, ldb int32, beta float32, c *float32, ldc int32)
	cblasSgemv func(order, trans, m, n int32, alpha float32, a *float32, lda int32,
		x *float32, incx int32, beta float32, y *float32, incy int32)
	openblasSetNumThreads func(n int32)
)

// blasCandidates lists library paths to try, most specific first:
// CHUNLIAN_OPENBLAS (an explicit file), then each LD_LIBRARY_PATH directory,
// then the bare sonames (the dynamic loader's default search, which covers
// Debian's /usr/lib/<triplet>/libopenblas.so.0 alternative).
func blasCandidates() []string {
	names := []string{"libopenblas.so.0", "libopenblas.so"}
	if isDarwin {
		names = []string{"libopenblas.0.dylib", "libopenblas.dylib"}
	}
	var c []string
	if p := os.Getenv("CHUNLIAN_OPENBLAS"); p != "" {
		c = append(c, p)
	}
	for _, dir := range strings.Split(os.Getenv("LD_LIBRARY_PATH"), ":") {
		if dir == "" {
			continue
		}
		for _, n := range names {
			c = append(c, filepath.Join(dir, n))
		}
	}
	c = append(c, names...)
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
	for _, path := range blasCandidates() {
		h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
		if err != nil {
			continue
		}
		// Check every symbol before registering, since RegisterLibFunc
		// panics on a missing one (e.g. a reference BLAS without the
		// openblas_ extension).
		ok := true
		for _, s := range []string{"cblas_sgemm", "cblas_sgemv", "openblas_set_num_threads"} {
			if _, err := purego.Dlsym(h, s); err != nil {
				ok = false
			}
		}
		if !ok {
			purego.Dlclose(h)
			continue
		}
		purego.RegisterLibFunc(&cblasSgemm, h, "cblas_sgemm")
		purego.RegisterLibFunc(&cblasSgemv, h, "cblas_sgemv")
		purego.RegisterLibFunc(&openblasSetNumThreads, h, "openblas_set_num_threads")
		blasLibPath = path
		blasOK = true
		openblasSetNumThreads(int32(Threads()))
		return
	}
}

func blasAvailable() bool {
	if os.Getenv("CHUNLIAN_NO_OPENBLAS") != "" {
		return false
	}
	blasOnce.Do(loadBLAS)
	return blasOK
}

// setBLASThreads forwards SetThreads to OpenBLAS if it is already loaded (if
// not, loadBLAS applies Threads() when it loads).
func setBLASThreads(n int) {
	if blasOK {
		openblasSetNumThreads(int32(n))
	}
}

// gemmBLAS: y[m,n] (+)= x[m,k]·w[n,k]ᵀ via one cblas call. M=1 (decode of
// one sequence) goes to sgemv, y = W·x, which OpenBLAS runs as a streaming
// kernel instead of packing W for a GEMM.
func gemmBLAS(m, n, k int, x, w, y []float32, acc bool) {
	var beta float32
	if acc {
		beta = 1
	}
	if m == 1 {
		cblasSgemv(cblasRowMajor, cblasNoTrans, int32(n), int32(k), 1, &w[0], int32(k),
			&x[0], 1, beta, &y[0], 1)
		return
	}
	cblasSgemm(cblasRowMajor, cblasNoTrans, cblasTrans, int32(m), int32(n), int32(k),
		1, &x[0], int32(k), &w[0], int32(k), beta, &y[0], int32(n))
}
