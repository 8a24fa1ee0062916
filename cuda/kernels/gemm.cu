// ---------------------------------------------------------------------------
// Tensor-core GEMMs with fused prologues and epilogues for the cuBLAS path
// (Options.FusedMLP, FusedMLPNorm, FusedQKVNorm). This file is appended to
// llama.cu (after draw.cu) into one NVRTC program, so it uses llama.cu's
// f2bf, silu_up, WARP and i64.
//
// One kernel body, y = x · Wᵀ for x [M, K] and W [N, K] in bf16 with
// float32 products and sums (mma.sync m16n8k16), and two switches:
//   NORM: x is the float32 residual stream and the rows are RMSNorm'ed on
//         the way: RMSNorm(x)·Wᵀ = inv_rms · ((x ⊙ nw)·Wᵀ), so each stage's
//         tile is scaled by the norm weight nw and rounded to bf16 as it
//         enters shared memory (from registers loaded a stage ahead), the
//         rows' sums of squares come from the same loads, and the
//         accumulators are scaled by 1/sqrt(mean(x²) + eps) at the end; one
//         rounding of x ⊙ nw instead of one of the normalised row, the same
//         relative error. Without NORM, x is bf16 and its tiles go straight
//         to shared memory (cp.async), as W's always do.
//   SILU: W's rows are gate and up rows interleaved and the output is bf16
//         act [M, N/2] = SiLU(gate)·up: the MLP's float32 gate/up
//         activations stay in registers and silu_mul is not launched.
//         Without SILU the output is float32 y [M, N] (the QKV projection).
// The arithmetic is the unfused path's up to the order of the sums.
// ---------------------------------------------------------------------------

#define TC_BM 64         // tokens per block
#define TC_BN 128        // output columns per block
#define TC_BK 32         // K per stage
#define TC_STAGES 3      // stages in flight (cp.async)
#define TC_THREADS 256   // 8 warps: 2 (tokens) × 4 (columns), 32 × 32 each
#define TC_LD (TC_BK + 8) // shared row pitch in bf16: the fragment loads hit 32 banks

