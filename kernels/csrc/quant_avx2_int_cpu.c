/* int8 and int4 weight-only linears on AVX2 + FMA (graft_quant_linear's integer calls on CPUs
 * without AVX-512 VNNI, or whose x holds inf or NaN; int8-gG's on CPUs without AVX-512), W in
 * quant_vnni_cpu.c's layouts: a pair's two 16-lane blocks alternate 64-byte steps; int8 holds
 * q + 128, four columns per lane word (byte t: column 4j + t); int4 holds eight (byte t: column
 * 8j + t in the low nibble, 8j + 4 + t in the high), y = sum_g s_g sum_k x q + min_g sum_k x.
 *
 * Why it looks like this: at decode sizes the cost is widening weights to fp32, not the FMAs.
 * int8: one vpshufb moves byte t of every lane word into the top byte of the word, zeros
 * elsewhere (XORed to signed q first), and vcvtdq2ps converts that int32 exactly, q * 2^24:
 * 2 uops per 8 weights where shift, shift, convert took 3. int4: one vpand keeps column c's
 * nibble in place (column 7's, at the sign bit, is shifted down instead) and vcvtdq2ps
 * converts it, q * 2^(0..24); no shuffle, so the 3 uops per 8 weights (with the FMA) spread
 * over all four FP pipes. The powers of 2 are taken out of x instead: a copy per call, x *
 * 2^-24 at most, exact but for |x| < 2^-100 or so, so every product is the dequantized
 * model's x * q, bit for bit.
 *
 * Tiles: 4 rows x one block (8 accumulators), or the leftover 1-3 rows x the pair's two blocks
 * (4-12 accumulators: one pass over the pair's interleaved stream; int4's 2 rows go block by
 * block, see INT4_TILE). Each row and lane is one FMA chain over the columns in order (int4:
 * per group), whatever the tile: a row's result does not depend on its batch. At one row those
 * are 4 chains, and their FMA latency held it to one FMA a cycle: int4 runs two groups side by
 * side there (each group's sum is its own chain, 8 in all, folded into the output in group
 * order), 1.16-1.22x from memory on one thread. A second chain per lane that splits a group
 * (K halves, or even/odd columns) would have to run in every tile, and the 4-row tiles have no
 * registers for it (docs/kernels.md).
 */
#include <stdint.h>
#include <stdlib.h>

#include "quant_group_sums.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

#include "avx2_store.h"
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
 * apart; H = 4: the pair, 128 contiguous bytes a step), before the channel scale. */
static inline __attribute__((always_inline)) void int8_tile(int R, int H, const float *xs,
                                                            int64_t ldx, int64_t K,
                                                            const uint8_t *w, __m256 out[][4]) {
    const __m256i masks[4] = {column_mask(0, 3), column_mask(1, 3), column_mask(2, 3), column_mask(3, 3)};
    const __m256i flip = _mm256_set1_epi8((char)0x80); /* q + 128 -> q */
    for (int r = 0; r < R; ++r)
        for (int h = 0; h < H; ++h) out[r][h] = _mm256_setzero_ps();
    for (int64_t j = 0; j < (K + 3) / 4; ++j) {
        prefetch_step(w + j * 128, H);
        __m256i v[4];
        for (int h = 0; h < H; ++h)
            v[h] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w + j * 128 + 32 * h)), flip);
        FOUR_COLUMNS(R, H, v, xs + 4 * j, ldx, out, masks)
    }
}

/* int8-gG (group > 0): the same widening, then each weight vector times its group's scales
 * (sc: fp32 [G][32] of the pair, the first half's at sc; a half h 8 floats on), so each
 * product is x times the dequantized weight fl(q * s), as the reference multiplies (2^24 out
 * of x as above: fl(q 2^24 s) is fl(q s) 2^24). One vmulps per 8 weights more than int8's; no
 * per-group accumulators, which the 4-row tiles have no registers for. */
