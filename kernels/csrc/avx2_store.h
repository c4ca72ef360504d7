/* The store of an AVX2 integer-linear tile (quant_avx2_int_cpu.c, quant_a8_cpu.c): R rows of
 * H 8-lane halves, y[r][o0 + l] = out * scale + bias, lanes past N left alone. */
#ifndef GRAFT_AVX2_STORE_H
#define GRAFT_AVX2_STORE_H
#include <immintrin.h>
#include <stdint.h>

/* scale: per-channel factor or NULL (1; x * 1 is x exactly); bias: [N] or NULL (0) */
static inline void store_tile(int R, int H, __m256 out[][4], const float *scale,
                              const float *bias, int64_t o0, float *y, int64_t ldy, int64_t N) {
    for (int r = 0; r < R; ++r) {
        float row[32];
        for (int h = 0; h < H; ++h) _mm256_storeu_ps(row + 8 * h, out[r][h]);
        for (int l = 0; l < 8 * H && o0 + l < N; ++l)
            y[r * ldy + o0 + l] = row[l] * (scale ? scale[o0 + l] : 1.0f) + (bias ? bias[o0 + l] : 0.0f);
    }
}
#endif
