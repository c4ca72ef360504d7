/* Per-token ops of a decoder layer on CPU, fp32 or bf16 rows: RMSNorm (with the residual add
 * fused), rotary embedding, the KV-cache store and the gated MLP's silu(gate) * up.
 *
 * Why C: at decode batch 32 each of these touches a few kB, so the torch versions (5-8 small
 * ops each: cast, pow, mean, rsqrt, mul, cat, index_copy...) cost their dispatch overhead,
 * ~100 us per call and ~150 calls per SmolLM2 step (16 of 180 ms on one thread). One pass
 * over the rows here takes a few microseconds. Same contracts and operation order as
 * graft.kernels.reference (HF transformers); built with paged_decode_cpu.c by cpu_ops.py.
 *
 * One implementation per op, parameterized by the dtype of each operand (0 fp32, 1 bf16, the
 * codes of cpu_ops._DTYPES): values are loaded as fp32 and, where torch works on bf16
 * tensors, rounded back to bf16 after each op it runs (round_to), so the results equal the
 * reference's bit for bit (silu: see silu_mul_row). The per-row bodies are always-inline and
 * the exported functions call them with constant dtypes from inside their OpenMP loop (gcc
 * outlines an OpenMP region before inlining, so a dtype passed into one stays a runtime
 * branch and the loops stay scalar): each combination compiles to its own vectorized loops
 * and fp32 runs the same arithmetic as before.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"
#include "fast_exp.h"

/* No fused multiply-add in this file: x*c + y*s must round like torch's two products and
 * a sum, so that rotary and norm outputs equal the reference's. */
#pragma GCC optimize("fp-contract=off")

#define INLINE static inline __attribute__((always_inline))
enum { F32 = 0, BF16 = 1 };

