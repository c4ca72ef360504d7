/* int8, int4 and bf16 weight-only linears on AMX tiles, for many rows (prefill, batched decode):
 * y[M, N] = x[M, K] @ dequant(W)^T + bias, x and y fp32 (bf16 for a bf16 engine's bf16 calls,
 * graft_quant_amx_bf16_io), in the layouts of quant_linear_cpu.c and quant_vnni_cpu.c, read as
 * they are.
 *
 * Why: from ~8 rows on, the vector paths are bound by their multiply instructions, not by
 * the weight's bytes (int8 at 32 rows: 3 vpdpbusd per 4 columns, row and 16 outputs). One
 * AMX tile product does 16 x 16 x 64 int8 (or x 32 bf16) multiply-adds.
 *
 * The activations enter as the vector paths make them, with fp32 accuracy kept:
 *   int8: the three base-256 digits of the row's 24-bit fixed point (quant_vnni_cpu.c
 *         prep_row), [M][3][K] bytes, i.e. a matrix of 3M rows: digit p of row m is row 3m + p.
 *         TDPBSUD (signed digits x unsigned q + 128) gives each digit's exact int32 dot
 *         product, combined as the VNNI path does, so the outputs are bit-identical to it.
 *   int4: the same digits against the nibbles unpacked to bytes, per group (amx_int4).
 *   bf16: x = hi + mid + lo, three bf16 pieces (each the round-to-nearest of what the ones
 *         before left), exact for normal fp32 values; TDPBF16PS multiplies bf16 exactly
 *         and adds in fp32, and the three pieces' products are summed at the end.
 * Either way the weights' tile rows are the layouts' 64-byte steps: 16 output lanes x 4 int8
 * columns or x 2 bf16 columns, a block's steps 128 bytes apart (the pair's blocks alternate).
 * Each tile computes 32 rows of that 3M-row matrix x 32 outputs (one pair of blocks), the
 * pieces are combined per row of x afterwards.
 *
 * What bounds it (measured on a 2-core Xeon VM with AMX, docs/benchmarks.md): the tile
 * product runs at 1.5 TMAC/s a core from L1, as fast with one operand streaming from L2,
 * about 30% slower with both from L2, and ten times slower with the weights streaming from
 * memory. So W is read from memory once a pass of rows, and the pass is as long as L2 keeps
 * its rows while every pair of a thread goes by (passes of 96 rows spent most of their time
 * waiting on W); long rows are cut in K blocks to keep that so; each tile runs its K block
 * whole (storing its accumulators is slow: once, not every 256 columns); and the next
 * weights are prefetched while the tiles multiply.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AMX_BF16__) && \
    defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__linux__)
#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "amx_tiles.h"
#include "quant_epilogue.h"
#define GRAFT_QUANT_AMX 1
#else
#define GRAFT_QUANT_AMX 0
#endif

enum { KIND_INT8 = 0, KIND_BF16 = 2 };
#define PIECES 3
#define M_CHUNK 96 /* int4: rows of x per pass over W: 288 piece rows = 9 tiles of 32 */
#define A_BUDGET (1 << 20) /* bytes of piece rows (one K block) a pass over W keeps in L2 */
#define W_BUDGET (512 << 10) /* bytes of W (one K block) a block of pairs keeps in L2 */
#define PASS_ROWS 256 /* piece rows a pass takes at least: longer rows are cut in K blocks */
#define MIN_ROWS 8  /* fewer rows: the vector paths (measured, docs/quantization.md) */

/* Byte offset of piece row r in the tile blocks of rows with K columns, `chunk` columns per
 * 64 bytes (int8 64, bf16 32): blocks of 32 rows, each chunk by chunk ([32][64] bytes). */
static inline int64_t amx_row(int64_t r, int64_t K, int64_t chunk) {
    return (r / 32) * (K / chunk) * 2048 + (r % 32) * 64;
}
int64_t graft_quant_amx_row(int64_t r, int64_t K, int64_t chunk) { return amx_row(r, K, chunk); }

