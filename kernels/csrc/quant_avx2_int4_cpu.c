/* int4 weight-only linears on AVX2 with the activations as integer digits, the VNNI path's
 * arithmetic (quant_vnni_cpu.c) without VNNI: y = x @ dequant(W)^T + bias, W in its int4
 * layout (a pair's two 16-lane blocks alternate 64-byte steps; byte t of a lane word: column
 * 8j + t in the low nibble, 8j + 4 + t in the high; fp16 scales and minimums per group).
 *
 * Why: widening every nibble to fp32 for an FMA (quant_avx2_int_cpu.c) costs a vpshufb, a
 * vcvtdq2ps and an FMA per 8 weights at one row, and batch-1 int4 decode of the 1.5B shape ran
 * compute-bound at 77-78% of the read bandwidth. vpmaddubsw multiplies 32 unsigned bytes (the
 * nibbles as stored, once masked) by 32 signed bytes and adds pairs into int16 lanes: 32
 * weights an instruction. The activations go in as quant_vnni_cpu.c writes them: each row
 * x = s * X, X = round(x / s) a 24-bit integer (s = max|x| / (127 * 2^16)) in three balanced
 * base-256 digits d in [-128, 127], so every digit's products are exact integers and the only
 * rounding is x -> s * X (about 2^-24 of the row's largest |x|).
 *
 * A pair of nibble-digit products is at most 2 * 15 * 128 = 3840, so one int16 lane holds 8 of
 * them (30720 < 32767): each digit's int16 sums run over 32 columns (4 steps, the lo and hi
 * nibbles of each), then vpmaddwd by 1 widens them into int32 group sums. The group sums are
 * then folded exactly as the VNNI tile folds its own (combine: 2^16 a2 + 2^8 a1 + a0 in fp32,
 * then scale, minimum, * s, + bias, in that order), and the integer sums are exact whatever the
 * order, so a row's outputs equal the VNNI path's bit for bit, and do not depend on the batch
 * (tests/kernels/test_quant_avx2_int4.py).
 *
 * Tiles: one row x the pair in one pass over its stream (per group, each block's two halves:
 * 6 int16 sums, a half's lo and hi nibbles, the mask, a broadcast digit; the 4 outputs stay in
 * registers), or ROWS rows x the pair, each group's four halves in turn (9 sums; the group's
 * 512 bytes stay in L1), so a step is unpacked once for all its rows. Register pressure shaped
 * both (16 ymm on AVX2; GCC spilled a sum whenever more was live, and every spilled sum chained
 * the loop through a store and a load). Against the fp32 path, 1 thread on the Zen 4 built for
 * Zen 3 (-march=znver3), 8960 x 1536: one row 1.25x, 3+ rows 0.87x (docs/kernels.md).
 */
#include <stdint.h>
#include <stdlib.h>

#include "quant_group_sums.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define INT4_AVX2 1
#else
#define INT4_AVX2 0
#endif

#if INT4_AVX2
#define PIECES 3
#define X_RANGE 8323072.0f /* 127 * 2^16, as quant_vnni_cpu.c: |X| below the digits' limit */
#define PF_AHEAD 2048      /* bytes of the pair's stream prefetched ahead (quant_avx2_int_cpu.c) */
#define ROWS 3             /* a multi-row tile (2 and 4 ran slower: 4 spilled) */
#define M_CHUNK 96         /* rows whose digits stay in L2 while every pair passes, as the VNNI path */

/* Row x -> *rs (the step s) and its PIECES digit rows dig[p * K + k], as quant_vnni_cpu.c's
 * prep_row writes them (same rounding, same digits). K is a multiple of 32 (int4 groups).
 * Returns 1 when the row holds inf or NaN, or its largest |x| is below 1e-30 (1/s would
 * overflow): the caller runs the fp32 path then. */
