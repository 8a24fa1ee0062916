package main

import (
	"strings"
	"testing"

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