/* Piece rows from..to of those blocks set to zero (they fill the last tile). */
void graft_quant_amx_zero_rows(uint8_t *blocks, int64_t from, int64_t to, int64_t K, int64_t chunk) {
    for (int64_t r = from; r < to; ++r)
        for (int64_t c = 0; c < K / chunk; ++c) memset(blocks + amx_row(r, K, chunk) + c * 2048, 0, 64);
}

/* Whether a call of M rows and K columns suits AMX (K a whole number of 64-byte chunks). That
 * this CPU runs AMX at all (and GRAFT_CPU_ISA does not cap it) is the dispatcher's decision,
 * quant_linear_cpu.c: it calls the AMX paths, directly or through the VNNI one, only then. */
int graft_quant_amx_applies(int64_t M, int64_t K, int64_t chunk) {
    return M >= MIN_ROWS && K % chunk == 0;
}

#if GRAFT_QUANT_AMX
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* Linux hands out the 8 KB tile state only to processes that ask for it. */
static int amx_permitted(void) {
    static int state = -1; /* asked once; the first call comes from the loading thread */
    if (state < 0) state = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    return state;
}

/* Tiles (configure_tiles, amx_tiles.h) 0-3: the 2 x 2 accumulators (16 rows x 16
 * int32/fp32); 4, 5: two 16-row slices of the activation pieces; 6, 7: the pair's two weight
 * blocks, 16 steps each. */

/* The 2 x 2 accumulators (tiles 0-3) to or from acc [32 rows][32 lanes of 4 bytes]. */
static inline void store_acc(void *acc) {
    char *c = (char *)acc;
    _tile_stored(0, c, 128);
    _tile_stored(1, c + 64, 128);
    _tile_stored(2, c + 16 * 128, 128);
    _tile_stored(3, c + 16 * 128 + 64, 128);
}
static inline void load_acc(const void *acc) {
    const char *c = (const char *)acc;
    _tile_loadd(0, c, 128);
    _tile_loadd(1, c + 64, 128);
    _tile_loadd(2, c + 16 * 128, 128);
    _tile_loadd(3, c + 16 * 128 + 64, 128);
}

/* One step of the 2 x 2 block: the two 16-row slices of a (tile blocks: 1 KB apart, rows 64
 * bytes apart) times the pair's two weight tiles b0, b1 (rows bstride bytes apart). */
