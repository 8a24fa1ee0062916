// Kernels of the chunlian CUDA backend (package cuda), compiled at start by
// NVRTC for the device's architecture. All tensors are float32, row-major.
// Model constants arrive as -D macros:
//   HEAD_DIM  head dimension (any size up to 32*MAX_LANE_DIMS)
// Every kernel uses 64-bit offsets: the paged cache can exceed 2^31 floats.

#define WARP 32
#define MAX_LANE_DIMS ((HEAD_DIM + WARP - 1) / WARP)

typedef long long i64;

// NVRTC has no <math.h>, so no INFINITY macro.
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// block_sum: sum over the whole block (blockDim.x a multiple of 32, ≤ 1024).
// Every thread gets the result.
__device__ float block_sum(float v) {
    __shared__ float part[32];
    __shared__ float total;
    int lane = threadIdx.x & (WARP - 1), w = threadIdx.x / WARP;
    v = warp_sum(v);
    if (lane == 0) part[w] = v;
    __syncthreads();
    if (w == 0) {
        float s = lane < (int)(blockDim.x / WARP) ? part[lane] : 0.f;
        s = warp_sum(s);
        if (lane == 0) total = s;
    }
    __syncthreads();
    return total;
}

// embed_gather: out[t, :] = table[ids[t], :]. grid = T, block = any.
// out [T, d]; table [V, d]; ids [T].
extern "C" __global__ void embed_gather(float* __restrict__ out, const float* __restrict__ table,
                                        const int* __restrict__ ids, int d) {
    int t = blockIdx.x;
    const float* src = table + (i64)ids[t] * d;
    float* dst = out + (i64)t * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) dst[i] = src[i];
}

// rmsnorm: out[r, :] = x[src, :] / sqrt(mean(x[src]^2) + eps) * w, where
// src = rows ? rows[r] : r (rows gathers the sampled rows before the LM head).
// grid = R, block = 256. out [R, d]; x [*, d]; w [d].
extern "C" __global__ void rmsnorm(float* __restrict__ out, const float* __restrict__ x,
                                   const float* __restrict__ w, const int* __restrict__ rows,
                                   int d, float eps) {
    int r = blockIdx.x;
    int src = rows ? rows[r] : r;
    const float* xr = x + (i64)src * d;
    float ss = 0.f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) { float v = xr[i]; ss += v * v; }
    ss = block_sum(ss);
    float inv = 1.0f / sqrtf(ss / (float)d + eps);
    float* o = out + (i64)r * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) o[i] = xr[i] * inv * w[i];
}

// rope_kv: applies RoPE (Hugging Face rotate_half convention: dimension i
// pairs with i + HEAD_DIM/2) in place to the q and k parts of each token's
// qkv row, then writes k and v to the token's paged cache slot.
// grid = T, block = 128.
// qkv [T, (nH + 2*nKV) * HEAD_DIM] laid out [q heads | k heads | v heads];
// cosSin [maxPos, HEAD_DIM/2, 2] (cos, sin); positions [T]; slots [T]
// (slot = block*blockSize + offset; negative = do not store);
// kcache, vcache [numBlocks*blockSize, nKV, HEAD_DIM] of this layer.
extern "C" __global__ void rope_kv(float* __restrict__ qkv, const float* __restrict__ cosSin,
                                   const int* __restrict__ positions, const int* __restrict__ slots,
                                   float* __restrict__ kcache, float* __restrict__ vcache,
                                   int nH, int nKV) {
    const int half = HEAD_DIM / 2;
    int t = blockIdx.x;
    int stride = (nH + 2 * nKV) * HEAD_DIM;
    float* row = qkv + (i64)t * stride;
    int pos = positions[t];
    int slot = slots[t];
    const float* cs = cosSin + (i64)pos * half * 2;
    int pairs = (nH + nKV) * half;
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
        int head = p / half, i = p % half;
        float* base = row + head * HEAD_DIM; // q heads then k heads are contiguous
        float c = cs[2 * i], s = cs[2 * i + 1];
        float x1 = base[i], x2 = base[i + half];
        float y1 = x1 * c - x2 * s;
        float y2 = x2 * c + x1 * s;
        base[i] = y1;
        base[i + half] = y2;
        if (head >= nH && slot >= 0) {
            float* kd = kcache + ((i64)slot * nKV + (head - nH)) * HEAD_DIM;
            kd[i] = y1;
            kd[i + half] = y2;
        }
    }
    if (slot >= 0) {
        const float* v = row + (nH + nKV) * HEAD_DIM;
        float* vd = vcache + (i64)slot * nKV * HEAD_DIM;
        for (int j = threadIdx.x; j < nKV * HEAD_DIM; j += blockDim.x) vd[j] = v[j];
    }
}

