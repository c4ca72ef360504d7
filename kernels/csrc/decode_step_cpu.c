/* Every decoder layer of one step in one call (fp32 or bf16 activations, CPU): an all-decode
 * step, or one with prompt chunks (graft_decode_layers' prefill rows).
 *
 * Why: at batch 1 a SmolLM2 step is ~12 small ops per layer (norm, linear, rotary, KV store,
 * attention, silu * up...) x 30 layers. Each op costs a few microseconds of Python, dispatch
 * and tensor allocation around a few microseconds of work, so the overhead outweighed the
 * int8/int4 linears themselves. A 512-token prompt paid the same ~360 calls' Python: 29-68 ms
 * of a 650-730 ms fp32 step (SmolLM2, 2 threads), while the second thread waited. Here the
 * same C functions the per-op path calls (norm_rope_cpu.c, paged_decode_cpu.c,
 * paged_prefill_cpu.c, quant_linear_cpu.c) run back to back on preallocated scratch, in the
 * per-op path's order: the result is bit-identical to it.
 * An MoE layer's MLP is graft_moe_block (moe_cpu.c), the call its per-op path makes too.
 *
 * bf16 activations (a bf16 engine, dims.act_dtype 1): every buffer between the ops holds bf16
 * as the per-op path's tensors do, and the norm weights and RoPE tables are bf16 too. A linear
 * widens its rows to fp32, runs the fp32-in, fp32-out C linear and rounds the result to bf16,
 * as the per-op path's quant_linear does (x.float(), then .to(bfloat16)); the logits are
 * rounded to bf16 and widened back, as the per-op head's .float() leaves them. Dense layers
 * and bf16 KV caches only (the MoE block and the int8 cache store take fp32 rows).
 */
#include <stdint.h>
#include <string.h>

#include "bf16.h"
#include "decode_types.h"

void graft_rms_norm(const void *x, int64_t x_stride, const void *residual, int64_t res_stride,
                    const void *weight, void *out, void *sum_out, int64_t rows, int64_t d,
                    float eps, int dtype, int wdtype, int num_threads);
void graft_rotary(const void *x, int64_t x_stride, const void *cos_t, const void *sin_t,
                  void *out, int64_t tokens, int64_t heads, int64_t d, int64_t rot,
                  int interleaved, int dtype, int cdtype, int num_threads);
int64_t graft_store_kv(const void *k, int64_t k_stride, const void *v, int64_t v_stride,
                       void *k_cache, void *v_cache, const int64_t *slots, int64_t tokens,
                       int64_t width, int64_t num_slots, int dtype, int cache_dtype);
int64_t graft_store_kv_i8(const float *k, int64_t k_stride, const float *v, int64_t v_stride,
                          int8_t *k_cache, int8_t *v_cache, float *k_scale, float *v_scale,
                          const int64_t *slots, int64_t tokens, int64_t heads, int64_t d,
                          int64_t num_slots);
int64_t graft_paged_decode(const void *q, const void *k_cache, const void *v_cache,
                           const int32_t *block_tables, const int32_t *context_lens, void *out,
                           int64_t num_seqs, int64_t num_q_heads, int64_t num_kv_heads,
                           int64_t head_dim, int64_t block_size, int64_t max_blocks,
                           int64_t num_blocks, float scale, const float *k_scale,
                           const float *v_scale, int dtype, int cache_dtype, int num_threads);
int64_t graft_paged_prefill(const void *q, const void *k_cache, const void *v_cache,
                            const int32_t *block_tables, const int32_t *cu_seqlens,
                            const int32_t *context_lens, void *out, int64_t num_seqs,
                            int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim,
                            int64_t block_size, int64_t max_blocks, int64_t num_blocks,
                            float scale, const float *k_scale, const float *v_scale, int dtype,
                            int cache_dtype, int num_threads);
int graft_quant_isa(void);
int graft_quant_bf16_io(const uint16_t *x, int64_t ldx, int64_t M, int64_t K, const void *w,
                        const float *bias, uint16_t *y, int64_t ldy, int64_t N, int64_t NB,
                        int nthreads);

