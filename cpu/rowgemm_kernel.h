/* cpu/rowgemm.h's kernel for the arithmetic type T of the inclusion (cpu/rowgemm.h includes this
 * once per type, with T, V (its vector type, cpu/simd.h) and RG_X(name) = name_s or name_d
 * defined; no include guard). The operands' kinds are constant arguments of these force-inlined
 * functions (cpu/rowgemm.h's kf__rg_kind), so each call site is one kinds' code; mr, nv and the
 * tile's columns are constants where kf__rg_rows_X calls the tile, so its loops unroll into
 * registers. Lanes per vector: RG_L. */
#define RG_L ((int)(sizeof(V) / sizeof(T)))

/* A tile's step over B's row bq (of T): the tile's nv vectors of it, times the broadcast of A's
 * element of each row i, the expression AI, into the accumulators c. */
#define KF__RG_STEP(bq, AI)                                                                        \
    do {                                                                                           \
        const V *bq_ = (const V *)(bq); /* vector u: elements u L .. */                            \
        V bv[KF__RG_NV];                                                                           \
        for (int u = 0; u < nv; ++u) bv[u] = bq_[u];                                               \
        for (int i = 0; i < mr; ++i) {                                                             \
            const V av = RG_X(kf__splat)(AI);                                                      \
            for (int u = 0; u < nv; ++u) c[i][u] = RG_X(kf__fma)(av, bv[u], c[i][u]);              \
        }                                                                                          \
    } while (0)

/* B's row q of T (two stacked panels: rows q < K0 at B0 + q ldb, the others at B1). */
KF__RG_INLINE const T *RG_X(kf__rg_brow)(const T *B0, const T *B1, int64_t ldb, int64_t K0,
                                         int64_t q) {
    return q < K0 ? B0 + q * ldb : B1 + (q - K0) * ldb;
}

/* One tile: mr rows by a panel of nv vectors of columns, of which the first w are C's (w = nv L,
 * or w < L in a partial panel, nv = 1, whose B columns past w are zeros), B's rows of type T (a
 * low B is widened into its chunk first), the bias of B's kind kb. */
KF__RG_INLINE void RG_X(kf__rg_tile)(kf__rg_kind ka, kf__rg_kind kb, kf__rg_kind kc, int mr,
                                     int nv, int w, int64_t K, int64_t K0, T alpha, const void *A,
                                     int64_t am, int64_t aq, const T *B0, const T *B1, int64_t ldb,
                                     const void *bias, bool acc, void *C, int64_t ldc,
                                     const kf__rg_epi *epi) {
    enum { L = RG_L };
    V c[KF__RG_MR][KF__RG_NV];
    for (int i = 0; i < mr; ++i)
        for (int u = 0; u < nv; ++u) c[i][u] = (V){0};
    if (!kf__rg_native(ka) && aq == 1) {
        /* a low A's rows widened by vectors, KF__RG_KC elements at a time */
        T ab[KF__RG_MR][KF__RG_KC] __attribute__((aligned(KF__V_BYTES)));
        for (int64_t q0 = 0; q0 < K; q0 += KF__RG_KC) {
            const int64_t nq = K - q0 < KF__RG_KC ? K - q0 : KF__RG_KC; /* the chunk's rows */
            for (int i = 0; i < mr; ++i) RG_X(kf__rg_widen)(ka, A, i * am + q0, ab[i], nq);
            for (int64_t q = 0; q < nq; ++q)
                KF__RG_STEP(RG_X(kf__rg_brow)(B0, B1, ldb, K0, q0 + q), ab[i][q]);
        }
    } else if (!kf__rg_native(ka) && am == 1) {
        /* a low A^T (a tile's mr elements for one q lie together), widened by vectors, q by q,
         * KF__RG_KC at a time; element by element in the broadcasts, each widening used the
         * shuffle port three times (float16 SKLinear fwd+bwd, 256^2 B=64: 1.35x -> 1.28x
         * float32's on an AVX-512 Xeon) */
        T at[KF__RG_KC][8]; /* MR <= 8 */
        for (int64_t q0 = 0; q0 < K; q0 += KF__RG_KC) {
            const int64_t nq = K - q0 < KF__RG_KC ? K - q0 : KF__RG_KC; /* the chunk's rows */
            for (int64_t q = 0; q < nq; ++q)
                RG_X(kf__rg_widen_part)(ka, A, (q0 + q) * aq, mr, at[q]);
            for (int64_t q = 0; q < nq; ++q)
                KF__RG_STEP(RG_X(kf__rg_brow)(B0, B1, ldb, K0, q0 + q), at[q][i]);
        }
    } else {
        for (int64_t q = 0; q < K; ++q)
            KF__RG_STEP(RG_X(kf__rg_brow)(B0, B1, ldb, K0, q),
                        RG_X(kf__rg_get)(ka, A, i * am + q * aq));
    }
    V badd[KF__RG_NV]; /* the bias, widened once for the tile's rows */
    for (int u = 0; u < nv; ++u)
        badd[u] = w == nv * L && bias ? RG_X(kf__rg_vld)(kb, bias, u * L) : (V){0};
    /* with an epilogue, the tile's results are gathered here first and it runs once the
     * accumulators are dead (a call among them made the compiler spill them all: ReLU cost
     * 0.3 ns an element more than this) */
    T eb[KF__RG_MR][KF__RG_NV * L];
    for (int i = 0; i < mr; ++i)
        for (int u = 0; u < nv; ++u) {
            const int64_t d = i * ldc + u * L; /* C's element */
            if (w == nv * L) {
                const V add = bias || !acc ? badd[u] : RG_X(kf__rg_vld)(kc, C, d);
                const V res = RG_X(kf__fma)(c[i][u], RG_X(kf__splat)(alpha), add);
                if (epi) memcpy(&eb[i][u * L], &res, sizeof res);
                else RG_X(kf__rg_vst)(kc, C, d, res);
                continue;
            }
            /* a partial panel's w columns, through arrays of lanes (subscripting the vectors
             * themselves would keep them in memory through the K loop) */
            T ad[L];
            for (int l = 0; l < L; ++l)
                ad[l] = l >= w ? 0
                        : bias ? RG_X(kf__rg_get)(kb, bias, l)
                        : acc  ? RG_X(kf__rg_get)(kc, C, d + l)
                               : 0;
            V add;
            memcpy(&add, ad, sizeof add);
            const V res = RG_X(kf__fma)(c[i][u], RG_X(kf__splat)(alpha), add);
            memcpy(&eb[i][u * L], &res, sizeof res);
            if (!epi)
                for (int l = 0; l < w; ++l) RG_X(kf__rg_put)(kc, C, d + l, eb[i][u * L + l]);
        }
    if (!epi) return;
    const int n = w == nv * L ? nv * L : w; /* a row's columns */
    /* C's flat index in the output, from the epilogue's origin */
    const int64_t c0 = ((const char *)C - (const char *)epi->origin) / kf__rg_size(kc);
    for (int i = 0; i < mr; ++i) {
        const int64_t ix = c0 + i * ldc;
        if (epi->pre)
            for (int l = 0; l < n; ++l) RG_X(kf__rg_put)(kc, epi->pre, ix + l, eb[i][l]);
        RG_X(kf__rg_epi)(epi, eb[i], n, ix);
        for (int l = 0; l < n; ++l) RG_X(kf__rg_put)(kc, C, i * ldc + l, eb[i][l]);
    }
}

