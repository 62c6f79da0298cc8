"""numpy front end of kfuse's recurrent ops, sketched linear layer and KAN linear layer.

    y, hn, reserve = rnn_forward(plan, x, weights, h0=None, lengths=None, training=False)
    dx, dh0, dweights = rnn_backward(plan, x, weights, reserve, dy=..., dhn=..., ...)
    params = sklinear_init(plan, seed, W_init=None)          # {"S1s": ..., "U2s": ...}
    y = sklinear_forward(plan, x, params)
    dx, dparams = sklinear_backward(plan, x, params, dy)     # dparams: {"S1s", "S2s", "bias"}
    grid = kan_uniform_grid(plan, lo=-1.0, hi=1.0)           # [F, G + 2k + 1]
    y = kan_forward(plan, x, params)                         # params: efficient-kan's names
    dx, dparams = kan_backward(plan, x, params, dy)          # base_weight, spline_weight, ...
    grid, spline_weight = kan_update_grid(plan, x, params)   # efficient-kan's update_grid

The kan_* functions take a kfuse.kan.KanLinearPlan (x [..., in] -> y [..., out]) or a
kfuse.kan.KanConv2dPlan (x [B, C_in, H, W] -> y [B, C_out, Ho, Wo]); kan_linear_uniform_grid,
kan_linear_forward and kan_linear_backward are their 1.1 names.

Arrays are passed to the library as they are (their dtype and strides go into the kf_tensor), so
every check (dtype, C-contiguous, shapes) is the library's own and fails with its message
as kfuse.InvalidArgument. Anything numpy can view without copying works as input: ndarrays,
objects exposing __array_interface__ or the buffer protocol, and DLPack producers (__dlpack__,
through np.from_dlpack). Outputs are new float32 arrays (the kan_* functions': arrays of the
plan's dtype, float32, float64 or float16). The GIL is released during each call.
`plan` is a kfuse.RnnPlan, kfuse.sklinear.SkLinearPlan, kfuse.kan.KanLinearPlan
or kfuse.kan.KanConv2dPlan on a CPU context (numpy memory is host memory).
"""
from collections.abc import Mapping

import numpy as np

from kfuse._lowlevel import ALIGN_BYTES, DTYPE_BF16, DTYPE_F16, DTYPE_F64, TensorRef, rnn_seq_dims
from kfuse.kan import QUANTILES_TORCH1

__all__ = ["rnn_forward", "rnn_backward", "sklinear_init", "sklinear_forward",
           "sklinear_backward", "kan_uniform_grid", "kan_forward", "kan_backward",
           "kan_update_grid", "kan_linear_uniform_grid", "kan_linear_forward",
           "kan_linear_backward", "as_array", "tensor_ref", "aligned_empty"]

def as_array(obj):
    """A numpy view of `obj` without copying: an ndarray as is, a DLPack producer through
    np.from_dlpack, else np.asarray (buffer protocol / __array_interface__)."""
    if obj is None or isinstance(obj, np.ndarray):
        return obj
    if hasattr(obj, "__dlpack__") and not hasattr(obj, "__array_interface__"):
        return np.from_dlpack(obj)
    return np.asarray(obj)


def tensor_ref(a):
    """A TensorRef describing numpy array `a` as it is (strides in elements; an unknown dtype is
    passed as 0 so that the library rejects it by name), holding `a` so that its memory lives as
    long as the TensorRef (kfuse._lowlevel's one conversion, shared with kfuse.torch)."""
    return TensorRef.of(a)


def aligned_empty(nbytes, align=ALIGN_BYTES):
    """An uninitialised uint8 array of `nbytes` whose address is a multiple of `align`."""
    raw = np.empty(int(nbytes) + align, dtype=np.uint8)
    off = (-raw.__array_interface__["data"][0]) % align
    return raw[off:off + int(nbytes)]


def _weights(plan, weights):
    if isinstance(weights, Mapping):
        weights = [weights[name] for name in plan.weight_names]
    return [as_array(w) for w in weights]


def _y_hn_shapes(plan, x):
    # Output allocation only (the library checks x itself): the library's shapes of y and hn
    # (kf_rnn_output_shapes). For an x that is not 3-D the library reports the error.
    if x.ndim != 3:
        return None, None
    return plan.output_shapes(*rnn_seq_dims(plan.batch_first, x.shape))


