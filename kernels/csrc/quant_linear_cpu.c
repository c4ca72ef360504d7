/* Weight-only low-precision linears on CPU: y[M, N] = x[M, K] @ dequant(W)[N, K]^T + bias,
 * x and y in fp32, W in int8 (per-channel scale), int4 (per-group scale and minimum), bf16 or
 * fp32 (the unquantized modules of a quantized engine, so one decode step runs one kernel).
 *
 * Why our own: at decode sizes (1-32 rows) a linear is a pass over the weight, so its time is
 * the weight's bytes over memory bandwidth; int8 and int4 read 4x and ~7x fewer bytes than
 * fp32. torch 2.14's _weight_int8pack_mm / _weight_int4pack_mm_for_cpu run these shapes
 * slower than fp32 F.linear here, and torch.ao's dynamic int8 quantizes the activations too
 * (not the same numbers as the dequantized weight). Weights are dequantized in registers
 * exactly (int -> fp32 is exact) and multiplied with fp32 FMAs.
 *
 * Layout (built by graft.kernels.cpu_quant.pack): output channels in blocks of 16 lanes,
 * N padded to a multiple of 32 (two blocks per tile); per block the K columns follow each
 * other, 16 lanes each: int8/bf16/fp32 [NB][K][16], int4 [NB][K/2][16] bytes
 * (low nibble column 2j, high nibble column 2j+1), int4 scales/mins [NB][G][16] fp16,
 * int8 scales [NB*16] fp32. A tile is up to MR rows x 2 blocks of accumulators; small M
 * splits the K loop over several accumulator sets so FMA latency is hidden.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#define GRAFT_QUANT_AVX512 1
#else
#define GRAFT_QUANT_AVX512 0
#endif

enum { KIND_INT8 = 0, KIND_INT4 = 1, KIND_BF16 = 2, KIND_F32 = 3 };
#define MAX_MR 6     /* rows per tile: 6 rows x 2 blocks = 12 accumulators */
#define M_CHUNK 96   /* rows whose x stays in L2 while every block of W passes over them */

int graft_quant_isa(void) { return GRAFT_QUANT_AVX512; }

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

/* ---- portable path: one output channel at a time, same arithmetic per product -------------- */
static float weight_at(int kind, const uint8_t *w, int64_t K, int64_t o, int64_t k) {
    const int64_t b = o / 16, lane = o % 16;
    if (kind == KIND_INT8) return (float)((const int8_t *)w)[(b * K + k) * 16 + lane];
    if (kind == KIND_F32) return ((const float *)w)[(b * K + k) * 16 + lane];
    if (kind == KIND_BF16) {
        const uint32_t bits = (uint32_t)((const uint16_t *)w)[(b * K + k) * 16 + lane] << 16;
        float f;
        memcpy(&f, &bits, 4);
        return f;
    }
    const uint8_t byte = w[(b * (K / 2) + k / 2) * 16 + lane];
    return (float)((k & 1) ? byte >> 4 : byte & 0xf); /* int4: q; scale and min per group */
}

static void qlinear_portable(int kind, const float *x, int64_t ldx, int64_t M, int64_t K,
                             const uint8_t *w, const float *scale8, const uint16_t *scales4,
                             const uint16_t *mins4, int64_t group, const float *bias, float *y,
                             int64_t ldy, int64_t N, int nthreads) {
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t o = 0; o < N; ++o) {
        const int64_t b = o / 16, lane = o % 16, G = kind == KIND_INT4 ? K / group : 1;
        for (int64_t m = 0; m < M; ++m) {
            float acc = 0.0f;
            for (int64_t g = 0; g < G; ++g) {
                const int64_t k0 = kind == KIND_INT4 ? g * group : 0;
                const int64_t k1 = kind == KIND_INT4 ? k0 + group : K;
                float part = 0.0f, xsum = 0.0f;
                for (int64_t k = k0; k < k1; ++k) {
                    part += x[m * ldx + k] * weight_at(kind, w, K, o, k);
                    xsum += x[m * ldx + k];
                }
                if (kind == KIND_INT4) { /* sum x * (q * s + min) = s * sum x q + min * sum x */
                    const int64_t i = (b * G + g) * 16 + lane;
                    acc += part * half_to_float(scales4[i]) + xsum * half_to_float(mins4[i]);
                } else {
                    acc += part;
                }
            }
            if (kind == KIND_INT8) acc *= scale8[o];
            y[m * ldy + o] = acc + (bias ? bias[o] : 0.0f);
        }
    }
}

