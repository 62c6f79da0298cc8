/*
 * kfuse.h: the one public header of kfuse, the stable C ABI.
 *
 * kfuse is a library of fused CPU and CUDA kernels for structured neural layers: GRU and A-GRU,
 * SKLinear (Panther's sketched linear layer), KANLinear and KANConv2d (efficient-kan). This header is valid C99 and C++ and includes no CUDA
 * header: a CUDA stream is passed as `void *` (a cudaStream_t).
 *
 * Conventions, stated once (they hold for every function unless its comment says otherwise):
 *  - Every function returns a kf_status; KF_OK (0) is success. On failure nothing visible to the
 *    caller was written (outputs, out-parameters), and kf_last_error_message() names the call,
 *    the argument, what was expected and what was received.
 *  - No pointer may be NULL unless its comment says so. Sizes in bytes end in `_bytes`; every
 *    other count is in elements. Dimension letters: T steps, B batch, I input size, H hidden size,
 *    L layers, D directions (1 or 2). Tensors are row-major, last dimension fastest.
 *  - Tensor data lives on the device of the context the call runs on (host memory for a CPU
 *    context, device memory for a CUDA context).
 *  - Work on a CUDA context is enqueued on the context's stream and is asynchronous: a call
 *    returning KF_OK means the work was enqueued. Errors of validation are reported at once.
 *  - A context, and every plan made from it, is used by one thread at a time. Separate contexts
 *    are independent and may be used concurrently from different threads.
 *  - The library never aborts, exits or prints, and holds no global mutable state except the
 *    thread-local error message.
 *  - Descriptor and argument structs begin with `size_t struct_size`; always fill them with the
 *    matching *_init() function first, which writes the defaults and struct_size. Fields are only
 *    ever appended, so a program built against an older header keeps working.
 *
 * ABI policy (docs/abi.md): within one KF_ABI_VERSION, exported functions and struct layouts never
 * change or disappear; additions bump KF_VERSION_MINOR. The shared library's SONAME is
 * libkfuse.so.<KF_ABI_VERSION>.
 */
#ifndef KFUSE_H
#define KFUSE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- export macro ---------------------------------------------------------------------- */
#if defined(_WIN32)
#  if defined(KF_BUILDING_LIBRARY)
#    define KF_API __declspec(dllexport)
#  else
#    define KF_API
#  endif
#elif defined(__GNUC__) || defined(__clang__)
#  define KF_API __attribute__((visibility("default")))
#else
#  define KF_API
#endif

/* ---- version (the build reads these three lines to form the SONAME and package version) - */
/* The version of this header: MAJOR (the ABI generation), MINOR (bumped by additions), PATCH
 * (fixes). */
#define KF_VERSION_MAJOR 1
#define KF_VERSION_MINOR 9
#define KF_VERSION_PATCH 0
/* The ABI generation; equals KF_VERSION_MAJOR. */
#define KF_ABI_VERSION KF_VERSION_MAJOR
/* MAJOR*10000 + MINOR*100 + PATCH, as kf_version() returns it. */
#define KF_VERSION_NUMBER (KF_VERSION_MAJOR * 10000 + KF_VERSION_MINOR * 100 + KF_VERSION_PATCH)

/* The version of the library loaded at run time, as KF_VERSION_NUMBER. Since 1.0. */
KF_API uint32_t kf_version(void);
/* "1.0.0"-style static string of the loaded library's version. Never NULL. Since 1.0. */
KF_API const char *kf_version_string(void);

/* ---- status ---------------------------------------------------------------------------- */
/* Values are fixed forever; new codes are appended. */
typedef enum kf_status {
    KF_OK = 0,                      /* success */
    KF_ERR_INVALID_ARGUMENT = 1,    /* NULL, bad size, shape/dtype mismatch, unknown flag, ... */
    KF_ERR_UNSUPPORTED = 2,         /* valid request this build or backend does not implement */
    KF_ERR_OUT_OF_MEMORY = 3,       /* host or device allocation failed */
    KF_ERR_WORKSPACE_TOO_SMALL = 4, /* caller workspace/reserve, a fixed arena, or an arena that
                                       would grow during a CUDA graph capture: too small */
    KF_ERR_BACKEND_UNAVAILABLE = 5, /* e.g. CUDA asked for in a CPU-only build or without driver */
    KF_ERR_DEVICE = 6,              /* a CUDA / cuBLAS call failed (message has its error text) */
    KF_ERR_INTERNAL = 7             /* a bug in kfuse; please report it with the message */
} kf_status;

/* Static name and meaning of a status, e.g. "KF_ERR_INVALID_ARGUMENT: invalid argument". Never
 * NULL, also for unknown values. Does not change the thread's last error message. Since 1.0. */
KF_API const char *kf_status_string(kf_status status);

/* Detail of the latest failure on the calling thread, e.g.
 * "kf_rnn_forward: args->x.shape[2] = 64, expected 128 (input_size)". A successful call clears it
 * to "". The string is owned by the library and valid until the next kfuse call on this thread.
 * Never NULL. Does not itself change the message. Since 1.0. */
KF_API const char *kf_last_error_message(void);

/* ---- tensors --------------------------------------------------------------------------- */
/* The most dimensions a kf_tensor has. */
#define KF_MAX_DIMS 6
/* The alignment, in bytes, of every workspace and reserve a caller passes (and of the arena's
 * memory). Since 1.3. */
#define KF_ALIGN_BYTES 64

/* Element types. KF_DTYPE_F16 and KF_DTYPE_BF16 are storage types (every op on the CPU backend
 * since 1.5, on the CUDA backend since 1.6): a plan's tensors are in the type, its arithmetic
 * (products, reductions, gates, the recurrent state) is float32, results are rounded to nearest
 * even (NaN stays NaN), and an accumulated gradient is round(g_old + g) with the sum in float32.
 * On CUDA the KAN layers (since 1.7), SKLinear (since 1.7.1) and the recurrent layers' input-side
 * products where H is not 64, 96 or 128 (since 1.7.2) run on the tensor cores, so a product's
 * operands are in the type too (the KAN bases and combined weight, SKLinear's bottleneck, each
 * recurrent layer's output and gate gradients: rounded as torch's own low-precision layers round
 * them). Their workspace queries include float32 copies of the call's tensors where a backend
 * converts them (the low-type operands where it does not); the recurrent reserves hold float32
 * states and gates. */
typedef enum kf_dtype {
    KF_DTYPE_F32 = 1, /* IEEE binary32: the only dtype of 1.0's ops */
    KF_DTYPE_F64 = 2, /* IEEE binary64: every op on the CPU backend since 1.4 */
    KF_DTYPE_F16 = 3, /* IEEE binary16 storage (CPU since 1.5, CUDA since 1.6) */
    KF_DTYPE_BF16 = 4, /* bfloat16 storage (CPU since 1.5, CUDA since 1.6) */
    KF_DTYPE_I32 = 5, /* sequence lengths */
    KF_DTYPE_I64 = 6  /* 64-bit integers; no op of this version takes them */
} kf_dtype;

/* A plain view of memory, shaped like DLPack's DLTensor. The library never frees `data`. A tensor
 * whose `data` is NULL is "absent"; only arguments documented as optional may be absent. */
typedef struct kf_tensor {
    void *data;                   /* first element; on the context's device; aligned to its dtype */
    int32_t dtype;                /* a kf_dtype */
    int32_t ndim;                 /* 0..KF_MAX_DIMS */
    int64_t shape[KF_MAX_DIMS];   /* elements per dimension; entries past ndim are ignored */
    int64_t strides[KF_MAX_DIMS]; /* in elements, not bytes; 1.0's ops need row-major contiguous */
} kf_tensor;

