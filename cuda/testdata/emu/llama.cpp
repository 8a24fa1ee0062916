// Runs one of kernels/llama.cu's attention kernels or one of
// kernels/gemm.cu's tensor-core GEMMs on the CPU (shim.h).
// Usage: emu IN OUT; IN starts with an int32 op: 0 attention, 1 GEMM, 2
// silu_mul16.
//
// Attention, one warp at a time on 32 threads. IN (little-endian): int32
// which (0 paged_attention_chunked, 1 its _g, 2 paged_attention_rope, 3 its
// _g; + 4: the bf16 output out16 instead of out), nH, nKV, blockSize, T, S, btStride, nSlots, maxPos, float32 scale;
// then qkv [T, (nH+2nKV)·HEAD_DIM], kcache and vcache [nSlots, nKV,
// HEAD_DIM], cosSin [maxPos, HEAD_DIM/2, 2] float32; positions, slots,
// tokSeq [T], blockTables [S, btStride] int32. OUT: out [T, nH·HEAD_DIM]
// (float32; out16's values with + 4), then kcache and vcache as the kernel
// left them.
//
// GEMM, one block at a time on TC_THREADS threads. IN: int32 M, K, N,
// which (0 gemm_gu_silu, 1 gemm_gu_silu_norm, 2 gemm_norm); float32 eps;
// x [M, K] bf16 (which 0) or float32 and the norm weight [K] float32 (1,
// 2); W [N, K] bf16. OUT: act [M, N/2] bf16 (0, 1) or y [M, N] float32 (2).
//
// silu_mul16, thread by thread (it neither shuffles nor synchronises). IN:
// int32 T, ffn, grid; gu [T, 2·ffn] bf16. OUT: act [T, ffn] bf16.
#include "shim.h"
#include "kernel.inc"
template <typename T> static bool get(FILE* f, std::vector<T>& v, size_t n) {
    v.resize(n + 1);
    return fread(v.data(), sizeof(T), n, f) == n;
}
static int attention(FILE* f, const char* outPath) {
    int h[10];
    if (fread(h, 4, 10, f) != 10) return 4;
    int which = h[0], nH = h[1], nKV = h[2], bs = h[3], T = h[4], S = h[5], btStride = h[6], nSlots = h[7], maxPos = h[8];
    float scale;
    memcpy(&scale, &h[9], 4);
    size_t kvN = (size_t)nSlots * nKV * HEAD_DIM;
    std::vector<float> qkv, kc, vc, cs;
    std::vector<int> pos, slots, tokSeq, bt;
    if (!get(f, qkv, (size_t)T * (nH + 2 * nKV) * HEAD_DIM) || !get(f, kc, kvN) || !get(f, vc, kvN) ||
        !get(f, cs, (size_t)maxPos * HEAD_DIM) || !get(f, pos, T) || !get(f, slots, T) || !get(f, tokSeq, T) ||
        !get(f, bt, (size_t)S * btStride))
        return 5;
    fclose(f);
    std::vector<float> out((size_t)T * nH * HEAD_DIM, NAN);
    std::vector<unsigned short> out16(out.size(), 0x7fc0);
    unsigned short* o16 = which >= 4 ? out16.data() : nullptr;
    which &= 3;
    blockDim.x = 128;
    int grid = (T * nH + 3) / 4;
    run_threads(WARP, [&](int lane) {
        for (int b = 0; b < grid; b++)
            for (int w = 0; w < 4; w++) {
                threadIdx.x = w * WARP + lane;
                if (lane == 0) blockIdx.x = b;
                __syncthreads();
                switch (which) {
                case 0:
                    paged_attention_chunked(out.data(), qkv.data(), kc.data(), vc.data(), tokSeq.data(), pos.data(),
                                            bt.data(), btStride, T, nH, nKV, bs, scale, o16);
                    break;
                case 1:
                    paged_attention_chunked_g(out.data(), qkv.data(), kc.data(), vc.data(), tokSeq.data(), pos.data(),
                                              bt.data(), btStride, T, nH, nKV, bs, scale, o16);
                    break;
                case 2:
                    paged_attention_rope(out.data(), qkv.data(), cs.data(), slots.data(), kc.data(), vc.data(),
                                         tokSeq.data(), pos.data(), bt.data(), btStride, T, nH, nKV, bs, scale, o16);
                    break;
                default:
                    paged_attention_rope_g(out.data(), qkv.data(), cs.data(), slots.data(), kc.data(), vc.data(),
                                           tokSeq.data(), pos.data(), bt.data(), btStride, T, nH, nKV, bs, scale, o16);
                }
                __syncthreads();
            }
    });
    FILE* o = fopen(outPath, "wb");
    if (o16)
        for (size_t i = 0; i < out.size(); i++) out[i] = emu_bf(out16[i], 0);
    if (!o || fwrite(out.data(), 4, out.size(), o) != out.size() || fwrite(kc.data(), 4, kvN, o) != kvN ||
        fwrite(vc.data(), 4, kvN, o) != kvN)
        return 7;
    return fclose(o) == 0 ? 0 : 8;
}

