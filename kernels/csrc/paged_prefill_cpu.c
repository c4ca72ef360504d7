/* Paged-attention prefill on CPU: each sequence's chunk of queries (its last q_len positions)
 * attends causally to its n cached tokens, walking the block table in place.
 *
 * Why C and not torch's SDPA (the reference): torch's CPU flash attention takes keys 512 at a
 * time, so a causal 512-token prompt computes every score of the square (no block lies wholly
 * above the diagonal), and the reference first gathers the blocks into a padded copy. Its
 * 512-token fp32 prefill of SmolLM2-135M ran at 58 GFLOP/s of the causal products, 21% of an
 * embedding step (docs/benchmarks.md, "Prefill attention in C").
 *
 * The work items are (sequence, kv head, QT query positions): the group's G query heads at
 * QT positions are the R = G * QT rows of one tile (row r: position r / G, head r % G), so
 * every key row is read once for the whole group. The rows are kept transposed, [D][R] (Q,
 * the output accumulator) and [keys][R] (scores), so both products are "a broadcast cache
 * value times LANES rows": scores[j][r] = sum_d K[j][d] Q[d][r], out[d][r] += sum_j V[j][d]
 * P[j][r]. The key and value rows are read where they lie in the cache (fp32), or converted
 * KT rows at a time (bf16, fp16, int8 with its scale); nothing is transposed but the tile's
 * queries and outputs, once per item. Softmax is online (running max and sum per row), in
 * fp32, one pass over KT keys at a time; a block of keys that lies wholly after a row chunk's
 * last position is skipped. An item's result depends neither on the batch nor on the threads.
 *
 * Layouts (contiguous): q/out [T, Hq, D]; caches [num_blocks, block_size, Hkv, D]; block_tables
 * [S, max_blocks] int32; cu_seqlens [S + 1], context_lens [S] int32. dtypes as
 * paged_decode_cpu.c: 0 fp32, 1 bf16, 2 fp16, 3 int8 (caches only, scales [num_blocks,
 * block_size, Hkv] fp32).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "fast_exp.h"
#include "paged_common.h"

#if defined(__GNUC__) && !defined(__clang__)
#define PREFILL_BUILT 1
/* LANES rows a vector: 16 with AVX-512, else 8 (GCC keeps no 64-byte vector in registers
 * without AVX-512). KB keys x NR vectors of rows per score block (24 accumulators of 32
 * registers; 12 of 16 on AVX2, 1.15x the 8 of KB 4 there), DB dims x NR per output block. */
#ifdef __AVX512F__
#define LANES 16
#define NR 4
#define KB 6
typedef v16f vf;
typedef v16i vi;
#define EXP_NEG exp_neg16
#else
#define LANES 8
#define NR 2
#define KB 6
typedef v8f vf;
typedef v8i vi;
#define EXP_NEG exp_neg8
#endif
#define DB 4  /* dims of an output block: head_dim is a multiple of it */
#define KT 64 /* keys a pass */
#define ROWS 128 /* rows a tile: QT = ROWS / G positions (one when G > ROWS) */

