/* int8 and int4 weight-only linears on AVX2 + FMA (graft_quant_linear's integer calls on CPUs
 * without AVX-512 VNNI, or whose x holds inf or NaN), W in
 * quant_vnni_cpu.c's layouts: a pair's two 16-lane blocks alternate 64-byte steps; int8 holds
 * q + 128, four columns per lane word (byte t: column 4j + t); int4 holds eight (byte t: column
 * 8j + t in the low nibble, 8j + 4 + t in the high), y = sum_g s_g sum_k x q + min_g sum_k x.
 *
 * Why it looks like this: at decode sizes the cost is widening weights to fp32, not the FMAs.
 * One vpshufb moves byte t of every lane word into one byte of the word, zeros elsewhere, and
 * vcvtdq2ps converts that int32 exactly: 2 uops per 8 weights where shift, shift (or mask),
 * convert took 3. int8 is XORed to signed q first and goes to the top byte (q * 2^24); int4's
 * nibbles are masked in place first, 0x0F and 0xF0, once per four columns, and go to byte 2
 * (q * 2^16 and q * 2^20). The powers of 2 are taken out of x instead: a copy per call,
 * x * 2^-24, 2^-16 or 2^-20, exact but for |x| < 2^-100 or so, so every product is the
 * dequantized model's x * q, bit for bit.
 *
 * Tiles: 4 rows x one block (8 accumulators), or the leftover 1-3 rows x the pair's two blocks
 * (4-12 accumulators: one pass over the pair's interleaved stream, and more independent FMA
 * chains at one row). Each row and lane is one FMA chain over the columns in order (int4: per
 * group), whatever the tile: a row's result does not depend on its batch. One row runs about
 * one FMA a cycle, held there by the widening, not by its 4 chains' FMA latency: a second
 * chain per lane (K split in halves, in every tile) measured no faster cache-hot and slower
 * from memory (docs/kernels.md).
 */
#include <stdint.h>
#include <stdlib.h>

#include "quant_group_sums.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define INT_AVX2 1
#else
#define INT_AVX2 0
#endif

enum { KIND_INT8 = 0, KIND_INT4 = 1 };
#define ROWS 4 /* rows of a one-block tile */

#if INT_AVX2
/* shuffle mask of column t: byte t of each 32-bit word to byte `at` of the word, zeros
 * elsewhere (at = 3 keeps int8's sign; int4's high nibble, 16 q, needs at = 2 to stay positive) */
static inline __m256i column_mask(int t, int at) {
    const __m256i word = _mm256_set1_epi32((int)(0x80808080u & ~(0xffu << 8 * at)) | (t << 8 * at));
    return _mm256_add_epi32(word, _mm256_setr_epi32(0, 4 << 8 * at, 8 << 8 * at, 12 << 8 * at,
                                                     0, 4 << 8 * at, 8 << 8 * at, 12 << 8 * at));
}

/* The weight bytes 16 steps on (2 KB; 1 KB and 4 KB measured slower): the hardware prefetcher
 * alone left a cold 1024 x 1024 int8 matrix at 13-14 GB/s at one row where fp32 streamed 20
 * (18.8 with this; 4 rows 26 -> 32 GMAC/s; linear_micro --cold). __builtin_prefetch, not
 * _mm_prefetch: GCC 12 dropped the latter from this file at -O1 and above. */
static inline void prefetch_step(const uint8_t *step, int H) {
    __builtin_prefetch(step + 2048, 0, 3);
    if (H == 4) __builtin_prefetch(step + 2048 + 64, 0, 3);
}

/* acc[r][h] += xs[r][k0 + t] * column t of the words v[h], t = 0..3 */
#define FOUR_COLUMNS(R, H, v, xk, ldx, acc, masks)                                              \
    _Pragma("GCC unroll 4") for (int t = 0; t < 4; ++t) {                                       \
        const __m256i mask = (masks)[t];                                                        \
        for (int h = 0; h < (H); ++h) {                                                         \
            const __m256 wv = _mm256_cvtepi32_ps(_mm256_shuffle_epi8((v)[h], mask));            \
            for (int r = 0; r < (R); ++r)                                                       \
                (acc)[r][h] = _mm256_fmadd_ps(_mm256_broadcast_ss((xk) + r * (ldx) + t), wv, (acc)[r][h]); \
        }                                                                                       \
    }

