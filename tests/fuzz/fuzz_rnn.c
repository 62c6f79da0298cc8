/* libFuzzer harness for kfuse's public API: context, tensors, GRU / A-GRU plans, forward and
 * backward (issue 8). Build: tests/fuzz/CMakeLists.txt; run: scripts/fuzz.sh.
 *
 * Each input is a small "program": its first byte the plan's dtype (float32, float64, bfloat16,
 * float16) and the CPU instruction set of the context (KF_CPU_ISA; fuzz_input.h's
 * fuzz_draw_setup), a context descriptor, a plan descriptor, then up to 8 calls
 * (forward in either mode, backward in either gradient mode, workspace-size queries, arena reserves,
 * weight-info queries, fresh inputs), each with up to 3 mutations of its arguments (dtype, rank,
 * shape, strides, NULL / misaligned / offset data, struct_size and reserved fields, counts, modes,
 * workspaces and reserves too small, NULL or misaligned).
 *
 * Oracles, on top of ASan + UBSan (any report is a crash):
 *  - every status is a kf_status value; a failing call leaves a non-empty message and every output
 *    (y, hn, reserve, dx, dh0, dweights, out-parameters) byte-identical; a successful call leaves "";
 *  - a mutation the contract forbids (NULL required tensor, wrong dtype/rank/shape, non-contiguous
 *    strides, data not aligned to 4 bytes, bad struct_size, reserved != 0, wrong counts, bad mode,
 *    too-small or misaligned caller workspace / reserve, a tensor of another dtype than the
 *    plan's: any other float dtype among them) must be rejected;
 *  - a call with no such mutation must succeed (except KF_ERR_WORKSPACE_TOO_SMALL from a fixed
 *    arena), leave the canary bytes after every output intact, write every element of y / hn /
 *    dx / dh0 / dweights, and, with finite inputs, match the float64 reference of tests/c/ref_rnn.c
 *    on the values the tensors hold (relative error < 1e-3 for float32, and the bounds
 *    fuzz_input.h derives from docs/precision.md for the other dtypes: + 2^-8 bfloat16, + 2^-11
 *    float16, x 2^-29 float64; backward only when the reserve is the one a training forward on
 *    the same inputs wrote).
 *
 * Bounded allocations: real buffers hold at most T <= 6, B <= 5, I, H <= 6, L <= 3 (a few KB). Huge
 * extents (up to INT64_MAX, negative, products that overflow) are still passed, with small buffers
 * behind them: at most one tensor per call "lies" (declares more elements than its buffer holds),
 * and only on a dimension that another present tensor or the plan pins, so a correct library must
 * reject it from its shape checks before touching memory. (A lie on x's T in a backward call
 * where no dy / dx is given is undetectable by design, since the reserve is 64-byte granular,
 * so the harness never makes it.)
 *
 * Corpus (tests/fuzz/corpus/fuzz_rnn): every input begins with the byte fuzz_draw_setup reads (0:
 * float32, the CPU's default kernels); gru_fwd_bwd, agru_fwd_bwd, gru_bidir_bf and infer come
 * again as NAME.f64, .bf16, .f16 and as .f32.avx2, .bf16.avx2 (the baseline kernels), and
 * gru_fwd_bwd.bf16.avx512 draws avx512 (the fallback on a CPU without AVX-512).
 *
 * Wrong order: backward with a reserve no forward wrote (fuzz bytes, NaN, Inf), or one written
 * for other inputs / lengths / dropout keys, may return garbage numbers (documented in
 * docs/robustness.md) but must return a status and stay inside its buffers. */
#include "kfuse.h"
#include "ref_rnn.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_input.h"

static char g_desc[256]; /* the session's configuration, for oracle reports */
#define FAIL(...)                                                                                  \
    do {                                                                                           \
        fprintf(stderr, "fuzz_rnn oracle [%s]: ", g_desc);                                         \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, "\n  last error: \"%s\"\n", kf_last_error_message());                      \
        abort();                                                                                   \
    } while (0)

/* Interesting 64-bit extents: 0, negative, limits, overflow bait. */
static int64_t interesting_i64(rd *r, int64_t honest) {
    static const int64_t v[] = {0,         -1,        -2,          INT64_MIN,  INT64_MAX,
                                INT32_MAX, (int64_t)INT32_MAX + 1, (int64_t)1 << 32,
                                (int64_t)1 << 40,     (int64_t)1 << 62,        INT64_MAX / 2,
                                INT64_MAX / 3 + 1,    1,           2,          7,
                                65536,     3037000500LL /* sqrt(INT64_MAX) + 1 */};
    uint32_t k = u8(r);
    if (k < sizeof v / sizeof v[0]) return v[k];
    if (k < 40) return (int64_t)((uint64_t)honest + 1);
    if (k < 60) return (int64_t)((uint64_t)honest - 1);
    if (k < 80) return (int64_t)((uint64_t)honest * 2);
    return (int64_t)u64(r);
}

static size_t interesting_size(rd *r) {
    static const size_t v[] = {0, 1, 63, 64, 65, 4096, 1u << 20, 16u << 20, SIZE_MAX,
                               SIZE_MAX - 1, SIZE_MAX - 63, SIZE_MAX - 64, SIZE_MAX / 2,
                               (size_t)1 << 62, (size_t)1 << 44};
    uint32_t k = u8(r);
    if (k < sizeof v / sizeof v[0]) return v[k];
    return (size_t)(u32(r) % (1u << 22)); /* at most 4 MiB of real allocation */
}

/* ---- guarded buffers -------------------------------------------------------------------------- */
/* A buffer of `cap` bytes at a 64-byte aligned address, followed by CANARY bytes of 0xA5. Only a
 * call's declared region may change. */
#define CANARY 64
typedef struct buf {
    unsigned char *mem; /* allocation */
    unsigned char *p;   /* 64-aligned start */
    size_t cap;
} buf;

static buf buf_new(size_t cap) {
    buf b;
    b.mem = malloc(cap + CANARY + 128);
    if (!b.mem) abort();
    b.p = (unsigned char *)(((uintptr_t)b.mem + 63) & ~(uintptr_t)63);
    b.cap = cap;
    memset(b.p, 0xA5, cap + CANARY + 64);
    return b;
}
static void buf_free(buf *b) {
    free(b->mem);
    b->mem = b->p = NULL;
}
/* Bytes 64 past cap are guarded too: data pointers may be offset by up to 60 bytes. */
static void buf_check_canary(const buf *b, size_t used, const char *what) {
    for (size_t i = used; i < b->cap + CANARY + 64; i++)
        if (b->p[i] != 0xA5 && i >= b->cap)
            FAIL("%s: canary byte %zu (cap %zu) overwritten", what, i - b->cap, b->cap);
}

/* ---- a tensor argument with its honest backing -------------------------------------------------- */
typedef struct targ {
    kf_tensor t;     /* what is passed */
    buf b;           /* backing, dtype (the plan's, or int32 for lengths) */
    float *f;        /* an input's values (fuzz_store: what b holds) */
    int64_t numel;   /* honest element count */
    int64_t shape[3];
    int ndim;
    int32_t dtype;
    bool present;    /* passed with data */
    const char *name;
} targ;

static void targ_make(targ *a, const char *name, int32_t dtype, int ndim, const int64_t *shape,
                      bool present) {
    memset(a, 0, sizeof *a);
    a->name = name;
    a->ndim = ndim;
    a->dtype = dtype;
    a->numel = 1;
    for (int i = 0; i < ndim; i++) a->shape[i] = shape[i], a->numel *= shape[i];
    a->b = buf_new((size_t)a->numel * fuzz_dtype_bytes(dtype));
    a->f = calloc((size_t)a->numel, sizeof *a->f);
    if (!a->f) abort();
    a->present = present;
    kf_tensor_init(&a->t, present ? a->b.p : NULL, dtype, ndim, shape);
}
static void targ_reset(targ *a) { /* undo mutations */
    kf_tensor_init(&a->t, a->present ? a->b.p : NULL, a->dtype, a->ndim, a->shape);
}
static float *tf(const targ *a) { return a->f; }
static void sync(targ *a) { fuzz_store(a->dtype, a->b.p, a->f, a->numel); }
static void targ_free(targ *a) { buf_free(&a->b), free(a->f); }