static inline __attribute__((always_inline)) void int8g_tile(int R, int H, const float *xs,
                                                             int64_t ldx, int64_t K, const uint8_t *w,
                                                             const float *sc, int64_t group,
                                                             __m256 out[][4]) {
    const __m256i masks[4] = {column_mask(0, 3), column_mask(1, 3), column_mask(2, 3), column_mask(3, 3)};
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    for (int r = 0; r < R; ++r)
        for (int h = 0; h < H; ++h) out[r][h] = _mm256_setzero_ps();
    const int64_t steps = group / 4;
    for (int64_t g = 0; g < K / group; ++g) {
        __m256 s[4];
        for (int h = 0; h < H; ++h) s[h] = _mm256_loadu_ps(sc + g * 32 + 8 * h);
        for (int64_t j = g * steps; j < (g + 1) * steps; ++j) {
            prefetch_step(w + j * 128, H);
            __m256i v[4];
            for (int h = 0; h < H; ++h)
                v[h] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w + j * 128 + 32 * h)), flip);
            _Pragma("GCC unroll 4") for (int t = 0; t < 4; ++t)
                for (int h = 0; h < H; ++h) {
                    const __m256 wv = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_shuffle_epi8(v[h], masks[t])), s[h]);
                    for (int r = 0; r < R; ++r)
                        out[r][h] = _mm256_fmadd_ps(_mm256_broadcast_ss(xs + r * ldx + 4 * j + t), wv, out[r][h]);
                }
        }
    }
}

/* int4 column c of a lane word (byte c % 4, the low nibble for c < 4, the high one after),
 * masked in place: q * 2^NIBBLE_SHIFT(c). Column 7 is shifted down instead, q: its mask would
 * keep the sign bit. */
#define NIBBLE_SHIFT(c) ((c) == 7 ? 0 : (c) < 4 ? 8 * (c) : 8 * ((c) - 4) + 4)
#define NIBBLE_MASK(c) (0xF << NIBBLE_SHIFT(c))
#define EIGHT_LANES(c) {NIBBLE_MASK(c), NIBBLE_MASK(c), NIBBLE_MASK(c), NIBBLE_MASK(c),             \
                        NIBBLE_MASK(c), NIBBLE_MASK(c), NIBBLE_MASK(c), NIBBLE_MASK(c)}
static const int32_t nibble_masks[8][8] __attribute__((aligned(32))) = {
    EIGHT_LANES(0), EIGHT_LANES(1), EIGHT_LANES(2), EIGHT_LANES(3),
    EIGHT_LANES(4), EIGHT_LANES(5), EIGHT_LANES(6), EIGHT_LANES(7)};

/* int4, groups g0 .. g0 + GP - 1: out[r][h] += row r . the tile's H 8-lane halves (H = 2:
 * one block, its halves 32 bytes apart; H = 4: the pair, 128 contiguous bytes a step), with the
 * group scales and minimums (sc, mn: fp16 [G][64], the first half's; gs: group sums of x,
 * [R][G]). The GP groups run side by side, each its own FMA chains, and fold into out in
 * group order: the same arithmetic for every GP. */