/* Fills `t` as a contiguous row-major view of `data` with `ndim` dims of `shape`. `data` may be
 * NULL (an absent tensor). Returns KF_ERR_INVALID_ARGUMENT for ndim outside 0..KF_MAX_DIMS or a
 * negative extent. Since 1.0. */
KF_API kf_status kf_tensor_init(kf_tensor *t, void *data, kf_dtype dtype, int32_t ndim,
                                const int64_t *shape);

/* ---- context --------------------------------------------------------------------------- */
/* Opaque handle: device, stream, BLAS handle and arena (kf_context_create()). */
typedef struct kf_context kf_context;

/* Where a context's work and memory are. */
typedef enum kf_device_type {
    KF_DEVICE_CPU = 1, /* host memory, CPU threads */
    KF_DEVICE_CUDA = 2 /* a CUDA device's memory and stream */
} kf_device_type;

/* Context flags. */
#define KF_CONTEXT_FIXED_ARENA 1u /* never grow the arena: a call needing more fails with
                                     KF_ERR_WORKSPACE_TOO_SMALL instead of allocating */

/* What kf_context_create() makes; kf_context_desc_init() writes the defaults. */
typedef struct kf_context_desc {
    size_t struct_size;  /* sizeof(kf_context_desc) as the caller compiled it */
    int32_t device_type; /* a kf_device_type; default KF_DEVICE_CPU */
    int32_t device_index;/* CUDA device ordinal; default 0; must be 0 for the CPU */
    int32_t num_threads; /* CPU threads a call may use, 1..4096; 0 (default) = the CPUs this
                            process may use when the context is created: the smallest of
                            omp_get_max_threads() (OMP_NUM_THREADS), the CPUs of its affinity
                            mask (sched_getaffinity) and, where a cgroup v2 CPU quota is set
                            (/sys/fs/cgroup/cpu.max), that quota rounded up; at least 1 */
    uint32_t flags;      /* KF_CONTEXT_*; unknown bits are rejected */
    size_t arena_bytes;  /* arena allocated at creation; default 0 (grown on first need) */
    /* appended in later versions below this line; never reorder or remove */
} kf_context_desc;

/* Writes the defaults and struct_size into `desc`. Since 1.0. */
KF_API void kf_context_desc_init(kf_context_desc *desc);

/* Creates a context: device, stream (the CUDA default stream until set), BLAS handle, arena.
 * A CPU context picks here, once, the instruction set of its recurrent and (since 1.7.5)
 * sketched-linear kernels: x86-64-v4 (AVX-512) where the library was built with them and the CPU
 * runs them, else the build's baseline (x86-64-v3: AVX2+FMA). The environment variable
 * KF_CPU_ISA (since 1.4) overrides:
 * "avx2" the baseline, "avx512" x86-64-v4 (KF_ERR_UNSUPPORTED where it cannot run); any other
 * non-empty value is KF_ERR_INVALID_ARGUMENT. Results agree within float32 rounding either way.
 * @return KF_OK and *out set; KF_ERR_BACKEND_UNAVAILABLE for CUDA in a CPU-only build or with no
 * usable driver/device; KF_ERR_OUT_OF_MEMORY; KF_ERR_INVALID_ARGUMENT; KF_ERR_UNSUPPORTED.
 * *out is NULL on failure. Since 1.0. */
KF_API kf_status kf_context_create(const kf_context_desc *desc, kf_context **out);

/* Destroys a context. Accepts NULL. Every plan made from it must be destroyed first. On CUDA it
 * waits for the context's stream before freeing the arena. Since 1.0. */
KF_API void kf_context_destroy(kf_context *ctx);

/* The kf_device_type of the context. Since 1.0. */
KF_API kf_status kf_context_device_type(const kf_context *ctx, int32_t *device_type);

/* Sets the CUDA stream (a cudaStream_t; NULL = the legacy default stream) that later calls
 * enqueue on. Since 1.5, work on the new stream is ordered after the work already queued on the
 * old one (it may use the arena), unless either stream is capturing a CUDA graph. No wait.
 * KF_ERR_INVALID_ARGUMENT on a CPU context unless `stream` is NULL. Since 1.0. */
KF_API kf_status kf_context_set_stream(kf_context *ctx, void *stream);

/* The stream calls enqueue on (NULL on a CPU context). Since 1.0. */
KF_API kf_status kf_context_get_stream(const kf_context *ctx, void **stream);

/* Grows the arena to at least `bytes` now, so later calls needing up to that much never
 * allocate (also under KF_CONTEXT_FIXED_ARENA). Never shrinks it. On CUDA the growth is ordered on
 * the context's stream (since 1.5: no wait; the smaller block is freed once the work queued
 * before it is done), and refused with KF_ERR_WORKSPACE_TOO_SMALL while that stream captures a
 * CUDA graph: reserve before capturing. A call that would grow the arena during a capture is
 * refused the same way, before anything is enqueued. Since 1.0. */
KF_API kf_status kf_context_reserve(kf_context *ctx, size_t bytes);

/* Bytes the arena holds now, and how many times it has been (re)allocated since creation: a
 * steady-state loop of calls leaves `grow_count` unchanged. Either pointer may be NULL. Since 1.0. */
KF_API kf_status kf_context_arena_info(const kf_context *ctx, size_t *arena_bytes,
                                       uint64_t *grow_count);

/* Waits until all work enqueued on the context's stream has finished (no-op on the CPU), and
 * reports a CUDA error raised by that work as KF_ERR_DEVICE. Since 1.0. */
KF_API kf_status kf_context_synchronize(kf_context *ctx);

/* ---- calls: modes and gradients -------------------------------------------------------- */
/* Whether a forward call trains (writes the reserve backward reads) or only infers. */
typedef enum kf_mode {
    KF_MODE_INFERENCE = 1, /* no reserve written, no dropout */
    KF_MODE_TRAINING = 2   /* forward writes the reserve that backward reads; dropout applied */
} kf_mode;

/* Whether a backward call overwrites or accumulates into the weight-gradient buffers. */
typedef enum kf_grad_mode {
    KF_GRAD_OVERWRITE = 1,  /* weight gradients are written */
    KF_GRAD_ACCUMULATE = 2  /* weight gradients are added to what the buffers hold */
} kf_grad_mode;

/* ---- recurrent layers: GRU and A-GRU --------------------------------------------------- */
/*
 * One plan describes a stack of L recurrent layers whose cell is a GRU (torch.nn.GRU semantics)
 * or an A-GRU (antisymmetric GRU; math in docs/ops/rnn.md). A whole sequence runs in one call. Dropout (probability p) is applied to the output of every layer except the last, in
 * KF_MODE_TRAINING only, with a counter-based generator keyed by (seed, offset) that every backend
 * reproduces bit for bit; kept elements are scaled by 1/(1-p).
 *
 * Weights are passed in the reference layouts, as an array of tensors in a canonical order that
 * kf_rnn_weight_info() describes (index, name, shape):
 *  GRU, per layer l then direction d (suffix "" or "_reverse"), like torch's _flat_weights:
 *    weight_ih_l{l}{sfx} [3H, I_l], weight_hh_l{l}{sfx} [3H, H], bias_ih_l{l}{sfx} [3H],
 *    bias_hh_l{l}{sfx} [3H]      (I_0 = I, I_l = D*H; gate rows in the order r, z, n)
 *  A-GRU, per layer l (no bidirectional form):
 *    cells.{l}.W_z.weight [H, I_l], cells.{l}.W_z.bias [H], cells.{l}.U_z.weight [H, H],
 *    cells.{l}.W_r.weight [H, I_l], cells.{l}.W_r.bias [H], cells.{l}.U_r.weight [H, H],
 *    cells.{l}.V_h.weight [H, I_l], cells.{l}.V_h.bias [H], cells.{l}.W_h [H, H],
 *    cells.{l}.epsilon [1]       (I_0 = I, I_l = H)
 */
