// Runs kernels/mlp.cu's gemm_gu_silu (norm 0) or gemm_gu_silu_norm (norm
// 1) on the CPU (shim.h), one block at a time on MLP_THREADS threads.
// Usage: emu IN OUT. IN (little-endian): int32 M, K, ffn, norm; float32
// eps; x [M, K] bf16 (norm 0) or float32 and the norm weight [K] float32
// (norm 1); W [2·ffn, K] bf16. OUT: act [M, ffn] bf16.
#include "shim.h"
#include "kernel.inc"
int main(int argc, char** argv) {
    if (argc != 3) return 2;
    FILE* f = fopen(argv[1], "rb");
    if (!f) return 3;
    int h[5];
    if (fread(h, 4, 5, f) != 5) return 4;
    int M = h[0], K = h[1], ffn = h[2], norm = h[3];
    float eps;
    memcpy(&eps, &h[4], 4);
    std::vector<unsigned short> x16((size_t)M * K), w((size_t)2 * ffn * K), act((size_t)M * ffn, 0x7fc0);
    std::vector<float> x32((size_t)M * K), nw(K);
    bool ok = norm ? fread(x32.data(), 4, x32.size(), f) == x32.size() && fread(nw.data(), 4, nw.size(), f) == nw.size()
                   : fread(x16.data(), 2, x16.size(), f) == x16.size();
    if (!ok || fread(w.data(), 2, w.size(), f) != w.size()) return 5;
    fclose(f);
    std::barrier<> bar(MLP_THREADS);
    g_bar = &bar;
    blockDim.x = MLP_THREADS;
    int gx = (M + MLP_BM - 1) / MLP_BM, gy = (2 * ffn + MLP_BN - 1) / MLP_BN;
    std::vector<std::thread> th;
    for (int t = 0; t < MLP_THREADS; t++)
        th.emplace_back([&, t] {
            threadIdx.x = t;
            for (int by = 0; by < gy; by++)
                for (int bx = 0; bx < gx; bx++) {
                    if (t == 0) blockIdx.x = bx, blockIdx.y = by;
                    __syncthreads();
                    if (norm) gemm_gu_silu_norm(act.data(), x32.data(), nw.data(), eps, w.data(), M, K, ffn);
                    else gemm_gu_silu(act.data(), x16.data(), w.data(), M, K, ffn);
                    __syncthreads();
                }
        });
    for (auto& x : th) x.join();
    FILE* o = fopen(argv[2], "wb");
    if (!o || fwrite(act.data(), 2, act.size(), o) != act.size()) return 7;
    return fclose(o) == 0 ? 0 : 8;
}