/* ---- the session of one input ----------------------------------------------------------------- */
#define MAXW (3 * 2 * 10)
typedef struct sess {
    kf_context *ctx;
    bool fixed_arena;
    kf_rnn_plan *plan;
    ref_rnn_cfg cfg;
    int nw;
    int64_t T, B, I, H;
    int L, D;
    bool batch_first;
    targ x, h0, len, y, hn, dy, dhn, dx, dh0;
    targ w[MAXW], dw[MAXW];
    bool use_h0, use_len;
    bool special;        /* inputs hold NaN / Inf / huge values: no numeric oracle */
    uint64_t seed, offset;
    buf reserve;
    size_t rs_need;
    int reserve_state;   /* 0 garbage, 1 written by a training forward on the current inputs */
    uint64_t reserve_seed, reserve_offset;
    bool reserve_h0, reserve_len; /* presence of h0 and lengths in that forward */
} sess;

static void fill_inputs(sess *s, rd *r) {
    ref_rng g;
    ref_rng_seed(&g, u64(r));
    ref_fill_uniform_f32(&g, tf(&s->x), s->x.numel, -1, 1);
    ref_fill_uniform_f32(&g, tf(&s->h0), s->h0.numel, -1, 1);
    ref_fill_uniform_f32(&g, tf(&s->dy), s->dy.numel, -1, 1);
    ref_fill_uniform_f32(&g, tf(&s->dhn), s->dhn.numel, -1, 1);
    for (int k = 0; k < s->nw; k++) ref_fill_uniform_f32(&g, tf(&s->w[k]), s->w[k].numel, -1, 1);
    int32_t *len = (int32_t *)s->len.b.p;
    for (int64_t b = 0; b < s->B; b++) len[b] = (int32_t)(ref_rng_next(&g) % (uint64_t)(s->T + 1));
    s->use_h0 = u8(r) & 1;
    s->use_len = u8(r) & 1;
    s->h0.present = s->use_h0;
    s->len.present = s->use_len;
    s->seed = u64(r);
    s->offset = u64(r) >> (u8(r) % 64);
    s->special = false;
    uint32_t sp = u8(r);
    if (sp >= 200) { /* IEEE specials and extremes at a fuzz-chosen spot */
        static const float vals[] = {NAN, INFINITY, -INFINITY, 1e30f, -1e30f, 1e-40f, -1e-45f,
                                     3.4e38f, 0.0f, -0.0f};
        float v = vals[u8(r) % (sizeof vals / sizeof vals[0])];
        targ *tg = sp % 3 == 0 ? &s->x : sp % 3 == 1 ? &s->h0 : &s->w[u8(r) % s->nw];
        tf(tg)[u16(r) % tg->numel] = v;
        s->special = true;
    }
    targ *in[] = {&s->x, &s->h0, &s->dy, &s->dhn};
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) sync(in[i]);
    for (int k = 0; k < s->nw; k++) sync(&s->w[k]);
    if (sp >= 250) /* invalid lengths: must be rejected when present */
        len[u8(r) % s->B] = (int32_t)interesting_i64(r, s->T);
    s->reserve_state = 0;
}

static bool lengths_valid_t(const sess *s, int64_t T) {
    const int32_t *len = (const int32_t *)s->len.b.p;
    for (int64_t b = 0; b < s->B; b++)
        if (len[b] < 0 || len[b] > T) return false;
    return true;
}

/* ---- mutations ------------------------------------------------------------------------------- */
typedef struct mut {
    bool must_fail; /* the contract requires a non-OK status (besides the lie) */
    int why[8];     /* harness lines that decided it, first ones kept (for oracle reports) */
    int nwhy;
    bool lied;      /* one tensor declares more than its buffer */
    targ *lie_t;    /* which, in which dim, and the extent it had before */
    int lie_dim;
    int64_t lie_old;
} mut;

static void must_fail(mut *m, int line) {
    m->must_fail = true;
    if (m->nwhy < (int)(sizeof m->why / sizeof m->why[0])) m->why[m->nwhy++] = line;
}

/* "fuzz_rnn.c:L1,L2,..": every harness line that made the call invalid. */
static const char *why_lines(const mut *m, char *buf, size_t n) {
    size_t used = (size_t)snprintf(buf, n, "fuzz_rnn.c:");
    for (int i = 0; i < m->nwhy && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%d", i ? "," : "", m->why[i]);
    return buf;
}

/* Whether the contract requires rejecting tensor `t` passed for the honest argument `a`. */
static bool tensor_bad(const targ *a, const kf_tensor *t, bool required) {
    if (!t->data) return required;
    if (t->dtype != a->dtype || t->ndim != a->ndim) return true;
    if ((uintptr_t)t->data % fuzz_dtype_bytes(a->dtype)) return true;
    int64_t stride = 1;
    for (int i = a->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != a->shape[i]) return true;
        if (a->shape[i] != 1 && t->strides[i] != stride) return true;
        stride *= a->shape[i];
    }
    return false;
}

/* Mutates tensor argument `a`. `pinned[d]`: whether another present tensor or the plan pins dim d
 * (a lie there is detectable). */
static void mutate_tensor(rd *r, targ *a, const bool *pinned, bool required, mut *m) {
    uint32_t kind = u8(r) % 10;
    kf_tensor *t = &a->t;
    switch (kind) {
    case 0: /* absent */
        t->data = NULL;
        break;
    case 1: { /* dtype */
        int32_t d = (int32_t)(u8(r) % 9) - 1;
        t->dtype = d;
        break;
    }
    case 2: { /* rank */
        int32_t nd = (int32_t)interesting_i64(r, a->ndim);
        if (nd > a->ndim && nd <= KF_MAX_DIMS)
            for (int i = a->ndim; i < nd; i++) t->shape[i] = 1, t->strides[i] = 1; /* still honest */
        t->ndim = nd;
        break;
    }
    case 3: case 4: { /* one extent */
        int dim = (int)(u8(r) % (uint32_t)a->ndim);
        int64_t v = interesting_i64(r, a->shape[dim]);
        if (v > a->shape[dim]) {
            if (m->lied || !pinned[dim]) break; /* keep at most one, detectable, lie */
            m->lied = true, m->lie_t = a, m->lie_dim = dim, m->lie_old = t->shape[dim];
            t->shape[dim] = v;
            break;
        }
        t->shape[dim] = v;
        break;
    }
    case 5: { /* strides */
        int dim = (int)(u8(r) % (uint32_t)a->ndim);
        int64_t v = interesting_i64(r, t->strides[dim]);
        t->strides[dim] = v;
        break;
    }
    case 6: /* misaligned by 1 to element size - 1 bytes (the buffer has slack after it) */
        if (t->data) { /* absolute: never re-aligned */
            t->data = (char *)a->b.p + 1 + u8(r) % (uint32_t)(fuzz_dtype_bytes(a->dtype) - 1);
        }
        break;
    case 7: /* shrunk declared count in one dim to 1: honest, wrong unless that dim is 1 */
        if (t->data) {
            int dim = (int)(u8(r) % (uint32_t)a->ndim);
            t->shape[dim] = 1;
        }
        break;
    default: /* optional tensor made present (honestly) or left alone */
        if (!t->data && a->b.p) t->data = a->b.p;
        break;
    }
}

/* ---- the reference oracle ---------------------------------------------------------------------- */
static double norm_f64(const double *v, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += v[i] * v[i];
    return sqrt(s);
}

/* got: n elements of the target's dtype. ||got - want|| < tol * ||want||, or below `abs_floor` (a
 * small tensor whose exact value is a cancelling sum, e.g. an epsilon gradient, is judged against
 * the scale of its call's gradients; 0 disables), with tol and abs_floor a float32 plan's bounds
 * and fuzz_input.h's derivation of the other dtypes' from them. */
