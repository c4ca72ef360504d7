/* Paged-attention prefill on AMX tiles, for bf16 queries over a bf16 cache (a bf16 engine on
 * a CPU with AMX): the work items of paged_prefill_cpu.c (a sequence's tile of G * QT query
 * rows of one kv head), their two products on TDPBF16PS.
 *
 * Why: the vector kernel runs both products as fp32 FMAs, a broadcast key value times 16 query
 * rows, and was 27% of a bf16 512-token prefill step of SmolLM2-135M on a 2-core AMX Xeon
 * (docs/benchmarks.md, "Prefill attention on AMX tiles"); one tile product does 16 x 16 x 32
 * multiply-adds. What is left is the softmax, on 16-lane vectors.
 *
 * Numerics: the scores are exact bf16 products summed in fp32 (in the tiles' order), scaled
 * in fp32. The softmax is fp32, online over chunks of KC keys. The probabilities enter the
 * value product as two bf16 pieces (the rounded value and what rounding left): with one
 * piece, as torch's CPU flash attention does for bf16, the outputs were as far from exact
 * attention as torch's (rms 1.27x the bf16 rounding's own), and a bf16 engine's logprobs
 * moved against the vector kernel's; two cost one more tile product per step. An item's
 * result depends neither on the batch nor on the threads.
 *
 * Operands: the keys and values are packed once per call (graft_prefill_amx_pack), for every
 * sequence and kv head, into the tiles' pair layout: keys as B of Q K^T, [16 dim pairs][16
 * keys x 2] per 16 keys and 32 dims; values as B of P V, [16 key pairs][16 dims x 2] per 32
 * keys and 16 dims. The query rows are copied into 32-row blocks [rows][D], the scores S
 * [rows][KC] fp32, the probabilities P [2][rows][KC] bf16 and the output O [rows][D] fp32 are
 * per thread. Rows and keys are padded to 32 (2 x 2 tile blocks); a padded key is zero and
 * its probability zero, a padded row repeats the tile's last position and is not stored.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "paged_common.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && \
    defined(__AVX512BW__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#include <immintrin.h>
#include "amx_tiles.h"
#include "fast_exp.h"
#define PREFILL_AMX 1
#else
#define PREFILL_AMX 0
#endif

#define KC 512 /* keys a chunk of scores (S: 128 rows x 512 x 4 bytes = 256 KB, in L2) */

int graft_quant_isa(void); /* quant_linear_cpu.c: 4 where AMX runs (and is not capped) */

/* Whether graft_prefill_amx_item takes this call: an AMX build on a CPU that runs AMX under
 * GRAFT_CPU_ISA, bf16 q and caches, and a head size of whole 32-element tile chunks. */
int graft_prefill_amx_applies(int dtype, int cache_dtype, int64_t head_dim) {
    return PREFILL_AMX && graft_quant_isa() >= 4 && dtype == BF16 && cache_dtype == BF16 &&
           head_dim % 32 == 0 && head_dim <= 256;
}

/* Keys of a sequence padded to whole 2 x 2 blocks of 16-key tiles */
static inline int64_t padded_keys(int64_t n) { return (n + 31) / 32 * 32; }

/* Where sequence s's (n keys) kv head h begins in each half of the packed buffer */
static inline int64_t head_at(const int64_t *offsets, int64_t s, int64_t h, int64_t n, int64_t d) {
    return offsets[s] + h * padded_keys(n) * d;
}

/* The packed keys and values of every sequence and kv head: sequence s's kv head h at
 * offsets[s] + h * padded_keys(n_s) * d elements, keys in the first half of the buffer, values
 * at half. offsets has num_seqs + 1 entries (the last: the half's size). NULL without memory. */