static inline void tile_step(int kind, const uint8_t *a, const uint8_t *b0, const uint8_t *b1,
                             int bstride) {
    _tile_loadd(6, b0, bstride);
    _tile_loadd(7, b1, bstride);
    _tile_loadd(4, a, 64);
    _tile_loadd(5, a + 1024, 64);
    if (kind == KIND_INT8) { /* int4 too: signed digits x unsigned bytes */
        _tile_dpbsud(0, 4, 6);
        _tile_dpbsud(1, 4, 7);
        _tile_dpbsud(2, 5, 6);
        _tile_dpbsud(3, 5, 7);
    } else {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
}

/* Row i of the chunk from its piece rows in cbuf: int8 as quant_vnni_cpu.c combines its
 * accumulators (the +128 offset of the weights taken off first), bf16 as (hi + mid) + lo, or
 * hi alone where x was bf16 already (mid and lo would add zeros). */
static inline void combine_row(int kind, int pieces, const void *cbuf, int64_t i,
                               const int32_t *dsum, __m512 out[1][2]) {
    for (int h = 0; h < 2; ++h) {
        if (kind == KIND_BF16 && pieces == 1) {
            out[0][h] = _mm512_loadu_ps((const float *)cbuf + i * 32 + h * 16);
        } else if (kind == KIND_INT8) {
            const int32_t *c = (const int32_t *)cbuf + 3 * i * 32 + h * 16;
            __m512i a[PIECES];
            for (int p = 0; p < PIECES; ++p)
                a[p] = _mm512_sub_epi32(_mm512_loadu_si512(c + p * 32), _mm512_set1_epi32(128 * dsum[p]));
            out[0][h] = combine_digits(a[0], a[1], a[2]);
        } else {
            const float *c = (const float *)cbuf + 3 * i * 32 + h * 16;
            out[0][h] = _mm512_add_ps(_mm512_add_ps(_mm512_loadu_ps(c), _mm512_loadu_ps(c + 32)),
                                      _mm512_loadu_ps(c + 64));
        }
    }
}

/* How a call is cut (bf16 and int8 alike: W's 64-byte chunks, 2 KB a pair's chunk): rows in
 * passes over W, each pass's K in blocks of kb chunks, the pairs in blocks of pblock, so that
 * a pass's piece rows of one K block stay in L2 while every pair passes over them, and a
 * block of pairs' weights while the pass's rows do. */
typedef struct {
    int64_t rows, kb, pblock;
} amx_plan;

static amx_plan plan_call(int pieces, int64_t chunks, int64_t M) {
    amx_plan pl;
    const int64_t blocks = (chunks * PASS_ROWS * 64 + A_BUDGET - 1) / A_BUDGET; /* of K */
    pl.kb = (chunks + blocks - 1) / blocks;
    pl.rows = A_BUDGET / (pieces * pl.kb * 64) / 32 * 32;
    if (pl.rows < 32) pl.rows = 32;
    if (pl.rows > M) pl.rows = M;
    pl.pblock = W_BUDGET / (pl.kb * 2048);
    if (pl.pblock < 1) pl.pblock = 1;
    return pl;
}

/* 16 lanes rounded to bf16 as bf16.h's float_to_bf16 rounds (nearest even in integers: NaN
 * stays NaN, denormals kept). */
static inline __m256i round_bf16(__m512 v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    return _mm512_cvtepi32_epi16(
        _mm512_mask_mov_epi32(r, nan, _mm512_srli_epi32(_mm512_or_si512(u, _mm512_set1_epi32(0x400000)), 16)));
}

/* A row's 32 outputs from o0 plus bias (0 without one: -0 sums become +0, as finish_pair's
 * fp32 route gives them), rounded into row (bf16). */
static inline void finish_pair_bf16(__m512 sums[1][2], const float *bias, int64_t o0, uint16_t *row, int64_t N) {
    __m512 b[2];
    __m256i h[2];
    load_bias_pair(bias, o0, N, b);
    for (int k = 0; k < 2; ++k) h[k] = round_bf16(_mm512_add_ps(sums[0][k], b[k]));
    uint16_t *at = row + o0;
    if (N - o0 >= 32) { /* one 64-byte store: two masked halves ran slower */
        _mm512_storeu_si512((void *)at, _mm512_inserti64x4(_mm512_castsi256_si512(h[0]), h[1], 1));
        return;
    }
    for (int k = 0; k < 2; ++k) _mm256_mask_storeu_epi16(at + 16 * k, lane_mask(N - o0 - 16 * k), h[k]);
}

/* What a call's rows need to be finished: combine_row's inputs and the output's. */
typedef struct {
    int kind, pieces;
    const int32_t *dsum;
    const float *rs, *scale8, *bias;
    float *y;
    uint16_t *out;
    int64_t ldy, ldo, N;
} amx_call;

/* Rows i0..i1 of the 32 from x's row r0 whose piece rows' sums for pair p are in cbuf: to y
 * (fp32) or out (bf16). */
static inline void finish_rows(const amx_call *c, const float *cbuf, int64_t r0, int64_t i0, int64_t i1,
                               int64_t p) {
    for (int64_t i = i0; i < i1; ++i) {
        __m512 sums[1][2];
        const int64_t m = r0 + i;
        combine_row(c->kind, c->pieces, cbuf, i, c->kind == KIND_INT8 ? c->dsum + m * PIECES : 0, sums);
        if (c->out)
            finish_pair_bf16(sums, c->bias, p * 32, c->out + m * c->ldo, c->N);
        else
            finish_pair(sums, 1, c->rs ? c->rs + m : 0, c->kind == KIND_INT8 ? c->scale8 : 0, c->bias, p * 32,
                        c->y + m * c->ldy, c->ldy, c->N);
    }
}

/* a: the piece rows (`pieces` per row of x, zero rows up to a multiple of 32) in 32-row
 * blocks. y: fp32 out; or, with out, bf16 rows `ldo` apart (y unused), rounded as torch's
 * .to(bfloat16) rounds. Returns 0; -1 when the accumulators' scratch could not be allocated
 * (nothing written then). Each thread takes its share of the pairs; a tile (32 piece rows x
 * a pair) runs one K block at a time; once K is whole, the tile's rows are combined and
 * stored while the next tile multiplies (the vector units are free while the tiles work). */
static int amx_linear(int kind, int pieces, const uint8_t *a, int64_t M, int64_t chunks,
                      const uint8_t *w, int64_t block_bytes, const int32_t *dsum, const float *rs,
                      const float *scale8, const float *bias, float *y, int64_t ldy, int64_t N,
                      int64_t NB, int nthreads, uint16_t *out, int64_t ldo) {
    const int64_t pairs = NB / 2, team = nthreads > 1 && pairs > 1 ? nthreads : 1;
    const amx_plan pl = plan_call(pieces, chunks, M);
    const amx_call call = {kind, pieces, dsum, rs, scale8, bias, y, out, ldy, ldo, N};
    /* with K in blocks, each tile's sums wait between them: per thread, the pass's groups of
     * 32 rows x its pairs x the group's piece blocks, 4 KB each */
    const int64_t tiles = (pl.rows + 31) / 32 * ((pairs + team - 1) / team) * pieces;
    float *accs = pl.kb < chunks ? aligned_alloc(64, sizeof(float) * 1024 * (size_t)(tiles * team)) : 0;
    if (pl.kb < chunks && !accs) return -1;
#pragma omp parallel num_threads(team)
    {
        float cbuf[2][PIECES * 1024] __attribute__((aligned(64))); /* a finished tile's sums, two by turns */
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
        const int64_t p_begin = pairs * t / nt, p_end = pairs * (t + 1) / nt, tp = p_end - p_begin;
        /* the thread's pairs in blocks of equal size, none above the plan's */
        const int64_t nblocks = (tp + pl.pblock - 1) / pl.pblock, pblock = nblocks ? (tp + nblocks - 1) / nblocks : 1;
        float *acc = accs ? accs + 1024 * tiles * t : 0;
        int prev = -1; /* the buffer of the tile whose rows are finished while the next one runs */
        int64_t prev_r0 = 0, prev_n = 0, prev_p = 0;
        configure_tiles();
        for (int64_t mc = 0; mc < M; mc += pl.rows) {
            const int64_t rows = M - mc < pl.rows ? M - mc : pl.rows, groups = (rows + 31) / 32;
            for (int64_t k0 = 0; k0 < chunks; k0 += pl.kb) {
                const int64_t k1 = k0 + pl.kb < chunks ? k0 + pl.kb : chunks, kn = k1 - k0;
                for (int64_t pb = p_begin; pb < p_end; pb += pblock) {
                    const int64_t pe = pb + pblock < p_end ? pb + pblock : p_end;
                    /* the weights of the next block (pairs, K, or pass), prefetched a share a
                     * step (in bursts they stalled), so that its first tiles do not wait on memory */
                    int64_t np0 = pe, nk0 = k0, nk1 = k1;
                    if (pe >= p_end) {
                        np0 = p_begin;
                        nk0 = k1 < chunks ? k1 : mc + pl.rows < M ? 0 : chunks;
                        nk1 = nk0 + pl.kb < chunks ? nk0 + pl.kb : chunks;
                    }
                    const int64_t np = np0 + pblock < p_end ? pblock : p_end - np0;
                    const int64_t per_pair = nk1 > nk0 ? (nk1 - nk0) * 32 : 0; /* lines */
                    const int64_t steps = groups * (pe - pb) * pieces * kn;
                    const int64_t per_step = (np * per_pair + steps - 1) / steps;
                    int64_t lp = 0, lo = 0; /* the next line: pair np0 + lp, line lo of its part */
                    for (int64_t g = 0; g < groups; ++g) {
                        const int64_t r0 = mc + 32 * g, n = rows - 32 * g < 32 ? rows - 32 * g : 32;
                        const int64_t nb = (n * pieces + 31) / 32, tile_steps = nb * kn;
                        for (int64_t p = pb; p < pe; ++p) {
                            const uint8_t *wp = w + 2 * p * block_bytes;
                            float *slot = acc ? acc + ((g * tp) + (p - p_begin)) * pieces * 1024 : 0;
                            float *cb = k1 == chunks ? cbuf[prev == 0] : slot;
                            const int64_t share = (prev_n + tile_steps - 1) / tile_steps;
                            int64_t done = prev < 0 ? prev_n : 0; /* the previous tile's rows finished */
                            for (int64_t b = 0; b < nb; ++b) {
                                const uint8_t *ab = a + (r0 * pieces / 32 + b) * chunks * 2048;
                                if (k0 == 0) {
                                    _tile_zero(0);
                                    _tile_zero(1);
                                    _tile_zero(2);
                                    _tile_zero(3);
                                } else {
                                    load_acc(slot + b * 1024);
                                }
                                for (int64_t c = k0; c < k1; ++c) {
                                    tile_step(kind, ab + c * 2048, wp + c * 2048, wp + c * 2048 + 64, 128);
                                    /* the previous tile's rows, a share a step: the core
                                     * finishes them while the tiles multiply */
                                    if (done < prev_n) {
                                        const int64_t to = done + share < prev_n ? done + share : prev_n;
                                        finish_rows(&call, cbuf[prev], prev_r0, done, to, prev_p);
                                        done = to;
                                    }
                                    for (int64_t e = 0; e < per_step && lp < np; ++e) {
                                        __builtin_prefetch(w + 2 * (np0 + lp) * block_bytes + nk0 * 2048 + 64 * lo, 0, 3);
                                        if (++lo == per_pair) lo = 0, ++lp;
                                    }
                                }
                                store_acc(cb + b * 1024);
                            }
                            if (done < prev_n) finish_rows(&call, cbuf[prev], prev_r0, done, prev_n, prev_p);
                            if (k1 == chunks) { /* this tile's rows are finished during the next */
                                prev = cb == cbuf[1];
                                prev_r0 = r0;
                                prev_n = n;
                                prev_p = p;
                            } else if (prev >= 0) {
                                prev = -1;
                            }
                        }
                    }
                }
            }
        }
        if (prev >= 0) finish_rows(&call, cbuf[prev], prev_r0, 0, prev_n, prev_p);
        _tile_release();
    }
    free(accs);
    return 0;
}

/* int4: tiles as configure_tiles, but the activation slices `cols` bytes wide and the weight
 * tiles cols / 4 rows (a group of 32 columns is half a 64-column chunk). */
static void configure_int4_tiles(int cols) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; ++t) {
        cfg.colsb[t] = t == 4 || t == 5 ? cols : 64;
        cfg.rows[t] = t >= 6 ? cols / 4 : 16;
    }
    _tile_loadconfig(&cfg);
}

