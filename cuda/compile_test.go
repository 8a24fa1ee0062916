package cuda

import (
	"os"
	"strings"
	"testing"
)

// TestKernelsCompile compiles the embedded kernels with whatever NVRTC is
// found (no GPU needed), for several head sizes, so a syntax error shows up
// on any machine that has NVRTC. It skips when NVRTC is absent (CPU CI).
func TestKernelsCompile(t *testing.T) {
	f, path, err := loadNVRTCOnly("")
	if err != nil {
		t.Skipf("NVRTC not available: %v", err)
	}
	maj, min := f.Version()
	t.Logf("NVRTC %d.%d from %s", maj, min, path)
	for _, tc := range []struct {
		headDim int
		arch    string
	}{
		{64, "compute_80"},
		{32, "compute_80"},
		{16, "compute_80"},
		{48, "compute_80"},
		{128, "sm_80"},
		// CHUNLIAN_CUDA_TEST_ARCH (e.g. sm_90) adds the device's own CUBIN
		// target: run it alone first to learn whether the device's NVRTC
		// compiles the kernels natively.
		{64, os.Getenv("CHUNLIAN_CUDA_TEST_ARCH")},
	} {
		if tc.arch == "" {
			continue
		}
		res, err := f.compileSource("llama.cu", kernelSource, tc.arch, kernelOptions(tc.headDim))
		if err != nil {
			t.Fatalf("headDim %d arch %s: %v", tc.headDim, tc.arch, err)
		}
		if len(res.image) < 100 {
			t.Fatalf("headDim %d: image only %d bytes", tc.headDim, len(res.image))
		}
		if !res.cubin {
			ptx := string(res.image)
			for _, k := range kernelNames {
				if !strings.Contains(ptx, ".entry "+k) {
					t.Errorf("headDim %d: PTX has no entry %s", tc.headDim, k)
				}
			}
		}
		if res.log != "" {
			t.Logf("headDim %d log: %s", tc.headDim, res.log)
		}
	}
}