enum { F32 = 0, I8 = 3 }; /* dtype codes; 1 is bf16 */
enum { KIND_BF16 = 2 };   /* quant_linear_cpu.c's code */
enum { VNNI = 3 };        /* graft_quant_isa() from avx512-vnni up (AVX512-BF16 dot products) */

/* Element i of a buffer of activations `es` bytes wide (4: fp32, 2: bf16). */
#define AT(p, i) ((void *)((char *)(p) + (size_t)(i) * es))

/* n bf16 values widened into fp32 dst (exact). */
static void widen_rows(const void *src, float *dst, int64_t n, int nt) {
#pragma omp parallel for num_threads(nt) if (n >= (1 << 16))
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(((const uint16_t *)src)[i]);
}

/* n bf16 values rounded from fp32 src into dst, as torch's .to(bfloat16) rounds. */
static void narrow_rows(const float *src, uint16_t *dst, int64_t n, int nt) {
#pragma omp parallel for num_threads(nt) if (n >= (1 << 16))
    for (int64_t i = 0; i < n; ++i) dst[i] = float_to_bf16(src[i]);
}

/* y [rows, l->n] = x [rows, l->k] through the C-layout linear l, in the activations' dtype:
 * bf16 rows are widened into stage (rows * (l->k + l->n) floats) and the fp32 product is
 * rounded into y. bf16 weights on AVX512-BF16 (AMX tiles included) take bf16 rows as they
 * are, as the per-op path's quant_linear does there (graft.kernels.cpu_quant.bf16_dot): the
 * same products without the two conversions. Nonzero: no scratch memory. */
static int act_linear(const graft_linear_t *l, const void *x, int64_t rows, void *y, int act,
                      float *stage, int nt) {
    if (act == F32) return linear(l, x, rows, y, nt);
    if (l->kind == KIND_BF16 && graft_quant_isa() >= VNNI) {
        const int status = graft_quant_bf16_io(x, l->k, rows, l->k, l->w, l->bias, y, l->n, l->n,
                                               l->nb, nt);
        if (status <= 0) return status; /* 1: a build without AVX512-BF16 */
    }
    float *in = stage, *out = stage + rows * l->k;
    widen_rows(x, in, rows * l->k, nt);
    if (linear(l, in, rows, out, nt)) return -1;
    narrow_rows(out, y, rows * l->n, nt);
    return 0;
}

/* Floats of the bf16 linears' staging for `tokens` rows: the widest input and output of any
 * layer's linear (none for fp32 activations). */
static int64_t stage_floats(const graft_layer_t *layers, int64_t num_layers, const graft_dims_t *d,
                            int64_t tokens) {
    if (d->act_dtype == F32) return 0;
    int64_t most = 0;
    for (int64_t i = 0; i < num_layers; ++i) {
        const graft_linear_t *ls[4] = {&layers[i].qkv, &layers[i].o, &layers[i].gate_up, &layers[i].down};
        for (int j = 0; j < 4; ++j) most = ls[j]->k + ls[j]->n > most ? ls[j]->k + ls[j]->n : most;
    }
    return tokens * most;
}

/* Paged attention of the step's rows q [T, Hq * D] into out: the decode rows through tables
 * and lens, then the prompt chunks of pf (NULL: every row decodes), as the per-op path's
 * paged_attention splits them. Returns 0, -1 (no scratch) or 2 (a bad block table, or a
 * chunk longer than its context). */
static int64_t step_attention(const graft_layer_t *L, const graft_dims_t *d, int64_t T,
                              const void *q, const int32_t *tables, const int32_t *lens,
                              const graft_prefill_t *pf, void *out, int nt) {
    const int act = (int)d->act_dtype;
    const size_t es = act == F32 ? sizeof(float) : sizeof(uint16_t);
    const int64_t qs = d->num_heads * d->head_dim, nd = pf ? pf->num_decodes : T;
    int64_t bad = nd ? graft_paged_decode(q, L->k_cache, L->v_cache, tables, lens, out, nd,
                                          d->num_heads, d->num_kv_heads, d->head_dim,
                                          d->block_size, d->max_blocks, d->num_blocks, d->scale,
                                          L->k_scale, L->v_scale, act, (int)d->cache_dtype, nt)
                     : 0;
    if (!bad && pf && nd < T) {
        const int64_t lo = nd + pf->cu_seqlens[0], hi = nd + pf->cu_seqlens[pf->num_seqs];
        memset(AT(out, nd * qs), 0, es * (size_t)((lo - nd) * qs)); /* rows of no chunk */
        memset(AT(out, hi * qs), 0, es * (size_t)((T - hi) * qs));
        if (hi > lo)
            bad = graft_paged_prefill(AT(q, nd * qs), L->k_cache, L->v_cache, pf->tables,
                                      pf->cu_seqlens, pf->context_lens, AT(out, nd * qs),
                                      pf->num_seqs, d->num_heads, d->num_kv_heads, d->head_dim,
                                      d->block_size, pf->max_blocks, d->num_blocks, d->scale,
                                      L->k_scale, L->v_scale, act, (int)d->cache_dtype, nt);
    }
    return bad < 0 ? -1 : bad ? 2 : 0;
}