#if GRAFT_QUANT_AVX512
/* Weight vectors (16 lanes of fp32) of block column k. */
static inline __m512 load_int8(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
static inline __m512 load_f32(const float *p) { return _mm512_loadu_ps(p); }
static inline __m512 load_bf16(const uint16_t *p) {
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

/* Stores 16 lanes of output row y (only the first `valid` lanes belong to the layer). */
static inline void store_lanes(float *y, __m512 v, int64_t valid) {
    if (valid >= 16) _mm512_storeu_ps(y, v);
    else if (valid > 0) _mm512_mask_storeu_ps(y, (__mmask16)((1u << valid) - 1), v);
}

/* Accumulators: acc[s][m][j]: s = K-split set, m = row, j = block of the pair. */
#define TILE_BODY_DENSE(MR, S, LOADW)                                                          \
    __m512 acc[S][MR][2];                                                                       \
    for (int s = 0; s < S; ++s)                                                                 \
        for (int m = 0; m < MR; ++m) acc[s][m][0] = acc[s][m][1] = _mm512_setzero_ps();        \
    int64_t k = 0;                                                                              \
    for (; k + S <= K; k += S) {                                                                \
        _Pragma("GCC unroll 4") for (int s = 0; s < S; ++s) {                                   \
            const __m512 w0 = LOADW(w0p + (k + s) * 16), w1 = LOADW(w1p + (k + s) * 16);        \
            _Pragma("GCC unroll 6") for (int m = 0; m < MR; ++m) {                              \
                const __m512 xv = _mm512_set1_ps(x[m * ldx + k + s]);                           \
                acc[s][m][0] = _mm512_fmadd_ps(xv, w0, acc[s][m][0]);                           \
                acc[s][m][1] = _mm512_fmadd_ps(xv, w1, acc[s][m][1]);                           \
            }                                                                                   \
        }                                                                                       \
    }                                                                                           \
    for (; k < K; ++k) {                                                                        \
        const __m512 w0 = LOADW(w0p + k * 16), w1 = LOADW(w1p + k * 16);                        \
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

/* Epilogue: per-channel scale (int8) and bias, then store both blocks of every row. */
static inline void finish_pair(__m512 out[][2], int MR, const float *scale, const float *bias,
                               int64_t o0, float *y, int64_t ldy, int64_t N) {
    __m512 s0 = _mm512_set1_ps(1.0f), s1 = s0, b0 = _mm512_setzero_ps(), b1 = b0;
    if (scale) { s0 = _mm512_loadu_ps(scale + o0); s1 = _mm512_loadu_ps(scale + o0 + 16); }
    if (bias) {
        const int64_t v0 = N - o0, v1 = N - o0 - 16;
        if (v0 > 0) b0 = _mm512_maskz_loadu_ps(v0 >= 16 ? 0xffff : (__mmask16)((1u << v0) - 1), bias + o0);
        if (v1 > 0) b1 = _mm512_maskz_loadu_ps(v1 >= 16 ? 0xffff : (__mmask16)((1u << v1) - 1), bias + o0 + 16);
    }
    for (int m = 0; m < MR; ++m) {
        store_lanes(y + m * ldy + o0, _mm512_fmadd_ps(out[m][0], s0, b0), N - o0);
        store_lanes(y + m * ldy + o0 + 16, _mm512_fmadd_ps(out[m][1], s1, b1), N - o0 - 16);
    }
}

#define DEFINE_DENSE_TILE(NAME, T, LOADW, MR, S)                                                \
    static void NAME(const float *x, int64_t ldx, int64_t K, const T *w0p, const float *scale,  \
                     const float *bias, int64_t o0, float *y, int64_t ldy, int64_t N) {         \
        const T *w1p = w0p + K * 16;                                                            \
        TILE_BODY_DENSE(MR, S, LOADW)                                                           \
        finish_pair(acc[0], MR, scale, bias, o0, y, ldy, N);                                    \
    }

DEFINE_DENSE_TILE(tile_i8_1, int8_t, load_int8, 1, 4)
DEFINE_DENSE_TILE(tile_i8_2, int8_t, load_int8, 2, 2)
DEFINE_DENSE_TILE(tile_i8_3, int8_t, load_int8, 3, 2)
DEFINE_DENSE_TILE(tile_i8_4, int8_t, load_int8, 4, 1)
DEFINE_DENSE_TILE(tile_i8_5, int8_t, load_int8, 5, 1)
DEFINE_DENSE_TILE(tile_i8_6, int8_t, load_int8, 6, 1)
DEFINE_DENSE_TILE(tile_bf_1, uint16_t, load_bf16, 1, 4)
DEFINE_DENSE_TILE(tile_bf_2, uint16_t, load_bf16, 2, 2)
DEFINE_DENSE_TILE(tile_bf_3, uint16_t, load_bf16, 3, 2)
DEFINE_DENSE_TILE(tile_bf_4, uint16_t, load_bf16, 4, 1)
DEFINE_DENSE_TILE(tile_bf_5, uint16_t, load_bf16, 5, 1)
DEFINE_DENSE_TILE(tile_bf_6, uint16_t, load_bf16, 6, 1)
DEFINE_DENSE_TILE(tile_f32_1, float, load_f32, 1, 4)
DEFINE_DENSE_TILE(tile_f32_2, float, load_f32, 2, 2)
DEFINE_DENSE_TILE(tile_f32_3, float, load_f32, 3, 2)
DEFINE_DENSE_TILE(tile_f32_4, float, load_f32, 4, 1)
DEFINE_DENSE_TILE(tile_f32_5, float, load_f32, 5, 1)
DEFINE_DENSE_TILE(tile_f32_6, float, load_f32, 6, 1)

typedef void (*dense_tile_fn)(const float *, int64_t, int64_t, const void *, const float *,
                              const float *, int64_t, float *, int64_t, int64_t);
static const dense_tile_fn I8_TILES[MAX_MR + 1] = {
    0, (dense_tile_fn)tile_i8_1, (dense_tile_fn)tile_i8_2, (dense_tile_fn)tile_i8_3,
    (dense_tile_fn)tile_i8_4, (dense_tile_fn)tile_i8_5, (dense_tile_fn)tile_i8_6};
static const dense_tile_fn BF_TILES[MAX_MR + 1] = {
    0, (dense_tile_fn)tile_bf_1, (dense_tile_fn)tile_bf_2, (dense_tile_fn)tile_bf_3,
    (dense_tile_fn)tile_bf_4, (dense_tile_fn)tile_bf_5, (dense_tile_fn)tile_bf_6};
static const dense_tile_fn F32_TILES[MAX_MR + 1] = {
    0, (dense_tile_fn)tile_f32_1, (dense_tile_fn)tile_f32_2, (dense_tile_fn)tile_f32_3,
    (dense_tile_fn)tile_f32_4, (dense_tile_fn)tile_f32_5, (dense_tile_fn)tile_f32_6};

/* int4: w = q * scale + min per group. Per group the tile sums x * q (q exact in fp32), then
 * adds scale * that + min * sum(x) (xs: the group sums of x, [rows][G], computed once per
 * call). q becomes a float without a convert: the bits 0x4B000000 | q are the float 2^23 + q,
 * and subtracting 2^23 is exact (one ternary-logic op and one subtract per 16 nibbles). S
 * accumulator sets take the group's column pairs in turn (S = 1 or 2). */
#define DEFINE_INT4_TILE(NAME, MR, S)                                                           \
    static void NAME(const float *x, int64_t ldx, int64_t K, const uint8_t *w0p,                \
                     const uint16_t *sc0, const uint16_t *mn0, const float *xs, int64_t group,  \
                     const float *bias, int64_t o0, float *y, int64_t ldy, int64_t N) {         \
        const int64_t G = K / group, half = group / 2;                                          \
        const uint8_t *w1p = w0p + (K / 2) * 16;                                                \
        const uint16_t *sc1 = sc0 + G * 16, *mn1 = mn0 + G * 16;                                \
        const __m512i nib = _mm512_set1_epi32(0xf), magic = _mm512_set1_epi32(0x4B000000);       \
        const __m512 two23 = _mm512_set1_ps(8388608.0f);                                        \
        __m512 out[MR][2];                                                                      \
        for (int m = 0; m < MR; ++m) out[m][0] = out[m][1] = _mm512_setzero_ps();               \
        for (int64_t g = 0; g < G; ++g) {                                                       \
            __m512 acc[S][MR][2];                                                               \
            for (int s = 0; s < S; ++s)                                                         \
                for (int m = 0; m < MR; ++m) acc[s][m][0] = acc[s][m][1] = _mm512_setzero_ps(); \
            const uint8_t *p0 = w0p + g * half * 16, *p1 = w1p + g * half * 16;                 \
            const float *xg = x + g * group;                                                    \
            for (int64_t j = 0; j < half; j += S) {                                             \
                _Pragma("GCC unroll 2") for (int s = 0; s < S; ++s) {                           \
                    const __m512i b0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p0 + (j + s) * 16))); \
                    const __m512i b1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p1 + (j + s) * 16))); \
                    const __m512 lo0 = _mm512_sub_ps(_mm512_castsi512_ps(_mm512_ternarylogic_epi32(b0, nib, magic, 0xEA)), two23); \
                    const __m512 hi0 = _mm512_sub_ps(_mm512_castsi512_ps(_mm512_or_si512(_mm512_srli_epi32(b0, 4), magic)), two23); \
                    const __m512 lo1 = _mm512_sub_ps(_mm512_castsi512_ps(_mm512_ternarylogic_epi32(b1, nib, magic, 0xEA)), two23); \
                    const __m512 hi1 = _mm512_sub_ps(_mm512_castsi512_ps(_mm512_or_si512(_mm512_srli_epi32(b1, 4), magic)), two23); \
                    _Pragma("GCC unroll 6") for (int m = 0; m < MR; ++m) {                      \
                        const __m512 xe = _mm512_set1_ps(xg[m * ldx + 2 * (j + s)]);            \
                        const __m512 xo = _mm512_set1_ps(xg[m * ldx + 2 * (j + s) + 1]);        \
                        acc[s][m][0] = _mm512_fmadd_ps(xo, hi0, _mm512_fmadd_ps(xe, lo0, acc[s][m][0])); \
                        acc[s][m][1] = _mm512_fmadd_ps(xo, hi1, _mm512_fmadd_ps(xe, lo1, acc[s][m][1])); \
                    }                                                                           \
                }                                                                               \
            }                                                                                   \
            const __m512 s0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sc0 + g * 16))); \
            const __m512 s1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sc1 + g * 16))); \
            const __m512 n0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(mn0 + g * 16))); \
            const __m512 n1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(mn1 + g * 16))); \
            for (int m = 0; m < MR; ++m) {                                                      \
                __m512 a0 = acc[0][m][0], a1 = acc[0][m][1];                                    \
                for (int s = 1; s < S; ++s) { a0 = _mm512_add_ps(a0, acc[s][m][0]); a1 = _mm512_add_ps(a1, acc[s][m][1]); } \
                const __m512 xsum = _mm512_set1_ps(xs[m * G + g]);                              \
                out[m][0] = _mm512_fmadd_ps(xsum, n0, _mm512_fmadd_ps(a0, s0, out[m][0]));      \
                out[m][1] = _mm512_fmadd_ps(xsum, n1, _mm512_fmadd_ps(a1, s1, out[m][1]));      \
            }                                                                                   \
        }                                                                                       \
        finish_pair(out, MR, 0, bias, o0, y, ldy, N);                                           \
    }