typedef struct kf_rnn_plan kf_rnn_plan;

/* The cell of a recurrent plan. */
typedef enum kf_rnn_cell {
    KF_RNN_GRU = 1, /* torch.nn.GRU's cell (gates r, z, n) */
    KF_RNN_AGRU = 2 /* the antisymmetric GRU cell (docs/ops/rnn.md) */
} kf_rnn_cell;

#define KF_RNN_BATCH_FIRST 1u   /* x, y are [B, T, .] instead of [T, B, .] */
#define KF_RNN_BIDIRECTIONAL 2u /* GRU only: D = 2, y is [T, B, 2H] (forward half first) */

/* A recurrent plan's layer stack; kf_rnn_desc_init() writes the defaults. */
typedef struct kf_rnn_desc {
    size_t struct_size;  /* sizeof(kf_rnn_desc) as the caller compiled it */
    int32_t cell;        /* a kf_rnn_cell; default KF_RNN_GRU */
    int32_t num_layers;  /* L >= 1; default 1 */
    int64_t input_size;  /* I >= 1; no default (0) */
    int64_t hidden_size; /* H >= 1; no default (0) */
    uint32_t flags;      /* KF_RNN_*; default 0; unknown bits are rejected */
    float dropout;       /* in [0, 1); default 0 */
    float gamma;         /* A-GRU diffusion constant in A = W_h - W_h^T - gamma I; default 0.01 */
    int32_t dtype;       /* kf_dtype of x, y, h and weights: KF_DTYPE_F32 (default), or
                            KF_DTYPE_F64 (since 1.4; on CUDA since 1.7), KF_DTYPE_F16 or
                            KF_DTYPE_BF16 (since 1.5; on CUDA since 1.6). dropout and gamma stay
                            float whatever the dtype */
    /* appended in later versions below this line; never reorder or remove */
} kf_rnn_desc;

/* Writes the defaults and struct_size into `desc`. Since 1.0. */
KF_API void kf_rnn_desc_init(kf_rnn_desc *desc);

/* Creates a plan bound to `ctx` (which must outlive it). Checks the descriptor; makes no
 * per-shape decision that a call could not revise. @return KF_OK and *out, KF_ERR_INVALID_ARGUMENT
 * (message names the field), KF_ERR_UNSUPPORTED (e.g. A-GRU with KF_RNN_BIDIRECTIONAL),
 * KF_ERR_OUT_OF_MEMORY. On failure *out is set to NULL (when `out` itself is not NULL).
 * Since 1.0. */
KF_API kf_status kf_rnn_plan_create(kf_context *ctx, const kf_rnn_desc *desc, kf_rnn_plan **out);

/* Destroys a plan. Accepts NULL. Since 1.0. */
KF_API void kf_rnn_plan_destroy(kf_rnn_plan *plan);

/* Number of weight tensors a call takes (L*D*4 for a GRU, L*10 for an A-GRU). Since 1.0. */
KF_API kf_status kf_rnn_weight_count(const kf_rnn_plan *plan, int32_t *count);

/* Name (reference state_dict key, static storage owned by the plan, valid while it lives), rank
 * and shape of weight `index` in the canonical order. `name`, `ndim`, `shape` may each be NULL;
 * `shape` has room for KF_MAX_DIMS entries. Since 1.0. */
KF_API kf_status kf_rnn_weight_info(const kf_rnn_plan *plan, int32_t index, const char **name,
                                    int32_t *ndim, int64_t *shape);

/* The shapes of the outputs of T steps of B samples: y_shape[3] = [T, B, D*H] ([B, T, D*H] with
 * KF_RNN_BATCH_FIRST) and hn_shape[3] = [L*D, B, H]. Either may be NULL. @return KF_OK, or
 * KF_ERR_INVALID_ARGUMENT (NULL plan; T or B outside 1..2^31-1, or too large to address).
 * Since 1.3. */
KF_API kf_status kf_rnn_output_shapes(const kf_rnn_plan *plan, int64_t T, int64_t B,
                                      int64_t *y_shape, int64_t *hn_shape);

/* Bytes of scratch workspace that kf_rnn_forward() (in `mode`) and kf_rnn_backward() need for T
 * steps of B samples, and bytes of reserve that a KF_MODE_TRAINING forward writes and backward
 * reads (0 in KF_MODE_INFERENCE). `workspace_bytes` covers both calls. Either pointer may be NULL.
 * Pure: no allocation, no device work. Sizes are not monotonic in T and B: query per shape.
 * Since 1.0. */
KF_API kf_status kf_rnn_workspace_size(const kf_rnn_plan *plan, int64_t T, int64_t B, kf_mode mode,
                                       size_t *workspace_bytes, size_t *reserve_bytes);

/* The tensors of kf_rnn_forward(); kf_rnn_forward_args_init() writes the defaults. */
typedef struct kf_rnn_forward_args {
    size_t struct_size;     /* sizeof(kf_rnn_forward_args) as the caller compiled it */
    kf_tensor x;            /* [T, B, I] ([B, T, I] with KF_RNN_BATCH_FIRST) */
    kf_tensor h0;           /* optional [L*D, B, H]; absent = zeros */
    const kf_tensor *weights; /* array of num_weights tensors, canonical order */
    int32_t num_weights;    /* kf_rnn_weight_count() */
    int32_t reserved0;      /* must be 0 */
    kf_tensor lengths;      /* optional [B] KF_DTYPE_I32 in 0..T, on the context's device: steps
                               past lengths[b] leave h unchanged and write y = 0 there; the
                               reverse direction starts at lengths[b]-1. Absent = all T. A CPU
                               context refuses a length outside 0..T; a CUDA one cannot read
                               device memory at the call, so its kernels clamp it to 0..T. */
    uint64_t dropout_seed;  /* key of the dropout masks (training with dropout > 0 only) */
    uint64_t dropout_offset;/* counter offset, so successive calls can draw fresh masks */
    kf_tensor y;            /* out [T, B, D*H] ([B, T, D*H] batch-first): last layer, every step */
    kf_tensor hn;           /* optional out [L*D, B, H]: each layer's and direction's last state */
} kf_rnn_forward_args;

/* Writes the defaults (all tensors absent, zeros) and struct_size into `args`. Since 1.0. */
KF_API void kf_rnn_forward_args_init(kf_rnn_forward_args *args);

/* Runs the stacked layer over the whole sequence. T and B are read from args->x.
 * `workspace` (`workspace_bytes` of it, on the context's device, KF_ALIGN_BYTES-aligned) may be
 * NULL with 0 bytes, in which case the context's arena serves. In KF_MODE_TRAINING `reserve`
 * (KF_ALIGN_BYTES-aligned, on the context's device) must hold the reserve_bytes that
 * kf_rnn_workspace_size() gave and must be passed unchanged to the backward call for the same
 * inputs; in KF_MODE_INFERENCE it may be NULL.
 * @return KF_OK; KF_ERR_INVALID_ARGUMENT (message names the argument); KF_ERR_WORKSPACE_TOO_SMALL;
 * KF_ERR_OUT_OF_MEMORY (arena growth); KF_ERR_DEVICE. Since 1.0. */
KF_API kf_status kf_rnn_forward(kf_rnn_plan *plan, kf_mode mode, const kf_rnn_forward_args *args,
                                void *workspace, size_t workspace_bytes, void *reserve,
                                size_t reserve_bytes);