static void check_close(const char *what, const targ *got, const double *want, int64_t n,
                        double tol32, double abs_floor32) {
    const double tol = fuzz_rel_bound(got->dtype, tol32);
    const double abs_floor = fuzz_abs_bound(got->dtype, abs_floor32);
    /* float16 rounds a result below its smallest normal (6.1e-5) to a multiple of 2^-24: up to
     * 2^-25 per element that no relative bound covers (an A-GRU's y of 1e-6: 2.9e-3 off, each
     * element correctly rounded; corpus agru_f16_subnormal_y) */
    const double sub = got->dtype == KF_DTYPE_F16 ? 0x1p-25 * sqrt((double)n) : 0.0;
    /* A 16-bit result whose exact value lies past the type's largest finite one rounds to inf
     * (float16: |v| >= 65520; an A-GRU with gamma 7e25 has dh0 ~ 1e25; corpus
     * agru_f16_overflow_dh0): such an element must be that inf, and leaves the norms */
    const double big = got->dtype == KF_DTYPE_F16    ? 65520.0
                       : got->dtype == KF_DTYPE_BF16 ? 0x1.fep127
                                                     : INFINITY;
    double num = 0.0, den2 = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double v = fuzz_get(got->dtype, got->b.p, i);
        if (fabs(want[i]) >= 0.999 * big && isinf(v) && (v > 0) == (want[i] > 0)) continue;
        num += (v - want[i]) * (v - want[i]);
        den2 += want[i] * want[i];
    }
    const double den = sqrt(den2), e = sqrt(num) / (den > 0 ? den : 1.0);
    bool ok = sqrt(num) < tol * (den > 0 ? den : 1.0) + sub || sqrt(num) < abs_floor + sub;
    if (!ok) {
        for (int64_t i = 0; i < n; i++)
            fprintf(stderr, "  %s[%lld] = %.17g, reference %.17g\n", what, (long long)i,
                    fuzz_get(got->dtype, got->b.p, i), want[i]);
        FAIL("%s: relative error %g against the float64 reference (%s: tol %g, floor %g)", what, e,
             fuzz_dtype_name(got->dtype), tol, abs_floor);
    }
}

/* Every element written and not NaN; finite, except that a 16-bit one may be an overflow's inf,
 * which check_close then holds to the reference. */
static void all_finite(const char *what, const targ *a) {
    const bool low = a->dtype == KF_DTYPE_F16 || a->dtype == KF_DTYPE_BF16;
    for (int64_t i = 0; i < a->numel; i++) {
        const double v = fuzz_get(a->dtype, a->b.p, i);
        if (isnan(v) || (isinf(v) && !low))
            FAIL("%s[%lld] = %g not written / not finite", what, (long long)i, v);
    }
}

/* ---- snapshots for "nothing written on failure" ------------------------------------------------- */
typedef struct snap {
    unsigned char *copy[2 * MAXW + 8];
    const buf *src[2 * MAXW + 8];
    int n;
} snap;
static void snap_add(snap *s, const buf *b) {
    s->src[s->n] = b;
    s->copy[s->n] = malloc(b->cap + CANARY + 64);
    memcpy(s->copy[s->n], b->p, b->cap + CANARY + 64);
    s->n++;
}
static void snap_verify_free(snap *s, bool unchanged, const char *call) {
    for (int i = 0; i < s->n; i++) {
        if (unchanged && memcmp(s->copy[i], s->src[i]->p, s->src[i]->cap + CANARY + 64) != 0)
            FAIL("%s failed but wrote output buffer #%d", call, i);
        free(s->copy[i]);
    }
    s->n = 0;
}

static void check_status(kf_status st, const char *call) {
    if ((unsigned)st > KF_ERR_INTERNAL) FAIL("%s returned %d, not a kf_status", call, (int)st);
    if (st == KF_ERR_INTERNAL) FAIL("%s returned KF_ERR_INTERNAL", call);
    if (st == KF_OK && kf_last_error_message()[0] != '\0') FAIL("%s: KF_OK with a message", call);
    if (st != KF_OK && kf_last_error_message()[0] == '\0') FAIL("%s: status %d without message", call, (int)st);
    if (strlen(kf_status_string(st)) == 0) FAIL("empty status string");
}

/* ---- workspace / reserve selection -------------------------------------------------------------- */
typedef struct wsarg {
    buf b;
    void *p;
    size_t bytes;
} wsarg;

static void pick_workspace(rd *r, size_t need, wsarg *w, mut *m) {
    memset(w, 0, sizeof *w);
    uint32_t k = u8(r) % 8;
    if (k < 4) return; /* arena */
    w->b = buf_new(need + 64);
    w->p = w->b.p;
    w->bytes = need;
    if (k == 5) { /* too small */
        if (need == 0) return;
        w->bytes = need - 1 - (size_t)(u16(r) % need);
        must_fail(m, __LINE__);
    } else if (k == 6) { /* misaligned */
        w->p = w->b.p + 1 + u8(r) % 63;
        must_fail(m, __LINE__);
    } else if (k == 7) { /* NULL with bytes */
        w->p = NULL;
        w->bytes = 1 + u16(r);
        must_fail(m, __LINE__);
    }
}

/* x defines T and B. A present tensor carrying one of those extents that was shrunk to x's new,
 * shrunk value would, with the others, make a valid smaller call that the oracle does not model:
 * restore that tensor's extent so that it disagrees with x (and pins the extent). `ts` holds the
 * tensors with their dim carrying T (t_dim) and B (b_dim), -1 where absent. */
typedef struct carried { targ *t; int t_dim, b_dim; } carried;

static void unalign_with_x(sess *s, const carried *ts, int n) {
    const int xt = s->batch_first ? 1 : 0, xb = 1 - xt;
    for (int i = 0; i < n; i++) {
        targ *t = ts[i].t;
        const int dims[2][2] = {{xt, ts[i].t_dim}, {xb, ts[i].b_dim}};
        for (int j = 0; j < 2; j++) {
            int xd = dims[j][0], td = dims[j][1];
            if (td < 0 || !t->t.data || td >= t->t.ndim) continue;
            if (s->x.t.shape[xd] != s->x.shape[xd] && t->t.shape[td] == s->x.t.shape[xd])
                t->t.shape[td] = t->shape[td];
        }
    }
}