/* Rows [0, M) of one panel of nv vectors (w columns), kf__rg_mr(ka) at a time; the last tile's
 * rows a constant (a case per height below the kind's). */
KF__RG_INLINE void RG_X(kf__rg_rows)(kf__rg_kind ka, kf__rg_kind kb, kf__rg_kind kc, int nv,
                                     int w, int64_t M, int64_t K, int64_t K0, T alpha,
                                     const void *A, int64_t am, int64_t aq, const T *B0,
                                     const T *B1, int64_t ldb, const void *bias, bool acc, void *C,
                                     int64_t ldc, const kf__rg_epi *epi) {
    const int mr = kf__rg_mr(ka);
    int64_t m = 0;
    for (; m + mr <= M; m += mr)
        RG_X(kf__rg_tile)(ka, kb, kc, mr, nv, w, K, K0, alpha, kf__rg_at(ka, A, m * am), am, aq,
                          B0, B1, ldb, bias, acc, kf__rg_atw(kc, C, m * ldc), ldc, epi);
    const void *a_ = kf__rg_at(ka, A, m * am);
    void *cm = kf__rg_atw(kc, C, m * ldc);
#define KF__RG_CASE(r)                                                                             \
    case r:                                                                                        \
        if (r < mr)                                                                                \
            RG_X(kf__rg_tile)(ka, kb, kc, r, nv, w, K, K0, alpha, a_, am, aq, B0, B1, ldb, bias,   \
                              acc, cm, ldc, epi);                                                  \
        break;
    switch (M - m) { /* < mr */
        KF__RG_CASE(7) KF__RG_CASE(6) KF__RG_CASE(5) KF__RG_CASE(4) KF__RG_CASE(3) KF__RG_CASE(2)
        KF__RG_CASE(1)
    default: break;
    }
#undef KF__RG_CASE
}