INLINE float ld(const void *p, int64_t i, int dt) {
    return dt == BF16 ? bf16_to_float(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

INLINE void st(void *p, int64_t i, float v, int dt) {
    if (dt == BF16)
        ((uint16_t *)p)[i] = float_to_bf16(v);
    else
        ((float *)p)[i] = v;
}

/* v as a tensor of dtype dt holds it (fp32: unchanged). */
INLINE float round_to(float v, int dt) { return dt == BF16 ? bf16_round(v) : v; }

INLINE size_t elsize(int dt) { return dt == BF16 ? 2 : 4; }

/* 16 values at element i of an fp32 or bf16 row (gcc's 16-lane vectors; bf16 rounded as st
 * rounds): the per-row loops below run on these, with scalar tails (gcc vectorized the scalar
 * loops 8 lanes wide, its bf16 rounding in integer steps). */
#if defined(__GNUC__) && !defined(__clang__)
INLINE v16f load16_dt(const void *p, int64_t i, int dt) {
    return dt == BF16 ? bf16_to_float16((const uint16_t *)p + i) : load16((const float *)p + i);
}

INLINE void store16_dt(void *p, int64_t i, v16f v, int dt) {
    if (dt == BF16)
        float_to_bf16_16((uint16_t *)p + i, v);
    else
        v16_store((float *)p + i, v);
}

INLINE v16f round16_to(v16f v, int dt) { return dt == BF16 ? bf16_round16(v) : v; }
#endif

/* sum(x[i]^2) in the order torch sums x.pow(2).mean(-1) on CPU (ATen SumKernel.cpp,
 * vectorized_inner_sum -> row_sum -> multi_row_sum): `lanes`-wide vectors, four vector
 * accumulators over groups of four vectors, cascaded every 2^level_power groups, the
 * leftover vectors into the first, the four combined, then the scalar tail and the lanes in
 * order. lanes is 8 on x86 (the sum kernel is registered for AVX2 only, so AVX-512 CPUs run
 * it too), and 1 for rows shorter than 8 (torch's scalar_inner_sum: the same steps on single
 * elements). Matching the order makes the mean, and so every rounded output, equal the
 * reference's instead of a few ulp apart. */
INLINE float sum_squares(const void *p, int64_t d, int dt, const int lanes) {
    const int64_t nvec = d / lanes, groups = nvec / 4;
    int64_t ceil_log2 = 1;
    while (ceil_log2 < 63 && ((int64_t)1 << ceil_log2) < groups) ++ceil_log2;
    const int64_t level_power = ceil_log2 / 4 > 4 ? ceil_log2 / 4 : 4;
    const int64_t step = (int64_t)1 << level_power, mask = step - 1;
    float acc[4][4][8] = {{{0.0f}}}; /* [cascade level][accumulator][lane < lanes] */
#define ADD_GROUP(g)                                                                   \
    for (int k = 0; k < 4; ++k)                                                        \
        for (int l = 0; l < lanes; ++l) {                                              \
            const float x = ld(p, ((g) * 4 + k) * lanes + l, dt);                      \
            acc[0][k][l] += x * x;                                                     \
        }
    int64_t g = 0;
    while (g + step <= groups) {
        for (int64_t j = 0; j < step; ++j, ++g) ADD_GROUP(g)
        for (int64_t lev = 1; lev < 4; ++lev) {
            for (int k = 0; k < 4; ++k)
                for (int l = 0; l < lanes; ++l) {
                    acc[lev][k][l] += acc[lev - 1][k][l];
                    acc[lev - 1][k][l] = 0.0f;
                }
            if (g & (mask << (lev * level_power))) break;
        }
    }
    for (; g < groups; ++g) ADD_GROUP(g)
#undef ADD_GROUP
    for (int lev = 1; lev < 4; ++lev)
        for (int k = 0; k < 4; ++k)
            for (int l = 0; l < lanes; ++l) acc[0][k][l] += acc[lev][k][l];
    for (int64_t v = groups * 4; v < nvec; ++v)
        for (int l = 0; l < lanes; ++l) {
            const float x = ld(p, v * lanes + l, dt);
            acc[0][0][l] += x * x;
        }
    for (int k = 1; k < 4; ++k)
        for (int l = 0; l < lanes; ++l) acc[0][0][l] += acc[0][k][l];
    if (lanes == 1) return acc[0][0][0];
    float total = 0.0f;
    for (int64_t i = nvec * lanes; i < d; ++i) {
        const float x = ld(p, i, dt);
        total += x * x;
    }
    for (int l = 0; l < lanes; ++l) total += acc[0][0][l];
    return total;
}

/* One row of graft_rms_norm: x (+ residual) -> out (and sum_out), d values of dtype dt,
 * weight of dtype wdt. HF order: normalize in fp32, round to the input dtype, multiply by the
 * weight, round again. sum_out may be residual itself (an in-place residual stream, as
 * decode_step_cpu.c runs it): those two are not restrict. */
INLINE void rms_norm_row(const void *restrict x, const void *residual, const void *restrict weight,
                         void *restrict out, void *sum_out, int64_t d, float eps, int dt, int wdt) {
    const void *src = x;
    int64_t i = 0;
    if (residual) { /* x + residual, rounded to dt like torch's add, is the next residual */
#if defined(__GNUC__) && !defined(__clang__)
        for (; i + 16 <= d; i += 16)
            store16_dt(sum_out, i, load16_dt(x, i, dt) + load16_dt(residual, i, dt), dt);
#endif
        for (; i < d; ++i) st(sum_out, i, ld(x, i, dt) + ld(residual, i, dt), dt);
        src = sum_out;
    }
    const float ss = d >= 8 ? sum_squares(src, d, dt, 8) : sum_squares(src, d, dt, 1);
    const float inv = 1.0f / sqrtf(ss / (float)d + eps);
    i = 0;
#if defined(__GNUC__) && !defined(__clang__)
    for (; i + 16 <= d; i += 16)
        store16_dt(out, i, load16_dt(weight, i, wdt) * round16_to(load16_dt(src, i, dt) * inv, dt), dt);
#endif
    for (; i < d; ++i) st(out, i, ld(weight, i, wdt) * round_to(ld(src, i, dt) * inv, dt), dt);
}

/* out[r] = rms_norm(x[r] (+ residual[r])) * weight for `rows` rows of d values. x and
 * residual (same dtype) rows start `x_stride` / `res_stride` elements apart; out and sum_out
 * (x's dtype) are contiguous. With residual (non-NULL), sum_out receives x + residual (the
 * next residual; sum_out == residual updates it in place). dtype: of x; wdtype: of weight. */
void graft_rms_norm(const void *x, int64_t x_stride, const void *residual, int64_t res_stride,
                    const void *weight, void *out, void *sum_out, int64_t rows, int64_t d,
                    float eps, int dtype, int wdtype, int num_threads) {
    const size_t e = elsize(dtype);
#pragma omp parallel for num_threads(num_threads) if (rows * d >= (1 << 16))
    for (int64_t r = 0; r < rows; ++r) {
        const char *xr = (const char *)x + r * x_stride * e;
        const char *rr = residual ? (const char *)residual + r * res_stride * e : NULL;
        char *o = (char *)out + r * d * e, *s = sum_out ? (char *)sum_out + r * d * e : NULL;
#define ROW(dt, wdt) rms_norm_row(xr, rr, weight, o, s, d, eps, dt, wdt)
        if (dtype == F32)
            wdtype == F32 ? ROW(F32, F32) : ROW(F32, BF16);
        else
            wdtype == F32 ? ROW(BF16, F32) : ROW(BF16, BF16);
#undef ROW
    }
}

/* One head of graft_rotary: pairs (i * step, i * step + gap) of x -> out. cd is the dtype the
 * arithmetic rounds to (torch's promote_types of x and cos), dt the dtype of x and out, cdt
 * of cos and sin. */
INLINE void rotate_head(const void *restrict x, const void *restrict cos_t,
                        const void *restrict sin_t, void *restrict out, int64_t half,
                        const int64_t step, const int64_t gap, int dt, int cdt) {
    const int cd = dt == BF16 && cdt == BF16 ? BF16 : F32;
    int64_t i = 0;
#if defined(__GNUC__) && !defined(__clang__)
    if (step == 1) /* rotate_half: the pairs' halves are 16 contiguous values each */
        for (; i + 16 <= half; i += 16) {
            const v16f a = load16_dt(x, i, dt), b = load16_dt(x, i + gap, dt);
            const v16f c = load16_dt(cos_t, i, cdt), s = load16_dt(sin_t, i, cdt);
            store16_dt(out, i, round16_to(round16_to(a * c, cd) + round16_to(-b * s, cd), cd), dt);
            store16_dt(out, i + gap, round16_to(round16_to(b * c, cd) + round16_to(a * s, cd), cd), dt);
        }
#endif
    for (; i < half; ++i) {
        const float a = ld(x, i * step, dt), b = ld(x, i * step + gap, dt);
        const float c = ld(cos_t, i, cdt), s = ld(sin_t, i, cdt);
        st(out, i * step, round_to(round_to(a * c, cd) + round_to(-b * s, cd), cd), dt);
        st(out, i * step + gap, round_to(round_to(b * c, cd) + round_to(a * s, cd), cd), dt);
    }
}

/* out [T, H, D] (contiguous) = x rotated on its first R dims; x rows (tokens) start
 * `x_stride` elements apart, heads D apart. cos/sin: [T, R/2]. interleaved: pairs (2i, 2i+1)
 * (GLM4); else (i, i + R/2) (HF rotate_half). dtype: of x and out; cdtype: of cos and sin
 * (bf16 with bf16 rounds after every op like torch's bf16 ops; fp32 cos rounds once at the
 * end, like the reference's promote to fp32). */
void graft_rotary(const void *x, int64_t x_stride, const void *cos_t, const void *sin_t,
                  void *out, int64_t tokens, int64_t heads, int64_t d, int64_t rot,
                  int interleaved, int dtype, int cdtype, int num_threads) {
    const int64_t half = rot / 2;
    const size_t e = elsize(dtype), ce = elsize(cdtype);
#pragma omp parallel for num_threads(num_threads) if (tokens * heads * d >= (1 << 16))
    for (int64_t t = 0; t < tokens; ++t)
        for (int64_t h = 0; h < heads; ++h) {
            const char *xh = (const char *)x + (t * x_stride + h * d) * e;
            char *oh = (char *)out + (t * heads + h) * d * e;
            const char *c = (const char *)cos_t + t * half * ce, *s = (const char *)sin_t + t * half * ce;
            /* interleaved (GLM4): pairs (2i, 2i+1); else HF rotate_half: pairs (i, i + half) */
#define HEAD(dt, cdt) (interleaved ? rotate_head(xh, c, s, oh, half, 2, 1, dt, cdt) \
                                   : rotate_head(xh, c, s, oh, half, 1, half, dt, cdt))
            if (dtype == F32)
                cdtype == F32 ? HEAD(F32, F32) : HEAD(F32, BF16);
            else
                cdtype == F32 ? HEAD(BF16, F32) : HEAD(BF16, BF16);
#undef HEAD
            if (rot < d) memcpy(oh + rot * e, xh + rot * e, e * (size_t)(d - rot));
        }
}

/* n values from src (dtype dt) to dst (dtype cdt), converted like .to(). */
INLINE void copy_row(void *dst, const void *src, int64_t n, int dt, int cdt) {
    if (dt == cdt) {
        memcpy(dst, src, elsize(dt) * (size_t)n);
        return;
    }
    for (int64_t i = 0; i < n; ++i) st(dst, i, ld(src, i, dt), cdt);
}

/* k_cache/v_cache slot slots[t] <- rows k[t], v[t] (width values each; rows start k_stride /
 * v_stride elements apart), converted from dtype (of k and v) to cache_dtype like the
 * reference's .to(k_cache.dtype); a negative slot (-1: a padding row) skips the row. Returns
 * 0, or 1 + the first row whose slot is >= num_slots (nothing is written then). */
int64_t graft_store_kv(const void *k, int64_t k_stride, const void *v, int64_t v_stride,
                       void *k_cache, void *v_cache, const int64_t *slots, int64_t tokens,
                       int64_t width, int64_t num_slots, int dtype, int cache_dtype) {
    for (int64_t t = 0; t < tokens; ++t)
        if (slots[t] >= num_slots) return t + 1;
    const size_t in = elsize(dtype), ce = elsize(cache_dtype);
    for (int64_t t = 0; t < tokens; ++t) {
        if (slots[t] < 0) continue;
        char *kc = (char *)k_cache + slots[t] * width * ce, *vc = (char *)v_cache + slots[t] * width * ce;
        const char *kr = (const char *)k + t * k_stride * in, *vr = (const char *)v + t * v_stride * in;
        if (dtype == F32 && cache_dtype == BF16) {
            copy_row(kc, kr, width, F32, BF16);
            copy_row(vc, vr, width, F32, BF16);
        } else if (dtype == BF16 && cache_dtype == F32) {
            copy_row(kc, kr, width, BF16, F32);
            copy_row(vc, vr, width, BF16, F32);
        } else {
            copy_row(kc, kr, width, dtype, dtype);
            copy_row(vc, vr, width, dtype, dtype);
        }
    }
    return 0;
}

/* One fp32 row of `heads` head vectors of d values -> int8 + a scale per head, exactly as
 * graft.kernels.reference.quantize_kv: scale = absmax / 127, q = round-half-even(x / scale)
 * clamped to [-127, 127] (an all-zero vector: scale 0, q 0). */
static void quantize_row_i8(const float *x, int64_t heads, int64_t d, int8_t *q, float *scales) {
    for (int64_t h = 0; h < heads; ++h) {
        const float *xh = x + h * d;
        float amax = 0.0f;
        for (int64_t i = 0; i < d; ++i) amax = fmaxf(amax, fabsf(xh[i]));
        const float sc = amax / 127.0f, safe = sc > 0.0f ? sc : 1.0f;
        for (int64_t i = 0; i < d; ++i) {
            float r = nearbyintf(xh[i] / safe);
            r = r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r);
            q[h * d + i] = (int8_t)r;
        }
        scales[h] = sc;
    }
}

