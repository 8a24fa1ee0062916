// ---------------------------------------------------------------------------
// Drawing tokens where the logits are (Backend.ForwardDraw, cuda/draw.go).
// This file is appended to llama.cu into one NVRTC program (kernelSource in
// kernels.go), so it uses llama.cu's WARP, NEG_INF and i64.
//
// draw_rows implements sampler.DrawRow (notes: the device draw's exact
// definition), arithmetic included: the float32 products/sums are spelled
// with __fmul_rn/__fadd_rn/__fsub_rn so that NVRTC cannot contract them
// into FMAs, exp runs in double and is rounded to float, every sum of
// probabilities is a double. Only the order of those double sums differs
// from the Go reference (tree reductions), which can move a boundary token
// in rare cases; greedy and forced results are exact.
// ---------------------------------------------------------------------------

#define DRAW_THREADS 512
#define DRAW_WARPS (DRAW_THREADS / WARP)
// DRAW_WORDS int32s per draw in the spec array (see draw.go, packDraws):
// row, force, mask, temperature, top-p, min-p (float bits), top-k,
// u low word, u high word, exclude offset, exclude count.
#define DRAW_WORDS 11
#define DRAW_ROUNDS 64
#define DRAW_NONE 0x7fffffff

__device__ __forceinline__ unsigned long long draw_splitmix64(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

// draw_uniform: sampler.DrawUniform, round r's uniform number.
__device__ __forceinline__ double draw_uniform(double u, int r) {
    if (r == 0) return u;
    unsigned long long z = draw_splitmix64((unsigned long long)__double_as_longlong(u) +
                                           (unsigned long long)r * 0x9E3779B97F4A7C15ULL);
    return (double)(z >> 11) * __longlong_as_double(0x3CA0000000000000LL); // · 2^-53, exact
}

// draw_next_down: nextafter32(m, -Inf) for m > -Inf (Go's math.Nextafter32).
__device__ __forceinline__ float draw_next_down(float m) {
    if (m == 0.0f) return __int_as_float(0x80000001); // ±0 → the negative smallest denormal
    int b = __float_as_int(m);
    return __int_as_float(m > 0.0f ? b - 1 : b + 1);
}

// Block-wide reductions for DRAW_THREADS threads. Every thread gets the
// result, bitwise identical in every thread (the butterfly adds commute,
// the warp partials are combined in one fixed order by every thread), so
// the decisions taken on it are uniform over the block. Each ends with
// __syncthreads(): back-to-back calls may reuse the partials.

// draw_argmax: the maximum of m over the block and the lowest im holding it.
__device__ void draw_argmax(float& m, int& im) {
    __shared__ float pm[DRAW_WARPS];
    __shared__ int pi[DRAW_WARPS];
    int lane = threadIdx.x & (WARP - 1), w = threadIdx.x / WARP;
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o);
        int i2 = __shfl_xor_sync(0xffffffffu, im, o);
        if (m2 > m || (m2 == m && i2 < im)) { m = m2; im = i2; }
    }
    if (lane == 0) { pm[w] = m; pi[w] = im; }
    __syncthreads();
    m = pm[0];
    im = pi[0];
    for (int k = 1; k < DRAW_WARPS; k++) {
        float m2 = pm[k];
        int i2 = pi[k];
        if (m2 > m || (m2 == m && i2 < im)) { m = m2; im = i2; }
    }
    __syncthreads();
}

// draw_sum_count: the block's sums of a (double) and n (int).
__device__ void draw_sum_count(double& a, int& n) {
    __shared__ double pa[DRAW_WARPS];
    __shared__ int pn[DRAW_WARPS];
    int lane = threadIdx.x & (WARP - 1), w = threadIdx.x / WARP;
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) {
        a += __shfl_xor_sync(0xffffffffu, a, o);
        n += __shfl_xor_sync(0xffffffffu, n, o);
    }
    if (lane == 0) { pa[w] = a; pn[w] = n; }
    __syncthreads();
    a = 0.0;
    n = 0;
    for (int k = 0; k < DRAW_WARPS; k++) { a += pa[k]; n += pn[k]; }
    __syncthreads();
}

// draw_min_max: the block's minimum of lo and maximum of hi.
__device__ void draw_min_max(int& lo, int& hi) {
    __shared__ int plo[DRAW_WARPS], phi[DRAW_WARPS];
    int lane = threadIdx.x & (WARP - 1), w = threadIdx.x / WARP;
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) {
        lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, o));
        hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, o));
    }
    if (lane == 0) { plo[w] = lo; phi[w] = hi; }
    __syncthreads();
    lo = plo[0];
    hi = phi[0];
    for (int k = 1; k < DRAW_WARPS; k++) { lo = min(lo, plo[k]); hi = max(hi, phi[k]); }
    __syncthreads();
}

