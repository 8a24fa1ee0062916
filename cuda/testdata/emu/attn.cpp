// Runs one of kernels/llama.cu's attention kernels on the CPU (shim.h),
// one warp at a time on 32 threads. Usage: emu IN OUT.
// IN (little-endian): int32 which (0 paged_attention_chunked, 1 its _g,
// 2 paged_attention_rope, 3 its _g), nH, nKV, blockSize, T, S, btStride,
// nSlots, maxPos, float32 scale; then qkv [T, (nH+2nKV)·HEAD_DIM], kcache
// and vcache [nSlots, nKV, HEAD_DIM], cosSin [maxPos, HEAD_DIM/2, 2]
// float32; positions, slots, tokSeq [T], blockTables [S, btStride] int32.
// OUT: out [T, nH·HEAD_DIM], then kcache and vcache as the kernel left them.
#include "shim.h"
#include "kernel.inc"
template <typename T> static bool get(FILE* f, std::vector<T>& v, size_t n) {
    v.resize(n + 1);
    return fread(v.data(), sizeof(T), n, f) == n;
}
int main(int argc, char** argv) {
    if (argc != 3) return 2;
    FILE* f = fopen(argv[1], "rb");
    if (!f) return 3;
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
    std::barrier<> bar(WARP);
    g_bar = &bar;
    blockDim.x = 128;
    int grid = (T * nH + 3) / 4;
    std::vector<std::thread> th;
    for (int lane = 0; lane < WARP; lane++)
        th.emplace_back([&, lane] {
            for (int b = 0; b < grid; b++)
                for (int w = 0; w < 4; w++) {
                    threadIdx.x = w * WARP + lane;
                    if (lane == 0) blockIdx.x = b;
                    __syncthreads();
                    switch (which) {
                    case 0:
                        paged_attention_chunked(out.data(), qkv.data(), kc.data(), vc.data(), tokSeq.data(), pos.data(),
                                                bt.data(), btStride, T, nH, nKV, bs, scale, nullptr);
                        break;
                    case 1:
                        paged_attention_chunked_g(out.data(), qkv.data(), kc.data(), vc.data(), tokSeq.data(), pos.data(),
                                                  bt.data(), btStride, T, nH, nKV, bs, scale, nullptr);
                        break;
                    case 2:
                        paged_attention_rope(out.data(), qkv.data(), cs.data(), slots.data(), kc.data(), vc.data(),
                                             tokSeq.data(), pos.data(), bt.data(), btStride, T, nH, nKV, bs, scale, nullptr);
                        break;
                    default:
                        paged_attention_rope_g(out.data(), qkv.data(), cs.data(), slots.data(), kc.data(), vc.data(),
                                               tokSeq.data(), pos.data(), bt.data(), btStride, T, nH, nKV, bs, scale, nullptr);
                    }
                    __syncthreads();
                }
        });
    for (auto& x : th) x.join();
    FILE* o = fopen(argv[2], "wb");
    if (!o || fwrite(out.data(), 4, out.size(), o) != out.size() || fwrite(kc.data(), 4, kvN, o) != kvN ||
        fwrite(vc.data(), 4, kvN, o) != kvN)
        return 7;
    return fclose(o) == 0 ? 0 : 8;
}
