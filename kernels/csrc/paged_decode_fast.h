/* The split-KV fast path of paged_decode_cpu.c (included there, once): an fp32 query with
 * head_dim 64 or 128 over fp32, bf16 or int8 caches, on GCC vector extensions. It uses that
 * file's includes (paged_common.h's dtype enum and slot_of, the scalar exp), so it is not a
 * header for other files. */
#ifndef GRAFT_PAGED_DECODE_FAST_H
#define GRAFT_PAGED_DECODE_FAST_H
#if defined(__GNUC__) && !defined(__clang__)
#define GRAFT_FAST_F32 1
/* Fast path for an fp32 query and head_dim 64 or 128, over fp32, bf16 or int8 caches (GCC
 * vector extensions). The plain path spends most
 * of its time folding each 16-lane dot product into one score and keeping accumulators on
 * the stack; here the partial sums of a tile of tokens are folded together in shuffle-add
 * rounds, and each head's query and output row stay in registers while K and V stream past
 * (a sequence's K and V fit in L2, so the per-head passes after the first hit cache). */
/* The vector width: 16 lanes (a zmm) with AVX-512, else 8 (a ymm). GCC 12 keeps no 64-byte
 * vector in registers without AVX-512: there the 16-lane kernel ran through the stack, 6x
 * slower than in the AVX-512 build and 2.4x slower than the plain path (issue 49). A score
 * tile is LANES tokens, a head row d / LANES chunks. */
#ifdef __AVX512F__
#define LANES 16
typedef v16f vf;
typedef v16i vi;
#else
#define LANES 8
typedef v8f vf;
typedef v8i vi;
#endif
typedef int8_t vc __attribute__((vector_size(LANES)));
typedef uint16_t vh __attribute__((vector_size(2 * LANES)));
typedef uint32_t vu __attribute__((vector_size(4 * LANES)));

static inline vf loadv(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* r[j] = sum of the LANES lanes of x[j], for j < LANES (x is clobbered): shuffle-add rounds,
 * each halving the partial sums of twice the tokens, ending in token order. */
static inline vf fold_tile(vf *x) {
#if LANES == 16
    const vi lo8 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
    const vi hi8 = lo8 + 8;
    const vi lo4 = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
    const vi lo2 = {0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29};
    const vi ev = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
    for (int j = 0; j < 8; ++j) /* token pairs: 8 partial sums each */
        x[j] = __builtin_shuffle(x[2 * j], x[2 * j + 1], lo8) + __builtin_shuffle(x[2 * j], x[2 * j + 1], hi8);
#else
    const vi lo4 = {0, 1, 2, 3, 8, 9, 10, 11};
    const vi lo2 = {0, 1, 4, 5, 8, 9, 12, 13};
    const vi ev = {0, 2, 4, 6, 8, 10, 12, 14};
#endif
    const vi hi4 = lo4 + 4, hi2 = lo2 + 2, od = ev + 1;
    for (int j = 0; j < 4; ++j) /* 4 partial sums a token (8 lanes: the token pairs) */
        x[j] = __builtin_shuffle(x[2 * j], x[2 * j + 1], lo4) + __builtin_shuffle(x[2 * j], x[2 * j + 1], hi4);
    for (int j = 0; j < 2; ++j) /* 2 a token */
        x[j] = __builtin_shuffle(x[2 * j], x[2 * j + 1], lo2) + __builtin_shuffle(x[2 * j], x[2 * j + 1], hi2);
    return __builtin_shuffle(x[0], x[1], ev) + __builtin_shuffle(x[0], x[1], od); /* token order */
}

/* exp_shifted for the fast path: sc[i] <- exp(sc[i] - max), returns the sum and the max in
 * *max_out; LANES at a time, the tail with the scalar exp_neg. */
static inline float exp_shifted_v(float *sc, int64_t n, float *max_out) {
    float mx = -INFINITY;
    int64_t i = 0;
    if (n >= LANES) {
        vf mv = loadv(sc);
        for (i = LANES; i + LANES <= n; i += LANES) {
            const vf x = loadv(sc + i);
            mv = (vf)(((vi)x & (x > mv)) | ((vi)mv & ~(x > mv)));
        }
        for (int l = 0; l < LANES; ++l) mx = mv[l] > mx ? mv[l] : mx;
    }
    for (; i < n; ++i) mx = sc[i] > mx ? sc[i] : mx;
    *max_out = mx;
    vf tv = (vf){0};
    float total = 0.0f;
    for (i = 0; i + LANES <= n; i += LANES) {
#if LANES == 16
        const vf e = exp_neg16(loadv(sc + i) - mx);
#else
        const vf e = exp_neg8(loadv(sc + i) - mx);
#endif
        memcpy(sc + i, &e, sizeof e);
        tv += e;
    }
    for (; i < n; ++i) {
        sc[i] = exp_neg(sc[i] - mx);
        total += sc[i];
    }
    for (int l = 0; l < LANES; ++l) total += tv[l];
    return total;
}

/* LANES cache values at element offset `off` as fp32 (int8: unscaled; the caller applies the
 * row's scale once per dot product or per probability). `cd` is a constant at every call. */
static inline __attribute__((always_inline)) vf load_kv(const void *base, int64_t off,
                                                       const int cd) {
    if (cd == F32) return loadv((const float *)base + off);
    if (cd == BF16) {
        vh h;
        memcpy(&h, (const uint16_t *)base + off, sizeof h);
        return (vf)(__builtin_convertvector(h, vu) << 16);
    }
#ifdef __AVX512F__
    /* gcc's __builtin_convertvector from 16 int8 goes element by element: one sign-extend
     * and one convert instead */
    return (vf)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
        _mm_loadu_si128((const __m128i *)((const int8_t *)base + off))));
