/* Weight-only linears on AVX2 + FMA (CPUs without AVX-512, and int8/int4 on AVX-512 CPUs
 * without VNNI): y[M, N] = x[M, K] @ dequant(W)^T + bias, every format in the layouts of
 * quant_linear_cpu.c (fp32, bf16) and quant_vnni_cpu.c (int8 as q + 128, int4): a block's
 * 64-byte steps are 128 bytes apart, its pair's other block in between.
 *
 * Each weight is widened to fp32 exactly in registers and multiplied with one FMA per row:
 * the portable loop's fp32 products, summed in another order. A 16-lane block is two 8-lane halves; a tile is up to 3 rows x 2 halves x 2
 * accumulator sets (even and odd columns), 12 of the 16 ymm registers.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "quant_group_sums.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define GRAFT_QUANT_AVX2 1
#else
#define GRAFT_QUANT_AVX2 0
#endif

int graft_quant_avx2(void) { return GRAFT_QUANT_AVX2; }

int graft_quant_int8_avx2(const float *x, int64_t ldx, int64_t M, int64_t K, const void *w,
                          const float *scale, const float *bias, float *y, int64_t ldy,
                          int64_t N, int64_t NB, int nthreads); /* quant_avx2_int8_cpu.c */

#if GRAFT_QUANT_AVX2
enum { KIND_INT8 = 0, KIND_INT4 = 1, KIND_BF16 = 2, KIND_F32 = 3 };
#define MR_MAX 3

typedef struct {
    __m256 a[MR_MAX][2][2]; /* [row][half][column parity] */
} tile_acc;

/* acc[m] += x[m][k] * (w_lo, w_hi) for the tile's rows; s = the column's parity set */
static inline __attribute__((always_inline)) void fma_rows(tile_acc *t, int MR, const float *x,
                                                           int64_t ldx, int64_t k, int s,
                                                           __m256 wl, __m256 wh) {
    for (int m = 0; m < MR; ++m) {
        const __m256 xv = _mm256_broadcast_ss(x + m * ldx + k);
        t->a[m][0][s] = _mm256_fmadd_ps(xv, wl, t->a[m][0][s]);
        t->a[m][1][s] = _mm256_fmadd_ps(xv, wh, t->a[m][1][s]);
    }
}

/* byte t of every 32-bit word of v, as fp32 (int8: v already XORed to signed q) */
#define BYTE_S8(v, T) _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(v, 24 - 8 * (T)), 24))
#define NIB(v, SHIFT) _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v, SHIFT), _mm256_set1_epi32(0xf)))

/* out[m][h] = row m . block w (16 lanes), int8 before the channel scale, int4 with its
 * per-group scale and minimum (xs: group sums of x, [MR][G]) */
