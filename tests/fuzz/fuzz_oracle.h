/* What the libFuzzer harnesses fuzz_layers.c and fuzz_kan_conv.c share (header-only: each
 * harness is one translation unit): the oracle's failure report, the status discipline, guarded
 * buffers in the plan's dtype, interesting integers and the caller-workspace mutation. A harness defines FUZZ_NAME
 * (its name in oracle reports) before including this. fuzz_rnn.c predates it and draws its
 * integers from another table (merging them would change how its corpus decodes). */
#ifndef KF_FUZZ_ORACLE_H
#define KF_FUZZ_ORACLE_H

#include "kfuse.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_input.h"

/* The harness's own loops (references, byte comparisons, poisoning) stay out of the coverage
 * feedback: it should steer by the library's branches, and the trace-cmp hooks in these loops
 * would dominate the run time. */
#define NOCOV __attribute__((no_sanitize("coverage")))

/* What the current input is doing, for the report. */
static char g_desc[320];
#define FAIL(...)                                                                                  \
    do {                                                                                           \
        fprintf(stderr, FUZZ_NAME " oracle [%s]: ", g_desc);                                       \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, "\n  last error: \"%s\"\n", kf_last_error_message());                      \
        abort();                                                                                   \
    } while (0)

static int64_t interesting_i64(rd *r, int64_t honest) {
    static const int64_t v[] = {0,         -1,        -2,          INT64_MIN,  INT64_MAX,
                                INT32_MAX, (int64_t)INT32_MAX + 1, (int64_t)1 << 32,
                                (int64_t)1 << 40,     (int64_t)1 << 62,        INT64_MAX / 2,
                                INT64_MAX / 3 + 1,    1,           2,          7,
                                65536,     3037000500LL, INT32_MIN, 46341, 1 << 30};
    uint32_t k = u8(r);
    if (k < sizeof v / sizeof v[0]) return v[k];
    if (k < 60) return (int64_t)((uint64_t)honest + 1);
    if (k < 100) return (int64_t)((uint64_t)honest - 1);
    if (k < 120) return (int64_t)((uint64_t)honest * 2);
    if (k < 200) return honest;
    return (int64_t)u64(r);
}

/* Every status is a kf_status, never KF_ERR_INTERNAL, with a message exactly when it fails. */
static void check_status(kf_status st, const char *call) {
    if ((unsigned)st > KF_ERR_INTERNAL) FAIL("%s returned %d, not a kf_status", call, (int)st);
    if (st == KF_ERR_INTERNAL) FAIL("%s returned KF_ERR_INTERNAL", call);
    if (st == KF_OK && kf_last_error_message()[0] != '\0') FAIL("%s: KF_OK with a message", call);
    if (st != KF_OK && kf_last_error_message()[0] == '\0') FAIL("%s: status %d without message", call, (int)st);
}

/* ---- guarded buffers ------------------------------------------------------------------------- */
#define GUARD 128 /* bytes after cap that must never change (data may be offset by up to 3) */
typedef struct buf {
    unsigned char *mem, *p; /* allocation, 64-aligned start */
    size_t cap;
} buf;
static buf buf_new(size_t cap) {
    buf b;
    b.mem = malloc(cap + GUARD + 64);
    if (!b.mem) abort();
    b.p = (unsigned char *)(((uintptr_t)b.mem + 63) & ~(uintptr_t)63);
    b.cap = cap;
    memset(b.p, 0xA5, cap + GUARD);
    return b;
}

/* ---- workspace --------------------------------------------------------------------------------- */
typedef struct wsarg { buf b; void *p; size_t bytes; } wsarg;
static bool pick_workspace(rd *r, size_t need, wsarg *w) { /* returns: must fail */
    memset(w, 0, sizeof *w);
    uint32_t k = u8(r) % 8;
    if (k < 4) return false; /* arena */
    w->b = buf_new(need + 64);
    w->p = w->b.p;
    w->bytes = need;
    if (k == 5 && need > 0) { w->bytes = need - 1 - (size_t)(u16(r) % need); return true; }
    if (k == 6) { w->p = w->b.p + 1 + u8(r) % 63; return true; }
    if (k == 7) { w->p = NULL; w->bytes = 1 + u16(r); return true; }
    return false;
}

/* Contiguity with the library's rule (extents of 1 take any stride); false on overflow. */
NOCOV static bool contiguous(const kf_tensor *t, int64_t *numel) {
    int64_t expect = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != expect) return false;
        if (__builtin_mul_overflow(expect, t->shape[i], &expect)) return false;
    }
    *numel = expect;
    return true;
}

/* got: n elements of dtype dt; ||got - want|| <= 1e-3 ||want|| + 1e-4 sqrt(n) for float32, and
 * the bounds fuzz_input.h derives from it for the other dtypes. */
NOCOV static void check_close(const char *what, int32_t dt, const void *got, const double *want,
                              int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        const double v = fuzz_get(dt, got, i);
        if (!isfinite(v)) FAIL("%s[%lld] = %g: not written / not finite", what, (long long)i, v);
        double e = v - want[i];
        num += e * e, den += want[i] * want[i];
    }
    const double rel = fuzz_rel_bound(dt, 1e-3), floor = fuzz_abs_bound(dt, 1e-4) * sqrt((double)n);
    if (sqrt(num) > rel * sqrt(den) + floor) {
        for (int64_t i = 0; i < n; i++)
            fprintf(stderr, "  %s[%lld] = %.17g, reference %.17g\n", what, (long long)i,
                    fuzz_get(dt, got, i), want[i]);
        FAIL("%s: error %g against the float64 reference (norm %g; %s bound %g relative + %g)",
             what, sqrt(num), sqrt(den), fuzz_dtype_name(dt), rel, floor);
    }
}

/* The tensor mutations both harnesses make, as case k of their own draw: absent, dtype (any
 * value: another float dtype than the plan's among them), rank, one extent, one stride, data
 * misaligned for the element size esz, one extent shrunk to 1 (k = 0..7; `data` is the buffer,
 * `ndim` the honest rank). Returns false for any other k, the harness's own cases. */
static bool mutate_tensor_common(rd *r, kf_tensor *t, unsigned char *data, int ndim, size_t esz,
                                 uint32_t k) {
    switch (k) {
    case 0: t->data = NULL; return true;
    case 1: t->dtype = (int32_t)(u8(r) % 9) - 1; return true;
    case 2: {
        int32_t nd = (int32_t)interesting_i64(r, t->ndim);
        if (nd > t->ndim && nd <= KF_MAX_DIMS)
            for (int i = t->ndim < 0 ? 0 : t->ndim; i < nd; i++) t->shape[i] = 1, t->strides[i] = 1;
        t->ndim = nd;
        return true;
    }
    case 3: case 4: { int d = (int)(u8(r) % (uint32_t)ndim); t->shape[d] = interesting_i64(r, t->shape[d]); return true; }
    case 5: { int d = (int)(u8(r) % (uint32_t)ndim); t->strides[d] = interesting_i64(r, t->strides[d]); return true; }
    case 6: if (t->data) t->data = (char *)data + 1 + u8(r) % (uint32_t)(esz - 1); return true;
    case 7: if (t->data) t->shape[u8(r) % (uint32_t)ndim] = 1; return true;
    default: return false;
    }
}

#endif /* KF_FUZZ_ORACLE_H */
