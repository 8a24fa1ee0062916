package cuda

import (
	"fmt"
	"strings"
	"unsafe"

	"github.com/ebitengine/purego"
)

// nvrtcFns are NVRTC's entry points (thread-safe per program; we only
// compile at start-up).
type nvrtcFns struct {
	create, compile, destroy, logSize, getLog uintptr
	cubinSize, getCubin, ptxSize, getPTX      uintptr
	errString, version                        uintptr
}

func (f *nvrtcFns) load(h uintptr) error {
	var miss []string
	f.create = sym(h, "nvrtcCreateProgram", &miss)
	f.compile = sym(h, "nvrtcCompileProgram", &miss)
	f.destroy = sym(h, "nvrtcDestroyProgram", &miss)
	f.logSize = sym(h, "nvrtcGetProgramLogSize", &miss)
	f.getLog = sym(h, "nvrtcGetProgramLog", &miss)
	f.ptxSize = sym(h, "nvrtcGetPTXSize", &miss)
	f.getPTX = sym(h, "nvrtcGetPTX", &miss)
	f.errString = sym(h, "nvrtcGetErrorString", &miss)
	f.version = sym(h, "nvrtcVersion", &miss)
	if len(miss) > 0 {
		return fmt.Errorf("missing NVRTC symbols: %s", strings.Join(miss, ", "))
	}
	// CUBIN output exists from NVRTC 11.1 on; without it we fall back to PTX.
	var m2 []string
	f.cubinSize = sym(h, "nvrtcGetCUBINSize", &m2)
	f.getCubin = sym(h, "nvrtcGetCUBIN", &m2)
	return nil
}

func (f *nvrtcFns) err(what string, r uintptr) error {
	r = uint32r(r)
	if r == 0 {
		return nil
	}
	s, _, _ := purego.SyscallN(f.errString, r)
	return fmt.Errorf("nvrtc: %s: %s (%d)", what, goString(s), int(r))
}

// Version returns NVRTC's major and minor version.
func (f *nvrtcFns) Version() (int, int) {
	var maj, min int32
	purego.SyscallN(f.version, uintptr(unsafe.Pointer(&maj)), uintptr(unsafe.Pointer(&min)))
	return int(maj), int(min)
}

// compileResult is a compiled module image: CUBIN when arch is a real sm_XY
// and NVRTC can emit it, else PTX (NUL-terminated, loadable by
// cuModuleLoadData).
type compileResult struct {
	image []byte
	cubin bool
	log   string
}

// compileSource compiles src for arch ("sm_90" gives CUBIN, "compute_90"
// gives PTX). defines become -D options. On failure the error carries the
// compiler log.
func (f *nvrtcFns) compileSource(name, src, arch string, opts []string) (*compileResult, error) {
	var prog uintptr
	csrc, cname := cString(src), cString(name)
	if err := f.err("nvrtcCreateProgram", func() uintptr {
		r, _, _ := purego.SyscallN(f.create, uintptr(unsafe.Pointer(&prog)),
			uintptr(unsafe.Pointer(&csrc[0])), uintptr(unsafe.Pointer(&cname[0])), 0, 0, 0)
		return r
	}()); err != nil {
		return nil, err
	}
	defer purego.SyscallN(f.destroy, uintptr(unsafe.Pointer(&prog)))

	all := append([]string{"--gpu-architecture=" + arch, "--std=c++17"}, opts...)
	cstrs := make([][]byte, len(all))
	ptrs := make([]uintptr, len(all))
	for i, o := range all {
		cstrs[i] = cString(o)
		ptrs[i] = uintptr(unsafe.Pointer(&cstrs[i][0]))
	}
	r, _, _ := purego.SyscallN(f.compile, prog, uintptr(len(ptrs)), uintptr(unsafe.Pointer(&ptrs[0])))
	keepAlive(cstrs)
	log := f.programLog(prog)
	if err := f.err("nvrtcCompileProgram", r); err != nil {
		return nil, fmt.Errorf("%v (options %q)\n%s", err, all, log)
	}
	res := &compileResult{log: log}
	if strings.HasPrefix(arch, "sm_") && f.cubinSize != 0 {
		var n uintptr
		if err := f.err("nvrtcGetCUBINSize", func() uintptr {
			r, _, _ := purego.SyscallN(f.cubinSize, prog, uintptr(unsafe.Pointer(&n)))
			return r
		}()); err != nil {
			return nil, err
		}
		res.image = make([]byte, n)
		if err := f.err("nvrtcGetCUBIN", func() uintptr {
			r, _, _ := purego.SyscallN(f.getCubin, prog, uintptr(unsafe.Pointer(&res.image[0])))
			return r
		}()); err != nil {
			return nil, err
		}
		res.cubin = true
		return res, nil
	}
	var n uintptr
	if err := f.err("nvrtcGetPTXSize", func() uintptr {
		r, _, _ := purego.SyscallN(f.ptxSize, prog, uintptr(unsafe.Pointer(&n)))
		return r
	}()); err != nil {
		return nil, err
	}
	res.image = make([]byte, n)
	if err := f.err("nvrtcGetPTX", func() uintptr {
		r, _, _ := purego.SyscallN(f.getPTX, prog, uintptr(unsafe.Pointer(&res.image[0])))
		return r
	}()); err != nil {
		return nil, err
	}
	return res, nil
}

func (f *nvrtcFns) programLog(prog uintptr) string {
	var n uintptr
	if r, _, _ := purego.SyscallN(f.logSize, prog, uintptr(unsafe.Pointer(&n))); uint32r(r) != 0 || n <= 1 {
		return ""
	}
	b := make([]byte, n)
	purego.SyscallN(f.getLog, prog, uintptr(unsafe.Pointer(&b[0])))
	return strings.TrimRight(string(b), "\x00\n")
}
