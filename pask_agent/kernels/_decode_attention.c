/* Mixed-precision decode attention on a CPU, reading BF16 and packed INT4 rows in place.
 *
 * The torch path (decode_attention.py) widens every retained row to fp32 before its matmuls,
 * so an INT4 row costs what a BF16 row costs and both cost a pass over memory several times
 * their own size. Here each key row is widened into a 64-float register-sized buffer, used for
 * all query heads of its KV group, and dropped: memory traffic is the rows' own bytes.
 *
 * One task per (sequence, KV head). Keys come in blocks of BLOCK from three sources (the
 * current chunk, the high pool, the low pool) and are folded into an online softmax, as the
 * Triton kernel does on a GPU. Query row r = t * group + g is token t0 + t, query head
 * h * group + g, so a token's rows are contiguous in q and out.
 *
 * Layouts (all contiguous): q, out [T, Hq, D] fp32; cur_k/cur_v [T, Hkv, D] fp32; high_k/high_v
 * [Nh, Hkv, D] bf16; low_k/low_v [Nl, Hkv, D/2] signed nibbles (low nibble = even dim);
 * low_ks/low_vs [Nl, Hkv] fp16. D is even. A key at position p is visible to a query at
 * position q when p <= q.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK 64

static inline float bf16_to_float(uint16_t x) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)x << 16;
    return v.f;
}

static inline float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    union { uint32_t u; float f; } v;
    if (exp == 0) {
        if (man == 0) {
            v.u = sign;
            return v.f;
        }
        float f = (float)man * 5.9604644775390625e-08f; /* 2^-24: subnormal */
        return sign ? -f : f;
    }
    if (exp == 31) {
        v.u = sign | 0x7f800000u | (man << 13);
        return v.f;
    }
    v.u = sign | ((exp + 112) << 23) | (man << 13);
    return v.f;
}

typedef struct {
    const int64_t *seqs, *q_off, *h_off, *l_off;
    const float *q;
    const int64_t *q_pos;
    const float *cur_k, *cur_v;
    const uint16_t *high_k, *high_v;
    const int64_t *h_slots, *h_pos;
    const uint8_t *low_k, *low_v;
    const uint16_t *low_ks, *low_vs;
    const int64_t *l_slots, *l_pos;
    float *out;
    int64_t n_qh, n_kvh, dim;
    float scale;
} Args;

typedef struct {
    float *qrow;  /* [R, D] scaled queries */
    int64_t *row_pos;  /* [R] */
    float *m, *l;  /* [R] running max and normalizer */
    float *acc;  /* [R, D] */
    float *s;  /* [R, BLOCK] scores of the block */
    float *vblk;  /* [BLOCK, D] the block's values, scaled */
    int64_t *kpos;  /* [BLOCK] */
    float kf[512];  /* one key row (D <= 512) */
} Work;

/* e^x for x <= 0 (Cephes' polynomial after x = n ln 2 + r), written so the compiler can
 * vectorize it: glibc's expf is one call per element. -inf gives 0 exactly (masked keys);
 * relative error about 2e-7. */
static inline float exp_nonpositive(float x) {
    float clamped = x < -87.0f ? -87.0f : x;
    float n = floorf(clamped * 1.44269504088896341f + 0.5f);
    float r = clamped - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union { int32_t i; float f; } two_n;
    two_n.i = ((int32_t)n + 127) << 23;
    return x == -INFINITY ? 0.0f : p * two_n.f;
}

/* Fold the block's n keys (masked scores in w->s, values in w->vblk) into the online softmax. */
static inline __attribute__((always_inline)) void fold_block(Work *w, int64_t rows, int64_t n,
                                                          int64_t dim) {
    for (int64_t r = 0; r < rows; ++r) {
        float *s = w->s + r * BLOCK;
        float mx = -INFINITY;
        for (int64_t j = 0; j < n; ++j) mx = s[j] > mx ? s[j] : mx;
        if (mx == -INFINITY) continue;
        float m_new = w->m[r] > mx ? w->m[r] : mx;
        float *restrict acc = w->acc + r * dim;
        if (w->m[r] != m_new) {
            float alpha = w->m[r] == -INFINITY ? 0.0f : exp_nonpositive(w->m[r] - m_new);
            w->l[r] *= alpha;
            for (int64_t d = 0; d < dim; ++d) acc[d] *= alpha;
            w->m[r] = m_new;
        }
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < n; ++j) {
            s[j] = exp_nonpositive(s[j] - m_new);
            sum += s[j];
        }
        for (int64_t j = 0; j < n; ++j) {
            const float p = s[j], *restrict v = w->vblk + j * dim;
#pragma omp simd
            for (int64_t d = 0; d < dim; ++d) acc[d] += p * v[d];
        }
        w->l[r] += sum;
    }
}

