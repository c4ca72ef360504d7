/* int8 and int4 weight-only linears on AVX-512 VNNI: y[M, N] = x[M, K] @ dequant(W)^T + bias.
 *
 * Why not fp32 FMAs: at 1-4 rows the FMA path spends three instructions per 16 weights
 * (widen, convert, multiply-add) and ran at 10-15 GMAC/s a core, below memory speed for int8
 * and int4. vpdpbusd multiplies 64 bytes by 64 bytes and sums each 4 into an int32 lane:
 * the weights go into it as stored.
 *
 * The activations enter as integers without giving up fp32 accuracy: each row x is written
 * as s * X with X = round(x / s) a 24-bit integer (s = max|x| / (127 * 2^16)), and X in
 * balanced base-256 digits X = d2 * 2^16 + d1 * 2^8 + d0, every d in [-128, 127]. Three
 * integer dot products per weight vector then give sum_k q_k X_k exactly; the only rounding
 * is x -> s * X, about 2^-23 of the row's largest |x| per element (fp32 rounds each element
 * to 2^-24 of itself), so outputs stay within float noise of the dequantized reference.
 * vpdpbusd takes one unsigned operand: the weights, stored as
 * q + 128 (int8) or the raw nibble (int4); the digits are the signed operand, and
 * 128 * sum(d) is subtracted (as the accumulator's start value) for int8.
 *
 * Layouts (graft.kernels.cpu_quant.pack), output channels in blocks of 16 lanes, each lane a
 * 4-byte word per step; the two blocks of a tile alternate per step, so a tile reads one
 * sequential stream ([NB/2][steps][2][16][4] bytes; two streams ran ~1.5x slower from DRAM):
 *   int8: q + 128, K padded with q = 0 to K4 (a multiple of 4), K4/4 steps;
 *   int4: K/8 steps, byte t of step j holds column 8j + t (low nibble) and 8j + 4 + t (high
 *         nibble); per group fp16 scales and minimums of the pair in one stream too:
 *         [NB/2][G][scale 0, scale 1, min 0, min 1][16] (mins4 = scales4 + 32).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include "quant_epilogue.h"
#include "quant_group_sums.h"
#include "vnni_dot.h"
#define GRAFT_QUANT_VNNI 1
#else
#define GRAFT_QUANT_VNNI 0
#endif

int graft_quant_vnni(void) { return GRAFT_QUANT_VNNI; }

int graft_quant_amx_applies(int64_t M, int64_t K, int64_t chunk);
int64_t graft_quant_amx_row(int64_t r, int64_t K, int64_t chunk);
void graft_quant_amx_zero_rows(uint8_t *blocks, int64_t from, int64_t to, int64_t K, int64_t chunk);
int graft_quant_amx_i8(const int8_t *dig, int64_t KP, const int32_t *dsum, const float *rs,
                        int64_t M, const void *w, const float *scale8, const float *bias, float *y,
                        int64_t ldy, int64_t N, int64_t NB, int nthreads);
void graft_quant_amx_i4(const int8_t *dig, int64_t K, const float *xs, const float *rs, int64_t M,
                        const void *w, const uint16_t *scales4, const uint16_t *mins4,
                        int64_t group, const float *bias, float *y, int64_t ldy, int64_t N,
                        int64_t NB, int nthreads);

#if GRAFT_QUANT_VNNI
enum { KIND_INT8 = 0, KIND_INT4 = 1 };
#define PIECES 3
/* Software prefetch, bytes ahead in a tile's weight stream: on an Intel Xeon batch-1 decode ran
 * 1.43-1.50x (int8) and 1.13-1.16x (int4) faster with it; the bf16/fp32 tiles, which issue
 * more loads per byte, gained nothing (docs/quantization.md). */
#define PF_DIST 4096
#define MAX_MR8 4       /* int8 tile: 4 rows x 2 blocks x 3 digit accumulators = 24 registers */
#define MAX_MR4 3       /* int4 tile: 18 digit accumulators + 6 fp32 outputs */
#define CHUNK_K 32768   /* int8: columns per int32 accumulation (|sum| < 255 * 128 * K + 128^2 * K) */
#define M_CHUNK 96      /* rows whose digits stay in L2 while every block of W passes over them */
#define X_RANGE 8323072.0f /* 127 * 2^16: |X| stays below the 3 balanced digits' limit 8355711 */

