/* Weight-only low-precision linears on CPU: y[M, N] = x[M, K] @ dequant(W)[N, K]^T + bias,
 * x and y in fp32, W in int8 (per-channel or per-group scale), int4 (per-group scale and minimum), bf16 or
 * fp32 (the unquantized modules of a quantized engine, so one decode step runs one kernel).
 *
 * Why our own: at decode sizes (1-32 rows) a linear is a pass over the weight, so its time is
 * the weight's bytes over memory bandwidth; int8 and int4 read 4x and ~7x fewer bytes than
 * fp32. torch 2.14's _weight_int8pack_mm / _weight_int4pack_mm_for_cpu run these shapes
 * slower than fp32 F.linear here, and torch.ao's dynamic int8 quantizes the activations to
 * 8 bits (not the numbers of the dequantized weight).
 *
 * Paths: int8 and int4 run on AVX-512 VNNI (quant_vnni_cpu.c, which also documents their
 * layouts; int8 with a group size, int8-gG, on AVX-512F in quant_int8g_cpu.c, its weights
 * widened and scaled in registers); bf16 and fp32 weights are widened to fp32 in registers
 * (exact) and multiplied with fp32 FMAs on AVX-512F, except bf16 weights under x that holds
 * only bf16 values (a bf16 engine's), which run on AVX512-BF16 dot products
 * (quant_bf16dot_cpu.c). From WIDEN_ROWS
 * rows (prefill) a bf16 pair of blocks is widened once per call into fp32 scratch and run on
 * the fp32 tiles: the fp32 tiles run near the FMA peak, and widening in every tile costs a
 * shift or mask per weight vector beside the FMAs. What a CPU lacks runs on AVX2 + FMA (quant_avx2_cpu.c for fp32
 * and bf16, quant_avx2_int_cpu.c for int8 and int4, also calls whose x holds inf or NaN), and without AVX2 on the portable loop below:
 * fp32 products in the same layouts.
 *
 * This file is the one dispatcher: graft_quant_linear picks the level (graft_quant_isa) and
 * calls the ISA paths in that order; they never call back into it (the VNNI path is told
 * whether AMX runs and then hands many rows to quant_amx_cpu.c's tiles).
 *
 * bf16/fp32 layout (graft.kernels.cpu_quant.pack): output channels in blocks of 16 lanes, N
 * padded to a multiple of 32 (two blocks per tile); per block the columns follow each other
 * in 64-byte steps, and the two blocks of a pair alternate per step (one sequential stream
 * per tile): fp32 a column per step, [NB/2][K][2][16]; bf16 a column pair per lane word,
 * [NB/2][K2/2][2][16][2] (K2: K rounded up to even, padded with 0). A tile is up to MR rows
 * x 2 blocks of accumulators; small M splits the K loop over several accumulator sets so FMA
 * latency is hidden.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__)
#include "quant_epilogue.h"
#define GRAFT_QUANT_AVX512 1
#else
#define GRAFT_QUANT_AVX512 0
#endif

enum { KIND_INT8 = 0, KIND_INT4 = 1, KIND_BF16 = 2, KIND_F32 = 3, KIND_INT4_A8 = 4 };
#define MAX_MR 6     /* rows per tile: 6 rows x 2 blocks = 12 accumulators */
#define M_CHUNK 96   /* rows whose x stays in L2 while every block of W passes over them */
#define INT8G_WIDEN_ROWS 12 /* int8-gG: from here its pairs are widened once per call (8960 x 1536,
                            * 2 Zen 5 threads, cold: 1.44 against 1.31 ms direct at 8 rows, 1.91
                            * against 2.63 at 16, 2.72 against 5.29 at 32) */
#define WIDEN_ROWS 128 /* bf16 under fp32 x: from here widening once per call pays (one thread,
                        * SmolLM2's MLP shapes: level at 128 rows, 13-19% faster at 512; slower
                        * at 32 and below, where few rows share the widened copy) */

int graft_quant_vnni(void);
int graft_quant_linear_vnni(int kind, const float *x, int64_t ldx, int64_t M, int64_t K,
                            const void *w, const float *scale8, const uint16_t *scales4,
                            const uint16_t *mins4, int64_t group, const float *bias, float *y,
                            int64_t ldy, int64_t N, int64_t NB, int nthreads, int amx_runs);