/* One layer's attention half, in the per-op path's order: the residual add and input norm
 * of h (first: h is the embeddings, the residual starts as them), qkv, Qwen3's q/k norms,
 * rotary, the KV store, paged attention, o_proj, and the post-attention norm with its
 * residual add into normed [T, hidden] (the MLP's input). work: the scratch after normed.
 * Returns 0, -1 (no scratch), 1 (a KV slot out of range) or 2 (a bad block table). */
static int64_t attention_block(const graft_layer_t *L, const graft_dims_t *d, int64_t T,
                               const void *h, void *residual, int first, const void *cos_t,
                               const void *sin_t, const int64_t *slots, const int32_t *tables,
                               const int32_t *lens, const graft_prefill_t *pf, float *normed,
                               float *work, float *stage, int nt) {
    const int64_t H = d->hidden, D = d->head_dim, qs = d->num_heads * D, kvs = d->num_kv_heads * D;
    const int64_t nqkv = qs + 2 * kvs, num_slots = d->num_blocks * d->block_size;
    const int act = (int)d->act_dtype;
    const size_t es = act == F32 ? sizeof(float) : sizeof(uint16_t);
    /* each buffer is sized in floats, so it holds its bf16 rows too */
    float *o = work, *qkv = o + T * H, *qn = qkv + T * nqkv;
    float *kn = qn + T * qs, *qr = kn + T * kvs, *attn = qr + T * qs, *kr = attn + T * qs;
    if (first) { /* no residual yet: it starts as the embeddings */
        memcpy(residual, h, es * (size_t)(T * H));
        graft_rms_norm(h, H, 0, 0, L->in_norm, normed, 0, T, H, d->eps, act, act, nt);
    } else {
        graft_rms_norm(h, H, residual, H, L->in_norm, normed, residual, T, H, d->eps, act, act, nt);
    }
    if (act_linear(&L->qkv, normed, T, qkv, act, stage, nt)) return -1;
    const void *qsrc = qkv, *ksrc = AT(qkv, qs);
    int64_t qstride = nqkv, kstride = nqkv;
    if (L->q_norm) { /* per-head RMSNorm of q and k before rotary (Qwen3): a token's heads */
#pragma omp parallel for num_threads(nt) if (T >= 16)
        for (int64_t t = 0; t < T; ++t) {
            graft_rms_norm(AT(qkv, t * nqkv), D, 0, 0, L->q_norm, AT(qn, t * qs), 0,
                           d->num_heads, D, d->qk_eps, act, act, 1);
            graft_rms_norm(AT(qkv, t * nqkv + qs), D, 0, 0, L->k_norm, AT(kn, t * kvs), 0,
                           d->num_kv_heads, D, d->qk_eps, act, act, 1);
        }
        qsrc = qn, ksrc = kn, qstride = qs, kstride = kvs;
    }
    graft_rotary(qsrc, qstride, cos_t, sin_t, qr, T, d->num_heads, D, d->rot,
                 (int)d->interleaved, act, act, nt);
    graft_rotary(ksrc, kstride, cos_t, sin_t, kr, T, d->num_kv_heads, D, d->rot,
                 (int)d->interleaved, act, act, nt);
    const int64_t stored = d->cache_dtype == I8
        ? graft_store_kv_i8(kr, kvs, qkv + qs + kvs, nqkv, L->k_cache, L->v_cache, L->k_scale,
                            L->v_scale, slots, T, d->num_kv_heads, D, num_slots)
        : graft_store_kv(kr, kvs, AT(qkv, qs + kvs), nqkv, L->k_cache, L->v_cache, slots, T,
                         kvs, num_slots, act, (int)d->cache_dtype);
    if (stored) return 1;
    const int64_t bad = step_attention(L, d, T, qr, tables, lens, pf, attn, nt);
    if (bad) return bad;
    if (act_linear(&L->o, attn, T, o, act, stage, nt)) return -1;
    graft_rms_norm(o, H, residual, H, L->post_norm, normed, residual, T, H, d->eps, act, act, nt);
    return 0;
}