static inline vf loadv(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void storev(float *p, vf v) { memcpy(p, &v, sizeof v); }

/* d values at element `at` of an fp32, bf16 or fp16 tensor into (or from) fp32 `row`: one
 * loop per dtype, so each vectorizes */
static inline void load_row(const void *base, int64_t at, int64_t d, int dtype, float *row) {
    if (dtype == F32) {
        memcpy(row, (const float *)base + at, sizeof(float) * (size_t)d);
        return;
    }
    const uint16_t *src = (const uint16_t *)base + at;
    if (dtype == BF16)
        for (int64_t e = 0; e < d; ++e) row[e] = bf16_to_float(src[e]);
    else
        for (int64_t e = 0; e < d; ++e) row[e] = f16_to_float(src[e]);
}

static inline void store_row(void *base, int64_t at, int64_t d, int dtype, const float *row) {
    if (dtype == F32) {
        memcpy((float *)base + at, row, sizeof(float) * (size_t)d);
        return;
    }
    uint16_t *dst = (uint16_t *)base + at;
    if (dtype == BF16)
        for (int64_t e = 0; e < d; ++e) dst[e] = float_to_bf16(row[e]);
    else
        for (int64_t e = 0; e < d; ++e) dst[e] = float_to_f16(row[e]);
}

/* Row (slot, head) of a cache as fp32: a pointer into an fp32 cache, else converted into buf. */
static inline const float *cache_row(const void *cache, const float *scales, int64_t slot,
                                     int64_t kvh, int64_t kv_heads, int64_t d, int cd,
                                     float *buf) {
    const int64_t at = (slot * kv_heads + kvh) * d;
    if (cd == F32) return (const float *)cache + at;
    if (cd == I8) {
        const int8_t *src = (const int8_t *)cache + at;
        const float sc = scales[slot * kv_heads + kvh];
        for (int64_t i = 0; i < d; ++i) buf[i] = (float)src[i] * sc;
    } else if (cd == BF16) {
        const uint16_t *src = (const uint16_t *)cache + at;
        for (int64_t i = 0; i < d; ++i) buf[i] = bf16_to_float(src[i]);
    } else {
        const uint16_t *src = (const uint16_t *)cache + at;
        for (int64_t i = 0; i < d; ++i) buf[i] = f16_to_float(src[i]);
    }
    return buf;
}

static inline vf max_v(vf a, vf b) { return (vf)(((vi)a & (a > b)) | ((vi)b & ~(a > b))); }

/* st[j][c..c+nr) = sum_d k[j][d] q[d][c..c+nr) for keys j = 0 .. KB of the block, the first
 * being key k (vectors of rows; ld: the row stride of q and st). With `mask`, a key after a
 * row's position (posv) scores -inf; mx takes each vector's largest score over the block's
 * first `keys` (the others are padding, or keys no row of the chunk sees). nr (<= NR) is a
 * constant at each call. */
static inline __attribute__((always_inline)) void score_block(
        const float *const *krows, int64_t d, const float *q, float *st, int64_t ld, int64_t c,
        int64_t k, int64_t keys, const vi *posv, int mask, vf *mx, const int nr) {
    vf acc[KB][NR];
    for (int j = 0; j < KB; ++j)
        for (int v = 0; v < nr; ++v) acc[j][v] = (vf){0};
    for (int64_t i = 0; i < d; ++i) {
        vf qv[NR];
        for (int v = 0; v < nr; ++v) qv[v] = loadv(q + i * ld + c + v * LANES);
        for (int j = 0; j < KB; ++j) {
            const float kj = krows[j][i];
            for (int v = 0; v < nr; ++v) acc[j][v] += kj * qv[v];
        }
    }
    const vf minus_inf = (vf){0} - INFINITY;
    for (int j = 0; j < KB; ++j)
        for (int v = 0; v < nr; ++v) {
            vf sv = acc[j][v];
            if (mask) {
                const vi hide = (vi){0} + (int32_t)(k + j) > posv[v];
                sv = (vf)(((vi)sv & ~hide) | ((vi)minus_inf & hide));
            }
            if (j < keys) mx[v] = max_v(sv, mx[v]);
            storev(st + j * ld + c + v * LANES, sv);
        }
}

/* o[i0..i0+DB)[c..c+nr) = alpha * o + sum_{j < nk} v[j][i] p[j][c..c+nr) */
static inline __attribute__((always_inline)) void value_block(const float *const *vrows,
                                                            int64_t nk, int64_t i0,
                                                            const float *p, float *o,
                                                            int64_t ld, int64_t c,
                                                            const vf *alpha, const int nr) {
    vf acc[DB][NR];
    for (int i = 0; i < DB; ++i)
        for (int v = 0; v < nr; ++v)
            acc[i][v] = loadv(o + (i0 + i) * ld + c + v * LANES) * alpha[v];
    for (int64_t j = 0; j < nk; ++j) {
        vf pv[NR];
        for (int v = 0; v < nr; ++v) pv[v] = loadv(p + j * ld + c + v * LANES);
        const float *vj = vrows[j] + i0;
        for (int i = 0; i < DB; ++i)
            for (int v = 0; v < nr; ++v) acc[i][v] += vj[i] * pv[v];
    }
    for (int i = 0; i < DB; ++i)
        for (int v = 0; v < nr; ++v) storev(o + (i0 + i) * ld + c + v * LANES, acc[i][v]);
}

/* One chunk of nr row vectors at column c through a pass of nk keys (the first at key k0):
 * scores, causal mask, online softmax, values. last: the chunk's last position. */
static inline __attribute__((always_inline)) void chunk_pass(
        const float *const *krows, const float *const *vrows, int64_t nk, int64_t k0,
        int64_t d, const float *q, float *st, float *o, float *m, float *l, const int32_t *pos,
        int64_t last, int64_t ld, int64_t c, const int nr) {
    const int64_t seen = k0 + nk - 1 <= last ? nk : last - k0 + 1; /* keys any row may see */
    vi posv[NR];
    vf mx[NR], alpha[NR];
    for (int v = 0; v < nr; ++v) {
        memcpy(&posv[v], pos + c + v * LANES, sizeof posv[v]);
        mx[v] = loadv(m + c + v * LANES);
    }
    for (int64_t j = 0; j < seen; j += KB) /* a block's keys past a row's position are masked */
        score_block(krows + j, d, q, st + j * ld, ld, c, k0 + j, seen - j, posv,
                    k0 + j + KB - 1 > pos[c], mx, nr);
    for (int v = 0; v < nr; ++v) {
        const int64_t cv = c + v * LANES;
        const vf m_old = loadv(m + cv);
        alpha[v] = EXP_NEG(m_old - mx[v]); /* m_old = -inf on the first pass: 0 */
        vf sum = (vf){0};
        for (int64_t j = 0; j < seen; ++j) {
            const vf e = EXP_NEG(loadv(st + j * ld + cv) - mx[v]);
            storev(st + j * ld + cv, e);
            sum += e;
        }
        storev(m + cv, mx[v]);
        storev(l + cv, loadv(l + cv) * alpha[v] + sum);
    }
    for (int64_t i0 = 0; i0 < d; i0 += DB) value_block(vrows, seen, i0, st, o, ld, c, alpha, nr);
}

typedef struct {
    int64_t seq, kvh, first; /* first: the tile's first query of the chunk */
} item_t;

/* Per-thread scratch for tiles of up to `width` rows: q and out [d][width], scores
 * [KT + KB][width] (the last score block may run past KT), m, l, positions [width], and KT
 * converted key and value rows. */
typedef struct {
    float *q, *o, *st, *m, *l, *kbuf, *vbuf;
    int32_t *pos;
} scratch_t;

static int scratch_alloc(scratch_t *s, int64_t d, int64_t width) {
    const size_t floats = (size_t)(2 * d * width + (KT + KB) * width + 2 * width + 2 * KT * d);
    const size_t bytes = sizeof(float) * floats + (size_t)width * sizeof(int32_t);
    float *all = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!all) return 0;
    s->q = all;
    s->o = s->q + d * width;
    s->st = s->o + d * width;
    s->m = s->st + (KT + KB) * width;
    s->l = s->m + width;
    s->kbuf = s->l + width;
    s->vbuf = s->kbuf + KT * d;
    s->pos = (int32_t *)(s->vbuf + KT * d);
    return 1;
}

