// CPU emulation of the CUDA subset the emulated kernels use, for
// cuda/emu_test.go: draw.cpp runs draw.cu's draw_rows (one block at a time
// on DRAW_THREADS std::threads), llama.cpp llama.cu's attention kernels
// (one warp at a time on 32) and gemm.cu's tensor-core GEMMs (one block
// at a time).
// __syncthreads (and __syncwarp) = the barrier g_bar of the threads that
// run together; warp shuffles and ballots go through an exchange among
// them, so every thread of those must make the same calls (draw.cu
// shuffles in block-uniform code, the attention kernels in warp-uniform
// code); __shared__ = static, the dynamic shared array dp a global.
#include <algorithm>
#include <barrier>
#include <cmath>
#include <math.h>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>
#define WARP 32
typedef long long i64;
static inline float __int_as_float(int x) { float f; memcpy(&f, &x, 4); return f; }
static inline int __float_as_int(float f) { int x; memcpy(&x, &f, 4); return x; }
static inline long long __double_as_longlong(double d) { long long x; memcpy(&x, &d, 8); return x; }
static inline double __longlong_as_double(long long x) { double d; memcpy(&d, &x, 8); return d; }
static inline double __hiloint2double(int hi, int lo) {
    return __longlong_as_double((long long)(((unsigned long long)(unsigned)hi << 32) | (unsigned)lo));
}
// volatile: each operation rounded on its own (no contraction).
static inline float __fdiv_rn(float a, float b) { volatile float r = a / b; return r; }
static inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
static inline float __fsub_rn(float a, float b) { volatile float r = a - b; return r; }
static inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
#define NEG_INF __int_as_float(0xff800000)
struct dim3_ { unsigned x, y; };
thread_local dim3_ threadIdx;
dim3_ blockIdx, blockDim, gridDim;
static std::barrier<>* g_bar;
static inline void __syncthreads() { g_bar->arrive_and_wait(); }
static unsigned long long g_x[1024];
template <typename T> T shfl_from(T v, int src) {
    unsigned long long b = 0;
    memcpy(&b, &v, sizeof(T));
    g_x[threadIdx.x] = b;
    __syncthreads();
    unsigned long long r = g_x[src];
    __syncthreads();
    T out;
    memcpy(&out, &r, sizeof(T));
    return out;
}
// run_threads runs body(t) for t in [0, n) on n threads that share the
// barrier g_bar (__syncthreads) and returns when all have finished: one
// block (or one warp) of an emulated launch at a time, the body looping
// over the grid.
template <typename F> static void run_threads(int n, F body) {
    std::barrier<> bar(n);
    g_bar = &bar;
    std::vector<std::thread> th;
    for (int t = 0; t < n; t++) th.emplace_back([&, t] { body(t); });
    for (auto& x : th) x.join();
}
template <typename T> T __shfl_xor_sync(unsigned, T v, int o) {
    int t = threadIdx.x;
    return shfl_from(v, (t & ~31) | ((t & 31) ^ o));
}
template <typename T> T __shfl_sync(unsigned, T v, int src) {
    int t = threadIdx.x;
    return shfl_from(v, (t & ~31) | (src & 31));
}
static inline unsigned __ballot_sync(unsigned, int p) {
    int t = threadIdx.x;
    g_x[t] = p != 0;
    __syncthreads();
    unsigned r = 0;
    for (int i = 0; i < 32; i++) r |= (unsigned)g_x[(t & ~31) | i] << i;
    __syncthreads();
    return r;
}
static inline void __syncwarp() { __syncthreads(); }
static inline void __threadfence_system() {}
static inline int __ffs(unsigned x) { return x ? __builtin_ctz(x) + 1 : 0; }
static inline float __uint_as_float(unsigned x) { float f; memcpy(&f, &x, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned x; memcpy(&x, &f, 4); return x; }
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(8) float2 { float x, y; };
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
template <typename T> T __ldg(const T* p) { return *p; }
#define __align__(n) __attribute__((aligned(n)))
// gemm.cu's tensor-core and cp.async helpers (it defines them itself
// unless KERNEL_EMULATOR). cp.async copies at once; mma.sync m16n8k16
// (bf16 in, float32 accumulate) passes the warp's fragments through the
// exchange, and each thread computes its own four accumulators from the
// whole tile.
#define KERNEL_EMULATOR
static inline void cp_async16(void* smem, const void* gmem, bool ok) {
    if (ok) memcpy(smem, gmem, 16);
    else memset(smem, 0, 16);
}
static inline void cp_async_commit() {}
template <int N> static inline void cp_async_wait() {}
static unsigned g_frag[1024][6];
static inline float emu_bf(unsigned w, int hi) {
    unsigned u = hi ? (w & 0xffff0000u) : (w << 16);
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline void mma_bf16(float* d, const unsigned* a, const unsigned* b) {
    int self = threadIdx.x, w0 = self & ~31, lane = self & 31;
    for (int i = 0; i < 4; i++) g_frag[self][i] = a[i];
    g_frag[self][4] = b[0];
    g_frag[self][5] = b[1];
    g_bar->arrive_and_wait();
    // A(row, col) is in lane (row % 8)·4 + (col % 8)/2, register
    // (row ≥ 8) + 2·(col ≥ 8); B(k, n) in lane n·4 + (k % 8)/2, register
    // 4 + (k ≥ 8); even columns (k) in the low half.
    auto A = [&](int row, int col) { return emu_bf(g_frag[w0 + (row & 7) * 4 + ((col & 7) >> 1)][(row >> 3) + 2 * (col >> 3)], col & 1); };
    auto B = [&](int k, int n) { return emu_bf(g_frag[w0 + n * 4 + ((k & 7) >> 1)][4 + (k >> 3)], k & 1); };
    int g = lane >> 2, t = lane & 3;
    float out[4];
    for (int e = 0; e < 4; e++) {
        int row = g + (e >= 2 ? 8 : 0), col = 2 * t + (e & 1);
        float s = 0.f;
        for (int k = 0; k < 16; k++) s += A(row, k) * B(k, col);
        out[e] = s;
    }
    g_bar->arrive_and_wait();
    for (int e = 0; e < 4; e++) d[e] += out[e];
}
template <typename T> T __shfl_up_sync(unsigned, T v, int d) {
    int t = threadIdx.x;
    return shfl_from(v, (t & 31) >= d ? t - d : t);
}
using std::max;
using std::min;
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __shared__ static
float dp[1 << 16];