/* Floats of the attention half's scratch (normed and work) for `tokens` rows. */
static int64_t attention_scratch(const graft_dims_t *d, int64_t tokens) {
    const int64_t q = d->num_heads * d->head_dim, kv = d->num_kv_heads * d->head_dim;
    return tokens * (2 * d->hidden + (q + 2 * kv) + 3 * q + 2 * kv);
}

/* The dense MLP in the activations' dtype: gate|up, silu(gate) * up, down, as gated_mlp
 * (decode_types.h) runs it for fp32 rows; work: 3 * inter floats per row. */
static int act_gated_mlp(const graft_layer_t *L, const void *x, int64_t rows, void *y, int act,
                         float *work, float *stage, int nt) {
    if (act == F32) return gated_mlp(&L->gate_up, &L->down, x, rows, y, work, nt);
    const int64_t inter = L->down.k;
    float *act_rows = work + rows * 2 * inter;
    if (act_linear(&L->gate_up, x, rows, work, act, stage, nt)) return -1;
    graft_silu_mul(work, 2 * inter, act_rows, rows, inter, act, nt);
    return act_linear(&L->down, act_rows, rows, y, act, stage, nt);
}

/* Floats of the MLP half's scratch for `tokens` rows, the most any layer needs: a dense
 * layer's gate|up and activation, or an MoE layer's (graft_moe_block_scratch). */
static int64_t mlp_scratch(const graft_layer_t *layers, const graft_moe_t *const *moes,
                           int64_t num_layers, const graft_dims_t *d, int64_t tokens) {
    int64_t most = 0;
    for (int64_t i = 0; i < num_layers; ++i) {
        const int64_t need = moes && moes[i] ? graft_moe_block_scratch(moes[i], d->hidden, tokens)
                                             : 3 * tokens * layers[i].down.k;
        most = need > most ? need : most;
    }
    return most;
}

/* Scratch floats graft_decode_layers needs for `tokens` rows: the attention half's, the
 * MLP's, then the bf16 linears' staging. */
int64_t graft_decode_scratch(const graft_layer_t *layers, const graft_moe_t *const *moes,
                             int64_t num_layers, const graft_dims_t *d, int64_t tokens) {
    return attention_scratch(d, tokens) + mlp_scratch(layers, moes, num_layers, d, tokens)
           + stage_floats(layers, num_layers, d, tokens);
}

/* h [T, hidden]: the embeddings in, the last layer's MLP output out; residual [T, hidden]
 * out: the residual stream before the final norm (the model adds and norms the rows it
 * needs logits for); both, and cos/sin, of dims.act_dtype. moes: NULL (a dense model), or
 * per layer its MoE block (NULL: that layer is dense; fp32 activations only). cos/sin
 * [T, rot/2]; slots [T]; tables [nd, max_blocks] and lens [nd] of the nd decode rows: all T
 * when prefill is NULL, else prefill->num_decodes, whose prompt chunks follow.
 * Returns 0, or 1 + layer * 2 + (0: a KV slot out of range, 1: a bad block table) on the
 * first failure, or -1 when scratch (attention, int4 group sums) could not be allocated. */
