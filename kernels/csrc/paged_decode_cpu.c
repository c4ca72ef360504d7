/* Paged-attention decode on CPU: one query token per sequence over its paged KV cache.
 *
 * Why C and not torch ops: the torch reference has to gather every sequence's blocks into a
 * padded copy and permute it for bmm, which moves the whole KV cache through memory three
 * times per layer; at batch 32 that was ~60% of a SmolLM2-135M decode step. Here each
 * sequence walks its blocks in place for all heads at once, reading K and V once.
 *
 * Layouts (all contiguous): q/out [S, Hq, D]; k_cache/v_cache [num_blocks, block_size, Hkv, D];
 * block_tables [S, max_blocks] int32; context_lens [S] int32. dtypes: 0 fp32, 1 bf16, 2 fp16,
 * 3 int8 (caches only; k_scale/v_scale [num_blocks, block_size, Hkv] fp32, value = q * scale).
 * q/out and the caches may differ in dtype (an fp32 engine with a bf16 or int8 cache): cache
 * rows are converted to fp32 as they are read, in place, never copied out of the pool.
 * Arithmetic is fp32 throughout (scores = (q . k) * scale, softmax, probs @ V) like the
 * reference. Built and loaded by graft/kernels/cpu_ops.py (gcc -O3 -march=native -fopenmp).
 */
#include <math.h>
#include <omp.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "fast_exp.h"
#include "paged_common.h"

/* Row `row` (of length d) of a tensor of `dtype` as fp32: a pointer into the tensor for fp32,
 * else converted into buf. */
static inline __attribute__((always_inline)) const float *row_f32(const void *base, int64_t row, int64_t d, int dtype, float *buf) {
    if (dtype == F32) return (const float *)base + row * d;
    const uint16_t *src = (const uint16_t *)base + row * d;
    if (dtype == BF16)
        for (int64_t i = 0; i < d; ++i) buf[i] = bf16_to_float(src[i]);
    else
        for (int64_t i = 0; i < d; ++i) buf[i] = f16_to_float(src[i]);
    return buf;
}

/* Cache row `slot` (all kv heads, kv_width = Hkv * d values) as fp32; int8 rows are scaled
 * per head by scales[slot * Hkv + h]. */
static inline __attribute__((always_inline)) const float *cache_row_f32(
        const void *base, const float *scales, int64_t slot, int64_t kv_width, int64_t d,
        int dtype, float *buf) {
    if (dtype != I8) return row_f32(base, slot, kv_width, dtype, buf);
    const int8_t *src = (const int8_t *)base + slot * kv_width;
    const int64_t heads = kv_width / d;
    for (int64_t h = 0; h < heads; ++h) {
        const float sc = scales[slot * heads + h];
#pragma omp simd
        for (int64_t i = 0; i < d; ++i) buf[h * d + i] = (float)src[h * d + i] * sc;
    }
    return buf;
}

static inline void store_row(void *base, int64_t row, int64_t d, int dtype, const float *src) {
    if (dtype == F32) {
        memcpy((float *)base + row * d, src, (size_t)d * sizeof(float));
        return;
    }
    uint16_t *dst = (uint16_t *)base + row * d;
    for (int64_t i = 0; i < d; ++i) dst[i] = dtype == BF16 ? float_to_bf16(src[i]) : float_to_f16(src[i]);
}

/* a . b with 16 independent lanes and a short tree at the end: a plain reduction loop makes
 * gcc spill the vector and add its lanes one by one, which cost a quarter of the kernel. */
static inline __attribute__((always_inline)) float dot(const float *restrict a,
                                                      const float *restrict b, int64_t d) {
    float part[16] = {0.0f}, acc = 0.0f;
    int64_t i = 0;
    for (; i + 16 <= d; i += 16)
        for (int l = 0; l < 16; ++l) part[l] += a[i + l] * b[i + l];
    for (; i < d; ++i) acc += a[i] * b[i];
    for (int l = 0; l < 8; ++l) part[l] += part[l + 8];
    for (int l = 0; l < 4; ++l) part[l] += part[l + 4];
    return acc + ((part[0] + part[2]) + (part[1] + part[3]));
}

/* sc[i] <- exp(sc[i] - max(sc)) for i < n, in place; returns their sum (the softmax
 * denominator). */
static inline __attribute__((always_inline)) float exp_shifted(float *sc, int64_t n) {
    float mx = -INFINITY, total = 0.0f;
    for (int64_t i = 0; i < n; ++i) mx = sc[i] > mx ? sc[i] : mx;
#pragma omp simd reduction(+ : total)
    for (int64_t i = 0; i < n; ++i) {
        sc[i] = exp_neg(sc[i] - mx);
        total += sc[i];
    }
    return total;
}

#include "paged_decode_fast.h" /* the fast path: GRAFT_FAST_F32 where GCC builds it */