/* The tensors of kf_rnn_backward(); kf_rnn_backward_args_init() writes the defaults. */
typedef struct kf_rnn_backward_args {
    size_t struct_size;     /* sizeof(kf_rnn_backward_args) as the caller compiled it */
    kf_tensor x;            /* the forward's x */
    kf_tensor h0;           /* the forward's h0 (optional: absent = zeros, as in forward) */
    const kf_tensor *weights; /* the forward's weights */
    int32_t num_weights;    /* the forward's */
    int32_t reserved0;      /* must be 0 */
    kf_tensor lengths;      /* the forward's lengths (optional) */
    uint64_t dropout_seed;  /* the forward's */
    uint64_t dropout_offset;/* the forward's */
    kf_tensor dy;           /* optional [T, B, D*H]: gradient of the loss w.r.t. y; absent = 0 */
    kf_tensor dhn;          /* optional [L*D, B, H]: gradient w.r.t. hn; absent = 0 */
    kf_tensor dx;           /* optional out, x's shape: always overwritten */
    kf_tensor dh0;          /* optional out [L*D, B, H]: always overwritten */
    const kf_tensor *dweights; /* optional (NULL) out array shaped like `weights`; each entry may
                                  be absent; written or accumulated per kf_grad_mode */
    int32_t num_dweights;   /* num_weights when dweights is given, else 0 */
    int32_t reserved1;      /* must be 0 */
} kf_rnn_backward_args;

/* Writes the defaults and struct_size into `args`. Since 1.0. */
KF_API void kf_rnn_backward_args_init(kf_rnn_backward_args *args);

/* Gradients of x, h0 and every weight (A-GRU: including epsilon) from the reserve that a
 * KF_MODE_TRAINING forward on the same inputs wrote. `grad_mode` applies to dweights only.
 * Workspace as for kf_rnn_forward(). Same statuses. Since 1.0. */
KF_API kf_status kf_rnn_backward(kf_rnn_plan *plan, kf_grad_mode grad_mode,
                                 const kf_rnn_backward_args *args, void *workspace,
                                 size_t workspace_bytes, const void *reserve, size_t reserve_bytes);

/* ---- sketched linear layer: SKLinear (Panther) ------------------------------------------ */
/*
 * Panther's randomized low-rank replacement of a dense Linear, with L = num_terms terms of rank
 * k = low_rank. Parameters in Panther's layout and names: learnable S1s [L, in, k] and
 * S2s [L, k, out], fixed sketch buffers U1s [L, k, out] and U2s [L, in, k], bias [out]:
 *     y = 1/(2L) * sum_i [ (x S1_i) U1_i + (x U2_i) S2_i ] + bias
 * computed as two GEMMs through the rank-2Lk bottleneck Z = x [S1_1..S1_L | U2_1..U2_L],
 * y = Z [U1_1; ..; U1_L; S2_1; ..; S2_L] / (2L) + bias, never term by term. x is [..., in] with
 * any leading dims (flattened into N >= 1 rows; bindings handle empty batches themselves), y is
 * [..., out] with the same leading dims.
 * Backward gives dx, dS1s, dS2s and dbias (U1s and U2s are fixed). No reserve: backward
 * recomputes the bottleneck from x.
 *
 * Fused epilogue (since 1.8): with desc->activation and desc->dropout = p the layer stores
 *     y = dropout(act(pre)),  pre = 1/(2L) * sum_i [...] + bias
 * in the one output store. The dropout mask is never stored: element (n, o) of y (row n of the
 * flattened leading dims, column o) is kept iff the counter-based generator the recurrent layers
 * use (keyed by args->dropout_seed) draws u >= p at counter args->dropout_offset + n * out + o,
 * the same bits on every backend; kept elements are scaled by 1/(1-p). A caller that draws a fresh
 * seed per call (the bindings do) gets fresh masks; the offset lets one seed serve several calls.
 * Dropout applies in KF_MODE_TRAINING calls only (args->mode). The backward needs the
 * pre-activation for GELU, GELU_TANH and SILU: the forward writes it to the optional args->pre,
 * and the backward reads it from its args->pre; for RELU the forward's y serves as well (pre > 0
 * exactly where a kept y > 0), so nothing more is stored; with no activation nothing is needed.
 */
typedef struct kf_sklinear_plan kf_sklinear_plan;

/* The activation of SKLinear's fused epilogue (kf_sklinear_desc.activation). Since 1.8. */
typedef enum kf_activation {
    KF_ACTIVATION_NONE = 0,      /* the identity: no activation */
    KF_ACTIVATION_RELU = 1,      /* max(v, 0) */
    KF_ACTIVATION_GELU = 2,      /* v Phi(v) = v (1 + erf(v / sqrt 2)) / 2 (torch's default) */
    KF_ACTIVATION_GELU_TANH = 3, /* v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3))) / 2 */
    KF_ACTIVATION_SILU = 4       /* v / (1 + exp(-v)) */
} kf_activation;

/* An SKLinear plan's layer; kf_sklinear_desc_init() writes the defaults. */
typedef struct kf_sklinear_desc {
    size_t struct_size;   /* sizeof(kf_sklinear_desc) as the caller compiled it */
    int64_t in_features;  /* >= 1; no default (0) */
    int64_t out_features; /* >= 1; no default (0) */
    int32_t num_terms;    /* L >= 1; no default (0) */
    int32_t low_rank;     /* k >= 1; no default (0) */
    int32_t bias;         /* 1 (default): a bias [out] is added; 0: none */
    int32_t dtype;        /* kf_dtype of every tensor: KF_DTYPE_F32 (default), or KF_DTYPE_F64
                             (since 1.3; on CUDA since 1.7), KF_DTYPE_F16 or KF_DTYPE_BF16
                             (since 1.5; on CUDA since 1.6) */
    int32_t activation;   /* kf_activation applied to s Z W2 + bias in the output store:
                             KF_ACTIVATION_NONE (default). Since 1.8 */
    float dropout;        /* probability in [0, 1) of zeroing an output element after the
                             activation, in KF_MODE_TRAINING calls only (kept ones are scaled by
                             1/(1-p)); 0 (default): none. Since 1.8 */
    /* appended in later versions below this line; never reorder or remove */
} kf_sklinear_desc;

/* Writes the defaults and struct_size into `desc`. Since 1.1. */
KF_API void kf_sklinear_desc_init(kf_sklinear_desc *desc);

/* Creates a plan bound to `ctx` (which must outlive it). @return KF_OK and *out,
 * KF_ERR_INVALID_ARGUMENT (message names the field), KF_ERR_UNSUPPORTED, KF_ERR_OUT_OF_MEMORY.
 * A layer whose 2Lk(in+out) parameters exceed in*out is allowed (see
 * kf_sklinear_param_ratio()). On failure *out is set to NULL (when `out` is not NULL).
 * Since 1.1. */
KF_API kf_status kf_sklinear_plan_create(kf_context *ctx, const kf_sklinear_desc *desc,
                                         kf_sklinear_plan **out);

/* Destroys a plan. Accepts NULL. Since 1.1. */
KF_API void kf_sklinear_plan_destroy(kf_sklinear_plan *plan);

/* 2Lk(in+out) / (in*out): the sketched layer's parameter count over the dense layer's. Above 1
 * the sketch holds more parameters than the Linear it replaces (Panther warns then). Since 1.1. */
KF_API kf_status kf_sklinear_param_ratio(const kf_sklinear_plan *plan, double *ratio);

/* The number of tensors of the layer's state (Panther's state_dict): 5, or 4 without a bias.
 * Since 1.3. */
KF_API kf_status kf_sklinear_param_count(const kf_sklinear_plan *plan, int32_t *count);