static int prep_row(const float *x, int64_t K, int8_t *dig, float *rs) {
    const __m256 sign = _mm256_set1_ps(-0.0f), fmax = _mm256_set1_ps(3.4028235e38f);
    __m256 mx = _mm256_setzero_ps(), finite = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    for (int64_t k = 0; k < K; k += 8) {
        const __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + k));
        mx = _mm256_max_ps(mx, a);
        finite = _mm256_and_ps(finite, _mm256_cmp_ps(a, fmax, _CMP_LE_OQ)); /* false for NaN */
    }
    if (_mm256_movemask_ps(finite) != 0xff) return 1;
    float lanes[8], amax = 0.0f;
    _mm256_storeu_ps(lanes, mx);
    for (int l = 0; l < 8; ++l) amax = lanes[l] > amax ? lanes[l] : amax;
    if (amax > 0.0f && amax < 1e-30f) return 1;
    *rs = amax / X_RANGE;
    const __m256 vinv = _mm256_set1_ps(amax > 0.0f ? X_RANGE / amax : 0.0f);
    const __m256i c128 = _mm256_set1_epi32(128), c255 = _mm256_set1_epi32(255);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t k = 0; k < K; k += 32) {
        __m256i d[PIECES][4];
        for (int v = 0; v < 4; ++v) {
            const __m256i X = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k + 8 * v), vinv));
            d[0][v] = _mm256_sub_epi32(_mm256_and_si256(_mm256_add_epi32(X, c128), c255), c128);
            const __m256i X1 = _mm256_srai_epi32(_mm256_sub_epi32(X, d[0][v]), 8);
            d[1][v] = _mm256_sub_epi32(_mm256_and_si256(_mm256_add_epi32(X1, c128), c255), c128);
            d[2][v] = _mm256_srai_epi32(_mm256_sub_epi32(X1, d[1][v]), 8);
        }
        for (int p = 0; p < PIECES; ++p) { /* 32 int32 in [-128, 127] -> 32 bytes in order */
            const __m256i w = _mm256_packs_epi16(_mm256_packs_epi32(d[p][0], d[p][1]),
                                                 _mm256_packs_epi32(d[p][2], d[p][3]));
            _mm256_storeu_si256((__m256i *)(dig + p * K + k), _mm256_permutevar8x32_epi32(w, order));
        }
    }
    return 0;
}

/* the 4 digits at p in every lane word; asm volatile, so that GCC neither merges the two
 * halves' broadcasts of one digit word nor hoists them: 6 more live registers spilled sums */
static inline __m256i bcast_word(const int8_t *p) {
    __m256i v;
    __asm__ volatile("vpbroadcastd %1, %0" : "=x"(v) : "m"(*(const int32_t *)p));
    return v;
}

/* 2^16 a2 + 2^8 a1 + a0 in fp32, in quant_epilogue.h's combine_digits order */
static inline __m256 combine(__m256i a0, __m256i a1, __m256i a2) {
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(a2), _mm256_set1_ps(65536.0f),
                           _mm256_fmadd_ps(_mm256_cvtepi32_ps(a1), _mm256_set1_ps(256.0f),
                                           _mm256_cvtepi32_ps(a0)));
}

/* s[p] += the products of one step's lo and hi nibbles (columns 8j..8j+3, 8j+4..8j+7) with
 * digit p of the row whose digits start at d (column 8j; digit rows K apart) */
#define STEP_SUMS(s, lo, hi, d, K)                                                              \
    do {                                                                                        \
        for (int p_ = 0; p_ < PIECES; ++p_) {                                                   \
            s[p_] = _mm256_add_epi16(s[p_], _mm256_maddubs_epi16(lo, bcast_word((d) + p_ * (K))));      \
            s[p_] = _mm256_add_epi16(s[p_], _mm256_maddubs_epi16(hi, bcast_word((d) + p_ * (K) + 4)));  \
        }                                                                                       \
    } while (0)

/* the lo and hi nibbles of the 8-lane half at p, each in the low 4 bits of its byte */
#define UNPACK(lo, hi, p)                                                                       \
    const __m256i v_##lo = _mm256_loadu_si256((const __m256i *)(p));                            \
    const __m256i lo = _mm256_and_si256(v_##lo, nib), hi = _mm256_and_si256(_mm256_srli_epi16(v_##lo, 4), nib)

static inline void prefetch_step(const uint8_t *step) {
    __builtin_prefetch(step + PF_AHEAD, 0, 3);
    __builtin_prefetch(step + PF_AHEAD + 64, 0, 3);
}

/* int16 sums s[p] (at most 8 pair products of |2 * 15 * 128| a lane: 30720) widened into a[p] */
static inline void widen(__m256i a[PIECES], const __m256i s[PIECES]) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int p = 0; p < PIECES; ++p) a[p] = _mm256_add_epi32(a[p], _mm256_madd_epi16(s[p], ones));
}

/* o += scale * combine(a) + min * xs' for half h of the pair's group g, the VNNI tile's fold
 * (halves 0, 1: block 0; 2, 3: block 1, whose scales sit 16 halves on) */
static inline __m256 fold(__m256 o, const __m256i a[PIECES], const uint16_t *sc, const uint16_t *mn,
                          int64_t g, int h, float xsum) {
    const int64_t at = g * 64 + (h >> 1) * 16 + (h & 1) * 8;
    const __m256 s = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sc + at)));
    const __m256 n = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(mn + at)));
    return _mm256_fmadd_ps(_mm256_set1_ps(xsum), n, _mm256_fmadd_ps(combine(a[0], a[1], a[2]), s, o));
}