int graft_quant_amx(void);
int graft_quant_bf16_dot(const float *x, int64_t ldx, int64_t M, int64_t K, const void *w,
                         const float *bias, float *y, int64_t ldy, int64_t N, int64_t NB,
                         int nthreads);
int graft_quant_amx_bf16(const float *x, int64_t ldx, int64_t M, int64_t K, const void *w,
                         const float *bias, float *y, int64_t ldy, int64_t N, int64_t NB,
                         int nthreads);

int graft_quant_int8g_avx512(const float *x, int64_t ldx, int64_t M, int64_t K, const void *w,
                             const float *scales, int64_t group, const float *bias, float *y,
                             int64_t ldy, int64_t N, int64_t NB, int nthreads);
int graft_quant_int8g_widen_pair(const void *w, const float *scales, int64_t K, int64_t group,
                                 int64_t p, float *out); /* int8-gG (quant_int8g_cpu.c) */

int graft_quant_avx2(void);
int graft_quant_int4_a8(int vnni, const float *x, int64_t ldx, int64_t M, int64_t K,
                        const void *w, const uint16_t *scales4, const uint16_t *mins4,
                        int64_t group, const float *bias, float *y, int64_t ldy, int64_t N,
                        int64_t NB, int nthreads); /* int4 x 8-bit activations (quant_a8_cpu.c) */
void graft_quant_round8(const float *x, int64_t ldx, int64_t M, int64_t K, float *xhat);
int graft_quant_linear_avx2(int kind, const float *x, int64_t ldx, int64_t M, int64_t K,
                            const void *w, const float *bias, float *y, int64_t ldy, int64_t N,
                            int64_t NB, int nthreads); /* fp32, bf16 */
int graft_quant_int_avx2(int kind, const float *x, int64_t ldx, int64_t M, int64_t K,
                         const void *w, const float *scale8, const uint16_t *scales4,
                         const uint16_t *mins4, int64_t group, const float *bias, float *y,
                         int64_t ldy, int64_t N, int64_t NB, int nthreads); /* int8, int4 */

/* 0: portable only; 1: every format on AVX2 + FMA; 2: bf16/fp32 on AVX-512F (int8/int4 on
 * AVX2); 3: int8/int4 on AVX-512 VNNI too; 4: int8/bf16/int4 (groups of 64, 128) calls of 8
 * rows or more on AMX tiles (quant_amx_cpu.c). The level can be lowered (GRAFT_CPU_ISA, via
 * graft.kernels.cpu_ops) to run a smaller CPU's paths on a machine that has more. */
static int level_cap = 4;
int graft_quant_isa(void) {
    const int vnni = graft_quant_vnni();
    const int built = GRAFT_QUANT_AVX512 ? 2 + vnni + (vnni && graft_quant_amx()) : graft_quant_avx2();
    return built < level_cap ? built : level_cap;
}
void graft_quant_cap_isa(int level) { level_cap = level; }