/* Name (Panther's state_dict key; static storage), rank and shape of tensor `index` in the order
 * S1s [L, in, k], S2s [L, k, out], U1s [L, k, out], U2s [L, in, k], bias [out] (when the plan has
 * one), as kf_rnn_weight_info() (`name`, `ndim`, `shape` may each be NULL; `shape` has room for
 * KF_MAX_DIMS entries). @return KF_OK, or KF_ERR_INVALID_ARGUMENT (NULL plan, index out of
 * range). Since 1.3. */
KF_API kf_status kf_sklinear_param_info(const kf_sklinear_plan *plan, int32_t index,
                                        const char **name, int32_t *ndim, int64_t *shape);

/* Bytes of scratch workspace kf_sklinear_forward() and kf_sklinear_backward() need for N rows
 * (the product of x's leading dims). Pure. Since 1.1. */
KF_API kf_status kf_sklinear_workspace_size(const kf_sklinear_plan *plan, int64_t N,
                                            size_t *workspace_bytes);

/* The tensors of kf_sklinear_forward(); kf_sklinear_forward_args_init() writes the defaults. */
typedef struct kf_sklinear_forward_args {
    size_t struct_size; /* sizeof(kf_sklinear_forward_args) as the caller compiled it */
    kf_tensor x;        /* [..., in], rank 1..KF_MAX_DIMS */
    kf_tensor S1s;      /* [L, in, k] */
    kf_tensor S2s;      /* [L, k, out] */
    kf_tensor U1s;      /* [L, k, out] */
    kf_tensor U2s;      /* [L, in, k] */
    kf_tensor bias;     /* [out]: required when the plan has a bias, absent otherwise */
    kf_tensor y;        /* out [..., out]: x's leading dims */
    /* since 1.8: the fused epilogue (header comment of this section) */
    int32_t mode;       /* kf_mode: KF_MODE_TRAINING applies the plan's dropout; 0 (default) or
                           KF_MODE_INFERENCE does not */
    int32_t reserved0;  /* must be 0 */
    uint64_t dropout_seed;   /* key of the dropout mask */
    uint64_t dropout_offset; /* counter offset of y's element 0 */
    kf_tensor pre;      /* optional out, y's shape: the pre-activation s Z W2 + bias */
} kf_sklinear_forward_args;

/* Writes the defaults (all tensors absent) and struct_size into `args`. Since 1.1. */
KF_API void kf_sklinear_forward_args_init(kf_sklinear_forward_args *args);

/* y for every row of x. Workspace as for kf_rnn_forward() (NULL with 0 bytes: the arena).
 * @return KF_OK; KF_ERR_INVALID_ARGUMENT (message names the argument);
 * KF_ERR_WORKSPACE_TOO_SMALL; KF_ERR_OUT_OF_MEMORY; KF_ERR_DEVICE. Since 1.1. */
KF_API kf_status kf_sklinear_forward(kf_sklinear_plan *plan, const kf_sklinear_forward_args *args,
                                     void *workspace, size_t workspace_bytes);

/* The tensors of kf_sklinear_backward(); kf_sklinear_backward_args_init() writes the
 * defaults. */
typedef struct kf_sklinear_backward_args {
    size_t struct_size; /* sizeof(kf_sklinear_backward_args) as the caller compiled it */
    kf_tensor x;        /* the forward's x */
    kf_tensor S1s, S2s, U1s, U2s; /* the forward's parameters */
    kf_tensor dy;       /* [..., out]: gradient of the loss w.r.t. y */
    kf_tensor dx;       /* optional out, x's shape: always overwritten */
    kf_tensor dS1s;     /* optional out [L, in, k]: written or accumulated per kf_grad_mode */
    kf_tensor dS2s;     /* optional out [L, k, out]: likewise */
    kf_tensor dbias;    /* optional out [out] (plans with a bias only): likewise */
    /* since 1.8: the fused epilogue's gradient, dy * mask / (1-p) * act'(pre) */
    int32_t mode;       /* the forward's */
    int32_t reserved0;  /* must be 0 */
    uint64_t dropout_seed;   /* the forward's */
    uint64_t dropout_offset; /* the forward's */
    kf_tensor pre;      /* dy's shape: the forward's pre-activation, required when the plan has
                           an activation (for RELU the forward's y may be passed instead) */
} kf_sklinear_backward_args;

/* Writes the defaults and struct_size into `args`. Since 1.1. */
KF_API void kf_sklinear_backward_args_init(kf_sklinear_backward_args *args);

/* Gradients of x, S1s, S2s and bias. `grad_mode` applies to dS1s, dS2s, dbias. Workspace and
 * statuses as for kf_sklinear_forward(). Since 1.1. */
KF_API kf_status kf_sklinear_backward(kf_sklinear_plan *plan, kf_grad_mode grad_mode,
                                      const kf_sklinear_backward_args *args, void *workspace,
                                      size_t workspace_bytes);

/* The seed, optional W_init and outputs of kf_sklinear_init_params();
 * kf_sklinear_init_args_init() writes the defaults. */
typedef struct kf_sklinear_init_args {
    size_t struct_size; /* sizeof(kf_sklinear_init_args) as the caller compiled it */
    uint64_t seed;      /* every draw is a pure function of (seed, element): the same on every
                           backend and thread count */
    kf_tensor W_init;   /* optional [out, in] (a Linear's weight); absent = Kaiming-uniform
                           W [in, out] with bound 1/sqrt(out), as Panther draws it */
    kf_tensor S1s, S2s, U1s, U2s; /* out: shapes as in kf_sklinear_forward_args */
    kf_tensor bias;     /* out [out], required when the plan has a bias (absent otherwise):
                           U(-1/sqrt(out), 1/sqrt(out)) */
} kf_sklinear_init_args;

/* Writes the defaults and struct_size into `args`. Since 1.1. */
KF_API void kf_sklinear_init_args_init(kf_sklinear_init_args *args);

/* Panther's initialisation: U1s[i] = scaled sign sketch [k, out] and U2s[i] = (sign sketch
 * [k, in])^T, entries +-1/sqrt(k); S1s[i] = W U1s[i]^T, S2s[i] = U2s[i]^T W with W = W_init^T
 * or drawn. A bfloat16 or float16 plan gets the float32 values rounded to its type (since 1.5).
 * Not a hot path: it synchronises with the context's stream and may allocate host memory.
 * Since 1.1. */
KF_API kf_status kf_sklinear_init_params(kf_sklinear_plan *plan,
                                         const kf_sklinear_init_args *args);

/* ---- KAN layers: KANLinear (efficient-kan) ----------------------------------------------- */
/*
 * efficient-kan's KANLinear with G = grid_size, k = spline_order, C = G + k coefficients per
 * (output, input) pair. Parameters in its layout and names: base_weight [out, in],
 * spline_weight [out, in, C], spline_scaler [out, in] (standalone_scale only), and the
 * per-feature knot vectors grid [in, G + 2k + 1] (non-decreasing; uniform on grid_range and
 * extended by k knots each side until a grid update makes them non-uniform):
 *     y = SiLU(x) base_weight^T + B(x) (spline_weight * spline_scaler[..., None])^T
 * where B(x) [N, in*C] holds the Cox-de Boor B-spline bases of order k of every feature on its
 * own knots (zero outside the grid; a term whose knot interval has zero width counts as 0, where
 * the reference divides 0 by 0). x is [..., in] with any leading dims (flattened into N >= 1
 * rows), y is [..., out]. The bases are computed inside the product and never stored for the
 * whole batch. Backward gives dx (through SiLU' and dB/dx), d base_weight, d spline_weight and
 * d spline_scaler; the grid gets no gradient.
 */