/* ---- the calls ---------------------------------------------------------------------------------- */
static void call_forward(sess *s, rd *r, kf_mode mode) {
    mut m = {0};
    bool training = mode == KF_MODE_TRAINING;
    targ_reset(&s->x), targ_reset(&s->h0), targ_reset(&s->len), targ_reset(&s->y), targ_reset(&s->hn);
    for (int k = 0; k < s->nw; k++) targ_reset(&s->w[k]);
    bool want_hn = u8(r) & 1;
    if (!want_hn) s->hn.t.data = NULL;

    /* args struct, possibly with a larger struct_size and a tail */
    unsigned char argbuf[sizeof(kf_rnn_forward_args) + 64] __attribute__((aligned(16)));
    memset(argbuf, 0, sizeof argbuf);
    kf_rnn_forward_args *a = (kf_rnn_forward_args *)(void *)argbuf;
    kf_rnn_forward_args_init(a);
    kf_tensor wt[MAXW + 4];
    for (int k = 0; k < s->nw; k++) wt[k] = s->w[k].t;
    a->weights = wt;
    a->num_weights = s->nw;
    a->dropout_seed = s->seed;
    a->dropout_offset = s->offset;
    kf_mode passed_mode = mode;

    int nmut = (int)(u8(r) % 4);
    for (int i = 0; i < nmut; i++) {
        uint32_t what = u8(r) % 16;
        bool pin_all[3] = {true, true, true};
        switch (what) {
        case 0: case 1: case 2: /* x: T and B are pinned by y (required), I by the plan */
            mutate_tensor(r, &s->x, pin_all, true, &m);
            break;
        case 3: mutate_tensor(r, &s->h0, pin_all, false, &m); break;
        case 4: mutate_tensor(r, &s->len, pin_all, false, &m); break;
        case 5: case 6: mutate_tensor(r, &s->y, pin_all, true, &m); break;
        case 7: mutate_tensor(r, &s->hn, pin_all, false, &m); break;
        case 8: case 9: { int k = (int)(u8(r) % (uint32_t)s->nw); mutate_tensor(r, &s->w[k], pin_all, true, &m); wt[k] = s->w[k].t; break; }
        case 10: a->num_weights = (int32_t)interesting_i64(r, s->nw); break; /* judged below */
        case 11: a->reserved0 = (int32_t)u32(r) | 1; must_fail(&m, __LINE__); break;
        case 12: { size_t v = (size_t)interesting_i64(r, (int64_t)sizeof *a); if (v > sizeof argbuf) v = sizeof argbuf; a->struct_size = v; /* judged below */
                   if (u8(r) & 1 && v > sizeof *a) { argbuf[sizeof *a + (v - sizeof *a - 1)] = 1; } break; }
        case 13: passed_mode = (kf_mode)(int32_t)interesting_i64(r, mode); break; /* judged below */
        case 14: a->weights = NULL; must_fail(&m, __LINE__); break;
        default: a->dropout_seed = u64(r), a->dropout_offset = u64(r); break;
        }
    }
    {
        const int t = s->batch_first ? 1 : 0;
        const carried ts[] = {{&s->y, t, 1 - t}, {&s->h0, -1, 1}, {&s->hn, -1, 1}, {&s->len, -1, 0}};
        unalign_with_x(s, ts, 4);
    }
    a->x = s->x.t, a->h0 = s->h0.t, a->lengths = s->len.t, a->y = s->y.t, a->hn = s->hn.t;
    for (int k = 0; k < s->nw; k++) wt[k] = s->w[k].t;
    if (a->lengths.data && !lengths_valid_t(s, s->T)) must_fail(&m, __LINE__);
    if (m.lied && !m.lie_t->t.data) m.lied = false; /* absent: not read, not a lie */
    /* A later mutation of the same extent may have undone the lie (set it back to <= honest). */
    if (m.lied && m.lie_t->t.shape[m.lie_dim] <= m.lie_t->shape[m.lie_dim]) m.lied = false;
    if (a->struct_size < sizeof *a) must_fail(&m, __LINE__);
    /* judged after every mutation: a later one may set it back */
    if (a->num_weights != s->nw) must_fail(&m, __LINE__);
    for (size_t i = sizeof *a; i < a->struct_size && i < sizeof argbuf; i++)
        if (argbuf[i]) must_fail(&m, __LINE__);
    if (m.lied) must_fail(&m, __LINE__); /* every forward lie is pinned by y or the plan */
    if (tensor_bad(&s->x, &a->x, true) || tensor_bad(&s->h0, &a->h0, false) ||
        tensor_bad(&s->len, &a->lengths, false) || tensor_bad(&s->y, &a->y, true) ||
        tensor_bad(&s->hn, &a->hn, false))
        must_fail(&m, __LINE__);
    for (int k = 0; k < s->nw; k++)
        if (tensor_bad(&s->w[k], &wt[k], true)) must_fail(&m, __LINE__);
    if (passed_mode != KF_MODE_INFERENCE && passed_mode != KF_MODE_TRAINING) must_fail(&m, __LINE__);
    if (passed_mode != mode && (passed_mode == KF_MODE_INFERENCE || passed_mode == KF_MODE_TRAINING)) {
        mode = passed_mode; /* a valid mode after all */
        training = mode == KF_MODE_TRAINING;
    }

    size_t ws_need = 0, rs_need = 0;
    if (kf_rnn_workspace_size(s->plan, s->T, s->B, mode, &ws_need, &rs_need) != KF_OK)
        FAIL("workspace_size failed for a valid shape");
    wsarg ws;
    pick_workspace(r, ws_need, &ws, &m);
    /* reserve */
    void *rp = s->reserve.p;
    size_t rb = s->rs_need;
    if (training) {
        uint32_t k = u8(r) % 8;
        if (k == 5 && rs_need > 0) { rb = rs_need - 1 - (size_t)(u16(r) % rs_need); must_fail(&m, __LINE__); }
        else if (k == 6 && rs_need > 0) { rp = NULL; must_fail(&m, __LINE__); }
        else if (k == 7 && rs_need > 0) { rp = s->reserve.p + 4 * (1 + u8(r) % 15); rb = rs_need; must_fail(&m, __LINE__); }
    } else if (u8(r) & 1) {
        rp = NULL, rb = 0;
    }

    snap sn = {0};
    snap_add(&sn, &s->y.b), snap_add(&sn, &s->hn.b), snap_add(&sn, &s->reserve);
    /* poison outputs so that every element must be written */
    fuzz_poison(s->y.dtype, s->y.b.p, s->y.numel);
    fuzz_poison(s->hn.dtype, s->hn.b.p, s->hn.numel);
    snap_verify_free(&sn, false, "");
    snap_add(&sn, &s->y.b), snap_add(&sn, &s->hn.b), snap_add(&sn, &s->reserve);

    if (getenv("FUZZ_RNN_VERBOSE")) {
        const kf_tensor *ts[] = {&a->x, &a->h0, &a->lengths, &a->y, &a->hn};
        const targ *tg[] = {&s->x, &s->h0, &s->len, &s->y, &s->hn};
        for (int i = 0; i < 5; i++)
            fprintf(stderr, "  %s: data %+td dtype %d ndim %d shape %lld %lld %lld strides %lld %lld %lld\n",
                    tg[i]->name, ts[i]->data ? (char *)ts[i]->data - (char *)tg[i]->b.p : -1,
                    ts[i]->dtype, ts[i]->ndim, (long long)ts[i]->shape[0], (long long)ts[i]->shape[1],
                    (long long)ts[i]->shape[2], (long long)ts[i]->strides[0],
                    (long long)ts[i]->strides[1], (long long)ts[i]->strides[2]);
    }
    kf_status st = kf_rnn_forward(s->plan, passed_mode, a, ws.p, ws.bytes, rp, rb);
    check_status(st, "kf_rnn_forward");
    if (st != KF_OK) {
        snap_verify_free(&sn, true, "kf_rnn_forward");
        if (!m.must_fail && !(st == KF_ERR_WORKSPACE_TOO_SMALL && s->fixed_arena && !ws.p) &&
            st != KF_ERR_OUT_OF_MEMORY)
            FAIL("kf_rnn_forward rejected a valid call with %d", (int)st);
    } else {
        snap_verify_free(&sn, false, "");
        char wb[128];
        if (m.must_fail) FAIL("kf_rnn_forward accepted an invalid call (mode %d, %s, lie %s[%d]: %lld -> %lld)",
                              (int)passed_mode, why_lines(&m, wb, sizeof wb), m.lied ? m.lie_t->name : "-", m.lie_dim,
                              m.lied ? (long long)m.lie_old : 0, m.lied ? (long long)m.lie_t->t.shape[m.lie_dim] : 0);
        buf_check_canary(&s->y.b, s->y.b.cap, "y");
        buf_check_canary(&s->hn.b, s->hn.b.cap, "hn");
        if (training) buf_check_canary(&s->reserve, s->reserve.cap, "reserve");
        if (!s->special) {
            all_finite("y", &s->y);
            if (a->hn.data) all_finite("hn", &s->hn);
            ref_rnn_cfg c = s->cfg;
            c.training = training;
            c.seed = a->dropout_seed, c.offset = a->dropout_offset;
            double *x = ref_to_f64(tf(&s->x), s->x.numel);
            double *h0 = a->h0.data ? ref_to_f64(tf(&s->h0), s->h0.numel) : NULL;
            double *w[MAXW];
            for (int k = 0; k < s->nw; k++) w[k] = ref_to_f64(tf(&s->w[k]), s->w[k].numel);
            double *y = calloc((size_t)s->y.numel, 8), *hn = calloc((size_t)s->hn.numel, 8);
            ref_rnn_forward_f64(&c, x, h0, (const double *const *)w,
                                a->lengths.data ? (const int32_t *)s->len.b.p : NULL, y, hn);
            if (getenv("FUZZ_RNN_VERBOSE"))
                fprintf(stderr, "forward mode %d h0 %d len %d seed %llu offset %llu\n", (int)mode,
                        a->h0.data != NULL, a->lengths.data != NULL,
                        (unsigned long long)c.seed, (unsigned long long)c.offset);
            check_close("y", &s->y, y, s->y.numel, 1e-3, 0);
            if (a->hn.data) check_close("hn", &s->hn, hn, s->hn.numel, 1e-3, 0);
            free(x), free(h0), free(y), free(hn);
            for (int k = 0; k < s->nw; k++) free(w[k]);
        }
        if (training) {
            s->reserve_state = 1;
            s->reserve_seed = a->dropout_seed, s->reserve_offset = a->dropout_offset;
            s->reserve_h0 = a->h0.data != NULL, s->reserve_len = a->lengths.data != NULL;
        }
    }
    if (ws.b.mem) buf_free(&ws.b);
}

