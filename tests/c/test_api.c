/* The non-op part of the ABI: version, status strings, the thread-local last-error message,
 * kf_tensor_init, and the context (create/destroy/stream/reserve/arena_info/synchronize), on the
 * CPU; a CUDA context where this build has no CUDA, or no usable driver, is refused cleanly. */
#define _POSIX_C_SOURCE 200809L

#include <criterion/criterion.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kfuse.h"
#include "kf_test.h"

/* The status is `want`; the message names `fn` and one of the '|'-separated tokens of `args`. */
static void check_error(const char *what, kf_status got, kf_status want, const char *fn,
                        const char *args) {
    const char *msg = kf_last_error_message();
    cr_assert(msg != NULL, "%s: message is NULL", what);
    cr_expect(got == want, "%s: status %s, expected %s (message '%s')", what,
              kf_status_string(got), kf_status_string(want), msg);
    cr_expect(has_token(msg, fn), "%s: message '%s' does not name %s", what, msg, fn);
    char buf[128];
    snprintf(buf, sizeof buf, "%s", args);
    int named = 0;
    for (char *save = NULL, *t = strtok_r(buf, "|", &save); t; t = strtok_r(NULL, "|", &save))
        named |= has_token(msg, t);
    cr_expect(named, "%s: message '%s' does not name the argument (%s)", what, msg, args);
}

/* ---- version ------------------------------------------------------------------------------ */
Test(api, version) {
    cr_expect_eq(kf_version(), (uint32_t)KF_VERSION_NUMBER, "kf_version() = %u, header says %u",
                 (unsigned)kf_version(), (unsigned)KF_VERSION_NUMBER);
    cr_expect_eq(KF_VERSION_NUMBER,
                 KF_VERSION_MAJOR * 10000 + KF_VERSION_MINOR * 100 + KF_VERSION_PATCH);
    cr_expect_eq(KF_ABI_VERSION, KF_VERSION_MAJOR);
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", KF_VERSION_MAJOR, KF_VERSION_MINOR, KF_VERSION_PATCH);
    const char *v = kf_version_string();
    cr_assert(v != NULL);
    cr_expect_str_eq(v, want, "kf_version_string() = '%s', expected '%s'", v, want);
    cr_expect(kf_version_string() == v || strcmp(kf_version_string(), v) == 0);
}

/* ---- status strings ----------------------------------------------------------------------- */
Test(api, status_strings) {
    static const struct { kf_status s; int value; const char *name; } all[] = {
        {KF_OK, 0, "KF_OK"},
        {KF_ERR_INVALID_ARGUMENT, 1, "KF_ERR_INVALID_ARGUMENT"},
        {KF_ERR_UNSUPPORTED, 2, "KF_ERR_UNSUPPORTED"},
        {KF_ERR_OUT_OF_MEMORY, 3, "KF_ERR_OUT_OF_MEMORY"},
        {KF_ERR_WORKSPACE_TOO_SMALL, 4, "KF_ERR_WORKSPACE_TOO_SMALL"},
        {KF_ERR_BACKEND_UNAVAILABLE, 5, "KF_ERR_BACKEND_UNAVAILABLE"},
        {KF_ERR_DEVICE, 6, "KF_ERR_DEVICE"},
        {KF_ERR_INTERNAL, 7, "KF_ERR_INTERNAL"},
    };
    const size_t n = sizeof all / sizeof all[0];
    for (size_t i = 0; i < n; ++i) {
        cr_expect_eq((int)all[i].s, all[i].value, "%s = %d, fixed forever at %d", all[i].name,
                     (int)all[i].s, all[i].value);
        const char *str = kf_status_string(all[i].s);
        cr_assert(str != NULL, "%s: NULL string", all[i].name);
        size_t len = strlen(all[i].name);
        /* "NAME: meaning", and not a prefix of a longer name */
        cr_expect(strncmp(str, all[i].name, len) == 0 && !ident_char(str[len]),
                  "kf_status_string(%s) = '%s'", all[i].name, str);
        cr_expect(strlen(str) > len + 2, "kf_status_string(%s) = '%s' has no meaning", all[i].name,
                  str);
        for (size_t j = 0; j < i; ++j)
            cr_expect(strcmp(str, kf_status_string(all[j].s)) != 0, "%s and %s share '%s'",
                      all[i].name, all[j].name, str);
    }
    const int unknown[] = {-1, 8, 99, 1 << 30};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; ++i) {
        const char *str = kf_status_string((kf_status)unknown[i]);
        cr_assert(str != NULL, "kf_status_string(%d) is NULL", unknown[i]);
        cr_expect(strlen(str) > 0, "kf_status_string(%d) is empty", unknown[i]);
        for (size_t j = 0; j < n; ++j)
            cr_expect(strcmp(str, kf_status_string(all[j].s)) != 0,
                      "kf_status_string(%d) = '%s', the string of %s", unknown[i], str,
                      all[j].name);
    }
}