static const float zero_row[1024] __attribute__((aligned(64)));

/* One item: queries [first, first + qt) of sequence seq (the chunk starts at position
 * n - q_len), kv head kvh and its group's G query heads. */
static void run_item(const void *q, const void *k_cache, const void *v_cache, const float *ks,
                     const float *vs, const int32_t *table, int64_t t0, int64_t q_len, int64_t n,
                     int64_t first, int64_t qt, int64_t kvh, int64_t group, int64_t kv_heads,
                     int64_t d, int64_t block_size, float scale, int dtype, int cd,
                     void *out, scratch_t *s) {
    const int64_t rows = qt * group, ld = (rows + LANES - 1) / LANES * LANES, hq = kv_heads * group;
    const int64_t base = n - q_len + first, last_pos = base + qt - 1;
    /* the query rows as fp32 into o (free until the passes), then transposed into q LANES
     * rows at a time (storing each row down a column of q took ~1 ms of a 10 ms call) */
    tile_rows_init(s->pos, s->m, s->l, rows, ld, group, qt, base);
    for (int64_t r = 0; r < ld; ++r) {
        if (r < rows)
            load_row(q, ((t0 + first + r / group) * hq + kvh * group + r % group) * d, d, dtype,
                     s->o + r * d);
        else
            memset(s->o + r * d, 0, sizeof(float) * (size_t)d);
    }
    for (int64_t r0 = 0; r0 < ld; r0 += LANES) /* LANES rows at a time: they stay in L1 */
        for (int64_t e = 0; e < d; ++e)
            for (int64_t r = r0; r < r0 + LANES; ++r) s->q[e * ld + r] = s->o[r * d + e] * scale;
    memset(s->o, 0, sizeof(float) * (size_t)(d * ld));
    const float *krows[KT + KB], *vrows[KT + KB];
    for (int64_t k0 = 0; k0 <= last_pos; k0 += KT) {
        const int64_t nk = last_pos + 1 - k0 < KT ? last_pos + 1 - k0 : KT;
        for (int64_t j = 0; j < nk; ++j) {
            const int64_t slot = slot_of(table, k0 + j, block_size);
            krows[j] = cache_row(k_cache, ks, slot, kvh, kv_heads, d, cd, s->kbuf + j * d);
            vrows[j] = cache_row(v_cache, vs, slot, kvh, kv_heads, d, cd, s->vbuf + j * d);
        }
        for (int64_t j = nk; j < nk + KB; ++j) krows[j] = vrows[j] = zero_row; /* a block's tail */
        int64_t c = 0;
        for (; c + NR * LANES <= ld; c += NR * LANES) {
            const int64_t last = s->pos[c + NR * LANES - 1];
            if (last >= k0)
                chunk_pass(krows, vrows, nk, k0, d, s->q, s->st, s->o, s->m, s->l, s->pos, last,
                           ld, c, NR);
        }
        for (; c < ld; c += LANES) { /* the last vectors, one at a time */
            const int64_t last = s->pos[c + LANES - 1];
            if (last >= k0)
                chunk_pass(krows, vrows, nk, k0, d, s->q, s->st, s->o, s->m, s->l, s->pos, last,
                           ld, c, 1);
        }
    }
    float *block = s->kbuf; /* LANES output rows, [LANES][d] (KT >= LANES) */
    for (int64_t r0 = 0; r0 < rows; r0 += LANES) {
        const int64_t nr = rows - r0 < LANES ? rows - r0 : LANES;
        for (int64_t e = 0; e < d; ++e)
            for (int64_t r = 0; r < nr; ++r) block[r * d + e] = s->o[e * ld + r0 + r];
        for (int64_t r = r0; r < r0 + nr; ++r) {
            float *row = block + (r - r0) * d;
            const float inv = 1.0f / s->l[r];
            for (int64_t e = 0; e < d; ++e) row[e] *= inv;
            const int64_t at = ((t0 + first + r / group) * hq + kvh * group + r % group) * d;
            store_row(out, at, d, dtype, row);
        }
    }
}
#else
#define PREFILL_BUILT 0
#endif

