/* fp32 vector building blocks for the CPU decode kernel (``_decode_attention.c``): vectors of
 * LANES floats, sixteen (AVX-512 and portable builds) or eight (AVX2).
 *
 * GCC vector extensions, so the same source builds for AVX-512, AVX2 or anything else; where a
 * generic conversion compiles badly (GCC scalarizes widening int8/uint16 vectors), the
 * instruction meant is named under the ISA that has it. Nothing here knows about attention:
 * loads and widening of BF16 halves and packed INT4 nibbles, LANES dot products summed at
 * once, and e^x for x <= 0.
 */
#ifndef PASK_VECTOR_OPS_H
#define PASK_VECTOR_OPS_H

#include <math.h>
#include <stdint.h>

#define INLINE static inline __attribute__((always_inline))

/* Lanes per vector: sixteen fp32 (one AVX-512 register), or eight where AVX2 is the widest:
 * sixteen-lane vectors there live in pairs of registers and spill to the stack (measured
 * 9x slower than AVX-512 on the same CPU, against 2x expected). Portable builds keep 16. */
#if defined(__AVX2__) && !defined(__AVX512F__)
#define LANES 8
#else
#define LANES 16
#endif

typedef float vf __attribute__((vector_size(4 * LANES), aligned(4)));
typedef int32_t vi __attribute__((vector_size(4 * LANES), aligned(4)));
typedef int8_t vb __attribute__((vector_size(LANES), aligned(1)));
typedef uint16_t vh __attribute__((vector_size(2 * LANES), aligned(2)));

#if defined(__F16C__) || defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#if defined(__F16C__) /* every x86 CPU with AVX2: one instruction */
INLINE float half_to_float(uint16_t h) { return _cvtsh_ss(h); }
#else
INLINE float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    union { uint32_t u; float f; } v;
    if (exp == 0) {
        float f = (float)man * 5.9604644775390625e-08f; /* zero or subnormal: man * 2^-24 */
        return sign ? -f : f;
    }
    v.u = sign | (exp == 31 ? 0x7f800000u | (man << 13) : ((exp + 112) << 23) | (man << 13));
    return v.f;
}

#endif

INLINE vf load_vf(const float *p) { return *(const vf *)p; }
INLINE void store_vf(float *p, vf x) { *(vf *)p = x; }

/* LANES int8 / uint16 values widened to int32 lanes. GCC turns ``__builtin_convertvector``
 * of these into one scalar load and insert per lane (measured: that alone was most of the
 * time spent unpacking INT4 rows), so AVX-512 and AVX2 builds say the instruction they mean. */
#if defined(__AVX512F__)
INLINE vi widen_i8(const uint8_t *p) {
    return (vi)_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p));
}
INLINE vi widen_u16(const uint16_t *p) {
    return (vi)_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
}
#elif defined(__AVX2__) /* LANES 8 */
INLINE vi widen_i8(const uint8_t *p) {
    return (vi)_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
}
INLINE vi widen_u16(const uint16_t *p) {
    return (vi)_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
}
#else
INLINE vi widen_i8(const uint8_t *p) { return __builtin_convertvector(*(const vb *)p, vi); }
INLINE vi widen_u16(const uint16_t *p) { return __builtin_convertvector(*(const vh *)p, vi); }
#endif

INLINE vf bf16_vf(const uint16_t *p) { return (vf)(widen_u16(p) << 16); }

/* LANES packed bytes -> their low nibbles (LANES even dims) and high nibbles (LANES odd dims),
 * widened to int32 first: x86 has no 8-bit vector shifts. */
INLINE void nibbles_vf(const uint8_t *p, float scale, vf *even, vf *odd) {
    vi x = widen_i8(p);
    *even = __builtin_convertvector((x << 28) >> 28, vf) * scale;
    *odd = __builtin_convertvector(x >> 4, vf) * scale;
}

/* LANES dot products at once: t[j] holds key j's LANES partial sums; lane j of the result is
 * their total. Summing one vector's lanes in C order is a chain of dependent scalar adds (the
 * compiler may not reassociate them), which cost more than the products themselves; this
 * tree halves the lanes of two vectors per step (LANES - 1 steps of two shuffles and an add). */
#define HALVE(a, b, LO, HI) (__builtin_shuffle(a, b, (vi){LO}) + __builtin_shuffle(a, b, (vi){HI}))
#if LANES == 16
#define LO8 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23
#define HI8 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31
#define LO4 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27
#define HI4 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31
#define LO2 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29
#define HI2 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31
#define LO1 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30
#define HI1 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31

INLINE vf sum_lanes(const vf *t) {
    vf u[8], v[4], w[2];
    for (int i = 0; i < 8; ++i) u[i] = HALVE(t[2 * i], t[2 * i + 1], LO8, HI8);
    for (int i = 0; i < 4; ++i) v[i] = HALVE(u[2 * i], u[2 * i + 1], LO4, HI4);
    for (int i = 0; i < 2; ++i) w[i] = HALVE(v[2 * i], v[2 * i + 1], LO2, HI2);
    return HALVE(w[0], w[1], LO1, HI1);
}
#else
#define LO4 0, 1, 2, 3, 8, 9, 10, 11
#define HI4 4, 5, 6, 7, 12, 13, 14, 15
#define LO2 0, 1, 4, 5, 8, 9, 12, 13
#define HI2 2, 3, 6, 7, 10, 11, 14, 15
#define LO1 0, 2, 4, 6, 8, 10, 12, 14
#define HI1 1, 3, 5, 7, 9, 11, 13, 15

INLINE vf sum_lanes(const vf *t) {
    vf u[4], v[2];
    for (int i = 0; i < 4; ++i) u[i] = HALVE(t[2 * i], t[2 * i + 1], LO4, HI4);
    for (int i = 0; i < 2; ++i) v[i] = HALVE(u[2 * i], u[2 * i + 1], LO2, HI2);
    return HALVE(v[0], v[1], LO1, HI1);
}
#endif

/* e^x for x <= 0 on sixteen lanes (Cephes' polynomial after x = n ln 2 + r); -inf gives 0
 * exactly (masked keys); relative error about 2e-7. Written on vectors because a loop over a
 * scalar version under ``omp simd`` was left scalar in some inlined copies (one call per key
 * and query head: the largest cost in a profile of PASK's decode step). */
INLINE vf exp_nonpositive_vf(vf x) {
    const vf lo = (vf){0} - 87.0f;
    vi below = x < lo;
    vf clamped = (vf)((below & (vi)lo) | (~below & (vi)x));
    vf y = clamped * 1.44269504088896341f + 0.5f;
    vf n = __builtin_convertvector(__builtin_convertvector(y, vi), vf); /* truncates */
    n -= (vf)((vi)(n > y) & (vi)((vf){0} + 1.0f)); /* floor */
    vf r = clamped - n * 0.693359375f + n * 2.12194440e-4f;
    vf p = (vf){0} + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    vf two_n = (vf)((__builtin_convertvector(n, vi) + 127) << 23);
    vi dead = x == -INFINITY;
    return (vf)(~dead & (vi)(p * two_n));
}

#endif /* PASK_VECTOR_OPS_H */