/* Steps j0..j0+n of the pair at wp as int8 tile rows: step j's low nibbles are columns
 * 8j..8j+3 (row 2j), its high nibbles 8j+4..8j+7 (row 2j + 1); bbuf [2 blocks][2n][64]. */
static void unpack_int4(const uint8_t *wp, int64_t j0, int n, uint8_t *bbuf) {
    const __m512i nib = _mm512_set1_epi8(0x0f);
    for (int b = 0; b < 2; ++b)
        for (int j = 0; j < n; ++j) {
            const __m512i v = _mm512_loadu_si512(wp + (j0 + j) * 128 + b * 64);
            _mm512_storeu_si512(bbuf + (b * 2 * n + 2 * j) * 64, _mm512_and_si512(v, nib));
            _mm512_storeu_si512(bbuf + (b * 2 * n + 2 * j + 1) * 64,
                                _mm512_and_si512(_mm512_srli_epi32(v, 4), nib));
        }
}

/* int4 per group, as quant_vnni_cpu.c's int4 tile: out += scale_g * (the digits' combined
 * int32 sums) + min_g * xs_g, in the same order, so the outputs are the VNNI path's. The
 * digits' tile products run per group (each group its own scale): per pair and group, every
 * row block's sums go to cbuf, then each row of x folds its three digit rows into out. */
