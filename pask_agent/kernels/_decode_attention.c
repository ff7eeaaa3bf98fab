/* Mixed-precision decode attention on a CPU, reading BF16 and packed INT4 rows in place.
 *
 * The torch path (decode_attention.py) widens every retained row to fp32 before its matmuls,
 * so an INT4 row costs what a BF16 row costs and both cost a pass over memory several times
 * their own size. Here a block of key rows is widened into a small buffer that stays in L1,
 * used for every query head of its KV group, and overwritten: a step reads each row's own
 * bytes once.
 *
 * One task per (sequence, KV head). Keys come in blocks of BLOCK from three sources (the
 * current chunk, the high pool, the low pool), are scored LANES at a time (``sum_lanes``) and
 * folded into an online softmax, as the Triton kernel does on a GPU. Query row
 * r = t * group + g is token t0 + t, query head h * group + g, so a token's rows are
 * contiguous in q and out.
 *
 * Head dims 64 and 128 only (NV = D / LANES vectors of LANES floats; GCC vector extensions, so the
 * same source builds for AVX-512, AVX2 or anything else). Packed INT4 rows hold the even dims
 * in low nibbles and the odd dims in high nibbles; they are widened in that split order
 * (evens, then odds) and met by queries and accumulators kept in the same order, so no
 * interleaving shuffle is ever needed; rows from the other sources use natural order.
 *
 * Layouts (all contiguous): q, out [T, Hq, D] fp32; cur_k/cur_v [T, Hkv, D] fp32; high_k/high_v
 * [Nh, Hkv, D] bf16; low_k/low_v [Nl, Hkv, D/2] signed nibbles; low_ks/low_vs [Nl, Hkv] fp16.
 * A key at position p is visible to a query at position q when p <= q.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK 64
#define MAX_NV (128 / LANES) /* D = 128 */
/* query heads whose accumulators one tile keeps in registers (AVX-512 has 32, AVX2 16) */
#define TILE_ROWS (LANES == 16 ? 4 : 1)
#define AHEAD 8 /* keys ahead whose rows are prefetched */

#include "_vector_ops.h" /* LANES, vf, vi, INLINE, widening, sum_lanes, exp */

typedef struct {
    const int64_t *q_off, *h_off, *l_off;
    const float *q;
    const int64_t *q_pos;
    const float *cur_k, *cur_v;
    const uint16_t *high_k, *high_v;
    const int64_t *h_slots, *h_pos;
    const uint8_t *low_k, *low_v;
    const uint16_t *low_ks, *low_vs;
    const int64_t *l_slots, *l_pos;
    float *out;
    int64_t n_qh, n_kvh;
    float scale;
} Args;

/* Per-thread scratch: queries in both orders, the two accumulators, one block's scores and
 * values. ``split`` marks a block whose values are in split order. */
typedef struct {
    vf *q_nat, *q_split; /* [R][NV] scaled queries, natural and split order */
    vf *acc_nat, *acc_split; /* [R][NV] */
    float *m, *l; /* [R] */
    int64_t *row_pos; /* [R] */
    float *s; /* [R][BLOCK] */
    vf *kblk, *vblk; /* [BLOCK][NV]: one block's keys and values, widened */
    float kscale[BLOCK];
    int64_t kpos[BLOCK];
} Work;

/* Rows r0..r0+RT-1 (RT <= 4) take the block's values: keys outer, rows inner, so each value
 * vector is loaded once for RT rows and the accumulators stay in registers (1.3x over one row
 * at a time on PASK's decode shape, GQA 7, head dim 64). */
INLINE void accumulate_tile(Work *w, int64_t r0, int n, const int NV, const int RT, int split) {
    vf a[4][MAX_NV];
    for (int r = 0; r < RT; ++r) {
        const vf *src = (split ? w->acc_split : w->acc_nat) + (r0 + r) * NV;
        for (int c = 0; c < NV; ++c) a[r][c] = src[c];
    }
    for (int j = 0; j < n; ++j) {
        const vf *v = w->vblk + j * NV;
        for (int r = 0; r < RT; ++r) {
            const float p = w->s[(r0 + r) * BLOCK + j];
            for (int c = 0; c < NV; ++c) a[r][c] += p * v[c];
        }
    }
    for (int r = 0; r < RT; ++r) {
        vf *dst = (split ? w->acc_split : w->acc_nat) + (r0 + r) * NV;
        for (int c = 0; c < NV; ++c) dst[c] = a[r][c];
    }
}