uint16_t *graft_prefill_amx_pack(const uint16_t *k_cache, const uint16_t *v_cache,
                                 const int32_t *block_tables, const int32_t *context_lens,
                                 int64_t num_seqs, int64_t kv_heads, int64_t d, int64_t block_size,
                                 int64_t max_blocks, int64_t *offsets, int num_threads) {
    offsets[0] = 0;
    for (int64_t s = 0; s < num_seqs; ++s)
        offsets[s + 1] = offsets[s] + kv_heads * padded_keys(context_lens[s]) * d;
    const int64_t half = offsets[num_seqs];
    uint16_t *packed = aligned_alloc(64, (size_t)((2 * half * 2 + 63) / 64 * 64) + 64);
    if (!packed) return NULL;
    const int64_t dc = d / 32, de = d / 16;
    int64_t blocks = 0; /* (sequence, head, 32 keys) */
    for (int64_t s = 0; s < num_seqs; ++s) blocks += kv_heads * padded_keys(context_lens[s]) / 32;
#pragma omp parallel for num_threads(num_threads) schedule(static) if (blocks > 16)
    for (int64_t b = 0; b < blocks; ++b) {
        int64_t s = 0, rest = b;
        while (rest >= kv_heads * padded_keys(context_lens[s]) / 32)
            rest -= kv_heads * padded_keys(context_lens[s++]) / 32;
        const int64_t n = context_lens[s], per = padded_keys(n) / 32, h = rest / per, j0 = rest % per * 32;
        uint32_t *kp = (uint32_t *)(packed + head_at(offsets, s, h, n, d));
        uint16_t *vp = packed + half + head_at(offsets, s, h, n, d);
        for (int64_t j = j0; j < j0 + 32; ++j) {
            const int64_t slot = j < n ? slot_of(block_tables + s * max_blocks, j, block_size) : -1;
            const int64_t at = slot < 0 ? -1 : (slot * kv_heads + h) * d;
            const uint32_t *kr = at < 0 ? NULL : (const uint32_t *)(k_cache + at);
            const uint16_t *vr = at < 0 ? NULL : v_cache + at;
            /* key j: dword dp of chunk c (dims 32c + 2dp, +1) at row dp, column j % 16 */
            for (int64_t c = 0; c < dc; ++c)
                for (int64_t dp = 0; dp < 16; ++dp)
                    kp[((j / 16 * dc + c) * 16 + dp) * 16 + j % 16] = kr ? kr[c * 16 + dp] : 0;
            /* value j: dim 16e + i at row (j % 32) / 2, column 2i + j % 2 */
            for (int64_t e = 0; e < de; ++e)
                for (int64_t i = 0; i < 16; ++i)
                    vp[(((j / 32 * de + e) * 16 + j % 32 / 2) * 16 + i) * 2 + j % 2] =
                        vr ? vr[e * 16 + i] : 0;
        }
    }
    return packed;
}

#if PREFILL_AMX
typedef struct {
    uint16_t *q, *p; /* query rows [rows][d]; probabilities [rows][KC], then what bf16 left */
    float *s, *o, *m, *l; /* scores [rows][KC], output [rows][d], running max and sum */
    int32_t *pos;
} amx_scratch;

static int64_t rows_padded(int64_t rows) { return (rows + 31) / 32 * 32; }
#endif

/* Per-thread scratch for items of up to `rows` query rows (NULL without memory), and this
 * thread's tiles configured. Give it back with graft_prefill_amx_done. */
void *graft_prefill_amx_scratch(int64_t d, int64_t rows) {
#if PREFILL_AMX
    const int64_t rp = rows_padded(rows);
    const size_t bytes = sizeof(amx_scratch) + 64 + (size_t)rp * (2 * d + 4 * KC + 4 * KC + 4 * d + 12);
    char *all = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!all) return NULL;
    amx_scratch *sc = (amx_scratch *)all;
    char *at = all + 64;
    sc->s = (float *)at;
    sc->o = sc->s + rp * KC;
    sc->q = (uint16_t *)(sc->o + rp * d);
    sc->p = sc->q + rp * d;
    sc->m = (float *)(sc->p + 2 * rp * KC);
    sc->l = sc->m + rp;
    sc->pos = (int32_t *)(sc->l + rp);
    configure_tiles();
    return all;
#else
    (void)d; (void)rows;
    return NULL;
#endif
}

/* A thread's scratch freed and its tiles released (their 8 KB of state is then no longer
 * saved at each context switch), as the AMX linears release theirs. */
void graft_prefill_amx_done(void *scratch) {
#if PREFILL_AMX
    _tile_release();
#endif
    free(scratch);
}

#if PREFILL_AMX
/* S[rows r0..r0+32)[keys g0*16 ..) = Q K^T over the chunk's first `keys` (a multiple of 32):
 * 2 x 2 blocks of tiles, tiles 0-3 the scores, 4, 5 the query rows, 6, 7 the keys. */