def rnn_forward(plan, x, weights, h0=None, lengths=None, training=False, dropout_seed=0,
                dropout_offset=0, workspace=None, return_hn=True):
    """Runs the recurrent stack of `plan` over `x` ([T, B, I], or [B, T, I] batch-first).

    weights: sequence of arrays in the canonical order (plan.weight_info), or a mapping from the
    reference state_dict names. h0: optional [L*D, B, H]. lengths: optional int32 [B].
    training: KF_MODE_TRAINING (dropout applied, reserve written for rnn_backward).
    workspace: optional caller scratch (a uint8 array, KF_ALIGN_BYTES-aligned: aligned_empty);
    None = context arena.
    Returns (y, hn, reserve): reserve is None in inference; in training pass it to rnn_backward
    with the same inputs."""
    x = as_array(x)
    h0 = as_array(h0)
    lengths = as_array(lengths)
    ws = _weights(plan, weights)
    y_shape, hn_shape = _y_hn_shapes(plan, x)
    y = np.empty(y_shape if y_shape else (0,), dtype=np.float32)
    hn = np.empty(hn_shape, dtype=np.float32) if (hn_shape and return_hn) else None
    reserve = None
    if training:
        T, B = rnn_seq_dims(plan.batch_first, x.shape)
        reserve = aligned_empty(plan.workspace_size(T, B, training=True)[1])
    plan.forward(
        tensor_ref(x), [tensor_ref(w) for w in ws], tensor_ref(y) if y_shape else None,
        h0=tensor_ref(h0), hn=tensor_ref(hn), lengths=tensor_ref(lengths), training=training,
        dropout_seed=dropout_seed, dropout_offset=dropout_offset,
        workspace=workspace, reserve=reserve)
    return y, hn, reserve


def rnn_backward(plan, x, weights, reserve, dy=None, dhn=None, h0=None, lengths=None,
                 dropout_seed=0, dropout_offset=0, need_dx=True, need_dh0=True,
                 need_dweights=True, dweights=None, accumulate=False, workspace=None):
    """Gradients from the reserve of a training rnn_forward with the same inputs.

    dy: optional gradient w.r.t. y; dhn: optional gradient w.r.t. hn (absent = zero).
    dweights: optional list of float32 arrays (canonical order) to write, or with
    accumulate=True to add into; by default new arrays are made when need_dweights.
    Returns (dx, dh0, dweights) with None for what was not asked for."""
    x = as_array(x)
    h0 = as_array(h0)
    lengths = as_array(lengths)
    dy = as_array(dy)
    dhn = as_array(dhn)
    ws = _weights(plan, weights)
    dx = np.empty(x.shape, dtype=np.float32) if need_dx else None
    dh0 = None
    if need_dh0:
        _, hn_shape = _y_hn_shapes(plan, x)
        dh0 = np.empty(hn_shape, dtype=np.float32) if hn_shape else None
    if dweights is None and need_dweights:
        dweights = [np.empty(shape, dtype=np.float32) for _, shape in plan.weight_info]
    elif dweights is not None:
        dweights = [as_array(d) for d in dweights]
    plan.backward(
        tensor_ref(x), [tensor_ref(w) for w in ws],
        reserve,
        h0=tensor_ref(h0), lengths=tensor_ref(lengths), dy=tensor_ref(dy), dhn=tensor_ref(dhn),
        dx=tensor_ref(dx), dh0=tensor_ref(dh0),
        dweights=None if dweights is None else [tensor_ref(d) for d in dweights],
        accumulate=accumulate, dropout_seed=dropout_seed, dropout_offset=dropout_offset,
        workspace=workspace)
    return dx, dh0, dweights


# ---- sketched linear layer (SKLinear) ----------------------------------------------------------

def _sk_params(plan, params):
    """{name: array} from a mapping (Panther's state_dict names; extra keys ignored) or a sequence
    in plan.param_names order. A missing name is passed as absent, for the library to report."""
    if not isinstance(params, Mapping):
        params = dict(zip(plan.param_names, params))
    return {n: as_array(params.get(n)) for n in ("S1s", "S2s", "U1s", "U2s", "bias")}


def _workspace(workspace):
    return workspace  # a uint8 array (or None), held by the plan method during the call


def _lead_shape(x, n):
    # Output allocation only: x [..., in] -> [..., n]; a 0-d x is passed on for the library to
    # report (the output is then absent).
    return None if x.ndim == 0 else x.shape[:-1] + (n,)