/* One row x the pair, one pass over its stream: per group, block 0's two halves, then block
 * 1's (b: written out twice, so that GCC keeps the six sums and four outputs in registers
 * without copies), the outputs in registers. (Its digits stored pre-broadcast, 24 bytes a
 * column, as vpmaddubsw's memory operand ran 1.08x cache-hot but 0.69x from memory.) */
#define ROW_BLOCK(b, g, nsteps)                                                                 \
    do {                                                                                        \
        __m256i a0[PIECES], a1[PIECES];                                                         \
        for (int p = 0; p < PIECES; ++p) a0[p] = a1[p] = _mm256_setzero_si256();                \
        for (int64_t c = (g) * (nsteps) / 4; c < ((g) + 1) * (nsteps) / 4; ++c) {               \
            __m256i s0[PIECES], s1[PIECES];                                                     \
            for (int p = 0; p < PIECES; ++p) s0[p] = s1[p] = _mm256_setzero_si256();            \
            _Pragma("GCC unroll 4") for (int64_t j = 4 * c; j < 4 * c + 4; ++j) {              \
                const uint8_t *step = wp + j * 128 + 64 * (b);                                  \
                if ((b) == 0) prefetch_step(step);                                              \
                UNPACK(lo0, hi0, step);                                                         \
                STEP_SUMS(s0, lo0, hi0, dig + 8 * j, K);                                        \
                UNPACK(lo1, hi1, step + 32);                                                    \
                STEP_SUMS(s1, lo1, hi1, dig + 8 * j, K);                                        \
            }                                                                                   \
            widen(a0, s0);                                                                      \
            widen(a1, s1);                                                                      \
        }                                                                                       \
        o##b##0 = fold(o##b##0, a0, sc, mn, g, 2 * (b), xs[g]);                                 \
        o##b##1 = fold(o##b##1, a1, sc, mn, g, 2 * (b) + 1, xs[g]);                             \
    } while (0)

static inline __attribute__((always_inline)) void row_tile(
    const int8_t *dig, int64_t K, const uint8_t *wp, const uint16_t *sc, const uint16_t *mn,
    const float *xs, int64_t group, float *out) {
    const __m256i nib = _mm256_set1_epi8(0x0F);
    __m256 o00 = _mm256_setzero_ps(), o01 = o00, o10 = o00, o11 = o00;
    for (int64_t g = 0; g < K / group; ++g) {
        ROW_BLOCK(0, g, group / 8);
        ROW_BLOCK(1, g, group / 8);
    }
    _mm256_storeu_ps(out, o00);
    _mm256_storeu_ps(out + 8, o01);
    _mm256_storeu_ps(out + 16, o10);
    _mm256_storeu_ps(out + 24, o11);
}

/* ROWS rows x the pair: per group, each of the four halves in turn (the group's 512 bytes
 * stay in L1), each step unpacked once for the rows, the outputs in memory. */
static inline __attribute__((always_inline)) void rows_tile(
    const int8_t *dig, int64_t K, const uint8_t *wp, const uint16_t *sc, const uint16_t *mn,
    const float *xs, int64_t group, float *out) {
    const __m256i nib = _mm256_set1_epi8(0x0F);
    const int64_t G = K / group;
    for (int i = 0; i < ROWS * 32; ++i) out[i] = 0.0f;
    for (int64_t g = 0; g < G; ++g)
        for (int h = 0; h < 4; ++h) {
            __m256i a[ROWS][PIECES];
            for (int r = 0; r < ROWS; ++r)
                for (int p = 0; p < PIECES; ++p) a[r][p] = _mm256_setzero_si256();
            for (int64_t c = g * group / 32; c < (g + 1) * group / 32; ++c) {
                __m256i s[ROWS][PIECES];
                for (int r = 0; r < ROWS; ++r)
                    for (int p = 0; p < PIECES; ++p) s[r][p] = _mm256_setzero_si256();
                for (int64_t j = 4 * c; j < 4 * c + 4; ++j) {
                    if (h == 0) prefetch_step(wp + j * 128);
                    UNPACK(lo, hi, wp + j * 128 + 32 * h);
                    for (int r = 0; r < ROWS; ++r) STEP_SUMS(s[r], lo, hi, dig + r * PIECES * K + 8 * j, K);
                }
                for (int r = 0; r < ROWS; ++r) widen(a[r], s[r]);
            }
            for (int r = 0; r < ROWS; ++r)
                _mm256_storeu_ps(out + r * 32 + 8 * h,
                                 fold(_mm256_loadu_ps(out + r * 32 + 8 * h), a[r], sc, mn, g, h, xs[r * G + g]));
        }
}