static inline int32_t load_word(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Row m of x -> rs[m] (the step s) and its PIECES digit rows (K..KP padded with 0): column k
 * of piece p at dig[p] + (k / 64) * cstride + k % 64 (cstride 64: plain rows; the AMX path
 * asks for its tile blocks). dsum [PIECES][chunks]: each piece's digit sum per CHUNK_K
 * columns (int8's offset). Returns 0, or 1 when the row holds inf or NaN (the fixed point
 * cannot represent it). */
static int prep_row(const float *x, int64_t K, int64_t KP, int8_t *const dig[PIECES],
                    int64_t cstride, float *rs, int32_t *dsum, int64_t chunks) {
    __m512 mx = _mm512_setzero_ps();
    __mmask16 nan = 0; /* max_ps drops a NaN once a later number meets it in its lane */
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        const __m512 v = _mm512_loadu_ps(x + k);
        mx = _mm512_max_ps(mx, _mm512_abs_ps(v));
        nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    }
    float amax = _mm512_reduce_max_ps(mx);
    for (; k < K; ++k) {
        amax = fabsf(x[k]) > amax ? fabsf(x[k]) : amax;
        nan |= x[k] != x[k];
    }
    /* inf/NaN, or so small that 1/s overflows: the fixed point cannot hold the row */
    if (nan || !(amax <= 3.4028235e38f) || (amax > 0.0f && amax < 1e-30f)) return 1;
    *rs = amax / X_RANGE;
    const float inv = amax > 0.0f ? X_RANGE / amax : 0.0f;
    const __m512 vinv = _mm512_set1_ps(inv);
    const __m512i c128 = _mm512_set1_epi32(128), c255 = _mm512_set1_epi32(255);
    __m512i sums[PIECES] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
    for (k = 0; k < KP; k += 16) {
        const __mmask16 live = lane_mask(K - k);
        const __m512i X = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(live, x + k), vinv));
        __m512i d[PIECES];
        d[0] = _mm512_sub_epi32(_mm512_and_si512(_mm512_add_epi32(X, c128), c255), c128);
        const __m512i X1 = _mm512_srai_epi32(_mm512_sub_epi32(X, d[0]), 8);
        d[1] = _mm512_sub_epi32(_mm512_and_si512(_mm512_add_epi32(X1, c128), c255), c128);
        d[2] = _mm512_srai_epi32(_mm512_sub_epi32(X1, d[1]), 8);
        const int64_t n = KP - k >= 16 ? 16 : KP - k, at = (k >> 6) * cstride + (k & 63);
        const __mmask16 store = lane_mask(n);
        for (int p = 0; p < PIECES; ++p) { /* lanes past K are 0: the sums need no mask */
            _mm512_mask_cvtepi32_storeu_epi8(dig[p] + at, store, d[p]);
            sums[p] = _mm512_add_epi32(sums[p], d[p]);
        }
        if (chunks && ((k + 16) % CHUNK_K == 0 || k + 16 >= KP)) /* int4 (chunks 0): no sums */
            for (int p = 0; p < PIECES; ++p) {
                dsum[p * chunks + k / CHUNK_K] = _mm512_reduce_add_epi32(sums[p]);
                sums[p] = _mm512_setzero_si512();
            }
    }
    return 0;
}

/* acc pieces -> 2^16 a2 + 2^8 a1 + a0 in fp32 */
static inline __m512 combine(const __m512i a[PIECES]) { return combine_digits(a[0], a[1], a[2]); }

