"""Thin Python objects over kfuse's KAN layers: KANLinear (efficient-kan's layer), the
kf_kan_linear_* part of capi/include/kfuse.h, and KANConv2d (unfold + KANLinear as an implicit
GEMM), its kf_kan_conv2d_* part.

    plan = KanLinearPlan(ctx, in_features, out_features, grid_size=5, spline_order=3,
                         standalone_scale=True)
    plan = KanConv2dPlan(ctx, in_channels, out_channels, kernel_size, stride=1, padding=0,
                         dilation=1, grid_size=5, spline_order=3, standalone_scale=True)
    plan.param_info      [("base_weight", (out, F)), ("spline_weight", (out, F, G+k)),
                          ("spline_scaler", (out, F)), ("grid", (F, G+2k+1))]
                         (efficient-kan's state_dict order: parameters, then the grid buffer;
                         F = in_features, or in_channels * kh * kw for the convolution)
    plan.uniform_grid(lo, hi, grid)
    plan.update_grid(x, grid, spline_weight, margin=0.01, grid_eps=0.02,
                     quantile_rule=QUANTILES_TORCH1)
    plan.output_shape(x_shape)                     y's shape for an x of that shape
    plan.workspace_size(N) / plan.workspace_size(batch, height, width)
    plan.forward(x, grid, base_weight, spline_weight, y, spline_scaler=None,
                 input_weight=None, derivative_order=0)      (the last two: KANLinear only)
    plan.backward(x, grid, base_weight, spline_weight, dy, spline_scaler=None, dx=None,
                  dbase_weight=None, dspline_weight=None, dspline_scaler=None,
                  input_weight=None, dinput_weight=None, derivative_order=0)

As in kfuse._lowlevel and kfuse.sklinear, tensors are torch tensors, numpy arrays, TensorRefs or
raw (ptr, kf_dtype, shape, strides) tuples (None = absent), each held by the method until the C
call returns, and nothing is validated or computed here: every check is the
library's, and a failing status becomes a KfuseError subclass with the library's message. The
GIL is released during each C call. The numpy front end is kfuse.numpy.kan_linear_*; the PyTorch
drop-ins are kfuse.torch.KANLinear and kfuse.torch.KANConv2d.
"""
from kfuse._lowlevel import (
    DTYPE_F32, InvalidArgument, _buffer, _fill_tensor, _Plan, check, ffi, lib, param_list,
    remembered,
)
from kfuse.sklinear import _fill_args, _packed_layout

__all__ = ["KanLinearPlan", "KanConv2dPlan", "PARAM_NAMES", "QUANTILES_TORCH1",
           "QUANTILES_TORCH2"]

# update_grid's quantile indices as torch 1.13's or torch 2.x's int64 linspace picks them
# (kf_kan_quantile_rule).
QUANTILES_TORCH1 = lib.KF_KAN_QUANTILES_TORCH1  #: torch 1.13's (KF_KAN_QUANTILES_TORCH1)
QUANTILES_TORCH2 = lib.KF_KAN_QUANTILES_TORCH2  #: torch >= 2.0's (KF_KAN_QUANTILES_TORCH2)

#: efficient-kan's parameter and buffer names, in its state_dict order (parameters, then buffers).
PARAM_NAMES = ("base_weight", "spline_weight", "spline_scaler", "grid")

# The forward and backward argument structs of both layers hold the same kf_tensor fields.
_FWD_FIELDS = ("x", "grid", "base_weight", "spline_weight", "spline_scaler", "y")
_BWD_FIELDS = ("x", "grid", "base_weight", "spline_weight", "spline_scaler", "dy", "dx",
               "dbase_weight", "dspline_weight", "dspline_scaler")

# KANLinear's structs append (since 1.9) the input weight (and the backward's dinput_weight) and
# the derivative order, set on every call.
_LIN_FWD_FIELDS = _FWD_FIELDS + ("input_weight",)
_LIN_BWD_FIELDS = _BWD_FIELDS + ("input_weight", "dinput_weight")

_FWD_STRUCT = _packed_layout("kf_kan_linear_forward_args", _LIN_FWD_FIELDS)
_BWD_STRUCT = _packed_layout("kf_kan_linear_backward_args", _LIN_BWD_FIELDS)
_CONV_FWD_STRUCT = _packed_layout("kf_kan_conv2d_forward_args", _FWD_FIELDS)
_CONV_BWD_STRUCT = _packed_layout("kf_kan_conv2d_backward_args", _BWD_FIELDS)