/* Fold one block of n keys (scores in w->s, values in w->vblk) into the online softmax: each
 * row's weights first (rescaling its accumulator when its maximum grows), then the values. */
INLINE void fold_block(Work *w, int64_t rows, int n, const int NV, int split) {
    for (int64_t r = 0; r < rows; ++r) {
        float *s = w->s + r * BLOCK;
        const int padded = (n + LANES - 1) & ~(LANES - 1);
        for (int j = n; j < padded; ++j) s[j] = -INFINITY; /* lanes past the block: weight 0 */
        vf top = load_vf(s);
        for (int j = LANES; j < padded; j += LANES) {
            vf x = load_vf(s + j);
            vi more = x > top;
            top = (vf)((more & (vi)x) | (~more & (vi)top));
        }
        float mx = top[0];
        for (int i = 1; i < LANES; ++i) mx = top[i] > mx ? top[i] : mx;
        if (mx == -INFINITY) { /* nothing visible: weights 0 for the tile pass */
            for (int j = 0; j < padded; ++j) s[j] = 0.0f;
            continue;
        }
        float m_new = w->m[r] > mx ? w->m[r] : mx;
        vf *acc_n = w->acc_nat + r * NV, *acc_s = w->acc_split + r * NV;
        if (w->m[r] != m_new) {
            const vf shift = (vf){0} + (w->m[r] - m_new); /* one lane used: the rescale */
            float alpha = w->m[r] == -INFINITY ? 0.0f : exp_nonpositive_vf(shift)[0];
            w->l[r] *= alpha;
            for (int c = 0; c < NV; ++c) {
                acc_n[c] *= alpha;
                acc_s[c] *= alpha;
            }
            w->m[r] = m_new;
        }
        vf total = {0};
        for (int j = 0; j < padded; j += LANES) {
            vf e = exp_nonpositive_vf(load_vf(s + j) - m_new);
            store_vf(s + j, e);
            total += e;
        }
        float sum = 0.0f;
        for (int i = 0; i < LANES; ++i) sum += total[i];
        w->l[r] += sum;
    }
    int64_t r0 = 0;
    for (; r0 + TILE_ROWS <= rows; r0 += TILE_ROWS) accumulate_tile(w, r0, n, NV, TILE_ROWS, split);
    switch (rows - r0) {
        case 3: accumulate_tile(w, r0, n, NV, 3, split); break;
        case 2: accumulate_tile(w, r0, n, NV, 2, split); break;
        case 1: accumulate_tile(w, r0, n, NV, 1, split); break;
        default: break;
    }
}

/* The staged block's scores (n keys, in the order of ``qs``) for every query row; keys after a
 * row's position are hidden. */
INLINE void score_block(Work *w, const vf *qs, int64_t rows, int n, const int NV) {
    int64_t newest = w->kpos[0];
    for (int j = 1; j < n; ++j) newest = w->kpos[j] > newest ? w->kpos[j] : newest;
    for (int j = n; j % LANES; ++j) /* the last group's missing keys score zero, and are unused */
        for (int c = 0; c < NV; ++c) w->kblk[j * NV + c] = (vf){0};
    for (int64_t r = 0; r < rows; ++r) {
        vf q[MAX_NV], t[LANES];
        for (int c = 0; c < NV; ++c) q[c] = qs[r * NV + c];
        float *s = w->s + r * BLOCK;
        for (int j0 = 0; j0 < n; j0 += LANES) {
            for (int j = 0; j < LANES; ++j) {
                const vf *k = w->kblk + (j0 + j) * NV;
                vf x = q[0] * k[0];
                for (int c = 1; c < NV; ++c) x += q[c] * k[c];
                t[j] = x;
            }
            store_vf(s + j0, sum_lanes(t) * load_vf(w->kscale + j0));
        }
        if (newest > w->row_pos[r])
            for (int j = 0; j < n; ++j)
                if (w->kpos[j] > w->row_pos[r]) s[j] = -INFINITY;
    }
}