static void amx_int4(const uint8_t *a, int64_t M, int64_t K, const uint8_t *w, const float *xs,
                     const float *rs, const uint16_t *scales4, const uint16_t *mins4,
                     int64_t group, const float *bias, float *y, int64_t ldy, int64_t N,
                     int64_t NB, int nthreads) {
    const int64_t pairs = NB / 2, G = K / group, chunks = K / 64;
    const int cols = group < 64 ? (int)group : 64, per = (int)(group / cols); /* slices a group */
#pragma omp parallel num_threads(nthreads) if (nthreads > 1 && pairs > 1)
    {
        int32_t cbuf[M_CHUNK * PIECES * 32] __attribute__((aligned(64)));
        float out[M_CHUNK][32] __attribute__((aligned(64)));
        uint8_t bbuf[2 * 32 * 64] __attribute__((aligned(64))); /* a group of <= 128 columns */
        configure_int4_tiles(cols);
        for (int64_t mc = 0; mc < M; mc += M_CHUNK) {
            const int64_t rows = (M - mc < M_CHUNK ? M - mc : M_CHUNK), prows = rows * PIECES;
#pragma omp for schedule(static)
            for (int64_t p = 0; p < pairs; ++p) {
                const uint8_t *wp = w + p * K * 16; /* the pair: K / 8 steps of 128 bytes */
                const uint16_t *sc = scales4 + p * G * 64, *mn = mins4 + p * G * 64;
                memset(out, 0, sizeof(float) * 32 * (size_t)rows);
                for (int64_t g = 0; g < G; ++g) {
                    unpack_int4(wp, g * group / 8, (int)(group / 8), bbuf);
                    for (int64_t r0 = 0; r0 < prows; r0 += 32) {
                        const uint8_t *ab = a + (mc * PIECES + r0) / 32 * chunks * 2048;
                        _tile_zero(0);
                        _tile_zero(1);
                        _tile_zero(2);
                        _tile_zero(3);
                        for (int s = 0; s < per; ++s) {
                            const int64_t col = g * group + s * cols;
                            const uint8_t *b0 = bbuf + (size_t)(s * cols / 4) * 64; /* block 0's rows */
                            tile_step(KIND_INT8, ab + col / 64 * 2048 + col % 64, b0, b0 + group / 4 * 64, 64);
                        }
                        store_acc(cbuf + r0 * 32);
                    }
                    __m512 sv[2], nv[2];
                    for (int h = 0; h < 2; ++h) {
                        sv[h] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sc + g * 64 + h * 16)));
                        nv[h] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(mn + g * 64 + h * 16)));
                    }
                    for (int64_t i = 0; i < rows; ++i) {
                        const __m512 xsum = _mm512_set1_ps(xs[(mc + i) * G + g]);
                        for (int h = 0; h < 2; ++h) {
                            const int32_t *c = cbuf + 3 * i * 32 + h * 16;
                            const __m512 comb = combine_digits(_mm512_loadu_si512(c), _mm512_loadu_si512(c + 32),
                                                               _mm512_loadu_si512(c + 64));
                            _mm512_store_ps(out[i] + h * 16,
                                            _mm512_fmadd_ps(xsum, nv[h], _mm512_fmadd_ps(comb, sv[h], _mm512_load_ps(out[i] + h * 16))));
                        }
                    }
                }
                for (int64_t i = 0; i < rows; ++i) {
                    __m512 o[1][2] = {{_mm512_loadu_ps(out[i]), _mm512_loadu_ps(out[i] + 16)}};
                    finish_pair(o, 1, rs + mc + i, 0, bias, p * 32, y + (mc + i) * ldy, ldy, N);
                }
            }
        }
        _tile_release();
    }
}

