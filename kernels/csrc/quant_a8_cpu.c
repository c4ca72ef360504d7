/* int4 weights times 8-bit activations (scheme int4-gG-a8): each row of x is rounded to int8
 * per block of 32 columns, d = max|x| / 127, xq = round(x * (1 / d)) (to nearest even, as
 * torch rounds), and the linear is the int4 one on x_hat = xq * d: y = x_hat @ dequant(W)^T + bias.
 * The weight layout is int4's (quant_vnni_cpu.c): a pair's two 16-lane blocks alternate
 * 64-byte steps of 8 columns, byte t of a lane word holding column 8j + t (low nibble) and
 * 8j + 4 + t (high).
 *
 * Why: batch-1 int4 decode on AVX2 is compute-bound, not memory-bound. Widening every weight
 * to fp32 costs a shuffle, a convert and an FMA per 8 weights, ~29 GB/s on 2 Zen 4 cores
 * capped at AVX2 (docs/benchmarks.md, issue 49). With 8-bit activations the products are
 * integer: vpmaddubsw multiplies 32 nibbles by 32 activation bytes and adds pairs, so 64
 * weights cost a mask, a shift, a mask, two vpmaddubsw and two adds; the four steps of a
 * block add up in int16 (|sum| <= 4 * 2 * 2 * 15 * 127 = 30480, no overflow) and become fp32
 * once per block and lane: vpmaddwd, a convert and an FMA by scale * d. This is llama.cpp's
 * q4_1 x q8_1 dot product in graft's layout; the price is x's rounding, which the scheme's
 * name says and `graft bench scheme-quality` measures. On AVX-512 VNNI, vpdpbusd adds 4 products
 * straight into int32 lanes, 16 at a time: the same integer sums and fp32 steps, the same bits.
 *
 * The minimum term, min_g * sum over group g of x_hat, uses the group sums of x_hat, so the
 * result is the dequantized linear on x_hat up to fp32 summation order. A row holding inf or
 * NaN gives NaN in every output (what the reference gives: its blocks round to NaN); a block
 * whose d would be subnormal (1 / d could overflow) rounds to zero. Without AVX2 the
 * dispatcher (quant_linear_cpu.c) runs its portable int4 loop on graft_quant_round8's x_hat.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

#include "avx2_store.h"
#define A8_AVX2 1
#else
#define A8_AVX2 0
#endif
#if A8_AVX2 && defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include "vnni_dot.h"
#define A8_VNNI 1 /* the same sums on AVX-512 VNNI: vpdpbusd, 16 lanes (below) */
#else
#define A8_VNNI 0
#endif

#define QBLOCK 32 /* activation columns per scale */
#define PREFETCH 4096 /* bytes ahead in the weight stream (quant_avx2_cpu.c's one-row pass) */

/* One block of 32 columns to int8 (d: its scale); returns the sum of its xq. Vector and scalar
 * versions give the same bytes: max is exact, and vcvtps2dq rounds to nearest even as
 * nearbyintf does in the default rounding mode. */
static inline int act8_block(const float *xb, int vector, int8_t *q, float *d) {
#if A8_AVX2
    if (vector) {
        const __m256 sign = _mm256_set1_ps(-0.0f);
        __m256 v[4], m = _mm256_setzero_ps();
        for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(xb + 8 * i), m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[i]));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        const float db = _mm_cvtss_f32(h) / 127.0f, id = db >= FLT_MIN ? 1.0f / db : 0.0f;
        __m256i n[4];
        for (int i = 0; i < 4; ++i) n[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], _mm256_set1_ps(id)));
        __m256i sum = _mm256_add_epi32(_mm256_add_epi32(n[0], n[1]), _mm256_add_epi32(n[2], n[3]));
        /* packs interleave the 128-bit lanes: dwords 0 4 1 5 2 6 3 7 put them back in order */
        const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(n[0], n[1]), _mm256_packs_epi32(n[2], n[3]));
        _mm256_storeu_si256((__m256i *)q, _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
        __m128i s = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
        s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
        *d = db;
        return _mm_cvtsi128_si32(s);
    }
