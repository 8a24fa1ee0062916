// Runs kernels/draw.cu's draw_rows on the CPU (shim.h). Usage: emu IN OUT.
// IN (little-endian): int32 V, R, nMasks, maskWords, nDraws, nExcl; masks
// [nMasks·maskWords] uint64; rows [R·V] float32; specs [nDraws·DRAW_WORDS]
// int32; exclude lists [nExcl] int32. OUT: [nDraws, 2] int32 as on the GPU.
#include "shim.h"
#include "kernel.inc"
int main(int argc, char** argv) {
    if (argc != 3) return 2;
    FILE* f = fopen(argv[1], "rb");
    if (!f) return 3;
    int h[6];
    if (fread(h, 4, 6, f) != 6) return 4;
    int V = h[0], R = h[1], nM = h[2], W = h[3], nD = h[4], nE = h[5];
    if (V > (1 << 16)) return 5;
    std::vector<unsigned long long> masks((size_t)nM * W + 1);
    std::vector<float> rows((size_t)R * V);
    std::vector<int> spec((size_t)nD * DRAW_WORDS + 1), excl(nE + 1);
    if (fread(masks.data(), 8, (size_t)nM * W, f) != (size_t)nM * W || fread(rows.data(), 4, rows.size(), f) != rows.size() ||
        fread(spec.data(), 4, (size_t)nD * DRAW_WORDS, f) != (size_t)nD * DRAW_WORDS || fread(excl.data(), 4, nE, f) != (size_t)nE)
        return 6;
    fclose(f);
    std::vector<int> out(2 * (size_t)nD + 1);
    blockDim.x = DRAW_THREADS;
    run_threads(DRAW_THREADS, [&](int t) {
        threadIdx.x = t;
        for (int b = 0; b < nD; b++) {
            if (t == 0) blockIdx.x = b;
            __syncthreads();
            draw_rows(out.data(), rows.data(), V, spec.data(), excl.data(), masks.data(), W);
            __syncthreads();
        }
    });
    FILE* o = fopen(argv[2], "wb");
    if (!o || fwrite(out.data(), 4, 2 * (size_t)nD, o) != 2 * (size_t)nD) return 7;
    return fclose(o) == 0 ? 0 : 8;
}
