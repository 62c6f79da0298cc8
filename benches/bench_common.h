/* Helpers shared by the C benchmark drivers (bench_rnn.c, onednn_gru.c): command-line parsing,
 * a monotonic clock, medians, a deterministic random fill, and JSON-safe error reporting.
 * Header-only on purpose: each driver is one translation unit. Timing lives only in benches/. */
#ifndef KF_BENCH_COMMON_H
#define KF_BENCH_COMMON_H

#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Shape and run settings that both drivers read. */
typedef struct bench_args {
    const char *cell;   /* "gru" or "agru" */
    const char *device; /* "cpu" or "cuda" */
    long T, I, H, B, layers;
    long threads;       /* 0 = library / runtime default */
    long reps, warmup;
    int no_dx;          /* kfuse only: skip dx in backward (dx is computed by default) */
    int fwd_only;       /* skip forward+backward */
    const char *dtype;  /* kfuse only: "f32", "bf16" or "f16" (bench_device.h parses it) */
} bench_args;

static const char *bench_name = "bench";

/* Prints {"bench": ..., "error": "..."} on stdout (one JSON line, so the Python driver can
 * always parse the result) and the same text on stderr, then exits with status 1. */
static void bench_fail(const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s: %s\n", bench_name, msg);
    printf("{\"bench\": \"%s\", \"error\": \"", bench_name);
    for (const char *p = msg; *p; ++p) {
        if (*p == '"' || *p == '\\') printf("\\%c", *p);
        else if ((unsigned char)*p < 0x20) printf(" ");
        else putchar(*p);
    }
    printf("\"}\n");
    fflush(stdout);
    exit(1);
}

static void bench_usage(const char *prog) {
    fprintf(stderr,
            "usage: %s [--cell gru|agru] [--T n] [--I n] [--H n] [--B n] [--layers n]\n"
            "          [--threads n] [--device cpu|cuda] [--reps n] [--warmup n]\n"
            "          [--no-dx] [--fwd-only] [--dtype f32|bf16|f16]\n"
            "Defaults: --cell gru --T 28 --I 28 --H 128 --B 128 --layers 1 --threads 0\n"
            "          --device cpu --reps 20 --warmup 3 --dtype f32. Prints one JSON line.\n",
            prog);
}

static long bench_parse_long(const char *flag, const char *s, long lo) {
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end != '\0' || v < lo)
        bench_fail("bad value for %s: '%s' (expected an integer >= %ld)", flag, s, lo);
    return v;
}

/* Fails unless device is "cpu" or "cuda". */
static inline void bench_check_device(const char *device) {
    if (strcmp(device, "cpu") && strcmp(device, "cuda"))
        bench_fail("--device must be cpu or cuda, got '%s'", device);
}

/* The value after flag argv[*i] (advancing *i), failing when there is none. */
static inline const char *bench_flag_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) bench_fail("missing value after %s", argv[*i]);
    return argv[++*i];
}

static void bench_parse(int argc, char **argv, bench_args *a) {
    a->cell = "gru";
    a->device = "cpu";
    a->T = 28; a->I = 28; a->H = 128; a->B = 128; a->layers = 1;
    a->threads = 0; a->reps = 20; a->warmup = 3; a->no_dx = 0; a->fwd_only = 0; a->dtype = "f32";
    for (int i = 1; i < argc; ++i) {
        const char *f = argv[i];
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { bench_usage(argv[0]); exit(0); }
        if (!strcmp(f, "--no-dx")) { a->no_dx = 1; continue; }
        if (!strcmp(f, "--fwd-only")) { a->fwd_only = 1; continue; }
        const char *v = bench_flag_value(argc, argv, &i);
        if (!strcmp(f, "--cell")) a->cell = v;
        else if (!strcmp(f, "--device")) a->device = v;
        else if (!strcmp(f, "--T")) a->T = bench_parse_long(f, v, 1);
        else if (!strcmp(f, "--I")) a->I = bench_parse_long(f, v, 1);
        else if (!strcmp(f, "--H")) a->H = bench_parse_long(f, v, 1);
        else if (!strcmp(f, "--B")) a->B = bench_parse_long(f, v, 1);
        else if (!strcmp(f, "--layers")) a->layers = bench_parse_long(f, v, 1);
        else if (!strcmp(f, "--threads")) a->threads = bench_parse_long(f, v, 0);
        else if (!strcmp(f, "--reps")) a->reps = bench_parse_long(f, v, 1);
        else if (!strcmp(f, "--warmup")) a->warmup = bench_parse_long(f, v, 0);
        else if (!strcmp(f, "--dtype")) a->dtype = v;
        else { bench_usage(argv[0]); bench_fail("unknown argument '%s'", f); }
    }
    if (strcmp(a->cell, "gru") && strcmp(a->cell, "agru"))
        bench_fail("--cell must be gru or agru, got '%s'", a->cell);
    bench_check_device(a->device);
}

/* Milliseconds on the wall clock, or with KF_BENCH_CLOCK=cpu in the environment the process's
 * CPU time (CLOCK_PROCESS_CPUTIME_ID: with --threads 1, the work of a call without the time other
 * processes take from it on a loaded box; with more threads, the sum over them). */
static double bench_now_ms(void) {
    static int cpu = -1;
    if (cpu < 0) cpu = getenv("KF_BENCH_CLOCK") && !strcmp(getenv("KF_BENCH_CLOCK"), "cpu");
    struct timespec ts;
    clock_gettime(cpu ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts v in place; returns the median (mean of the middle two for even n). */
static double bench_median(double *v, long n) {
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return (n & 1) ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double bench_min(const double *v, long n) {
    double m = v[0];
    for (long i = 1; i < n; ++i) if (v[i] < m) m = v[i];
    return m;
}

/* splitmix64: a deterministic, seedable generator, so every run times the same data. */
static uint64_t bench_rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t bench_rng_next(void) {
    uint64_t z = (bench_rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Fills n floats uniformly in [lo, hi); never all zeros for n > 0 and lo < hi. */
static void bench_fill_uniform(float *p, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; ++i) {
        double u = (double)(bench_rng_next() >> 11) * (1.0 / 9007199254740992.0);
        p[i] = (float)(lo + (hi - lo) * u);
    }
}

static void *bench_alloc(size_t bytes) {
    size_t rounded = (bytes + 63) / 64 * 64;
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    if (!p) bench_fail("out of host memory (%zu bytes)", bytes);
    return p;
}

static const char *bench_env(const char *name) {
    const char *v = getenv(name);
    return v ? v : "";
}

#endif /* KF_BENCH_COMMON_H */