/* store_kv into an int8 cache (fp32 rows): k_cache/v_cache slot slots[t] <- quantized rows,
 * k_scale/v_scale [num_slots, heads] <- their scales; -1 slots skip. Returns as
 * graft_store_kv. */
int64_t graft_store_kv_i8(const float *k, int64_t k_stride, const float *v, int64_t v_stride,
                          int8_t *k_cache, int8_t *v_cache, float *k_scale, float *v_scale,
                          const int64_t *slots, int64_t tokens, int64_t heads, int64_t d,
                          int64_t num_slots) {
    for (int64_t t = 0; t < tokens; ++t)
        if (slots[t] >= num_slots) return t + 1;
    const int64_t width = heads * d;
    for (int64_t t = 0; t < tokens; ++t) {
        if (slots[t] < 0) continue;
        quantize_row_i8(k + t * k_stride, heads, d, k_cache + slots[t] * width, k_scale + slots[t] * heads);
        quantize_row_i8(v + t * v_stride, heads, d, v_cache + slots[t] * width, v_scale + slots[t] * heads);
    }
    return 0;
}

/* silu(x) = x / (1 + exp(-x)) as torch computes it, with e = exp(-|x|) from exp_neg (which
 * takes arguments <= 0): x / (1 + e) for x >= 0, x e / (1 + e) for x < 0, one division either
 * way (x / (1 + 1 / e) took two: 7% more time on a 512-row bf16 call). Within a few ulp of
 * torch's silu (another exp). */