def _pair(v, name, owner="kfuse.KanConv2dPlan"):
    """An int or a pair of ints (torch.nn.Conv2d's convention) as a 2-tuple of ints; the values
    are the library's to check."""
    if isinstance(v, str):
        raise ValueError("%s: %s must be an int or a pair of ints, got %r (string paddings such "
                         "as 'same' are not supported)" % (owner, name, v))
    if isinstance(v, (tuple, list)):
        if len(v) != 2:
            raise ValueError("%s: %s must be an int or a pair of ints, got %r" % (owner, name, v))
        return int(v[0]), int(v[1])
    return int(v), int(v)


class _KanPlan(_Plan):
    """What KanLinearPlan and KanConv2dPlan share: the kf_kan_<layer>_* calls that differ only
    by prefix, the KAN fields of the desc, and the parameter layout over F features."""

    _prefix = None       # "kf_kan_linear" or "kf_kan_conv2d"
    _structs = None      # (forward args layout, backward args layout)
    _fields = (_FWD_FIELDS, _BWD_FIELDS)  # the kf_tensor fields of those structs

    def _args_of(self, direction, tensors, extra, order):
        """The filled args struct of `direction` ("forward" 0 or "backward" 1) for `tensors`, plus
        `extra` (the input weight tensors) and the derivative order where the layer's struct has
        them (KANLinear, since 1.9); elsewhere they must be absent."""
        p, fields = self._prefix, self._fields[direction]
        name = p + ("_forward_args", "_backward_args")[direction]
        if len(fields) == len(tensors):
            if order or any(t is not None for t in extra):
                raise ValueError("kfuse: %s takes no input weight or derivative order" % name)
            extra = ()
        args = _fill_args(self._args, name, getattr(lib, name + "_init"),
                          self._structs[direction], fields, tuple(tensors) + tuple(extra))
        if extra:
            args.derivative_order = int(order)
        return args

    def _create(self, ctx, grid_size, spline_order, standalone_scale, dtype, fill):
        def fill_all(desc):
            fill(desc)
            desc.grid_size = int(grid_size)
            desc.spline_order = int(spline_order)
            desc.standalone_scale = 1 if standalone_scale else 0
            desc.dtype = int(dtype)

        self._make_plan(ctx, fill_all)
        self.grid_size = int(grid_size)
        self.spline_order = int(spline_order)
        self.standalone_scale = bool(standalone_scale)
        self.dtype = int(dtype)
        # [(name, shape), ...] of the layer's tensors (kf_kan_<layer>_param_info) in
        # efficient-kan's state_dict order: base_weight, spline_weight, spline_scaler when the
        # plan has a standalone scale, then the grid buffer
        p = self._prefix
        self.param_info = param_list(getattr(lib, p + "_param_count"),
                                     getattr(lib, p + "_param_info"), self._ptr, PARAM_NAMES)
        self._shapes = dict(self.param_info)

    @property
    def num_coeffs(self):
        """C = G + k coefficients per (output, input feature) pair (the library's shape of
        spline_weight)."""
        return self._shapes["spline_weight"][2]

    @property
    def num_knots(self):
        """G + 2k + 1 knots per input feature (the library's shape of the grid)."""
        return self._shapes["grid"][1]

    @property
    def param_names(self):
        return [n for n, _ in self.param_info]

    def uniform_grid(self, lo, hi, grid):
        """kf_kan_<layer>_uniform_grid: writes efficient-kan's initial knots
        lo + (j - k) (hi - lo) / G into every row of `grid` [F, G + 2k + 1] (a tensor, array,
        TensorRef or tuple; memory of the context's device), with the bits torch gives that
        buffer."""
        t = ffi.new("kf_tensor *")
        _fill_tensor(t, grid, "grid")
        check(getattr(lib, self._prefix + "_uniform_grid")(self._ptr, float(lo), float(hi), t))

    def update_grid(self, x, grid, spline_weight, margin=0.01, grid_eps=0.02,
                    quantile_rule=QUANTILES_TORCH1):
        """kf_kan_<layer>_update_grid (efficient-kan's update_grid): new knots in `grid` from the
        samples x (as forward takes it; for the convolution, its patches) and `spline_weight`
        refitted in float64 so that its splines on the new knots reproduce, on the samples, those
        on the old ones (minimum-norm least squares by SVD). Both are written in place, and only
        on success. `quantile_rule` (QUANTILES_TORCH1 or QUANTILES_TORCH2) picks whose torch's
        int64 linspace gives the quantile indices, as efficient-kan gets them from the torch it
        runs on. Not a hot path: it synchronises and computes on the host. Tensors as for
        forward()."""
        args = ffi.new("kf_kan_update_grid_args *")
        lib.kf_kan_update_grid_args_init(args)
        for field, t in (("x", x), ("grid", grid), ("spline_weight", spline_weight)):
            _fill_tensor(getattr(args, field), t, field)
        args.margin = float(margin)
        args.grid_eps = float(grid_eps)
        args.quantile_rule = int(quantile_rule)
        check(getattr(lib, self._prefix + "_update_grid")(self._ptr, args))

    def _workspace_bytes(self, *dims):
        ws = ffi.new("size_t *")
        check(getattr(lib, self._prefix + "_workspace_size")(self._ptr, *(int(d) for d in dims),
                                                             ws))
        return int(ws[0])

    def forward(self, x, grid, base_weight, spline_weight, y, spline_scaler=None,
                workspace=None, input_weight=None, derivative_order=0):
        """kf_kan_<layer>_forward: y from x (see the class). Tensors: torch tensors, numpy arrays,
        TensorRefs or raw (ptr, kf_dtype, shape, strides) tuples, None = absent; each is held
        until the call returns. `workspace` is a uint8 tensor or array, a raw (ptr, nbytes) pair
        or None (the context's arena). KANLinear only (since 1.9): `input_weight` (x's shape)
        and `derivative_order` m give y = sum_i w phi^(m)(x) (kf_kan_linear_forward_args).
        Releases the GIL."""
        p = self._prefix
        args = self._args_of(0, (x, grid, base_weight, spline_weight, spline_scaler, y),
                             (input_weight,), derivative_order)
        ws, ws_bytes = _buffer(workspace, "workspace")
        check(getattr(lib, p + "_forward")(self._ptr, args, ws, ws_bytes))

    def backward(self, x, grid, base_weight, spline_weight, dy, spline_scaler=None, dx=None,
                 dbase_weight=None, dspline_weight=None, dspline_scaler=None,
                 accumulate=False, workspace=None, input_weight=None, dinput_weight=None,
                 derivative_order=0):
        """kf_kan_<layer>_backward: dx (always overwritten), dbase_weight, dspline_weight,
        dspline_scaler (written, or added to with accumulate=True); each output may be None
        (its work is skipped). The grid gets no gradient. KANLinear only (since 1.9): the
        backward of forward() at `input_weight` w and `derivative_order` m, with dx = w
        sum_o dy phi^(m+1) and `dinput_weight` = sum_o dy phi^(m) (x's shape, overwritten).
        Tensors as for forward(). Releases the GIL."""
        p = self._prefix
        args = self._args_of(1, (x, grid, base_weight, spline_weight, spline_scaler, dy, dx,
                                 dbase_weight, dspline_weight, dspline_scaler),
                             (input_weight, dinput_weight), derivative_order)
        ws, ws_bytes = _buffer(workspace, "workspace")
        grad_mode = lib.KF_GRAD_ACCUMULATE if accumulate else lib.KF_GRAD_OVERWRITE
        check(getattr(lib, p + "_backward")(self._ptr, grad_mode, args, ws, ws_bytes))