typedef struct kf_kan_linear_plan kf_kan_linear_plan;

/* A KANLinear plan's layer; kf_kan_linear_desc_init() writes the defaults. */
typedef struct kf_kan_linear_desc {
    size_t struct_size;       /* sizeof(kf_kan_linear_desc) as the caller compiled it */
    int64_t in_features;      /* >= 1; no default (0) */
    int64_t out_features;     /* >= 1; no default (0) */
    int32_t grid_size;        /* G >= 1; default 5 */
    int32_t spline_order;     /* k >= 0; default 3 */
    int32_t standalone_scale; /* 1 (default): spline_scaler multiplies spline_weight; 0: none */
    int32_t dtype;            /* kf_dtype of every tensor: KF_DTYPE_F32 (default), or KF_DTYPE_F64
                                 (since 1.4; on CUDA since 1.7), KF_DTYPE_F16 or KF_DTYPE_BF16
                                 (since 1.5; on CUDA since 1.6) */
    /* appended in later versions below this line; never reorder or remove */
} kf_kan_linear_desc;

/* Writes the defaults and struct_size into `desc`. Since 1.1. */
KF_API void kf_kan_linear_desc_init(kf_kan_linear_desc *desc);

/* Creates a plan bound to `ctx` (which must outlive it). @return KF_OK and *out,
 * KF_ERR_INVALID_ARGUMENT (message names the field), KF_ERR_UNSUPPORTED (a dtype the context
 * does not implement, see desc->dtype; on a CUDA context a spline_order above 15: since 1.3
 * reported here, before 1.3 by forward and backward), KF_ERR_OUT_OF_MEMORY. On failure
 * *out is set to NULL (when `out` is not NULL). Since 1.1. */
KF_API kf_status kf_kan_linear_plan_create(kf_context *ctx, const kf_kan_linear_desc *desc,
                                           kf_kan_linear_plan **out);

/* Destroys a plan. Accepts NULL. Since 1.1. */
KF_API void kf_kan_linear_plan_destroy(kf_kan_linear_plan *plan);

/* Bytes of scratch workspace kf_kan_linear_forward() and kf_kan_linear_backward() need for N
 * rows. Bounded by tiles, not by N times the bases. Pure. Since 1.1. */
KF_API kf_status kf_kan_linear_workspace_size(const kf_kan_linear_plan *plan, int64_t N,
                                              size_t *workspace_bytes);

/* The number of tensors of the layer's state (efficient-kan's state_dict): 4, or 3 without a
 * spline_scaler (standalone_scale = 0). Since 1.3. */
KF_API kf_status kf_kan_linear_param_count(const kf_kan_linear_plan *plan, int32_t *count);

/* Name (efficient-kan's state_dict key; static storage), rank and shape of tensor `index` in the
 * order grid [in, G+2k+1], base_weight [out, in], spline_weight [out, in, G+k], spline_scaler
 * [out, in] (when the plan has one), as kf_rnn_weight_info(). @return KF_OK, or
 * KF_ERR_INVALID_ARGUMENT (NULL plan, index out of range). Since 1.3. */
KF_API kf_status kf_kan_linear_param_info(const kf_kan_linear_plan *plan, int32_t index,
                                          const char **name, int32_t *ndim, int64_t *shape);

/* Writes efficient-kan's initial knots into `grid` [in, G + 2k + 1] (memory of the context's
 * device): grid[i][j] = lo + (j - k) * (hi - lo) / G for every feature, rounded as torch forms
 * it in the plan's dtype (bfloat16, float16: the float32 knots rounded to the type). Since 1.1. */
KF_API kf_status kf_kan_linear_uniform_grid(const kf_kan_linear_plan *plan, float lo, float hi,
                                            kf_tensor *grid);

/* The largest derivative_order a KAN call takes (kf_kan_linear_forward_args): SiLU^(m) is a
 * polynomial in the sigmoid whose coefficients grow like m!, so beyond this its float64 value
 * is cancellation. Since 1.9. */
#define KF_KAN_MAX_DERIVATIVE_ORDER 12

/* The tensors of kf_kan_linear_forward(); kf_kan_linear_forward_args_init() writes the
 * defaults. */
typedef struct kf_kan_linear_forward_args {
    size_t struct_size;     /* sizeof(kf_kan_linear_forward_args) as the caller compiled it */
    kf_tensor x;            /* [..., in], rank 1..KF_MAX_DIMS */
    kf_tensor grid;         /* [in, G + 2k + 1], non-decreasing along each row */
    kf_tensor base_weight;  /* [out, in]; since 1.3 optional: absent = no base term (y is the
                               spline branch alone, as when another activation's base branch is
                               computed by the caller) */
    kf_tensor spline_weight;/* [out, in, G + k] */
    kf_tensor spline_scaler;/* [out, in]: required with standalone_scale, absent otherwise */
    kf_tensor y;            /* out [..., out]: x's leading dims */
    /* since 1.9 (a 1.1-1.8 caller's shorter struct means: absent, order 0) */
    kf_tensor input_weight; /* optional, x's shape: w[n, i] multiplies feature i's term of row
                               n (absent: 1), y[n, o] = sum_i w[n, i] phi_oi^(m)(x[n, i]) */
    int32_t derivative_order; /* m, default 0: y takes the m-th derivative of every edge
                                 function phi_oi = base_weight SiLU + sum_c spline_weight B_c
                                 (SiLU^(m), B_c^(m); B^(k+1) = 0, the a.e. derivative);
                                 0 <= m <= min(spline_order + 1, KF_KAN_MAX_DERIVATIVE_ORDER).
                                 m > 0 or input_weight: KF_DTYPE_F32 or KF_DTYPE_F64 plans only */
} kf_kan_linear_forward_args;

/* Writes the defaults (all tensors absent) and struct_size into `args`. Since 1.1. */
KF_API void kf_kan_linear_forward_args_init(kf_kan_linear_forward_args *args);

/* y for every row of x. Workspace as for kf_rnn_forward() (NULL with 0 bytes: the arena). A
 * grid that decreases along a row is rejected on CPU contexts (KF_ERR_INVALID_ARGUMENT); on
 * CUDA contexts, where reading it would need a synchronisation, it gives unspecified values.
 * @return KF_OK; KF_ERR_INVALID_ARGUMENT (message names the argument);
 * KF_ERR_WORKSPACE_TOO_SMALL; KF_ERR_OUT_OF_MEMORY; KF_ERR_DEVICE. Since 1.1. */
KF_API kf_status kf_kan_linear_forward(kf_kan_linear_plan *plan,
                                       const kf_kan_linear_forward_args *args, void *workspace,
                                       size_t workspace_bytes);

/* The tensors of kf_kan_linear_backward(); kf_kan_linear_backward_args_init() writes the
 * defaults. */
typedef struct kf_kan_linear_backward_args {
    size_t struct_size;      /* sizeof(kf_kan_linear_backward_args) as the caller compiled it */
    kf_tensor x, grid, base_weight, spline_weight, spline_scaler; /* the forward's */
    kf_tensor dy;            /* [..., out]: gradient of the loss w.r.t. y */
    kf_tensor dx;            /* optional out, x's shape: always overwritten */
    kf_tensor dbase_weight;  /* optional out [out, in]: written or accumulated per kf_grad_mode;
                                must be absent when base_weight is */
    kf_tensor dspline_weight;/* optional out [out, in, G + k]: likewise */
    kf_tensor dspline_scaler;/* optional out [out, in] (standalone_scale only): likewise */
    /* since 1.9 (a 1.1-1.8 caller's shorter struct means: absent, order 0); the backward of
     * the forward at the same input_weight w and derivative_order m (docs/ops/kan.md):
     * dx = w * sum_o dy phi^(m+1), dinput_weight = sum_o dy phi^(m), and the parameter
     * gradients of y = sum_i w phi^(m) */
    kf_tensor input_weight;  /* optional, x's shape: the forward's (absent: 1) */
    kf_tensor dinput_weight; /* optional out, x's shape: always overwritten; may be given
                                without input_weight (the gradient at w = 1) */
    int32_t derivative_order; /* m, default 0: as the forward's, 0 <= m <= spline_order + 1;
                                 with dx, m + 1 <= min(spline_order + 1,
                                 KF_KAN_MAX_DERIVATIVE_ORDER). m > 0, input_weight or
                                 dinput_weight: KF_DTYPE_F32 or KF_DTYPE_F64 plans only */
} kf_kan_linear_backward_args;