static inline __attribute__((always_inline)) void block_rows(
    int kind, int MR, const float *x, int64_t ldx, int64_t K, const uint8_t *w,
    const uint16_t *sc, const uint16_t *mn, int64_t group, const float *xs, __m256 out[][2]) {
    tile_acc t;
    for (int m = 0; m < MR; ++m)
        for (int h = 0; h < 2; ++h) t.a[m][h][0] = t.a[m][h][1] = out[m][h] = _mm256_setzero_ps();
    if (kind == KIND_F32) {
        const float *wf = (const float *)w;
#define F32_COL(k, s) fma_rows(&t, MR, x, ldx, k, s, _mm256_loadu_ps(wf + (k) * 32), _mm256_loadu_ps(wf + (k) * 32 + 8))
        int64_t k = 0;
        for (; k + 2 <= K; k += 2) { F32_COL(k, 0); F32_COL(k + 1, 1); }
        if (k < K) F32_COL(k, 0);
#undef F32_COL
    } else if (kind == KIND_BF16) {
        const uint16_t *wb = (const uint16_t *)w; /* column pairs: [K2/2][16][2] */
        const __m256i high = _mm256_set1_epi32((int)0xFFFF0000u);
        int64_t k = 0;
        for (; k + 2 <= K; k += 2) {
            const __m256i v0 = _mm256_loadu_si256((const __m256i *)(wb + k * 32));
            const __m256i v1 = _mm256_loadu_si256((const __m256i *)(wb + k * 32 + 16));
            fma_rows(&t, MR, x, ldx, k, 0, _mm256_castsi256_ps(_mm256_slli_epi32(v0, 16)),
                     _mm256_castsi256_ps(_mm256_slli_epi32(v1, 16)));
            fma_rows(&t, MR, x, ldx, k + 1, 1, _mm256_castsi256_ps(_mm256_and_si256(v0, high)),
                     _mm256_castsi256_ps(_mm256_and_si256(v1, high)));
        }
        if (k < K) {
            const __m256i v0 = _mm256_loadu_si256((const __m256i *)(wb + k * 32));
            const __m256i v1 = _mm256_loadu_si256((const __m256i *)(wb + k * 32 + 16));
            fma_rows(&t, MR, x, ldx, k, 0, _mm256_castsi256_ps(_mm256_slli_epi32(v0, 16)),
                     _mm256_castsi256_ps(_mm256_slli_epi32(v1, 16)));
        }
    } else if (kind == KIND_INT8) {
        const __m256i flip = _mm256_set1_epi8((char)0x80); /* q + 128 -> q */
        int64_t q = 0;
        for (; 4 * q + 4 <= K; ++q) {
            const __m256i v0 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w + q * 128)), flip);
            const __m256i v1 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w + q * 128 + 32)), flip);
            fma_rows(&t, MR, x, ldx, 4 * q, 0, BYTE_S8(v0, 0), BYTE_S8(v1, 0));
            fma_rows(&t, MR, x, ldx, 4 * q + 1, 1, BYTE_S8(v0, 1), BYTE_S8(v1, 1));
            fma_rows(&t, MR, x, ldx, 4 * q + 2, 0, BYTE_S8(v0, 2), BYTE_S8(v1, 2));
            fma_rows(&t, MR, x, ldx, 4 * q + 3, 1, BYTE_S8(v0, 3), BYTE_S8(v1, 3));
        }
        if (4 * q < K) { /* the last, partial step */
            const __m256i v0 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w + q * 128)), flip);
            const __m256i v1 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w + q * 128 + 32)), flip);
            fma_rows(&t, MR, x, ldx, 4 * q, 0, BYTE_S8(v0, 0), BYTE_S8(v1, 0));
            if (4 * q + 1 < K) fma_rows(&t, MR, x, ldx, 4 * q + 1, 1, BYTE_S8(v0, 1), BYTE_S8(v1, 1));
            if (4 * q + 2 < K) fma_rows(&t, MR, x, ldx, 4 * q + 2, 0, BYTE_S8(v0, 2), BYTE_S8(v1, 2));
        }
    } else { /* int4: byte t of step j holds column 8j + t (low nibble) and 8j + 4 + t (high) */
        const int64_t G = K / group;
        for (int64_t g = 0; g < G; ++g) {
            for (int m = 0; m < MR; ++m)
                for (int h = 0; h < 2; ++h) t.a[m][h][0] = t.a[m][h][1] = _mm256_setzero_ps();
            for (int64_t j = g * group / 8; j < (g + 1) * group / 8; ++j) {
                const __m256i v0 = _mm256_loadu_si256((const __m256i *)(w + j * 128));
                const __m256i v1 = _mm256_loadu_si256((const __m256i *)(w + j * 128 + 32));
                _Pragma("GCC unroll 4") for (int b = 0; b < 4; ++b) {
                    fma_rows(&t, MR, x, ldx, 8 * j + b, 0, NIB(v0, 8 * b), NIB(v1, 8 * b));
                    fma_rows(&t, MR, x, ldx, 8 * j + 4 + b, 1, NIB(v0, 8 * b + 4), NIB(v1, 8 * b + 4));
                }
            }
            for (int h = 0; h < 2; ++h) {
                const __m256 s = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sc + g * 64 + 8 * h)));
                const __m256 n = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(mn + g * 64 + 8 * h)));
                for (int m = 0; m < MR; ++m) {
                    const __m256 part = _mm256_add_ps(t.a[m][h][0], t.a[m][h][1]);
                    out[m][h] = _mm256_fmadd_ps(_mm256_set1_ps(xs[m * G + g]), n, _mm256_fmadd_ps(part, s, out[m][h]));
                }
            }
        }
        return;
    }
    for (int m = 0; m < MR; ++m)
        for (int h = 0; h < 2; ++h) out[m][h] = _mm256_add_ps(t.a[m][h][0], t.a[m][h][1]);
}