class KanLinearPlan(_KanPlan):
    """A kf_kan_linear_plan bound to a Context, which it keeps alive.

    KanLinearPlan(ctx, in_features, out_features, grid_size=5, spline_order=3,
                  standalone_scale=True, dtype=DTYPE_F32). Descriptor checks are the library's
    (InvalidArgument naming the field; Unsupported for a dtype other than DTYPE_F32 and, on a CPU
    context, DTYPE_F64).
    forward/backward: x [..., in] -> y [..., out]."""

    _prefix = "kf_kan_linear"
    _structs = (_FWD_STRUCT, _BWD_STRUCT)
    _fields = (_LIN_FWD_FIELDS, _LIN_BWD_FIELDS)

    def __init__(self, ctx, in_features, out_features, grid_size=5, spline_order=3,
                 standalone_scale=True, dtype=DTYPE_F32):
        def fill(desc):
            desc.in_features = int(in_features)
            desc.out_features = int(out_features)

        self._create(ctx, grid_size, spline_order, standalone_scale, dtype, fill)
        self.in_features = int(in_features)
        self.out_features = int(out_features)

    def workspace_size(self, N):
        """Bytes of scratch workspace forward() and backward() need for N rows
        (kf_kan_linear_workspace_size)."""
        return self._workspace_bytes(N)

    def output_shape(self, x_shape):
        """y's shape [..., out] for an x of shape [..., in]; None where the library is to report
        x (a 0-d x)."""
        x_shape = tuple(x_shape)
        return x_shape[:-1] + (self.out_features,) if x_shape else None

    def work_dims(self, x_shape):
        """workspace_size()'s arguments for an x of this shape: (N,), or None for an empty batch
        of the right width (the library takes N >= 1; the front ends handle it)."""
        x_shape = tuple(x_shape)
        n = 1
        for d in x_shape[:-1]:
            n *= d
        if len(x_shape) >= 2 and x_shape[-1] == self.in_features and n == 0:
            return None
        return (n,)

    def __repr__(self):
        return ("kfuse.KanLinearPlan(in_features=%d, out_features=%d, grid_size=%d, "
                "spline_order=%d, standalone_scale=%r)" % (
                    self.in_features, self.out_features, self.grid_size, self.spline_order,
                    self.standalone_scale))


