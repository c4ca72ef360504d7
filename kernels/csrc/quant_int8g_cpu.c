/* int8-gG weight-only linears on AVX-512 (graft_quant_linear's int8 calls with a group size):
 * W in int8's layout (quant_vnni_cpu.c: q + 128, four columns per lane word, a pair's two
 * 16-lane blocks alternating 64-byte steps), one fp32 scale per G columns of each output,
 * [NB/2][K/G][2][16] (graft.kernels.cpu_quant.pack). y = x . fl(q * s) + bias: every product
 * is x times the dequantized weight, as the reference (quant_formats.quant_linear) multiplies.
 *
 * Widening: one vpshufb moves byte t of each lane word to its top byte (int8's trick,
 * quant_avx2_int_cpu.c), vcvtdq2ps gives q * 2^24 exactly, and one vmulps by s * 2^-24 (exact
 * but for s < 2^-102) gives fl(q * s): 3 uops per 16 weights, then an FMA per row. A call of
 * few rows runs on these tiles (graft_quant_int8g_avx512); from INT8G_WIDEN_ROWS rows the
 * dispatcher widens each pair of blocks once into fp32 scratch (graft_quant_int8g_widen_pair)
 * and runs the fp32 tiles on it, as it does for bf16 weights: the same products, since the
 * widened weight is fl(q * s) itself. CPUs without AVX-512 run quant_avx2_int_cpu.c's tiles.
 */
#include <stdint.h>
#include <stdlib.h>

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define INT8G_AVX512 1
#else
#define INT8G_AVX512 0
#endif

#define ROWS 4 /* rows of a tile: 4 x 2 blocks = 8 accumulators */

#if INT8G_AVX512
/* byte t of each 32-bit word to the word's top byte, zeros elsewhere (within 128-bit lanes) */
static inline __m512i column_mask(int t) {
    const __m512i word = _mm512_set1_epi32((int)(0x00808080u | ((uint32_t)t << 24)));
    return _mm512_add_epi32(word, _mm512_set4_epi32(12 << 24, 8 << 24, 4 << 24, 0));
}

/* the group's scales of block b, times 2^-24 (the widened codes are q * 2^24) */
static inline __m512 group_scale(const float *sc, int64_t g, int b) {
    return _mm512_mul_ps(_mm512_loadu_ps(sc + g * 32 + 16 * b), _mm512_set1_ps(0x1p-24f));
}

/* column t of the 16 lane words v as fp32 weights fl(q * s) */
static inline __m512 widened(__m512i v, __m512i mask, __m512 s) {
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_shuffle_epi8(v, mask)), s);
}

/* out[r][b] = row r . block b of the pair (w: its first step, sc: its scales), R rows */
static inline __attribute__((always_inline)) void int8g_tile(int R, const float *x, int64_t ldx,
                                                             int64_t K, const uint8_t *w,
                                                             const float *sc, int64_t group,
                                                             __m512 out[ROWS][2]) {
    const __m512i masks[4] = {column_mask(0), column_mask(1), column_mask(2), column_mask(3)};
    const __m512i flip = _mm512_set1_epi8((char)0x80); /* q + 128 -> q */
    for (int r = 0; r < R; ++r) out[r][0] = out[r][1] = _mm512_setzero_ps();
    const int64_t steps = group / 4;
    for (int64_t g = 0; g < K / group; ++g) {
        const __m512 s[2] = {group_scale(sc, g, 0), group_scale(sc, g, 1)};
        for (int64_t j = g * steps; j < (g + 1) * steps; ++j) {
            __builtin_prefetch(w + j * 128 + 2048, 0, 3);
            __builtin_prefetch(w + j * 128 + 2048 + 64, 0, 3);
            const __m512i v[2] = {_mm512_xor_si512(_mm512_loadu_si512(w + j * 128), flip),
                                  _mm512_xor_si512(_mm512_loadu_si512(w + j * 128 + 64), flip)};
            _Pragma("GCC unroll 4") for (int t = 0; t < 4; ++t)
                for (int b = 0; b < 2; ++b) {
                    const __m512 wv = widened(v[b], masks[t], s[b]);
                    for (int r = 0; r < R; ++r)
                        out[r][b] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * ldx + 4 * j + t]), wv, out[r][b]);
                }
        }
    }
}

