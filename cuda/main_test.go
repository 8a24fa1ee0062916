package cuda

import (
	"os"
	"testing"
)

// TestMain hands the GPU machine's settings to the tests, as the command
// line's --cuda-lib-dir and --cuda-nvrtc-target do for the service:
// CHUNLIAN_CUDA_LIB_DIR (the libraries' directory) is searched after each
// backend's own LibDir, and CHUNLIAN_CUDA_NVRTC_TARGET (cubin or ptx) is
// the NVRTC target of backends that set none. The package itself reads no
// environment.
func TestMain(m *testing.M) {
	testLibDirs = os.Getenv("CHUNLIAN_CUDA_LIB_DIR")
	testNVRTCTarget = os.Getenv("CHUNLIAN_CUDA_NVRTC_TARGET")
	os.Exit(m.Run())
}