static void scores(const amx_scratch *sc, const uint16_t *kp, int64_t d, int64_t r0, int64_t g0,
                   int64_t keys) {
    const int64_t dc = d / 32;
    for (int64_t g = 0; g < keys / 16; g += 2) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t c = 0; c < dc; ++c) {
            _tile_loadd(4, sc->q + r0 * d + c * 32, (int)(d * 2));
            _tile_loadd(5, sc->q + (r0 + 16) * d + c * 32, (int)(d * 2));
            _tile_loadd(6, kp + ((g0 + g) * dc + c) * 512, 64);
            _tile_loadd(7, kp + ((g0 + g + 1) * dc + c) * 512, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
        float *s = sc->s + r0 * KC + g * 16;
        _tile_stored(0, s, KC * 4);
        _tile_stored(1, s + 16, KC * 4);
        _tile_stored(2, s + 16 * KC, KC * 4);
        _tile_stored(3, s + 16 * KC + 16, KC * 4);
    }
}

/* O[rows r0..r0+32) += P V over the chunk's first `keys` (a multiple of 32; values from pair
 * block h0), P as its two bf16 pieces (`rows` rows a piece): tiles 0-3 the outputs, 4, 5 the
 * probabilities, 6, 7 the values. */
static void values(const amx_scratch *sc, const uint16_t *vp, int64_t d, int64_t rows, int64_t r0,
                   int64_t h0, int64_t keys) {
    const int64_t de = d / 16;
    for (int64_t e = 0; e < de; e += 2) {
        float *o = sc->o + r0 * d + e * 16;
        _tile_loadd(0, o, (int)(d * 4));
        _tile_loadd(1, o + 16, (int)(d * 4));
        _tile_loadd(2, o + 16 * d, (int)(d * 4));
        _tile_loadd(3, o + 16 * d + 16, (int)(d * 4));
        for (int64_t h = 0; h < keys / 32; ++h) {
            _tile_loadd(6, vp + ((h0 + h) * de + e) * 512, 64);
            _tile_loadd(7, vp + ((h0 + h) * de + e + 1) * 512, 64);
            for (int64_t piece = 0; piece < 2; ++piece) { /* the bf16 probabilities, then the rest */
                const uint16_t *p = sc->p + piece * rows * KC + r0 * KC + h * 32;
                _tile_loadd(4, p, KC * 2);
                _tile_loadd(5, p + 16 * KC, KC * 2);
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 4, 7);
                _tile_dpbf16ps(2, 5, 6);
                _tile_dpbf16ps(3, 5, 7);
            }
        }
        _tile_stored(0, o, (int)(d * 4));
        _tile_stored(1, o + 16, (int)(d * 4));
        _tile_stored(2, o + 16 * d, (int)(d * 4));
        _tile_stored(3, o + 16 * d + 16, (int)(d * 4));
    }
}

/* Row r's softmax over its `vis` visible keys of the chunk (scores S[r]): the running max and
 * sum updated, O[r] rescaled, P[r] written up to `width` keys (zeros past vis) as two bf16
 * pieces, the rounded probability and what the rounding left (`rows` rows a piece): together
 * 16 bits of each probability, so P V is about as exact as in fp32. */