// paged_attention: causal attention of every new token over its sequence's
// cached keys 0..position (the new tokens' K/V were stored by rope_kv before
// this launch). One warp per (token, query head); lane l owns dimensions
// l, l+32, ... Online softmax in float32.
// out [T, nH*HEAD_DIM]; qkv as in rope_kv (q already rotated);
// tokSeq [T] batch sequence index of each token; positions [T];
// blockTables [S, btStride] physical block ids; caches as in rope_kv.
// grid = ceil(T*nH / 4), block = 128.
extern "C" __global__ void paged_attention(float* __restrict__ out, const float* __restrict__ qkv,
                                           const float* __restrict__ kcache,
                                           const float* __restrict__ vcache,
                                           const int* __restrict__ tokSeq,
                                           const int* __restrict__ positions,
                                           const int* __restrict__ blockTables, int btStride,
                                           int T, int nH, int nKV, int blockSize, float scale) {
    int gw = (blockIdx.x * blockDim.x + threadIdx.x) / WARP;
    int lane = threadIdx.x & (WARP - 1);
    if (gw >= T * nH) return; // whole warp exits together
    int t = gw / nH, h = gw % nH;
    int kvh = h / (nH / nKV);
    int stride = (nH + 2 * nKV) * HEAD_DIM;
    const float* q = qkv + (i64)t * stride + h * HEAD_DIM;
    const int* bt = blockTables + (i64)tokSeq[t] * btStride;
    int pos = positions[t];

    float qr[MAX_LANE_DIMS], acc[MAX_LANE_DIMS];
#pragma unroll
    for (int i = 0; i < MAX_LANE_DIMS; i++) {
        int dd = lane + i * WARP;
        qr[i] = dd < HEAD_DIM ? q[dd] * scale : 0.f;
        acc[i] = 0.f;
    }
    float m = NEG_INF, l = 0.f;
    for (int j = 0; j <= pos; j++) {
        int blk = bt[j / blockSize];
        i64 base = (((i64)blk * blockSize + (j % blockSize)) * nKV + kvh) * HEAD_DIM;
        const float* k = kcache + base;
        const float* v = vcache + base;
        float dot = 0.f;
#pragma unroll
        for (int i = 0; i < MAX_LANE_DIMS; i++) {
            int dd = lane + i * WARP;
            if (dd < HEAD_DIM) dot += qr[i] * k[dd];
        }
        dot = warp_sum(dot);
        float mn = fmaxf(m, dot);
        float c = m == NEG_INF ? 0.f : expf(m - mn);
        float p = expf(dot - mn);
        l = l * c + p;
#pragma unroll
        for (int i = 0; i < MAX_LANE_DIMS; i++) {
            int dd = lane + i * WARP;
            if (dd < HEAD_DIM) acc[i] = acc[i] * c + p * v[dd];
        }
        m = mn;
    }
    float inv = 1.0f / l;
    float* o = out + ((i64)t * nH + h) * HEAD_DIM;
#pragma unroll
    for (int i = 0; i < MAX_LANE_DIMS; i++) {
        int dd = lane + i * WARP;
        if (dd < HEAD_DIM) o[dd] = acc[i] * inv;
    }
}

// silu_mul: act[t, i] = silu(gu[t, i]) * gu[t, ffn + i].
// gu [T, 2*ffn] (gate then up, one fused GEMM); act [T, ffn]. Grid-stride.
extern "C" __global__ void silu_mul(float* __restrict__ act, const float* __restrict__ gu,
                                    int T, int ffn) {
    i64 n = (i64)T * ffn;
    for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (i64)gridDim.x * blockDim.x) {
        i64 t = e / ffn;
        int i = (int)(e - t * ffn);
        float g = gu[t * 2 * ffn + i];
        float u = gu[t * 2 * ffn + ffn + i];
        act[e] = g / (1.0f + expf(-g)) * u;
    }
}

// copy_blocks: for every pair p and every layer-half lk (2*layer + {0:K,1:V}),
// copies block src[p] to dst[p]. cache [2*L, numBlocks, blockElems].
// grid = (npairs, 2*L), block = 256.
extern "C" __global__ void copy_blocks(float* __restrict__ cache, const int* __restrict__ src,
                                       const int* __restrict__ dst, i64 numBlocks, int blockElems) {
    int p = blockIdx.x, lk = blockIdx.y;
    float* base = cache + (i64)lk * numBlocks * blockElems;
    const float* s = base + (i64)src[p] * blockElems;
    float* d = base + (i64)dst[p] * blockElems;
    for (int i = threadIdx.x; i < blockElems; i += blockDim.x) d[i] = s[i];
}

// block_max: maximum over the whole block (same shape rules as block_sum).
__device__ float block_max(float v) {
    __shared__ float part[32];
    __shared__ float total;
    int lane = threadIdx.x & (WARP - 1), w = threadIdx.x / WARP;
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) part[w] = v;
    __syncthreads();
    if (w == 0) {
        float s = lane < (int)(blockDim.x / WARP) ? part[lane] : NEG_INF;
#pragma unroll
        for (int o = WARP / 2; o > 0; o >>= 1) s = fmaxf(s, __shfl_xor_sync(0xffffffffu, s, o));
        if (lane == 0) total = s;
    }
    __syncthreads();
    return total;
}

// row_lse: out[r] = log Σ_i exp(logits[r, i]) (max-shifted), so that the
// host can turn a logit into a log-probability without touching the row.
// logits [R, V]; out [R]. grid = R, block = 256.
extern "C" __global__ void row_lse(float* __restrict__ out, const float* __restrict__ logits, int V) {
    const float* row = logits + (i64)blockIdx.x * V;
    float m = NEG_INF;
    for (int i = threadIdx.x; i < V; i += blockDim.x) m = fmaxf(m, row[i]);
    m = block_max(m);
    float s = 0.f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) s += expf(row[i] - m);
    s = block_sum(s);
    if (threadIdx.x == 0) out[blockIdx.x] = m + logf(s);
}