INLINE void attend_one(const Args *a, Work *w, int64_t b, int64_t h, const int NV) {
    const int64_t dim = NV * LANES, half = dim / 2, group = a->n_qh / a->n_kvh;
    const int64_t t0 = a->q_off[b], n_t = a->q_off[b + 1] - t0, rows = n_t * group;
    for (int64_t t = 0; t < n_t; ++t) {
        for (int64_t g = 0; g < group; ++g) {
            const int64_t r = t * group + g;
            const float *src = a->q + ((t0 + t) * a->n_qh + h * group + g) * dim;
            float *nat = (float *)(w->q_nat + r * NV), *spl = (float *)(w->q_split + r * NV);
            for (int64_t d = 0; d < half; ++d) {
                nat[2 * d] = spl[d] = src[2 * d] * a->scale;
                nat[2 * d + 1] = spl[half + d] = src[2 * d + 1] * a->scale;
            }
            w->row_pos[r] = a->q_pos[t0 + t];
            w->m[r] = -INFINITY;
            w->l[r] = 0.0f;
            for (int c = 0; c < NV; ++c) w->acc_nat[r * NV + c] = w->acc_split[r * NV + c] = (vf){0};
        }
    }
    /* the current chunk's keys (fp32) */
    for (int64_t k0 = 0; k0 < n_t; k0 += BLOCK) {
        int n = n_t - k0 < BLOCK ? (int)(n_t - k0) : BLOCK;
        for (int j = 0; j < n; ++j) {
            const int64_t row = ((t0 + k0 + j) * a->n_kvh + h) * dim;
            for (int c = 0; c < NV; ++c) {
                w->kblk[j * NV + c] = load_vf(a->cur_k + row + LANES * c);
                w->vblk[j * NV + c] = load_vf(a->cur_v + row + LANES * c);
            }
            w->kscale[j] = 1.0f;
            w->kpos[j] = a->q_pos[t0 + k0 + j];
        }
        score_block(w, w->q_nat, rows, n, NV);
        fold_block(w, rows, n, NV, 0);
    }
    /* high pool rows (bf16) */
    const int64_t h0 = a->h_off[b], n_h = a->h_off[b + 1] - h0;
    for (int64_t k0 = 0; k0 < n_h; k0 += BLOCK) {
        int n = n_h - k0 < BLOCK ? (int)(n_h - k0) : BLOCK;
        for (int j = 0; j < n; ++j) {
            if (k0 + j + AHEAD < n_h) { /* slots can be anywhere: ask for the rows early */
                const int64_t ahead = (a->h_slots[h0 + k0 + j + AHEAD] * a->n_kvh + h) * dim;
                __builtin_prefetch(a->high_k + ahead);
                __builtin_prefetch(a->high_k + ahead + dim - 1);
                __builtin_prefetch(a->high_v + ahead);
                __builtin_prefetch(a->high_v + ahead + dim - 1);
            }
            const int64_t row = (a->h_slots[h0 + k0 + j] * a->n_kvh + h) * dim;
            for (int c = 0; c < NV; ++c) {
                w->kblk[j * NV + c] = bf16_vf(a->high_k + row + LANES * c);
                w->vblk[j * NV + c] = bf16_vf(a->high_v + row + LANES * c);
            }
            w->kscale[j] = 1.0f;
            w->kpos[j] = a->h_pos[h0 + k0 + j];
        }
        score_block(w, w->q_nat, rows, n, NV);
        fold_block(w, rows, n, NV, 0);
    }
    /* low pool rows (INT4 + fp16 row scales), in split order */
    const int64_t l0 = a->l_off[b], n_l = a->l_off[b + 1] - l0;
    for (int64_t k0 = 0; k0 < n_l; k0 += BLOCK) {
        int n = n_l - k0 < BLOCK ? (int)(n_l - k0) : BLOCK;
        for (int j = 0; j < n; ++j) {
            if (k0 + j + AHEAD < n_l) {
                const int64_t ahead = a->l_slots[l0 + k0 + j + AHEAD] * a->n_kvh + h;
                __builtin_prefetch(a->low_k + ahead * half);
                __builtin_prefetch(a->low_k + ahead * half + half - 1);
                __builtin_prefetch(a->low_v + ahead * half);
                __builtin_prefetch(a->low_v + ahead * half + half - 1);
                __builtin_prefetch(a->low_ks + ahead);
                __builtin_prefetch(a->low_vs + ahead);
            }
            const int64_t slot = a->l_slots[l0 + k0 + j] * a->n_kvh + h;
            const uint8_t *kc = a->low_k + slot * half, *vc = a->low_v + slot * half;
            const float vscale = half_to_float(a->low_vs[slot]);
            vf *k = w->kblk + j * NV, *v = w->vblk + j * NV;
            for (int c = 0; c < NV / 2; ++c) {
                nibbles_vf(kc + LANES * c, 1.0f, &k[c], &k[NV / 2 + c]);
                nibbles_vf(vc + LANES * c, vscale, &v[c], &v[NV / 2 + c]);
            }
            w->kscale[j] = half_to_float(a->low_ks[slot]);
            w->kpos[j] = a->l_pos[l0 + k0 + j];
        }
        score_block(w, w->q_split, rows, n, NV);
        fold_block(w, rows, n, NV, 1);
    }

    for (int64_t t = 0; t < n_t; ++t) {
        for (int64_t g = 0; g < group; ++g) {
            const int64_t r = t * group + g;
            float *dst = a->out + ((t0 + t) * a->n_qh + h * group + g) * dim;
            const float *nat = (const float *)(w->acc_nat + r * NV);
            const float *spl = (const float *)(w->acc_split + r * NV);
            const float inv = w->l[r] > 0.0f ? 1.0f / w->l[r] : 0.0f;
            for (int64_t d = 0; d < half; ++d) {
                dst[2 * d] = (nat[2 * d] + spl[d]) * inv;
                dst[2 * d + 1] = (nat[2 * d + 1] + spl[half + d]) * inv;
            }
        }
    }
}

