// ---------------------------------------------------------------------------
// The MLP's first half on tensor cores (Options.FusedMLP). This file is
// appended to llama.cu (after draw.cu) into one NVRTC program, so it uses
// llama.cu's f2bf and i64.
//
// gemm_gu_silu is the gate/up GEMM of the cuBLAS path with SiLU·up in its
// epilogue: the float32 gate and up activations stay in registers instead
// of going to memory and back through silu_mul. The arithmetic is the
// unfused path's (bf16 inputs, float32 products and sums, SiLU in float32,
// one rounding to bf16); only the order of the sums differs.
// ---------------------------------------------------------------------------

#define MLP_BM 64        // tokens per block
#define MLP_BN 128       // interleaved gate/up columns per block (64 outputs)
#define MLP_BK 32        // K per stage
#define MLP_STAGES 3     // stages in flight (cp.async)
#define MLP_THREADS 256  // 8 warps: 2 (tokens) × 4 (columns), 32 × 32 each
#define MLP_LD (MLP_BK + 8) // shared row pitch in bf16: the fragment loads hit 32 banks

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

// gemm_gu_silu: act[m, j] = bf16(silu(g) · u) with g = x[m] · W[2j] and
// u = x[m] · W[2j + 1]: x [M, K] bf16 (the normalised rows); W [2·ffn, K]
// bf16, the gate and up rows interleaved; act [M, ffn] bf16.
// K % MLP_BK == 0. grid = (ceil(M / MLP_BM), ceil(2·ffn / MLP_BN)),
// block = MLP_THREADS; tiles past M or 2·ffn read zeros there and write
// nothing. MLP_STAGES stages of the x and W tiles are in flight (cp.async
// into a ring of shared buffers, one barrier a stage).
//
// gemm_gu_silu_norm is the same with the MLP's RMSNorm folded in: x is the
// float32 residual stream and the rows are normalised on the way, as
// RMSNorm(x)·W = inv_rms · ((x ⊙ nw)·W): each stage's x tile is scaled by
// the norm weight nw and rounded to bf16 as it enters shared memory (from
// registers loaded a stage ahead), the sums of squares of the rows are
// gathered from the same loads, and the accumulators are scaled by
// 1/sqrt(mean(x²) + eps) before SiLU·up. One rounding to bf16 of x ⊙ nw
// instead of one of the normalised row: the same relative error.
template <bool NORM>
__device__ __forceinline__ void gemm_gu_silu_t(unsigned short* __restrict__ act, const unsigned short* __restrict__ x16,
                                               const float* __restrict__ x32, const float* __restrict__ nw, float eps,
                                               const unsigned short* __restrict__ W, int M, int K, int ffn) {
    __shared__ __align__(16) unsigned short As[MLP_STAGES][MLP_BM * MLP_LD];
    __shared__ __align__(16) unsigned short Bs[MLP_STAGES][MLP_BN * MLP_LD];
    __shared__ float invs[MLP_BM];
    int tid = threadIdx.x, lane = tid & (WARP - 1), warp = tid / WARP;
    int wm = warp / 4, wn = warp % 4;
    int g = lane >> 2, t = lane & 3;
    int m0 = blockIdx.x * MLP_BM, n0 = blockIdx.y * MLP_BN;
    // This thread's 16-byte pieces of a stage: row tid/4 of the x tile and
    // rows tid/4 and 64 + tid/4 of the W tile, 8 bf16 from (tid % 4) · 8.
    int r = tid >> 2, k8 = (tid & 3) * 8, N = 2 * ffn;
    bool aok = m0 + r < M, b0ok = n0 + r < N, b1ok = n0 + 64 + r < N;
    i64 arow = (i64)min(m0 + r, M - 1) * K + k8;
    const unsigned short* bg0 = W + (i64)min(n0 + r, N - 1) * K + k8;
    const unsigned short* bg1 = W + (i64)min(n0 + 64 + r, N - 1) * K + k8;
    int nk = K / MLP_BK;
    auto load = [&](int kt) { // stage kt into buffer kt % MLP_STAGES
        if (kt < nk) {
            int s = kt % MLP_STAGES, o = kt * MLP_BK;
            if (!NORM) cp_async16(&As[s][r * MLP_LD + k8], x16 + arow + o, aok);
            cp_async16(&Bs[s][r * MLP_LD + k8], bg0 + o, b0ok);
            cp_async16(&Bs[s][(64 + r) * MLP_LD + k8], bg1 + o, b1ok);
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
            const float4* p = reinterpret_cast<const float4*>(x32 + arow + kt * MLP_BK);
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
    for (int kt = 0; kt < MLP_STAGES - 1; kt++) load(kt);
    loadX(0);
    for (int kt = 0; kt < nk; kt++) {
        if (NORM) { // stage kt's x tile: its buffer was last read MLP_STAGES stages ago
            const float* w = nw + kt * MLP_BK + k8;
            float v[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
            unsigned u[4];
#pragma unroll
            for (int e = 0; e < 8; e += 2) {
                ss += v[e] * v[e] + v[e + 1] * v[e + 1];
                u[e / 2] = (unsigned)f2bf(v[e] * w[e]) | ((unsigned)f2bf(v[e + 1] * w[e + 1]) << 16);
            }
            *reinterpret_cast<uint4*>(&As[kt % MLP_STAGES][r * MLP_LD + k8]) = make_uint4(u[0], u[1], u[2], u[3]);
        }
        cp_async_wait<MLP_STAGES - 2>(); // stage kt has landed (this thread's part)
        __syncthreads();                 // everyone's part; stage kt-1's buffer is free
        load(kt + MLP_STAGES - 1);
        loadX(kt + 1);
        const unsigned short* A = As[kt % MLP_STAGES];
        const unsigned short* B = Bs[kt % MLP_STAGES];
#pragma unroll
        for (int kk = 0; kk < MLP_BK; kk += 16) {
            unsigned a[2][4], b[4][2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const unsigned short* p = A + (wm * 32 + i * 16 + g) * MLP_LD + kk + 2 * t;
                a[i][0] = lds32(p);
                a[i][1] = lds32(p + 8 * MLP_LD);
                a[i][2] = lds32(p + 8);
                a[i][3] = lds32(p + 8 * MLP_LD + 8);
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const unsigned short* p = B + (wn * 32 + j * 8 + g) * MLP_LD + kk + 2 * t;
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
    // Accumulator pairs (2t, 2t+1) of a tile are a gate column and its up
    // column: output column (n0 + wn·32 + j·8 + 2t) / 2.
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int lr = wm * 32 + i * 16 + g, row = m0 + lr;
        float s0 = NORM ? invs[lr] : 1.f, s1 = NORM ? invs[lr + 8] : 1.f;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int col = (n0 + wn * 32 + j * 8 + 2 * t) / 2;
            if (col >= ffn) continue;
            float g0 = acc[i][j][0] * s0, u0 = acc[i][j][1] * s0;
            float g1 = acc[i][j][2] * s1, u1 = acc[i][j][3] * s1;
            if (row < M) act[(i64)row * ffn + col] = f2bf(g0 / (1.0f + expf(-g0)) * u0);
            if (row + 8 < M) act[(i64)(row + 8) * ffn + col] = f2bf(g1 / (1.0f + expf(-g1)) * u1);
        }
    }
}

extern "C" __global__ void __launch_bounds__(MLP_THREADS)
    gemm_gu_silu(unsigned short* __restrict__ act, const unsigned short* __restrict__ x,
                 const unsigned short* __restrict__ W, int M, int K, int ffn) {
    gemm_gu_silu_t<false>(act, x, 0, 0, 0.f, W, M, K, ffn);
}

extern "C" __global__ void __launch_bounds__(MLP_THREADS)
    gemm_gu_silu_norm(unsigned short* __restrict__ act, const float* __restrict__ x, const float* __restrict__ nw,
                      float eps, const unsigned short* __restrict__ W, int M, int K, int ffn) {
    gemm_gu_silu_t<true>(act, 0, x, nw, eps, W, M, K, ffn);
}