/* Returns 0; 1 + the index of the first sequence whose block table points outside
 * [0, num_blocks) within its context (nothing is computed then); or -1 when the per-thread
 * scratch buffers could not be allocated (out is incomplete then). */
int64_t graft_paged_decode(const void *q, const void *k_cache, const void *v_cache,
                           const int32_t *block_tables, const int32_t *context_lens, void *out,
                           int64_t num_seqs, int64_t num_q_heads, int64_t num_kv_heads,
                           int64_t head_dim, int64_t block_size, int64_t max_blocks,
                           int64_t num_blocks, float scale, const float *k_scale,
                           const float *v_scale, int dtype, int cache_dtype, int num_threads) {
    const int64_t group = num_q_heads / num_kv_heads, d = head_dim;
    int64_t max_len = 0;
    for (int64_t s = 0; s < num_seqs; ++s) {
        int64_t n = context_lens[s], used = (n + block_size - 1) / block_size;
        if (n < 0 || used > max_blocks) return s + 1;
        for (int64_t b = 0; b < used; ++b) {
            int32_t blk = block_tables[s * max_blocks + b];
            if (blk < 0 || blk >= num_blocks) return s + 1;
        }
        if (n > max_len) max_len = n;
    }
#ifdef GRAFT_FAST_F32
    const part_decode_fn fast = dtype == F32 ? fast_kernel(cache_dtype, d) : NULL;
    if (fast)
        return paged_decode_parts(fast, q, k_cache, v_cache, k_scale, v_scale, block_tables,
                                  context_lens, out, num_seqs, num_q_heads, num_kv_heads, d,
                                  block_size, max_blocks, scale, num_threads);
#endif
    /* The other dtypes and head sizes: one work item per sequence, all heads at once: each
     * token's K (then V) row of all kv heads is one contiguous read, so a block streams
     * through memory in order. */
    int failed = 0;
#pragma omp parallel num_threads(num_threads) if (num_seqs > 1)  /* one sequence: no fork/join */
    {
        float *scores = malloc(sizeof(float) * (size_t)(num_q_heads * (max_len > 0 ? max_len : 1)));
        float *qf = malloc(sizeof(float) * (size_t)(num_q_heads * d));
        float *acc = malloc(sizeof(float) * (size_t)(num_q_heads * d));
        float *buf = malloc(sizeof(float) * (size_t)(num_kv_heads * d));
        if (!scores || !qf || !acc || !buf) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static, 1)
        for (int64_t s = 0; s < num_seqs; ++s) {
            if (!scores || !qf || !acc || !buf) continue; /* reported through `failed` */
            const int64_t n = context_lens[s], kv_width = num_kv_heads * d;
            const int32_t *table = block_tables + s * max_blocks;
            memset(acc, 0, sizeof(float) * (size_t)(num_q_heads * d));
            if (n > 0) {
                for (int64_t hq = 0; hq < num_q_heads; ++hq)
                    memcpy(qf + hq * d, row_f32(q, s * num_q_heads + hq, d, dtype, buf),
                           sizeof(float) * (size_t)d);
                for (int64_t t = 0; t < n; ++t) {
                    const int64_t slot = slot_of(table, t, block_size);
                    const float *k = cache_row_f32(k_cache, k_scale, slot, kv_width, d, cache_dtype,
                                                   buf); /* [Hkv, D] */
                    for (int64_t h = 0, hq = 0; h < num_kv_heads; ++h)
                        for (int64_t g = 0; g < group; ++g, ++hq)
                            scores[hq * n + t] = dot(qf + hq * d, k + h * d, d) * scale;
                }
                for (int64_t hq = 0; hq < num_q_heads; ++hq) {
                    float *sc = scores + hq * n;
                    const float sum = exp_shifted(sc, n);
#pragma omp simd
                    for (int64_t t = 0; t < n; ++t) sc[t] /= sum;
                }
                for (int64_t t = 0; t < n; ++t) {
                    const int64_t slot = slot_of(table, t, block_size);
                    const float *v = cache_row_f32(v_cache, v_scale, slot, kv_width, d, cache_dtype,
                                                   buf);
                    for (int64_t h = 0, hq = 0; h < num_kv_heads; ++h)
                        for (int64_t g = 0; g < group; ++g, ++hq) {
                            const float p = scores[hq * n + t], *vh = v + h * d;
                            float *a = acc + hq * d;
#pragma omp simd
                            for (int64_t i = 0; i < d; ++i) a[i] += p * vh[i];
                        }
                }
            }
            for (int64_t hq = 0; hq < num_q_heads; ++hq)
                store_row(out, s * num_q_heads + hq, d, dtype, acc + hq * d);
        }
        free(scores);
        free(qf);
        free(acc);
        free(buf);
    }
    return failed ? -1 : 0;
}
