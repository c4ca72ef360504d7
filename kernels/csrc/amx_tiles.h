/* The AMX tile configuration that the tile kernels share (quant_amx_cpu.c, paged_prefill_amx.c).
 * Include after <immintrin.h>, in code built for AMX. */
#ifndef GRAFT_AMX_TILES_H
#define GRAFT_AMX_TILES_H
#include <stdint.h>
#include <string.h>

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) tile_config;

/* All 8 tiles 16 rows of 64 bytes. Tile state is per thread: each thread loads it, and each
 * kernel loads its own at the start of its parallel region (another kernel's may be loaded). */
static inline void configure_tiles(void) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; ++t) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = 16;
    }
    /* GCC (12) does not see ldtilecfg read cfg: inlined, the stores above were dropped */
    __asm__ __volatile__("" : : "r"(&cfg) : "memory");
    _tile_loadconfig(&cfg);
}
#endif
