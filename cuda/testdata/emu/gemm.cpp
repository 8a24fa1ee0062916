// Runs kernels/mlp.cu's gemm_gu_silu on the CPU (shim.h), one block at a
// time on MLP_THREADS threads. Usage: emu IN OUT.
// IN (little-endian): int32 M, K, ffn; x [M, K] and W [2·ffn, K] bf16.
// OUT: act [M, ffn] bf16.
#include "shim.h"
#include "kernel.inc"
int main(int argc, char** argv) {
    if (argc != 3) return 2;
    FILE* f = fopen(argv[1], "rb");
    if (!f) return 3;
    int h[3];
    if (fread(h, 4, 3, f) != 3) return 4;
    int M = h[0], K = h[1], ffn = h[2];
    std::vector<unsigned short> x((size_t)M * K), w((size_t)2 * ffn * K), act((size_t)M * ffn, 0x7fc0);
    if (fread(x.data(), 2, x.size(), f) != x.size() || fread(w.data(), 2, w.size(), f) != w.size()) return 5;
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
                    gemm_gu_silu(act.data(), x.data(), w.data(), M, K, ffn);
                    __syncthreads();
                }
        });
    for (auto& x : th) x.join();
    FILE* o = fopen(argv[2], "wb");
    if (!o || fwrite(act.data(), 2, act.size(), o) != act.size()) return 7;
    return fclose(o) == 0 ? 0 : 8;
}