#ifndef KERNEL_EMULATOR
// mma_bf16: d += a · b for one m16n8k16 tile, bf16 inputs and float32
// accumulators in the PTX fragment layouts (g = lane / 4, t = lane % 4):
// a[0] row g cols 2t..2t+1, a[1] row g+8, a[2] row g cols 2t+8.., a[3]
// row g+8 cols 2t+8..; b[0] k 2t..2t+1 col g, b[1] k 2t+8..; d[0..1] row g
// cols 2t, 2t+1, d[2..3] row g+8. Called by the whole warp.
__device__ __forceinline__ void mma_bf16(float* d, const unsigned* a, const unsigned* b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// cp_async16 copies 16 bytes from global to shared memory without
// passing through registers (zeros instead when !ok); cp_async_commit
// closes this thread's group of copies, cp_async_wait<N> waits until at
// most N of its groups are in flight.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool ok) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }
#endif

__device__ __forceinline__ unsigned lds32(const unsigned short* p) { return *reinterpret_cast<const unsigned*>(p); }

// gemm_tc_t: the body of the entry points below (see the file comment).
// x16 [M, K] bf16 (without NORM) or x32 [M, K] float32 and nw [K] (NORM);
// W [N, K] bf16; out as the entry points say. TC_STAGES stages of the x
// and W tiles are in flight in a ring of shared buffers, one barrier a
// stage.
static_assert(TC_BM == TC_THREADS / 4 && TC_BN == 2 * TC_BM && TC_BK == 32,
              "gemm_tc_t's loads: a thread moves 8 bf16 of one x row and of two W rows a stage");
template <bool NORM, bool SILU>
__device__ __forceinline__ void gemm_tc_t(void* __restrict__ out, const unsigned short* __restrict__ x16,
                                          const float* __restrict__ x32, const float* __restrict__ nw, float eps,
                                          const unsigned short* __restrict__ W, int M, int K, int N) {
    __shared__ __align__(16) unsigned short As[TC_STAGES][TC_BM * TC_LD];
    __shared__ __align__(16) unsigned short Bs[TC_STAGES][TC_BN * TC_LD];
    __shared__ float invs[TC_BM];
    // Launched after cuBLAS, so never early itself; this lets the kernel
    // after it (attention after gemm_norm) launch while it runs.
    pdl_wait();
    int tid = threadIdx.x, lane = tid & (WARP - 1), warp = tid / WARP;
    int wm = warp / 4, wn = warp % 4;
    int g = lane >> 2, t = lane & 3;
    int m0 = blockIdx.x * TC_BM, n0 = blockIdx.y * TC_BN;
    // This thread's 16-byte pieces of a stage: row tid/4 of the x tile and
    // rows tid/4 and TC_BM + tid/4 of the W tile, 8 bf16 from (tid % 4) · 8.
    int r = tid >> 2, k8 = (tid & 3) * 8;
    bool aok = m0 + r < M, b0ok = n0 + r < N, b1ok = n0 + TC_BM + r < N;
    i64 arow = (i64)min(m0 + r, M - 1) * K + k8;
    const unsigned short* bg0 = W + (i64)min(n0 + r, N - 1) * K + k8;
    const unsigned short* bg1 = W + (i64)min(n0 + TC_BM + r, N - 1) * K + k8;
    int nk = K / TC_BK;
    auto load = [&](int kt) { // stage kt into buffer kt % TC_STAGES
        if (kt < nk) {
            int s = kt % TC_STAGES, o = kt * TC_BK;
            if (!NORM) cp_async16(&As[s][r * TC_LD + k8], x16 + arow + o, aok);
            cp_async16(&Bs[s][r * TC_LD + k8], bg0 + o, b0ok);
            cp_async16(&Bs[s][(TC_BM + r) * TC_LD + k8], bg1 + o, b1ok);
        }
        cp_async_commit(); // an empty group past the end keeps the count
    };
    // NORM: this thread's 8 floats of stage kt (zeros past M) and its
    // row's partial sum of squares.
    const float4 zero4 = make_float4(0.f, 0.f, 0.f, 0.f);
    float4 xa = zero4, xb = zero4;
    float ss = 0.f;
    auto loadX = [&](int kt) {
        if (NORM && kt < nk && aok) {
            const float4* p = reinterpret_cast<const float4*>(x32 + arow + kt * TC_BK);
            xa = p[0];
            xb = p[1];
        }
    };
    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.f;
#pragma unroll
    for (int kt = 0; kt < TC_STAGES - 1; kt++) load(kt);
    loadX(0);
    for (int kt = 0; kt < nk; kt++) {
        if (NORM) { // stage kt's x tile: its buffer was last read TC_STAGES stages ago
            const float* w = nw + kt * TC_BK + k8;
            float v[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
            unsigned u[4];
#pragma unroll
            for (int e = 0; e < 8; e += 2) {
                ss += v[e] * v[e] + v[e + 1] * v[e + 1];
                u[e / 2] = (unsigned)f2bf(v[e] * w[e]) | ((unsigned)f2bf(v[e + 1] * w[e + 1]) << 16);
            }
            *reinterpret_cast<uint4*>(&As[kt % TC_STAGES][r * TC_LD + k8]) = make_uint4(u[0], u[1], u[2], u[3]);
        }
        cp_async_wait<TC_STAGES - 2>(); // stage kt has landed (this thread's part)
        __syncthreads();                 // everyone's part; stage kt-1's buffer is free
        load(kt + TC_STAGES - 1);
        loadX(kt + 1);
        const unsigned short* A = As[kt % TC_STAGES];
        const unsigned short* B = Bs[kt % TC_STAGES];
#pragma unroll
        for (int kk = 0; kk < TC_BK; kk += 16) {
            unsigned a[2][4], b[4][2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const unsigned short* p = A + (wm * 32 + i * 16 + g) * TC_LD + kk + 2 * t;
                a[i][0] = lds32(p);
                a[i][1] = lds32(p + 8 * TC_LD);
                a[i][2] = lds32(p + 8);
                a[i][3] = lds32(p + 8 * TC_LD + 8);
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const unsigned short* p = B + (wn * 32 + j * 8 + g) * TC_LD + kk + 2 * t;
                b[j][0] = lds32(p);
                b[j][1] = lds32(p + 8);
            }
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) mma_bf16(acc[i][j], a[i], b[j]);
        }
    }
    // NORM: each row's scale, from the sums of squares of the four
    // threads that loaded it (neighbouring lanes).
    if (NORM) {
        ss += __shfl_xor_sync(0xffffffffu, ss, 1);
        ss += __shfl_xor_sync(0xffffffffu, ss, 2);
        if ((tid & 3) == 0) invs[r] = 1.0f / sqrtf(ss / (float)K + eps);
        __syncthreads();
    }
    // Accumulators (2t, 2t+1) of a tile are neighbouring columns: with
    // SILU a gate column and its up column, output column (n0 + wn·32 +
    // j·8 + 2t) / 2.
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int lr = wm * 32 + i * 16 + g, row = m0 + lr;
        float s0 = NORM ? invs[lr] : 1.f, s1 = NORM ? invs[lr + 8] : 1.f;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int col = n0 + wn * 32 + j * 8 + 2 * t;
            if (col >= N) continue;
            float c0 = acc[i][j][0] * s0, c1 = acc[i][j][1] * s0;
            float c2 = acc[i][j][2] * s1, c3 = acc[i][j][3] * s1;
            if (SILU) {
                unsigned short* act = reinterpret_cast<unsigned short*>(out);
                int h = N / 2;
                if (row < M) act[(i64)row * h + col / 2] = f2bf(silu_up(c0, c1));
                if (row + 8 < M) act[(i64)(row + 8) * h + col / 2] = f2bf(silu_up(c2, c3));
            } else {
                float2* y = reinterpret_cast<float2*>(out);
                if (row < M) y[((i64)row * N + col) / 2] = make_float2(c0, c1);
                if (row + 8 < M) y[((i64)(row + 8) * N + col) / 2] = make_float2(c2, c3);
            }
        }
    }
}

