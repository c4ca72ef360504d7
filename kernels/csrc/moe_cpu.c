/* The MLP of a mixture-of-experts layer in one call (serving/models/moe.py MoEBlock): the
 * fp32 router, every active expert once on its rows, the sum over each token's k slots, the
 * shared experts.
 *
 * Why in C: at batch 1 the router (a [E, hidden] matvec, softmax or sigmoid, top-k) and the
 * glue around the experts took ~0.15 ms of Python per layer, as much as a layer's attention;
 * here they are microseconds, and the one-call decode step (decode_step_cpu.c) runs MoE layers
 * too. The block is the same code on every path of the engine (per-op and one-call decode,
 * prefill), so a token's numbers do not depend on its batch: a row's router logits are its own
 * dot products, a row's expert outputs are the (batch-invariant) C linears', and its slots
 * are summed in slot order. The choices follow transformers (Qwen3-MoE: softmax over all
 * experts, top-k, optionally renormalised; GLM-4.5: sigmoid scores plus a correction bias that
 * only steers the choice, top-k within the best groups, weights renormalised and scaled);
 * the values can differ from torch's router in the last bits (another summation order and exp),
 * which can flip only an exact near-tie between two experts.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "decode_types.h"

static int64_t even(int64_t n) { return (n + 1) & ~(int64_t)1; } /* int64 regions stay aligned */

typedef float v8f __attribute__((vector_size(32)));

/* a . b over n floats: eight lanes of partial sums (GCC vectors: one AVX register where there
 * is one), reduced in a fixed order, so every row gets the same bits whatever its batch */
