package cuda

import (
	"fmt"
	"runtime"
	"strings"

	"github.com/ebitengine/purego"
)

// cublasFns are the cuBLAS entry points used (handle bound to our stream;
// called only from the CUDA worker thread).
type cublasFns struct {
	create, destroy, setStream, setMathMode, gemmEx, getStatusString uintptr
	setWorkspace                                                     uintptr
}

func (f *cublasFns) load(h uintptr) error {
	var miss []string
	f.create = sym(h, "cublasCreate_v2", &miss)
	f.destroy = sym(h, "cublasDestroy_v2", &miss)
	f.setStream = sym(h, "cublasSetStream_v2", &miss)
	f.setMathMode = sym(h, "cublasSetMathMode", &miss)
	f.gemmEx = sym(h, "cublasGemmEx", &miss)
	f.setWorkspace = sym(h, "cublasSetWorkspace_v2", &miss)
	if len(miss) > 0 {
		return fmt.Errorf("missing cuBLAS symbols: %s", strings.Join(miss, ", "))
	}
	var m2 []string
	f.getStatusString = sym(h, "cublasGetStatusString", &m2)
	return nil
}

// cuBLAS enum values (cublas_api.h, library_types.h).
const (
	cublasOpN              = 0
	cublasOpT              = 1
	cudaR32F               = 0
	cudaR16BF              = 14
	cublasCompute32F       = 68
	cublasCompute32FTF32   = 77
	cublasGemmDefault      = -1
	cublasDefaultMath      = 0
	cublasTF32TensorOpMath = 3
)

func (f *cublasFns) err(what string, r uintptr) error {
	r = uint32r(r)
	if r == 0 {
		return nil
	}
	desc := ""
	if f.getStatusString != 0 {
		s, _, _ := purego.SyscallN(f.getStatusString, r)
		desc = goString(s)
	}
	return fmt.Errorf("cublas: %s: status %d %s", what, int(r), desc)
}

func keepAlive(x any) { runtime.KeepAlive(x) }