int64_t graft_decode_layers(const graft_layer_t *layers, const graft_moe_t *const *moes,
                            int64_t num_layers, const graft_dims_t *d, int64_t T, void *h,
                            void *residual, const void *cos_t, const void *sin_t,
                            const int64_t *slots, const int32_t *tables, const int32_t *lens,
                            const graft_prefill_t *prefill, float *scratch, int nt) {
    const int act = (int)d->act_dtype;
    float *normed = scratch, *mlp = scratch + attention_scratch(d, T);
    float *stage = mlp + mlp_scratch(layers, moes, num_layers, d, T);
    for (int64_t i = 0; i < num_layers; ++i) {
        const graft_layer_t *L = &layers[i];
        const int64_t bad = attention_block(L, d, T, h, residual, i == 0, cos_t, sin_t, slots,
                                            tables, lens, prefill, normed, normed + T * d->hidden,
                                            stage, nt);
        if (bad) return bad < 0 ? -1 : bad + 2 * i;
        if (moes && moes[i] ? graft_moe_block(moes[i], d->hidden, T, normed, h, mlp, nt)
                            : act_gated_mlp(L, normed, T, h, act, mlp, stage, nt))
            return -1;
    }
    return 0;
}

/* Floats of scratch graft_decode_step needs for `tokens` rows: the layers' own, plus the
 * embeddings, the residual stream, the rows' cos/sin and, for bf16 activations, the final
 * norm's rows widened for the head. */
int64_t graft_decode_step_scratch(const graft_layer_t *layers, const graft_moe_t *const *moes,
                                  int64_t num_layers, const graft_dims_t *d, int64_t tokens) {
    return graft_decode_scratch(layers, moes, num_layers, d, tokens)
           + tokens * (2 * d->hidden + d->rot) + (d->act_dtype == F32 ? 0 : tokens * d->hidden);
}

static inline float half_to_float(uint16_t x) {
    _Float16 h;
    memcpy(&h, &x, 2);
    return (float)h;
}

/* Row `id` of a held table (graft_step_t.embed_kind >= 0) into dst, in act's dtype: the bits
 * of the per-op path's QuantizedWeight.rows() (int8 q * scale, per row or per group; int4
 * q * scale + min), from canonical tensors or a C layout, then act's rounding. int4's product
 * is exact (a 4-bit code times an fp16 scale), so a fused multiply-add gives torch's
 * mul-then-add bits. */
static void held_embedding_row(
    const graft_step_t *s, int64_t id, int64_t H, int act, void *dst) {
    enum { INT8 = 0, INT4 = 1, BF16_ROWS = 2, F32_LAYOUT = 4, BF16_LAYOUT = 5, INT8_LAYOUT = 6,
           INT4_LAYOUT = 7 };
    /* the C layouts (cpu_quant.pack): pairs of 16-row blocks, a step per column (fp32) or
     * column pair (bf16), the pair's blocks side by side in each step */
    const int64_t pair = id / 32, lane = id / 16 % 2 * 16 + id % 16;
    for (int64_t k = 0; k < H; ++k) {
        float v;
        if (s->embed_kind == F32_LAYOUT) {
            v = ((const float *)s->embed)[(pair * H + k) * 32 + lane];
        } else if (s->embed_kind == BF16_LAYOUT) {
            const int64_t word = (pair * ((H + 1) / 2) + k / 2) * 32 + lane;
            v = bf16_to_float(((const uint16_t *)s->embed)[word * 2 + k % 2]);
        } else if (s->embed_kind == INT8_LAYOUT) { /* q + 128, 4 columns a lane word */
            const uint8_t byte = ((const uint8_t *)s->embed)[((pair * ((H + 3) / 4) + k / 4) * 32 + lane) * 4 + k % 4];
            const int64_t G = s->embed_group;
            const int64_t at = G ? (pair * (H / G) + k / G) * 32 + lane : id; /* [NB/2][K/G][2][16] or [N] */
            v = (float)((int)byte - 128) * ((const float *)s->embed_scales)[at];
        } else if (s->embed_kind == INT4_LAYOUT) { /* byte t: column 8j + t low, 8j + 4 + t high */
            const uint8_t byte = ((const uint8_t *)s->embed)[((pair * (H / 8) + k / 8) * 32 + lane) * 4 + k % 4];
            const float q = (float)(k % 8 >= 4 ? byte >> 4 : byte & 15);
            const int64_t at = (pair * (H / s->embed_group) + k / s->embed_group) * 64 + lane; /* [NB/2][G][4][16] */
            const uint16_t *sc = (const uint16_t *)s->embed_scales;
            const float scaled = q * half_to_float(sc[at]);
            v = scaled + half_to_float(sc[at + 32]);
        } else if (s->embed_kind == INT8) {
            const int64_t g = s->embed_group ? id * (H / s->embed_group) + k / s->embed_group : id;
            v = (float)((const int8_t *)s->embed)[id * H + k] * ((const float *)s->embed_scales)[g];
        } else if (s->embed_kind == INT4) {
            const uint8_t byte = ((const uint8_t *)s->embed)[(id * H + k) / 2];
            const int64_t g = id * (H / s->embed_group) + k / s->embed_group;
            const float q = (float)(k & 1 ? byte >> 4 : byte & 15);
            const float scaled = q * half_to_float(((const uint16_t *)s->embed_scales)[g]);
            v = scaled + half_to_float(((const uint16_t *)s->embed_mins)[g]);
        } else if (s->embed_kind == BF16_ROWS) {
            v = bf16_to_float(((const uint16_t *)s->embed)[id * H + k]);
        } else {
            v = ((const float *)s->embed)[id * H + k];
        }
        if (act == F32) ((float *)dst)[k] = v;
        else ((uint16_t *)dst)[k] = float_to_bf16(v);
    }
}