static inline float silu(float x) {
    const float e = exp_neg(x >= 0.0f ? -x : x);
    return (x >= 0.0f ? x : x * e) / (1.0f + e);
}

/* One row of graft_silu_mul, dtype dt. bf16 like torch's F.silu(gate).mul_(up): silu in
 * fp32 rounded to bf16, times up, rounded again. exp_neg is another exp than torch's, yet
 * rounded to bf16 the silu of every finite bf16 value >= -87 is torch's (tested on all of
 * them); below, exp_neg flushes to zero and silu gives -0 where torch gives ~-1e-37. */
INLINE void silu_mul_row(const void *restrict gate, const void *restrict up, void *restrict out,
                         int64_t inter, int dt) {
    int64_t i = 0;
#if defined(__GNUC__) && !defined(__clang__)
    for (; i + 16 <= inter; i += 16) { /* silu() on 16 lanes (gcc keeps the loop scalar) */
        const v16f x = load16_dt(gate, i, dt);
        const v16i pos = v16_ge(x, (v16f){0});
        const v16f e = exp_neg16((v16f)((v16i)x | (int32_t)0x80000000)); /* exp(-|x|) */
        const v16f num = (v16f)((pos & (v16i)x) | (~pos & (v16i)(x * e)));
        store16_dt(out, i, round16_to(num / (1.0f + e), dt) * load16_dt(up, i, dt), dt);
    }
#endif
    for (; i < inter; ++i) st(out, i, round_to(silu(ld(gate, i, dt)), dt) * ld(up, i, dt), dt);
}

/* out[r, i] = silu(gate_up[r, i]) * gate_up[r, inter + i] for `rows` rows of the fused
 * gate|up projection (row starts `stride` elements apart); out is contiguous [rows, inter]. */
void graft_silu_mul(const void *gate_up, int64_t stride, void *out, int64_t rows, int64_t inter,
                    int dtype, int num_threads) {
    const size_t e = elsize(dtype);
#pragma omp parallel for num_threads(num_threads) if (rows * inter >= (1 << 16))
    for (int64_t r = 0; r < rows; ++r) {
        const char *g = (const char *)gate_up + r * stride * e;
        char *o = (char *)out + r * inter * e;
        if (dtype == F32)
            silu_mul_row(g, g + inter * e, o, inter, F32);
        else
            silu_mul_row(g, g + inter * e, o, inter, BF16);
    }
}
