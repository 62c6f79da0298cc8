"""Thin Python object over kfuse's sketched linear layer (SKLinear, Panther's randomized low-rank
layer): the kf_sklinear_* part of capi/include/kfuse.h.

    plan = SkLinearPlan(ctx, in_features, out_features, num_terms, low_rank, bias=True,
                        activation=ACTIVATION_NONE, dropout=0.0)
    plan.param_info      [("S1s", (L, in, k)), ("S2s", (L, k, out)), ("bias", (out,)),
                          ("U1s", (L, k, out)), ("U2s", (L, in, k))]   (Panther's state_dict order)
    plan.param_ratio     2Lk(in+out) / (in*out)  (Panther warns above 1)
    plan.forward(x, S1s, S2s, U1s, U2s, y, bias=None, pre=None, training=False,
                 dropout_seed=0, dropout_offset=0)
    plan.backward(x, S1s, S2s, U1s, U2s, dy, dx=None, dS1s=None, dS2s=None, dbias=None,
                  pre=None, training=False, dropout_seed=0, dropout_offset=0)
    plan.init_params(seed, S1s, S2s, U1s, U2s, bias=None, W_init=None)

As in kfuse._lowlevel, nothing is validated or computed here: every check is the library's, and
a failing status becomes a KfuseError subclass with the library's message. The GIL is released
during each C call. The numpy front end is kfuse.numpy.sklinear_*; the PyTorch drop-in is
kfuse.torch.SKLinear.

Tensors are handed over as objects (torch tensors, numpy arrays, TensorRefs; None = absent), and
their kf_tensor fields are taken inside the method, which holds every object it was given until
the C call returns (kfuse._lowlevel.tensor_values, shared by every plan). A raw
(ptr, kf_dtype, shape, strides) tuple (strides in elements; None = row-major) is accepted for
memory the caller keeps alive itself. A layer this cheap is called often with small shapes, so
the argument struct's tensors are written with one struct.pack_into (kfuse._lowlevel.pack_tensors;
the layout is checked against the compiler's at import; where it differs, the fields are set one
by one).
"""
from kfuse._lowlevel import (  # noqa: F401  (tensor_values: re-exported, its 1.1 home)
    DTYPE_F32, _buffer, _fill_tensor, _Plan, check, ffi, lib, pack_tensors, param_list,
    tensor_run, tensor_values,
)

__all__ = ["SkLinearPlan", "PARAM_NAMES", "ACTIVATIONS"]

#: No activation in the fused epilogue (kf_activation's KF_ACTIVATION_NONE, the default).
ACTIVATION_NONE = lib.KF_ACTIVATION_NONE
#: The fused epilogue's activations (kf_activation, since 1.8) by name, as
#: kfuse.torch.SKLinear's `activation=` takes them.
ACTIVATIONS = {None: lib.KF_ACTIVATION_NONE, "relu": lib.KF_ACTIVATION_RELU,
               "gelu": lib.KF_ACTIVATION_GELU, "gelu_tanh": lib.KF_ACTIVATION_GELU_TANH,
               "silu": lib.KF_ACTIVATION_SILU}

#: Panther's parameter and buffer names, in its state_dict order (parameters, then buffers).
PARAM_NAMES = ("S1s", "S2s", "bias", "U1s", "U2s")

_FWD_FIELDS = ("x", "S1s", "S2s", "U1s", "U2s", "bias", "y")
_BWD_FIELDS = ("x", "S1s", "S2s", "U1s", "U2s", "dy", "dx", "dS1s", "dS2s", "dbias")


# The byte offset of a struct's kf_tensor fields when they follow one another there (one
# pack_tensors call writes them all), or None (then field by field); kfuse.kan uses it too.
_packed_layout = tensor_run

_FWD_STRUCT = _packed_layout("kf_sklinear_forward_args", _FWD_FIELDS)
_BWD_STRUCT = _packed_layout("kf_sklinear_backward_args", _BWD_FIELDS)


def _fill_args(cache, ctype, init, start, fields, refs):
    """The plan's `ctype` struct (made once, its defaults written by `init`, and kept in the
    plan's dict `cache`: a plan is used by one thread at a time, so refilling it is safe),
    describing the tensors `refs` (anything kfuse._lowlevel.tensor_values takes) in `fields`
    order; `start` is _packed_layout(ctype, fields). The caller holds `refs` until the C call
    returns."""
    entry = cache.get(ctype)
    if entry is None:
        args = ffi.new(ctype + " *")
        init(args)
        entry = cache[ctype] = (args, ffi.buffer(args))
    args, buf = entry
    if start is not None:
        pack_tensors(buf, start, refs, fields)
    else:  # pragma: no cover - a compiler laying the struct out with padding
        for f, r in zip(fields, refs):
            _fill_tensor(getattr(args, f), r, f)
    return args


def _fill_epi(args, pre, training, seed, offset):
    """The epilogue's fields of a forward or backward args struct (refilled every call)."""
    args.mode = lib.KF_MODE_TRAINING if training else lib.KF_MODE_INFERENCE
    args.dropout_seed = int(seed)
    args.dropout_offset = int(offset)
    _fill_tensor(args.pre, pre, "pre")


