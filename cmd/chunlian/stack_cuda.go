package main

// stack_cuda.go wires the CUDA backend (package cuda) into the stack:
// --backend cuda, and --backend auto choosing CUDA when a GPU is usable.

import (
	"cmp"
	"fmt"
	"os"
	"strconv"
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
	Device         int           // CUDA device ordinal among the visible ones (CUDA_VISIBLE_DEVICES applies first)
	LibDir         string        // extra directory for libcuda/libnvrtc/libcublas (--cuda-lib-dir, registerModel)
	NVRTCTarget    string        // "" | cubin | ptx (--cuda-nvrtc-target, registerModel)
	MemoryFraction float64       // like vLLM's gpu_memory_utilization (used when --kv-cache-memory is 0)
	MaxBlocks      int           // cap on KV blocks per engine; 0 = none, -1 = cudaCacheTokens' worth
	Precision      string        // bf16 | tf32 | fp32 (--gpu-precision, registerModel)
	HandoffSpin    time.Duration // cuda.Options.HandoffSpin (0 = its default, < 0 = no polling)
	GroupedFrom    int           // cuda.Options.GroupedAttentionFrom (0 = its default, < 0 = never)
}

// cudaDefaultBlockSize is the CUDA backend's default KV block size, shown
// in --block-size's help.
const cudaDefaultBlockSize = cuda.DefaultBlockSize

func defaultCUDAConfig() cudaConfig {
	return cudaConfig{MemoryFraction: 0.9, Precision: "bf16", MaxBlocks: -1}
}

// cudaCacheTokens caps each engine's KV cache unless --gpu-max-blocks is
// given: the 4,096 sequences of --max-num-seqs at 64 tokens each, where a
// couplet's sequences hold 21-26 (docs/DECISIONS.md, "KV block size").
const cudaCacheTokens = 1 << 18

// maxBlocks is the cap on KV blocks of blockSize tokens (0 = none).
func (c cudaConfig) maxBlocks(blockSize int) int {
	if c.MaxBlocks < 0 {
		return cudaCacheTokens / blockSize
	}
	return c.MaxBlocks
}

// register registers the GPU tuning flags (serve only).
func (c *cudaConfig) register(fs *pflag.FlagSet) {
	fs.Float64Var(&c.MemoryFraction, "gpu-memory-utilization", c.MemoryFraction, "CUDA: fraction of GPU memory for weights + activations + KV cache when --kv-cache-memory is 0")
	fs.IntVar(&c.MaxBlocks, "gpu-max-blocks", c.MaxBlocks, fmt.Sprintf("CUDA: cap on KV cache blocks per engine (-1 = %d tokens' worth at the block size; 0 = no cap)", cudaCacheTokens))
	fs.IntVar(&c.GroupedFrom, "gpu-grouped-attention-from", c.GroupedFrom, fmt.Sprintf("CUDA: steps of at least this many tokens compute attention scores with 8 lanes per key, smaller ones with one key per lane (0 = default %d; negative = never)", cuda.DefaultGroupedAttentionFrom))
	fs.DurationVar(&c.HandoffSpin, "gpu-handoff-spin", c.HandoffSpin, "CUDA: how long the CUDA thread and its caller poll before parking (0 = default 2ms, negative = never; a launched step's wait polls its done word up to 20ms unless negative)")
}

// newCUDABackend builds engine loop i's CUDA backend (of n on the device)
// from the stack config, with kv bytes of KV cache (0: sized from
// --gpu-memory-utilization, which the n backends share: backend i fills
// the device up to (i+1)/n of it).
func newCUDABackend(cfg stackConfig, m *model.Model, kv int64, i, n int) (forward.Backend, error) {
	return cuda.New(m, cudaOptions(cfg, kv, i, n))
}

// cudaOptions is engine loop i's cuda.Options (see newCUDABackend).
func cudaOptions(cfg stackConfig, kv int64, i, n int) cuda.Options {
	return cuda.Options{
		Device:               cfg.CUDA.Device,
		LibDir:               cfg.CUDA.LibDir,
		BlockSize:            cfg.BlockSize,
		KVCacheBytes:         kv,
		MemoryFraction:       cfg.CUDA.MemoryFraction * float64(i+1) / float64(n),
		MaxBlocks:            cfg.CUDA.maxBlocks(cmp.Or(cfg.BlockSize, cuda.DefaultBlockSize)),
		Precision:            cfg.CUDA.Precision,
		EagerOnly:            cfg.Experimental.Has(featCUDAEager),
		GateUpBF16:           cfg.Experimental.Has(featCUDAGateUp16),
		FusedMLP:             cfg.Experimental.Has(featCUDAFusedMLP),
		FusedMLPNorm:         cfg.Experimental.Has(featCUDAFusedMLPNorm),
		FusedQKVNorm:         cfg.Experimental.Has(featCUDAFusedQKVNorm),
		FineGraphBuckets:     cfg.Experimental.Has(featCUDAFineGraphs),
		HandoffSpin:          cfg.CUDA.HandoffSpin,
		GroupedAttentionFrom: cfg.CUDA.GroupedFrom,
		NVRTCTarget:          cfg.CUDA.NVRTCTarget,
		MaxBatchTokens:       max(cfg.MaxNumBatchedTokens, cfg.MaxNumSeqs),
	}
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
		if cfg.logger != nil { // serve: one log stream (--log-format json stays JSON-only)
			cfg.logger.Info("--backend auto: using cpu", "reason", reason)
		} else {
			fmt.Fprintf(os.Stderr, "chunlian: --backend auto: using cpu (%s)\n", reason)
		}
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

// nvmlIndex maps a CUDA ordinal to NVML's index, which ignores
// CUDA_VISIBLE_DEVICES: entry dev of a numeric CUDA_VISIBLE_DEVICES list,
// else dev itself (UUID lists: NVML and CUDA then agree only on hosts of
// identical GPUs, where both enumerate in PCI order).
func nvmlIndex(dev int, visible string) int {
	if visible == "" {
		return dev
	}
	ids := strings.Split(visible, ",")
	if dev < 0 || dev >= len(ids) {
		return dev
	}
	if n, err := strconv.Atoi(strings.TrimSpace(ids[dev])); err == nil {
		return n
	}
	return dev
}

// gpuHook returns the server's GPU reading (NVML utilisation and memory of
// the device it runs on) when the stack runs on the CUDA backend, else nil.
func gpuHook(st *stack) func() (server.GPUStats, bool) {
	if _, ok := st.Backend.(*cuda.Backend); !ok {
		return nil
	}
	n, err := cuda.OpenNVML(st.Config.CUDA.LibDir)
	if err != nil {
		if st.Config.logger != nil {
			st.Config.logger.Warn("no GPU metrics", "err", err)
		} else {
			fmt.Fprintf(os.Stderr, "chunlian: no GPU metrics: %v\n", err)
		}
		return nil
	}
	idx := nvmlIndex(st.Config.CUDA.Device, os.Getenv("CUDA_VISIBLE_DEVICES"))
	return func() (server.GPUStats, bool) {
		s, err := n.Sample(idx)
		if err != nil {
			return server.GPUStats{}, false
		}
		return server.GPUStats{UtilizationPerc: float64(s.UtilGPU), MemoryUsedBytes: s.MemUsed, MemoryTotalBytes: s.MemTotal}, true
	}
}
