// Runs one of kernels/gemm.cu's entry points on the CPU (shim.h), one block
// at a time on TC_THREADS threads. Usage: emu IN OUT.
// IN (little-endian): int32 M, K, N, which (0 gemm_gu_silu, 1
// gemm_gu_silu_norm, 2 gemm_norm); float32 eps; x [M, K] bf16 (which 0) or
// float32 and the norm weight [K] float32 (1, 2); W [N, K] bf16.
// OUT: act [M, N/2] bf16 (0, 1) or y [M, N] float32 (2).
#include "shim.h"
#include "kernel.inc"
int main(int argc, char** argv) {
    if (argc != 3) return 2;
    FILE* f = fopen(argv[1], "rb");
    if (!f) return 3;
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
    std::barrier<> bar(TC_THREADS);
    g_bar = &bar;
    blockDim.x = TC_THREADS;
    int gx = (M + TC_BM - 1) / TC_BM, gy = (N + TC_BN - 1) / TC_BN;
    std::vector<std::thread> th;
    for (int t = 0; t < TC_THREADS; t++)
        th.emplace_back([&, t] {
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
    for (auto& x : th) x.join();
    FILE* o = fopen(argv[2], "wb");
    if (!o) return 7;
    if (which == 2 ? fwrite(y.data(), 4, y.size(), o) != y.size() : fwrite(act.data(), 2, act.size(), o) != act.size())
        return 7;
    return fclose(o) == 0 ? 0 : 8;
}