/* ---- the last-error message --------------------------------------------------------------- */
Test(api, last_error_semantics) {
    const char *m = kf_last_error_message();
    cr_assert(m != NULL);
    cr_expect_str_eq(m, "", "fresh thread's message '%s'", m);

    kf_tensor t;
    int64_t shape[2] = {2, -3};
    kf_status s = kf_tensor_init(&t, NULL, KF_DTYPE_F32, 2, shape);
    check_error("negative extent", s, KF_ERR_INVALID_ARGUMENT, "kf_tensor_init", "shape");
    char saved[512];
    snprintf(saved, sizeof saved, "%s", kf_last_error_message());
    cr_expect(strlen(saved) > 0);

    /* neither kf_status_string nor kf_last_error_message changes it */
    (void)kf_status_string(KF_OK);
    (void)kf_status_string(KF_ERR_INTERNAL);
    (void)kf_status_string((kf_status)1234);
    (void)kf_last_error_message();
    cr_expect_str_eq(kf_last_error_message(), saved, "message changed by status_string/last_error");
    /* nor do the *_init functions and version queries, which cannot fail */
    (void)kf_version();
    (void)kf_version_string();

    /* a successful call clears it */
    shape[1] = 3;
    cr_assert_eq(kf_tensor_init(&t, NULL, KF_DTYPE_F32, 2, shape), KF_OK);
    cr_expect_str_eq(kf_last_error_message(), "", "after success: '%s'", kf_last_error_message());

    /* a later failure replaces an earlier one */
    kf_context_desc d;
    kf_context_desc_init(&d);
    d.device_index = 3;
    kf_context *ctx = NULL;
    check_error("context", kf_context_create(&d, &ctx), KF_ERR_INVALID_ARGUMENT,
                "kf_context_create", "device_index");
    check_error("context", kf_context_arena_info(NULL, NULL, NULL), KF_ERR_INVALID_ARGUMENT,
                "kf_context_arena_info", "ctx");
    cr_expect(!has_token(kf_last_error_message(), "kf_context_create"),
              "stale message '%s'", kf_last_error_message());
}

typedef struct thread_result { char msg_before[512], msg_after[512]; kf_status s; } thread_result;

static void *thread_main(void *arg) {
    thread_result *r = arg;
    snprintf(r->msg_before, sizeof r->msg_before, "%s", kf_last_error_message());
    r->s = kf_context_reserve(NULL, 16);
    snprintf(r->msg_after, sizeof r->msg_after, "%s", kf_last_error_message());
    return NULL;
}

Test(api, last_error_is_thread_local) {
    int64_t shape[1] = {-1};
    kf_tensor t;
    cr_assert_eq(kf_tensor_init(&t, NULL, KF_DTYPE_F32, 1, shape), KF_ERR_INVALID_ARGUMENT);
    char mine[512];
    snprintf(mine, sizeof mine, "%s", kf_last_error_message());
    thread_result r;
    memset(&r, 0, sizeof r);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, thread_main, &r), 0);
    pthread_join(th, NULL);
    cr_expect_str_eq(r.msg_before, "", "new thread sees '%s'", r.msg_before);
    cr_expect_eq(r.s, KF_ERR_INVALID_ARGUMENT);
    cr_expect(has_token(r.msg_after, "kf_context_reserve"), "thread's message '%s'", r.msg_after);
    cr_expect_str_eq(kf_last_error_message(), mine, "main thread's message changed to '%s'",
                     kf_last_error_message());
}