/* 1 when every x is a bf16 value already (a bf16 engine's activations, upcast): hi alone is
 * x; 3 when the pieces are needed; 0 when a row holds inf or NaN (the split cannot carry
 * them: the FMA path runs instead). */
static int pieces_needed(const float *x, int64_t ldx, int64_t M, int64_t K, int nthreads) {
    int exact = 1, finite = 1;
#pragma omp parallel for num_threads(nthreads) reduction(&& : exact, finite) if (nthreads > 1 && M > 1)
    for (int64_t m = 0; m < M; ++m)
        for (int64_t k = 0; k < K; k += 16) {
            const __m512 r = _mm512_loadu_ps(x + m * ldx + k);
            finite = finite && !_mm512_cmp_ps_mask(_mm512_abs_ps(r), _mm512_set1_ps(3.4028235e38f), _CMP_NLE_UQ);
            exact = exact && !_mm512_test_epi32_mask(_mm512_castps_si512(r), _mm512_set1_epi32(0xffff));
        }
    return !finite ? 0 : exact ? 1 : PIECES;
}

/* x = hi + mid + lo in bf16 (or hi alone: pieces 1), piece p of row m as row pieces * m + p of
 * the blocks. */
static void split_bf16(const float *x, int64_t ldx, int64_t M, int64_t K, int pieces, uint8_t *out,
                       int nthreads) {
#pragma omp parallel for num_threads(nthreads) if (nthreads > 1 && M > 1)
    for (int64_t m = 0; m < M; ++m)
        for (int64_t k = 0; k < K; k += 16) {
            __m512 r = _mm512_loadu_ps(x + m * ldx + k);
            for (int p = 0; p < pieces; ++p) {
                const __m256bh b = _mm512_cvtneps_pbh(r);
                uint8_t *at = out + amx_row(m * pieces + p, K, 32) + k / 32 * 2048 + k % 32 * 2;
                _mm256_storeu_si256((__m256i *)at, (__m256i)b);
                r = _mm512_sub_ps(r, _mm512_castsi512_ps(
                                         _mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)b), 16)));
            }
        }
}