#else
    vc c;
    memcpy(&c, (const int8_t *)base + off, sizeof c);
    return __builtin_convertvector(c, vf);
#endif
}

/* The LANES lane-wise partial sums of q . k over `chunks` LANES-value chunks of a cache row. */
static inline __attribute__((always_inline)) vf dot_lanes(const vf *qv, const void *k,
                                                         int64_t off, const int64_t chunks,
                                                         const int cd) {
    vf a = qv[0] * load_kv(k, off, cd);
    for (int64_t c = 1; c < chunks; ++c) a += qv[c] * load_kv(k, off + LANES * c, cd);
    return a;
}

/* Ask for the K and V rows of tokens [lo, hi) of a sequence to be brought into L2
 * (row_bytes: one slot's values of all kv heads). */
static inline void prefetch_rows(const void *k_cache, const void *v_cache, const int32_t *table,
                                 int64_t lo, int64_t hi, int64_t block_size, int64_t row_bytes) {
    for (int64_t t = lo; t < hi; ++t) {
        const int64_t at = slot_of(table, t, block_size) * row_bytes;
        for (int64_t o = 0; o < row_bytes; o += 64) {
            __builtin_prefetch((const char *)k_cache + at + o, 0, 2);
            __builtin_prefetch((const char *)v_cache + at + o, 0, 2);
        }
    }
}

/* Tokens per work item of the fast path. A sequence's context is cut at fixed multiples of
 * PART and each piece is one item, so one long sequence (batch 1) is spread over the threads
 * while its result depends neither on the batch nor on the thread count. 64 tokens of one kv
 * head's K (16 KB at head_dim 64) stay in L1 for every query head of its group. */
#define PART 64

/* Where the next item of this thread lies, for prefetching: its sequence's table and tokens. */
typedef struct {
    const int32_t *table;
    int64_t lo, hi;
} next_rows_t;