def sklinear_init(plan, seed, W_init=None):
    """Panther's initialisation through kf_sklinear_init_params, a pure function of `seed`
    (0 .. 2**64-1): returns {name: new float32 array} in Panther's state_dict order (S1s, S2s,
    bias when the plan has one, U1s, U2s). W_init: optional [out, in] array (a Linear's weight);
    absent = Kaiming-uniform W as Panther draws it."""
    out = {n: np.empty(shape, dtype=np.float32) for n, shape in plan.param_info}
    W_init = as_array(W_init)
    plan.init_params(seed, tensor_ref(out["S1s"]), tensor_ref(out["S2s"]),
                     tensor_ref(out["U1s"]), tensor_ref(out["U2s"]),
                     bias=tensor_ref(out.get("bias")), W_init=tensor_ref(W_init))
    return out


def sklinear_forward(plan, x, params, workspace=None):
    """y [..., out] = 1/(2L) sum_i [(x S1s[i]) U1s[i] + (x U2s[i]) S2s[i]] + bias for
    x [..., in] (any leading dims, up to KF_MAX_DIMS in all). params: mapping with Panther's
    names (S1s, S2s, U1s, U2s, bias) or a sequence in plan.param_names order. Returns a new
    float32 array."""
    x = as_array(x)
    p = _sk_params(plan, params)
    y_shape = _lead_shape(x, plan.out_features)
    y = None if y_shape is None else np.empty(y_shape, dtype=np.float32)
    plan.forward(tensor_ref(x), tensor_ref(p["S1s"]), tensor_ref(p["S2s"]), tensor_ref(p["U1s"]),
                 tensor_ref(p["U2s"]), tensor_ref(y), bias=tensor_ref(p["bias"]),
                 workspace=_workspace(workspace))
    return y


def sklinear_backward(plan, x, params, dy, need_dx=True, need_dparams=True, dparams=None,
                      accumulate=False, workspace=None):
    """Gradients of the loss given dy = dL/dy (y's shape): returns (dx, dparams) where dparams
    is {"S1s", "S2s", and "bias" when the plan has one} (U1s and U2s are fixed). dparams may be
    given (a mapping of float32 arrays to write, or with accumulate=True to add into; a missing
    name is not computed); by default new arrays are made when need_dparams. dx is None unless
    need_dx."""
    x = as_array(x)
    dy = as_array(dy)
    p = _sk_params(plan, params)
    dx = np.empty(x.shape, dtype=np.float32) if need_dx else None
    if dparams is None and need_dparams:
        dparams = {n: np.empty(shape, dtype=np.float32) for n, shape in plan.param_info
                   if n in ("S1s", "S2s", "bias")}
    elif dparams is not None:
        dparams = {n: as_array(a) for n, a in dparams.items()}
    d = dparams or {}
    plan.backward(tensor_ref(x), tensor_ref(p["S1s"]), tensor_ref(p["S2s"]), tensor_ref(p["U1s"]),
                  tensor_ref(p["U2s"]), tensor_ref(dy), dx=tensor_ref(dx),
                  dS1s=tensor_ref(d.get("S1s")), dS2s=tensor_ref(d.get("S2s")),
                  dbias=tensor_ref(d.get("bias")), accumulate=accumulate,
                  workspace=_workspace(workspace))
    return dx, dparams


# ---- KAN linear layer (KANLinear, efficient-kan) -----------------------------------------------

_KAN_NAMES = ("base_weight", "spline_weight", "spline_scaler", "grid")
_KAN_GRADS = ("base_weight", "spline_weight", "spline_scaler")


def _kan_dtype(plan):
    """The numpy dtype of a KAN plan's tensors (its descriptor's dtype: float32, float64 or
    float16; numpy has no bfloat16: such a plan is for the torch front end)."""
    if plan.dtype == DTYPE_BF16:
        raise TypeError("kfuse.numpy: a bfloat16 KAN plan has no numpy dtype (numpy has no "
                        "bfloat16); use kfuse.torch")
    return {DTYPE_F64: np.float64, DTYPE_F16: np.float16}.get(plan.dtype, np.float32)


def _kan_params(plan, params):
    """{name: array} from a mapping (efficient-kan's state_dict names; extra keys ignored) or a
    sequence in plan.param_names order. A missing name is passed as absent, for the library to
    report (a missing base_weight: no base term, the spline branch alone)."""
    if not isinstance(params, Mapping):
        params = dict(zip(plan.param_names, params))
    return {n: as_array(params.get(n)) for n in _KAN_NAMES}


def kan_uniform_grid(plan, lo=-1.0, hi=1.0):
    """efficient-kan's initial knots for grid_range [lo, hi] through kf_kan_<layer>_uniform_grid:
    a new array of the plan's dtype [F, G + 2k + 1] (F = in_features, or C_in kh kw) whose every
    row is lo + (j - k) (hi - lo) / G, with the bits torch gives efficient-kan's grid buffer in
    that dtype."""
    grid = np.empty((plan.in_features, plan.num_knots), dtype=_kan_dtype(plan))
    plan.uniform_grid(lo, hi, tensor_ref(grid))
    return grid