/* One panel of nv vectors of columns, of which the first w are C's: all (w = nv L), or in a
 * partial panel (nv = 1) the last n mod L of C's columns. Where several row tiles read B's rows
 * and these lie KF__RG_FAR_BYTES or more apart, B goes by chunks of KF__RG_KC rows, each copied
 * first into a contiguous buffer that every tile then reads from L1: rows far apart make every
 * load of a tile a new cache line, and a power of two apart they all fall in one cache set
 * (SKLinear's U1, S2 and dy rows are `out` elements apart: 2^13 floats at in = out = 8192). The
 * first chunk adds bias | C | 0 as asked, the later ones the C that the earlier ones wrote. Rows
 * close together are read in place (the copy would cost more than it saves: in=out=1024, B=1024,
 * 1 thread, fwd+bwd 1.29x slower with it), except a low B's, which always go through the chunk,
 * widened there, and a partial panel's, whose chunk holds its w columns and zeros after them (the
 * tiles then run on whole vectors, and the epilogue writes w columns of C). */
KF__RG_INLINE void RG_X(kf__rg_panel)(kf__rg_kind ka, kf__rg_kind kb, kf__rg_kind kc, int nv,
                                      int w, int64_t M, int64_t K, int64_t K0, T alpha,
                                      const void *A, int64_t am, int64_t aq, const void *B0,
                                      const void *B1, int64_t ldb, const void *bias, bool acc,
                                      void *C, int64_t ldc, const kf__rg_epi *epi) {
    enum { L = RG_L };
    if (kf__rg_native(kb) && w == nv * L &&
        (M <= kf__rg_mr(ka) || ldb * kf__rg_size(kb) < KF__RG_FAR_BYTES)) {
        RG_X(kf__rg_rows)(ka, kb, kc, nv, w, M, K, K0, alpha, A, am, aq, (const T *)B0,
                          (const T *)B1, ldb, bias, acc, C, ldc, epi);
        return;
    }
    V pk[KF__RG_KC * KF__RG_NV] __attribute__((aligned(KF__V_BYTES)));
    for (int64_t q0 = 0; q0 < K; q0 += KF__RG_KC) {
        const int64_t nq = K - q0 < KF__RG_KC ? K - q0 : KF__RG_KC; /* the chunk's rows */
        for (int64_t q = 0; q < nq; ++q) {
            const int64_t row = q0 + q < K0 ? (q0 + q) * ldb : (q0 + q - K0) * ldb;
            const void *bq = q0 + q < K0 ? B0 : B1; /* B's row: element `row` of bq */
            if (w < nv * L) {
                T t[L];
                for (int l = 0; l < L; ++l) t[l] = l < w ? RG_X(kf__rg_get)(kb, bq, row + l) : 0;
                memcpy(&pk[q], t, sizeof t);
                continue;
            }
            for (int u = 0; u < nv; ++u) pk[q * nv + u] = RG_X(kf__rg_vld)(kb, bq, row + u * L);
        }
        const T *bp = (const T *)pk;
        RG_X(kf__rg_rows)(ka, kb, kc, nv, w, M, nq, nq, alpha, kf__rg_at(ka, A, q0 * aq), am, aq,
                          bp, bp, nv * L, q0 ? NULL : bias, q0 ? true : acc, C, ldc,
                          q0 + nq < K ? NULL : epi);
    }
}

/* cpu/rowgemm.h's contract, A of kind ka, B and the bias of kind kb, C of kind kc; K0 <= K (B1
 * unused where K0 = K). Panels of NV vectors, then one of a single vector, then a partial one.
 * epi: NULL, or the epilogue. */
KF__RG_INLINE void RG_X(kf__rg_gemm)(kf__rg_kind ka, kf__rg_kind kb, kf__rg_kind kc, int64_t M,
                                     int64_t n, int64_t K, int64_t K0, T alpha, const void *A,
                                     int64_t am, int64_t aq, const void *B0, const void *B1,
                                     int64_t ldb, const void *bias, bool acc, void *C, int64_t ldc,
                                     const kf__rg_epi *epi) {
    enum { L = RG_L };
    int64_t j = 0;
    for (; j + KF__RG_NV * L <= n; j += KF__RG_NV * L)
        RG_X(kf__rg_panel)(ka, kb, kc, KF__RG_NV, KF__RG_NV * L, M, K, K0, alpha, A, am, aq,
                           kf__rg_at(kb, B0, j), kf__rg_at(kb, B1, j), ldb,
                           bias ? kf__rg_at(kb, bias, j) : NULL, acc, kf__rg_atw(kc, C, j), ldc,
                           epi);
    for (; j < n; j += L)
        RG_X(kf__rg_panel)(ka, kb, kc, 1, n - j < L ? (int)(n - j) : L, M, K, K0, alpha, A, am,
                           aq, kf__rg_at(kb, B0, j), kf__rg_at(kb, B1, j), ldb,
                           bias ? kf__rg_at(kb, bias, j) : NULL, acc, kf__rg_atw(kc, C, j), ldc,
                           epi);
}

#undef KF__RG_STEP
#undef RG_L