/* out[r][h] = row r of the tile . its H 8-lane halves (H = 2: one block, its halves 32 bytes
 * apart; H = 4: the pair, 128 contiguous bytes a step). int8: before the channel scale; int4:
 * with the group scales and minimums (sc, mn: the first block's, 8 lanes per half; gs: group
 * sums of x, [R][G]). */
static inline __attribute__((always_inline)) void int_tile(
    int kind, int R, int H, const float *xs, int64_t ldx, int64_t K, const uint8_t *w,
    const uint16_t *sc, const uint16_t *mn, int64_t group, const float *gs, __m256 out[][4]) {
    const __m256i masks[4] = {column_mask(0, kind == KIND_INT8 ? 3 : 2), column_mask(1, kind == KIND_INT8 ? 3 : 2),
                              column_mask(2, kind == KIND_INT8 ? 3 : 2), column_mask(3, kind == KIND_INT8 ? 3 : 2)};
    for (int r = 0; r < R; ++r)
        for (int h = 0; h < H; ++h) out[r][h] = _mm256_setzero_ps();
    if (kind == KIND_INT8) {
        const __m256i flip = _mm256_set1_epi8((char)0x80); /* q + 128 -> q */
        for (int64_t j = 0; j < (K + 3) / 4; ++j) {
            prefetch_step(w + j * 128, H);
            __m256i v[4];
            for (int h = 0; h < H; ++h)
                v[h] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w + j * 128 + 32 * h)), flip);
            FOUR_COLUMNS(R, H, v, xs + 4 * j, ldx, out, masks)
        }
        return;
    }
    const __m256i low = _mm256_set1_epi8(0x0F), high = _mm256_set1_epi8((char)0xF0);
    const int64_t G = K / group;
    for (int64_t g = 0; g < G; ++g) {
        __m256 part[ROWS][4];
        for (int r = 0; r < R; ++r)
            for (int h = 0; h < H; ++h) part[r][h] = _mm256_setzero_ps();
        for (int64_t j = g * group / 8; j < (g + 1) * group / 8; ++j) {
            prefetch_step(w + j * 128, H);
            __m256i lo[4], hi[4];
            for (int h = 0; h < H; ++h) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(w + j * 128 + 32 * h));
                lo[h] = _mm256_and_si256(v, low);
                hi[h] = _mm256_and_si256(v, high);
            }
            FOUR_COLUMNS(R, H, lo, xs + 8 * j, ldx, part, masks)
            FOUR_COLUMNS(R, H, hi, xs + 8 * j + 4, ldx, part, masks)
        }
        for (int h = 0; h < H; ++h) {
            const __m256 s = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sc + g * 64 + 8 * h)));
            const __m256 n = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(mn + g * 64 + 8 * h)));
            for (int r = 0; r < R; ++r)
                out[r][h] = _mm256_fmadd_ps(_mm256_set1_ps(gs[r * G + g]), n,
                                            _mm256_fmadd_ps(part[r][h], s, out[r][h]));
        }
    }
}

/* y[r][o0 + l] = out * scale + bias for the tile's rows and 8 * H lanes, lanes past N left alone */
static void store_tile(int R, int H, __m256 out[][4], const float *scale, const float *bias,
                       int64_t o0, float *y, int64_t ldy, int64_t N) {
    for (int r = 0; r < R; ++r) {
        float row[32];
        for (int h = 0; h < H; ++h) _mm256_storeu_ps(row + 8 * h, out[r][h]);
        for (int l = 0; l < 8 * H && o0 + l < N; ++l)
            y[r * ldy + o0 + l] = row[l] * (scale ? scale[o0 + l] : 1.0f) + (bias ? bias[o0 + l] : 0.0f);
    }
}

/* One tile, R rows x H halves; constant kind, R and H per call: each specialisation keeps
 * its accumulators in registers. */