/* bf16 rows x (K a multiple of 32) into the blocks as they are: one piece per row. 0 when a
 * value is inf or NaN (the fp32 route's split cannot carry them and takes the FMA path, so
 * this one leaves them to the dot products, which do as that path does), else 1. */
static int copy_bf16_rows(const uint16_t *x, int64_t ldx, int64_t M, int64_t K, uint8_t *out,
                          int nthreads) {
    const __m512i exp = _mm512_set1_epi16(0x7f80);
    int finite = 1;
#pragma omp parallel for num_threads(nthreads) reduction(&& : finite) if (nthreads > 1 && M > 1)
    for (int64_t m = 0; m < M; ++m) {
        uint8_t *row = out + amx_row(m, K, 32);
        for (int64_t k = 0; k < K; k += 32) {
            const __m512i r = _mm512_loadu_si512(x + m * ldx + k);
            finite = finite && !_mm512_cmpeq_epi16_mask(_mm512_and_si512(r, exp), exp);
            _mm512_storeu_si512(row + k / 32 * 2048, r);
        }
    }
    return finite;
}
#endif

int graft_quant_amx(void) {
#if GRAFT_QUANT_AMX
    return amx_permitted();
#else
    return 0;
#endif
}

/* int8 (quant_vnni_cpu.c calls it after making the digits, when graft_quant_amx_applies):
 * dig: the 3M digit rows, then zero rows up to a multiple of 32, in the blocks of
 * graft_quant_amx_row; dsum [M][3] the digit sums (one chunk); rs [M] the rows' steps.
 * Returns 0; -1 when scratch could not be allocated (y is not written then). */
int graft_quant_amx_i8(const int8_t *dig, int64_t KP, const int32_t *dsum, const float *rs,
                        int64_t M, const void *w, const float *scale8, const float *bias, float *y,
                        int64_t ldy, int64_t N, int64_t NB, int nthreads) {
#if GRAFT_QUANT_AMX
    return amx_linear(KIND_INT8, PIECES, (const uint8_t *)dig, M, KP / 64, (const uint8_t *)w, KP * 16,
                      dsum, rs, scale8, bias, y, ldy, N, NB, nthreads, 0, 0);
#else
    (void)dig; (void)KP; (void)dsum; (void)rs; (void)M; (void)w; (void)scale8; (void)bias;
    (void)y; (void)ldy; (void)N; (void)NB; (void)nthreads;
    return 0;
#endif
}

/* int4 (quant_vnni_cpu.c calls it after making the digits and xs, when graft_quant_amx_applies
 * and the group is 64 or 128; 32 works too): dig as for int8 (K a multiple of 64); xs [M][G] the group
 * sums of x over each row's step; scales4/mins4 as quant_vnni_cpu.c describes. */