def kan_forward(plan, x, params, workspace=None):
    """KANLinear: y [..., out] = SiLU(x) base_weight^T + B(x) (spline_weight *
    spline_scaler[..., None])^T for x [..., in] (any leading dims, up to KF_MAX_DIMS in all), B(x)
    the B-spline bases of order k on each feature's knots; KANConv2d: that map on every patch of
    x [B, C_in, H, W] (or [C_in, H, W]), y [B, C_out, Ho, Wo]. params: mapping with
    efficient-kan's names (base_weight, spline_weight, spline_scaler when the plan has a
    standalone scale, grid) or a sequence in plan.param_names order. Returns a new array of the
    plan's dtype."""
    x = as_array(x)
    p = _kan_params(plan, params)
    y_shape = plan.output_shape(x.shape)
    y = None if y_shape is None else np.empty(y_shape, dtype=_kan_dtype(plan))
    plan.forward(tensor_ref(x), tensor_ref(p["grid"]), tensor_ref(p["base_weight"]),
                 tensor_ref(p["spline_weight"]), tensor_ref(y),
                 spline_scaler=tensor_ref(p["spline_scaler"]), workspace=_workspace(workspace))
    return y


def kan_update_grid(plan, x, params, margin=0.01, grid_eps=0.02,
                    quantile_rule=QUANTILES_TORCH1):
    """efficient-kan's update_grid through kf_kan_<layer>_update_grid: returns new arrays (grid,
    spline_weight) of their dtype, the knots placed on the samples x (x's rows, or the patches
    of x for KANConv2d) and the coefficients refitted so that the splines on them reproduce, on
    the samples, the old ones (float64 minimum-norm least squares). params as for kan_forward
    (grid and spline_weight are read, not written). quantile_rule: kfuse.kan.QUANTILES_TORCH1
    (torch 1.13's quantile indices) or QUANTILES_TORCH2 (torch 2.x's)."""
    x = as_array(x)
    p = _kan_params(plan, params)
    # copies to write (their dtype kept: the library checks it)
    grid = None if p["grid"] is None else np.array(p["grid"], order="C", copy=True)
    spline_weight = (None if p["spline_weight"] is None
                     else np.array(p["spline_weight"], order="C", copy=True))
    plan.update_grid(tensor_ref(x), tensor_ref(grid), tensor_ref(spline_weight), margin=margin,
                     grid_eps=grid_eps, quantile_rule=quantile_rule)
    return grid, spline_weight


def kan_backward(plan, x, params, dy, need_dx=True, need_dparams=True, dparams=None,
                 accumulate=False, workspace=None):
    """Gradients of the loss given dy = dL/dy (y's shape): returns (dx, dparams) where dparams
    is {"base_weight", "spline_weight", and "spline_scaler" when the plan has one} (the grid gets
    none). dparams may be given (a mapping of arrays of the plan's dtype to write, or with
    accumulate=True to add into; a missing name is not computed); by default new arrays are made
    when need_dparams. dx is None unless need_dx."""
    x = as_array(x)
    dy = as_array(dy)
    p = _kan_params(plan, params)
    dt = _kan_dtype(plan)
    dx = np.empty(x.shape, dtype=dt) if need_dx else None
    if dparams is None and need_dparams:
        dparams = {n: np.empty(shape, dtype=dt) for n, shape in plan.param_info
                   if n in _KAN_GRADS}
    elif dparams is not None:
        dparams = {n: as_array(a) for n, a in dparams.items()}
    d = dparams or {}
    plan.backward(tensor_ref(x), tensor_ref(p["grid"]), tensor_ref(p["base_weight"]),
                  tensor_ref(p["spline_weight"]), tensor_ref(dy),
                  spline_scaler=tensor_ref(p["spline_scaler"]), dx=tensor_ref(dx),
                  dbase_weight=tensor_ref(d.get("base_weight")),
                  dspline_weight=tensor_ref(d.get("spline_weight")),
                  dspline_scaler=tensor_ref(d.get("spline_scaler")), accumulate=accumulate,
                  workspace=_workspace(workspace))
    return dx, dparams


# The 1.1 names, for KANLinear plans (they take KANConv2d plans as well).
kan_linear_uniform_grid = kan_uniform_grid
kan_linear_forward = kan_forward
kan_linear_backward = kan_backward