#define INT8G_TILE(R)                                                                           \
    static __attribute__((noinline)) void int8g_tile_##R(const float *x, int64_t ldx, int64_t K,  \
                                                          const uint8_t *w, const float *sc,    \
                                                          int64_t group, __m512 out[ROWS][2]) {  \
        int8g_tile(R, x, ldx, K, w, sc, group, out);                                             \
    }
INT8G_TILE(1) INT8G_TILE(2) INT8G_TILE(3) INT8G_TILE(4)
#undef INT8G_TILE

static void store_rows(int R, __m512 out[ROWS][2], const float *bias, int64_t o0, float *y,
                       int64_t ldy, int64_t N) {
    for (int b = 0; b < 2; ++b) {
        const int64_t left = N - o0 - 16 * b;
        if (left <= 0) break;
        const __mmask16 keep = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
        const __m512 add = bias ? _mm512_maskz_loadu_ps(keep, bias + o0 + 16 * b) : _mm512_setzero_ps();
        for (int r = 0; r < R; ++r)
            _mm512_mask_storeu_ps(y + r * ldy + o0 + 16 * b, keep, _mm512_add_ps(out[r][b], add));
    }
}
#endif

/* Same arguments as graft_quant_linear for kind int8 with group > 0 (scale8: the group
 * scales). Returns 0, or 1 when this build has no AVX-512 (BW). */
int graft_quant_int8g_avx512(const float *x, int64_t ldx, int64_t M, int64_t K, const void *w,
                             const float *scales, int64_t group, const float *bias, float *y,
                             int64_t ldy, int64_t N, int64_t NB, int nthreads) {
#if INT8G_AVX512
    const int64_t pairs = NB / 2, pair_bytes = K * 32, G = K / group;
    /* guided, as the other integer paths: big runs of pairs first, then smaller ones */
#pragma omp parallel for num_threads(nthreads) schedule(guided) if (pairs > 1 && nthreads > 1)
    for (int64_t p = 0; p < pairs; ++p) {
        if (p * 32 >= N) continue;
        const uint8_t *wp = (const uint8_t *)w + p * pair_bytes;
        const float *sc = scales + p * G * 32;
        for (int64_t m0 = 0; m0 < M; m0 += ROWS) {
            const int R = (int)(M - m0 < ROWS ? M - m0 : ROWS);
            __m512 out[ROWS][2];
            const float *xr = x + m0 * ldx;
            if (R == 4) int8g_tile_4(xr, ldx, K, wp, sc, group, out);
            else if (R == 3) int8g_tile_3(xr, ldx, K, wp, sc, group, out);
            else if (R == 2) int8g_tile_2(xr, ldx, K, wp, sc, group, out);
            else int8g_tile_1(xr, ldx, K, wp, sc, group, out);
            store_rows(R, out, bias, p * 32, y + m0 * ldy, ldy, N);
        }
    }
    return 0;
#else
    (void)x; (void)ldx; (void)M; (void)K; (void)w; (void)scales; (void)group; (void)bias;
    (void)y; (void)ldy; (void)N; (void)NB; (void)nthreads;
    return 1;
#endif
}

/* Pair p's weights widened to the fp32 pair layout [K][2][16] (the fp32 tiles' input), each
 * fl(q * s). Returns 0, or 1 when this build has no AVX-512 (BW). */
int graft_quant_int8g_widen_pair(const void *w, const float *scales, int64_t K, int64_t group,
                                 int64_t p, float *out) {
#if INT8G_AVX512
    const __m512i masks[4] = {column_mask(0), column_mask(1), column_mask(2), column_mask(3)};
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    const uint8_t *wp = (const uint8_t *)w + p * K * 32;
    const float *sc = scales + p * (K / group) * 32;
    for (int64_t j = 0; j < K / 4; ++j) {
        const int64_t g = 4 * j / group;
        for (int b = 0; b < 2; ++b) {
            const __m512i v = _mm512_xor_si512(_mm512_loadu_si512(wp + j * 128 + 64 * b), flip);
            const __m512 s = group_scale(sc, g, b);
            for (int t = 0; t < 4; ++t)
                _mm512_storeu_ps(out + ((4 * j + t) * 2 + b) * 16, widened(v, masks[t], s));
        }
    }
    return 0;
#else
    (void)w; (void)scales; (void)K; (void)group; (void)p; (void)out;
    return 1;
#endif
}