static inline __attribute__((always_inline)) void int4_groups(
    int R, int H, int GP, int64_t g0, const float *xs, int64_t ldx, int64_t G, int64_t steps,
    const uint8_t *w, const uint16_t *sc, const uint16_t *mn, const float *gs, __m256 out[][4]) {
    __m256 part[2][ROWS][4];
    for (int e = 0; e < GP; ++e)
        for (int r = 0; r < R; ++r)
            for (int h = 0; h < H; ++h) part[e][r][h] = _mm256_setzero_ps();
    for (int64_t i = 0; i < steps; ++i) {
        const int64_t j0 = g0 * steps + i; /* group g0 + e's step: j0 + e * steps */
        /* the pass's steps in order, GP a step (prefetching where each group is read, two
         * streams 4 steps apart at g32, read 16-18% slower from memory); two groups at a time
         * prefetch the whole step, both blocks: two rows go block by block, and the second
         * block's lines otherwise came from memory unprefetched */
        for (int e = 0; e < GP; ++e) prefetch_step(w + (g0 * steps + GP * i + e) * 128, GP == 2 ? 4 : H);
        /* read the masks each step: hoisted, 7 masks and 8 accumulators spill */
        const __m256i *masks = (const __m256i *)nibble_masks;
        __asm__("" : "+r"(masks));
        _Pragma("GCC unroll 8") for (int c = 0; c < 8; ++c) {
            const __m256i mask = _mm256_load_si256(masks + c);
            _Pragma("GCC unroll 2") for (int e = 0; e < GP; ++e) {
                const int64_t j = j0 + e * steps;
                _Pragma("GCC unroll 4") for (int h = 0; h < H; ++h) {
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(w + j * 128 + 32 * h));
                    const __m256 wv = _mm256_cvtepi32_ps(c == 7 ? _mm256_srli_epi32(v, 28) : _mm256_and_si256(v, mask));
                    for (int r = 0; r < R; ++r)
                        part[e][r][h] = _mm256_fmadd_ps(_mm256_broadcast_ss(xs + r * ldx + 8 * j + c), wv, part[e][r][h]);
                }
            }
        }
    }
    for (int e = 0; e < GP; ++e) {
        const int64_t g = g0 + e;
        for (int h = 0; h < H; ++h) {
            const __m256 s = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sc + g * 64 + 8 * h)));
            const __m256 n = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(mn + g * 64 + 8 * h)));
            for (int r = 0; r < R; ++r)
                out[r][h] = _mm256_fmadd_ps(_mm256_set1_ps(gs[r * G + g]), n,
                                            _mm256_fmadd_ps(part[e][r][h], s, out[r][h]));
        }
    }
}

/* int4: out = the tile's rows . its halves, GP groups at a time (an odd G's last alone) */
static inline __attribute__((always_inline)) void int4_tile(
    int R, int H, int GP, const float *xs, int64_t ldx, int64_t K, const uint8_t *w,
    const uint16_t *sc, const uint16_t *mn, int64_t group, const float *gs, __m256 out[][4]) {
    for (int r = 0; r < R; ++r)
        for (int h = 0; h < H; ++h) out[r][h] = _mm256_setzero_ps();
    const int64_t G = K / group;
    int64_t g0 = 0;
    for (; g0 + GP <= G; g0 += GP) int4_groups(R, H, GP, g0, xs, ldx, G, group / 8, w, sc, mn, gs, out);
    if (g0 < G) int4_groups(R, H, 1, g0, xs, ldx, G, group / 8, w, sc, mn, gs, out);
}

/* The int4 tiles, rows x halves x groups at a time, 8-12 FMA chains each: one row takes the
 * pair two groups at a time (4 chains held it to one FMA a cycle), two rows a block at a time,
 * two groups each (cache-hot 1.14x the old kernel, where the pair one group at a time ran
 * 0.96x). Each shape is its own
 * function: inlined together into run_tile, GCC kept some shapes' accumulators on the stack
 * (2-row tiles ran at half speed). */
#define INT4_TILE(R, H, GP)                                                                     \
    static __attribute__((noinline)) void int4_tile_##R##x##H(                                 \
        const float *xs, int64_t ldx, int64_t K, const uint8_t *w, const uint16_t *sc,         \
        const uint16_t *mn, int64_t group, const float *gs, __m256 out[][4]) {                  \
        int4_tile(R, H, GP, xs, ldx, K, w, sc, mn, group, gs, out);                             \
    }
INT4_TILE(4, 2, 1) INT4_TILE(1, 4, 2) INT4_TILE(2, 2, 2) INT4_TILE(3, 4, 1)
#undef INT4_TILE

/* One tile, R rows x H halves; constant kind, R and H per call: each specialisation keeps
 * its accumulators in registers. */