/* int8: dig [MR][PIECES][K4] digits, dsum [MR][PIECES][chunks], w0p the pair's first block. */
#define DEFINE_I8_TILE(NAME, MR)                                                                \
    static void NAME(const int8_t *dig, const int32_t *dsum, int64_t chunks, int64_t K4,          \
                     const uint8_t *w0p, const float *rs, const float *scale, const float *bias,  \
                     int64_t o0, float *y, int64_t ldy, int64_t N) {                              \
        const uint8_t *w1p = w0p + 64; /* the pair's blocks alternate per step */                                                       \
        __m512 out[MR][2];                                                                        \
        for (int m = 0; m < MR; ++m) out[m][0] = out[m][1] = _mm512_setzero_ps();                 \
        for (int64_t c = 0; c < chunks; ++c) {                                                    \
            __m512i acc[MR][2][PIECES];                                                           \
            for (int m = 0; m < MR; ++m)                                                          \
                for (int p = 0; p < PIECES; ++p)                                                  \
                    acc[m][0][p] = acc[m][1][p] =                                                 \
                        _mm512_set1_epi32(-128 * dsum[(m * PIECES + p) * chunks + c]);            \
            const int64_t q1 = ((c + 1) * CHUNK_K < K4 ? (c + 1) * CHUNK_K : K4) / 4;             \
            for (int64_t q = c * (CHUNK_K / 4); q < q1; ++q) {                                    \
                _mm_prefetch((const char *)(w0p + q * 128 + PF_DIST), _MM_HINT_T0);                \
                _mm_prefetch((const char *)(w0p + q * 128 + PF_DIST + 64), _MM_HINT_T0);           \
                const __m512i w0 = _mm512_loadu_si512(w0p + q * 128);                             \
                const __m512i w1 = _mm512_loadu_si512(w1p + q * 128);                             \
                _Pragma("GCC unroll 4") for (int m = 0; m < MR; ++m) {                            \
                    _Pragma("GCC unroll 3") for (int p = 0; p < PIECES; ++p) {                    \
                        const __m512i xb = _mm512_set1_epi32(load_word(dig + (m * PIECES + p) * K4 + 4 * q)); \
                        acc[m][0][p] = dot(acc[m][0][p], w0, xb);                                  \
                        acc[m][1][p] = dot(acc[m][1][p], w1, xb);                                  \
                    }                                                                             \
                }                                                                                 \
            }                                                                                     \
            for (int m = 0; m < MR; ++m) {                                                        \
                out[m][0] = _mm512_add_ps(out[m][0], combine(acc[m][0]));                         \
                out[m][1] = _mm512_add_ps(out[m][1], combine(acc[m][1]));                         \
            }                                                                                     \
        }                                                                                         \
        finish_pair(out, MR, rs, scale, bias, o0, y, ldy, N);                                          \
    }

/* int4: per group, out += scale_g * (sum q X) + min_g * xs'_g with xs' = (sum of x over the
 * group) / s, so that the final * s gives scale * sum q x + min * sum x. */
#define DEFINE_I4_TILE(NAME, MR)                                                                \
    static void NAME(const int8_t *dig, int64_t K, const uint8_t *w0p, const uint16_t *sc0,       \
                     const uint16_t *mn0, const float *xs, int64_t group, const float *rs,        \
                     const float *bias, int64_t o0, float *y, int64_t ldy, int64_t N) {           \
        const int64_t G = K / group, steps = group / 8;                                           \
        const uint8_t *w1p = w0p + 64;                                                            \
        const uint16_t *sc1 = sc0 + 16, *mn1 = mn0 + 16; /* per group: 64 halves, see pack */    \
        const __m512i nib = _mm512_set1_epi8(0x0f);                                               \
        __m512 out[MR][2];                                                                        \
        for (int m = 0; m < MR; ++m) out[m][0] = out[m][1] = _mm512_setzero_ps();                 \
        for (int64_t g = 0; g < G; ++g) {                                                         \
            __m512i acc[MR][2][PIECES];                                                           \
            for (int m = 0; m < MR; ++m)                                                          \
                for (int p = 0; p < PIECES; ++p) acc[m][0][p] = acc[m][1][p] = _mm512_setzero_si512(); \
            for (int64_t j = g * steps; j < (g + 1) * steps; ++j) {                               \
                _mm_prefetch((const char *)(w0p + j * 128 + PF_DIST), _MM_HINT_T0);                \
                _mm_prefetch((const char *)(w0p + j * 128 + PF_DIST + 64), _MM_HINT_T0);           \
                const __m512i v0 = _mm512_loadu_si512(w0p + j * 128), v1 = _mm512_loadu_si512(w1p + j * 128); \
                const __m512i lo0 = _mm512_and_si512(v0, nib), hi0 = _mm512_and_si512(_mm512_srli_epi32(v0, 4), nib); \
                const __m512i lo1 = _mm512_and_si512(v1, nib), hi1 = _mm512_and_si512(_mm512_srli_epi32(v1, 4), nib); \
                _Pragma("GCC unroll 3") for (int m = 0; m < MR; ++m) {                            \
                    _Pragma("GCC unroll 3") for (int p = 0; p < PIECES; ++p) {                    \
                        const int8_t *d = dig + (m * PIECES + p) * K + 8 * j;                     \
                        const __m512i xl = _mm512_set1_epi32(load_word(d)), xh = _mm512_set1_epi32(load_word(d + 4)); \
                        acc[m][0][p] = dot(dot(acc[m][0][p], lo0, xl), hi0, xh); \
                        acc[m][1][p] = dot(dot(acc[m][1][p], lo1, xl), hi1, xh); \
                    }                                                                             \
                }                                                                                 \
            }                                                                                     \
            const __m512 s0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sc0 + g * 64))); \
            const __m512 s1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sc1 + g * 64))); \
            const __m512 n0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(mn0 + g * 64))); \
            const __m512 n1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(mn1 + g * 64))); \
            for (int m = 0; m < MR; ++m) {                                                        \
                const __m512 xsum = _mm512_set1_ps(xs[m * G + g]);                                \
                out[m][0] = _mm512_fmadd_ps(xsum, n0, _mm512_fmadd_ps(combine(acc[m][0]), s0, out[m][0])); \
                out[m][1] = _mm512_fmadd_ps(xsum, n1, _mm512_fmadd_ps(combine(acc[m][1]), s1, out[m][1])); \
            }                                                                                     \
        }                                                                                         \
        finish_pair(out, MR, rs, 0, bias, o0, y, ldy, N);                                          \
    }

