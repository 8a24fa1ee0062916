// Kernels of the chunlian CUDA backend (package cuda), compiled at start by
// NVRTC for the device's architecture. All tensors are float32, row-major.
// (The bf16 GEMM path stores some activations as bfloat16: out16 arguments.)
// Model constants arrive as -D macros:
//   HEAD_DIM  head dimension (any size up to 32*MAX_LANE_DIMS)
// Every kernel uses 64-bit offsets: the paged cache can exceed 2^31 floats.

#define WARP 32
#define MAX_LANE_DIMS ((HEAD_DIM + WARP - 1) / WARP)

typedef long long i64;

// NVRTC has no <math.h>, so no INFINITY macro.
#define NEG_INF __int_as_float(0xff800000)

// f2bf rounds a float32 to the nearest-even bfloat16 (NaNs stay NaNs), as
// the host's toBF16: the form in which the bf16 GEMM path (Options.Precision
// "bf16") hands activations to cuBLAS.
__device__ __forceinline__ unsigned short f2bf(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// bf_lo, bf_hi: the low and high bfloat16 of a 32-bit word as float32
// (exact: the bits shifted into the high half).
__device__ __forceinline__ float bf_lo(unsigned int u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf_hi(unsigned int u) { return __uint_as_float(u & 0xffff0000u); }

// silu_up: SiLU(g)·u, the one definition of the MLP's gating (every
// path, fused or not, computes it term for term alike).
__device__ __forceinline__ float silu_up(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// store_act writes an activation: as bfloat16 into out16 when it is
// non-null (the bf16 GEMM path), else as float32 into out.
__device__ __forceinline__ void store_act(float* out, unsigned short* out16, i64 i, float v) {
    if (out16) out16[i] = f2bf(v);
    else out[i] = v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Programmatic dependent launch (Hopper+, Options.PDL): a kernel launched
// with the programmatic-stream-serialization attribute may start while its
// predecessor still runs. pdl_wait blocks until the predecessor grid has
// completed and its writes are visible, then lets this grid's own
// dependents be scheduled (they in turn wait for this grid to complete).
// Every kernel that can be launched that way calls it before its first
// read of a predecessor's output and before any write. Without the
// attribute (or before sm_90) both instructions are no-ops / absent.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// prefetch_l2 asks for bytes at p to be brought into L2 (one 128-byte line
// per lane and step): weights, which no predecessor writes, so it may run
// before pdl_wait.
__device__ __forceinline__ void prefetch_l2(const void* p, int bytes) {
    const char* c = reinterpret_cast<const char*>(p);
    for (int off = (threadIdx.x & 31) * 128; off < bytes; off += 32 * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(c + off));
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
// One warp per row (a block per row spent most of its time synchronising):
// grid = ceil(n / 8), block = 256; n rows. out [n, d]; x [*, d]; w [d].
// out16 [n, d] bf16: written instead of out when non-null.
extern "C" __global__ void rmsnorm(float* __restrict__ out, const float* __restrict__ x,
                                   const float* __restrict__ w, const int* __restrict__ rows,
                                   int d, float eps, int n, unsigned short* __restrict__ out16) {
    int r = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (r >= n) return;
    int lane = threadIdx.x & (WARP - 1);
    int src = rows ? rows[r] : r;
    const float* xr = x + (i64)src * d;
    float ss = 0.f;
    for (int i = lane; i < d; i += WARP) { float v = xr[i]; ss += v * v; }
    ss = warp_sum(ss);
    float inv = 1.0f / sqrtf(ss / (float)d + eps);
    for (int i = lane; i < d; i += WARP) store_act(out, out16, (i64)r * d + i, xr[i] * inv * w[i]);
}

// Layouts shared by the attention kernels below and gemv_qkv_rope:
// qkv [T, (nH + 2*nKV) * HEAD_DIM] laid out [q heads | k heads | v heads];
// RoPE in the Hugging Face rotate_half convention (dimension i pairs with
// i + HEAD_DIM/2), cosSin [maxPos, HEAD_DIM/2, 2] (cos, sin);
// positions [T]; slots [T] (slot = block*blockSize + offset; negative = do
// not store); kcache, vcache [numBlocks*blockSize, nKV, HEAD_DIM] of one
// layer; tokSeq [T] batch sequence index of each token; blockTables
// [S, btStride] physical block ids.

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// rope_pair: RoPE of one dimension pair (x1 at i, x2 at i + HEAD_DIM/2)
// with cos c and sin s: the one definition every kernel rotates with, so
// that keys rotated on the fly equal the keys stored in the cache.
__device__ __forceinline__ void rope_pair(float x1, float x2, float c, float s, float& y1, float& y2) {
    y1 = x1 * c - x2 * s;
    y2 = x2 * c + x1 * s;
}

// cache_row: the offset of key j's K/V row (KV head kvh) in one layer's
// cache, through its sequence's block table bt.
__device__ __forceinline__ i64 cache_row(const int* bt, int j, int blockSize, int nKV, int kvh) {
    return (((i64)bt[j / blockSize] * blockSize + (j % blockSize)) * nKV + kvh) * HEAD_DIM;
}

// dot_q: Σ_d k[d] * qw[d] over HEAD_DIM in the order the attention
// kernels use (float4 groups in turn). qw in shared memory, 16-byte
// aligned; k 16-byte aligned when HEAD_DIM % 4 == 0 (cache and qkv rows).
__device__ __forceinline__ float dot_q(const float* k, const float* qw) {
    float dot = 0.f;
#if HEAD_DIM % 4 == 0
#pragma unroll
    for (int d = 0; d < HEAD_DIM; d += 4) {
        float4 kv = *reinterpret_cast<const float4*>(k + d);
        float4 qv = *reinterpret_cast<const float4*>(qw + d);
        dot += kv.x * qv.x + kv.y * qv.y + kv.z * qv.z + kv.w * qv.w;
    }
#else
#pragma unroll
    for (int d = 0; d < HEAD_DIM; d++) dot += k[d] * qw[d];
#endif
    return dot;
}

// attend: one warp's causal attention over keys 0..pos, 32 keys at a time
// (one per lane), online softmax in float32, the result written to
// out/out16 at o (out16 bf16 instead of out when non-null). score(base)
// is called by the whole warp and returns the dot product of key
// base + lane with the warp's scaled query (NEG_INF past pos); vrow(j)
// returns key j's V row [HEAD_DIM]. Lane l accumulates dims l, l+32, ...
template <typename Score, typename VRow>
__device__ __forceinline__ void attend(float* out, unsigned short* out16, i64 o, int pos, Score score,
                                       VRow vrow_of) {
    int lane = threadIdx.x & (WARP - 1);
    float acc[MAX_LANE_DIMS];
#pragma unroll
    for (int i = 0; i < MAX_LANE_DIMS; i++) acc[i] = 0.f;
    float m = NEG_INF, l = 0.f;
    for (int base = 0; base <= pos; base += WARP) {
        int j = base + lane;
        bool valid = j <= pos;
        float s = score(base);
        const float* vrow = valid ? vrow_of(j) : 0;
        float mn = fmaxf(m, warp_max(s)); // finite: key `base` (lane 0) is valid
        float c = m == NEG_INF ? 0.f : expf(m - mn);
        float p = valid ? expf(s - mn) : 0.f;
        l = l * c + warp_sum(p);
#pragma unroll
        for (int i = 0; i < MAX_LANE_DIMS; i++) acc[i] *= c;
        int n = min(WARP, pos - base + 1); // warp-uniform
#pragma unroll 8
        for (int u = 0; u < n; u++) {
            float pu = __shfl_sync(0xffffffffu, p, u);
            const float* v = reinterpret_cast<const float*>(
                __shfl_sync(0xffffffffu, reinterpret_cast<long long>(vrow), u));
#pragma unroll
            for (int i = 0; i < MAX_LANE_DIMS; i++) {
                int dd = lane + i * WARP;
                if (dd < HEAD_DIM) acc[i] += pu * v[dd];
            }
        }
        m = mn;
    }
    float inv = 1.0f / l;
#pragma unroll
    for (int i = 0; i < MAX_LANE_DIMS; i++) {
        int dd = lane + i * WARP;
        if (dd < HEAD_DIM) store_act(out, out16, o + dd, acc[i] * inv);
    }
}

// Grouped scoring (the _g attention kernels): AG lanes compute one key's
// dot product together, AKPR keys a round, so each load instruction reads
// a few whole K rows (coalesced) instead of 32 rows one 16-byte piece at a
// time. Lane e = lane % AG of group lane / AG holds dims [e*AQD,
// (e+1)*AQD) of each half of the query and of its group's key, so a RoPE
// pair (i, i + HEAD_DIM/2) stays in one lane.
#if HEAD_DIM % 16 == 0
#define AG 8
#elif HEAD_DIM % 8 == 0
#define AG 4
#elif HEAD_DIM % 4 == 0
#define AG 2
#else
#define AG 1
#endif
#define AKPR (WARP / AG)
#define AQD (HEAD_DIM / (2 * AG))

// load_dims: AQD consecutive K elements at k.
__device__ __forceinline__ void load_dims(const float* k, float* out) {
#if AQD % 4 == 0
#pragma unroll
    for (int i = 0; i < AQD; i += 4) {
        float4 v = *reinterpret_cast<const float4*>(k + i);
        out[i] = v.x;
        out[i + 1] = v.y;
        out[i + 2] = v.z;
        out[i + 3] = v.w;
    }
#else
#pragma unroll
    for (int i = 0; i < AQD; i++) out[i] = k[i];
#endif
}

// cache_dims: a grouped lane's dims of cached key j (AQD from e0 in each
// half), through the sequence's block table bt.
__device__ __forceinline__ void cache_dims(const float* kcache, const int* bt, int j, int blockSize, int nKV,
                                           int kvh, int e0, float* ka, float* kb) {
    const float* k = kcache + cache_row(bt, j, blockSize, nKV, kvh);
    load_dims(k + e0, ka);
    load_dims(k + HEAD_DIM / 2 + e0, kb);
}

// score_grouped: attend's score for the grouped layout. dims(j, ka, kb)
// fills the lane's dims of key j (first half, second half); qa, qb are
// the same dims of the scaled query. The AG rounds are unrolled and load
// before any of them reduces, so their loads are in flight together (a
// rolled loop waited a memory latency per round); a lane whose key lies
// past pos loads key pos instead (a row that exists) and its score is
// dropped. Every lane of a group ends the butterfly with the same bits
// (each step adds the same two numbers).
template <typename Dims>
__device__ __forceinline__ float score_grouped(int base, int pos, const float* qa, const float* qb, Dims dims) {
    int lane = threadIdx.x & (WARP - 1);
    float part[AG];
#pragma unroll
    for (int r = 0; r < AG; r++) {
        float ka[AQD], kb[AQD];
        dims(min(base + r * AKPR + lane / AG, pos), ka, kb);
        float p = 0.f;
#pragma unroll
        for (int i = 0; i < AQD; i++) {
            p += ka[i] * qa[i];
            p += kb[i] * qb[i];
        }
        part[r] = p;
    }
    float s = NEG_INF;
#pragma unroll
    for (int r = 0; r < AG; r++) {
        float p = part[r];
#pragma unroll
        for (int o = 1; o < AG; o <<= 1) p += __shfl_xor_sync(0xffffffffu, p, o);
        float sr = __shfl_sync(0xffffffffu, p, (lane % AKPR) * AG); // group lane % AKPR: key base + lane
        if (lane / AKPR == r) s = sr;
    }
    return base + lane <= pos ? s : NEG_INF;
}

// query_dims: the lane's grouped dims (AQD from e0 in each half) of the
// scaled query in shared memory.
__device__ __forceinline__ void query_dims(const float* qw, int e0, float* qa, float* qb) {
#pragma unroll
    for (int i = 0; i < AQD; i++) {
        qa[i] = qw[e0 + i];
        qb[i] = qw[HEAD_DIM / 2 + e0 + i];
    }
}

// paged_attention_chunked: causal attention of every new token over its
// sequence's cached keys 0..position, whose K/V were stored, and q rotated
// in qkv, before this launch (gemv_qkv_rope: the GEMV path). One warp per
// (token, query head), taking 32 keys at a time (attend): a loop over one
// key at a time across the lanes was a chain of dependent steps per key
// (load K, 5 shuffles, exp, load V) of ~0.3 µs each, so a decode token
// with 40 keys took ~10 µs per layer. GROUPED = false: each lane computes
// its key's whole dot product from the pre-scaled query in shared memory
// (independent loads); true: score_grouped. The chunk's softmax update is
// one max and one sum over the warp, and the V accumulation loops over the
// chunk's keys with independent loads. out [T, nH*HEAD_DIM] (or out16 bf16
// when non-null); the other layouts above. grid = ceil(T*nH / 4), block = 128.
template <bool GROUPED>
__device__ __forceinline__ void paged_attention_chunked_t(float* __restrict__ out, const float* __restrict__ qkv,
                                                          const float* __restrict__ kcache,
                                                          const float* __restrict__ vcache,
                                                          const int* __restrict__ tokSeq,
                                                          const int* __restrict__ positions,
                                                          const int* __restrict__ blockTables, int btStride,
                                                          int T, int nH, int nKV, int blockSize, float scale,
                                                          unsigned short* __restrict__ out16) {
    __shared__ __align__(16) float qs[4][HEAD_DIM]; // blockDim.x == 128: one row per warp
    pdl_wait();
    int wib = threadIdx.x / WARP;
    int gw = blockIdx.x * (blockDim.x / WARP) + wib;
    int lane = threadIdx.x & (WARP - 1);
    if (gw >= T * nH) return; // whole warp exits together; only __syncwarp below
    int t = gw / nH, h = gw % nH;
    int kvh = h / (nH / nKV);
    int stride = (nH + 2 * nKV) * HEAD_DIM;
    const float* q = qkv + (i64)t * stride + h * HEAD_DIM;
    float* qw = qs[wib];
    for (int d = lane; d < HEAD_DIM; d += WARP) qw[d] = q[d] * scale;
    __syncwarp();
    const int* bt = blockTables + (i64)tokSeq[t] * btStride;
    int pos = positions[t];
    auto vrow = [&](int j) { return vcache + cache_row(bt, j, blockSize, nKV, kvh); };
    i64 o = ((i64)t * nH + h) * HEAD_DIM;
    if (GROUPED) {
        int e0 = (lane % AG) * AQD;
        float qa[AQD], qb[AQD];
        query_dims(qw, e0, qa, qb);
        auto dims = [&](int j, float* ka, float* kb) { cache_dims(kcache, bt, j, blockSize, nKV, kvh, e0, ka, kb); };
        attend(out, out16, o, pos, [&](int base) { return score_grouped(base, pos, qa, qb, dims); }, vrow);
        return;
    }
    attend(out, out16, o, pos, [&](int base) {
        int j = base + lane;
        return j <= pos ? dot_q(kcache + cache_row(bt, j, blockSize, nKV, kvh), qw) : NEG_INF;
    }, vrow);
}

// paged_attention_rope: RoPE, the K/V cache store and
// paged_attention_chunked in one launch (same grid, block and output): the
// attention of the cuBLAS path, whose QKV GEMM leaves q, k and v in qkv
// not rotated. Warp (t, h) rotates its query; the warp of each KV head's
// first query head rotates token t's key of that head and stores it, and
// the value, in t's cache slot. Keys at positions this launch stores (the
// sequence's chunk: contiguous in T, consecutive positions) are read from
// the qkv rows and rotated here, since other warps of the launch are still
// writing their cache slots; earlier keys come from the cache. The
// rotation is gemv_qkv_rope's and each dot product
// paged_attention_chunked's (of the same GROUPED), term for term. out16
// [T, nH*HEAD_DIM] bf16: written instead of out when non-null.
template <bool GROUPED>
__device__ __forceinline__ void paged_attention_rope_t(float* __restrict__ out, const float* __restrict__ qkv,
                                                       const float* __restrict__ cosSin,
                                                       const int* __restrict__ slots,
                                                       float* __restrict__ kcache, float* __restrict__ vcache,
                                                       const int* __restrict__ tokSeq,
                                                       const int* __restrict__ positions,
                                                       const int* __restrict__ blockTables, int btStride,
                                                       int T, int nH, int nKV, int blockSize, float scale,
                                                       unsigned short* __restrict__ out16) {
    __shared__ __align__(16) float qs[4][HEAD_DIM]; // blockDim.x == 128: one row per warp
    const int half = HEAD_DIM / 2;
    pdl_wait();
    int wib = threadIdx.x / WARP;
    int gw = blockIdx.x * (blockDim.x / WARP) + wib;
    int lane = threadIdx.x & (WARP - 1);
    if (gw >= T * nH) return; // whole warp exits together; only __syncwarp below
    int t = gw / nH, h = gw % nH;
    int group = nH / nKV;
    int kvh = h / group;
    int stride = (nH + 2 * nKV) * HEAD_DIM;
    const float* row = qkv + (i64)t * stride;
    int pos = positions[t];
    int seq = tokSeq[t];
    const float* cs = cosSin + (i64)pos * half * 2;
    float* qw = qs[wib];
    for (int i = lane; i < half; i += WARP) {
        float y1, y2;
        rope_pair(row[h * HEAD_DIM + i], row[h * HEAD_DIM + i + half], cs[2 * i], cs[2 * i + 1], y1, y2);
        qw[i] = y1 * scale;
        qw[i + half] = y2 * scale;
    }
    int slot = slots[t];
    if (slot >= 0 && h % group == 0) {
        const float* k = row + (nH + kvh) * HEAD_DIM;
        const float* v = row + (nH + nKV + kvh) * HEAD_DIM;
        float* kd = kcache + ((i64)slot * nKV + kvh) * HEAD_DIM;
        float* vd = vcache + ((i64)slot * nKV + kvh) * HEAD_DIM;
        for (int i = lane; i < half; i += WARP)
            rope_pair(k[i], k[i + half], cs[2 * i], cs[2 * i + 1], kd[i], kd[i + half]);
        for (int d = lane; d < HEAD_DIM; d += WARP) vd[d] = v[d];
    }
    __syncwarp();
    // c0: the first token of t's chunk (32 earlier tokens per round).
    int c0 = t;
    for (;;) {
        int tt = c0 - 1 - lane;
        unsigned other = __ballot_sync(0xffffffffu, tt < 0 || tokSeq[tt] != seq);
        if (other) {
            c0 -= __ffs(other) - 1;
            break;
        }
        c0 -= WARP;
    }
    int firstPos = positions[c0];
    const int* bt = blockTables + (i64)seq * btStride;
    // qkvKey: key j's row in qkv (j >= firstPos), not rotated.
    auto qkvKey = [&](int j) { return qkv + (i64)(c0 + (j - firstPos)) * stride + (nH + kvh) * HEAD_DIM; };
    auto vrow = [&](int j) -> const float* {
        if (j < firstPos) return vcache + cache_row(bt, j, blockSize, nKV, kvh);
        return qkvKey(j) + nKV * HEAD_DIM;
    };
    i64 o = ((i64)t * nH + h) * HEAD_DIM;
    if (GROUPED) {
        int e0 = (lane % AG) * AQD;
        float qa[AQD], qb[AQD];
        query_dims(qw, e0, qa, qb);
        auto dims = [&](int j, float* ka, float* kb) {
            if (j < firstPos) {
                cache_dims(kcache, bt, j, blockSize, nKV, kvh, e0, ka, kb);
                return;
            }
            const float* k = qkvKey(j);
            const float* cj = cosSin + (i64)j * half * 2;
#pragma unroll
            for (int i = 0; i < AQD; i++) {
                int d = e0 + i;
                rope_pair(k[d], k[d + half], cj[2 * d], cj[2 * d + 1], ka[i], kb[i]);
            }
        };
        attend(out, out16, o, pos, [&](int base) { return score_grouped(base, pos, qa, qb, dims); }, vrow);
        return;
    }
    attend(out, out16, o, pos, [&](int base) {
        int j = base + lane;
        if (j > pos) return NEG_INF;
        if (j < firstPos) return dot_q(kcache + cache_row(bt, j, blockSize, nKV, kvh), qw);
        const float* k = qkvKey(j);
        const float* cj = cosSin + (i64)j * half * 2;
        float kd[HEAD_DIM]; // key j rotated, as stored in the cache (registers)
#pragma unroll
        for (int i = 0; i < half; i++) rope_pair(k[i], k[i + half], cj[2 * i], cj[2 * i + 1], kd[i], kd[i + half]);
        float dot = 0.f; // dot_q's order
#if HEAD_DIM % 4 == 0
#pragma unroll
        for (int d = 0; d < HEAD_DIM; d += 4) {
            float4 qv = *reinterpret_cast<const float4*>(qw + d);
            dot += kd[d] * qv.x + kd[d + 1] * qv.y + kd[d + 2] * qv.z + kd[d + 3] * qv.w;
        }
#else
#pragma unroll
        for (int d = 0; d < HEAD_DIM; d++) dot += kd[d] * qw[d];
#endif
        return dot;
    }, vrow);
}

#define ATTN_ARGS                                                                                      \
    float *__restrict__ out, const float *__restrict__ qkv, const float *__restrict__ kcache,          \
        const float *__restrict__ vcache, const int *__restrict__ tokSeq,                               \
        const int *__restrict__ positions, const int *__restrict__ blockTables, int btStride, int T,   \
        int nH, int nKV, int blockSize, float scale, unsigned short *__restrict__ out16
#define ATTN_PASS out, qkv, kcache, vcache, tokSeq, positions, blockTables, btStride, T, nH, nKV, blockSize, scale, out16
extern "C" __global__ void paged_attention_chunked(ATTN_ARGS) { paged_attention_chunked_t<false>(ATTN_PASS); }
extern "C" __global__ void paged_attention_chunked_g(ATTN_ARGS) { paged_attention_chunked_t<true>(ATTN_PASS); }

#define ROPE_ARGS                                                                                      \
    float *__restrict__ out, const float *__restrict__ qkv, const float *__restrict__ cosSin,         \
        const int *__restrict__ slots, float *__restrict__ kcache, float *__restrict__ vcache,           \
        const int *__restrict__ tokSeq, const int *__restrict__ positions,                             \
        const int *__restrict__ blockTables, int btStride, int T, int nH, int nKV, int blockSize,      \
        float scale, unsigned short *__restrict__ out16
#define ROPE_PASS                                                                                      \
    out, qkv, cosSin, slots, kcache, vcache, tokSeq, positions, blockTables, btStride, T, nH, nKV, blockSize, scale, out16
extern "C" __global__ void paged_attention_rope(ROPE_ARGS) { paged_attention_rope_t<false>(ROPE_PASS); }
extern "C" __global__ void paged_attention_rope_g(ROPE_ARGS) { paged_attention_rope_t<true>(ROPE_PASS); }

// silu_mul: act[t, i] = silu(gu[t, i]) * gu[t, ffn + i].
// gu [T, 2*ffn] (gate then up, one fused GEMM); act [T, ffn] (or act16
// [T, ffn] bf16 when non-null). Grid-stride.
// Indices are 32-bit when T * ffn fits (always, at the engine's batch
// sizes): a 64-bit division per element is slow on the GPU.
extern "C" __global__ void silu_mul(float* __restrict__ act, const float* __restrict__ gu,
                                    int T, int ffn, unsigned short* __restrict__ act16) {
    i64 n = (i64)T * ffn;
    if (n <= 0x7fffffffLL) { // e + the grid stride stays below 2^32
        unsigned un = (unsigned)n, uf = (unsigned)ffn;
        for (unsigned e = blockIdx.x * blockDim.x + threadIdx.x; e < un; e += gridDim.x * blockDim.x) {
            unsigned t = e / uf, i = e - t * uf;
            const float* row = gu + (i64)t * 2 * ffn;
            float g = row[i], u = row[uf + i];
            store_act(act, act16, e, silu_up(g, u));
        }
        return;
    }
    for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (i64)gridDim.x * blockDim.x) {
        i64 t = e / ffn;
        int i = (int)(e - t * ffn);
        float g = gu[t * 2 * ffn + i];
        float u = gu[t * 2 * ffn + ffn + i];
        store_act(act, act16, e, silu_up(g, u));
    }
}

// silu_mul16: silu_mul on the gate/up GEMM's bf16 output
// (Options.GateUpBF16): act16[t, i] = bf16(silu(g) * u) with g = gu16[t, i]
// and u = gu16[t, ffn + i]. Eight elements a thread and 16-byte loads
// (ffn % 8 == 0); T * ffn / 8 < 2^31. Grid-stride.
__device__ __forceinline__ unsigned silu_mul2(unsigned g, unsigned u) {
    float g0 = bf_lo(g), g1 = bf_hi(g);
    float a0 = silu_up(g0, bf_lo(u)), a1 = silu_up(g1, bf_hi(u));
    return (unsigned)f2bf(a0) | ((unsigned)f2bf(a1) << 16);
}

extern "C" __global__ void silu_mul16(unsigned short* __restrict__ act16, const unsigned short* __restrict__ gu16,
                                      int T, int ffn) {
    unsigned f8 = (unsigned)ffn / 8, n = (unsigned)T * f8;
    const uint4* gu = reinterpret_cast<const uint4*>(gu16);
    uint4* act = reinterpret_cast<uint4*>(act16);
    for (unsigned e = blockIdx.x * blockDim.x + threadIdx.x; e < n; e += gridDim.x * blockDim.x) {
        unsigned t = e / f8, i = e - t * f8;
        uint4 g = gu[(i64)t * 2 * f8 + i], u = gu[(i64)t * 2 * f8 + f8 + i];
        act[e] = make_uint4(silu_mul2(g.x, u.x), silu_mul2(g.y, u.y), silu_mul2(g.z, u.z), silu_mul2(g.w, u.w));
    }
}

// copy_blocks: for every pair p and every layer-half lk (2*layer + {0:K,1:V}),
// copies the first slots[p] slots of block src[p] to dst[p] (a block is
// slot-major: slot s holds elements [s*slotElems, (s+1)*slotElems)).
// cache [2*L, numBlocks, blockElems]. grid = (npairs, 2*L), block = 256.
extern "C" __global__ void copy_blocks(float* __restrict__ cache, const int* __restrict__ src,
                                       const int* __restrict__ dst, const int* __restrict__ slots,
                                       i64 numBlocks, int blockElems, int slotElems) {
    int p = blockIdx.x, lk = blockIdx.y;
    float* base = cache + (i64)lk * numBlocks * blockElems;
    const float* s = base + (i64)src[p] * blockElems;
    float* d = base + (i64)dst[p] * blockElems;
    int n = slots[p] * slotElems;
    for (int i = threadIdx.x; i < n; i += blockDim.x) d[i] = s[i];
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
// Same conventions as sampler.LogSumExp on the host: NaNs are ignored
// (fmaxf drops them from the max, and they add 0 to the sum); a row whose
// max is -Inf (all -Inf or NaN) gives -Inf, a row holding +Inf gives +Inf
// (no Inf - Inf = NaN in the shifted sum).
// logits [R, V]; out [R]. grid = R, block = 1024 (rowLSEThreads; any
// multiple of 32 up to 1024 works). The loops are unrolled so that each
// thread has several loads in flight.
extern "C" __global__ void row_lse(float* __restrict__ out, const float* __restrict__ logits, int V) {
    pdl_wait();
    const float* row = logits + (i64)blockIdx.x * V;
    float m = NEG_INF;
#pragma unroll 8
    for (int i = threadIdx.x; i < V; i += blockDim.x) m = fmaxf(m, row[i]);
    m = block_max(m);
    if (m == NEG_INF || m == -NEG_INF) { // uniform over the block: every thread returns here
        if (threadIdx.x == 0) out[blockIdx.x] = m;
        return;
    }
    float s = 0.f;
#pragma unroll 8
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float v = row[i];
        if (v == v) s += expf(v - m);
    }
    s = block_sum(s);
    if (threadIdx.x == 0) out[blockIdx.x] = m + logf(s);
}

// ---------------------------------------------------------------------------
// Small-batch path (M ≤ GEMV_MAX_M tokens, i.e. single-sequence and small
// decode steps): hand-written GEMVs that read each weight row once for all M
// tokens, with the neighbouring element-wise work fused in, so that a decoder
// layer is 5 launches instead of 9 (and cuBLAS's M=1 GEMM picks are avoided).
// Weights stay float32 and are multiplied in exact float32 FMAs.
// Every GEMV kernel: block = GEMV_THREADS (4 warps), one output unit per
// warp, dynamic shared memory M*K floats holding the block's copy of the
// (normalised) input rows. K must be a multiple of 4 (float4 loads); the
// host checks this and M*K*4 ≤ 48 KiB before choosing this path.
// ---------------------------------------------------------------------------

#define GEMV_MAX_M 8
#define GEMV_THREADS 128
#define GEMV_WARPS (GEMV_THREADS / WARP)

// load_rows first calls pdl_wait, then fills xs [M, K] (shared) with input
// rows and, when g != 0,
// applies RMSNorm with weight g [K]: xs[m,k] = x[m,k] * inv_rms(x[m]) * g[k].
// Row m comes from x + src*K with src = rows ? rows[m] : m. When copy_to != 0,
// block 0 also writes the raw rows to copy_to [M, K] (the embedding gather of
// layer 0 writing the residual stream). Ends with __syncthreads().
__device__ void load_rows(float* xs, const float* __restrict__ x, const int* __restrict__ rows,
                          float* __restrict__ copy_to, const float* __restrict__ g, float eps,
                          int M, int K) {
    __shared__ float inv[GEMV_MAX_M];
    __shared__ int src[GEMV_MAX_M];
    pdl_wait();
    // Row indices first (one load), so that the copy below has no
    // dependent load chain; float4 copies, unrolled so that each thread
    // has several loads in flight (a rolled loop waited a full memory
    // latency per element, which dominated a decode step).
    if (threadIdx.x < M) src[threadIdx.x] = rows ? rows[threadIdx.x] : threadIdx.x;
    __syncthreads();
    int K4 = K / 4;
    float4* xs4 = reinterpret_cast<float4*>(xs);
    const float4* x4 = reinterpret_cast<const float4*>(x);
#pragma unroll 8
    for (int i = threadIdx.x; i < M * K4; i += blockDim.x) {
        int m = i / K4, k = i - m * K4;
        float4 v = x4[(i64)src[m] * K4 + k];
        xs4[i] = v;
        if (copy_to && blockIdx.x == 0) reinterpret_cast<float4*>(copy_to)[i] = v;
    }
    __syncthreads();
    if (!g) return;
    int w = threadIdx.x / WARP, lane = threadIdx.x & (WARP - 1);
    for (int m = w; m < M; m += blockDim.x / WARP) {
        float ss = 0.f;
        for (int k = lane; k < K4; k += WARP) {
            float4 v = xs4[m * K4 + k];
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
        ss = warp_sum(ss);
        if (lane == 0) inv[m] = 1.0f / sqrtf(ss / (float)K + eps);
    }
    __syncthreads();
    const float4* g4 = reinterpret_cast<const float4*>(g);
#pragma unroll 8
    for (int i = threadIdx.x; i < M * K4; i += blockDim.x) {
        int m = i / K4, k = i - m * K4;
        float4 v = xs4[i], gv = __ldg(g4 + k);
        float s = inv[m];
        v.x = v.x * s * gv.x;
        v.y = v.y * s * gv.y;
        v.z = v.z * s * gv.z;
        v.w = v.w * s * gv.w;
        xs4[i] = v;
    }
    __syncthreads();
}

// warp_dot: acc[m] = Σ_k w[k] * xs[m, k] for m < M, summed over the warp
// (every lane gets the sums). w [K] in global memory, float32 (K % 4 == 0)
// or bfloat16 bits (K % 8 == 0); xs [M, K] in shared memory.
__device__ __forceinline__ void warp_dot(const float* __restrict__ w, const float* xs, int M, int K,
                                         float acc[GEMV_MAX_M]) {
    int lane = threadIdx.x & (WARP - 1);
    const float4* w4 = reinterpret_cast<const float4*>(w);
    const float4* x4 = reinterpret_cast<const float4*>(xs);
    int K4 = K / 4;
#pragma unroll
    for (int m = 0; m < GEMV_MAX_M; m++) acc[m] = 0.f;
#pragma unroll 4
    for (int k = lane; k < K4; k += WARP) {
        float4 a = __ldg(w4 + k);
#pragma unroll
        for (int m = 0; m < GEMV_MAX_M; m++) {
            if (m < M) {
                float4 b = x4[m * K4 + k];
                acc[m] += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
            }
        }
    }
#pragma unroll
    for (int m = 0; m < GEMV_MAX_M; m++)
        if (m < M) acc[m] = warp_sum(acc[m]);
}

// bf16 weights: 8 per 16-byte load; bfloat16 → float32 is exact (bf_lo,
// bf_hi), so a model stored in bf16 computes exactly what the float32
// kernel computes, reading half the bytes.

__device__ __forceinline__ void warp_dot(const unsigned short* __restrict__ w, const float* xs, int M,
                                         int K, float acc[GEMV_MAX_M]) {
    int lane = threadIdx.x & (WARP - 1);
    const uint4* w8 = reinterpret_cast<const uint4*>(w);
    const float4* x4 = reinterpret_cast<const float4*>(xs);
    int K8 = K / 8, K4 = K / 4;
#pragma unroll
    for (int m = 0; m < GEMV_MAX_M; m++) acc[m] = 0.f;
#pragma unroll 2
    for (int k = lane; k < K8; k += WARP) {
        uint4 a = __ldg(w8 + k);
        float w0 = bf_lo(a.x), w1 = bf_hi(a.x), w2 = bf_lo(a.y), w3 = bf_hi(a.y);
        float w4_ = bf_lo(a.z), w5 = bf_hi(a.z), w6 = bf_lo(a.w), w7 = bf_hi(a.w);
#pragma unroll
        for (int m = 0; m < GEMV_MAX_M; m++) {
            if (m < M) {
                float4 b = x4[m * K4 + 2 * k], c = x4[m * K4 + 2 * k + 1];
                acc[m] += w0 * b.x + w1 * b.y + w2 * b.z + w3 * b.w + w4_ * c.x + w5 * c.y + w6 * c.z + w7 * c.w;
            }
        }
    }
#pragma unroll
    for (int m = 0; m < GEMV_MAX_M; m++)
        if (m < M) acc[m] = warp_sum(acc[m]);
}

// The three GEMV kernels are templates over the weight type WT (float or
// bf16 bits as unsigned short), instantiated below under extern "C" names:
// gemv / gemv_bf16, gemv_qkv_rope / gemv_qkv_rope_bf16, gemv_gu_silu /
// gemv_gu_silu_bf16.

// gemv: y[m, n] = W[n, :] · in(m) (+ y[m, n] when accumulate), where in(m)
// is row (rows ? rows[m] : m) of x [*, K], RMSNorm'ed with g [K] when
// g != 0. W [N, K]; y [M, N]. grid = ceil(N / GEMV_WARPS).
// Used for the attention output and down projections (accumulate into the
// residual stream) and for the LM head (rows = sampled rows, g = final norm).
template <typename WT>
__device__ void gemv_t(float* __restrict__ y, const float* __restrict__ x, const int* __restrict__ rows,
                       const float* __restrict__ g, float eps, const WT* __restrict__ W, int M, int N, int K,
                       int accumulate) {
    extern __shared__ float4 smem4[];
    float* xs = reinterpret_cast<float*>(smem4);
    int n = blockIdx.x * GEMV_WARPS + threadIdx.x / WARP;
    if (n < N) prefetch_l2(W + (i64)n * K, K * (int)sizeof(WT));
    load_rows(xs, x, rows, 0, g, eps, M, K);
    if (n >= N) return;
    float acc[GEMV_MAX_M];
    warp_dot(W + (i64)n * K, xs, M, K, acc);
    int lane = threadIdx.x & (WARP - 1);
#pragma unroll
    for (int m = 0; m < GEMV_MAX_M; m++) {
        if (m < M && lane == m) {
            float* o = y + (i64)m * N + n;
            *o = accumulate ? *o + acc[m] : acc[m];
        }
    }
}

// gemv_qkv_rope: the attention input of one layer for M tokens in one
// launch: RMSNorm (g) of the residual rows, the fused [q|k|v] projection,
// RoPE on q and k (rotate_half pairs i, i+HEAD_DIM/2 are computed by the
// same warp), and the K/V cache writes. For layer 0, ids != 0
// makes x the embedding table [V, K] gathered by ids [M], and block 0 writes
// the raw embeddings to resid [M, K] (the residual stream).
// W [qkvDim, K] (rows of Wq, Wk, Wv); qkv [M, qkvDim]; cosSin, positions,
// slots, kcache, vcache as above. One warp per row pair:
// grid = ceil(qkvDim/2 / GEMV_WARPS).
template <typename WT>
__device__ void gemv_qkv_rope_t(float* __restrict__ qkv, const float* __restrict__ x,
                                const int* __restrict__ ids, float* __restrict__ resid,
                                const float* __restrict__ g, float eps, const WT* __restrict__ W,
                                const float* __restrict__ cosSin, const int* __restrict__ positions,
                                const int* __restrict__ slots, float* __restrict__ kcache,
                                float* __restrict__ vcache, int M, int K, int nH, int nKV) {
    extern __shared__ float4 smem4[];
    float* xs = reinterpret_cast<float*>(smem4);
    const int half = HEAD_DIM / 2;
    int qkvDim = (nH + 2 * nKV) * HEAD_DIM;
    int u = blockIdx.x * GEMV_WARPS + threadIdx.x / WARP;
    int head = u / half, i = u - head * half;
    int r1 = head * HEAD_DIM + i, r2 = r1 + half;
    if (u < qkvDim / 2) {
        prefetch_l2(W + (i64)r1 * K, K * (int)sizeof(WT));
        prefetch_l2(W + (i64)r2 * K, K * (int)sizeof(WT));
    }
    load_rows(xs, x, ids, ids ? resid : 0, g, eps, M, K);
    if (u >= qkvDim / 2) return;
    float a1[GEMV_MAX_M], a2[GEMV_MAX_M];
    warp_dot(W + (i64)r1 * K, xs, M, K, a1);
    warp_dot(W + (i64)r2 * K, xs, M, K, a2);
    int lane = threadIdx.x & (WARP - 1);
#pragma unroll
    for (int m = 0; m < GEMV_MAX_M; m++) {
        if (m < M && lane == m) {
            float x1 = a1[m], x2 = a2[m];
            int slot = slots[m];
            if (head < nH + nKV) { // q or k head: rotate
                const float* cs = cosSin + ((i64)positions[m] * half + i) * 2;
                rope_pair(x1, x2, cs[0], cs[1], x1, x2); // inputs are copies
            }
            float* row = qkv + (i64)m * qkvDim;
            row[r1] = x1;
            row[r2] = x2;
            if (head >= nH && slot >= 0) {
                int kv = head < nH + nKV ? head - nH : head - nH - nKV;
                float* dst = (head < nH + nKV ? kcache : vcache) + ((i64)slot * nKV + kv) * HEAD_DIM;
                dst[i] = x1;
                dst[i + half] = x2;
            }
        }
    }
}

// gemv_gu_silu: the MLP's first half for M tokens in one launch: RMSNorm
// (g) of the residual rows x [M, K], gate row i and up row ffn+i of
// W [2*ffn, K] in the same warp, act[m, i] = silu(gate) * up.
// act [M, ffn]. grid = ceil(ffn / GEMV_WARPS).
template <typename WT>
__device__ void gemv_gu_silu_t(float* __restrict__ act, const float* __restrict__ x,
                               const float* __restrict__ g, float eps, const WT* __restrict__ W, int M,
                               int K, int ffn) {
    extern __shared__ float4 smem4[];
    float* xs = reinterpret_cast<float*>(smem4);
    int i = blockIdx.x * GEMV_WARPS + threadIdx.x / WARP;
    if (i < ffn) {
        prefetch_l2(W + (i64)i * K, K * (int)sizeof(WT));
        prefetch_l2(W + (i64)(ffn + i) * K, K * (int)sizeof(WT));
    }
    load_rows(xs, x, 0, 0, g, eps, M, K);
    if (i >= ffn) return;
    float ag[GEMV_MAX_M], au[GEMV_MAX_M];
    warp_dot(W + (i64)i * K, xs, M, K, ag);
    warp_dot(W + (i64)(ffn + i) * K, xs, M, K, au);
    int lane = threadIdx.x & (WARP - 1);
#pragma unroll
    for (int m = 0; m < GEMV_MAX_M; m++) {
        if (m < M && lane == m) {
            float gt = ag[m];
            act[(i64)m * ffn + i] = silu_up(gt, au[m]);
        }
    }
}

#define GEMV_ENTRY(NAME, WT)                                                                          \
    extern "C" __global__ void NAME(float* __restrict__ y, const float* __restrict__ x,               \
                                    const int* __restrict__ rows, const float* __restrict__ g,        \
                                    float eps, const WT* __restrict__ W, int M, int N, int K,         \
                                    int accumulate) {                                                 \
        gemv_t<WT>(y, x, rows, g, eps, W, M, N, K, accumulate);                                       \
    }
GEMV_ENTRY(gemv, float)
GEMV_ENTRY(gemv_bf16, unsigned short)

#define QKV_ENTRY(NAME, WT)                                                                           \
    extern "C" __global__ void NAME(float* __restrict__ qkv, const float* __restrict__ x,             \
                                    const int* __restrict__ ids, float* __restrict__ resid,           \
                                    const float* __restrict__ g, float eps, const WT* __restrict__ W, \
                                    const float* __restrict__ cosSin,                                 \
                                    const int* __restrict__ positions, const int* __restrict__ slots, \
                                    float* __restrict__ kcache, float* __restrict__ vcache, int M,    \
                                    int K, int nH, int nKV) {                                         \
        gemv_qkv_rope_t<WT>(qkv, x, ids, resid, g, eps, W, cosSin, positions, slots, kcache, vcache, \
                            M, K, nH, nKV);                                                           \
    }
QKV_ENTRY(gemv_qkv_rope, float)
QKV_ENTRY(gemv_qkv_rope_bf16, unsigned short)

#define GU_ENTRY(NAME, WT)                                                                            \
    extern "C" __global__ void NAME(float* __restrict__ act, const float* __restrict__ x,             \
                                    const float* __restrict__ g, float eps, const WT* __restrict__ W, \
                                    int M, int K, int ffn) {                                          \
        gemv_gu_silu_t<WT>(act, x, g, eps, W, M, K, ffn);                                             \
    }
GU_ENTRY(gemv_gu_silu, float)
GU_ENTRY(gemv_gu_silu_bf16, unsigned short)

// mark_done: flag[0] = v (one thread). Enqueued after a LaunchDraw's copies
// back (cuda/async.go): the stream runs it only when they are complete,
// and the host polls the word (page-locked memory, reached through its
// unified address) instead of a driver call on the CUDA thread. The fence
// orders any earlier device writes before the flag.
extern "C" __global__ void mark_done(volatile unsigned int* flag, unsigned int v) {
    __threadfence_system();
    flag[0] = v;
}