#endif
    (void)vector;
    float amax = 0.0f;
    for (int i = 0; i < QBLOCK; ++i) {
        const float a = fabsf(xb[i]);
        amax = a > amax ? a : amax;
    }
    const float db = amax / 127.0f, id = db >= FLT_MIN ? 1.0f / db : 0.0f;
    int sum = 0;
    for (int i = 0; i < QBLOCK; ++i) { /* |x * id| <= 127 (+ rounding): in range */
        q[i] = (int8_t)nearbyintf(xb[i] * id);
        sum += q[i];
    }
    *d = db;
    return sum;
}

/* Whether the row's K values are all finite (x * 0 summed: NaN once any is inf or NaN). */
static int row_finite(const float *x, int64_t K) {
    float check[8] = {0};
    int64_t k = 0;
    for (; k + 8 <= K; k += 8)
        for (int i = 0; i < 8; ++i) check[i] += x[k + i] * 0.0f;
    for (; k < K; ++k) check[0] += x[k] * 0.0f;
    int bad = 0;
    for (int i = 0; i < 8; ++i) bad |= check[i] != 0.0f;
    return !bad;
}

/* xhat [M][K] = x rounded to int8 per 32 columns and back (the reference's
 * round_activations): a block holding inf or NaN is NaN. For the portable int4 loop on CPUs
 * without AVX2. */
void graft_quant_round8(const float *x, int64_t ldx, int64_t M, int64_t K, float *xhat) {
    for (int64_t m = 0; m < M; ++m)
        for (int64_t b = 0; b < K / QBLOCK; ++b) {
            const float *xb = x + m * ldx + b * QBLOCK;
            float *out = xhat + m * K + b * QBLOCK;
            if (!row_finite(xb, QBLOCK)) {
                for (int i = 0; i < QBLOCK; ++i) out[i] = NAN;
                continue;
            }
            int8_t q[QBLOCK];
            float db;
            act8_block(xb, 0, q, &db);
            for (int i = 0; i < QBLOCK; ++i) out[i] = (float)q[i] * db;
        }
}

#if A8_AVX2
/* Round rows of x to int8 per 32-column block: xq [M][K], d [M][K/32], gs [M][G] the group
 * sums of x_hat (G = K / group). K is a multiple of 32 (int4 groups are 32, 64 or 128).
 * bad[m]: row m holds inf or NaN (its numbers are then zeros: its outputs become NaN). */
static void act8_rows(const float *x, int64_t ldx, int64_t M, int64_t K, int64_t group,
                      int8_t *xq, float *d, float *gs, unsigned char *bad) {
    const int64_t nb = K / QBLOCK, per_group = group / QBLOCK, G = K / group;
    for (int64_t m = 0; m < M; ++m) {
        const float *xm = x + m * ldx;
        bad[m] = !row_finite(xm, K);
        if (bad[m]) {
            memset(xq + m * K, 0, (size_t)K);
            for (int64_t b = 0; b < nb; ++b) d[m * nb + b] = 0.0f;
            for (int64_t g = 0; g < G; ++g) gs[m * G + g] = 0.0f;
            continue;
        }
        for (int64_t g = 0; g < G; ++g) {
            float t = 0.0f;
            for (int64_t b = g * per_group; b < (g + 1) * per_group; ++b) {
                const int sum = act8_block(xm + b * QBLOCK, A8_AVX2, xq + m * K + b * QBLOCK, d + m * nb + b);
                t += d[m * nb + b] * (float)sum;
            }
            gs[m * G + g] = t;
        }
    }
}
/* acc[r][h] (int16 pairs) += the nibbles of half h of step `ws` times row r's activation
 * bytes of the step: columns 8j..8j+3 (low nibbles) and 8j+4..8j+7 (high). One half at a time
 * and the activations broadcast from memory (a load, no register held): 4 rows x 2 halves of
 * accumulators stay in registers. */
