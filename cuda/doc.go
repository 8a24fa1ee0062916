// Package cuda is a forward.Backend on an NVIDIA GPU, for CGO_ENABLED=0
// binaries: the CUDA driver (libcuda.so.1), NVRTC (libnvrtc.so.13) and
// cuBLAS (libcublas.so.13 + libcublasLt.so.13) are dlopened at run time
// through github.com/ebitengine/purego, and NVML (libnvidia-ml.so.1) for
// utilisation and memory readings.
//
// Library search, in order: Options.LibDir (the --cuda-lib-dir flag, or
// CHUNLIAN_CUDA_LIB_DIR through the command line), then the dynamic
// loader's own search (LD_LIBRARY_PATH, ld.so.cache, system dirs); the
// package reads no environment. Available reports false with an error naming every missing
// library and the paths tried; that is what CPU-only machines see, and the
// GPU tests skip on it.
//
// Threading: one worker goroutine per Backend, locked to its OS thread,
// owns the CUDA context (the device's primary context), the stream, the
// cuBLAS handle and all device memory, and makes every CUDA call; the
// forward.Backend methods hand it closures over a channel, both sides
// polling briefly before they park (handoff.go).
//
// C calls: every driver, cuBLAS and NVML call goes through purego.SyscallN,
// directly or through driverFns.call / sc. An out-parameter is passed as
// uintptr(unsafe.Pointer(&x)); that is only safe in a call to a function
// declared //go:uintptrescapes (it moves x to the heap, where a stack copy
// during the call cannot leave C writing x's old address). SyscallN, call
// and sc carry it; a new wrapper that takes such uintptrs must carry it
// too (TestWrappersKeepOutParamsOffTheStack).
//
// Data on the device, float32 unless noted: the weights in Hugging Face [out, in]
// layout with Q/K/V and gate/up rows stacked into one matrix each; a RoPE
// cos/sin table; bf16 copies of the weight matrices when the model is
// exactly bf16 (for the GEMV path below); the paged KV cache as one allocation
// [2·layers, numBlocks+1, blockSize, nKVHeads, headDim] (block numBlocks is
// reserved for graph padding); activation buffers sized for the largest
// batch seen. Each step copies one int32 metadata buffer in (tokens,
// positions, slots, token→sequence, logits rows, block tables) and the
// requested logits rows out (into the caller's buffer, page-locked once).
//
// Kernels (kernels/llama.cu, compiled by NVRTC at start for the device's
// sm_XY with the head dimension as a macro): embedding gather, RMSNorm
// (optionally gathering the sampled rows before the LM head), RoPE, the
// paged K/V store and paged attention in one kernel (one warp per token and
// query head, 32 keys per warp step, online softmax over keys 0..position
// through the block table: prefill, chunked prefill and decode alike; from
// Options.GroupedAttentionFrom tokens a step, 8 lanes score each key
// together),
// SwiGLU, block copy for copy-on-write, and the row log-sum-exp (the
// engine reads it as forward.RowLSEBackend). GEMMs go through cublasGemmEx (by
// default bf16 weights and inputs, the kernel before each GEMM writing its
// output as bf16, with float32 accumulation; TF32 tensor cores with
// Options.Precision "tf32", or strict float32); the residual adds ride on the GEMMs
// (beta = 1). Steps of up to 8192 tokens
// run as CUDA graphs captured per padded size (graph.go). Steps of one
// token (gemvUpTo) run instead on fused GEMV kernels, 5 launches per
// layer (gemv.go), with programmatic dependent launches where the device
// has them.
//
// Device draws (draw.go, kernels/draw.cu; forward.DrawBackend): ForwardDraw
// runs the step, then draw_rows draws each forward.Draw from its logits row
// on the GPU (sampler.DrawRow's definition: mask, temperature, top-k/top-p
// by rejection rounds over an id-order prefix sum, min-p; one block per
// draw, the row's probabilities in shared memory, so V·4 bytes must fit:
// DrawVocab), gather_rows packs the rows the host still reads, and only
// the draws' tokens and logits, the log-sum-exps and those rows come back.
// Allowed-token sets live on the device (RegisterMask, up to 64).
// LaunchDraw/WaitDraw (async.go; forward.AsyncDrawBackend) split ForwardDraw
// so that two steps can be in flight on slots 0 and 1: the launch hands
// the step to the worker and returns at once (the worker packs the
// metadata into page-locked per-slot staging and enqueues everything,
// ending with mark_done, which sets the slot's page-locked done word);
// the wait polls that word on the caller's goroutine and copies the
// results out of the slot's staging, falling back to an event sync on the
// worker only after 20 ms. CopyBlocks is handed over without waiting too.
// Forward and ForwardDraw refuse to run while a launch is outstanding.
//
// Figures on an H200: docs/BENCHMARKS.md (scripts/gpu.sh reproduces
// them).
package cuda
