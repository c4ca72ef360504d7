/* What the paged attention kernels (paged_decode_cpu.c, paged_prefill_cpu.c) share: the dtype
 * codes of q/out and the caches, fp16 <-> fp32 (bf16 is bf16.h), and a token's cache slot. */
#ifndef GRAFT_PAGED_COMMON_H
#define GRAFT_PAGED_COMMON_H
#include <math.h>
#include <stdint.h>
#include <string.h>

enum { F32 = 0, BF16 = 1, F16 = 2, I8 = 3 };

static inline float f16_to_float(uint16_t x) {
    _Float16 h;
    memcpy(&h, &x, 2);
    return (float)h;
}

static inline uint16_t float_to_f16(float f) {
    _Float16 h = (_Float16)f;
    uint16_t x;
    memcpy(&x, &h, 2);
    return x;
}

/* Cache slot of token t; block sizes are powers of two in practice, so the division is a
 * shift (the general case still works). */
static inline int64_t slot_of(const int32_t *table, int64_t t, int64_t block_size) {
    if ((block_size & (block_size - 1)) == 0) {
        const int shift = __builtin_ctzll((unsigned long long)block_size);
        return ((int64_t)table[t >> shift] << shift) + (t & (block_size - 1));
    }
    return (int64_t)table[t / block_size] * block_size + t % block_size;
}

/* A prefill tile's rows 0..padded (row r: query position base + r / group, head r % group;
 * padding rows repeat the last of the qt positions): positions, running max -inf, sum 0. */
static inline void tile_rows_init(int32_t *pos, float *m, float *l, int64_t rows, int64_t padded,
                                  int64_t group, int64_t qt, int64_t base) {
    for (int64_t r = 0; r < padded; ++r) {
        pos[r] = (int32_t)(base + (r < rows ? r / group : qt - 1));
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
}
#endif
