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
extern "C" __global__ void __launch_bounds__(MLP_THREADS)
    gemm_gu_silu(unsigned short* __restrict__ act, const unsigned short* __restrict__ x,
                 const unsigned short* __restrict__ W, int M, int K, int ffn) {
    __shared__ __align__(16) unsigned short As[MLP_STAGES][MLP_BM * MLP_LD];
    __shared__ __align__(16) unsigned short Bs[MLP_STAGES][MLP_BN * MLP_LD];
    int tid = threadIdx.x, lane = tid & (WARP - 1), warp = tid / WARP;
    int wm = warp / 4, wn = warp % 4;
    int g = lane >> 2, t = lane & 3;
    int m0 = blockIdx.x * MLP_BM, n0 = blockIdx.y * MLP_BN;
    // This thread's 16-byte pieces of a stage: row tid/4 of the x tile and
    // rows tid/4 and 64 + tid/4 of the W tile, 8 bf16 from (tid % 4) · 8.
    int r = tid >> 2, k8 = (tid & 3) * 8, N = 2 * ffn;
    bool aok = m0 + r < M, b0ok = n0 + r < N, b1ok = n0 + 64 + r < N;
    const unsigned short* ag = x + (i64)min(m0 + r, M - 1) * K + k8;
    const unsigned short* bg0 = W + (i64)min(n0 + r, N - 1) * K + k8;
    const unsigned short* bg1 = W + (i64)min(n0 + 64 + r, N - 1) * K + k8;
    int nk = K / MLP_BK;
    auto load = [&](int kt) { // stage kt into buffer kt % MLP_STAGES
        if (kt < nk) {
            int s = kt % MLP_STAGES, o = kt * MLP_BK;
            cp_async16(&As[s][r * MLP_LD + k8], ag + o, aok);
            cp_async16(&Bs[s][r * MLP_LD + k8], bg0 + o, b0ok);
            cp_async16(&Bs[s][(64 + r) * MLP_LD + k8], bg1 + o, b1ok);
        }
        cp_async_commit(); // an empty group past the end keeps the count
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
    for (int kt = 0; kt < nk; kt++) {
        cp_async_wait<MLP_STAGES - 2>(); // stage kt has landed (this thread's part)
        __syncthreads();                 // everyone's part; stage kt-1's buffer is free
        load(kt + MLP_STAGES - 1);
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
    // Accumulator pairs (2t, 2t+1) of a tile are a gate column and its up
    // column: output column (n0 + wn·32 + j·8 + 2t) / 2.
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int row = m0 + wm * 32 + i * 16 + g;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int col = (n0 + wn * 32 + j * 8 + 2 * t) / 2;
            const float* c = acc[i][j];
            if (col >= ffn) continue;
            if (row < M) act[(i64)row * ffn + col] = f2bf(c[0] / (1.0f + expf(-c[0])) * c[1]);
            if (row + 8 < M) act[(i64)(row + 8) * ffn + col] = f2bf(c[2] / (1.0f + expf(-c[2])) * c[3]);
        }
    }
}