/* ---- tensors ------------------------------------------------------------------------------ */
Test(api, tensor_init) {
    float buf[2 * 3 * 4];
    int64_t shape[3] = {2, 3, 4};
    kf_tensor t;
    memset(&t, 0xAB, sizeof t);
    cr_assert_eq(kf_tensor_init(&t, buf, KF_DTYPE_F32, 3, shape), KF_OK);
    cr_expect(t.data == buf);
    cr_expect_eq(t.dtype, KF_DTYPE_F32);
    cr_expect_eq(t.ndim, 3);
    cr_expect(t.shape[0] == 2 && t.shape[1] == 3 && t.shape[2] == 4);
    cr_expect(t.strides[0] == 12 && t.strides[1] == 4 && t.strides[2] == 1,
              "strides %lld %lld %lld, expected 12 4 1 (elements, row-major)",
              (long long)t.strides[0], (long long)t.strides[1], (long long)t.strides[2]);

    /* absent tensor, rank 0, zero extent, every dtype, KF_MAX_DIMS */
    cr_expect_eq(kf_tensor_init(&t, NULL, KF_DTYPE_I32, 1, shape), KF_OK);
    cr_expect(t.data == NULL && t.dtype == KF_DTYPE_I32 && t.ndim == 1 && t.shape[0] == 2);
    cr_expect_eq(kf_tensor_init(&t, buf, KF_DTYPE_F32, 0, shape), KF_OK);
    cr_expect_eq(t.ndim, 0);
    int64_t zero[2] = {0, 5};
    cr_expect_eq(kf_tensor_init(&t, buf, KF_DTYPE_F32, 2, zero), KF_OK);
    const kf_dtype dts[] = {KF_DTYPE_F32, KF_DTYPE_F64, KF_DTYPE_F16, KF_DTYPE_BF16,
                            KF_DTYPE_I32, KF_DTYPE_I64};
    for (size_t i = 0; i < sizeof dts / sizeof dts[0]; ++i) {
        cr_expect_eq(kf_tensor_init(&t, NULL, dts[i], 3, shape), KF_OK, "dtype %d", (int)dts[i]);
        cr_expect_eq(t.dtype, (int32_t)dts[i]);
    }
    int64_t six[KF_MAX_DIMS] = {1, 2, 1, 3, 1, 2};
    cr_expect_eq(kf_tensor_init(&t, buf, KF_DTYPE_F32, KF_MAX_DIMS, six), KF_OK);
    cr_expect(t.strides[KF_MAX_DIMS - 1] == 1 && t.strides[3] == 2 && t.strides[1] == 6 &&
                  t.strides[0] == 12, "6-d strides");

    /* errors leave *t untouched */
    const struct { int32_t ndim; int64_t s0; kf_dtype dt; const char *tok; } bad[] = {
        {-1, 2, KF_DTYPE_F32, "ndim"},
        {KF_MAX_DIMS + 1, 2, KF_DTYPE_F32, "ndim"},
        {3, -1, KF_DTYPE_F32, "shape"},
        {3, INT64_MIN, KF_DTYPE_F32, "shape"},
    };
    int64_t big[KF_MAX_DIMS + 1] = {2, 3, 4, 1, 1, 1, 1};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        kf_tensor before, u;
        memset(&u, 0x5C, sizeof u);
        before = u;
        big[0] = bad[i].s0;
        char what[64];
        snprintf(what, sizeof what, "ndim %d shape[0] %lld", (int)bad[i].ndim,
                 (long long)bad[i].s0);
        check_error(what, kf_tensor_init(&u, buf, bad[i].dt, bad[i].ndim, big),
                    KF_ERR_INVALID_ARGUMENT, "kf_tensor_init", bad[i].tok);
        cr_expect(memcmp(&u, &before, sizeof u) == 0, "%s: tensor written by a failing call", what);
    }
    check_error("NULL t", kf_tensor_init(NULL, buf, KF_DTYPE_F32, 3, shape),
                KF_ERR_INVALID_ARGUMENT, "kf_tensor_init", "t");
    check_error("NULL shape", kf_tensor_init(&t, buf, KF_DTYPE_F32, 2, NULL),
                KF_ERR_INVALID_ARGUMENT, "kf_tensor_init", "shape");
    check_error("bad dtype", kf_tensor_init(&t, buf, (kf_dtype)0, 2, shape),
                KF_ERR_INVALID_ARGUMENT, "kf_tensor_init", "dtype");
    check_error("bad dtype", kf_tensor_init(&t, buf, (kf_dtype)77, 2, shape),
                KF_ERR_INVALID_ARGUMENT, "kf_tensor_init", "dtype");
}