DEFINE_INT4_TILE(tile_i4_1, 1, 2)
DEFINE_INT4_TILE(tile_i4_2, 2, 2)
DEFINE_INT4_TILE(tile_i4_3, 3, 1)
DEFINE_INT4_TILE(tile_i4_4, 4, 1)
DEFINE_INT4_TILE(tile_i4_5, 5, 1)
DEFINE_INT4_TILE(tile_i4_6, 6, 1)

typedef void (*int4_tile_fn)(const float *, int64_t, int64_t, const uint8_t *, const uint16_t *,
                             const uint16_t *, const float *, int64_t, const float *, int64_t,
                             float *, int64_t, int64_t);
static const int4_tile_fn I4_TILES[MAX_MR + 1] = {0, tile_i4_1, tile_i4_2, tile_i4_3,
                                                  tile_i4_4, tile_i4_5, tile_i4_6};
#endif

/* y [M, ldy] = x [M, ldx] @ W^T + bias for the first N outputs. NB: blocks of 16 (even).
 * scale8: int8 per-channel scales [NB*16]; scales4/mins4: int4 fp16 [NB][G][16]. Returns 0,
 * or -1 when the int4 group sums could not be allocated (y is not written then). */
int graft_quant_linear(int kind, const float *x, int64_t ldx, int64_t M, int64_t K,
                        const void *w, const float *scale8, const uint16_t *scales4,
                        const uint16_t *mins4, int64_t group, const float *bias, float *y,
                        int64_t ldy, int64_t N, int64_t NB, int nthreads) {
#if GRAFT_QUANT_AVX512
    const int64_t pairs = NB / 2;
    const int64_t G = kind == KIND_INT4 ? K / group : 0;
    const int64_t block_elems = kind == KIND_INT4 ? (K / 2) * 16 : K * 16;
    const int64_t elem = kind == KIND_F32 ? 4 : kind == KIND_BF16 ? 2 : 1;
    float *xs = 0; /* int4: sum of x over each group, [M][G] */
    if (kind == KIND_INT4) {
        xs = malloc(sizeof(float) * (size_t)(M * G > 0 ? M * G : 1));
        if (!xs) return -1;
        for (int64_t m = 0; m < M; ++m)
            for (int64_t g = 0; g < G; ++g) {
                float t = 0.0f;
                for (int64_t k = g * group; k < (g + 1) * group; ++k) t += x[m * ldx + k];
                xs[m * G + g] = t;
            }
    }
    /* split the pairs of one M chunk over threads; big M also gets chunks so x stays cached */
    for (int64_t mc = 0; mc < M; mc += M_CHUNK) {
        const int64_t mend = mc + M_CHUNK < M ? mc + M_CHUNK : M;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (pairs > 1 && nthreads > 1)
        for (int64_t p = 0; p < pairs; ++p) {
            const int64_t o0 = p * 32;
            const uint8_t *wp = (const uint8_t *)w + 2 * p * block_elems * elem;
            for (int64_t m0 = mc; m0 < mend; m0 += MAX_MR) {
                const int mr = (int)(mend - m0 < MAX_MR ? mend - m0 : MAX_MR);
                const float *xm = x + m0 * ldx;
                float *ym = y + m0 * ldy;
                if (kind == KIND_INT4)
                    I4_TILES[mr](xm, ldx, K, wp, scales4 + 2 * p * G * 16, mins4 + 2 * p * G * 16,
                                 xs + m0 * G, group, bias, o0, ym, ldy, N);
                else
                    (kind == KIND_INT8 ? I8_TILES : kind == KIND_BF16 ? BF_TILES : F32_TILES)[mr](
                        xm, ldx, K, wp, kind == KIND_INT8 ? scale8 : 0, bias, o0, ym, ldy, N);
            }
        }
    }
    free(xs);
    return 0;
#else
    (void)NB;
    qlinear_portable(kind, x, ldx, M, K, (const uint8_t *)w, scale8, scales4, mins4, group,
                     bias, y, ldy, N, nthreads);
    return 0;
#endif
}

/* The portable path, callable on any build (tests compare it with the vector path). */
void graft_quant_linear_portable(int kind, const float *x, int64_t ldx, int64_t M, int64_t K,
                                 const void *w, const float *scale8, const uint16_t *scales4,
                                 const uint16_t *mins4, int64_t group, const float *bias,
                                 float *y, int64_t ldy, int64_t N, int nthreads) {
    qlinear_portable(kind, x, ldx, M, K, (const uint8_t *)w, scale8, scales4, mins4, group,
                     bias, y, ldy, N, nthreads);
}
