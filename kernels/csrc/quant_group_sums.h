/* int4's minimum term, min * sum(x) per group: the group sums of each row of x, computed once
 * per call (quant_vnni_cpu.c, quant_avx2_cpu.c), not once per output block. */
#ifndef GRAFT_QUANT_GROUP_SUMS_H
#define GRAFT_QUANT_GROUP_SUMS_H
#include <stdint.h>

/* xs[m * G + g] = sum of x[m][g * group .. (g + 1) * group), G = K / group */
static inline void group_sums(const float *x, int64_t ldx, int64_t M, int64_t K, int64_t group,
                              float *xs) {
    const int64_t G = K / group;
    for (int64_t m = 0; m < M; ++m)
        for (int64_t g = 0; g < G; ++g) {
            float t = 0.0f;
            for (int64_t k = g * group; k < (g + 1) * group; ++k) t += x[m * ldx + k];
            xs[m * G + g] = t;
        }
}
#endif
