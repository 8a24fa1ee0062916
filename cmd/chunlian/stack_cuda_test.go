package main

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"chunlian/cuda"
	"chunlian/model"
)

func TestCUDAFlags(t *testing.T) {
	t.Setenv("CHUNLIAN_CUDA_LIB_DIR", "/from/env")
	d := defaultCUDAConfig()
	for _, tc := range []struct {
		args []string
		want cudaConfig
	}{
		{nil, cudaConfig{LibDir: "/from/env", MemoryFraction: d.MemoryFraction, Precision: d.Precision, MaxBlocks: d.MaxBlocks}},
		{[]string{"--cuda-lib-dir", "/x", "--gpu-precision", "fp32", "--gpu-memory-utilization", "0.5", "--gpu-max-blocks", "0", "--cuda-nvrtc-target", "ptx"},
			cudaConfig{LibDir: "/x", NVRTCTarget: "ptx", MemoryFraction: 0.5, Precision: "fp32", MaxBlocks: 0}},
		{[]string{"--gpu-handoff-spin", "-1ns"},
			cudaConfig{LibDir: "/from/env", MemoryFraction: d.MemoryFraction, Precision: d.Precision, MaxBlocks: d.MaxBlocks, HandoffSpin: -1}},
	} {
		if got := parseStack(t, tc.args...).CUDA; got != tc.want {
			t.Errorf("%q: CUDA config %+v, want %+v", tc.args, got, tc.want)
		}
	}
}

// TestBackendCUDAWithoutGPU: --backend cuda fails with the loader's
// explanation where no GPU is usable, and auto falls back to the CPU.
func TestBackendCUDAWithoutGPU(t *testing.T) {
	if ok, _ := cuda.Available(""); ok {
		t.Skip("a CUDA GPU is present: the no-GPU paths do not apply")
	}
	m := model.NewRandom(model.TestConfig(), 3)
	c := parseStack(t, "--backend", "cuda", "--kv-cache-memory", "1MiB")
	if st, err := buildStackFor(c, m); err == nil {
		st.Close()
		t.Fatal("--backend cuda built a stack without a GPU")
	} else if !strings.Contains(err.Error(), "not found") {
		t.Errorf("error does not say what is missing: %v", err)
	}
	c = parseStack(t, "--backend", "auto", "--kv-cache-memory", "1MiB", "--threads", "1")
	st, err := buildStackFor(c, m)
	if err != nil {
		t.Fatalf("--backend auto without a GPU: %v", err)
	}
	defer st.Close()
	if _, ok := st.Backend.(*cuda.Backend); ok {
		t.Error("auto chose CUDA without a GPU")
	}
}

func TestNVMLIndex(t *testing.T) {
	for _, tc := range []struct {
		dev     int
		visible string
		want    int
	}{
		{0, "", 0},
		{3, "", 3},
		{0, "5", 5},
		{1, "4,6", 6},
		{1, " 4, 7 ", 7},
		{0, "GPU-1234abcd", 0}, // UUIDs: same order assumed
		{2, "1", 2},            // out of the list: cuda.New reports the bad ordinal
	} {
		if got := nvmlIndex(tc.dev, tc.visible); got != tc.want {
			t.Errorf("nvmlIndex(%d, %q) = %d, want %d", tc.dev, tc.visible, got, tc.want)
		}
	}
}

func TestDeviceFlag(t *testing.T) {
	// The CHUNLIAN_DEVICE binding is TestEveryFlagHasEnv's.
	for _, tc := range []struct {
		flag    string
		want    int
		wantErr bool
	}{
		{"", 0, false},
		{"3", 3, false},
		{"-1", 0, true},
	} {
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		var c stackConfig
		c.registerModel(fs)
		var args []string
		if tc.flag != "" {
			args = []string{"--device", tc.flag}
		}
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		err := c.Validate()
		if tc.wantErr {
			if err == nil || !strings.Contains(err.Error(), "--device") {
				t.Errorf("flag %q: %v, want an error naming --device", tc.flag, err)
			}
			continue
		}
		if err != nil || c.CUDA.Device != tc.want {
			t.Errorf("flag %q: device %d err %v, want %d", tc.flag, c.CUDA.Device, err, tc.want)
		}
	}
}
