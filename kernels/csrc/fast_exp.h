/* exp for arguments <= 0 (softmax, sigmoid), scalar and on 16 or 8 lanes (GCC vector
 * extensions); shared by the C kernels in this folder. */
#ifndef GRAFT_FAST_EXP_H
#define GRAFT_FAST_EXP_H
#include <stdint.h>
#include <string.h>

#include "vec16.h"

/* exp(x) for softmax arguments (x <= 0): Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2,
 * then Cephes' degree-6 polynomial, relative error < 2e-7 like expf. Inline arithmetic only,
 * so gcc vectorizes the softmax loop; a libm call per score was ~60% of the kernel. */
static inline __attribute__((always_inline)) float exp_neg(float x) {
    const float fn = x * 1.44269504088896341f;
    const int32_t n = (int32_t)(fn - 0.5f); /* truncation of a negative value: ceil(fn - 0.5) */
    const float nf = (float)n;
    const float r = (x - nf * 0.693359375f) + nf * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float y = p * r * r + r + 1.0f;
    int32_t bits = (n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    return x < -87.0f ? 0.0f : y * scale; /* below 2^-126: flush to zero */
}

#if defined(__GNUC__) && !defined(__clang__)
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

static inline v16f load16(const float *p) {
    v16f v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* exp_neg on 16 or 8 lanes: the same steps as the scalar version. Written out because gcc left
 * the decode kernel's softmax loop scalar once inlined there (a cvttss2si per score, 9
 * heads x hundreds of scores per sequence). BELOW: the lanes under -87 (v16_lt for 16: a
 * 64-byte compare is lane by lane on AVX2, vec16.h). */
#define GRAFT_EXP_NEG_V(NAME, VF, VI, BELOW)                                                    \
    static inline VF NAME(VF x) {                                                               \
        const VF fn = x * 1.44269504088896341f;                                                 \
        const VI n = __builtin_convertvector(fn - 0.5f, VI); /* truncation, as in exp_neg */    \
        const VF nf = __builtin_convertvector(n, VF);                                           \
        const VF r = (x - nf * 0.693359375f) + nf * 2.12194440e-4f;                             \
        VF p = r * 1.9875691500e-4f + 1.3981999507e-3f;                                         \
        p = p * r + 8.3334519073e-3f;                                                           \
        p = p * r + 4.1665795894e-2f;                                                           \
        p = p * r + 1.6666665459e-1f;                                                           \
        p = p * r + 5.0000001201e-1f;                                                           \
        const VF y = p * r * r + r + 1.0f;                                                      \
        const VF scale = (VF)((n + 127) << 23);                                                 \
        return (VF)((VI)(y * scale) & ~(BELOW)); /* below 2^-126: flush to zero */              \
    }
GRAFT_EXP_NEG_V(exp_neg16, v16f, v16i, v16_lt(x, (v16f){0} - 87.0f))
GRAFT_EXP_NEG_V(exp_neg8, v8f, v8i, (x < -87.0f))
#undef GRAFT_EXP_NEG_V

#endif
#endif
