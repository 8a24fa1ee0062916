//go:build linux || darwin

package cpu

import (
	"slices"
	"testing"
)

// The candidates are the bare sonames: the dynamic loader's own search
// (LD_LIBRARY_PATH included) finds the library.
func TestBLASCandidates(t *testing.T) {
	if isDarwin {
		t.Skip("library names differ on darwin")
	}
	if got, want := blasCandidates(), []string{"libopenblas.so.0", "libopenblas.so"}; !slices.Equal(got, want) {
		t.Errorf("candidates %v, want %v", got, want)
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
