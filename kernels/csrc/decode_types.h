/* The descriptors the one-call decode step reads (decode_step_cpu.c, moe_cpu.c), filled by
 * Python (kernels/c_signatures.py mirrors every struct here, checked at build time). */
#ifndef GRAFT_DECODE_TYPES_H
#define GRAFT_DECODE_TYPES_H
#include <stdint.h>

typedef struct {
    int64_t kind; /* quant_linear_cpu.c KIND_*: 0 int8, 1 int4, 2 bf16, 3 fp32 */
    const void *w;
    const float *scale8;
    const uint16_t *scales4;
    const uint16_t *mins4; /* int4: fp16 per-group minimums */
    int64_t group;
    const float *bias; /* NULL: no bias */
    int64_t n, k, nb;  /* outputs, inputs, 16-lane blocks */
} graft_linear_t;

typedef struct {
    graft_linear_t qkv, o, gate_up, down;
    const void *in_norm, *post_norm; /* [hidden] of dims.act_dtype */
    const void *q_norm, *k_norm;     /* [head_dim] or NULL (Qwen3's per-head norms) */
    void *k_cache, *v_cache;          /* [num_blocks, block_size, Hkv, D] of dims.cache_dtype */
    float *k_scale, *v_scale;         /* int8 caches: [num_blocks, block_size, Hkv], else NULL */
} graft_layer_t;

typedef struct {
    int64_t hidden, num_heads, num_kv_heads, head_dim, rot, interleaved;
    int64_t block_size, num_blocks, max_blocks;
    int64_t cache_dtype; /* paged_decode_cpu.c codes: 0 fp32, 1 bf16, 3 int8 */
    int64_t act_dtype;   /* of the activations, norm weights, embeddings, RoPE: 0 fp32, 1 bf16 */
    float eps, qk_eps, scale;
} graft_dims_t;

/* The prompt chunks of a step that is not all decode (graft_decode_layers): rows
 * [num_decodes, T) are the chunks of num_seqs sequences, each attending causally to its
 * cached tokens and itself (paged_prefill_cpu.c); rows outside every chunk get zeros. */
typedef struct {
    int64_t num_decodes;         /* rows [0, num_decodes) decode one token each */
    int64_t num_seqs;            /* sequences whose chunks follow them */
    const int32_t *tables;       /* [num_seqs, max_blocks] */
    int64_t max_blocks;
    const int32_t *cu_seqlens;   /* [num_seqs + 1]: each chunk's rows, counted from num_decodes */
    const int32_t *context_lens; /* [num_seqs]: tokens in the cache once the chunk is stored */
} graft_prefill_t;

/* What a whole decode step needs besides the layers: the embedding table, the final norm,
 * the output head (a C-layout linear) and the RoPE tables of every position (the tables and
 * norm of dims.act_dtype; the logits fp32). */
typedef struct {
    const void *embed;        /* [vocab, hidden] */
    int64_t vocab;
    const void *final_norm;   /* [hidden] */
    float final_eps;
    graft_linear_t head;      /* head.n logits per row */
    const void *cos_table, *sin_table; /* [max_pos, rot / 2] */
    int64_t max_pos;
    /* -1: embed holds rows of dims.act_dtype. 0-3: a table held in a weight scheme, its
     * canonical tensors (graft.kernels.quant_formats), kind as graft_linear_t's: int8 q
     * [vocab, hidden] with fp32 embed_scales [vocab] (embed_group 0) or [vocab, hidden /
     * embed_group] (int8-gG); int4 two columns a byte (low nibble
     * first) with fp16 embed_scales and embed_mins [vocab, hidden / embed_group]; bf16; fp32.
     * 4-7: fp32 / bf16 / int8 / int4 rows in a linear's C layout (a tied head's copy of the
     * table, or the head itself), embed_scales its layout's scales (cpu_quant.pack) */
    int64_t embed_kind, embed_group;
    const void *embed_scales, *embed_mins;
} graft_step_t;

/* A sparse layer's MLP (serving/models/moe.py MoEBlock): the fp32 router, the routed experts'
 * C-layout linears and the optional shared experts. */
typedef struct {
    const float *router;      /* [num_experts, hidden] fp32 */
    const float *router_bias; /* sigmoid scoring: the score-correction bias [num_experts], else NULL */
    int64_t num_experts, top_k;
    int64_t scoring;          /* 0: softmax over all experts (Qwen3-MoE); 1: sigmoid, grouped (GLM-4.5) */
    int64_t norm_topk, n_group, topk_group;
    float routed_scale;       /* sigmoid scoring: the weights' factor */
    const graft_linear_t *gate_up, *down;       /* [num_experts] */
    graft_linear_t shared_gate_up, shared_down; /* n = 0: no shared experts */
} graft_moe_t;

int graft_quant_linear(int kind, const float *x, int64_t ldx, int64_t M, int64_t K, const void *w,
                        const float *scale8, const uint16_t *scales4, const uint16_t *mins4,
                        int64_t group, const float *bias, float *y, int64_t ldy, int64_t N,
                        int64_t NB, int nthreads);
void graft_silu_mul(const void *gate_up, int64_t stride, void *out, int64_t rows, int64_t inter,
                    int dtype, int num_threads);
int64_t graft_moe_block_scratch(const graft_moe_t *m, int64_t hidden, int64_t tokens);
int64_t graft_moe_block(const graft_moe_t *m, int64_t hidden, int64_t T, const float *x,
                        float *out, float *scratch, int nt);

/* y [rows, l->n] = x [rows, l->k] through the C-layout linear l; nonzero: no scratch memory */
static inline int linear(const graft_linear_t *l, const float *x, int64_t rows, float *y, int nt) {
    return graft_quant_linear((int)l->kind, x, l->k, rows, l->k, l->w, l->scale8, l->scales4,
                              l->mins4, l->group, l->bias, y, l->n, l->n, l->nb, nt);
}

/* act [rows, inter] = silu(gate) * up of the C-layout MLP gate_up, down: y [rows, down->n]
 * = down(act); work: 3 * inter floats per row */
static inline int gated_mlp(const graft_linear_t *gate_up, const graft_linear_t *down,
                            const float *x, int64_t rows, float *y, float *work, int nt) {
    const int64_t inter = down->k;
    float *act = work + rows * 2 * inter;
    if (linear(gate_up, x, rows, work, nt)) return -1;
    graft_silu_mul(work, 2 * inter, act, rows, inter, 0, nt);
    return linear(down, act, rows, y, nt);
}

#endif
