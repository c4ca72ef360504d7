/* The end of a quantized-linear tile (quant_linear_cpu.c, quant_vnni_cpu.c, quant_amx_cpu.c):
 * the int32 sums of the three activation digits folded into fp32, and the store of two blocks
 * of 16 output channels per row, y = out * rs[m] * scale + bias, lanes past N left alone. */
#ifndef GRAFT_QUANT_EPILOGUE_H
#define GRAFT_QUANT_EPILOGUE_H
#include <immintrin.h>
#include <stdint.h>

#include "vec16.h" /* lane_mask */

/* 2^16 a2 + 2^8 a1 + a0 in fp32, in this order: the VNNI and AMX paths both fold their digit
 * sums here, which keeps their outputs bit-identical. */
static inline __m512 combine_digits(__m512i a0, __m512i a1, __m512i a2) {
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(a2), _mm512_set1_ps(65536.0f),
                           _mm512_fmadd_ps(_mm512_cvtepi32_ps(a1), _mm512_set1_ps(256.0f),
                                           _mm512_cvtepi32_ps(a0)));
}

static inline void store_lanes(float *y, __m512 v, int64_t valid) {
    if (valid >= 16) _mm512_storeu_ps(y, v);
    else if (valid > 0) _mm512_mask_storeu_ps(y, lane_mask(valid), v);
}

/* bias[o0 .. o0 + 32) into b[0], b[1], lanes past N (or all, without bias) 0. */
static inline void load_bias_pair(const float *bias, int64_t o0, int64_t N, __m512 b[2]) {
    for (int h = 0; h < 2; ++h)
        b[h] = bias ? _mm512_maskz_loadu_ps(lane_mask(N - o0 - 16 * h), bias + o0 + 16 * h) : _mm512_setzero_ps();
}

/* rs: per-row factor or NULL (1); scale: per-channel factor [N padded to 32] or NULL (1);
 * bias: [N] or NULL (0). */
static inline void finish_pair(__m512 out[][2], int MR, const float *rs, const float *scale,
                               const float *bias, int64_t o0, float *y, int64_t ldy, int64_t N) {
    __m512 s0 = _mm512_set1_ps(1.0f), s1 = s0, b[2];
    if (scale) { s0 = _mm512_loadu_ps(scale + o0); s1 = _mm512_loadu_ps(scale + o0 + 16); }
    load_bias_pair(bias, o0, N, b);
    for (int m = 0; m < MR; ++m) {
        __m512 a0 = out[m][0], a1 = out[m][1];
        if (rs) {
            const __m512 r = _mm512_set1_ps(rs[m]);
            a0 = _mm512_mul_ps(a0, r);
            a1 = _mm512_mul_ps(a1, r);
        }
        store_lanes(y + m * ldy + o0, _mm512_fmadd_ps(a0, s0, b[0]), N - o0);
        store_lanes(y + m * ldy + o0 + 16, _mm512_fmadd_ps(a1, s1, b[1]), N - o0 - 16);
    }
}
#endif