/* Writes the defaults and struct_size into `args`. Since 1.1. */
KF_API void kf_kan_linear_backward_args_init(kf_kan_linear_backward_args *args);

/* Gradients of x and the parameters. `grad_mode` applies to the parameter gradients. Workspace
 * and statuses as for kf_kan_linear_forward(). Since 1.1. */
KF_API kf_status kf_kan_linear_backward(kf_kan_linear_plan *plan, kf_grad_mode grad_mode,
                                        const kf_kan_linear_backward_args *args, void *workspace,
                                        size_t workspace_bytes);

/* ---- KAN layers: KANConv2d (unfold + KANLinear) ------------------------------------------- */
/*
 * A 2-D convolution whose per-patch map is a KANLinear: x [B, C_in, H, W] is unfolded into the
 * patches of torch.nn.functional.unfold (kernel kh x kw, stride, zero padding and dilation as in
 * torch.nn.Conv2d), and KANLinear with in = F = C_in * kh * kw features and out = C_out maps
 * every patch to one output pixel:
 *     y[b, :, oh, ow] = KANLinear(patch(b, oh, ow)),
 *     patch(b, oh, ow)[(c * kh + i) * kw + j] = x[b, c, oh*sh - ph + i*dh, ow*sw - pw + j*dw]
 * (0 outside the image: padded values go through SiLU and the bases as zeros, exactly as
 * unfold + KANLinear computes them), with Ho = (H + 2 ph - dh (kh - 1) - 1) / sh + 1 and Wo
 * likewise (>= 1). The parameters are KANLinear's over F features (kf_kan_linear_desc, with the
 * feature order above): grid [F, G + 2k + 1], base_weight [C_out, F], spline_weight
 * [C_out, F, G + k], spline_scaler [C_out, F]. Neither the patches nor the bases are stored for
 * the batch (an implicit GEMM). x may also be [C_in, H, W] (one image; y is then [C_out, Ho, Wo]),
 * as torch.nn.Conv2d accepts.
 */
typedef struct kf_kan_conv2d_plan kf_kan_conv2d_plan;

/* A KANConv2d plan's layer; kf_kan_conv2d_desc_init() writes the defaults. */
typedef struct kf_kan_conv2d_desc {
    size_t struct_size;            /* sizeof(kf_kan_conv2d_desc) as the caller compiled it */
    int64_t in_channels;           /* C_in >= 1; no default (0) */
    int64_t out_channels;          /* C_out >= 1; no default (0) */
    int32_t kernel_h, kernel_w;    /* >= 1; no default (0) */
    int32_t stride_h, stride_w;    /* >= 1; default 1 */
    int32_t pad_h, pad_w;          /* >= 0; default 0 (zeros on each side) */
    int32_t dilation_h, dilation_w;/* >= 1; default 1 */
    int32_t grid_size;             /* G >= 1; default 5 */
    int32_t spline_order;          /* k >= 0; default 3 */
    int32_t standalone_scale;      /* 1 (default): spline_scaler multiplies spline_weight; 0: none */
    int32_t dtype;                 /* kf_dtype of every tensor: KF_DTYPE_F32 (default), or
                                      KF_DTYPE_F64 (since 1.4; on CUDA since 1.7), KF_DTYPE_F16
                                      or KF_DTYPE_BF16 (since 1.5; on CUDA since 1.6) */
    /* appended in later versions below this line; never reorder or remove */
} kf_kan_conv2d_desc;

/* Writes the defaults and struct_size into `desc`. Since 1.2. */
KF_API void kf_kan_conv2d_desc_init(kf_kan_conv2d_desc *desc);

/* Creates a plan bound to `ctx` (which must outlive it). @return KF_OK and *out,
 * KF_ERR_INVALID_ARGUMENT (message names the field), KF_ERR_UNSUPPORTED, KF_ERR_OUT_OF_MEMORY.
 * On failure *out is set to NULL (when `out` is not NULL). Since 1.2. */
KF_API kf_status kf_kan_conv2d_plan_create(kf_context *ctx, const kf_kan_conv2d_desc *desc,
                                           kf_kan_conv2d_plan **out);

/* Destroys a plan. Accepts NULL. Since 1.2. */
KF_API void kf_kan_conv2d_plan_destroy(kf_kan_conv2d_plan *plan);

/* Bytes of scratch workspace kf_kan_conv2d_forward() and kf_kan_conv2d_backward() need for a
 * batch of `batch` images of height x width (batch 1 for an unbatched x). Bounded by tiles (on
 * the CPU, for a plan of at most 16 output channels: by one image's B-spline windows per
 * thread), not by the patches or the bases of the batch. Pure. Since 1.2. */
KF_API kf_status kf_kan_conv2d_workspace_size(const kf_kan_conv2d_plan *plan, int64_t batch,
                                              int64_t height, int64_t width,
                                              size_t *workspace_bytes);

/* The per-patch layer's tensors, as kf_kan_linear_param_count() and kf_kan_linear_param_info()
 * with in = in_channels * kernel_h * kernel_w. Since 1.3. */
KF_API kf_status kf_kan_conv2d_param_count(const kf_kan_conv2d_plan *plan, int32_t *count);
/* Name, rank and shape of the per-patch layer's tensor `index`, as kf_kan_linear_param_info().
 * Since 1.3. */
KF_API kf_status kf_kan_conv2d_param_info(const kf_kan_conv2d_plan *plan, int32_t index,
                                          const char **name, int32_t *ndim, int64_t *shape);

/* The output extent of a height x width image, as torch.nn.Conv2d forms it:
 * out = (in + 2 pad - dilation (kernel - 1) - 1) / stride + 1 per dimension; y is
 * [batch, out_channels, out_height, out_width] (or without batch for a 3-D x). Either output
 * may be NULL. @return KF_OK, or KF_ERR_INVALID_ARGUMENT (NULL plan; an extent outside
 * 1..2^31-1 or one whose output would be empty). Since 1.3. */
KF_API kf_status kf_kan_conv2d_output_size(const kf_kan_conv2d_plan *plan, int64_t height,
                                           int64_t width, int64_t *out_height,
                                           int64_t *out_width);

/* Writes efficient-kan's initial knots into `grid` [F, G + 2k + 1], as
 * kf_kan_linear_uniform_grid() does for F features. Since 1.2. */
KF_API kf_status kf_kan_conv2d_uniform_grid(const kf_kan_conv2d_plan *plan, float lo, float hi,
                                            kf_tensor *grid);

/* The tensors of kf_kan_conv2d_forward(); kf_kan_conv2d_forward_args_init() writes the
 * defaults. */