/* paged_prefill_amx.c: the items of bf16 calls on AMX tiles */
int graft_prefill_amx_applies(int dtype, int cache_dtype, int64_t head_dim);
uint16_t *graft_prefill_amx_pack(const uint16_t *k_cache, const uint16_t *v_cache,
                                 const int32_t *block_tables, const int32_t *context_lens,
                                 int64_t num_seqs, int64_t kv_heads, int64_t d, int64_t block_size,
                                 int64_t max_blocks, int64_t *offsets, int num_threads);
void *graft_prefill_amx_scratch(int64_t d, int64_t rows);
void graft_prefill_amx_done(void *scratch);
void graft_prefill_amx_item(const uint16_t *q, const uint16_t *packed, const int64_t *offsets,
                            int64_t num_seqs, int64_t seq, int64_t t0, int64_t q_len, int64_t n,
                            int64_t first, int64_t qt, int64_t kvh, int64_t group, int64_t kv_heads,
                            int64_t d, float scale, uint16_t *out, void *scratch);

/* 1 when this build has the kernel (GCC), else 0: graft_paged_prefill then computes nothing. */
int graft_paged_prefill_built(void) { return PREFILL_BUILT; }

/* Returns 0; 1 + the index of the first sequence whose chunk is longer than its context or
 * whose block table points outside [0, num_blocks) within its context (nothing computed);
 * -1 when the scratch or item list could not be allocated (out is incomplete then); -2 when
 * this build has no kernel. head_dim must be a multiple of 4 and at most 1024. */