static void softmax_row(const amx_scratch *sc, int64_t rows, int64_t r, int64_t vis, int64_t width,
                        int64_t d, float scale) {
    const float *s = sc->s + r * KC;
    uint16_t *p = sc->p + r * KC, *rest = p + rows * KC;
    if (vis <= 0) {
        memset(p, 0, sizeof(uint16_t) * (size_t)width);
        memset(rest, 0, sizeof(uint16_t) * (size_t)width);
        return;
    }
    const __m512 minus_inf = _mm512_set1_ps(-INFINITY);
    __m512 mx = minus_inf;
    for (int64_t j = 0; j < vis; j += 16) /* the lanes past vis stay -inf */
        mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(minus_inf, lane_mask(vis - j), s + j));
    const float m_old = sc->m[r], m_new = fmaxf(m_old, _mm512_reduce_max_ps(mx) * scale);
    const float alpha = m_old == -INFINITY ? 0.0f : exp_neg(m_old - m_new);
    const __m512 vscale = _mm512_set1_ps(scale), vm = _mm512_set1_ps(m_new);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < width; j += 16) {
        const __mmask16 keep = lane_mask(vis - j);
        const v16f x = (v16f)_mm512_fmsub_ps(_mm512_maskz_loadu_ps(keep, s + j), vscale, vm);
        const __m512 e = _mm512_maskz_mov_ps(keep, (__m512)exp_neg16(x));
        sum = _mm512_add_ps(sum, e);
        const __m256i hi = (__m256i)_mm512_cvtneps_pbh(e);
        const __m512 back = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(hi), 16));
        _mm256_storeu_si256((__m256i *)(p + j), hi);
        _mm256_storeu_si256((__m256i *)(rest + j), (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(e, back)));
    }
    sc->m[r] = m_new;
    sc->l[r] = sc->l[r] * alpha + _mm512_reduce_add_ps(sum);
    if (alpha != 1.0f) {
        float *o = sc->o + r * d;
        for (int64_t i = 0; i < d; i += 16)
            _mm512_storeu_ps(o + i, _mm512_mul_ps(_mm512_loadu_ps(o + i), _mm512_set1_ps(alpha)));
    }
}
#endif

/* One item of graft_paged_prefill: queries [first, first + qt) of sequence seq (its chunk
 * starts at position n - q_len; q rows from t0), kv head kvh and its group's G query heads;
 * packed, offsets: graft_prefill_amx_pack's, for num_seqs sequences. */
void graft_prefill_amx_item(const uint16_t *q, const uint16_t *packed, const int64_t *offsets,
                            int64_t num_seqs, int64_t seq, int64_t t0, int64_t q_len, int64_t n,
                            int64_t first, int64_t qt, int64_t kvh, int64_t group, int64_t kv_heads,
                            int64_t d, float scale, uint16_t *out, void *scratch) {
#if PREFILL_AMX
    amx_scratch *sc = (amx_scratch *)scratch;
    const uint16_t *kp = packed + head_at(offsets, seq, kvh, n, d), *vp = kp + offsets[num_seqs];
    const int64_t rows = qt * group, rp = rows_padded(rows), hq = kv_heads * group;
    const int64_t base = n - q_len + first, last_pos = base + qt - 1;
    tile_rows_init(sc->pos, sc->m, sc->l, rows, rp, group, qt, base);
    for (int64_t r = 0; r < rp; ++r) { /* a padding row copies the tile's last position */
        const int64_t i = r < rows ? r / group : qt - 1, head = r < rows ? r % group : 0;
        memcpy(sc->q + r * d, q + ((t0 + first + i) * hq + kvh * group + head) * d,
               sizeof(uint16_t) * (size_t)d);
    }
    memset(sc->o, 0, sizeof(float) * (size_t)(rp * d));
    for (int64_t k0 = 0; k0 <= last_pos; k0 += KC) {
        const int64_t nk = last_pos + 1 - k0 < KC ? last_pos + 1 - k0 : KC;
        for (int64_t r0 = 0; r0 < rp; r0 += 32) {
            const int64_t seen = sc->pos[r0 + 31] + 1 - k0; /* keys the block's rows may see */
            if (seen <= 0) continue;
            const int64_t keys = padded_keys(seen < nk ? seen : nk);
            scores(sc, kp, d, r0, k0 / 16, keys);
            for (int64_t r = r0; r < r0 + 32; ++r) {
                const int64_t vis = sc->pos[r] + 1 - k0;
                softmax_row(sc, rp, r, vis < nk ? vis : nk, keys, d, scale);
            }
            values(sc, vp, d, rp, r0, k0 / 32, keys);
        }
    }
    for (int64_t r = 0; r < rows; ++r) {
        const float inv = 1.0f / sc->l[r];
        uint16_t *dst = out + ((t0 + first + r / group) * hq + kvh * group + r % group) * d;
        for (int64_t i = 0; i < d; ++i) dst[i] = float_to_bf16(sc->o[r * d + i] * inv);
    }
#else
    (void)q; (void)packed; (void)offsets; (void)num_seqs; (void)seq; (void)t0; (void)q_len;
    (void)n; (void)first; (void)qt;
    (void)kvh; (void)group; (void)kv_heads; (void)d; (void)scale; (void)out; (void)scratch;
#endif
}