DEFINE_I8_TILE(vnni_i8_1, 1)
DEFINE_I8_TILE(vnni_i8_2, 2)
DEFINE_I8_TILE(vnni_i8_3, 3)
DEFINE_I8_TILE(vnni_i8_4, 4)
DEFINE_I4_TILE(vnni_i4_1, 1)
DEFINE_I4_TILE(vnni_i4_2, 2)
DEFINE_I4_TILE(vnni_i4_3, 3)

typedef void (*i8_tile_fn)(const int8_t *, const int32_t *, int64_t, int64_t, const uint8_t *,
                           const float *, const float *, const float *, int64_t, float *,
                           int64_t, int64_t);
typedef void (*i4_tile_fn)(const int8_t *, int64_t, const uint8_t *, const uint16_t *,
                           const uint16_t *, const float *, int64_t, const float *, const float *,
                           int64_t, float *, int64_t, int64_t);
static const i8_tile_fn I8_TILES[MAX_MR8 + 1] = {0, vnni_i8_1, vnni_i8_2, vnni_i8_3, vnni_i8_4};
static const i4_tile_fn I4_TILES[MAX_MR4 + 1] = {0, vnni_i4_1, vnni_i4_2, vnni_i4_3};
#endif

/* int8 (kind 0) or int4 (kind 1) in the layouts above; scale8 [NB*16] fp32 per channel;
 * scales4/mins4 fp16, interleaved per pair and group as above; amx: the dispatcher's word that
 * AMX runs here (many rows then go to quant_amx_cpu.c's tiles). Returns 0; 1 when this path
 * does not apply (no VNNI in this build, or a row of x with inf/NaN or a largest |x| below
 * 1e-30: the caller runs the AVX2 or portable path); -1 when scratch could not be allocated
 * (y is not written then). */
