/* acc += 4-byte dot products of u (unsigned bytes) and s (signed bytes) on AVX-512 VNNI, for
 * quant_vnni_cpu.c and quant_a8_cpu.c. Inline asm because GCC 12 copies the accumulator around
 * every _mm512_dpbusd_epi32 (three moves per dot). */
#ifndef GRAFT_VNNI_DOT_H
#define GRAFT_VNNI_DOT_H
#include <immintrin.h>

static inline __m512i dot(__m512i acc, __m512i u, __m512i s) {
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
    return acc;
}
#endif
