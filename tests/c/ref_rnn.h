/* Independent reference for kfuse's recurrent layers (GRU with torch.nn.GRU semantics, A-GRU), for
 * the C tests. Not linked into the library and shares no code with it: a plain per-step
 * transcription of the equations of DESIGN.md, forward and a hand-written backward (BPTT).
 *
 * Every function exists twice, with the same code: *_f64 (the float64 reference every op is
 * compared with) and *_f32 (the same algorithm in float32: DESIGN.md's long-sequence rule bounds
 * the library's error by 4x this run's error against float64).
 *
 * Layouts follow kfuse.h exactly:
 *  x  [T, B, I]      ([B, T, I] when cfg.batch_first)
 *  y  [T, B, D*H]    ([B, T, D*H] when cfg.batch_first), forward direction's half first
 *  h0, hn, dh0, dhn  [L*D, B, H], index l*D + d
 *  weights           kfuse's canonical order (ref_rnn_weight_desc() gives names and shapes)
 * Semantics: dropout after every layer but the last when cfg.training and cfg.dropout > 0, with the
 * counter formula of core/rnn_backend.h (mask function from common/counter_rng.h); variable
 * lengths as torch's packed sequences (t >= len[b]: state unchanged, y = 0; the reverse direction
 * starts at len[b]-1). NULL h0 = zeros; NULL lengths = all T.
 *
 * Besides the reference, a few helpers the tests share: a seeded PRNG, relative errors. */
#ifndef KF_TESTS_REF_RNN_H
#define KF_TESTS_REF_RNN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { REF_GRU = 1, REF_AGRU = 2 }; /* same values as kf_rnn_cell */

typedef struct ref_rnn_cfg {
    int cell;           /* REF_GRU or REF_AGRU */
    int L;              /* layers >= 1 */
    int D;              /* directions: 1, or 2 (GRU only) */
    int64_t I, H;       /* input and hidden size */
    int64_t T, B;       /* steps and batch */
    int batch_first;    /* x and y are [B, T, .] */
    int training;       /* dropout is applied iff training && dropout > 0 */
    float dropout;      /* p, exactly as the library's descriptor holds it */
    float gamma;        /* A-GRU: A = W_h - W_h^T - gamma I */
    uint64_t seed;      /* dropout key */
    uint64_t offset;    /* dropout counter offset */
} ref_rnn_cfg;

/* Weights per (layer, direction) group: 4 for a GRU, 10 for an A-GRU; and in total. */
int ref_rnn_group_size(const ref_rnn_cfg *c);
int ref_rnn_num_weights(const ref_rnn_cfg *c);
/* Reference state_dict name (written to `name`, `name_len` bytes), rank and shape of weight
 * `index` in kfuse's canonical order; returns its number of elements. `name` may be NULL. */
int64_t ref_rnn_weight_desc(const ref_rnn_cfg *c, int index, char *name, size_t name_len,
                            int *ndim, int64_t shape[2]);
/* Input width of layer l (I, then D*H). */
int64_t ref_rnn_layer_input(const ref_rnn_cfg *c, int l);

/* Forward over the whole sequence. `y` is required; `hn` may be NULL. */
void ref_rnn_forward_f64(const ref_rnn_cfg *c, const double *x, const double *h0,
                         const double *const *w, const int32_t *lengths, double *y, double *hn);
void ref_rnn_forward_f32(const ref_rnn_cfg *c, const float *x, const float *h0,
                         const float *const *w, const int32_t *lengths, float *y, float *hn);

/* Backward of the same forward: from dy (NULL = 0) and dhn (NULL = 0) to dx, dh0 and dw. Each
 * output may be NULL (not wanted); `dw` may be NULL, or an array of ref_rnn_num_weights()
 * pointers each of which may be NULL. Every output is overwritten (never accumulated). */
void ref_rnn_backward_f64(const ref_rnn_cfg *c, const double *x, const double *h0,
                          const double *const *w, const int32_t *lengths, const double *dy,
                          const double *dhn, double *dx, double *dh0, double *const *dw);
void ref_rnn_backward_f32(const ref_rnn_cfg *c, const float *x, const float *h0,
                          const float *const *w, const int32_t *lengths, const float *dy,
                          const float *dhn, float *dx, float *dh0, float *const *dw);

/* Element counts of x/dx, y/dy and h0/hn/dh0/dhn. */
int64_t ref_rnn_x_numel(const ref_rnn_cfg *c);
int64_t ref_rnn_y_numel(const ref_rnn_cfg *c);
int64_t ref_rnn_h_numel(const ref_rnn_cfg *c);

/* ---- shared test helpers ------------------------------------------------------------------ */
/* SplitMix64-based PRNG (independent of the library's counter RNG), seeded explicitly. */
typedef struct ref_rng { uint64_t s; } ref_rng;
void ref_rng_seed(ref_rng *r, uint64_t seed);
uint64_t ref_rng_next(ref_rng *r);
double ref_rng_uniform(ref_rng *r, double lo, double hi); /* [lo, hi) */
/* Fills n floats U(lo, hi) never exactly zero. */
void ref_fill_uniform_f32(ref_rng *r, float *p, int64_t n, double lo, double hi);
/* n new doubles (malloc) U(-bound, bound); n new doubles all NaN (poisoned outputs). */
double *ref_new_uniform_f64(ref_rng *r, int64_t n, double bound);
double *ref_new_nans_f64(int64_t n);

/* ||a - b|| / ||b|| in float64 over n elements (a float, b double). Returns INFINITY when any
 * a is not finite, and ||a - b|| when ||b|| = 0 (so two exact zeros give 0). */
double ref_rel_err_f32(const float *a, const double *b, int64_t n);
/* Same with a float64 `a`. */
double ref_rel_err_f64(const double *a, const double *b, int64_t n);

/* float -> newly malloc'ed double copy (NULL stays NULL), and back. */
double *ref_to_f64(const float *p, int64_t n);

#ifdef __cplusplus
}
#endif

#endif /* KF_TESTS_REF_RNN_H */
