/* Weight-only linears on AVX2 + FMA (CPUs without AVX-512, and int8/int4 on AVX-512 CPUs
 * without VNNI): y[M, N] = x[M, K] @ dequant(W)^T + bias. fp32 and bf16 here, in the layouts
 * of quant_linear_cpu.c: a block's 64-byte steps are 128 bytes apart, its pair's other block
 * in between. int8 and int4 on AVX2 are quant_avx2_int_cpu.c.
 *
 * Each weight is widened to fp32 exactly in registers and multiplied with one FMA per row, in
 * column order: every row and lane is one FMA chain over k, whatever the tile, so a row's
 * output does not depend on how many rows share the call.
 *
 * Tiles are the classic AVX2 GEMM shape, up to 6 rows x one 16-lane block (12 accumulators,
 * the two weight halves and a broadcast: 15 of the 16 ymm registers), so each weight load
 * feeds up to 12 FMAs. A 16-row decode step runs tiles of 6, 6 and 4 rows over each block,
 * from L1/L2 once the pair is fetched: while a pair's passes run, the next pair is prefetched,
 * spread over them, so memory and FMAs overlap (oneDNN's fp32 GEMM read a cold 16-row SmolLM2
 * step at 13-20 GB/s of the ~27 measured: docs/benchmarks.md, issue 49). One row takes a pair
 * in one sequential pass instead (pair_row).
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
#define MR_MAX 6
#define M_CHUNK 48     /* rows of x kept in L2 (512 KB on Zen 3) while every pair passes them */
#define PREFETCH 2048  /* bytes ahead in the pair's stream: 16 steps */
/* One row's single pass: on a 2-core Xeon held to AVX2, bf16 at the 1.5B shape read 100-101%
 * of the measured bandwidth 2 KB ahead and 71-80% 4 KB ahead (fp32 level; 2026-12-06); the
 * AVX2 integer kernels chose 2 KB on AMD. 4 KB had been the pick on the Zen 4 proxy (8 KB no
 * better), where 2 KB was not measured. */
#define ROW_PREFETCH 2048

/* acc[m][h] += x[m][k] * w_h for the tile's rows (xk: &x[0][k]) */
#define FMA_COLUMN(MR, xk, ldx, w0, w1)                                                         \
    _Pragma("GCC unroll 6") for (int m = 0; m < (MR); ++m) {                                    \
        const __m256 xv = _mm256_broadcast_ss((xk) + m * (ldx));                                \
        acc[m][0] = _mm256_fmadd_ps(xv, (w0), acc[m][0]);                                       \
        acc[m][1] = _mm256_fmadd_ps(xv, (w1), acc[m][1]);                                       \
    }

static inline void prefetch_pair(const uint8_t *step) {
    __builtin_prefetch(step + PREFETCH, 0, 3);
    __builtin_prefetch(step + PREFETCH + 64, 0, 3);
}