static void call_backward(sess *s, rd *r) {
    mut m = {0};
    targ *all[] = {&s->x, &s->h0, &s->len, &s->dy, &s->dhn, &s->dx, &s->dh0};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) targ_reset(all[i]);
    for (int k = 0; k < s->nw; k++) targ_reset(&s->w[k]), targ_reset(&s->dw[k]);
    uint32_t opt = u8(r);
    if (opt & 1) s->dy.t.data = NULL;
    if (opt & 2) s->dhn.t.data = NULL;
    if (opt & 4) s->dx.t.data = NULL;
    if (opt & 8) s->dh0.t.data = NULL;
    bool use_dw = !(opt & 16);
    bool accumulate = opt & 32;

    unsigned char argbuf[sizeof(kf_rnn_backward_args) + 64] __attribute__((aligned(16)));
    memset(argbuf, 0, sizeof argbuf);
    kf_rnn_backward_args *a = (kf_rnn_backward_args *)(void *)argbuf;
    kf_rnn_backward_args_init(a);
    kf_tensor wt[MAXW + 4], dwt[MAXW + 4];
    a->weights = wt;
    a->num_weights = s->nw;
    a->dweights = use_dw ? dwt : NULL;
    a->num_dweights = use_dw ? s->nw : 0;
    a->dropout_seed = s->reserve_state ? s->reserve_seed : s->seed;
    a->dropout_offset = s->reserve_state ? s->reserve_offset : s->offset;
    kf_grad_mode gm = accumulate ? KF_GRAD_ACCUMULATE : KF_GRAD_OVERWRITE;
    bool seed_changed = false;
    for (int k = 0; k < s->nw; k++)
        if (opt & 64 && (u8(r) & 3) == 0) s->dw[k].t.data = NULL; /* some absent */

    int nmut = (int)(u8(r) % 4);
    for (int i = 0; i < nmut; i++) {
        uint32_t what = u8(r) % 18;
        bool pin_all[3] = {true, true, true};
        /* x's T is pinned by dy or dx when present; B also by h0, lengths, dhn, dh0 */
        bool t_pin = s->dy.t.data || s->dx.t.data;
        bool b_pin = t_pin || s->h0.t.data || s->len.t.data || s->dhn.t.data || s->dh0.t.data;
        bool pin_x[3] = {s->batch_first ? b_pin : t_pin, s->batch_first ? t_pin : b_pin, true};
        switch (what) {
        case 0: case 1: mutate_tensor(r, &s->x, pin_x, true, &m); break;
        case 2: mutate_tensor(r, &s->h0, pin_all, false, &m); break;
        case 3: mutate_tensor(r, &s->len, pin_all, false, &m); break;
        case 4: mutate_tensor(r, &s->dy, pin_all, false, &m); break;
        case 5: mutate_tensor(r, &s->dhn, pin_all, false, &m); break;
        case 6: mutate_tensor(r, &s->dx, pin_all, false, &m); break;
        case 7: mutate_tensor(r, &s->dh0, pin_all, false, &m); break;
        case 8: { int k = (int)(u8(r) % (uint32_t)s->nw); mutate_tensor(r, &s->w[k], pin_all, true, &m); break; }
        case 9: { int k = (int)(u8(r) % (uint32_t)s->nw); mutate_tensor(r, &s->dw[k], pin_all, false, &m); break; }
        case 10: a->num_weights = (int32_t)interesting_i64(r, s->nw); break; /* judged below */
        case 11: a->num_dweights = (int32_t)interesting_i64(r, a->num_dweights); break; /* judged below */
        case 12: if (u8(r) & 1) a->reserved0 = (int32_t)u32(r) | 1; else a->reserved1 = (int32_t)u32(r) | 1; must_fail(&m, __LINE__); break;
        case 13: { size_t v = (size_t)interesting_i64(r, (int64_t)sizeof *a); if (v > sizeof argbuf) v = sizeof argbuf; a->struct_size = v; /* judged below */
                   if (u8(r) & 1 && v > sizeof *a) { argbuf[sizeof *a + (v - sizeof *a - 1)] = 1; } break; }
        case 14: { int32_t v = (int32_t)interesting_i64(r, gm); if (v == 1 || v == 2) accumulate = v == 2; gm = (kf_grad_mode)v; break; }
        case 15: a->weights = NULL; must_fail(&m, __LINE__); break;
        case 16: a->dropout_seed = u64(r); seed_changed = true; break;
        default: break;
        }
    }
    {
        const int t = s->batch_first ? 1 : 0;
        const carried ts[] = {{&s->dy, t, 1 - t}, {&s->dx, t, 1 - t}, {&s->h0, -1, 1},
                              {&s->dhn, -1, 1}, {&s->dh0, -1, 1}, {&s->len, -1, 0}};
        unalign_with_x(s, ts, 6);
    }
    if (m.lied && !m.lie_t->t.data) m.lied = false; /* absent: not read, not a lie */
    /* A later mutation of the same extent may have undone the lie (set it back to <= honest). */
    if (m.lied && m.lie_t->t.shape[m.lie_dim] <= m.lie_t->shape[m.lie_dim]) m.lied = false;
    if (a->struct_size < sizeof *a) must_fail(&m, __LINE__);
    /* judged after every mutation: a later one may set it back */
    if (a->num_weights != s->nw) must_fail(&m, __LINE__);
    for (size_t i = sizeof *a; i < a->struct_size && i < sizeof argbuf; i++)
        if (argbuf[i]) must_fail(&m, __LINE__);
    if (m.lied && m.lie_t >= s->dw && m.lie_t < s->dw + MAXW && !a->dweights) m.lied = false;
    /* A lie on x's T or B must stay pinned by what is present after all mutations. */
    if (m.lied && m.lie_t == &s->x && m.lie_dim < 2) {
        bool t_pin = s->dy.t.data || s->dx.t.data;
        bool b_pin = t_pin || s->h0.t.data || s->len.t.data || s->dhn.t.data || s->dh0.t.data;
        bool is_t = (m.lie_dim == 0) != s->batch_first;
        if (!(is_t ? t_pin : b_pin)) s->x.t.shape[m.lie_dim] = m.lie_old, m.lied = false;
    }
    if (m.lied) must_fail(&m, __LINE__);
    a->x = s->x.t, a->h0 = s->h0.t, a->lengths = s->len.t, a->dy = s->dy.t, a->dhn = s->dhn.t;
    a->dx = s->dx.t, a->dh0 = s->dh0.t;
    for (int k = 0; k < s->nw; k++) wt[k] = s->w[k].t, dwt[k] = s->dw[k].t;
    for (int k = s->nw; k < MAXW + 4; k++) memset(&wt[k], 0, sizeof wt[k]), memset(&dwt[k], 0, sizeof dwt[k]);
    if (gm != KF_GRAD_OVERWRITE && gm != KF_GRAD_ACCUMULATE) must_fail(&m, __LINE__);
    if (a->dweights == NULL && a->num_dweights != 0) must_fail(&m, __LINE__);
    if (a->dweights != NULL && a->num_dweights != s->nw) must_fail(&m, __LINE__);
    if (a->lengths.data && !lengths_valid_t(s, s->T)) must_fail(&m, __LINE__);
    /* x defines T and B: in backward a smaller x is a valid, smaller problem unless a present
     * tensor pins that extent (dy, dx pin T; those and h0, lengths, dhn, dh0 pin B). */
    targ xfree = s->x;
    bool x_resized = false;
    {
        bool t_pin = a->dy.data || a->dx.data;
        bool b_pin = t_pin || a->h0.data || a->lengths.data || a->dhn.data || a->dh0.data;
        for (int dim = 0; dim < 2; dim++) {
            bool is_t = (dim == 0) != s->batch_first;
            if (!(is_t ? t_pin : b_pin) && a->x.ndim == 3 && a->x.shape[dim] >= 1 &&
                a->x.shape[dim] <= s->x.shape[dim] && a->x.shape[dim] != s->x.shape[dim])
                xfree.shape[dim] = a->x.shape[dim], x_resized = true;
        }
    }
    if (x_resized && a->lengths.data && !lengths_valid_t(s, xfree.shape[s->batch_first ? 1 : 0]))
        must_fail(&m, __LINE__);
    {
        const targ *tg[] = {&xfree, &s->h0, &s->len, &s->dy, &s->dhn, &s->dx, &s->dh0};
        const kf_tensor *ts[] = {&a->x, &a->h0, &a->lengths, &a->dy, &a->dhn, &a->dx, &a->dh0};
        for (int i = 0; i < 7; i++)
            if (tensor_bad(tg[i], ts[i], i == 0)) {
                must_fail(&m, __LINE__);
                if (getenv("FUZZ_RNN_VERBOSE"))
                    fprintf(stderr, "  bad %s: data %+td dtype %d ndim %d shape %lld %lld %lld "
                            "strides %lld %lld %lld\n", tg[i]->name,
                            ts[i]->data ? (char *)ts[i]->data - (char *)tg[i]->b.p : -1,
                            ts[i]->dtype, ts[i]->ndim, (long long)ts[i]->shape[0],
                            (long long)ts[i]->shape[1], (long long)ts[i]->shape[2],
                            (long long)ts[i]->strides[0], (long long)ts[i]->strides[1],
                            (long long)ts[i]->strides[2]);
            }
    }
    for (int k = 0; k < s->nw; k++) {
        if (tensor_bad(&s->w[k], &wt[k], true)) must_fail(&m, __LINE__);
        if (a->dweights && tensor_bad(&s->dw[k], &dwt[k], false)) must_fail(&m, __LINE__);
    }

    /* Sizes of the problem the call describes: a smaller x makes a smaller problem, whose
     * workspace and reserve needs are smaller too. */
    const int64_t t_eff = xfree.shape[s->batch_first ? 1 : 0];
    const int64_t b_eff = xfree.shape[s->batch_first ? 0 : 1];
    size_t ws_need = 0, rs_need = 0;
    if (kf_rnn_workspace_size(s->plan, t_eff, b_eff, KF_MODE_TRAINING, &ws_need, &rs_need) != KF_OK)
        FAIL("workspace_size failed for a valid shape");
    wsarg ws;
    pick_workspace(r, ws_need, &ws, &m);
    const void *rp = s->reserve.p;
    size_t rb = rs_need;
    uint32_t k = u8(r) % 8;
    if (k == 5 && rs_need > 0) { rb = rs_need - 1 - (size_t)(u16(r) % rs_need); must_fail(&m, __LINE__); }
    else if (k == 6 && rs_need > 0) { rp = NULL; must_fail(&m, __LINE__); }
    else if (k == 7) { /* garbage reserve: never written by a forward */
        uint32_t f = u8(r) % 4;
        float v = f == 0 ? NAN : f == 1 ? INFINITY : f == 2 ? 1e30f : 0.5f;
        float *q = (float *)s->reserve.p;
        for (size_t i = 0; i < rs_need / 4; i++) q[i] = (i % 3) ? v : (float)(int32_t)u8(r);
        s->reserve_state = 0;
    }

    /* prefill outputs: poison in overwrite mode, a known finite value in accumulate mode */
    fuzz_poison(s->dx.dtype, s->dx.b.p, s->dx.numel);
    fuzz_poison(s->dh0.dtype, s->dh0.b.p, s->dh0.numel);
    for (int q = 0; q < s->nw; q++) {
        if (!accumulate) {
            fuzz_poison(s->dw[q].dtype, s->dw[q].b.p, s->dw[q].numel);
            continue;
        }
        for (int64_t i = 0; i < s->dw[q].numel; i++) tf(&s->dw[q])[i] = 0.25f; /* every dtype's */
        sync(&s->dw[q]);
    }
    snap sn = {0};
    snap_add(&sn, &s->dx.b), snap_add(&sn, &s->dh0.b), snap_add(&sn, &s->reserve);
    for (int q = 0; q < s->nw; q++) snap_add(&sn, &s->dw[q].b);

    kf_status st = kf_rnn_backward(s->plan, gm, a, ws.p, ws.bytes, rp, rb);
    check_status(st, "kf_rnn_backward");
    if (st != KF_OK) {
        snap_verify_free(&sn, true, "kf_rnn_backward");
        if (!m.must_fail && !(st == KF_ERR_WORKSPACE_TOO_SMALL && s->fixed_arena && !ws.p) &&
            st != KF_ERR_OUT_OF_MEMORY)
            FAIL("kf_rnn_backward rejected a valid call with %d", (int)st);
    } else {
        /* backward reads the reserve: it must not change it */
        if (memcmp(sn.copy[2], s->reserve.p, s->reserve.cap + CANARY + 64) != 0)
            FAIL("kf_rnn_backward wrote the reserve");
        snap_verify_free(&sn, false, "");
        char wb[128];
        if (m.must_fail) FAIL("kf_rnn_backward accepted an invalid call (%s, lie %s[%d]: %lld -> %lld)", why_lines(&m, wb, sizeof wb),
                              m.lied ? m.lie_t->name : "-", m.lie_dim,
                              m.lied ? (long long)m.lie_old : 0, m.lied ? (long long)m.lie_t->t.shape[m.lie_dim] : 0);
        buf_check_canary(&s->dx.b, s->dx.b.cap, "dx");
        buf_check_canary(&s->dh0.b, s->dh0.b.cap, "dh0");
        for (int q = 0; q < s->nw; q++) buf_check_canary(&s->dw[q].b, s->dw[q].b.cap, "dw");
        bool numeric = !s->special && s->reserve_state == 1 && !seed_changed && !x_resized &&
                       (a->h0.data != NULL) == s->reserve_h0 &&
                       (a->lengths.data != NULL) == s->reserve_len;
        if (numeric) {
            if (a->dx.data) all_finite("dx", &s->dx);
            if (a->dh0.data) all_finite("dh0", &s->dh0);
            ref_rnn_cfg c = s->cfg;
            c.training = 1;
            c.seed = a->dropout_seed, c.offset = a->dropout_offset;
            double *x = ref_to_f64(tf(&s->x), s->x.numel);
            double *h0 = a->h0.data ? ref_to_f64(tf(&s->h0), s->h0.numel) : NULL;
            double *dy = a->dy.data ? ref_to_f64(tf(&s->dy), s->dy.numel) : NULL;
            double *dhn = a->dhn.data ? ref_to_f64(tf(&s->dhn), s->dhn.numel) : NULL;
            double *w[MAXW], *dw[MAXW];
            for (int q = 0; q < s->nw; q++) {
                w[q] = ref_to_f64(tf(&s->w[q]), s->w[q].numel);
                dw[q] = calloc((size_t)s->w[q].numel, 8);
            }
            double *dx = calloc((size_t)s->x.numel, 8), *dh0 = calloc((size_t)s->h0.numel, 8);
            {
                const int32_t *len = a->lengths.data ? (const int32_t *)s->len.b.p : NULL;
                ref_rnn_backward_f64(&c, x, h0, (const double *const *)w, len, dy, dhn, dx, dh0,
                                     dw);
                /* The bound is max(1e-3, 4x the float32 reference's own error) per tensor
                 * (DESIGN.md): deep, dropout-amplified stacks with H=1 can cancel in float32 in
                 * any implementation, and such cases are still correct. */
                float *dx32 = calloc((size_t)s->x.numel, 4), *dh032 = calloc((size_t)s->h0.numel, 4);
                float *dw32[MAXW];
                const float *wt32[MAXW];
                for (int q = 0; q < s->nw; q++) {
                    dw32[q] = calloc((size_t)s->w[q].numel, 4);
                    wt32[q] = tf(&s->w[q]);
                }
                ref_rnn_backward_f32(&c, tf(&s->x), a->h0.data ? tf(&s->h0) : NULL,
                                     (const float *const *)wt32, len,
                                     a->dy.data ? tf(&s->dy) : NULL,
                                     a->dhn.data ? tf(&s->dhn) : NULL, dx32, dh032, dw32);
#define KF__FUZZ_TOL(F32, F64, N) fmax(1e-3, 4.0 * ref_rel_err_f32((F32), (F64), (N)))
                if (a->dx.data)
                    check_close("dx", &s->dx, dx, s->dx.numel,
                                KF__FUZZ_TOL(dx32, dx, s->dx.numel), 0);
                if (a->dh0.data)
                    check_close("dh0", &s->dh0, dh0, s->dh0.numel,
                                KF__FUZZ_TOL(dh032, dh0, s->h0.numel), 0);
                double dw_scale = 0.0; /* norm of all the call's weight gradients */
                for (int q = 0; q < s->nw; q++)
                    dw_scale = hypot(dw_scale, norm_f64(dw[q], s->dw[q].numel));
                for (int q = 0; q < s->nw && a->dweights; q++) {
                    if (!dwt[q].data) continue;
                    const double tol = KF__FUZZ_TOL(dw32[q], dw[q], s->dw[q].numel);
                    if (accumulate)
                        for (int64_t i = 0; i < s->dw[q].numel; i++) dw[q][i] += 0.25;
                    check_close("dweights", &s->dw[q], dw[q], s->dw[q].numel, tol,
                                1e-4 * dw_scale);
                }
#undef KF__FUZZ_TOL
                free(dx32), free(dh032);
                for (int q = 0; q < s->nw; q++) free(dw32[q]);
            }
            free(x), free(h0), free(dy), free(dhn), free(dx), free(dh0);
            for (int q = 0; q < s->nw; q++) free(w[q]), free(dw[q]);
        }
    }
    if (ws.b.mem) buf_free(&ws.b);
}