static float dot(const float *a, const float *b, int64_t n) {
    v8f acc = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v8f va, vb;
        memcpy(&va, a + i, sizeof va);
        memcpy(&vb, b + i, sizeof vb);
        acc += va * vb;
    }
    for (; i < n; ++i) acc[i & 7] += a[i] * b[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* ids[0..k) = the k largest of v[0..n) in descending order (ties: the lower index first);
 * entries equal to -INFINITY are never taken while others remain */
static void top_k(const float *v, int64_t n, int64_t k, int64_t *ids) {
    for (int64_t j = 0; j < k; ++j) {
        int64_t best = -1;
        for (int64_t e = 0; e < n; ++e) {
            int taken = 0;
            for (int64_t i = 0; i < j; ++i) taken |= ids[i] == e;
            if (!taken && (best < 0 || v[e] > v[best])) best = e;
        }
        ids[j] = best;
    }
}

/* One token's routing: w [k] and ids [k] from its router logits l [E] (overwritten with the
 * scores); choice [E] scratch. */
static void route_row(const graft_moe_t *m, float *l, float *choice, float *w, int64_t *ids) {
    const int64_t E = m->num_experts, k = m->top_k;
    float sum = 0.0f;
    if (m->scoring == 0) { /* softmax over all experts */
        float top = l[0];
        for (int64_t e = 1; e < E; ++e) top = l[e] > top ? l[e] : top;
        for (int64_t e = 0; e < E; ++e) sum += (l[e] = expf(l[e] - top));
        for (int64_t e = 0; e < E; ++e) l[e] /= sum;
        top_k(l, E, k, ids);
        sum = 0.0f;
        for (int64_t j = 0; j < k; ++j) sum += (w[j] = l[ids[j]]);
        if (m->norm_topk)
            for (int64_t j = 0; j < k; ++j) w[j] /= sum;
        return;
    }
    /* sigmoid scores; the bias steers the choice only; top-k within the best topk_group of
     * n_group groups, a group's worth being its two best choices */
    const int64_t G = m->n_group, per = E / G;
    for (int64_t e = 0; e < E; ++e) {
        l[e] = 1.0f / (1.0f + expf(-l[e]));
        choice[e] = l[e] + (m->router_bias ? m->router_bias[e] : 0.0f);
    }
    if (G > 1) {
        float group_score[G];
        int64_t best[2], groups[G];
        for (int64_t g = 0; g < G; ++g) {
            top_k(choice + g * per, per, per > 1 ? 2 : 1, best);
            group_score[g] = choice[g * per + best[0]] + (per > 1 ? choice[g * per + best[1]] : 0.0f);
        }
        top_k(group_score, G, m->topk_group, groups);
        for (int64_t g = 0; g < G; ++g) {
            int keep = 0;
            for (int64_t i = 0; i < m->topk_group; ++i) keep |= groups[i] == g;
            if (!keep)
                for (int64_t e = g * per; e < (g + 1) * per; ++e) choice[e] = -INFINITY;
        }
    }
    top_k(choice, E, k, ids);
    for (int64_t j = 0; j < k; ++j) sum += (w[j] = l[ids[j]]);
    for (int64_t j = 0; j < k; ++j)
        w[j] = (m->norm_topk ? w[j] / (sum + 1e-20f) : w[j]) * m->routed_scale;
}

/* Floats of scratch graft_moe_block needs for `tokens` rows. An expert gets at most one row
 * per token (a token's k experts are distinct). */
int64_t graft_moe_block_scratch(const graft_moe_t *m, int64_t hidden, int64_t tokens) {
    const int64_t E = m->num_experts, S = tokens * m->top_k;
    const int64_t inter = m->down[0].k, shared = m->shared_down.n ? m->shared_down.k : 0;
    return 2 * even(tokens * E) + 2 * even(S) + 2 * 3 * S /* ids, order, where (int64) */
           + 2 * S * hidden /* gathered rows, their outputs */ + tokens * hidden /* shared */
           + 3 * tokens * (inter > shared ? inter : shared);
}

/* out [T, hidden] = the MoE MLP of x [T, hidden] (fp32, rows contiguous; out must not overlap
 * x). Slot s = token s / k, its (s % k)-th choice. Batch 1 runs the k experts in slot order on
 * x itself; a batch sorts its slots by expert (stable: tokens in order), gathers each expert's
 * rows into one range and runs every active expert once. Returns 0, or -1 when the linears'
 * scratch (int4 group sums) could not be allocated. */
int64_t graft_moe_block(const graft_moe_t *m, int64_t hidden, int64_t T, const float *x,
                        float *out, float *scratch, int nt) {
    const int64_t E = m->num_experts, k = m->top_k, S = T * k, H = hidden;
    float *logits = scratch, *choice = logits + even(T * E), *w = choice + even(T * E);
    float *ws = w + even(S); /* slot weights in expert order */
    int64_t *ids = (int64_t *)(ws + even(S)), *order = ids + S, *where = order + S;
    float *xs = (float *)(where + S), *ys = xs + S * H, *shared = ys + S * H, *work = shared + T * H;
    for (int64_t t = 0; t < T; ++t) {
        for (int64_t e = 0; e < E; ++e) logits[t * E + e] = dot(x + t * H, m->router + e * H, H);
        route_row(m, logits + t * E, choice + t * E, w + t * k, ids + t * k);
    }
    if (T == 1) {
        for (int64_t s = 0; s < k; ++s) {
            where[s] = s;
            if (gated_mlp(&m->gate_up[ids[s]], &m->down[ids[s]], x, 1, ys + s * H, work, nt)) return -1;
            for (int64_t j = 0; j < H; ++j) ys[s * H + j] *= w[s];
        }
    } else {
        int64_t n = 0;
        for (int64_t e = 0; e < E; ++e) /* counting sort by expert, slots in order within one */
            for (int64_t s = 0; s < S; ++s)
                if (ids[s] == e) order[n] = s, where[s] = n++;
        for (int64_t r = 0; r < S; ++r) {
            memcpy(xs + r * H, x + order[r] / k * H, sizeof(float) * (size_t)H);
            ws[r] = w[order[r]];
        }
        for (int64_t r0 = 0, r1; r0 < S; r0 = r1) {
            const int64_t e = ids[order[r0]];
            for (r1 = r0 + 1; r1 < S && ids[order[r1]] == e; ++r1) {}
            if (gated_mlp(&m->gate_up[e], &m->down[e], xs + r0 * H, r1 - r0, ys + r0 * H, work, nt))
                return -1;
            for (int64_t r = r0; r < r1; ++r)
                for (int64_t j = 0; j < H; ++j) ys[r * H + j] *= ws[r];
        }
    }
    for (int64_t t = 0; t < T; ++t) { /* each token's slots summed in slot order */
        float *o = out + t * H;
        memcpy(o, ys + where[t * k] * H, sizeof(float) * (size_t)H);
        for (int64_t j = 1; j < k; ++j) {
            const float *y = ys + where[t * k + j] * H;
            for (int64_t c = 0; c < H; ++c) o[c] += y[c];
        }
    }
    if (m->shared_down.n) {
        if (gated_mlp(&m->shared_gate_up, &m->shared_down, x, T, shared, work, nt)) return -1;
        for (int64_t i = 0; i < T * H; ++i) out[i] += shared[i];
    }
    return 0;
}