#define A8_STEP(R, H, ws, xs, K, acc)                                                           \
    for (int h = 0; h < (H); ++h) {                                                             \
        const __m256i v = _mm256_loadu_si256((const __m256i *)((ws) + 32 * h));                 \
        const __m256i lo = _mm256_and_si256(v, nib), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib); \
        for (int r = 0; r < (R); ++r) {                                                         \
            int32_t xl, xh;                                                                     \
            memcpy(&xl, (xs) + r * (K), 4);                                                     \
            memcpy(&xh, (xs) + r * (K) + 4, 4);                                                 \
            const __m256i bl = _mm256_set1_epi32(xl), bh = _mm256_set1_epi32(xh);              \
            (acc)[r][h] = _mm256_add_epi16((acc)[r][h],                                         \
                _mm256_add_epi16(_mm256_maddubs_epi16(lo, bl), _mm256_maddubs_epi16(hi, bh)));  \
            __asm__("" : "+x"((acc)[r][h])); /* keeps GCC from computing every product first */ \
        }                                                                                       \
    }

/* out[r][h] = row r's x_hat . H 8-lane halves of int4 weights starting at w (steps 128 bytes
 * apart; H = 4: the pair, H = 2: one block), scale and minimum included. sc, mn: the pair's
 * fp16 scales and minimums of group 0 (64 halves per group), offset to the first half. */
static inline __attribute__((always_inline)) void a8_tile(
    int R, int H, const int8_t *xq, const float *d, const float *gs, int64_t K, int64_t group,
    const uint8_t *w, const uint16_t *sc, const uint16_t *mn, __m256 out[][4]) {
    const __m256i nib = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    const int64_t nb = K / QBLOCK, per_group = group / QBLOCK, G = K / group;
    for (int r = 0; r < R; ++r)
        for (int h = 0; h < H; ++h) out[r][h] = _mm256_setzero_ps();
    for (int64_t g = 0; g < G; ++g) {
        __m256 s[4];
        for (int h = 0; h < H; ++h)
            s[h] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sc + g * 64 + 8 * h)));
        for (int64_t b = g * per_group; b < (g + 1) * per_group; ++b) {
            __m256i acc[4][4];
            for (int r = 0; r < R; ++r)
                for (int h = 0; h < H; ++h) acc[r][h] = _mm256_setzero_si256();
            const uint8_t *wb = w + b * 4 * 128;
            _Pragma("GCC unroll 4") for (int t = 0; t < 4; ++t) {
                __builtin_prefetch(wb + t * 128 + PREFETCH, 0, 3);
                if (H == 4) __builtin_prefetch(wb + t * 128 + PREFETCH + 64, 0, 3);
                A8_STEP(R, H, wb + t * 128, xq + b * QBLOCK + 8 * t, K, acc);
            }
            for (int r = 0; r < R; ++r) {
                const __m256 db = _mm256_set1_ps(d[r * nb + b]);
                for (int h = 0; h < H; ++h)
                    out[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(acc[r][h], ones)),
                                                _mm256_mul_ps(s[h], db), out[r][h]);
            }
        }
        for (int h = 0; h < H; ++h) {
            const __m256 n = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(mn + g * 64 + 8 * h)));
            for (int r = 0; r < R; ++r)
                out[r][h] = _mm256_fmadd_ps(_mm256_set1_ps(gs[r * G + g]), n, out[r][h]);
        }
    }
}

/* One tile; constant R and H per specialisation (the int accumulators stay in registers):
 * one row takes the whole pair in one pass (4 halves), 2-4 rows one block (2 halves). */
static void a8_run(int R, int H, const int8_t *xq, const float *d, const float *gs, int64_t K,
                   int64_t group, const uint8_t *w, const uint16_t *sc, const uint16_t *mn,
                   const float *bias, int64_t o0, float *y, int64_t ldy, int64_t N) {
    __m256 out[4][4];
    switch (R * 8 + H) {
    case 1 * 8 + 4: a8_tile(1, 4, xq, d, gs, K, group, w, sc, mn, out); break;
    case 2 * 8 + 2: a8_tile(2, 2, xq, d, gs, K, group, w, sc, mn, out); break;
    case 3 * 8 + 2: a8_tile(3, 2, xq, d, gs, K, group, w, sc, mn, out); break;
    default: a8_tile(4, 2, xq, d, gs, K, group, w, sc, mn, out); break;
    }
    store_tile(R, H, out, 0, bias, o0, y, ldy, N);
}
#endif