/* out[m][h] = row m . the block whose first step is w (16 lanes as two 8-lane halves) */
static inline __attribute__((always_inline)) void block_tile(int kind, int MR, const float *x,
                                                             int64_t ldx, int64_t K,
                                                             const uint8_t *w, __m256 out[][2],
                                                             const uint8_t *pf, int64_t every) {
    __m256 acc[MR_MAX][2];
    int64_t due = 0; /* one line of pf every `every` steps */
    for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
    if (kind == KIND_F32) {
        for (int64_t k = 0; k < K; ++k) {
            const float *wk = (const float *)(w + k * 128);
            prefetch_pair((const uint8_t *)wk);
            if (pf && ++due == every) __builtin_prefetch(pf, 0, 3), pf += 64, due = 0;
            const __m256 w0 = _mm256_loadu_ps(wk), w1 = _mm256_loadu_ps(wk + 8);
            FMA_COLUMN(MR, x + k, ldx, w0, w1)
        }
    } else { /* bf16: a lane word holds columns 2j (low half) and 2j + 1 (high half) */
        const __m256i high = _mm256_set1_epi32((int)0xFFFF0000u);
        int64_t j = 0;
        for (; 2 * j + 1 < K; ++j) {
            const __m256i *wj = (const __m256i *)(w + j * 128);
            prefetch_pair((const uint8_t *)wj);
            if (pf && ++due == every) __builtin_prefetch(pf, 0, 3), pf += 64, due = 0;
            const __m256i v0 = _mm256_loadu_si256(wj), v1 = _mm256_loadu_si256(wj + 1);
            FMA_COLUMN(MR, x + 2 * j, ldx, _mm256_castsi256_ps(_mm256_slli_epi32(v0, 16)),
                       _mm256_castsi256_ps(_mm256_slli_epi32(v1, 16)))
            FMA_COLUMN(MR, x + 2 * j + 1, ldx, _mm256_castsi256_ps(_mm256_and_si256(v0, high)),
                       _mm256_castsi256_ps(_mm256_and_si256(v1, high)))
        }
        if (2 * j < K) { /* odd K: the last word's high half is padding */
            const __m256i *wj = (const __m256i *)(w + j * 128);
            FMA_COLUMN(MR, x + 2 * j, ldx,
                       _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_loadu_si256(wj), 16)),
                       _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_loadu_si256(wj + 1), 16)))
        }
    }
    for (int m = 0; m < MR; ++m) out[m][0] = acc[m][0], out[m][1] = acc[m][1];
}

/* One row through both blocks of a pair in one sequential pass (batch-1 decode, where the
 * memory stream is the bound), prefetching ROW_PREFETCH on: 4 FMA chains, each lane's in
 * column order as in the tiles. Two passes of every other line each, prefetching 2 KB on,
 * read ~50% of the measured bandwidth at the 1.5B shape; this reads 85-99% (b1stream, issue
 * 49). A second accumulator set per lane (even / odd columns) measured no faster. */
static void pair_row(int kind, const float *x, int64_t K, const uint8_t *w, __m256 out[4]) {
    __m256 a[4];
    for (int h = 0; h < 4; ++h) a[h] = _mm256_setzero_ps();
    if (kind == KIND_F32) {
        for (int64_t k = 0; k < K; ++k) {
            const float *wk = (const float *)(w + k * 128);
            __builtin_prefetch((const uint8_t *)wk + ROW_PREFETCH, 0, 3);
            __builtin_prefetch((const uint8_t *)wk + ROW_PREFETCH + 64, 0, 3);
            const __m256 xv = _mm256_broadcast_ss(x + k);
            for (int h = 0; h < 4; ++h) a[h] = _mm256_fmadd_ps(xv, _mm256_loadu_ps(wk + 8 * h), a[h]);
        }
    } else {
        const __m256i high = _mm256_set1_epi32((int)0xFFFF0000u);
        for (int64_t j = 0; j < (K + 1) / 2; ++j) {
            const __m256i *wj = (const __m256i *)(w + j * 128);
            __builtin_prefetch((const uint8_t *)wj + ROW_PREFETCH, 0, 3);
            __builtin_prefetch((const uint8_t *)wj + ROW_PREFETCH + 64, 0, 3);
            const __m256 x0 = _mm256_broadcast_ss(x + 2 * j);
            const __m256 x1 = 2 * j + 1 < K ? _mm256_broadcast_ss(x + 2 * j + 1) : _mm256_setzero_ps();
            for (int h = 0; h < 4; ++h) {
                const __m256i v = _mm256_loadu_si256(wj + h);
                a[h] = _mm256_fmadd_ps(x0, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)), a[h]);
                a[h] = _mm256_fmadd_ps(x1, _mm256_castsi256_ps(_mm256_and_si256(v, high)), a[h]);
            }
        }
    }
    for (int h = 0; h < 4; ++h) out[h] = a[h];
}