static void store_row(float *y, const float *o8x2, const float *scale, const float *bias,
                      int64_t o0, int64_t N) {
    for (int l = 0; l < 16 && o0 + l < N; ++l)
        y[o0 + l] = o8x2[l] * (scale ? scale[o0 + l] : 1.0f) + (bias ? bias[o0 + l] : 0.0f);
}

static void tile(int kind, int MR, const float *x, int64_t ldx, int64_t K, const uint8_t *w,
                 const uint16_t *sc, const uint16_t *mn, int64_t group, const float *xs,
                 const float *scale, const float *bias, int64_t o0, float *y, int64_t ldy, int64_t N) {
    __m256 out[MR_MAX][2];
    switch (MR) { /* constant MR and kind: each specialisation keeps its accumulators in registers */
#define CASE(R)                                                                                 \
    case R:                                                                                     \
        if (kind == KIND_F32) block_rows(KIND_F32, R, x, ldx, K, w, sc, mn, group, xs, out);      \
        else if (kind == KIND_BF16) block_rows(KIND_BF16, R, x, ldx, K, w, sc, mn, group, xs, out); \
        else if (kind == KIND_INT8) block_rows(KIND_INT8, R, x, ldx, K, w, sc, mn, group, xs, out); \
        else block_rows(KIND_INT4, R, x, ldx, K, w, sc, mn, group, xs, out);                      \
        break;
        CASE(1) CASE(2) CASE(3)
#undef CASE
    default: return;
    }
    for (int m = 0; m < MR; ++m) {
        float row[16];
        _mm256_storeu_ps(row, out[m][0]);
        _mm256_storeu_ps(row + 8, out[m][1]);
        store_row(y + m * ldy, row, scale, bias, o0, N);
    }
}
#endif

/* Same arguments as graft_quant_linear. Returns 0; 1 when this build has no AVX2 (the caller
 * runs the portable loop); -1 when int4's group sums could not be allocated. */
int graft_quant_linear_avx2(int kind, const float *x, int64_t ldx, int64_t M, int64_t K,
                            const void *w, const float *scale8, const uint16_t *scales4,
                            const uint16_t *mins4, int64_t group, const float *bias, float *y,
                            int64_t ldy, int64_t N, int64_t NB, int nthreads) {
#if GRAFT_QUANT_AVX2
    if (kind == KIND_INT8)
        return graft_quant_int8_avx2(x, ldx, M, K, w, scale8, bias, y, ldy, N, NB, nthreads);
    const int64_t KP = kind == KIND_INT8 ? (K + 3) / 4 * 4 : K;
    const int64_t bytes = kind == KIND_F32 ? KP * 64 : kind == KIND_BF16 ? (KP + 1) / 2 * 64
                        : kind == KIND_INT8 ? KP * 16 : KP * 8; /* per 16-lane block */
    const int64_t G = kind == KIND_INT4 ? K / group : 0;
    float *xs = 0; /* int4: the group sums of x, [M][G] */
    if (G) {
        xs = malloc(sizeof(float) * (size_t)(M * G));
        if (!xs) return -1;
        group_sums(x, ldx, M, K, group, xs);
    }
#pragma omp parallel for num_threads(nthreads) schedule(static) if (NB > 1 && nthreads > 1)
    for (int64_t b = 0; b < NB; ++b) {
        if (b * 16 >= N) continue;
        for (int64_t m0 = 0; m0 < M; m0 += MR_MAX) {
            const int mr = (int)(M - m0 < MR_MAX ? M - m0 : MR_MAX);
            /* the pair's blocks alternate 64-byte steps: block b starts 64 bytes into its pair */
            tile(kind, mr, x + m0 * ldx, ldx, K, (const uint8_t *)w + (b >> 1) * 2 * bytes + (b & 1) * 64,
                 kind == KIND_INT4 ? scales4 + (b >> 1) * G * 64 + (b & 1) * 16 : 0,
                 kind == KIND_INT4 ? mins4 + (b >> 1) * G * 64 + (b & 1) * 16 : 0,
                 group, xs ? xs + m0 * G : 0, kind == KIND_INT8 ? scale8 : 0, bias, b * 16,
                 y + m0 * ldy, ldy, N);
        }
    }
    free(xs);
    return 0;
#else
    (void)kind; (void)x; (void)ldx; (void)M; (void)K; (void)w; (void)scale8; (void)scales4;
    (void)mins4; (void)group; (void)bias; (void)y; (void)ldy; (void)N; (void)NB; (void)nthreads;
    return 1;
#endif
}