/* ---- contexts ----------------------------------------------------------------------------- */
static kf_context *make_cpu(void) {
    kf_context_desc d;
    kf_context_desc_init(&d);
    kf_context *ctx = NULL;
    cr_assert_eq(kf_context_create(&d, &ctx), KF_OK, "%s", kf_last_error_message());
    cr_assert(ctx != NULL);
    cr_expect_str_eq(kf_last_error_message(), "");
    return ctx;
}

Test(api, context_desc_defaults) {
    kf_context_desc d;
    memset(&d, 0xEE, sizeof d);
    kf_context_desc_init(&d);
    cr_expect_eq(d.struct_size, sizeof(kf_context_desc));
    cr_expect_eq(d.device_type, KF_DEVICE_CPU);
    cr_expect_eq(d.device_index, 0);
    cr_expect_eq(d.num_threads, 0);
    cr_expect_eq(d.flags, 0u);
    cr_expect_eq(d.arena_bytes, 0u);

    kf_rnn_desc r;
    memset(&r, 0xEE, sizeof r);
    kf_rnn_desc_init(&r);
    cr_expect_eq(r.struct_size, sizeof(kf_rnn_desc));
    cr_expect_eq(r.cell, KF_RNN_GRU);
    cr_expect_eq(r.num_layers, 1);
    cr_expect_eq(r.input_size, 0);
    cr_expect_eq(r.hidden_size, 0);
    cr_expect_eq(r.flags, 0u);
    cr_expect(r.dropout == 0.0f);
    cr_expect(r.gamma == 0.01f, "gamma default %g", (double)r.gamma);
    cr_expect_eq(r.dtype, KF_DTYPE_F32);

    kf_rnn_forward_args fa;
    memset(&fa, 0xEE, sizeof fa);
    kf_rnn_forward_args_init(&fa);
    cr_expect_eq(fa.struct_size, sizeof fa);
    cr_expect(fa.x.data == NULL && fa.h0.data == NULL && fa.y.data == NULL &&
              fa.hn.data == NULL && fa.lengths.data == NULL && fa.weights == NULL);
    cr_expect(fa.num_weights == 0 && fa.reserved0 == 0 && fa.dropout_seed == 0 &&
              fa.dropout_offset == 0);
    kf_rnn_backward_args ba;
    memset(&ba, 0xEE, sizeof ba);
    kf_rnn_backward_args_init(&ba);
    cr_expect_eq(ba.struct_size, sizeof ba);
    cr_expect(ba.dy.data == NULL && ba.dhn.data == NULL && ba.dx.data == NULL &&
              ba.dh0.data == NULL && ba.dweights == NULL && ba.num_dweights == 0 &&
              ba.reserved0 == 0 && ba.reserved1 == 0);
}

Test(api, cpu_context_lifecycle) {
    kf_context *ctx = make_cpu();
    int32_t dt = -1;
    cr_expect_eq(kf_context_device_type(ctx, &dt), KF_OK);
    cr_expect_eq(dt, KF_DEVICE_CPU);
    void *stream = (void *)&dt;
    cr_expect_eq(kf_context_get_stream(ctx, &stream), KF_OK);
    cr_expect(stream == NULL, "CPU stream %p, expected NULL", stream);
    cr_expect_eq(kf_context_set_stream(ctx, NULL), KF_OK, "%s", kf_last_error_message());
    check_error("set_stream non-NULL on CPU", kf_context_set_stream(ctx, (void *)&dt),
                KF_ERR_INVALID_ARGUMENT, "kf_context_set_stream", "stream");
    cr_expect_eq(kf_context_synchronize(ctx), KF_OK);
    cr_expect_str_eq(kf_last_error_message(), "");

    size_t bytes = 123;
    uint64_t grows = 456;
    cr_expect_eq(kf_context_arena_info(ctx, &bytes, &grows), KF_OK);
    cr_expect_eq(bytes, 0u, "default arena %zu bytes, expected 0 (grown on first need)", bytes);
    cr_expect_eq(kf_context_arena_info(ctx, NULL, NULL), KF_OK);
    uint64_t g0 = grows;

    cr_expect_eq(kf_context_reserve(ctx, 1 << 20), KF_OK, "%s", kf_last_error_message());
    cr_expect_eq(kf_context_arena_info(ctx, &bytes, &grows), KF_OK);
    cr_expect(bytes >= (1u << 20), "arena %zu bytes after reserve(1 MiB)", bytes);
    cr_expect(grows > g0, "grow_count %llu -> %llu after growing", (unsigned long long)g0,
              (unsigned long long)grows);
    /* never shrinks; a smaller or equal reserve is a no-op */
    uint64_t g1 = grows;
    size_t b1 = bytes;
    cr_expect_eq(kf_context_reserve(ctx, 4096), KF_OK);
    cr_expect_eq(kf_context_reserve(ctx, 1 << 20), KF_OK);
    cr_expect_eq(kf_context_reserve(ctx, 0), KF_OK);
    cr_expect_eq(kf_context_arena_info(ctx, &bytes, &grows), KF_OK);
    cr_expect(bytes == b1 && grows == g1,
              "arena changed by a smaller reserve: %zu/%llu -> %zu/%llu",
              b1, (unsigned long long)g1, bytes, (unsigned long long)grows);
    cr_expect_eq(kf_context_reserve(ctx, (1 << 20) + 1), KF_OK);
    cr_expect_eq(kf_context_arena_info(ctx, &bytes, &grows), KF_OK);
    cr_expect(bytes >= (1u << 20) + 1 && grows > g1);
    kf_context_destroy(ctx);
    kf_context_destroy(NULL);
}