void graft_quant_amx_i4(const int8_t *dig, int64_t K, const float *xs, const float *rs, int64_t M,
                        const void *w, const uint16_t *scales4, const uint16_t *mins4,
                        int64_t group, const float *bias, float *y, int64_t ldy, int64_t N,
                        int64_t NB, int nthreads) {
#if GRAFT_QUANT_AMX
    amx_int4((const uint8_t *)dig, M, K, (const uint8_t *)w, xs, rs, scales4, mins4, group, bias, y,
             ldy, N, NB, nthreads);
#else
    (void)dig; (void)K; (void)xs; (void)rs; (void)M; (void)w; (void)scales4; (void)mins4;
    (void)group; (void)bias; (void)y; (void)ldy; (void)N; (void)NB; (void)nthreads;
#endif
}

/* bf16 weights, fp32 x: K a multiple of 32; called by the dispatcher only where AMX runs.
 * Returns 0; 1 when this path does not apply (no AMX in this build, too few rows, K not a
 * multiple of 32, inf or NaN in x: the caller runs the FMA path); -1 when scratch could not be
 * allocated. */
int graft_quant_amx_bf16(const float *x, int64_t ldx, int64_t M, int64_t K, const void *w,
                         const float *bias, float *y, int64_t ldy, int64_t N, int64_t NB,
                         int nthreads) {
#if GRAFT_QUANT_AMX
    if (!graft_quant_amx_applies(M, K, 32)) return 1;
    const int pieces = pieces_needed(x, ldx, M, K, nthreads);
    if (!pieces) return 1;
    const int64_t rows = (M * pieces + 31) / 32 * 32, bytes = rows * K * 2;
    uint8_t *a = aligned_alloc(64, (size_t)bytes);
    if (!a) return -1;
    graft_quant_amx_zero_rows(a, M * pieces, rows, K, 32);
    split_bf16(x, ldx, M, K, pieces, a, nthreads);
    const int status = amx_linear(KIND_BF16, pieces, a, M, K / 32, (const uint8_t *)w, K * 32, 0, 0, 0,
                                  bias, y, ldy, N, NB, nthreads, 0, 0);
    free(a);
    return status;
#else
    (void)x; (void)ldx; (void)M; (void)K; (void)w; (void)bias; (void)y; (void)ldy; (void)N;
    (void)NB; (void)nthreads;
    return 1;
#endif
}

/* bf16 x [M, ldx] in, bf16 y [M, ldy] out (a bf16 engine's calls; quant_bf16dot_cpu.c's
 * graft_quant_bf16_io calls it where AMX runs): graft_quant_amx_bf16 on x widened, then
 * rounded, bit for bit, without those two conversions. Returns 0; 1 when this path does not
 * apply (as graft_quant_amx_bf16, inf or NaN included); -1 when scratch could not be had. */
int graft_quant_amx_bf16_io(const uint16_t *x, int64_t ldx, int64_t M, int64_t K, const void *w,
                            const float *bias, uint16_t *y, int64_t ldy, int64_t N, int64_t NB,
                            int nthreads) {
#if GRAFT_QUANT_AMX
    if (!graft_quant_amx_applies(M, K, 32)) return 1;
    const int64_t rows = (M + 31) / 32 * 32;
    uint8_t *a = aligned_alloc(64, (size_t)(rows * K * 2));
    int status = !a ? -1 : copy_bf16_rows(x, ldx, M, K, a, nthreads) ? 0 : 1;
    if (status == 0) {
        graft_quant_amx_zero_rows(a, M, rows, K, 32);
        status = amx_linear(KIND_BF16, 1, a, M, K / 32, (const uint8_t *)w, K * 32, 0, 0, 0, bias, 0, 0,
                            N, NB, nthreads, y, ldy);
    }
    free(a);
    return status;
#else
    (void)x; (void)ldx; (void)M; (void)K; (void)w; (void)bias; (void)y; (void)ldy; (void)N;
    (void)NB; (void)nthreads;
    return 1;
#endif
}
