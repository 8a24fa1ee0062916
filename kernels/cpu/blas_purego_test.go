//go:build linux || darwin

package cpu

import (
	"slices"
	"testing"
)

func TestBLASCandidates(t *testing.T) {
	if isDarwin {
		t.Skip("library names differ on darwin")
	}
	for _, tc := range []struct {
		explicit, ldPath string
		want             []string
	}{
		{"", "", []string{"libopenblas.so.0", "libopenblas.so"}},
		{"/opt/x/libopenblas.so.0", "", []string{"/opt/x/libopenblas.so.0", "libopenblas.so.0", "libopenblas.so"}},
		{"", "/a::/b", []string{"/a/libopenblas.so.0", "/a/libopenblas.so", "/b/libopenblas.so.0", "/b/libopenblas.so",
			"libopenblas.so.0", "libopenblas.so"}},
	} {
		t.Setenv("CHUNLIAN_OPENBLAS", tc.explicit)
		t.Setenv("LD_LIBRARY_PATH", tc.ldPath)
		if got := blasCandidates(); !slices.Equal(got, tc.want) {
			t.Errorf("CHUNLIAN_OPENBLAS=%q LD_LIBRARY_PATH=%q: candidates %v, want %v", tc.explicit, tc.ldPath, got, tc.want)
		}
	}
}

func TestBLASSelfTest(t *testing.T) {
	if !blasAvailable() {
		t.Skip("OpenBLAS not installed (apt-get install libopenblas0-pthread)")
	}
	t.Logf("OpenBLAS loaded from %s", blasLibPath)
	blasMu.Lock()
	defer blasMu.Unlock()
	if !blasSelfTest() {
		t.Fatal("self-test failed on the loaded library")
	}
}