class SkLinearPlan(_Plan):
    """A kf_sklinear_plan bound to a Context, which it keeps alive.

    SkLinearPlan(ctx, in_features, out_features, num_terms, low_rank, bias=True,
                 dtype=DTYPE_F32, activation=ACTIVATION_NONE, dropout=0.0). Descriptor checks
    are the library's (InvalidArgument naming the field; Unsupported for a dtype the backend
    lacks). activation (a kf_activation) and dropout (p in [0, 1)) make the fused epilogue
    y = dropout(act(pre)) (kfuse.h, since 1.8)."""

    _prefix = "kf_sklinear"

    def __init__(self, ctx, in_features, out_features, num_terms, low_rank, bias=True,
                 dtype=DTYPE_F32, activation=ACTIVATION_NONE, dropout=0.0):
        def fill(desc):
            desc.in_features = int(in_features)
            desc.out_features = int(out_features)
            desc.num_terms = int(num_terms)
            desc.low_rank = int(low_rank)
            desc.bias = 1 if bias else 0
            desc.dtype = int(dtype)
            desc.activation = int(activation)
            desc.dropout = float(dropout)

        self._make_plan(ctx, fill)
        self.in_features = int(in_features)
        self.out_features = int(out_features)
        self.num_terms = int(num_terms)
        self.low_rank = int(low_rank)
        self.bias = bool(bias)
        self.dtype = int(dtype)
        self.activation = int(activation)
        self.dropout = float(dropout)
        # [(name, shape), ...] of the layer's tensors (kf_sklinear_param_info) in Panther's
        # state_dict order: S1s, S2s, bias when the plan has one, U1s, U2s
        self.param_info = param_list(lib.kf_sklinear_param_count, lib.kf_sklinear_param_info,
                                     self._ptr, PARAM_NAMES)

    @property
    def param_names(self):
        return [n for n, _ in self.param_info]

    @property
    def param_ratio(self):
        """2Lk(in+out) / (in*out) (kf_sklinear_param_ratio): above 1 the sketch holds more
        parameters than the dense layer it replaces."""
        v = ffi.new("double *")
        check(lib.kf_sklinear_param_ratio(self._ptr, v))
        return float(v[0])

    def workspace_size(self, N):
        """Bytes of scratch workspace forward() and backward() need for N rows
        (kf_sklinear_workspace_size)."""
        ws = ffi.new("size_t *")
        check(lib.kf_sklinear_workspace_size(self._ptr, int(N), ws))
        return int(ws[0])

    def forward(self, x, S1s, S2s, U1s, U2s, y, bias=None, workspace=None, pre=None,
                training=False, dropout_seed=0, dropout_offset=0):
        """kf_sklinear_forward: y [..., out] from x [..., in]. Tensors: torch tensors, numpy
        arrays, TensorRefs or raw (ptr, kf_dtype, shape, strides) tuples, None = absent; each is
        held until the call returns. `workspace` is a uint8 tensor or array, a raw (ptr, nbytes)
        pair or None (the context's arena). The epilogue's: `pre` (optional out, y's shape: the
        pre-activation), `training` (KF_MODE_TRAINING: the plan's dropout applies), the dropout
        mask's seed and counter offset. Releases the GIL."""
        args = _fill_args(self._args, "kf_sklinear_forward_args",
                          lib.kf_sklinear_forward_args_init, _FWD_STRUCT, _FWD_FIELDS,
                          (x, S1s, S2s, U1s, U2s, bias, y))
        _fill_epi(args, pre, training, dropout_seed, dropout_offset)
        ws, ws_bytes = _buffer(workspace, "workspace")
        check(lib.kf_sklinear_forward(self._ptr, args, ws, ws_bytes))

    def backward(self, x, S1s, S2s, U1s, U2s, dy, dx=None, dS1s=None, dS2s=None, dbias=None,
                 accumulate=False, workspace=None, pre=None, training=False, dropout_seed=0,
                 dropout_offset=0):
        """kf_sklinear_backward: dx (always overwritten), dS1s, dS2s, dbias (written, or added
        to with accumulate=True); each output may be None. Tensors as for forward(); the
        epilogue's fields are the forward's (`pre`: its pre-activation, required with an
        activation; for ReLU its y serves). Releases the GIL."""
        args = _fill_args(self._args, "kf_sklinear_backward_args",
                          lib.kf_sklinear_backward_args_init, _BWD_STRUCT, _BWD_FIELDS,
                          (x, S1s, S2s, U1s, U2s, dy, dx, dS1s, dS2s, dbias))
        _fill_epi(args, pre, training, dropout_seed, dropout_offset)
        ws, ws_bytes = _buffer(workspace, "workspace")
        grad_mode = lib.KF_GRAD_ACCUMULATE if accumulate else lib.KF_GRAD_OVERWRITE
        check(lib.kf_sklinear_backward(self._ptr, grad_mode, args, ws, ws_bytes))

    def init_params(self, seed, S1s, S2s, U1s, U2s, bias=None, W_init=None):
        """kf_sklinear_init_params: Panther's initialisation, a pure function of `seed`: sign
        sketches U1s, U2s (entries +-1/sqrt(k)); S1s[i] = W U1s[i]^T, S2s[i] = U2s[i]^T W with
        W = W_init^T (W_init [out, in], a Linear's weight) or Kaiming-uniform; bias
        U(-1/sqrt(out), 1/sqrt(out)). Every output is written."""
        args = ffi.new("kf_sklinear_init_args *")
        lib.kf_sklinear_init_args_init(args)
        args.seed = int(seed)  # 0 .. 2**64-1 (cffi raises OverflowError outside)
        for field, r in (("W_init", W_init), ("S1s", S1s), ("S2s", S2s), ("U1s", U1s),
                         ("U2s", U2s), ("bias", bias)):
            _fill_tensor(getattr(args, field), r, field)
        check(lib.kf_sklinear_init_params(self._ptr, args))

    def __repr__(self):
        return ("kfuse.SkLinearPlan(in_features=%d, out_features=%d, num_terms=%d, "
                "low_rank=%d, bias=%r, activation=%d, dropout=%g)"
                % (self.in_features, self.out_features, self.num_terms, self.low_rank, self.bias,
                   self.activation, self.dropout))