/* y[m][o0 + l] = out + bias for the tile's rows, lanes past N left alone */
static void store_tile(int MR, __m256 out[][2], const float *bias, int64_t o0, float *y,
                       int64_t ldy, int64_t N) {
    for (int m = 0; m < MR; ++m) {
        float *ym = y + m * ldy + o0;
        if (o0 + 16 <= N) {
            __m256 b0 = _mm256_setzero_ps(), b1 = _mm256_setzero_ps();
            if (bias) b0 = _mm256_loadu_ps(bias + o0), b1 = _mm256_loadu_ps(bias + o0 + 8);
            _mm256_storeu_ps(ym, _mm256_add_ps(out[m][0], b0));
            _mm256_storeu_ps(ym + 8, _mm256_add_ps(out[m][1], b1));
            continue;
        }
        float row[16];
        _mm256_storeu_ps(row, out[m][0]);
        _mm256_storeu_ps(row + 8, out[m][1]);
        for (int l = 0; o0 + l < N; ++l) ym[l] = row[l] + (bias ? bias[o0 + l] : 0.0f);
    }
}

/* Rows [0, M) of x (M <= M_CHUNK) through block b: tiles of MR_MAX rows, then the rest. */
static void block_rows(int kind, const float *x, int64_t ldx, int64_t M, int64_t K,
                       const uint8_t *w, const float *bias, int64_t o0, float *y, int64_t ldy,
                       int64_t N, const uint8_t *pf, int64_t pf_bytes) {
    __m256 out[MR_MAX][2];
    const int64_t tiles = (M + MR_MAX - 1) / MR_MAX, steps = kind == KIND_F32 ? K : (K + 1) / 2;
    /* every tile pass takes its share of pf's lines, spread over its steps */
    const int64_t share = pf_bytes / 64 / tiles, every = share ? (steps + share - 1) / share : 0;
    for (int64_t m0 = 0; m0 < M; m0 += MR_MAX) {
        const int mr = (int)(M - m0 < MR_MAX ? M - m0 : MR_MAX);
        const float *xm = x + m0 * ldx;
        const uint8_t *pft = every ? pf + m0 / MR_MAX * share * 64 : 0;
        switch (mr * 4 + kind) { /* constant MR and kind: each one keeps acc in registers */
#define CASE(R)                                                                                 \
    case R * 4 + KIND_F32: block_tile(KIND_F32, R, xm, ldx, K, w, out, pft, every); break;                 \
    case R * 4 + KIND_BF16: block_tile(KIND_BF16, R, xm, ldx, K, w, out, pft, every); break;
            CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6)
#undef CASE
        default: return;
        }
        store_tile(mr, out, bias, o0, y + m0 * ldy, ldy, N);
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
    const int64_t pairs = NB / 2;
    for (int64_t mc = 0; mc < M; mc += M_CHUNK) {
        const int64_t rows = M - mc < M_CHUNK ? M - mc : M_CHUNK;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (pairs > 1 && nthreads > 1)
        for (int64_t p = 0; p < pairs; ++p) {
            /* the pair's blocks alternate 64-byte steps: block 2p + 1 starts 64 bytes in */
            const uint8_t *wp = (const uint8_t *)w + p * 2 * bytes;
            /* while a pair is computed (several passes from cache when rows > MR_MAX), the
             * next pair is fetched: its first half during block 0, its second during block 1 */
            if (rows == 1) {
                __m256 out[4];
                pair_row(kind, x + mc * ldx, K, wp, out);
                store_tile(1, (__m256(*)[2])out, bias, 2 * p * 16, y + mc * ldy, ldy, N);
                if ((2 * p + 1) * 16 < N)
                    store_tile(1, (__m256(*)[2])(out + 2), bias, (2 * p + 1) * 16, y + mc * ldy, ldy, N);
                continue;
            }
            const int last = p + 1 == pairs; /* (a thread's last pair fetches its neighbour's first) */
            for (int b = 0; b < 2 && (2 * p + b) * 16 < N; ++b)
                block_rows(kind, x + mc * ldx, ldx, rows, K, wp + b * 64, bias, (2 * p + b) * 16,
                           y + mc * ldy, ldy, N, last ? 0 : wp + 2 * bytes + b * bytes,
                           last ? 0 : bytes);
        }
    }
    return 0;
#else
    (void)kind; (void)x; (void)ldx; (void)M; (void)K; (void)w; (void)bias; (void)y; (void)ldy;
    (void)N; (void)NB; (void)nthreads;
    return 1;
#endif
}