// draw_scan: the exclusive prefix sum of v over the threads in order
// (thread 0 gets 0), and the block total (the same in every thread).
__device__ double draw_scan(double v, double& total) {
    __shared__ double pw[DRAW_WARPS];
    int lane = threadIdx.x & (WARP - 1), w = threadIdx.x / WARP;
    double inc = v;
#pragma unroll
    for (int o = 1; o < WARP; o <<= 1) {
        double t = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += t;
    }
    double exc = __shfl_up_sync(0xffffffffu, inc, 1);
    if (lane == 0) exc = 0.0;
    if (lane == WARP - 1) pw[w] = inc;
    __syncthreads();
    double base = 0.0, tot = 0.0;
    for (int k = 0; k < DRAW_WARPS; k++) {
        if (k == w) base = tot;
        tot += pw[k];
    }
    __syncthreads();
    total = tot;
    return base + exc;
}

// draw_in: is token i with probability q in S_r (step 5 and 6 of the
// definition)? cut: a token was rejected; (pc, jc) is the last one.
__device__ __forceinline__ bool draw_in(float q, int i, bool useMin, float minP, bool cut, float pc, int jc) {
    if (!(q > 0.0f) || (useMin && !(q >= minP))) return false;
    return !cut || q > pc || (q == pc && i < jc);
}