static int gemm(FILE* f, const char* outPath) {
    int h[5];
    if (fread(h, 4, 5, f) != 5) return 4;
    int M = h[0], K = h[1], N = h[2], which = h[3];
    float eps;
    memcpy(&eps, &h[4], 4);
    std::vector<unsigned short> x16((size_t)M * K), w((size_t)N * K), act((size_t)M * (N / 2), 0x7fc0);
    std::vector<float> x32((size_t)M * K), nw(K), y((size_t)M * N, NAN);
    bool ok = which ? fread(x32.data(), 4, x32.size(), f) == x32.size() && fread(nw.data(), 4, nw.size(), f) == nw.size()
                    : fread(x16.data(), 2, x16.size(), f) == x16.size();
    if (!ok || fread(w.data(), 2, w.size(), f) != w.size()) return 5;
    fclose(f);
    blockDim.x = TC_THREADS;
    int gx = (M + TC_BM - 1) / TC_BM, gy = (N + TC_BN - 1) / TC_BN;
    run_threads(TC_THREADS, [&](int t) {
        threadIdx.x = t;
        for (int by = 0; by < gy; by++)
            for (int bx = 0; bx < gx; bx++) {
                if (t == 0) blockIdx.x = bx, blockIdx.y = by;
                __syncthreads();
                switch (which) {
                case 0: gemm_gu_silu(act.data(), x16.data(), w.data(), M, K, N); break;
                case 1: gemm_gu_silu_norm(act.data(), x32.data(), nw.data(), eps, w.data(), M, K, N); break;
                default: gemm_norm(y.data(), x32.data(), nw.data(), eps, w.data(), M, K, N);
                }
                __syncthreads();
            }
    });
    FILE* o = fopen(outPath, "wb");
    if (!o) return 7;
    if (which == 2 ? fwrite(y.data(), 4, y.size(), o) != y.size() : fwrite(act.data(), 2, act.size(), o) != act.size())
        return 7;
    return fclose(o) == 0 ? 0 : 8;
}

static int siluMul16(FILE* f, const char* outPath) {
    int h[3];
    if (fread(h, 4, 3, f) != 3) return 4;
    int T = h[0], ffn = h[1], grid = h[2];
    std::vector<unsigned short> gu((size_t)T * 2 * ffn), act((size_t)T * ffn, 0x7fc0);
    if (fread(gu.data(), 2, gu.size(), f) != gu.size()) return 5;
    fclose(f);
    blockDim.x = 256;
    gridDim.x = grid;
    for (int b = 0; b < grid; b++)
        for (int t = 0; t < 256; t++) {
            blockIdx.x = b;
            threadIdx.x = t;
            silu_mul16(act.data(), gu.data(), T, ffn);
        }
    FILE* o = fopen(outPath, "wb");
    if (!o || fwrite(act.data(), 2, act.size(), o) != act.size()) return 7;
    return fclose(o) == 0 ? 0 : 8;
}

int main(int argc, char** argv) {
    if (argc != 3) return 2;
    FILE* f = fopen(argv[1], "rb");
    int op;
    if (!f || fread(&op, 4, 1, f) != 1) return 3;
    switch (op) {
    case 0: return attention(f, argv[2]);
    case 1: return gemm(f, argv[2]);
    default: return siluMul16(f, argv[2]);
    }
}