int64_t graft_paged_prefill(const void *q, const void *k_cache, const void *v_cache,
                            const int32_t *block_tables, const int32_t *cu_seqlens,
                            const int32_t *context_lens, void *out, int64_t num_seqs,
                            int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim,
                            int64_t block_size, int64_t max_blocks, int64_t num_blocks,
                            float scale, const float *k_scale, const float *v_scale, int dtype,
                            int cache_dtype, int num_threads) {
#if PREFILL_BUILT
    const int64_t group = num_q_heads / num_kv_heads, qt = group < ROWS ? ROWS / group : 1;
    int64_t count = 0;
    for (int64_t s = 0; s < num_seqs; ++s) {
        const int64_t q_len = cu_seqlens[s + 1] - cu_seqlens[s], n = context_lens[s];
        const int64_t used = (n + block_size - 1) / block_size;
        if (q_len < 0 || q_len > n || used > max_blocks) return s + 1;
        for (int64_t b = 0; b < used; ++b) {
            const int32_t blk = block_tables[s * max_blocks + b];
            if (blk < 0 || blk >= num_blocks) return s + 1;
        }
        count += num_kv_heads * ((q_len + qt - 1) / qt);
    }
    item_t *items = malloc(sizeof(item_t) * (size_t)(count > 0 ? count : 1));
    if (!items) return -1;
    /* the tiles of later queries (more keys) first, so the threads end together */
    int64_t at = 0;
    for (int64_t s = 0; s < num_seqs; ++s) {
        const int64_t q_len = cu_seqlens[s + 1] - cu_seqlens[s];
        for (int64_t first = (q_len - 1) / qt * qt; first >= 0 && q_len > 0; first -= qt)
            for (int64_t h = 0; h < num_kv_heads; ++h) items[at++] = (item_t){s, h, first};
    }
    /* bf16 on AMX: the keys and values packed once for every item's tiles */
    int64_t *offsets = NULL;
    uint16_t *packed = NULL;
    if (graft_prefill_amx_applies(dtype, cache_dtype, head_dim)) {
        offsets = malloc(sizeof(int64_t) * (size_t)(num_seqs + 1));
        packed = offsets ? graft_prefill_amx_pack(k_cache, v_cache, block_tables, context_lens,
                                                  num_seqs, num_kv_heads, head_dim, block_size,
                                                  max_blocks, offsets, num_threads)
                         : NULL;
        if (!packed) {
            free(offsets);
            free(items);
            return -1;
        }
    }
    int failed = 0;
#pragma omp parallel num_threads(num_threads) if (count > 1)
    {
        scratch_t sc;
        void *amx = packed ? graft_prefill_amx_scratch(head_dim, qt * group) : NULL;
        const int ok = packed ? amx != NULL
                              : scratch_alloc(&sc, head_dim, (qt * group + LANES - 1) / LANES * LANES);
        if (!ok) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < count; ++i) {
            if (!ok) continue;
            const item_t it = items[i];
            const int64_t t0 = cu_seqlens[it.seq], q_len = cu_seqlens[it.seq + 1] - t0;
            const int64_t tile = q_len - it.first < qt ? q_len - it.first : qt;
            if (packed) {
                graft_prefill_amx_item(q, packed, offsets, num_seqs, it.seq, t0, q_len,
                                       context_lens[it.seq], it.first, tile, it.kvh, group,
                                       num_kv_heads, head_dim, scale, out, amx);
            } else {
                run_item(q, k_cache, v_cache, k_scale, v_scale, block_tables + it.seq * max_blocks,
                         t0, q_len, context_lens[it.seq], it.first, tile, it.kvh, group,
                         num_kv_heads, head_dim, block_size, scale, dtype, cache_dtype, out, &sc);
            }
        }
        if (ok && packed)
            graft_prefill_amx_done(amx);
        else if (ok)
            free(sc.q);
    }
    free(items);
    free(packed);
    free(offsets);
    return failed ? -1 : 0;
#else
    (void)q; (void)k_cache; (void)v_cache; (void)block_tables; (void)cu_seqlens;
    (void)context_lens; (void)out; (void)num_seqs; (void)num_q_heads; (void)num_kv_heads;
    (void)head_dim; (void)block_size; (void)max_blocks; (void)num_blocks; (void)scale;
    (void)k_scale; (void)v_scale; (void)dtype; (void)cache_dtype; (void)num_threads;
    return -2;
#endif
}