#if A8_VNNI
/* a8_tile on AVX-512 VNNI: R rows x the pair's two 16-lane blocks in one pass. vpdpbusd adds 4
 * products into an int32 lane, so a block's 4 steps need no int16 stage; per block and lane the
 * fp32 steps are a8_tile's (convert, FMA by scale x d; min x group sum per group), in its order,
 * so both paths give the same bits. */
static inline __attribute__((always_inline)) void a8_tile_vnni(
    int R, const int8_t *xq, const float *d, const float *gs, int64_t K, int64_t group,
    const uint8_t *w, const uint16_t *sc, const uint16_t *mn, __m512 out[][2]) {
    const __m512i nib = _mm512_set1_epi8(0x0F);
    const int64_t nb = K / QBLOCK, per_group = group / QBLOCK, G = K / group;
    for (int r = 0; r < R; ++r) out[r][0] = out[r][1] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; ++g) {
        const __m512 s0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sc + g * 64))),
                     s1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sc + g * 64 + 16)));
        for (int64_t b = g * per_group; b < (g + 1) * per_group; ++b) {
            __m512i acc[4][2];
            for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
            _Pragma("GCC unroll 4") for (int t = 0; t < 4; ++t) {
                const uint8_t *ws = w + (b * 4 + t) * 128;
                __builtin_prefetch(ws + PREFETCH, 0, 3);
                __builtin_prefetch(ws + PREFETCH + 64, 0, 3);
                for (int h = 0; h < 2; ++h) {
                    const __m512i v = _mm512_loadu_si512((const void *)(ws + 64 * h));
                    const __m512i lo = _mm512_and_si512(v, nib), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
                    for (int r = 0; r < R; ++r) {
                        int32_t xl, xh;
                        memcpy(&xl, xq + r * K + b * QBLOCK + 8 * t, 4);
                        memcpy(&xh, xq + r * K + b * QBLOCK + 8 * t + 4, 4);
                        acc[r][h] = dot(dot(acc[r][h], lo, _mm512_set1_epi32(xl)), hi, _mm512_set1_epi32(xh));
                    }
                }
            }
            for (int r = 0; r < R; ++r) {
                const __m512 db = _mm512_set1_ps(d[r * nb + b]);
                out[r][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][0]), _mm512_mul_ps(s0, db), out[r][0]);
                out[r][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][1]), _mm512_mul_ps(s1, db), out[r][1]);
            }
        }
        const __m512 n0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(mn + g * 64))),
                     n1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(mn + g * 64 + 16)));
        for (int r = 0; r < R; ++r) {
            out[r][0] = _mm512_fmadd_ps(_mm512_set1_ps(gs[r * G + g]), n0, out[r][0]);
            out[r][1] = _mm512_fmadd_ps(_mm512_set1_ps(gs[r * G + g]), n1, out[r][1]);
        }
    }
}

/* R rows (1-4) through one pair on VNNI, stored as store_tile does (bias added, lanes past N
 * left alone) */
static void a8_run_vnni(int R, const int8_t *xq, const float *d, const float *gs, int64_t K,
                        int64_t group, const uint8_t *w, const uint16_t *sc, const uint16_t *mn,
                        const float *bias, int64_t o0, float *y, int64_t ldy, int64_t N) {
    __m512 out[4][2];
    switch (R) {
    case 1: a8_tile_vnni(1, xq, d, gs, K, group, w, sc, mn, out); break;
    case 2: a8_tile_vnni(2, xq, d, gs, K, group, w, sc, mn, out); break;
    case 3: a8_tile_vnni(3, xq, d, gs, K, group, w, sc, mn, out); break;
    default: a8_tile_vnni(4, xq, d, gs, K, group, w, sc, mn, out); break;
    }
    __m256 halves[4][4];
    for (int r = 0; r < R; ++r)
        for (int b = 0; b < 2; ++b) {
            halves[r][2 * b] = _mm512_castps512_ps256(out[r][b]);
            halves[r][2 * b + 1] = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(out[r][b]), 1));
        }
    store_tile(R, 4, halves, 0, bias, o0, y, ldy, N);
}
#endif