class KanConv2dPlan(_KanPlan):
    """A kf_kan_conv2d_plan bound to a Context, which it keeps alive: KANConv2d, the patches of
    torch.nn.functional.unfold (kernel, stride, zero padding, dilation as torch.nn.Conv2d) through
    a KANLinear over F = in_channels * kh * kw features, as an implicit GEMM.

    KanConv2dPlan(ctx, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                  grid_size=5, spline_order=3, standalone_scale=True, dtype=DTYPE_F32);
    kernel_size, stride, padding and dilation are ints or (h, w) pairs. Descriptor checks are the
    library's. forward/backward: x [B, C_in, H, W] -> y [B, C_out, Ho, Wo] (or [C_in, H, W] ->
    [C_out, Ho, Wo]). The parameters are KANLinear's over F features (param_info), with the
    feature order (c * kh + i) * kw + j of unfold."""

    _prefix = "kf_kan_conv2d"
    _structs = (_CONV_FWD_STRUCT, _CONV_BWD_STRUCT)

    def __init__(self, ctx, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 dilation=1, grid_size=5, spline_order=3, standalone_scale=True,
                 dtype=DTYPE_F32):
        kh, kw = _pair(kernel_size, "kernel_size")
        sh, sw = _pair(stride, "stride")
        ph, pw = _pair(padding, "padding")
        dh, dw = _pair(dilation, "dilation")

        def fill(desc):
            desc.in_channels = int(in_channels)
            desc.out_channels = int(out_channels)
            desc.kernel_h, desc.kernel_w = kh, kw
            desc.stride_h, desc.stride_w = sh, sw
            desc.pad_h, desc.pad_w = ph, pw
            desc.dilation_h, desc.dilation_w = dh, dw

        self._create(ctx, grid_size, spline_order, standalone_scale, dtype, fill)
        self.in_channels = int(in_channels)
        self.out_channels = int(out_channels)
        self.kernel_size = (kh, kw)
        self.stride = (sh, sw)
        self.padding = (ph, pw)
        self.dilation = (dh, dw)
        self.in_features = self._shapes["grid"][0]   # F = in_channels * kh * kw
        self.out_features = self.out_channels
        self._hw = {}  # (height, width) -> output_hw()

    def output_hw(self, height, width):
        """(Ho, Wo) of a height x width image, as torch.nn.Conv2d forms them
        (kf_kan_conv2d_output_size; remembered per (height, width)). An image smaller than the
        kernel's reach raises InvalidArgument naming the extent."""
        return remembered(self._hw, (int(height), int(width)), self._output_hw)

    def _output_hw(self, height, width):
        ho = ffi.new("int64_t *")
        wo = ffi.new("int64_t *")
        check(lib.kf_kan_conv2d_output_size(self._ptr, height, width, ho, wo))
        return int(ho[0]), int(wo[0])

    def output_shape(self, x_shape):
        """y's shape [B, C_out, Ho, Wo] (or [C_out, Ho, Wo]) for x [B, C_in, H, W] (or
        [C_in, H, W]); None where x's rank or size is for the library to report."""
        x_shape = tuple(x_shape)
        if len(x_shape) not in (3, 4):
            return None
        try:
            ho, wo = self.output_hw(x_shape[-2], x_shape[-1])
        except InvalidArgument:
            return None
        return x_shape[:-3] + (self.out_channels, ho, wo)

    def workspace_size(self, batch, height, width):
        """Bytes of scratch workspace forward() and backward() need for `batch` images of
        height x width (kf_kan_conv2d_workspace_size; batch 1 for an unbatched x)."""
        return self._workspace_bytes(batch, height, width)

    def work_dims(self, x_shape):
        """workspace_size()'s arguments for an x of this shape: (batch, H, W), or None for an
        empty batch [0, C_in, H, W] that has an output (the front ends handle it, as
        torch.nn.Conv2d takes one)."""
        x_shape = tuple(x_shape)
        if len(x_shape) == 4:
            if x_shape[0] == 0 and x_shape[1] == self.in_channels \
                    and self.output_shape(x_shape) is not None:
                return None
            return x_shape[0], x_shape[2], x_shape[3]
        if len(x_shape) == 3:
            return 1, x_shape[1], x_shape[2]
        return 1, 1, 1

    def __repr__(self):
        return ("kfuse.KanConv2dPlan(in_channels=%d, out_channels=%d, kernel_size=%r, "
                "stride=%r, padding=%r, dilation=%r, grid_size=%d, spline_order=%d, "
                "standalone_scale=%r)" % (
                    self.in_channels, self.out_channels, self.kernel_size, self.stride,
                    self.padding, self.dilation, self.grid_size, self.spline_order,
                    self.standalone_scale))