/* One work item: tokens [t0, t1) (at most PART) of one sequence, every query head, fp32 q
 * rows [Hq, D] over a cache of dtype `cd` (fp32, bf16, or int8 with per-token-and-head
 * scales ks/vs). Writes per head {m, l, acc[D]} to part: m the largest score, l the sum of
 * exp(score - m), acc the sum of exp(score - m) * v (merged across items by merge_parts).
 * `chunks` (head_dim / LANES) and `cd` are compile-time constants at each call below, so qv,
 * part and acc are indexed by constants and live in registers.
 *
 * Memory: the item's K and V are read from DRAM once (the later heads find them in L1/L2).
 * Demand misses alone left the core waiting on memory for about a third of the time, so
 * the rows of the item this thread takes next are prefetched a few at a time during this
 * one's score tiles, and a thread's first item all at once. */
static inline __attribute__((always_inline)) void part_decode_fast(
        const float *q, const void *k_cache, const void *v_cache, const float *ks,
        const float *vs, const int cd, const int32_t *table, int64_t t0, int64_t t1,
        int64_t num_kv_heads, int64_t group, const int64_t chunks, int64_t block_size,
        float scale, float *scores, float *part, next_rows_t next, int first) {
    const int64_t d = LANES * chunks, kv_width = num_kv_heads * d, num_q_heads = num_kv_heads * group;
    const int64_t row_bytes = kv_width * (cd == F32 ? 4 : cd == BF16 ? 2 : 1), n = t1 - t0;
    if (first) prefetch_rows(k_cache, v_cache, table, t0, t1, block_size, row_bytes);
    /* rows of the next item per tile, spread over this one's tiles */
    const int64_t pf_n = next.hi - next.lo, tiles = num_q_heads * (n / LANES);
    const int64_t per_tile = tiles ? (pf_n + tiles - 1) / tiles : 0;
    int64_t pf_next = tiles ? 0 : pf_n;
    for (int64_t hq = 0; hq < num_q_heads; ++hq) {
        const int64_t kvh = hq / group, koff = kvh * d;
        vf qv[chunks];
        for (int64_t c = 0; c < chunks; ++c) qv[c] = loadv(q + hq * d + LANES * c) * scale;
        float *sc = scores + hq * PART;
        int64_t t = 0;
        for (; t + LANES <= n; t += LANES) {
            vf dots[LANES];
#pragma GCC unroll 16
            for (int j = 0; j < LANES; ++j) {
                const int64_t slot = slot_of(table, t0 + t + j, block_size);
                dots[j] = dot_lanes(qv, k_cache, slot * kv_width + koff, chunks, cd);
                if (cd == I8) dots[j] *= ks[slot * num_kv_heads + kvh];
            }
            const vf r = fold_tile(dots);
            memcpy(sc + t, &r, sizeof r);
            if (pf_next < pf_n) {
                const int64_t hi = pf_next + per_tile < pf_n ? pf_next + per_tile : pf_n;
                prefetch_rows(k_cache, v_cache, next.table, next.lo + pf_next, next.lo + hi,
                              block_size, row_bytes);
                pf_next = hi;
            }
        }
        for (; t < n; ++t) { /* the tail, one token at a time */
            const int64_t slot = slot_of(table, t0 + t, block_size);
            const vf a = dot_lanes(qv, k_cache, slot * kv_width + koff, chunks, cd);
            float sum = 0.0f;
            for (int l = 0; l < LANES; ++l) sum += a[l];
            sc[t] = cd == I8 ? sum * ks[slot * num_kv_heads + kvh] : sum;
        }
        float *ph = part + hq * (d + 2);
        ph[1] = exp_shifted_v(sc, n, &ph[0]);
        /* two accumulator sets (even and odd tokens): one set is a chain of dependent adds
         * that waits on the add latency every token */
        vf acc[chunks], acc2[chunks];
        for (int64_t c = 0; c < chunks; ++c) acc[c] = acc2[c] = (vf){0};
        int64_t i = 0;
        for (; i + 2 <= n; i += 2) {
            const int64_t s1 = slot_of(table, t0 + i, block_size);
            const int64_t s2 = slot_of(table, t0 + i + 1, block_size);
            float p = sc[i], p2 = sc[i + 1];
            if (cd == I8) {
                p *= vs[s1 * num_kv_heads + kvh];
                p2 *= vs[s2 * num_kv_heads + kvh];
            }
            for (int64_t c = 0; c < chunks; ++c) {
                acc[c] += p * load_kv(v_cache, s1 * kv_width + koff + LANES * c, cd);
                acc2[c] += p2 * load_kv(v_cache, s2 * kv_width + koff + LANES * c, cd);
            }
        }
        if (i < n) {
            const int64_t s1 = slot_of(table, t0 + i, block_size);
            const float p = sc[i] * (cd == I8 ? vs[s1 * num_kv_heads + kvh] : 1.0f);
            for (int64_t c = 0; c < chunks; ++c)
                acc[c] += p * load_kv(v_cache, s1 * kv_width + koff + LANES * c, cd);
        }
        for (int64_t c = 0; c < chunks; ++c) acc[c] += acc2[c];
        memcpy(ph + 2, acc, sizeof acc);
    }
}

