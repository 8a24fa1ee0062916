package main

// stack_cuda.go wires the CUDA backend (package cuda) into the stack:
// --backend cuda, and --backend auto choosing CUDA when a GPU is usable.

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"chunlian/cuda"
	"chunlian/forward"
	"chunlian/model"
	"chunlian/server"
)

// cudaConfig holds the CUDA-only flags (ignored by the CPU backend).
type cudaConfig struct {
	LibDir         string        // extra directory for libcuda/libnvrtc/libcublas (--cuda-lib-dir, registerModel)
	NVRTCTarget    string        // "" | cubin | ptx (--cuda-nvrtc-target, registerModel)
	MemoryFraction float64       // like vLLM's gpu_memory_utilization (used when --kv-cache-memory is 0)
	MaxBlocks      int           // cap on KV blocks; 0 = none
	Precision      string        // tf32 | fp32
	HandoffSpin    time.Duration // cuda.Options.HandoffSpin (0 = its default, < 0 = no polling)
}

// cudaDefaultBlockSize is the CUDA backend's default KV block size, shown
// in --block-size's help.
const cudaDefaultBlockSize = cuda.DefaultBlockSize

func defaultCUDAConfig() cudaConfig {
	return cudaConfig{MemoryFraction: 0.9, Precision: "tf32", MaxBlocks: 1 << 16}
}

// register registers the GPU tuning flags (serve only).
func (c *cudaConfig) register(fs *pflag.FlagSet) {
	fs.Float64Var(&c.MemoryFraction, "gpu-memory-utilization", c.MemoryFraction, "CUDA: fraction of GPU memory for weights + activations + KV cache when --kv-cache-memory is 0")
	fs.IntVar(&c.MaxBlocks, "gpu-max-blocks", c.MaxBlocks, "CUDA: cap on KV cache blocks (0 = no cap)")
	fs.StringVar(&c.Precision, "gpu-precision", c.Precision, "CUDA GEMM precision: tf32 (tensor cores, fp32 accumulate) or fp32")
	fs.DurationVar(&c.HandoffSpin, "gpu-handoff-spin", c.HandoffSpin, "CUDA: how long the CUDA thread and its caller poll before parking (0 = default 2ms, negative = never; a launched step's wait polls its done word up to 20ms unless negative)")
}

// newCUDABackend builds the CUDA backend from the stack config.
func newCUDABackend(cfg stackConfig, m *model.Model) (forward.Backend, error) {
	return cuda.New(m, cuda.Options{
		LibDir:         cfg.CUDA.LibDir,
		BlockSize:      cfg.BlockSize,
		KVCacheBytes:   int64(cfg.KVCacheBytes),
		MemoryFraction: cfg.CUDA.MemoryFraction,
		MaxBlocks:      cfg.CUDA.MaxBlocks,
		Precision:      cfg.CUDA.Precision,
		HandoffSpin:    cfg.CUDA.HandoffSpin,
		NVRTCTarget:    cfg.CUDA.NVRTCTarget,
		MaxBatchTokens: max(cfg.MaxNumBatchedTokens, cfg.MaxNumSeqs),
	})
}

// autoBackendIsCUDA reports whether --backend auto should pick CUDA, and
// logs why not when it does not.
func autoBackendIsCUDA(cfg stackConfig) bool {
	ok, err := cuda.Available(cfg.CUDA.LibDir)
	if !ok {
		// On a machine without a GPU this is the normal case: one short line,
		// not the whole search path (--backend cuda prints that in full).
		reason := firstLine(err)
		if i := strings.Index(reason, " (tried"); i > 0 {
			reason = reason[:i]
		}
		fmt.Fprintf(os.Stderr, "chunlian: --backend auto: using cpu (%s)\n", reason)
	}
	return ok
}

func firstLine(err error) string {
	if err == nil {
		return "no GPU"
	}
	s := err.Error()
	for i, c := range s {
		if c == '\n' {
			return s[:i]
		}
	}
	return s
}

// gpuHook returns the server's GPU reading (NVML utilisation and memory of
// device 0) when the stack runs on the CUDA backend, else nil.
func gpuHook(st *stack) func() (server.GPUStats, bool) {
	if _, ok := st.Backend.(*cuda.Backend); !ok {
		return nil
	}
	n, err := cuda.OpenNVML(st.Config.CUDA.LibDir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "chunlian: no GPU metrics: %v\n", err)
		return nil
	}
	return func() (server.GPUStats, bool) {
		s, err := n.Sample(0)
		if err != nil {
			return server.GPUStats{}, false
		}
		return server.GPUStats{UtilizationPerc: float64(s.UtilGPU), MemoryUsedBytes: s.MemUsed, MemoryTotalBytes: s.MemTotal}, true
	}
}
