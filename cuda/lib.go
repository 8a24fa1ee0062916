package cuda

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/ebitengine/purego"
)

// testLibDirs is a path list searched after Options.LibDir: set only by
// this package's TestMain (from CHUNLIAN_CUDA_LIB_DIR), since the tests
// build backends with no LibDir of their own. The package reads no
// environment.
var testLibDirs string

// testNVRTCTarget is the Options.NVRTCTarget of backends that set none:
// set only by this package's TestMain (from CHUNLIAN_CUDA_NVRTC_TARGET).
var testNVRTCTarget string

// Shared-object names tried in order. NVRTC 11.2/12 are accepted for kernel
// compilation only (a CPU machine with an older toolkit can still check that
// the kernels compile); running needs the driver and cuBLAS.
var (
	driverNames   = []string{"libcuda.so.1", "libcuda.so"}
	nvrtcNames    = []string{"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so"}
	cublasLtNames = []string{"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"}
	cublasNames   = []string{"libcublas.so.13", "libcublas.so.12", "libcublas.so"}
	nvmlNames     = []string{"libnvidia-ml.so.1", "libnvidia-ml.so"}
)

// searchDirs lists the directories tried before the dynamic loader's own
// search (LD_LIBRARY_PATH, ld.so.cache, /lib, /usr/lib), in priority order:
// the explicit dir (--cuda-lib-dir), then the path list extra. An empty
// entry means "bare name: let dlopen search".
func searchDirs(explicit, extra string) []string {
	var dirs []string
	seen := map[string]bool{}
	add := func(d string) {
		if !seen[d] {
			seen[d] = true
			dirs = append(dirs, d)
		}
	}
	if explicit != "" {
		add(explicit)
	}
	if extra != "" {
		for _, d := range filepath.SplitList(extra) {
			if d != "" {
				add(d)
			}
		}
	}
	add("") // the loader's own search, which honours LD_LIBRARY_PATH
	return dirs
}

// candidates returns the paths to try for one library, in order.
func candidates(dirs, names []string) []string {
	var out []string
	for _, d := range dirs {
		for _, n := range names {
			if d == "" {
				out = append(out, n)
			} else {
				out = append(out, filepath.Join(d, n))
			}
		}
	}
	return out
}

// openFirst dlopens the first candidate that loads. The error names the
// library and every path tried, so a CPU-only machine's message says exactly
// what is missing.
func openFirst(what string, dirs, names []string) (uintptr, string, error) {
	var tried []string
	var last error
	for _, p := range candidates(dirs, names) {
		if strings.ContainsRune(p, '/') {
			if _, err := os.Stat(p); err != nil {
				tried = append(tried, p+" (absent)")
				continue
			}
		}
		h, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err == nil {
			return h, p, nil
		}
		last = err
		tried = append(tried, p)
	}
	msg := fmt.Sprintf("cuda: %s not found (tried %s)", what, strings.Join(tried, ", "))
	if last != nil {
		msg += "; last dlopen error: " + last.Error()
	}
	msg += "; set --cuda-lib-dir (CHUNLIAN_CUDA_LIB_DIR) to the directory holding it"
	return 0, "", errors.New(msg)
}

// sym resolves a symbol or records a missing one in *missing.
func sym(h uintptr, name string, missing *[]string) uintptr {
	p, err := purego.Dlsym(h, name)
	if err != nil || p == 0 {
		*missing = append(*missing, name)
		return 0
	}
	return p
}

// libs are the dlopened CUDA libraries and their entry points. Loading
// is process-wide and happens once per library directory setting.
type libs struct {
	driverPath, nvrtcPath, cublasPath string
	drv                               driverFns
	rtc                               nvrtcFns
	blas                              cublasFns
}

var (
	loadMu    sync.Mutex
	loadCache = map[string]*libsResult{}
)

type libsResult struct {
	l   *libs
	err error
}

// loadLibs opens driver, NVRTC and cuBLAS (all three needed to run).
func loadLibs(libDir string) (*libs, error) {
	env := testLibDirs
	key := libDir + "\x00" + env
	loadMu.Lock()
	defer loadMu.Unlock()
	if r, ok := loadCache[key]; ok {
		return r.l, r.err
	}
	l, err := loadLibsUncached(searchDirs(libDir, env))
	loadCache[key] = &libsResult{l, err}
	return l, err
}

func loadLibsUncached(dirs []string) (*libs, error) {
	l := &libs{}
	var errs []string

	if h, p, err := openFirst("CUDA driver (libcuda.so.1)", dirs, driverNames); err != nil {
		errs = append(errs, err.Error())
	} else if err := l.drv.load(h); err != nil {
		errs = append(errs, fmt.Sprintf("cuda: %s: %v", p, err))
	} else {
		l.driverPath = p
	}

	if h, p, err := openNVRTC(dirs); err != nil {
		errs = append(errs, err.Error())
	} else if err := l.rtc.load(h); err != nil {
		errs = append(errs, fmt.Sprintf("cuda: %s: %v", p, err))
	} else {
		l.nvrtcPath = p
	}

	// cuBLAS needs cuBLASLt: open it first, globally, from the same places so
	// the soname is already resident when libcublas asks for it.
	if _, _, err := openFirst("cuBLASLt (libcublasLt.so.13)", dirs, cublasLtNames); err != nil {
		errs = append(errs, err.Error())
	} else if h, p, err := openFirst("cuBLAS (libcublas.so.13)", dirs, cublasNames); err != nil {
		errs = append(errs, err.Error())
	} else if err := l.blas.load(h); err != nil {
		errs = append(errs, fmt.Sprintf("cuda: %s: %v", p, err))
	} else {
		l.cublasPath = p
	}
	if len(errs) > 0 {
		return nil, errors.New(strings.Join(errs, "\n"))
	}
	return l, nil
}

// openNVRTC opens NVRTC after preloading its builtins library from the same
// directory (NVRTC dlopens libnvrtc-builtins by bare name at compile time,
// which fails when the directory is not on the loader's path).
func openNVRTC(dirs []string) (uintptr, string, error) {
	for _, d := range dirs {
		if d == "" {
			continue
		}
		if m, _ := filepath.Glob(filepath.Join(d, "libnvrtc-builtins.so.*")); len(m) > 0 {
			for _, b := range m {
				if _, err := purego.Dlopen(b, purego.RTLD_NOW|purego.RTLD_GLOBAL); err == nil {
					break
				}
			}
		}
	}
	return openFirst("NVRTC (libnvrtc.so.13)", dirs, nvrtcNames)
}

// loadNVRTCOnly opens just NVRTC (for compile-only checks without a GPU).
func loadNVRTCOnly(libDir string) (*nvrtcFns, string, error) {
	h, p, err := openNVRTC(searchDirs(libDir, testLibDirs))
	if err != nil {
		return nil, "", err
	}
	var f nvrtcFns
	if err := f.load(h); err != nil {
		return nil, "", fmt.Errorf("cuda: %s: %v", p, err)
	}
	return &f, p, nil
}

// Available reports whether a CUDA GPU can be used: the driver, NVRTC and
// cuBLAS load and the driver reports at least one device. When it returns
// false, the error says what is missing (this is what CPU-only CI sees).
// libDir may be empty (then the dynamic loader's default search).
func Available(libDir string) (bool, error) {
	l, err := loadLibs(libDir)
	if err != nil {
		return false, err
	}
	n, err := l.drv.deviceCount()
	if err != nil {
		return false, err
	}
	if n == 0 {
		return false, errors.New("cuda: the driver loaded but reports no CUDA device")
	}
	return true, nil
}