/* Score one widened key row w->kf (times kscale) against every query row into column j. */
static inline __attribute__((always_inline)) void score_key(Work *w, int64_t rows, int64_t dim, int64_t j, float kscale) {
    for (int64_t r = 0; r < rows; ++r) {
        const float *qr = w->qrow + r * dim;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t d = 0; d < dim; ++d) dot += qr[d] * w->kf[d];
        w->s[r * BLOCK + j] = w->kpos[j] > w->row_pos[r] ? -INFINITY : dot * kscale;
    }
}

static inline void widen_nibbles(const uint8_t *codes, int64_t half, float scale, float *dst) {
    for (int64_t i = 0; i < half; ++i) {
        int8_t b = (int8_t)codes[i];
        dst[2 * i] = (float)((int8_t)(b << 4) >> 4) * scale;
        dst[2 * i + 1] = (float)(b >> 4) * scale;
    }
}

static inline __attribute__((always_inline)) void attend_one(const Args *a, Work *w, int64_t b,
                                                          int64_t h, const int64_t dim) {
    const int64_t group = a->n_qh / a->n_kvh, half = dim / 2;
    const int64_t t0 = a->q_off[b], n_t = a->q_off[b + 1] - t0, rows = n_t * group;
    for (int64_t t = 0; t < n_t; ++t) {
        const float *src = a->q + ((t0 + t) * a->n_qh + h * group) * dim;
        for (int64_t i = 0; i < group * dim; ++i) w->qrow[t * group * dim + i] = src[i] * a->scale;
        for (int64_t g = 0; g < group; ++g) w->row_pos[t * group + g] = a->q_pos[t0 + t];
    }
    for (int64_t r = 0; r < rows; ++r) {
        w->m[r] = -INFINITY;
        w->l[r] = 0.0f;
    }
    memset(w->acc, 0, sizeof(float) * rows * dim);

    /* the current chunk's keys (fp32) */
    for (int64_t k0 = 0; k0 < n_t; k0 += BLOCK) {
        int64_t n = n_t - k0 < BLOCK ? n_t - k0 : BLOCK;
        for (int64_t j = 0; j < n; ++j) {
            int64_t row = ((t0 + k0 + j) * a->n_kvh + h) * dim;
            memcpy(w->kf, a->cur_k + row, sizeof(float) * dim);
            memcpy(w->vblk + j * dim, a->cur_v + row, sizeof(float) * dim);
            w->kpos[j] = a->q_pos[t0 + k0 + j];
            score_key(w, rows, dim, j, 1.0f);
        }
        fold_block(w, rows, n, dim);
    }
    /* high pool rows (bf16) */
    const int64_t h0 = a->h_off[b], n_h = a->h_off[b + 1] - h0;
    for (int64_t k0 = 0; k0 < n_h; k0 += BLOCK) {
        int64_t n = n_h - k0 < BLOCK ? n_h - k0 : BLOCK;
        for (int64_t j = 0; j < n; ++j) {
            int64_t row = (a->h_slots[h0 + k0 + j] * a->n_kvh + h) * dim;
            const uint16_t *kr = a->high_k + row, *vr = a->high_v + row;
            float *v = w->vblk + j * dim;
            for (int64_t d = 0; d < dim; ++d) {
                w->kf[d] = bf16_to_float(kr[d]);
                v[d] = bf16_to_float(vr[d]);
            }
            w->kpos[j] = a->h_pos[h0 + k0 + j];
            score_key(w, rows, dim, j, 1.0f);
        }
        fold_block(w, rows, n, dim);
    }
    /* low pool rows (INT4 + fp16 row scales) */
    const int64_t l0 = a->l_off[b], n_l = a->l_off[b + 1] - l0;
    for (int64_t k0 = 0; k0 < n_l; k0 += BLOCK) {
        int64_t n = n_l - k0 < BLOCK ? n_l - k0 : BLOCK;
        for (int64_t j = 0; j < n; ++j) {
            int64_t slot = a->l_slots[l0 + k0 + j] * a->n_kvh + h;
            widen_nibbles(a->low_k + slot * half, half, 1.0f, w->kf);
            widen_nibbles(a->low_v + slot * half, half, half_to_float(a->low_vs[slot]),
                          w->vblk + j * dim);
            w->kpos[j] = a->l_pos[l0 + k0 + j];
            score_key(w, rows, dim, j, half_to_float(a->low_ks[slot]));
        }
        fold_block(w, rows, n, dim);
    }

    for (int64_t t = 0; t < n_t; ++t) {
        float *dst = a->out + ((t0 + t) * a->n_qh + h * group) * dim;
        for (int64_t g = 0; g < group; ++g) {
            int64_t r = t * group + g;
            float inv = w->l[r] > 0.0f ? 1.0f / w->l[r] : 0.0f;
            for (int64_t d = 0; d < dim; ++d) dst[g * dim + d] = w->acc[r * dim + d] * inv;
        }
    }
}