Test(api, context_arena_at_creation) {
    kf_context_desc d;
    kf_context_desc_init(&d);
    d.arena_bytes = 100000;
    d.num_threads = 1;
    kf_context *ctx = NULL;
    cr_assert_eq(kf_context_create(&d, &ctx), KF_OK, "%s", kf_last_error_message());
    size_t bytes = 0;
    cr_expect_eq(kf_context_arena_info(ctx, &bytes, NULL), KF_OK);
    cr_expect(bytes >= 100000, "arena %zu bytes, asked for 100000", bytes);
    kf_context_destroy(ctx);
    /* also with a fixed arena, the creation-time arena is allocated */
    d.flags = KF_CONTEXT_FIXED_ARENA;
    cr_assert_eq(kf_context_create(&d, &ctx), KF_OK, "%s", kf_last_error_message());
    cr_expect_eq(kf_context_arena_info(ctx, &bytes, NULL), KF_OK);
    cr_expect(bytes >= 100000, "fixed arena %zu bytes, asked for 100000", bytes);
    /* and kf_context_reserve grows even a fixed arena */
    cr_expect_eq(kf_context_reserve(ctx, 200000), KF_OK, "%s", kf_last_error_message());
    cr_expect_eq(kf_context_arena_info(ctx, &bytes, NULL), KF_OK);
    cr_expect(bytes >= 200000, "fixed arena %zu bytes after reserve(200000)", bytes);
    kf_context_destroy(ctx);
}

Test(api, reserve_out_of_memory) {
#ifdef KF_TEST_ASAN
    cr_skip_test("ASan aborts on impossible allocations unless allocator_may_return_null=1");
#else
    kf_context *ctx = make_cpu();
    /* 2^62 bytes: more than any address space holds, yet positive as a signed size (valgrind
     * reports "negative" sizes as errors) */
    check_error("reserve 2^62", kf_context_reserve(ctx, SIZE_MAX / 4), KF_ERR_OUT_OF_MEMORY,
                "kf_context_reserve", "arena|bytes");
    size_t bytes = 1;
    cr_expect_eq(kf_context_arena_info(ctx, &bytes, NULL), KF_OK);
    cr_expect_eq(bytes, 0u, "arena changed by a failed reserve");
    kf_context_destroy(ctx);
#endif
}

/* Regression (fuzzer, benches/results/reliability.md bug 1): a reserve within 63 bytes of SIZE_MAX
 * once rounded up to a 0-byte block that the arena then claimed held SIZE_MAX - 8 bytes. It must
 * fail cleanly before any allocation (no allocator involved, so this runs under ASan too). */
Test(api, reserve_near_size_max_is_rejected) {
    kf_context *ctx = make_cpu();
    check_error("reserve SIZE_MAX - 8", kf_context_reserve(ctx, SIZE_MAX - 8),
                KF_ERR_OUT_OF_MEMORY, "kf_context_reserve", "arena|bytes");
    size_t bytes = 1;
    cr_expect_eq(kf_context_arena_info(ctx, &bytes, NULL), KF_OK);
    cr_expect_eq(bytes, 0u, "arena changed by a failed reserve");
    kf_context_destroy(ctx);
}