/* ---- misc API surface ---------------------------------------------------------------------------- */
static void misc_calls(rd *r, kf_context *ctx, kf_rnn_plan *plan) {
    (void)kf_status_string((kf_status)(int32_t)u32(r));
    if (kf_version() != KF_VERSION_NUMBER || !kf_version_string()) FAIL("version");
    /* kf_tensor_init with fuzzed rank / shape: no write on failure */
    kf_tensor t, before;
    memset(&t, 0x5A, sizeof t);
    before = t;
    int64_t shape[KF_MAX_DIMS];
    for (int i = 0; i < KF_MAX_DIMS; i++) shape[i] = interesting_i64(r, 3);
    int32_t nd = (int32_t)interesting_i64(r, 3);
    int32_t dt = (int32_t)(u8(r) % 9) - 1;
    kf_status st = kf_tensor_init(u8(r) & 7 ? &t : NULL, NULL, (kf_dtype)dt, nd,
                                  u8(r) & 7 ? shape : NULL);
    check_status(st, "kf_tensor_init");
    if (st != KF_OK && memcmp(&t, &before, sizeof t) != 0) FAIL("kf_tensor_init wrote on failure");
    /* NULL handles and out-pointers */
    int32_t dev;
    void *stream = (void *)1;
    check_status(kf_context_device_type(NULL, &dev), "device_type");
    check_status(kf_context_device_type(ctx, NULL), "device_type");
    check_status(kf_context_get_stream(ctx, u8(r) & 1 ? &stream : NULL), "get_stream");
    st = kf_context_set_stream(ctx, (void *)(uintptr_t)(u8(r) & 3));
    check_status(st, "set_stream");
    check_status(kf_context_arena_info(NULL, NULL, NULL), "arena_info");
    check_status(kf_context_synchronize(u8(r) & 1 ? ctx : NULL), "synchronize");
    int32_t cnt = -7;
    check_status(kf_rnn_weight_count(u8(r) & 1 ? plan : NULL, u8(r) & 1 ? &cnt : NULL), "weight_count");
    const char *name;
    int32_t wnd;
    int64_t wshape[KF_MAX_DIMS];
    int32_t idx = (int32_t)interesting_i64(r, 0);
    check_status(kf_rnn_weight_info(plan, idx, u8(r) & 1 ? &name : NULL, u8(r) & 1 ? &wnd : NULL,
                                    u8(r) & 1 ? wshape : NULL), "weight_info");
    size_t wsb = 7, rsb = 7;
    st = kf_rnn_workspace_size(plan, interesting_i64(r, 3), interesting_i64(r, 2),
                               (kf_mode)(int32_t)(u8(r) % 4), u8(r) & 1 ? &wsb : NULL,
                               u8(r) & 1 ? &rsb : NULL);
    check_status(st, "workspace_size");
    if (st != KF_OK && (wsb != 7 || rsb != 7)) FAIL("workspace_size wrote on failure");
    check_status(kf_rnn_forward(NULL, KF_MODE_INFERENCE, NULL, NULL, 0, NULL, 0), "forward(NULL)");
    check_status(kf_rnn_forward(plan, KF_MODE_INFERENCE, NULL, NULL, 0, NULL, 0), "forward(args NULL)");
    check_status(kf_rnn_backward(plan, KF_GRAD_OVERWRITE, NULL, NULL, 0, NULL, 0), "backward(args NULL)");
    kf_rnn_forward_args_init(NULL);
    kf_rnn_backward_args_init(NULL);
    kf_rnn_desc_init(NULL);
    kf_context_desc_init(NULL);
    kf_rnn_plan_destroy(NULL);
    kf_context_destroy(NULL);
}