typedef struct kf_kan_conv2d_forward_args {
    size_t struct_size;     /* sizeof(kf_kan_conv2d_forward_args) as the caller compiled it */
    kf_tensor x;            /* [B, C_in, H, W] or [C_in, H, W] */
    kf_tensor grid;         /* [F, G + 2k + 1], non-decreasing along each row */
    kf_tensor base_weight;  /* [C_out, F]; since 1.3 optional: absent = no base term, as for
                               kf_kan_linear_forward() */
    kf_tensor spline_weight;/* [C_out, F, G + k] */
    kf_tensor spline_scaler;/* [C_out, F]: required with standalone_scale, absent otherwise */
    kf_tensor y;            /* out [B, C_out, Ho, Wo] (or [C_out, Ho, Wo] for a 3-D x) */
} kf_kan_conv2d_forward_args;

/* Writes the defaults (all tensors absent) and struct_size into `args`. Since 1.2. */
KF_API void kf_kan_conv2d_forward_args_init(kf_kan_conv2d_forward_args *args);

/* y for every image of x. Workspace, grid checks and statuses as for kf_kan_linear_forward().
 * Since 1.2. */
KF_API kf_status kf_kan_conv2d_forward(kf_kan_conv2d_plan *plan,
                                       const kf_kan_conv2d_forward_args *args, void *workspace,
                                       size_t workspace_bytes);

/* The tensors of kf_kan_conv2d_backward(); kf_kan_conv2d_backward_args_init() writes the
 * defaults. */
typedef struct kf_kan_conv2d_backward_args {
    size_t struct_size;      /* sizeof(kf_kan_conv2d_backward_args) as the caller compiled it */
    kf_tensor x, grid, base_weight, spline_weight, spline_scaler; /* the forward's */
    kf_tensor dy;            /* y's shape: gradient of the loss w.r.t. y */
    kf_tensor dx;            /* optional out, x's shape: always overwritten */
    kf_tensor dbase_weight;  /* optional out [C_out, F]: written or accumulated per kf_grad_mode;
                                must be absent when base_weight is */
    kf_tensor dspline_weight;/* optional out [C_out, F, G + k]: likewise */
    kf_tensor dspline_scaler;/* optional out [C_out, F] (standalone_scale only): likewise */
} kf_kan_conv2d_backward_args;

/* Writes the defaults and struct_size into `args`. Since 1.2. */
KF_API void kf_kan_conv2d_backward_args_init(kf_kan_conv2d_backward_args *args);

/* Gradients of x and the parameters. `grad_mode` applies to the parameter gradients. Workspace
 * and statuses as for kf_kan_conv2d_forward(). Since 1.2. */
KF_API kf_status kf_kan_conv2d_backward(kf_kan_conv2d_plan *plan, kf_grad_mode grad_mode,
                                        const kf_kan_conv2d_backward_args *args, void *workspace,
                                        size_t workspace_bytes);

/* ---- KAN layers: grid update (efficient-kan's update_grid) --------------------------------- */
/*
 * Moves each feature's knots to where a batch of inputs lies and refits the splines to them.
 * Per feature i, with s_0 <= ... <= s_{M-1} its M sample values sorted (M = N rows of x for
 * KANLinear; M = B Ho Wo patches of x, zero padding included, for KANConv2d):
 *     h   = (s_{M-1} - s_0 + 2 margin) / G
 *     g_j = grid_eps (s_0 - margin + j h) + (1 - grid_eps) s_{a_j},   j = 0..G,
 *           a_j = torch.linspace(0, M - 1, G + 1, dtype=int64) as the CPU kernel of the torch
 *           named by quantile_rule forms it (efficient-kan's quantile indices, which depend on
 *           the torch it runs on: not always floor(j (M - 1) / G))
 *     grid[i] = (g_0 - k h, ..., g_0 - h, g_0, ..., g_G, g_G + h, ..., g_G + k h)
 * and spline_weight[:, i, :] becomes the minimum-norm least-squares coefficients (float64, by
 * SVD: rank-deficient fits, where efficient-kan's lstsq fails, give the minimum-norm solution)
 * whose splines on the new knots best reproduce, on the samples, the splines of the old
 * spline_weight on the old knots. spline_scaler and base_weight are unchanged, so the layer's
 * output on the samples is kept up to the fit (efficient-kan fits the scaled weights and then
 * scales again; kfuse does not). The knots are formed in the plan's dtype in torch's order of
 * operations (the same bits as kfuse.torch's update_grid; a float64 plan takes margin and
 * grid_eps at their float32 values; a float16 or bfloat16 plan forms them in float32 and
 * rounds each knot to its type). Not a hot path: it synchronises with the
 * context's stream, allocates and computes on the host, and writes grid and spline_weight only on
 * success (on a CUDA context a failure of the final copy of spline_weight can leave the new grid
 * written).
 */
typedef struct kf_kan_update_grid_args {
    size_t struct_size;      /* sizeof(kf_kan_update_grid_args) as the caller compiled it */
    kf_tensor x;             /* the samples: x as kf_kan_linear_forward() or kf_kan_conv2d_forward()
                                take it; every value finite */
    kf_tensor grid;          /* in/out [in, G + 2k + 1] ([F, ...] for KANConv2d) */
    kf_tensor spline_weight; /* in/out [out, in, G + k] */
    float margin;            /* >= 0, finite; default 0.01 */
    float grid_eps;          /* in [0, 1]; default 0.02 */
    /* appended in later versions below this line; never reorder or remove */
    int32_t quantile_rule;   /* a kf_kan_quantile_rule; default (0) KF_KAN_QUANTILES_TORCH1.
                                Since 1.3: a 1.2 caller's struct_size, which ends before it,
                                gets the default */
} kf_kan_update_grid_args;

/* Which torch's int64 linspace picks the quantile indices a_j of a grid update (efficient-kan
 * gets them from the torch it runs on). Since 1.3. */
typedef enum kf_kan_quantile_rule {
    /* torch 1.13: trunc(step j) below the middle, trunc((M - 1) - step (G - j)) from it, with
     * 4-lane vector blocks of 8 over the first floor((G + 1) / 8) * 8 indices */
    KF_KAN_QUANTILES_TORCH1 = 0,
    /* torch >= 2.0: the same two halves, symmetric, element by element (e.g. M = 33, G = 10
     * picks index 16 for j = 5, where torch 1.13 picks 15) */
    KF_KAN_QUANTILES_TORCH2 = 1
} kf_kan_quantile_rule;

/* Writes the defaults (tensors absent, margin 0.01, grid_eps 0.02, quantile_rule
 * KF_KAN_QUANTILES_TORCH1) and struct_size. Since 1.2. */
KF_API void kf_kan_update_grid_args_init(kf_kan_update_grid_args *args);

/* The grid update for a KANLinear plan. @return KF_OK; KF_ERR_INVALID_ARGUMENT (message names the
 * argument: also a non-finite x or spline_weight, a grid that is not finite and non-decreasing,
 * samples spread too wide for finite knots, a refit coefficient beyond the dtype's range, as a
 * float16 plan's can be past 65504, where releases up to 1.7.5 stored an infinity that the next
 * update refused); KF_ERR_UNSUPPORTED (a struct_size newer than the library's with non-zero
 * trailing fields); KF_ERR_OUT_OF_MEMORY; KF_ERR_INTERNAL (the SVD did not converge);
 * KF_ERR_DEVICE. Since 1.2. */
KF_API kf_status kf_kan_linear_update_grid(kf_kan_linear_plan *plan,
                                           const kf_kan_update_grid_args *args);

/* The grid update for a KANConv2d plan, over the patches of x. Statuses as for
 * kf_kan_linear_update_grid(). Since 1.2. */
KF_API kf_status kf_kan_conv2d_update_grid(kf_kan_conv2d_plan *plan,
                                           const kf_kan_update_grid_args *args);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KFUSE_H */