/* y[r][o0 + l] = out * rs[r] * 1 + bias, as finish_pair (quant_epilogue.h); lanes past N left alone */
static void store_rows(int R, const float *out, const float *rs, const float *bias, int64_t o0,
                       float *y, int64_t ldy, int64_t N) {
    for (int r = 0; r < R; ++r) {
        float row[32];
        const __m256 s = _mm256_set1_ps(rs[r]);
        for (int h = 0; h < 4; ++h) {
            __m256 b = _mm256_setzero_ps();
            if (bias && o0 + 8 * h + 8 <= N) b = _mm256_loadu_ps(bias + o0 + 8 * h);
            else if (bias)
                for (int l = 0; l < 8; ++l) ((float *)&b)[l] = o0 + 8 * h + l < N ? bias[o0 + 8 * h + l] : 0.0f;
            _mm256_storeu_ps(row + 8 * h, _mm256_fmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(out + r * 32 + 8 * h), s), _mm256_set1_ps(1.0f), b));
        }
        for (int l = 0; l < 32 && o0 + l < N; ++l) y[r * ldy + o0 + l] = row[l];
    }
}

/* R = 1 or ROWS rows of the pair, groups of 32 (the common format: one int16 chunk a group)
 * compiled apart so their loops unroll; then y */
static void run_tile(int R, const int8_t *dig, int64_t K, const uint8_t *wp, const uint16_t *sc,
                     const uint16_t *mn, const float *xs, int64_t group, const float *rs,
                     const float *bias, int64_t o0, float *y, int64_t ldy, int64_t N) {
    float out[ROWS * 32];
    if (R == 1 && group == 32) row_tile(dig, K, wp, sc, mn, xs, 32, out);
    else if (R == 1) row_tile(dig, K, wp, sc, mn, xs, group, out);
    else if (group == 32) rows_tile(dig, K, wp, sc, mn, xs, 32, out);
    else rows_tile(dig, K, wp, sc, mn, xs, group, out);
    store_rows(R, out, rs, bias, o0, y, ldy, N);
}
#endif

/* graft_quant_linear's int4 arguments. Returns 0; 1 when this build has no AVX2, K is not a
 * multiple of 32, or a row of x has inf/NaN or a largest |x| below 1e-30 (the caller runs the
 * fp32 path: y is not written then); -1 when scratch could not be allocated. */
int graft_quant_int4_avx2_digits(const float *x, int64_t ldx, int64_t M, int64_t K, const void *w,
                                 const uint16_t *scales4, const uint16_t *mins4, int64_t group,
                                 const float *bias, float *y, int64_t ldy, int64_t N, int64_t NB,
                                 int nthreads) {
#if INT4_AVX2
    if (K % 32 || group % 32) return 1;
    const int64_t G = K / group, pairs = NB / 2;
    int8_t *dig = malloc((size_t)(M * PIECES * K));
    float *rs = malloc(sizeof(float) * (size_t)(M * (1 + G)));
    int status = dig && rs ? 0 : -1;
    float *xs = rs ? rs + M : 0;
    for (int64_t m = 0; m < M && !status; ++m) status = prep_row(x + m * ldx, K, dig + m * PIECES * K, rs + m);
    if (!status) { /* group sums of x, divided by the step, as quant_vnni_cpu.c */
        group_sums(x, ldx, M, K, group, xs);
        for (int64_t m = 0; m < M; ++m)
            for (int64_t g = 0; g < G; ++g) xs[m * G + g] = rs[m] > 0.0f ? xs[m * G + g] / rs[m] : 0.0f;
        for (int64_t mc = 0; mc < M; mc += M_CHUNK) {
            const int64_t mend = mc + M_CHUNK < M ? mc + M_CHUNK : M;
            const int64_t singles = mc + (mend - mc) / ROWS * ROWS; /* rows from here: 1-row tiles */
#pragma omp parallel for num_threads(nthreads) schedule(static) if (pairs > 1 && nthreads > 1)
            for (int64_t p = 0; p < pairs; ++p) {
                if (p * 32 >= N) continue;
                const uint8_t *wp = (const uint8_t *)w + p * K * 16;
                for (int64_t m0 = mc; m0 < mend; m0 += m0 < singles ? ROWS : 1)
                    run_tile(m0 < singles ? ROWS : 1, dig + m0 * PIECES * K, K, wp, scales4 + p * G * 64,
                             mins4 + p * G * 64, xs + m0 * G, group, rs + m0, bias, p * 32,
                             y + m0 * ldy, ldy, N);
            }
        }
    }
    free(dig);
    free(rs);
    return status;
#else
    (void)x; (void)ldx; (void)M; (void)K; (void)w; (void)scales4; (void)mins4; (void)group;
    (void)bias; (void)y; (void)ldy; (void)N; (void)NB; (void)nthreads;
    return 1;
#endif
}