/* Context creation errors: status, message naming the field, *out NULL (documented). */
Test(api, context_create_errors) {
    const kf_status INV = KF_ERR_INVALID_ARGUMENT;
    struct { const char *field; kf_context_desc d; } cases[8];
    size_t n = 0;
    kf_context_desc base;
    kf_context_desc_init(&base);
#define ADD(fieldname, ...)                                                                   \
    do {                                                                                      \
        cases[n].field = fieldname;                                                           \
        cases[n].d = base;                                                                    \
        kf_context_desc *d = &cases[n].d;                                                     \
        __VA_ARGS__;                                                                          \
        ++n;                                                                                  \
    } while (0)
    ADD("struct_size", d->struct_size = 0);
    ADD("struct_size", d->struct_size = sizeof(kf_context_desc) - 8);
    ADD("device_type", d->device_type = 0);
    ADD("device_type", d->device_type = 99);
    ADD("device_index", d->device_index = 1);
    ADD("device_index", d->device_index = -1);
    ADD("num_threads", d->num_threads = -2);
    ADD("flags", d->flags = 0x10);
#undef ADD
    for (size_t i = 0; i < n; ++i) {
        kf_context *ctx = (kf_context *)(uintptr_t)0x5A5A;
        kf_status s = kf_context_create(&cases[i].d, &ctx);
        check_error(cases[i].field, s, INV, "kf_context_create", cases[i].field);
        cr_expect(ctx == NULL, "%s: *out = %p after a failure, documented NULL", cases[i].field,
                  (void *)ctx);
    }
    kf_context *ctx = (kf_context *)(uintptr_t)0x5A5A;
    check_error("desc NULL", kf_context_create(NULL, &ctx), INV, "kf_context_create", "desc");
    cr_expect(ctx == NULL, "*out = %p after a NULL desc", (void *)ctx);
    check_error("out NULL", kf_context_create(&base, NULL), INV, "kf_context_create", "out");

    /* a newer caller's larger struct */
    struct { kf_context_desc d; uint64_t tail[2]; } big;
    memset(&big, 0, sizeof big);
    big.d = base;
    big.d.struct_size = sizeof big;
    ctx = NULL;
    cr_expect_eq(kf_context_create(&big.d, &ctx), KF_OK, "zero tail: %s", kf_last_error_message());
    kf_context_destroy(ctx);
    big.tail[0] = 1;
    ctx = (kf_context *)(uintptr_t)0x5A5A;
    kf_status s = kf_context_create(&big.d, &ctx);
    cr_expect(s == KF_ERR_UNSUPPORTED || s == INV, "non-zero tail: %s", kf_status_string(s));
    cr_expect(has_token(kf_last_error_message(), "kf_context_create") &&
                  has_token(kf_last_error_message(), "struct_size"),
              "message '%s'", kf_last_error_message());
    cr_expect(ctx == NULL);
}

/* KF_CPU_ISA picks the CPU recurrent kernels' instruction set at context creation: unset, empty
 * and "avx2" always work, "avx512" where the build and the CPU have AVX-512 kernels, anything
 * else is refused (Criterion runs each test in its own process, so the environment is ours). */
Test(api, cpu_isa_environment) {
    kf_context_desc d;
    kf_context_desc_init(&d);
    static const char *ok[] = {"avx2", ""};
    for (int i = 0; i < 2; i++) {
        kf_context *ctx = NULL;
        cr_assert_eq(setenv("KF_CPU_ISA", ok[i], 1), 0);
        cr_expect_eq(kf_context_create(&d, &ctx), KF_OK, "KF_CPU_ISA='%s': %s", ok[i],
                     kf_last_error_message());
        kf_context_destroy(ctx);
    }
    static const char *bad[] = {"avx-512", "AVX2", "x86-64-v4 "};
    for (int i = 0; i < 3; i++) {
        kf_context *ctx = (kf_context *)(uintptr_t)0x5A5A;
        cr_assert_eq(setenv("KF_CPU_ISA", bad[i], 1), 0);
        check_error(bad[i], kf_context_create(&d, &ctx), KF_ERR_INVALID_ARGUMENT,
                    "kf_context_create", "KF_CPU_ISA");
        cr_expect(ctx == NULL, "KF_CPU_ISA='%s': *out = %p after a failure", bad[i], (void *)ctx);
    }
    kf_context *ctx = (kf_context *)(uintptr_t)0x5A5A;
    cr_assert_eq(setenv("KF_CPU_ISA", "avx512", 1), 0);
    kf_status s = kf_context_create(&d, &ctx);
    if (s == KF_OK) {
        kf_context_destroy(ctx);
    } else {
        check_error("avx512", s, KF_ERR_UNSUPPORTED, "kf_context_create", "KF_CPU_ISA");
        cr_expect(ctx == NULL, "KF_CPU_ISA=avx512: *out = %p after a failure", (void *)ctx);
    }
#if defined(__x86_64__) && defined(__GNUC__)
    /* where the CPU runs x86-64-v4 only a build without the kernels may refuse */
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512cd") && s != KF_OK)
        cr_expect(strstr(kf_last_error_message(), "built without") != NULL,
                  "AVX-512 CPU, KF_CPU_ISA=avx512 refused: '%s'", kf_last_error_message());
#endif
}