/* A whole all-decode step, ids in, logits out: embedding rows, every layer
 * (graft_decode_layers), the final norm (with the last residual add) and the head, in the
 * order and with the functions the per-op path uses, so the logits are the same bits. At
 * batch 1 the Python between those calls cost more than it looked: each op after the weights
 * have streamed through the caches runs on a cold interpreter (~0.2 ms each measured).
 * ids, positions, slots [T]; tables [T, max_blocks]; lens [T]; logits [T, head.n].
 * Returns graft_decode_layers' codes, or -2 for a token id outside the embedding, -3 for a
 * position outside the RoPE tables (nothing is computed then). */
int64_t graft_decode_step(const graft_layer_t *layers, const graft_moe_t *const *moes,
                          int64_t num_layers, const graft_dims_t *d, const graft_step_t *s,
                          int64_t T, const int64_t *ids, const int64_t *positions,
                          const int64_t *slots, const int32_t *tables, const int32_t *lens,
                          float *logits, float *scratch, int nt) {
    const int64_t H = d->hidden, half = d->rot / 2;
    const int act = (int)d->act_dtype;
    const size_t es = act == F32 ? sizeof(float) : sizeof(uint16_t);
    for (int64_t t = 0; t < T; ++t) {
        if (ids[t] < 0 || ids[t] >= s->vocab) return -2;
        if (positions[t] < 0 || positions[t] >= s->max_pos) return -3;
    }
    float *h = scratch + graft_decode_scratch(layers, moes, num_layers, d, T), *residual = h + T * H;
    float *cos_t = residual + T * H, *sin_t = cos_t + T * half, *wide = sin_t + T * half;
    for (int64_t t = 0; t < T; ++t) {
        if (s->embed_kind < 0) memcpy(AT(h, t * H), AT(s->embed, ids[t] * H), es * (size_t)H);
        else held_embedding_row(s, ids[t], H, act, AT(h, t * H));
        memcpy(AT(cos_t, t * half), AT(s->cos_table, positions[t] * half), es * (size_t)half);
        memcpy(AT(sin_t, t * half), AT(s->sin_table, positions[t] * half), es * (size_t)half);
    }
    const int64_t bad = graft_decode_layers(layers, moes, num_layers, d, T, h, residual, cos_t,
                                            sin_t, slots, tables, lens, 0, scratch, nt);
    if (bad) return bad;
    float *normed = scratch; /* the layers' scratch is free again */
    graft_rms_norm(h, H, residual, H, s->final_norm, normed, residual, T, H, s->final_eps, act,
                   act, nt);
    if (act == F32) return linear(&s->head, normed, T, logits, nt) ? -1 : 0;
    widen_rows(normed, wide, T * H, nt);
    if (linear(&s->head, wide, T, logits, nt)) return -1;
#pragma omp parallel for num_threads(nt) if (T * s->head.n >= (1 << 16))
    for (int64_t i = 0; i < T * s->head.n; ++i) logits[i] = bf16_round(logits[i]);
    return 0;
}