// The entry points. N is even (column pairs); K % TC_BK == 0. grid =
// (ceil(M / TC_BM), ceil(N / TC_BN)), block = TC_THREADS; tiles past M or
// N read zeros there and write nothing.
//   gemm_gu_silu      act [M, N/2] bf16 = SiLU·up of x16 [M, K] bf16
//   gemm_gu_silu_norm the same of RMSNorm(x [M, K] float32) with nw, eps
//   gemm_norm         y [M, N] float32 = RMSNorm(x)·Wᵀ
extern "C" __global__ void __launch_bounds__(TC_THREADS)
    gemm_gu_silu(unsigned short* __restrict__ act, const unsigned short* __restrict__ x,
                 const unsigned short* __restrict__ W, int M, int K, int N) {
    gemm_tc_t<false, true>(act, x, 0, 0, 0.f, W, M, K, N);
}

extern "C" __global__ void __launch_bounds__(TC_THREADS)
    gemm_gu_silu_norm(unsigned short* __restrict__ act, const float* __restrict__ x, const float* __restrict__ nw,
                      float eps, const unsigned short* __restrict__ W, int M, int K, int N) {
    gemm_tc_t<true, true>(act, 0, x, nw, eps, W, M, K, N);
}

extern "C" __global__ void __launch_bounds__(TC_THREADS)
    gemm_norm(float* __restrict__ y, const float* __restrict__ x, const float* __restrict__ nw, float eps,
              const unsigned short* __restrict__ W, int M, int K, int N) {
    gemm_tc_t<true, false>(y, 0, x, nw, eps, W, M, K, N);
}