/* One instance per (cache dtype, head_dim): the constants make each a straight-line kernel. */
#define GRAFT_PART_DECODE(name, cd, chunks)                                                     \
    static void name(const float *q, const void *k, const void *v, const float *ks,            \
                     const float *vs, const int32_t *table, int64_t t0, int64_t t1,            \
                     int64_t hkv, int64_t group, int64_t bs, float scale, float *scores,       \
                     float *part, next_rows_t next, int first) {                               \
        part_decode_fast(q, k, v, ks, vs, cd, table, t0, t1, hkv, group, chunks, bs, scale,    \
                         scores, part, next, first);                                           \
    }
GRAFT_PART_DECODE(part_decode_f32_64, F32, 64 / LANES)
GRAFT_PART_DECODE(part_decode_f32_128, F32, 128 / LANES)
GRAFT_PART_DECODE(part_decode_bf16_64, BF16, 64 / LANES)
GRAFT_PART_DECODE(part_decode_bf16_128, BF16, 128 / LANES)
GRAFT_PART_DECODE(part_decode_i8_64, I8, 64 / LANES)
GRAFT_PART_DECODE(part_decode_i8_128, I8, 128 / LANES)

typedef void (*part_decode_fn)(const float *, const void *, const void *, const float *,
                               const float *, const int32_t *, int64_t, int64_t, int64_t,
                               int64_t, int64_t, float, float *, float *, next_rows_t, int);

/* The fast kernel for an fp32 query over a cache of dtype cd with head_dim d, or NULL. */
static part_decode_fn fast_kernel(int cd, int64_t d) {
    if (d != 64 && d != 128) return NULL;
    if (cd == F32) return d == 64 ? part_decode_f32_64 : part_decode_f32_128;
    if (cd == BF16) return d == 64 ? part_decode_bf16_64 : part_decode_bf16_128;
    if (cd == I8) return d == 64 ? part_decode_i8_64 : part_decode_i8_128;
    return NULL;
}

/* out [Hq, D] of one sequence from its np items' {m, l, acc}: the softmax over the whole
 * context, exp(m_j - M) rescaling each item to the largest score M. One item gives
 * acc / l exactly (its factor is exp(0) = 1); no items (an empty context) give zeros. */
