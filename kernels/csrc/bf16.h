/* bf16 <-> fp32 as torch converts them (c10::BFloat16): widening is exact (the high half of
 * the fp32 bits); narrowing rounds to nearest even in integer arithmetic, so denormals are
 * kept and NaN stays NaN. Scalar and 16-lane (GCC vector extensions) versions; gcc vectorizes
 * loops over the scalar ones too. With AVX512-BF16 the 16-lane narrowing is vcvtneps2bf16,
 * the same rounding, except for vectors holding a denormal (which it would flush). */
#ifndef GRAFT_BF16_H
#define GRAFT_BF16_H
#include <stdint.h>
#include <string.h>

#include "vec16.h"
#if defined(__AVX512BF16__) && defined(__AVX512DQ__)
#include <immintrin.h>
#endif

static inline float bf16_to_float(uint16_t x) {
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The fp32 bits of f rounded to the nearest bf16 (low 16 bits then zero). */
static inline uint32_t bf16_round_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return u | 0x400000u; /* quiet NaN stays NaN */
    return (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
}

static inline uint16_t float_to_bf16(float f) { return (uint16_t)(bf16_round_bits(f) >> 16); }

/* f rounded to bf16 and widened back: the value torch holds after an op on bf16 tensors. */
static inline float bf16_round(float f) {
    const uint32_t u = bf16_round_bits(f);
    float r;
    memcpy(&r, &u, 4);
    return r;
}

#if defined(__GNUC__) && !defined(__clang__)
typedef float v16f_bf __attribute__((vector_size(64)));
typedef uint32_t v16u_bf __attribute__((vector_size(64)));
typedef uint16_t v16h_bf __attribute__((vector_size(32)));

static inline v16f_bf bf16_to_float16(const uint16_t *p) {
    v16h_bf h;
    memcpy(&h, p, sizeof h);
    return (v16f_bf)(__builtin_convertvector(h, v16u_bf) << 16);
}

static inline v16u_bf bf16_round_bits16(v16f_bf f) {
    const v16u_bf u = (v16u_bf)f;
    /* |f| > inf as integers (both below 2^31, so the signed compare is the unsigned one) */
    const v16u_bf nan = (v16u_bf)v16_gt_i((v16i)(u & 0x7fffffffu), (v16i){0} + 0x7f800000);
    const v16u_bf r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    return (nan & (u | 0x400000u)) | (~nan & r);
}

#if defined(__AVX512BF16__) && defined(__AVX512DQ__) /* vfpclassps is AVX512DQ */
/* vcvtneps2bf16 rounds as above (nearest even; NaN quieted the same way) but reads denormal
 * inputs as zero: vectors with a denormal lane (rare) take the integer rounding. */
static inline int bf16_hw_ok(v16f_bf f) { return !_mm512_fpclass_ps_mask((__m512)f, 0x20); }
#endif

static inline void float_to_bf16_16(uint16_t *p, v16f_bf f) {
#if defined(__AVX512BF16__) && defined(__AVX512DQ__)
    if (bf16_hw_ok(f)) {
        _mm256_storeu_si256((__m256i *)p, (__m256i)_mm512_cvtneps_pbh((__m512)f));
        return;
    }
#endif
    const v16h_bf h = __builtin_convertvector(bf16_round_bits16(f) >> 16, v16h_bf);
    memcpy(p, &h, sizeof h);
}

static inline v16f_bf bf16_round16(v16f_bf f) {
#if defined(__AVX512BF16__) && defined(__AVX512DQ__)
    if (bf16_hw_ok(f))
        return (v16f_bf)_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh((__m512)f)), 16);
#endif
    return (v16f_bf)bf16_round_bits16(f);
}
#endif
#endif