static void *vec_alloc(size_t n) { return aligned_alloc(64, ((n + 63) / 64) * 64); }

/* Returns 0; -1 when scratch could not be allocated; -2 for a head dim other than 64 or 128. */
int pask_decode_attention(
    int64_t n_seqs, const int64_t *seqs, const int64_t *q_off, const int64_t *h_off,
    const int64_t *l_off, const float *q, const int64_t *q_pos, const float *cur_k,
    const float *cur_v, const uint16_t *high_k, const uint16_t *high_v, const int64_t *h_slots,
    const int64_t *h_pos, const uint8_t *low_k, const uint8_t *low_v, const uint16_t *low_ks,
    const uint16_t *low_vs, const int64_t *l_slots, const int64_t *l_pos, float *out,
    int64_t n_qh, int64_t n_kvh, int64_t dim, float scale, int64_t max_rows, int n_threads) {
    Args a = {q_off, h_off, l_off, q, q_pos, cur_k, cur_v, high_k, high_v, h_slots, h_pos,
              low_k, low_v, low_ks, low_vs, l_slots, l_pos, out, n_qh, n_kvh, scale};
    if (dim != 64 && dim != 128) return -2;
    const int NV = (int)(dim / LANES);
    int failed = 0;
    const int64_t tasks = n_seqs * n_kvh;
#pragma omp parallel num_threads(n_threads) reduction(| : failed)
    {
        Work w;
        const size_t rv = sizeof(vf) * max_rows * NV;
        w.q_nat = vec_alloc(rv);
        w.q_split = vec_alloc(rv);
        w.acc_nat = vec_alloc(rv);
        w.acc_split = vec_alloc(rv);
        w.kblk = vec_alloc(sizeof(vf) * BLOCK * NV);
        w.vblk = vec_alloc(sizeof(vf) * BLOCK * NV);
        w.m = malloc(sizeof(float) * max_rows);
        w.l = malloc(sizeof(float) * max_rows);
        w.row_pos = malloc(sizeof(int64_t) * max_rows);
        w.s = malloc(sizeof(float) * max_rows * BLOCK);
        const int ok = w.q_nat && w.q_split && w.acc_nat && w.acc_split && w.kblk && w.vblk &&
                       w.m && w.l && w.row_pos && w.s;
        if (!ok) failed = 1;
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; ++task) {
            if (!ok) continue;
            /* one copy per head size, with the loops over vectors unrolled */
            if (NV == 64 / LANES)
                attend_one(&a, &w, seqs[task / n_kvh], task % n_kvh, 64 / LANES);
            else
                attend_one(&a, &w, seqs[task / n_kvh], task % n_kvh, 128 / LANES);
        }
        free(w.q_nat);
        free(w.q_split);
        free(w.acc_nat);
        free(w.acc_split);
        free(w.kblk);
        free(w.vblk);
        free(w.m);
        free(w.l);
        free(w.row_pos);
        free(w.s);
    }
    return failed ? -1 : 0;
}