// draw_rows: one block of DRAW_THREADS threads per draw; dynamic shared
// memory V floats (the masked row, then its probabilities p in place).
// out [nDraws, 2] int32: the token (-1: dead end) and the bits of the raw
// logit logits[row, token] (-Inf for a dead end). logits [R, V] (row-major,
// the LM head's output); spec [nDraws, DRAW_WORDS]; excl: the exclude
// lists (spec's offsets index it); masks [nMasks, maskWords] allowed-token
// bitsets (read only for a draw whose mask ≥ 0). grid = nDraws.
//
// Passes: mask (global → shared, coalesced), argmax, p and Z (one
// reduction), then per round: each thread sums its contiguous chunk of
// ids over S_r, a block exclusive scan places the chunks, the thread(s)
// whose chunk holds the crossing walk it, one reduction picks j (and the
// largest id of S_r, the fallback when rounding leaves none); the
// nucleus test (one more pass and reduction) is skipped when j is im and
// no other token ties im's p = 1 below it (im is then first in sorted
// order, so in every nucleus), or when neither top-p nor top-k is on.
extern "C" __global__ void __launch_bounds__(DRAW_THREADS)
draw_rows(int* __restrict__ out, const float* __restrict__ logits, int V, const int* __restrict__ spec,
          const int* __restrict__ excl, const unsigned long long* __restrict__ masks, int maskWords) {
    extern __shared__ float dp[];
    const int tid = threadIdx.x;
    const int* s = spec + (i64)blockIdx.x * DRAW_WORDS;
    const int row = s[0], force = s[1], mask = s[2];
    const float* x = logits + (i64)row * V;
    int* o = out + 2 * (i64)blockIdx.x;
    if (force >= 0) {
        if (tid == 0) { o[0] = force; o[1] = __float_as_int(x[force]); }
        return;
    }
    const float T = __int_as_float(s[3]), topP = __int_as_float(s[4]), minP = __int_as_float(s[5]);
    const int topK = s[6];
    const double u = __hiloint2double(s[8], s[7]);
    const int exOff = s[9], exN = s[10];

    // Step 1: w = the row masked (not allowed, excluded or NaN → -Inf).
    const unsigned long long* mk = mask >= 0 ? masks + (i64)mask * maskWords : 0;
#pragma unroll 4
    for (int i = tid; i < V; i += DRAW_THREADS) {
        float v = x[i];
        bool ok = v == v;
        if (mk) ok = ok && ((mk[i >> 6] >> (i & 63)) & 1ULL);
        dp[i] = ok ? v : NEG_INF;
    }
    __syncthreads();
    if (tid < exN) {
        int e = excl[exOff + tid];
        if (e >= 0 && e < V) dp[e] = NEG_INF;
    }
    __syncthreads();

    // Step 2: m, im (lowest id of the max); dead end; greedy.
    float m = NEG_INF;
    int im = DRAW_NONE;
    for (int i = tid; i < V; i += DRAW_THREADS) {
        float v = dp[i];
        if (v > m) { m = v; im = i; }
    }
    draw_argmax(m, im);
    if (!(m > NEG_INF)) {
        if (tid == 0) { o[0] = -1; o[1] = __float_as_int(NEG_INF); }
        return;
    }
    if (T == 0.0f) {
        if (tid == 0) { o[0] = im; o[1] = __float_as_int(x[im]); }
        return;
    }

    // Step 3: p in place of w, Z. nfirst counts the tokens sorted before im
    // (p > 1, or p == 1 at a lower id): 0 means im leads the sorted order.
    const float invT = __fdiv_rn(1.0f, T);
    float thr = __fadd_rn(m, __fmul_rn(-24.0f, T));
    if (!(thr < m)) thr = draw_next_down(m);
    double Z = 0.0;
    int nfirst = 0;
    for (int i = tid; i < V; i += DRAW_THREADS) {
        float w = dp[i], q = 0.0f;
        if (w > thr) q = (float)exp((double)__fmul_rn(__fsub_rn(w, m), invT));
        dp[i] = q;
        Z += (double)q;
        nfirst += (q > 1.0f || (q == 1.0f && i < im)) ? 1 : 0;
    }
    draw_sum_count(Z, nfirst); // also the barrier after which every thread reads any p
    if (!(Z >= 1.0)) {
        if (tid == 0) { o[0] = im; o[1] = __float_as_int(x[im]); }
        return;
    }

    // Steps 4–6.
    const bool useP = 0.0f < topP && topP < 1.0f, useK = topK > 0, useMin = minP > 0.0f;
    const double pmass = (double)topP * Z;
    const int chunk = (V + DRAW_THREADS - 1) / DRAW_THREADS;
    const int lo = min(tid * chunk, V), hi = min(lo + chunk, V);
    bool cut = false;
    float pc = 0.0f;
    int jc = 0;
    for (int r = 0; r < DRAW_ROUNDS; r++) {
        double sum = 0.0;
        int last = -1; // this chunk's largest id in S_r
        for (int i = lo; i < hi; i++) {
            float q = dp[i];
            if (draw_in(q, i, useMin, minP, cut, pc, jc)) { sum += (double)q; last = i; }
        }
        double Zr;
        const double P = draw_scan(sum, Zr);
        const double target = draw_uniform(u, r) * Zr;
        // The first id whose running sum P + (this chunk's sum so far)
        // exceeds target. A chunk with P + sum <= target cannot hold it
        // (the walk adds the same terms in the same order, and adding
        // non-negative terms never decreases a float sum).
        int cand = DRAW_NONE;
        if (P + sum > target) {
            double acc = 0.0;
            for (int i = lo; i < hi; i++) {
                float q = dp[i];
                if (draw_in(q, i, useMin, minP, cut, pc, jc)) {
                    acc += (double)q;
                    if (P + acc > target) { cand = i; break; }
                }
            }
        }
        draw_min_max(cand, last);
        int j = cand != DRAW_NONE ? cand : last; // none exceeds target (rounding): the largest id of S_r
        if (j < 0) { // S_r empty: impossible for validated parameters (min-p ≤ 1)
            if (tid == 0) { o[0] = -1; o[1] = __float_as_int(NEG_INF); }
            return;
        }
        bool accept = (!useP && !useK) || (j == im && nfirst == 0);
        if (!accept) {
            // Step 4: above_j and rank_j over every token.
            const float pj = dp[j];
            double above = 0.0;
            int rank = 0;
            for (int i = lo; i < hi; i++) {
                float q = dp[i];
                if (q > pj || (q == pj && i < j)) { above += (double)q; rank++; }
            }
            draw_sum_count(above, rank);
            accept = (!useP || above < pmass) && (!useK || rank < topK);
            if (!accept) { cut = true; pc = pj; jc = j; }
        }
        if (accept) {
            if (tid == 0) { o[0] = j; o[1] = __float_as_int(x[j]); }
            return;
        }
    }
    if (tid == 0) { o[0] = im; o[1] = __float_as_int(x[im]); }
}

// gather_rows: dst[k, :] = src[rows[k], :] for the logits rows the host
// reads (one contiguous copy back instead of one per row).
// grid = nRows, block = any. dst [nRows, V]; src [R, V]; rows [nRows].
extern "C" __global__ void gather_rows(float* __restrict__ dst, const float* __restrict__ src,
                                       const int* __restrict__ rows, int V) {
    const float* a = src + (i64)rows[blockIdx.x] * V;
    float* d = dst + (i64)blockIdx.x * V;
#pragma unroll 4
    for (int i = threadIdx.x; i < V; i += blockDim.x) d[i] = a[i];
}