static void run_tile(int kind, int R, int H, const float *xs, int64_t ldx, int64_t K,
                     const uint8_t *w, const uint16_t *sc, const uint16_t *mn, int64_t group,
                     const float *gs, const float *scale, const float *bias, int64_t o0, float *y,
                     int64_t ldy, int64_t N) {
    __m256 out[ROWS][4];
#define TILE(KIND)                                                                          \
    if (H == 2) int_tile(KIND, ROWS, 2, xs, ldx, K, w, sc, mn, group, gs, out);             \
    else if (R == 1) int_tile(KIND, 1, 4, xs, ldx, K, w, sc, mn, group, gs, out);           \
    else if (R == 2) int_tile(KIND, 2, 4, xs, ldx, K, w, sc, mn, group, gs, out);           \
    else int_tile(KIND, 3, 4, xs, ldx, K, w, sc, mn, group, gs, out);
    if (kind == KIND_INT8) { TILE(KIND_INT8) } else { TILE(KIND_INT4) }
#undef TILE
    store_tile(R, H, out, scale, bias, o0, y, ldy, N);
}
#endif

/* Same arguments as graft_quant_linear, for kind int8 or int4. Returns 0; 1 when this build
 * has no AVX2; -1 when the scaled copy of x could not be allocated. */
int graft_quant_int_avx2(int kind, const float *x, int64_t ldx, int64_t M, int64_t K,
                         const void *w, const float *scale8, const uint16_t *scales4,
                         const uint16_t *mins4, int64_t group, const float *bias, float *y,
                         int64_t ldy, int64_t N, int64_t NB, int nthreads) {
#if INT_AVX2
    const int64_t KP = kind == KIND_INT8 ? (K + 3) / 4 * 4 : K, G = kind == KIND_INT4 ? K / group : 0;
    /* x without the weights' powers of 2, rows zero-padded to KP (int8's padded columns hold
     * q = 0), then int4's group sums [M][G] */
    float *xs = malloc(sizeof(float) * (size_t)(M * (KP + G)));
    if (!xs) return -1;
    float *gs = xs + M * KP;
    for (int64_t m = 0; m < M; ++m) { /* plain loops the compiler vectorizes: 2 ns a column counted at 32 rows */
        const float *xm = x + m * ldx;
        float *sm = xs + m * KP;
        if (kind == KIND_INT8) {
            for (int64_t k = 0; k < K; ++k) sm[k] = xm[k] * 0x1p-24f;
            for (int64_t k = K; k < KP; ++k) sm[k] = 0.0f;
        } else {
            for (int64_t j = 0; j < K; j += 8)
                for (int t = 0; t < 8; ++t) sm[j + t] = xm[j + t] * (t < 4 ? 0x1p-16f : 0x1p-20f);
        }
    }
    if (G) group_sums(x, ldx, M, K, group, gs);
    const int64_t pairs = NB / 2, full = M / ROWS * ROWS;
    const int64_t pair_bytes = kind == KIND_INT8 ? KP * 32 : K * 16;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (pairs > 1 && nthreads > 1)
    for (int64_t p = 0; p < pairs; ++p) {
        if (p * 32 >= N) continue;
        const uint8_t *wp = (const uint8_t *)w + p * pair_bytes;
        const uint16_t *sc = G ? scales4 + p * G * 64 : 0, *mn = G ? mins4 + p * G * 64 : 0;
        for (int b = 0; b < 2; ++b) /* block b of the pair: 64 bytes into each step */
            for (int64_t m0 = 0; m0 < full; m0 += ROWS)
                run_tile(kind, ROWS, 2, xs + m0 * KP, KP, K, wp + 64 * b, sc ? sc + 16 * b : 0,
                         mn ? mn + 16 * b : 0, group, gs + m0 * G, scale8, bias, p * 32 + 16 * b,
                         y + m0 * ldy, ldy, N);
        if (full < M)
            run_tile(kind, (int)(M - full), 4, xs + full * KP, KP, K, wp, sc, mn, group,
                     gs + full * G, scale8, bias, p * 32, y + full * ldy, ldy, N);
    }
    free(xs);
    return 0;
#else
    (void)kind; (void)x; (void)ldx; (void)M; (void)K; (void)w; (void)scale8; (void)scales4;
    (void)mins4; (void)group; (void)bias; (void)y; (void)ldy; (void)N; (void)NB; (void)nthreads;
    return 1;
#endif
}