/* Returns 0, or -1 when scratch could not be allocated (out is then partly written). */
int pask_decode_attention(
    int64_t n_seqs, const int64_t *seqs, const int64_t *q_off, const int64_t *h_off,
    const int64_t *l_off, const float *q, const int64_t *q_pos, const float *cur_k,
    const float *cur_v, const uint16_t *high_k, const uint16_t *high_v, const int64_t *h_slots,
    const int64_t *h_pos, const uint8_t *low_k, const uint8_t *low_v, const uint16_t *low_ks,
    const uint16_t *low_vs, const int64_t *l_slots, const int64_t *l_pos, float *out,
    int64_t n_qh, int64_t n_kvh, int64_t dim, float scale, int64_t max_rows, int n_threads) {
    Args a = {seqs, q_off, h_off, l_off, q, q_pos, cur_k, cur_v, high_k, high_v, h_slots,
              h_pos, low_k, low_v, low_ks, low_vs, l_slots, l_pos, out, n_qh, n_kvh, dim,
              scale};
    if (dim > 512 || dim % 2) return -2;
    int failed = 0;
    const int64_t tasks = n_seqs * n_kvh;
#pragma omp parallel num_threads(n_threads) reduction(| : failed)
    {
        Work w;
        w.qrow = malloc(sizeof(float) * max_rows * dim);
        w.row_pos = malloc(sizeof(int64_t) * max_rows);
        w.m = malloc(sizeof(float) * max_rows);
        w.l = malloc(sizeof(float) * max_rows);
        w.acc = malloc(sizeof(float) * max_rows * dim);
        w.s = malloc(sizeof(float) * max_rows * BLOCK);
        w.vblk = malloc(sizeof(float) * BLOCK * dim);
        w.kpos = malloc(sizeof(int64_t) * BLOCK);
        int ok = w.qrow && w.row_pos && w.m && w.l && w.acc && w.s && w.vblk && w.kpos;
        if (!ok) failed = 1;
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; ++task) {
            if (!ok) continue;
            /* the common head sizes get their own copy, with the loops over dims unrolled */
            if (dim == 64)
                attend_one(&a, &w, seqs[task / n_kvh], task % n_kvh, 64);
            else if (dim == 128)
                attend_one(&a, &w, seqs[task / n_kvh], task % n_kvh, 128);
            else
                attend_one(&a, &w, seqs[task / n_kvh], task % n_kvh, dim);
        }
        free(w.qrow);
        free(w.row_pos);
        free(w.m);
        free(w.l);
        free(w.acc);
        free(w.s);
        free(w.vblk);
        free(w.kpos);
    }
    return failed ? -1 : 0;
}