static void run_tile(int kind, int R, int H, const float *xs, int64_t ldx, int64_t K,
                     const uint8_t *w, const float *sc8, const uint16_t *sc, const uint16_t *mn, int64_t group,
                     const float *gs, const float *scale, const float *bias, int64_t o0, float *y,
                     int64_t ldy, int64_t N) {
    __m256 out[ROWS][4];
    if (kind == KIND_INT8 && group) {
        if (H == 2) int8g_tile(ROWS, 2, xs, ldx, K, w, sc8, group, out);
        else if (R == 1) int8g_tile(1, 4, xs, ldx, K, w, sc8, group, out);
        else if (R == 2) int8g_tile(2, 4, xs, ldx, K, w, sc8, group, out);
        else int8g_tile(3, 4, xs, ldx, K, w, sc8, group, out);
        scale = 0; /* applied per group */
    } else if (kind == KIND_INT8) {
        if (H == 2) int8_tile(ROWS, 2, xs, ldx, K, w, out);
        else if (R == 1) int8_tile(1, 4, xs, ldx, K, w, out);
        else if (R == 2) int8_tile(2, 4, xs, ldx, K, w, out);
        else int8_tile(3, 4, xs, ldx, K, w, out);
    } else {
        if (R == 4) int4_tile_4x2(xs, ldx, K, w, sc, mn, group, gs, out);
        else if (R == 3) int4_tile_3x4(xs, ldx, K, w, sc, mn, group, gs, out);
        else if (R == 2) int4_tile_2x2(xs, ldx, K, w, sc, mn, group, gs, out);
        else int4_tile_1x4(xs, ldx, K, w, sc, mn, group, gs, out);
    }
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
    float unscale[8]; /* int4 column c of 8: 2^-NIBBLE_SHIFT(c), at most 2^-24 as int8's */
    for (int c = 0; c < 8; ++c) unscale[c] = 1.0f / (float)(1 << NIBBLE_SHIFT(c));
    for (int64_t m = 0; m < M; ++m) { /* plain loops the compiler vectorizes: 2 ns a column counted at 32 rows */
        const float *xm = x + m * ldx;
        float *sm = xs + m * KP;
        if (kind == KIND_INT8) {
            for (int64_t k = 0; k < K; ++k) sm[k] = xm[k] * 0x1p-24f;
            for (int64_t k = K; k < KP; ++k) sm[k] = 0.0f;
        } else {
            for (int64_t j = 0; j < K; j += 8)
                for (int c = 0; c < 8; ++c) sm[j + c] = xm[j + c] * unscale[c];
        }
    }
    if (G) group_sums(x, ldx, M, K, group, gs);
    const int64_t pairs = NB / 2, full = M / ROWS * ROWS;
    const int64_t pair_bytes = kind == KIND_INT8 ? KP * 32 : K * 16;
    /* guided: big runs of pairs first (each thread streams its weights in order), then
     * smaller ones, so a thread slowed on a shared VM takes fewer of the last pairs: batch-1
     * int4 at the 1.5B shape ran 30.8 tok/s median against static's 27.7 (8 alternating
     * pairs; docs/benchmarks.md); dynamic chunks broke the streams (0.6-0.9x) */
#pragma omp parallel for num_threads(nthreads) schedule(guided) if (pairs > 1 && nthreads > 1)
    for (int64_t p = 0; p < pairs; ++p) {
        if (p * 32 >= N) continue;
        const uint8_t *wp = (const uint8_t *)w + p * pair_bytes;
        const uint16_t *sc = G ? scales4 + p * G * 64 : 0, *mn = G ? mins4 + p * G * 64 : 0;
        /* int8-gG: the pair's group scales [K/G][2][16] */
        const float *s8 = kind == KIND_INT8 && group ? scale8 + p * (K / group) * 32 : 0;
        for (int b = 0; b < 2; ++b) /* block b of the pair: 64 bytes into each step */
            for (int64_t m0 = 0; m0 < full; m0 += ROWS)
                run_tile(kind, ROWS, 2, xs + m0 * KP, KP, K, wp + 64 * b, s8 ? s8 + 16 * b : 0,
                         sc ? sc + 16 * b : 0, mn ? mn + 16 * b : 0, group, gs + m0 * G, scale8,
                         bias, p * 32 + 16 * b, y + m0 * ldy, ldy, N);
        if (kind == KIND_INT4 && M - full == 2) /* two rows block by block, two groups at a time */
            for (int b = 0; b < 2; ++b)
                run_tile(kind, 2, 2, xs + full * KP, KP, K, wp + 64 * b, 0, sc + 16 * b, mn + 16 * b,
                         group, gs + full * G, scale8, bias, p * 32 + 16 * b, y + full * ldy, ldy, N);
        else if (full < M)
            run_tile(kind, (int)(M - full), 4, xs + full * KP, KP, K, wp, s8, sc, mn, group,
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
