/* Per-token ops of a decoder layer on CPU, fp32: RMSNorm (with the residual add fused),
 * rotary embedding, the KV-cache store and the gated MLP's silu(gate) * up.
 *
 * Why C: at decode batch 32 each of these touches a few kB, so the torch versions (5-8 small
 * ops each: cast, pow, mean, rsqrt, mul, cat, index_copy...) cost their dispatch overhead,
 * ~100 us per call and ~150 calls per SmolLM2 step (16 of 180 ms on one thread). One pass
 * over the rows here takes a few microseconds. Same contracts and operation order as
 * graft.kernels.reference (HF transformers); built with paged_decode_cpu.c by cpu_ops.py.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "fast_exp.h"

/* No fused multiply-add in this file: x*c + y*s must round like torch's two products and
 * a sum, so that rotary and norm outputs equal the reference's. */
#pragma GCC optimize("fp-contract=off")

/* out[r] = rms_norm(x[r] (+ residual[r])) * weight for `rows` rows of d floats. x and
 * residual rows start `x_stride` / `res_stride` floats apart; out and sum_out are
 * contiguous. With residual (non-NULL), sum_out receives x + residual (the next residual). */
void graft_rms_norm_f32(const float *x, int64_t x_stride, const float *residual,
                        int64_t res_stride, const float *weight, float *out, float *sum_out,
                        int64_t rows, int64_t d, float eps, int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (rows * d >= (1 << 16))
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * x_stride;
        float *o = out + r * d;
        if (residual) {
            const float *rr = residual + r * res_stride;
            float *s = sum_out + r * d;
            for (int64_t i = 0; i < d; ++i) s[i] = xr[i] + rr[i];
            xr = s;
        }
        float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
        for (int64_t i = 0; i < d; ++i) ss += xr[i] * xr[i];
        const float inv = 1.0f / sqrtf(ss / (float)d + eps);
        for (int64_t i = 0; i < d; ++i) o[i] = (xr[i] * inv) * weight[i];
    }
}

/* out [T, H, D] (contiguous) = x rotated on its first R dims; x rows (tokens) start
 * `x_stride` floats apart, heads D apart. cos/sin: [T, R/2]. interleaved: pairs (2i, 2i+1)
 * (GLM4); else (i, i + R/2) (HF rotate_half). */
void graft_rotary_f32(const float *x, int64_t x_stride, const float *cos_t, const float *sin_t,
                      float *out, int64_t tokens, int64_t heads, int64_t d, int64_t rot,
                      int interleaved, int num_threads) {
    const int64_t half = rot / 2;
#pragma omp parallel for num_threads(num_threads) if (tokens * heads * d >= (1 << 16))
    for (int64_t t = 0; t < tokens; ++t) {
        const float *c = cos_t + t * half, *s = sin_t + t * half;
        for (int64_t h = 0; h < heads; ++h) {
            const float *xi = x + t * x_stride + h * d;
            float *o = out + (t * heads + h) * d;
            if (interleaved) {
                for (int64_t i = 0; i < half; ++i) {
                    const float a = xi[2 * i], b = xi[2 * i + 1];
                    o[2 * i] = a * c[i] + (-b) * s[i];
                    o[2 * i + 1] = b * c[i] + a * s[i];
                }
            } else {
                for (int64_t i = 0; i < half; ++i) {
                    const float a = xi[i], b = xi[i + half];
                    o[i] = a * c[i] + (-b) * s[i];
                    o[i + half] = b * c[i] + a * s[i];
                }
            }
            if (rot < d) memcpy(o + rot, xi + rot, sizeof(float) * (size_t)(d - rot));
        }
    }
}

/* k_cache/v_cache slot slots[t] <- rows k[t], v[t] (width floats each; rows start k_stride /
 * v_stride floats apart); a negative slot (-1: a padding row) skips the row. Returns 0, or
 * 1 + the first row whose slot is >= num_slots (nothing is written then). */
int64_t graft_store_kv_f32(const float *k, int64_t k_stride, const float *v, int64_t v_stride,
                           float *k_cache, float *v_cache, const int64_t *slots, int64_t tokens,
                           int64_t width, int64_t num_slots) {
    for (int64_t t = 0; t < tokens; ++t)
        if (slots[t] >= num_slots) return t + 1;
    for (int64_t t = 0; t < tokens; ++t) {
        if (slots[t] < 0) continue;
        memcpy(k_cache + slots[t] * width, k + t * k_stride, sizeof(float) * (size_t)width);
        memcpy(v_cache + slots[t] * width, v + t * v_stride, sizeof(float) * (size_t)width);
    }
    return 0;
}

/* silu(x) = x / (1 + exp(-x)) as torch computes it, with exp(-x) from exp_neg: for x >= 0
 * directly, for x < 0 as 1 / exp_neg(x) (exp_neg takes arguments <= 0). Within a few ulp of
 * torch's silu (another exp). */
static inline float silu(float x) {
    const float e = exp_neg(x >= 0.0f ? -x : x);
    return x / (1.0f + (x >= 0.0f ? e : 1.0f / e));
}

/* out[r, i] = silu(gate_up[r, i]) * gate_up[r, inter + i] for `rows` rows of the fused
 * gate|up projection (row starts `stride` floats apart); out is contiguous [rows, inter]. */
void graft_silu_mul_f32(const float *gate_up, int64_t stride, float *out, int64_t rows,
                        int64_t inter, int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (rows * inter >= (1 << 16))
    for (int64_t r = 0; r < rows; ++r) {
        const float *g = gate_up + r * stride, *u = g + inter;
        float *o = out + r * inter;
        int64_t i = 0;
#if defined(__GNUC__) && !defined(__clang__)
        for (; i + 16 <= inter; i += 16) { /* silu() on 16 lanes (gcc keeps the loop scalar) */
            const v16f x = load16(g + i);
            const v16i pos = x >= 0.0f;
            const v16f e = exp_neg16((v16f)((v16i)x | (int32_t)0x80000000)); /* exp(-|x|) */
            const v16f big = 1.0f / e;
            const v16f den = 1.0f + (v16f)((pos & (v16i)e) | (~pos & (v16i)big));
            const v16f y = x / den * load16(u + i);
            memcpy(o + i, &y, sizeof y);
        }
#endif
        for (; i < inter; ++i) o[i] = silu(g[i]) * u[i];
    }
}