static void merge_parts(const float *parts, int64_t np, float *out, int64_t num_q_heads,
                        int64_t d) {
    for (int64_t hq = 0; hq < num_q_heads; ++hq) {
        float *o = out + hq * d;
        memset(o, 0, sizeof(float) * (size_t)d);
        if (np == 0) continue;
        float mx = -INFINITY, total = 0.0f;
        for (int64_t j = 0; j < np; ++j) {
            const float m = parts[(j * num_q_heads + hq) * (d + 2)];
            mx = m > mx ? m : mx;
        }
        for (int64_t j = 0; j < np; ++j) {
            const float *ph = parts + (j * num_q_heads + hq) * (d + 2);
            const float w = exp_neg(ph[0] - mx);
            total += ph[1] * w;
#pragma omp simd
            for (int64_t i = 0; i < d; ++i) o[i] += ph[2 + i] * w;
        }
#pragma omp simd
        for (int64_t i = 0; i < d; ++i) o[i] /= total;
    }
}

/* The sequence of item `it`, searching forward from sequence s (first[s]: its first item). */
static inline int64_t seq_of(const int64_t *first, int64_t s, int64_t it) {
    while (first[s + 1] <= it) ++s;
    return s;
}

/* The fast path over every sequence: phase 1 runs the items ((sequence, PART-token piece),
 * round-robin over the threads so each knows the item it takes next), phase 2 merges each
 * sequence's items. Returns 0, or -1 when scratch could not be allocated. */
static int64_t paged_decode_parts(part_decode_fn fast, const float *q, const void *k_cache,
                                  const void *v_cache, const float *k_scale,
                                  const float *v_scale, const int32_t *block_tables,
                                  const int32_t *context_lens, float *out, int64_t num_seqs,
                                  int64_t num_q_heads, int64_t num_kv_heads, int64_t d,
                                  int64_t block_size, int64_t max_blocks, float scale,
                                  int num_threads) {
    const int64_t group = num_q_heads / num_kv_heads, per_item = num_q_heads * (d + 2);
    int64_t *first = malloc(sizeof(int64_t) * (size_t)(num_seqs + 1)); /* items of seq s start here */
    if (!first) return -1;
    first[0] = 0;
    for (int64_t s = 0; s < num_seqs; ++s) first[s + 1] = first[s] + (context_lens[s] + PART - 1) / PART;
    const int64_t items = first[num_seqs];
    float *parts = malloc(sizeof(float) * (size_t)(items * per_item + 1));
    int failed = parts == NULL;
#pragma omp parallel num_threads(num_threads) if (items > 1 && !failed)
    {
        float *scores = failed ? NULL : malloc(sizeof(float) * (size_t)(num_q_heads * PART));
        if (!scores) {
#pragma omp atomic write
            failed = 1;
        }
        const int64_t stride = omp_get_num_threads();
        int64_t s = 0; /* this thread's items come in increasing order: a cursor finds their sequence */
        int start = 1;
#pragma omp for schedule(static, 1)
        for (int64_t it = 0; it < items; ++it) {
            if (!scores) continue; /* reported through `failed` */
            s = seq_of(first, s, it);
            const int64_t t0 = (it - first[s]) * PART, n = context_lens[s];
            next_rows_t next = {block_tables, 0, 0};
            if (it + stride < items) {
                const int64_t ns = seq_of(first, s, it + stride);
                const int64_t nt0 = (it + stride - first[ns]) * PART, nn = context_lens[ns];
                next = (next_rows_t){block_tables + ns * max_blocks, nt0, nt0 + PART < nn ? nt0 + PART : nn};
            }
            fast(q + s * num_q_heads * d, k_cache, v_cache, k_scale, v_scale,
                 block_tables + s * max_blocks, t0, t0 + PART < n ? t0 + PART : n, num_kv_heads,
                 group, block_size, scale, scores, parts + it * per_item, next, start);
            start = 0;
        }
        free(scores);
        if (!failed) {
#pragma omp for schedule(static)
            for (int64_t r = 0; r < num_seqs; ++r)
                merge_parts(parts + first[r] * per_item, first[r + 1] - first[r],
                            out + r * num_q_heads * d, num_q_heads, d);
        }
    }
    free(first);
    free(parts);
    return failed ? -1 : 0;
}
#endif
#endif