/* ---- context and plan creation ------------------------------------------------------------------- */
static kf_context *make_context(rd *r, bool *fixed) {
    unsigned char db[sizeof(kf_context_desc) + 32] __attribute__((aligned(16)));
    memset(db, 0, sizeof db);
    kf_context_desc *d = (kf_context_desc *)(void *)db;
    kf_context_desc_init(d);
    uint32_t v = u8(r);
    /* One or two threads: two exercise the batch-slice split and concurrent GEMM calls. */
    d->num_threads = 1 + (int32_t)(v & 1);
    d->flags = (v & 2) ? KF_CONTEXT_FIXED_ARENA : 0;
    d->arena_bytes = (v & 4) ? (size_t)u16(r) * 16 : 0;
    bool must_fail = false;
    if (v & 8) { /* fuzz fields */
        switch (u8(r) % 7) {
        case 0: d->device_type = (int32_t)interesting_i64(r, 1); break;
        case 1: d->device_index = (int32_t)interesting_i64(r, 0); break;
        case 2: d->num_threads = (int32_t)interesting_i64(r, 1); break;
        case 3: d->flags = u32(r); break;
        case 4: d->arena_bytes = interesting_size(r); break;
        case 5: { size_t s = (size_t)interesting_i64(r, sizeof *d); if (s > sizeof db) s = sizeof db; d->struct_size = s; if (s < sizeof *d) must_fail = true; break; }
        default: if (d->struct_size < sizeof db) { d->struct_size = sizeof db; db[sizeof db - 1 - u8(r) % 32] = 1; must_fail = true; } break;
        }
    }
    if (d->device_type != KF_DEVICE_CPU || d->device_index != 0 || (d->flags & ~1u) ||
        d->num_threads < 0)
        must_fail = true;
    kf_context *ctx = (kf_context *)(uintptr_t)0x1;
    kf_status st = kf_context_create(u8(r) == 0xFF ? NULL : d, &ctx);
    check_status(st, "kf_context_create");
    if (st != KF_OK) {
        if (ctx != NULL) FAIL("kf_context_create failed without NULLing *out");
    } else if (must_fail) {
        FAIL("kf_context_create accepted an invalid descriptor");
    } else if (d->num_threads != 1) {
        kf_context_destroy(ctx); /* valid, but keep the harness's thread count small */
        ctx = NULL;
    }
    if (ctx == NULL) {
        kf_context_desc_init(d);
        d->num_threads = 1;
        if (kf_context_create(d, &ctx) != KF_OK) FAIL("plain context");
    }
    *fixed = st == KF_OK && (d->flags & KF_CONTEXT_FIXED_ARENA);
    return ctx;
}

