/* GCC's 16-lane vectors (64 bytes) for the C kernels in this folder, and their lane-wise
 * compares. With AVX-512 a compare is one instruction. Without it (an AVX2 build: Zen 3, older
 * Xeons) GCC 12 lowers a 64-byte compare lane by lane, a vcomiss and a vpinsrd per lane: there
 * silu_mul ran 5x slower than in the AVX-512 build, so on AVX2 the compares run on the two
 * 8-lane halves (two AVX2 compares; issue 49; the attention uses 8-lane vectors there). The
 * results are the generic operators' (-1 where true, 0 where false; ordered, so false for NaN).
 * Stores likewise (v16_store).
 */
#ifndef GRAFT_VEC16_H
#define GRAFT_VEC16_H
#include <stdint.h>
#include <string.h>

#if defined(__GNUC__) && !defined(__clang__)
typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

#if defined(__AVX2__) && !defined(__AVX512F__)
#include <immintrin.h>
typedef union {
    v16f f;
    v16i i;
    __m256 h[2];
    __m256i hi[2];
} v16_halves;

#define V16_FLOAT_CMP(NAME, PRED)                                                               \
    static inline __attribute__((always_inline)) v16i NAME(v16f a, v16f b) {                   \
        const v16_halves x = {.f = a}, y = {.f = b};                                            \
        v16_halves r;                                                                           \
        r.h[0] = _mm256_cmp_ps(x.h[0], y.h[0], PRED);                                           \
        r.h[1] = _mm256_cmp_ps(x.h[1], y.h[1], PRED);                                           \
        return r.i;                                                                             \
    }
V16_FLOAT_CMP(v16_lt, _CMP_LT_OQ)
V16_FLOAT_CMP(v16_ge, _CMP_GE_OQ)
#undef V16_FLOAT_CMP

/* signed int32 a > b */
static inline __attribute__((always_inline)) v16i v16_gt_i(v16i a, v16i b) {
    const v16_halves x = {.i = a}, y = {.i = b};
    v16_halves r;
    r.hi[0] = _mm256_cmpgt_epi32(x.hi[0], y.hi[0]);
    r.hi[1] = _mm256_cmpgt_epi32(x.hi[1], y.hi[1]);
    return r.i;
}

/* p[0..16) = v: two 8-lane stores (GCC 12 stored a 64-byte vector through the stack, 16 bytes
 * at a time) */
static inline __attribute__((always_inline)) void v16_store(float *p, v16f v) {
    const v16_halves x = {.f = v};
    _mm256_storeu_ps(p, x.h[0]);
    _mm256_storeu_ps(p + 8, x.h[1]);
}
#else
static inline __attribute__((always_inline)) void v16_store(float *p, v16f v) { memcpy(p, &v, sizeof v); }
static inline __attribute__((always_inline)) v16i v16_lt(v16f a, v16f b) { return a < b; }
static inline __attribute__((always_inline)) v16i v16_ge(v16f a, v16f b) { return a >= b; }
static inline __attribute__((always_inline)) v16i v16_gt_i(v16i a, v16i b) { return a > b; }
#endif
#endif

#ifdef __AVX512F__
#include <immintrin.h>
/* The first `valid` of 16 lanes as an AVX-512 mask (none for valid <= 0): the tails of the
 * kernels' 16-lane loops. */
static inline __mmask16 lane_mask(int64_t valid) {
    return valid >= 16 ? 0xffff : valid > 0 ? (__mmask16)((1u << valid) - 1) : 0;
}
#endif
#endif