static inline float half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalize */
            int e = -1;
            uint32_t m = man;
            do { ++e; m <<= 1; } while (!(m & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((m & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000 | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* ---- portable path: one block of 16 output lanes at a time, in plain loops over the lanes
 * that the compiler vectorizes for whatever -march this build has (AVX2 on CPUs without
 * AVX-512); fp32 products of the same weights. */
#define LANES 16

static inline float bf16_bits_to_float(uint16_t h) {
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Byte offset of step j of block b: each pair of blocks alternates 64-byte steps, and a block
 * has `steps` of them (fp32: K, bf16: K2/2, int8: K4/4, int4: K/8). */
static inline int64_t step_at(int64_t b, int64_t j, int64_t steps) {
    return (((b >> 1) * steps + j) * 2 + (b & 1)) * 64;
}

/* out[r][16] = rows x[r] . block b's weights (int8: before the channel scale), r < R. The
 * accumulators are locals so the compiler keeps them in vector registers; R rows share each
 * weight load. */
static inline __attribute__((always_inline)) void portable_rows(
    int kind, const float *restrict x, int64_t ldx, int R, int64_t K, const uint8_t *restrict w,
    int64_t b, const float *scale8, const uint16_t *scales4, const uint16_t *mins4, int64_t group,
    float out[][LANES]) {
    float acc[4][LANES] = {{0}};
    if (kind == KIND_F32) {
        for (int64_t k = 0; k < K; ++k) {
            const float *wk = (const float *)(w + step_at(b, k, K));
            for (int r = 0; r < R; ++r)
                for (int l = 0; l < LANES; ++l) acc[r][l] += x[r * ldx + k] * wk[l];
        }
    } else if (kind == KIND_BF16) { /* column pairs per lane */
        const int64_t steps = (K + 1) / 2;
        for (int64_t k = 0; k < K; ++k) {
            const uint16_t *ws = (const uint16_t *)(w + step_at(b, k / 2, steps));
            float wk[LANES];
            for (int l = 0; l < LANES; ++l) wk[l] = bf16_bits_to_float(ws[l * 2 + k % 2]);
            for (int r = 0; r < R; ++r)
                for (int l = 0; l < LANES; ++l) acc[r][l] += x[r * ldx + k] * wk[l];
        }
    } else if (kind == KIND_INT8) { /* q + 128, four columns per lane word; int8-gG: q * s */
        const int64_t steps = (K + 3) / 4;
        for (int64_t k = 0; k < K; ++k) {
            const uint8_t *ws = w + step_at(b, k / 4, steps);
            const float *s = group ? scale8 + ((b >> 1) * (K / group) + k / group) * 32 + (b & 1) * LANES : 0;
            float wk[LANES];
            for (int l = 0; l < LANES; ++l)
                wk[l] = s ? (float)((int)ws[l * 4 + k % 4] - 128) * s[l] : (float)((int)ws[l * 4 + k % 4] - 128);
            for (int r = 0; r < R; ++r)
                for (int l = 0; l < LANES; ++l) acc[r][l] += x[r * ldx + k] * wk[l];
        }
    } else { /* int4: byte t of step j holds column 8j + t (low nibble), 8j + 4 + t (high) */
        const int64_t G = K / group;
        for (int64_t g = 0; g < G; ++g) {
            float part[4][LANES] = {{0}}, sc[LANES], mn[LANES];
            for (int64_t k = g * group; k < (g + 1) * group; ++k) {
                const uint8_t *ws = w + step_at(b, k / 8, K / 8);
                float wk[LANES];
                const int64_t t = k % 4, high = (k % 8) >= 4;
                for (int l = 0; l < LANES; ++l) {
                    const uint8_t byte = ws[l * 4 + t];
                    wk[l] = (float)(high ? byte >> 4 : byte & 0xf);
                }
                for (int r = 0; r < R; ++r)
                    for (int l = 0; l < LANES; ++l) part[r][l] += x[r * ldx + k] * wk[l];
            }
            for (int l = 0; l < LANES; ++l) { /* sum x (q s + min) = s sum x q + min sum x */
                sc[l] = half_to_float(scales4[((b >> 1) * G + g) * 64 + (b & 1) * LANES + l]);
                mn[l] = half_to_float(mins4[((b >> 1) * G + g) * 64 + (b & 1) * LANES + l]);
            }
            for (int r = 0; r < R; ++r) {
                float xsum = 0.0f;
                for (int64_t k = g * group; k < (g + 1) * group; ++k) xsum += x[r * ldx + k];
                for (int l = 0; l < LANES; ++l) acc[r][l] += part[r][l] * sc[l] + xsum * mn[l];
            }
        }
    }
    for (int r = 0; r < R; ++r)
        for (int l = 0; l < LANES; ++l) out[r][l] = acc[r][l];
}

static void portable_block(int kind, const float *x, int64_t ldx, int R, int64_t K,
                           const uint8_t *w, int64_t b, const float *scale8,
                           const uint16_t *scales4, const uint16_t *mins4, int64_t group,
                           float out[][LANES]) {
    switch (R) { /* constant R: each specialisation unrolls its row loop */
    case 4: portable_rows(kind, x, ldx, 4, K, w, b, scale8, scales4, mins4, group, out); break;
    case 3: portable_rows(kind, x, ldx, 3, K, w, b, scale8, scales4, mins4, group, out); break;
    case 2: portable_rows(kind, x, ldx, 2, K, w, b, scale8, scales4, mins4, group, out); break;
    default: portable_rows(kind, x, ldx, 1, K, w, b, scale8, scales4, mins4, group, out); break;
    }
}

static void qlinear_portable(int kind, const float *x, int64_t ldx, int64_t M, int64_t K,
                             const uint8_t *w, const float *scale8, const uint16_t *scales4,
                             const uint16_t *mins4, int64_t group, const float *bias, float *y,
                             int64_t ldy, int64_t N, int nthreads) {
    const int64_t NB = (N + LANES - 1) / LANES, MB = (M + 3) / 4;
#pragma omp parallel for num_threads(nthreads) schedule(static) collapse(2) if (nthreads > 1)
    for (int64_t b = 0; b < NB; ++b)
        for (int64_t mb = 0; mb < MB; ++mb) {
            const int64_t m0 = mb * 4;
            const int R = (int)(M - m0 < 4 ? M - m0 : 4);
            float out[4][LANES];
            portable_block(kind, x + m0 * ldx, ldx, R, K, w, b, scale8, scales4, mins4, group, out);
            for (int r = 0; r < R; ++r)
                for (int l = 0; l < LANES && b * LANES + l < N; ++l) {
                    const int64_t o = b * LANES + l;
                    y[(m0 + r) * ldy + o] = (kind == KIND_INT8 && !group ? out[r][l] * scale8[o] : out[r][l])
                                            + (bias ? bias[o] : 0.0f);
                }
        }
}

/* int4 x 8-bit activations without AVX2: the rounded rows (quant_a8_cpu.c) through the int4
 * loop; a block holding inf or NaN rounds to NaN, so its row's outputs are NaN. Returns 0, or
 * -1 when the rounded copy could not be allocated. */
static int int4_a8_portable(const float *x, int64_t ldx, int64_t M, int64_t K, const void *w,
                            const uint16_t *scales4, const uint16_t *mins4, int64_t group,
                            const float *bias, float *y, int64_t ldy, int64_t N, int nthreads) {
    float *xhat = malloc(sizeof(float) * (size_t)(M * K));
    if (!xhat) return -1;
    graft_quant_round8(x, ldx, M, K, xhat);
    qlinear_portable(KIND_INT4, xhat, K, M, K, (const uint8_t *)w, 0, scales4, mins4, group, bias,
                     y, ldy, N, nthreads);
    free(xhat);
    return 0;
}

#if GRAFT_QUANT_AVX512
/* Weight vector (16 lanes of fp32) of block column k; p: the block's first step (steps are
 * 128 bytes apart: the pair's two blocks alternate). bf16 blocks hold column pairs per lane,
 * so a column is its 32-bit word shifted or masked: no shuffle. */
static inline __m512 load_f32(const float *p, int64_t k) { return _mm512_loadu_ps(p + k * 32); }
static inline __m512 load_bf16(const uint16_t *p, int64_t k) {
    const __m512i v = _mm512_loadu_si512(p + (k >> 1) * 64);
    return _mm512_castsi512_ps((k & 1) ? _mm512_and_si512(v, _mm512_set1_epi32((int)0xFFFF0000u))
                                       : _mm512_slli_epi32(v, 16));
}

/* Accumulators: acc[s][m][j]: s = K-split set, m = row, j = block of the pair. */
#define TILE_BODY_DENSE(MR, S, LOADW)                                                          \
    __m512 acc[S][MR][2];                                                                       \
    for (int s = 0; s < S; ++s)                                                                 \
        for (int m = 0; m < MR; ++m) acc[s][m][0] = acc[s][m][1] = _mm512_setzero_ps();        \
    int64_t k = 0;                                                                              \
    for (; k + S <= K; k += S) {                                                                \
        _Pragma("GCC unroll 4") for (int s = 0; s < S; ++s) {                                   \
            const __m512 w0 = LOADW(w0p, k + s), w1 = LOADW(w1p, k + s);                        \
            _Pragma("GCC unroll 6") for (int m = 0; m < MR; ++m) {                              \
                const __m512 xv = _mm512_set1_ps(x[m * ldx + k + s]);                           \
                acc[s][m][0] = _mm512_fmadd_ps(xv, w0, acc[s][m][0]);                           \
                acc[s][m][1] = _mm512_fmadd_ps(xv, w1, acc[s][m][1]);                           \
            }                                                                                   \
        }                                                                                       \
    }                                                                                           \
    for (; k < K; ++k) {                                                                        \
        const __m512 w0 = LOADW(w0p, k), w1 = LOADW(w1p, k);                                \
        for (int m = 0; m < MR; ++m) {                                                          \
            const __m512 xv = _mm512_set1_ps(x[m * ldx + k]);                                   \
            acc[0][m][0] = _mm512_fmadd_ps(xv, w0, acc[0][m][0]);                               \
            acc[0][m][1] = _mm512_fmadd_ps(xv, w1, acc[0][m][1]);                               \
        }                                                                                       \
    }                                                                                           \
    for (int s = 1; s < S; ++s)                                                                 \
        for (int m = 0; m < MR; ++m) {                                                          \
            acc[0][m][0] = _mm512_add_ps(acc[0][m][0], acc[s][m][0]);                           \
            acc[0][m][1] = _mm512_add_ps(acc[0][m][1], acc[s][m][1]);                           \
        }

#define DEFINE_DENSE_TILE(NAME, T, LOADW, MR, S)                                                \
    static void NAME(const float *x, int64_t ldx, int64_t K, const T *w0p, const float *bias,   \
                     int64_t o0, float *y, int64_t ldy, int64_t N) {                            \
        const T *w1p = w0p + 64 / sizeof(T); /* the pair's second block: 64 bytes on per step */ \
        TILE_BODY_DENSE(MR, S, LOADW)                                                           \
        finish_pair(acc[0], MR, 0, 0, bias, o0, y, ldy, N);                                    \
    }

DEFINE_DENSE_TILE(tile_bf_1, uint16_t, load_bf16, 1, 4)
DEFINE_DENSE_TILE(tile_bf_2, uint16_t, load_bf16, 2, 2)
DEFINE_DENSE_TILE(tile_bf_3, uint16_t, load_bf16, 3, 2)
DEFINE_DENSE_TILE(tile_bf_4, uint16_t, load_bf16, 4, 2)
DEFINE_DENSE_TILE(tile_bf_5, uint16_t, load_bf16, 5, 2)
DEFINE_DENSE_TILE(tile_bf_6, uint16_t, load_bf16, 6, 2)
DEFINE_DENSE_TILE(tile_f32_1, float, load_f32, 1, 4)
DEFINE_DENSE_TILE(tile_f32_2, float, load_f32, 2, 2)
DEFINE_DENSE_TILE(tile_f32_3, float, load_f32, 3, 2)
DEFINE_DENSE_TILE(tile_f32_4, float, load_f32, 4, 1)
DEFINE_DENSE_TILE(tile_f32_5, float, load_f32, 5, 1)
DEFINE_DENSE_TILE(tile_f32_6, float, load_f32, 6, 1)

/* Pair p of bf16 blocks ([K2/2][2][16][2] words) widened to the fp32 pair layout ([K][2][16]);
 * widen_fn's signature (int8-gG's graft_quant_int8g_widen_pair takes the scales and group). */
static int widen_bf16_pair(const void *wall, const float *scales, int64_t K, int64_t group,
                           int64_t p, float *out) {
    (void)scales; (void)group;
    const uint16_t *w = (const uint16_t *)((const uint8_t *)wall + 2 * p * ((K + 1) / 2 * 64));
    const __m512i high = _mm512_set1_epi32((int)0xFFFF0000u);
    for (int64_t j = 0; j < (K + 1) / 2; ++j)
        for (int b = 0; b < 2; ++b) {
            const __m512i v = _mm512_loadu_si512(w + (j * 2 + b) * 32);
            _mm512_storeu_ps(out + (2 * j * 2 + b) * 16, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
            if (2 * j + 1 < K)
                _mm512_storeu_ps(out + ((2 * j + 1) * 2 + b) * 16, _mm512_castsi512_ps(_mm512_and_si512(v, high)));
        }
    return 0;
}
typedef int (*widen_fn)(const void *, const float *, int64_t, int64_t, int64_t, float *);

typedef void (*dense_tile_fn)(const float *, int64_t, int64_t, const void *, const float *,
                              int64_t, float *, int64_t, int64_t);
static const dense_tile_fn BF_TILES[MAX_MR + 1] = {
    0, (dense_tile_fn)tile_bf_1, (dense_tile_fn)tile_bf_2, (dense_tile_fn)tile_bf_3,
    (dense_tile_fn)tile_bf_4, (dense_tile_fn)tile_bf_5, (dense_tile_fn)tile_bf_6};
static const dense_tile_fn F32_TILES[MAX_MR + 1] = {
    0, (dense_tile_fn)tile_f32_1, (dense_tile_fn)tile_f32_2, (dense_tile_fn)tile_f32_3,
    (dense_tile_fn)tile_f32_4, (dense_tile_fn)tile_f32_5, (dense_tile_fn)tile_f32_6};

/* Rows [m0, mend) of x through one pair of blocks (wp, outputs o0..o0+31), MAX_MR rows a tile:
 * the chunked path and the widened bf16 path share it, so a row meets the same tile height
 * (and sum order) in both when their chunks start at multiples of MAX_MR. */
static inline void tile_rows(const dense_tile_fn *tiles, const float *x, int64_t ldx, int64_t m0,
                             int64_t mend, int64_t K, const void *wp, const float *bias,
                             int64_t o0, float *y, int64_t ldy, int64_t N) {
    for (; m0 < mend; m0 += MAX_MR) {
        const int mr = (int)(mend - m0 < MAX_MR ? mend - m0 : MAX_MR);
        tiles[mr](x + m0 * ldx, ldx, K, wp, bias, o0, y + m0 * ldy, ldy, N);
    }
}

/* bf16 or int8-gG weights under fp32 rows, each thread widening its pairs into its own
 * scratch and running every row over it: the outputs are the fp32 path's on the dequantized
 * weight, bit for bit. Returns 1 (nothing written that counts) when scratch could not be
 * allocated or `widen` has no path in this build. */
static int widened(widen_fn widen, const float *x, int64_t ldx, int64_t M, int64_t K,
                   const void *w, const float *scales, int64_t group, const float *bias,
                   float *y, int64_t ldy, int64_t N, int64_t NB, int nthreads) {
    const int64_t pairs = NB / 2;
    int failed = 0;
#pragma omp parallel num_threads(nthreads) if (pairs > 1 && nthreads > 1)
    {
        float *scratch = aligned_alloc(64, (size_t)K * 32 * sizeof(float));
        if (!scratch) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t p = 0; p < pairs; ++p) {
            if (!scratch || failed) continue;
            if (widen(w, scales, K, group, p, scratch)) {
#pragma omp atomic write
                failed = 1;
                continue;
            }
            tile_rows(F32_TILES, x, ldx, 0, M, K, scratch, bias, p * 32, y, ldy, N);
        }
        free(scratch);
    }
    return failed;
}

#endif

/* y [M, ldy] = x [M, ldx] @ W^T + bias for the first N outputs. NB: blocks of 16 (even).
 * scale8: int8 per-channel scales [NB*16], or with group > 0 int8-gG's fp32 group scales
 * [NB/2][K/group][2][16] (graft.kernels.cpu_quant.pack); scales4/mins4: int4 fp16 (quant_vnni_cpu.c). Returns 0,
 * or -1 when scratch could not be allocated (y is not written then). */
int graft_quant_linear(int kind, const float *x, int64_t ldx, int64_t M, int64_t K,
                        const void *w, const float *scale8, const uint16_t *scales4,
                        const uint16_t *mins4, int64_t group, const float *bias, float *y,
                        int64_t ldy, int64_t N, int64_t NB, int nthreads) {
    const int level = graft_quant_isa();
    const int integer = kind == KIND_INT8 || kind == KIND_INT4;
    if (kind == KIND_INT4_A8) { /* its own integer kernel on AVX2 and up */
        const int status = level >= 1 ? graft_quant_int4_a8(level >= 3, x, ldx, M, K, w, scales4, mins4,
                                                            group, bias, y, ldy, N, NB, nthreads) : 1;
        return status <= 0 ? status : int4_a8_portable(x, ldx, M, K, w, scales4, mins4, group,
                                                       bias, y, ldy, N, nthreads);
    }
    if (integer && level >= 3 && !(kind == KIND_INT8 && group)) { /* int8-gG: on AVX2 below */
        const int status = graft_quant_linear_vnni(kind, x, ldx, M, K, w, scale8, scales4, mins4,
                                                   group, bias, y, ldy, N, NB, nthreads, level >= 4);
        if (status <= 0) return status; /* else a row the fixed point cannot hold: below */
    }
#if GRAFT_QUANT_AVX512
    if (kind == KIND_BF16 && level >= 4) {
        const int status = graft_quant_amx_bf16(x, ldx, M, K, w, bias, y, ldy, N, NB, nthreads);
        if (status <= 0) return status; /* else too few rows, K not a multiple of 32, inf/NaN */
    }
    if (kind == KIND_BF16 && level >= 3) {
        const int status = graft_quant_bf16_dot(x, ldx, M, K, w, bias, y, ldy, N, NB, nthreads);
        if (status <= 0) return status; /* else no AVX512-BF16, or x is not all bf16 values */
    }
    if (kind == KIND_BF16 && level >= 2 && M >= WIDEN_ROWS &&
        widened(widen_bf16_pair, x, ldx, M, K, w, 0, 0, bias, y, ldy, N, NB, nthreads) == 0)
        return 0;
    if (kind == KIND_INT8 && group && level >= 2) { /* int8-gG: else AVX2 below */
        if (M >= INT8G_WIDEN_ROWS && widened(graft_quant_int8g_widen_pair, x, ldx, M, K, w, scale8,
                                             group, bias, y, ldy, N, NB, nthreads) == 0)
            return 0;
        if (graft_quant_int8g_avx512(x, ldx, M, K, w, scale8, group, bias, y, ldy, N, NB, nthreads) == 0)
            return 0;
    }
    if (!integer && level >= 2) {
        const int64_t pairs = NB / 2, block = kind == KIND_F32 ? K * 64 : (K + 1) / 2 * 64; /* bytes */
        /* split the pairs of one M chunk over threads; big M also gets chunks so x stays cached */
#pragma omp parallel num_threads(nthreads) if (pairs > 1 && nthreads > 1)
        for (int64_t mc = 0; mc < M; mc += M_CHUNK) {
            const int64_t mend = mc + M_CHUNK < M ? mc + M_CHUNK : M;
#pragma omp for schedule(static) nowait
            for (int64_t p = 0; p < pairs; ++p)
                tile_rows(kind == KIND_BF16 ? BF_TILES : F32_TILES, x, ldx, mc, mend, K,
                          (const uint8_t *)w + 2 * p * block, bias, p * 32, y, ldy, N);
        }
        return 0;
    }
#endif
    if (level >= 1) {
        const int status = integer ? graft_quant_int_avx2(kind, x, ldx, M, K, w, scale8, scales4, mins4,
                                                          group, bias, y, ldy, N, NB, nthreads)
                                   : graft_quant_linear_avx2(kind, x, ldx, M, K, w, bias, y, ldy, N, NB, nthreads);
        if (status <= 0) return status;
    }
    qlinear_portable(kind, x, ldx, M, K, (const uint8_t *)w, scale8, scales4, mins4, group,
                     bias, y, ldy, N, nthreads);
    return 0;
}

/* The portable path, callable on any build (tests compare it with the vector path). */
void graft_quant_linear_portable(int kind, const float *x, int64_t ldx, int64_t M, int64_t K,
                                 const void *w, const float *scale8, const uint16_t *scales4,
                                 const uint16_t *mins4, int64_t group, const float *bias,
                                 float *y, int64_t ldy, int64_t N, int nthreads) {
    if (kind == KIND_INT4_A8) {
        if (int4_a8_portable(x, ldx, M, K, w, scales4, mins4, group, bias, y, ldy, N, nthreads))
            for (int64_t m = 0; m < M; ++m) /* no scratch: NaN, never stale numbers */
                for (int64_t o = 0; o < N; ++o) y[m * ldy + o] = 0.0f / 0.0f;
        return;
    }
    qlinear_portable(kind, x, ldx, M, K, (const uint8_t *)w, scale8, scales4, mins4, group,
                     bias, y, ldy, N, nthreads);
}

/* An fp32 weight's row-major [n][K] (torch's layout, for a GEMM library's call) from its C
 * layout, pairs of 16-row blocks [NB/2][K][2][16] (graft.kernels.cpu_quant._pairs of
 * _blocks): 16 x 32 tiles of it transposed in L1, on nthreads threads. 1.6x faster than
 * torch's two transposing copies on a cached weight; in an fp32 prefill step the weights come
 * from memory and the copy stays ~11% of the step (prefill-512 rose 1-2%). */
void graft_quant_unpack_fp32(const float *w, int64_t K, int64_t n, float *out, int nthreads) {
    const int64_t pairs = (n + 31) / 32;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (pairs * K >= (1 << 14))
    for (int64_t p = 0; p < pairs; ++p) {
        const float *src = w + p * K * 32;
        const int64_t rows = n - p * 32 < 32 ? n - p * 32 : 32;
        for (int64_t k0 = 0; k0 < K; k0 += 16) {
            const int64_t k1 = K - k0 < 16 ? K : k0 + 16;
            for (int64_t l = 0; l < rows; ++l) {
                float *dst = out + (p * 32 + l) * K;
                for (int64_t k = k0; k < k1; ++k) dst[k] = src[k * 32 + l];
            }
        }
    }
}