static int LLVMFuzzerTestOneInputImpl(const uint8_t *data, size_t size) {
    rd r = {data, size};
    sess s;
    memset(&s, 0, sizeof s);
    const fuzz_setup su = fuzz_draw_setup(&r);
    s.ctx = make_context(&r, &s.fixed_arena);
    bool fixed = s.fixed_arena;

    /* plan descriptor */
    unsigned char db[sizeof(kf_rnn_desc) + 32] __attribute__((aligned(16)));
    memset(db, 0, sizeof db);
    kf_rnn_desc *d = (kf_rnn_desc *)(void *)db;
    kf_rnn_desc_init(d);
    uint32_t v = u8(&r);
    d->cell = (v & 1) ? KF_RNN_AGRU : KF_RNN_GRU;
    d->dtype = su.dtype;
    d->num_layers = (int32_t)range(&r, 1, 3);
    d->input_size = range(&r, 1, 6);
    d->hidden_size = range(&r, 1, 6);
    d->flags = (v & 2 ? KF_RNN_BATCH_FIRST : 0) | (v & 4 && !(v & 1) ? KF_RNN_BIDIRECTIONAL : 0);
    static const float drops[] = {0.0f, 0.0f, 0.25f, 0.5f, 0.9f};
    d->dropout = drops[u8(&r) % 5];
    d->gamma = (float)range(&r, 0, 20) / 100.0f;
    bool must_fail = false;
    if (v & 8) {
        switch (u8(&r) % 10) {
        case 0: d->cell = (int32_t)interesting_i64(&r, 1); break;
        case 1: d->num_layers = (int32_t)interesting_i64(&r, 1); break;
        case 2: d->input_size = interesting_i64(&r, 4); break;
        case 3: d->hidden_size = interesting_i64(&r, 4); break;
        case 4: d->flags = u32(&r); break;
        case 5: { uint32_t bits = u32(&r); memcpy(&d->dropout, &bits, 4); break; }
        case 6: { uint32_t bits = u32(&r); memcpy(&d->gamma, &bits, 4); break; }
        case 7: d->dtype = (int32_t)(u8(&r) % 9) - 1; break;
        case 8: { size_t sz = (size_t)interesting_i64(&r, sizeof *d); if (sz > sizeof db) sz = sizeof db; d->struct_size = sz; break; }
        default: d->struct_size = sizeof db; db[sizeof db - 1 - u8(&r) % 32] = 1; break;
        }
    }
    if (d->struct_size < sizeof *d || (d->cell != 1 && d->cell != 2) || d->num_layers < 1 ||
        d->input_size < 1 || d->hidden_size < 1 || (d->flags & ~3u) ||
        !(d->dropout >= 0.0f && d->dropout < 1.0f) || !isfinite(d->gamma) ||
        !fuzz_float_dtype(d->dtype) ||
        (d->cell == 2 && (d->flags & 2)))
        must_fail = true;
    for (size_t i = sizeof *d; i < d->struct_size && i < sizeof db; i++)
        if (db[i]) must_fail = true;
    kf_rnn_plan *plan = (kf_rnn_plan *)(uintptr_t)0x1;
    kf_status st = kf_rnn_plan_create(s.ctx, d, &plan);
    check_status(st, "kf_rnn_plan_create");
    if (st != KF_OK && plan != NULL) FAIL("kf_rnn_plan_create failed without NULLing *out");
    if (st == KF_OK && must_fail) FAIL("kf_rnn_plan_create accepted an invalid descriptor");
    /* a valid plan too large for real buffers: exercise the queries, then a call with absent
     * weights (must be rejected) */
    if (st == KF_OK && (d->num_layers > 3 || d->input_size > 6 || d->hidden_size > 6)) {
        int32_t n = 0;
        if (kf_rnn_weight_count(plan, &n) != KF_OK) FAIL("weight_count");
        for (int32_t k = 0; k < n; k += 1 + n / 64) {
            const char *nm = NULL;
            int32_t nd = 0;
            int64_t sh[KF_MAX_DIMS];
            if (kf_rnn_weight_info(plan, k, &nm, &nd, sh) != KF_OK || !nm || nd < 1 || nd > 2 ||
                sh[0] < 1)
                FAIL("weight_info");
        }
        size_t wsb, rsb;
        check_status(kf_rnn_workspace_size(plan, interesting_i64(&r, 4), interesting_i64(&r, 4),
                                           KF_MODE_TRAINING, &wsb, &rsb), "workspace_size");
        static double xs[64], ys[64]; /* room for 6 (12) elements of every dtype */
        kf_tensor *wt = calloc((size_t)n, sizeof *wt);
        kf_rnn_forward_args a;
        kf_rnn_forward_args_init(&a);
        int64_t sh[3] = {1, 1, d->input_size};
        kf_tensor_init(&a.x, xs, d->dtype, 3, sh); /* a lie on I, pinned by the plan... */
        a.x.data = d->input_size <= 6 ? xs : NULL;   /* ...so only pass data when honest */
        sh[2] = d->hidden_size * ((d->flags & 2) ? 2 : 1);
        kf_tensor_init(&a.y, sh[2] <= 12 ? ys : NULL, d->dtype, 3, sh);
        a.weights = wt;
        a.num_weights = n;
        st = kf_rnn_forward(plan, KF_MODE_INFERENCE, &a, NULL, 0, NULL, 0);
        check_status(st, "forward(big plan)");
        free(wt);
        if (st == KF_OK) FAIL("forward accepted absent weights");
        kf_rnn_plan_destroy(plan);
        kf_context_destroy(s.ctx);
        return 0;
    }
    if (st != KF_OK) { /* fall back to a bounded plan of the drawn dtype */
        kf_rnn_desc_init(d);
        d->cell = (v & 1) ? KF_RNN_AGRU : KF_RNN_GRU;
        d->dtype = su.dtype;
        d->input_size = 1 + (v >> 4) % 6;
        d->hidden_size = 1 + (v >> 5) % 6;
        if (kf_rnn_plan_create(s.ctx, d, &plan) != KF_OK) FAIL("plain plan");
    }
    s.plan = plan;
    s.L = d->num_layers;
    s.D = (d->flags & KF_RNN_BIDIRECTIONAL) ? 2 : 1;
    s.I = d->input_size, s.H = d->hidden_size;
    s.batch_first = d->flags & KF_RNN_BATCH_FIRST;
    s.T = range(&r, 1, 6);
    s.B = range(&r, 1, 5);
    if (kf_rnn_weight_count(plan, &s.nw) != KF_OK || s.nw != s.L * s.D * (d->cell == 1 ? 4 : 10))
        FAIL("weight_count");
    s.cfg = (ref_rnn_cfg){.cell = d->cell, .L = s.L, .D = s.D, .I = s.I, .H = s.H, .T = s.T,
                          .B = s.B, .batch_first = s.batch_first, .dropout = d->dropout,
                          .gamma = d->gamma};

    snprintf(g_desc, sizeof g_desc,
             "%s isa %s cell %d L %d D %d I %lld H %lld T %lld B %lld batch_first %d dropout %g gamma %g",
             fuzz_dtype_name(d->dtype), su.isa, d->cell, s.L, s.D, (long long)s.I, (long long)s.H, (long long)s.T, (long long)s.B,
             (int)s.batch_first, (double)d->dropout, (double)d->gamma);
    int64_t TB0 = s.batch_first ? s.B : s.T, TB1 = s.batch_first ? s.T : s.B;
    int64_t sh[3];
    sh[0] = TB0, sh[1] = TB1, sh[2] = s.I;
    targ_make(&s.x, "x", d->dtype, 3, sh, true);
    targ_make(&s.dx, "dx", d->dtype, 3, sh, true);
    sh[2] = s.D * s.H;
    targ_make(&s.y, "y", d->dtype, 3, sh, true);
    targ_make(&s.dy, "dy", d->dtype, 3, sh, true);
    sh[0] = s.L * s.D, sh[1] = s.B, sh[2] = s.H;
    targ_make(&s.h0, "h0", d->dtype, 3, sh, true);
    targ_make(&s.hn, "hn", d->dtype, 3, sh, true);
    targ_make(&s.dhn, "dhn", d->dtype, 3, sh, true);
    targ_make(&s.dh0, "dh0", d->dtype, 3, sh, true);
    sh[0] = s.B;
    targ_make(&s.len, "len", KF_DTYPE_I32, 1, sh, true);
    for (int k = 0; k < s.nw; k++) {
        int32_t nd;
        int64_t ws[KF_MAX_DIMS];
        const char *nm;
        if (kf_rnn_weight_info(plan, k, &nm, &nd, ws) != KF_OK) FAIL("weight_info");
        targ_make(&s.w[k], "w", d->dtype, nd, ws, true);
        targ_make(&s.dw[k], "dw", d->dtype, nd, ws, true);
    }
    size_t wsb;
    if (kf_rnn_workspace_size(plan, s.T, s.B, KF_MODE_TRAINING, &wsb, &s.rs_need) != KF_OK)
        FAIL("workspace_size");
    s.reserve = buf_new(s.rs_need);
    fill_inputs(&s, &r);

    int nops = 1 + (int)(u8(&r) % 8);
    for (int op = 0; op < nops; op++) {
        uint32_t o = u8(&r) % 12;
        size_t before_bytes = 0, after_bytes = 0;
        uint64_t g0 = 0, g1 = 0;
        if (kf_context_arena_info(s.ctx, &before_bytes, &g0) != KF_OK) FAIL("arena_info");
        switch (o) {
        case 0: case 1: case 2: call_forward(&s, &r, KF_MODE_TRAINING); break;
        case 3: case 4: call_forward(&s, &r, KF_MODE_INFERENCE); break;
        case 5: case 6: case 7: call_backward(&s, &r); break;
        case 8: fill_inputs(&s, &r); break;
        case 9: {
            size_t b = interesting_size(&r);
            st = kf_context_reserve(s.ctx, b);
            check_status(st, "kf_context_reserve");
            if (kf_context_arena_info(s.ctx, &after_bytes, &g1) != KF_OK) FAIL("arena_info");
            if (st == KF_OK && after_bytes < b) FAIL("reserve(%zu) OK but arena holds %zu", b, after_bytes);
            if (st != KF_OK && (after_bytes != before_bytes || g1 != g0)) FAIL("failed reserve changed the arena");
            break;
        }
        default: misc_calls(&r, s.ctx, plan); break;
        }
        if (kf_context_arena_info(s.ctx, &after_bytes, &g1) != KF_OK) FAIL("arena_info");
        if (fixed && g1 != g0 && o != 9) FAIL("a fixed arena grew outside kf_context_reserve");
        if (after_bytes < before_bytes) FAIL("the arena shrank");
    }

    targ *all[] = {&s.x, &s.h0, &s.len, &s.y, &s.hn, &s.dy, &s.dhn, &s.dx, &s.dh0};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) targ_free(all[i]);
    for (int k = 0; k < s.nw; k++) targ_free(&s.w[k]), targ_free(&s.dw[k]);
    buf_free(&s.reserve);
    kf_rnn_plan_destroy(plan);
    kf_context_destroy(s.ctx);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    return LLVMFuzzerTestOneInputImpl(data, size);
}

/* Huge impossible allocations (a 2^62-byte arena) must come back as KF_ERR_OUT_OF_MEMORY. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }
