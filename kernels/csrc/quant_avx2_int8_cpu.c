/* int8 weight-only linear on AVX2 + FMA (quant_avx2_cpu.c's int8 calls): y = x @ (q * scale)^T
 * + bias, W in quant_vnni_cpu.c's layout (q + 128, four columns per lane word, a pair's two
 * 16-lane blocks alternating 64-byte steps).
 *
 * Why it looks like this: at decode sizes the cost is widening weights to fp32, not the FMAs.
 * One vpshufb puts byte t of every lane word (column 4j + t, already XORed to signed q) into
 * the word's top byte, zeros below: the int32 q * 2^24, which vcvtdq2ps converts exactly. That
 * is 2 uops per 8 weights where shift, shift, convert took 3. The 2^24 is taken out of x
 * instead (x * 2^-24, a copy per call, exact but for |x| < 2^-102): every product is the
 * dequantized model's x * q, bit for bit.
 *
 * Tiles: 4 rows x one block (8 accumulators), or the leftover 1-3 rows x the pair's two blocks
 * (4-12 accumulators: one pass over the pair's interleaved stream, and enough independent FMA
 * chains at one row). Each row and lane is one FMA chain over the columns in order, whatever
 * the tile: a row's result does not depend on its batch (the portable loop's order too).
 */
#include <stdint.h>
#include <stdlib.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#define ROWS 4 /* rows of a one-block tile */

/* shuffle mask of column t: byte t of each 32-bit word to the word's top byte, zeros below */
static inline __m256i top_byte_mask(int t) {
    const char z = (char)0x80, a = (char)t, b = (char)(4 + t), c = (char)(8 + t), d = (char)(12 + t);
    return _mm256_setr_epi8(z, z, z, a, z, z, z, b, z, z, z, c, z, z, z, d,
                            z, z, z, a, z, z, z, b, z, z, z, c, z, z, z, d);
}

/* acc[r][h] = sum_k xs[r][k] * q[k] for rows r < R and H 8-lane halves: H = 2 reads one block
 * (halves 32 bytes apart), H = 4 the pair (both blocks: 128 contiguous bytes per step). */
static inline __attribute__((always_inline)) void int8_tile(int R, int H, const float *xs,
                                                            int64_t ldx, int64_t steps,
                                                            const uint8_t *w, __m256 acc[][4]) {
    const __m256i flip = _mm256_set1_epi8((char)0x80); /* q + 128 -> q */
    const __m256i m0 = top_byte_mask(0), m1 = top_byte_mask(1), m2 = top_byte_mask(2),
                  m3 = top_byte_mask(3);
    for (int r = 0; r < R; ++r)
        for (int h = 0; h < H; ++h) acc[r][h] = _mm256_setzero_ps();
    for (int64_t j = 0; j < steps; ++j) {
        const uint8_t *wj = w + j * 128;
        const float *xj = xs + 4 * j;
        __m256i v[4];
        for (int h = 0; h < H; ++h)
            v[h] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(wj + 32 * h)), flip);
#define COLUMN(T, MASK)                                                                        \
        for (int h = 0; h < H; ++h) {                                                          \
            const __m256 wv = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(v[h], MASK));             \
            for (int r = 0; r < R; ++r)                                                        \
                acc[r][h] = _mm256_fmadd_ps(_mm256_broadcast_ss(xj + r * ldx + (T)), wv, acc[r][h]); \
        }
        COLUMN(0, m0) COLUMN(1, m1) COLUMN(2, m2) COLUMN(3, m3)
#undef COLUMN
    }
}

/* y[r][o0 + l] = acc * scale + bias for the tile's rows and 8 * H lanes, lanes past N left alone */
static void store_tile(int R, int H, __m256 acc[][4], const float *scale, const float *bias,
                       int64_t o0, float *y, int64_t ldy, int64_t N) {
    for (int r = 0; r < R; ++r) {
        float row[32];
        for (int h = 0; h < H; ++h) _mm256_storeu_ps(row + 8 * h, acc[r][h]);
        for (int l = 0; l < 8 * H && o0 + l < N; ++l)
            y[r * ldy + o0 + l] = row[l] * scale[o0 + l] + (bias ? bias[o0 + l] : 0.0f);
    }
}

/* Constant R and H per call site: each specialisation keeps its accumulators in registers. */
static void run_tile(int R, int H, const float *xs, int64_t ldx, int64_t steps, const uint8_t *w,
                     const float *scale, const float *bias, int64_t o0, float *y, int64_t ldy,
                     int64_t N) {
    __m256 acc[ROWS][4];
    if (H == 2) int8_tile(ROWS, 2, xs, ldx, steps, w, acc); /* only full 4-row tiles */
    else if (R == 1) int8_tile(1, 4, xs, ldx, steps, w, acc);
    else if (R == 2) int8_tile(2, 4, xs, ldx, steps, w, acc);
    else int8_tile(3, 4, xs, ldx, steps, w, acc);
    store_tile(R, H, acc, scale, bias, o0, y, ldy, N);
}
#endif

/* Same arguments as graft_quant_linear for int8. Returns 0; 1 when this build has no AVX2;
 * -1 when the scaled copy of x could not be allocated. */
int graft_quant_int8_avx2(const float *x, int64_t ldx, int64_t M, int64_t K, const void *w,
                          const float *scale, const float *bias, float *y, int64_t ldy,
                          int64_t N, int64_t NB, int nthreads) {
#if defined(__AVX2__) && defined(__FMA__)
    const int64_t steps = (K + 3) / 4, KP = steps * 4;
    /* x * 2^-24, each row zero-padded to KP: the padded columns hold q = 0 */
    float *xs = malloc(sizeof(float) * (size_t)(M * KP));
    if (!xs) return -1;
    for (int64_t m = 0; m < M; ++m)
        for (int64_t k = 0; k < KP; ++k) xs[m * KP + k] = k < K ? x[m * ldx + k] * 0x1p-24f : 0.0f;
    const int64_t pairs = NB / 2, full = M / ROWS * ROWS;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (pairs > 1 && nthreads > 1)
    for (int64_t p = 0; p < pairs; ++p) {
        const uint8_t *wp = (const uint8_t *)w + p * steps * 128;
        if (p * 32 >= N) continue;
        for (int b = 0; b < 2; ++b) /* block b of the pair starts 64 bytes in */
            for (int64_t m0 = 0; m0 < full; m0 += ROWS)
                run_tile(ROWS, 2, xs + m0 * KP, KP, steps, wp + 64 * b, scale, bias, p * 32 + 16 * b,
                         y + m0 * ldy, ldy, N);
        if (full < M)
            run_tile((int)(M - full), 4, xs + full * KP, KP, steps, wp, scale, bias, p * 32,
                     y + full * ldy, ldy, N);
    }
    free(xs);
    return 0;
#else
    (void)x; (void)ldx; (void)M; (void)K; (void)w; (void)scale; (void)bias; (void)y; (void)ldy;
    (void)N; (void)NB; (void)nthreads;
    return 1;
#endif
}