int graft_quant_linear_vnni(int kind, const float *x, int64_t ldx, int64_t M, int64_t K,
                            const void *w, const float *scale8, const uint16_t *scales4,
                            const uint16_t *mins4, int64_t group, const float *bias, float *y,
                            int64_t ldy, int64_t N, int64_t NB, int nthreads, int amx_runs) {
#if GRAFT_QUANT_VNNI
    if (kind != KIND_INT8 && kind != KIND_INT4) return 1;
    const int64_t KP = kind == KIND_INT8 ? (K + 3) / 4 * 4 : K, pairs = NB / 2;
    const int64_t chunks = kind == KIND_INT8 ? (KP + CHUNK_K - 1) / CHUNK_K : 0; /* int4: no offset */
    const int64_t G = kind == KIND_INT4 ? K / group : 0, block_bytes = KP * 16 / (kind == KIND_INT4 ? 2 : 1);
    /* many rows: AMX tiles, from digit rows in its blocks (up to a multiple of 32 rows); int4
     * in groups of 32 ran no faster there (each group's fold into fp32 costs as much as its
     * tile products), so those stay here */
    const int amx = amx_runs && (kind == KIND_INT8 ? chunks == 1 : group == 64 || group == 128)
                    && graft_quant_amx_applies(M, KP, 64);
    const int64_t dig_rows = amx ? (M * PIECES + 31) / 32 * 32 : M * PIECES;
    int8_t *dig = malloc((size_t)(dig_rows * KP) + 64);
    float *rs = malloc(sizeof(float) * (size_t)M);
    int32_t *dsum = malloc(sizeof(int32_t) * (size_t)(M * PIECES * chunks + 1));
    float *xs = malloc(sizeof(float) * (size_t)(M * G + 1));
    int status = dig && rs && dsum && xs ? 0 : -1;
    if (!status) { /* the rows' digits on the call's threads, from 32 rows (prefill) */
        int bad = 0;
#pragma omp parallel for num_threads(nthreads) reduction(|| : bad) if (nthreads > 1 && M >= 32)
        for (int64_t m = 0; m < M; ++m) {
            int8_t *rows[PIECES];
            for (int p = 0; p < PIECES; ++p)
                rows[p] = dig + (amx ? graft_quant_amx_row(m * PIECES + p, KP, 64) : (m * PIECES + p) * KP);
            bad = prep_row(x + m * ldx, K, KP, rows, amx ? 2048 : 64, rs + m, dsum + m * PIECES * chunks, chunks)
                  || bad;
        }
        status = bad;
    }
    if (G && !status) { /* int4: group sums of x, divided by the step */
        group_sums(x, ldx, M, K, group, xs);
        for (int64_t m = 0; m < M; ++m)
            for (int64_t g = 0; g < G; ++g) xs[m * G + g] = rs[m] > 0.0f ? xs[m * G + g] / rs[m] : 0.0f;
    }
    if (amx && !status) {
        graft_quant_amx_zero_rows((uint8_t *)dig, M * PIECES, dig_rows, KP, 64);
        if (kind == KIND_INT8)
            status = graft_quant_amx_i8(dig, KP, dsum, rs, M, w, scale8, bias, y, ldy, N, NB, nthreads);
        else
            graft_quant_amx_i4(dig, K, xs, rs, M, w, scales4, mins4, group, bias, y, ldy, N, NB,
                               nthreads);
    }
    for (int64_t mc = 0; mc < M && !status && !amx; mc += M_CHUNK) {
        const int64_t mend = mc + M_CHUNK < M ? mc + M_CHUNK : M;
        const int max_mr = kind == KIND_INT8 ? MAX_MR8 : MAX_MR4;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (pairs > 1 && nthreads > 1)
        for (int64_t p = 0; p < pairs; ++p) {
            const uint8_t *wp = (const uint8_t *)w + 2 * p * block_bytes;
            for (int64_t m0 = mc; m0 < mend; m0 += max_mr) {
                const int mr = (int)(mend - m0 < max_mr ? mend - m0 : max_mr);
                const int8_t *dm = dig + m0 * PIECES * KP;
                if (kind == KIND_INT8)
                    I8_TILES[mr](dm, dsum + m0 * PIECES * chunks, chunks, KP, wp, rs + m0, scale8,
                                 bias, p * 32, y + m0 * ldy, ldy, N);
                else
                    I4_TILES[mr](dm, K, wp, scales4 + p * G * 64, mins4 + p * G * 64,
                                 xs + m0 * G, group, rs + m0, bias, p * 32, y + m0 * ldy, ldy, N);
            }
        }
    }
    free(dig);
    free(rs);
    free(dsum);
    free(xs);
    return status;
#else
    (void)kind; (void)x; (void)ldx; (void)M; (void)K; (void)w; (void)scale8; (void)scales4;
    (void)mins4; (void)group; (void)bias; (void)y; (void)ldy; (void)N; (void)NB; (void)nthreads;
    return 1;
#endif
}