/* graft_quant_linear's arguments for int4 weights (kind 4 there). Returns 0; 1 when this
 * build has no AVX2 (the caller runs the portable loop on graft_quant_round8's x_hat); -1
 * when scratch could not be allocated (y not written). */
int graft_quant_int4_a8(int vnni, const float *x, int64_t ldx, int64_t M, int64_t K,
                        const void *w, const uint16_t *scales4, const uint16_t *mins4,
                        int64_t group, const float *bias, float *y, int64_t ldy, int64_t N,
                        int64_t NB, int nthreads) {
#if A8_AVX2
    (void)vnni; /* (read only where this build has VNNI) */
    const int64_t nb = K / QBLOCK, G = K / group;
    /* xq [M][K] int8, then d [M][nb], gs [M][G], bad [M] */
    char *scratch = malloc((size_t)(M * K) + sizeof(float) * (size_t)(M * (nb + G)) + (size_t)M + 64);
    if (!scratch) return -1;
    int8_t *xq = (int8_t *)scratch;
    float *d = (float *)(scratch + (M * K + 63) / 64 * 64), *gs = d + M * nb;
    unsigned char *bad = (unsigned char *)(gs + M * G);
    act8_rows(x, ldx, M, K, group, xq, d, gs, bad);
    const int64_t pairs = NB / 2, pair_bytes = K * 16, full = M / 4 * 4;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (pairs > 1 && nthreads > 1)
    for (int64_t p = 0; p < pairs; ++p) {
        if (p * 32 >= N) continue;
        const uint8_t *wp = (const uint8_t *)w + p * pair_bytes;
        const uint16_t *sc = scales4 + p * G * 64, *mn = mins4 + p * G * 64;
#if A8_VNNI
        if (vnni) {
            for (int64_t m0 = 0; m0 < M; m0 += 4)
                a8_run_vnni((int)(M - m0 < 4 ? M - m0 : 4), xq + m0 * K, d + m0 * nb, gs + m0 * G,
                            K, group, wp, sc, mn, bias, p * 32, y + m0 * ldy, ldy, N);
            continue;
        }
#endif
        for (int b = 0; b < 2; ++b)
            for (int64_t m0 = 0; m0 < full; m0 += 4)
                a8_run(4, 2, xq + m0 * K, d + m0 * nb, gs + m0 * G, K, group, wp + 64 * b,
                       sc + 16 * b, mn + 16 * b, bias, p * 32 + 16 * b, y + m0 * ldy, ldy, N);
        const int rest = (int)(M - full);
        if (rest == 1)
            a8_run(1, 4, xq + full * K, d + full * nb, gs + full * G, K, group, wp, sc, mn,
                   bias, p * 32, y + full * ldy, ldy, N);
        else if (rest)
            for (int b = 0; b < 2; ++b)
                a8_run(rest, 2, xq + full * K, d + full * nb, gs + full * G, K, group,
                       wp + 64 * b, sc + 16 * b, mn + 16 * b, bias, p * 32 + 16 * b,
                       y + full * ldy, ldy, N);
    }
    for (int64_t m = 0; m < M; ++m)
        if (bad[m])
            for (int64_t o = 0; o < N; ++o) y[m * ldy + o] = NAN;
    free(scratch);
    return 0;
#else
    (void)vnni; (void)x; (void)ldx; (void)M; (void)K; (void)w; (void)scales4; (void)mins4; (void)group;
    (void)bias; (void)y; (void)ldy; (void)N; (void)NB; (void)nthreads;
    return 1;
#endif
}
