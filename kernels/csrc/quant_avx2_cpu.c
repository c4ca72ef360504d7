/* Weight-only linears on AVX2 + FMA (CPUs without AVX-512, and int8/int4 on AVX-512 CPUs
 * without VNNI): y[M, N] = x[M, K] @ dequant(W)^T + bias. fp32 and bf16 here, in the layouts
 * of quant_linear_cpu.c: a block's 64-byte steps are 128 bytes apart, its pair's other block
 * in between. int8 and int4 on AVX2 are quant_avx2_int_cpu.c.
 *
 * Each weight is widened to fp32 exactly in registers and multiplied with one FMA per row:
 * the portable loop's fp32 products, summed in another order. A 16-lane block is two 8-lane
 * halves; a tile is up to 3 rows x 2 halves x 2 accumulator sets (even and odd columns), 12 of
 * the 16 ymm registers.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define GRAFT_QUANT_AVX2 1
#else
#define GRAFT_QUANT_AVX2 0
#endif

int graft_quant_avx2(void) { return GRAFT_QUANT_AVX2; }

#if GRAFT_QUANT_AVX2
enum { KIND_BF16 = 2, KIND_F32 = 3 }; /* quant_linear_cpu.c KIND_* */
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

/* out[m][h] = row m . block w (16 lanes) */
static inline __attribute__((always_inline)) void block_rows(int kind, int MR, const float *x,
                                                             int64_t ldx, int64_t K,
                                                             const uint8_t *w, __m256 out[][2]) {
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
    }
    for (int m = 0; m < MR; ++m)
        for (int h = 0; h < 2; ++h) out[m][h] = _mm256_add_ps(t.a[m][h][0], t.a[m][h][1]);
}

static void tile(int kind, int MR, const float *x, int64_t ldx, int64_t K, const uint8_t *w,
                 const float *bias, int64_t o0, float *y, int64_t ldy, int64_t N) {
    __m256 out[MR_MAX][2];
    switch (MR) { /* constant MR and kind: each specialisation keeps its accumulators in registers */
#define CASE(R)                                                                                 \
    case R:                                                                                     \
        if (kind == KIND_F32) block_rows(KIND_F32, R, x, ldx, K, w, out);                        \
        else block_rows(KIND_BF16, R, x, ldx, K, w, out);                                         \
        break;
        CASE(1) CASE(2) CASE(3)
#undef CASE
    default: return;
    }
    for (int m = 0; m < MR; ++m) {
        float row[16];
        _mm256_storeu_ps(row, out[m][0]);
        _mm256_storeu_ps(row + 8, out[m][1]);
        for (int l = 0; l < 16 && o0 + l < N; ++l) y[m * ldy + o0 + l] = row[l] + (bias ? bias[o0 + l] : 0.0f);
    }
}
#endif

/* graft_quant_linear's arguments for fp32 / bf16 (no scales). Returns 0; 1 when this build
 * has no AVX2 (the caller runs the portable loop). */
int graft_quant_linear_avx2(int kind, const float *x, int64_t ldx, int64_t M, int64_t K,
                            const void *w, const float *bias, float *y, int64_t ldy, int64_t N,
                            int64_t NB, int nthreads) {
#if GRAFT_QUANT_AVX2
    const int64_t bytes = kind == KIND_F32 ? K * 64 : (K + 1) / 2 * 64; /* per 16-lane block */
#pragma omp parallel for num_threads(nthreads) schedule(static) if (NB > 1 && nthreads > 1)
    for (int64_t b = 0; b < NB; ++b) {
        if (b * 16 >= N) continue;
        for (int64_t m0 = 0; m0 < M; m0 += MR_MAX) {
            const int mr = (int)(M - m0 < MR_MAX ? M - m0 : MR_MAX);
            /* the pair's blocks alternate 64-byte steps: block b starts 64 bytes into its pair */
            tile(kind, mr, x + m0 * ldx, ldx, K, (const uint8_t *)w + (b >> 1) * 2 * bytes + (b & 1) * 64,
                 bias, b * 16, y + m0 * ldy, ldy, N);
        }
    }
    return 0;
#else
    (void)kind; (void)x; (void)ldx; (void)M; (void)K; (void)w; (void)bias; (void)y; (void)ldy;
    (void)N; (void)NB; (void)nthreads;
    return 1;
#endif
}