Test(api, context_null_handles) {
    const kf_status INV = KF_ERR_INVALID_ARGUMENT;
    int32_t dt = 77;
    void *stream = (void *)&dt;
    size_t bytes = 5;
    uint64_t grows = 5;
    check_error("device_type", kf_context_device_type(NULL, &dt), INV, "kf_context_device_type",
                "ctx");
    cr_expect_eq(dt, 77);
    check_error("set_stream", kf_context_set_stream(NULL, NULL), INV, "kf_context_set_stream",
                "ctx");
    check_error("get_stream", kf_context_get_stream(NULL, &stream), INV, "kf_context_get_stream",
                "ctx");
    cr_expect(stream == (void *)&dt);
    check_error("reserve", kf_context_reserve(NULL, 64), INV, "kf_context_reserve", "ctx");
    check_error("arena_info", kf_context_arena_info(NULL, &bytes, &grows), INV,
                "kf_context_arena_info", "ctx");
    cr_expect(bytes == 5 && grows == 5);
    check_error("synchronize", kf_context_synchronize(NULL), INV, "kf_context_synchronize", "ctx");
    kf_context *ctx = make_cpu();
    check_error("device_type out", kf_context_device_type(ctx, NULL), INV,
                "kf_context_device_type", "device_type");
    check_error("get_stream out", kf_context_get_stream(ctx, NULL), INV, "kf_context_get_stream",
                "stream");
    kf_context_destroy(ctx);
}

/* CUDA: in a CPU-only build always KF_ERR_BACKEND_UNAVAILABLE; in a CUDA build OK with a usable
 * device, else also KF_ERR_BACKEND_UNAVAILABLE. The tests' build defines KF_HAVE_CUDA exactly
 * when the library has the CUDA backend. */
Test(api, cuda_context) {
    kf_context_desc d;
    kf_context_desc_init(&d);
    d.device_type = KF_DEVICE_CUDA;
    kf_context *ctx = (kf_context *)(uintptr_t)0x5A5A;
    kf_status s = kf_context_create(&d, &ctx);
#ifdef KF_HAVE_CUDA
    if (s == KF_OK) {
        cr_assert(ctx != NULL);
        int32_t dt = 0;
        cr_expect_eq(kf_context_device_type(ctx, &dt), KF_OK);
        cr_expect_eq(dt, KF_DEVICE_CUDA);
        void *stream = (void *)&dt;
        cr_expect_eq(kf_context_get_stream(ctx, &stream), KF_OK);
        cr_expect(stream == NULL, "a fresh CUDA context uses the legacy default stream");
        cr_expect_eq(kf_context_synchronize(ctx), KF_OK, "%s", kf_last_error_message());
        kf_context_destroy(ctx);
        /* an ordinal past the devices present */
        d.device_index = 1 << 20;
        ctx = (kf_context *)(uintptr_t)0x5A5A;
        s = kf_context_create(&d, &ctx);
        cr_expect(s == KF_ERR_INVALID_ARGUMENT || s == KF_ERR_BACKEND_UNAVAILABLE ||
                      s == KF_ERR_DEVICE, "device_index 2^20: %s", kf_status_string(s));
        cr_expect(ctx == NULL);
        return;
    }
    check_error("CUDA without a usable device", s, KF_ERR_BACKEND_UNAVAILABLE,
                "kf_context_create", "device_type|CUDA|cuda");
#else
    check_error("CUDA in a CPU-only build", s, KF_ERR_BACKEND_UNAVAILABLE, "kf_context_create",
                "device_type");
#endif
    cr_expect(ctx == NULL, "*out = %p after a failure", (void *)ctx);
}
