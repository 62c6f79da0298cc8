"""Thin Python object over kfuse's KAN linear layer (KANLinear, efficient-kan's layer): the
kf_kan_linear_* part of capi/include/kfuse.h.

    plan = KanLinearPlan(ctx, in_features, out_features, grid_size=5, spline_order=3,
                         standalone_scale=True)
    plan.param_info      [("base_weight", (out, in)), ("spline_weight", (out, in, G+k)),
                          ("spline_scaler", (out, in)), ("grid", (in, G+2k+1))]
                         (efficient-kan's state_dict order: parameters, then the grid buffer)
    plan.uniform_grid(lo, hi, grid)
    plan.forward(x, grid, base_weight, spline_weight, y, spline_scaler=None)
    plan.backward(x, grid, base_weight, spline_weight, dy, spline_scaler=None, dx=None,
                  dbase_weight=None, dspline_weight=None, dspline_scaler=None)

As in kfuse._lowlevel and kfuse.sklinear, tensors are TensorRefs or (ptr, kf_dtype, shape,
strides) tuples (None = absent) and nothing is validated or computed here: every check is the
library's, and a failing status becomes a KfuseError subclass with the library's message. The
GIL is released during each C call. The numpy front end is kfuse.numpy.kan_linear_*; the PyTorch
drop-in is kfuse.torch.KANLinear.
"""
from kfuse._lowlevel import DTYPE_F32, TensorRef, _buffer, _fill_tensor, check, ffi, lib
from kfuse.sklinear import _fill_args, _packed_layout

__all__ = ["KanLinearPlan", "PARAM_NAMES"]

# efficient-kan's parameter and buffer names, in its state_dict order (parameters, then buffers).
PARAM_NAMES = ("base_weight", "spline_weight", "spline_scaler", "grid")

_FWD_FIELDS = ("x", "grid", "base_weight", "spline_weight", "spline_scaler", "y")
_BWD_FIELDS = ("x", "grid", "base_weight", "spline_weight", "spline_scaler", "dy", "dx",
               "dbase_weight", "dspline_weight", "dspline_scaler")

_FWD_STRUCT = _packed_layout("kf_kan_linear_forward_args", _FWD_FIELDS)
_BWD_STRUCT = _packed_layout("kf_kan_linear_backward_args", _BWD_FIELDS)


class KanLinearPlan:
    """A kf_kan_linear_plan bound to a Context, which it keeps alive.

    KanLinearPlan(ctx, in_features, out_features, grid_size=5, spline_order=3,
                  standalone_scale=True, dtype=DTYPE_F32). Descriptor checks are the library's
    (InvalidArgument naming the field; Unsupported for a dtype other than f32)."""

    def __init__(self, ctx, in_features, out_features, grid_size=5, spline_order=3,
                 standalone_scale=True, dtype=DTYPE_F32):
        desc = ffi.new("kf_kan_linear_desc *")
        lib.kf_kan_linear_desc_init(desc)
        desc.in_features = int(in_features)
        desc.out_features = int(out_features)
        desc.grid_size = int(grid_size)
        desc.spline_order = int(spline_order)
        desc.standalone_scale = 1 if standalone_scale else 0
        desc.dtype = int(dtype)
        out = ffi.new("kf_kan_linear_plan **")
        check(lib.kf_kan_linear_plan_create(ctx.ptr, desc, out))
        ctx_ptr = ctx.ptr  # the closure keeps the context alive until the plan is destroyed

        def _destroy(p, _ctx=ctx_ptr):
            lib.kf_kan_linear_plan_destroy(p)

        self._ptr = ffi.gc(out[0], _destroy)
        self.ctx = ctx
        self.in_features = int(in_features)
        self.out_features = int(out_features)
        self.grid_size = int(grid_size)
        self.spline_order = int(spline_order)
        self.standalone_scale = bool(standalone_scale)
        self.dtype = int(dtype)

    @property
    def num_coeffs(self):
        """C = G + k coefficients per (output, input) pair."""
        return self.grid_size + self.spline_order

    @property
    def num_knots(self):
        """G + 2k + 1 knots per input feature."""
        return self.grid_size + 2 * self.spline_order + 1

    @property
    def param_info(self):
        """[(name, shape), ...] of the layer's tensors in efficient-kan's state_dict order
        (base_weight, spline_weight, spline_scaler when the plan has a standalone scale, then the
        grid buffer)."""
        i, o = self.in_features, self.out_features
        shapes = {"base_weight": (o, i), "spline_weight": (o, i, self.num_coeffs),
                  "spline_scaler": (o, i), "grid": (i, self.num_knots)}
        return [(n, shapes[n]) for n in PARAM_NAMES
                if n != "spline_scaler" or self.standalone_scale]

    @property
    def param_names(self):
        return [n for n, _ in self.param_info]

    def workspace_size(self, N):
        """Bytes of scratch workspace forward() and backward() need for N rows
        (kf_kan_linear_workspace_size)."""
        ws = ffi.new("size_t *")
        check(lib.kf_kan_linear_workspace_size(self._ptr, int(N), ws))
        return int(ws[0])

    def uniform_grid(self, lo, hi, grid):
        """kf_kan_linear_uniform_grid: writes efficient-kan's initial knots
        lo + (j - k) (hi - lo) / G into every row of `grid` [in, G + 2k + 1] (a TensorRef or
        tuple; memory of the context's device), with the bits torch gives that buffer."""
        t = ffi.new("kf_tensor *")
        _fill_tensor(t, TensorRef(*grid) if isinstance(grid, tuple) else grid)
        check(lib.kf_kan_linear_uniform_grid(self._ptr, float(lo), float(hi), t))

    def forward(self, x, grid, base_weight, spline_weight, y, spline_scaler=None,
                workspace=None):
        """kf_kan_linear_forward: y [..., out] from x [..., in]. Tensors: TensorRefs or
        (ptr, kf_dtype, shape, strides) tuples, None = absent. `workspace` is a (ptr, nbytes)
        pair or None (the context's arena). Releases the GIL."""
        args = _fill_args("kf_kan_linear_forward_args", lib.kf_kan_linear_forward_args_init,
                          _FWD_STRUCT, _FWD_FIELDS,
                          (x, grid, base_weight, spline_weight, spline_scaler, y))
        ws, ws_bytes = _buffer(workspace)
        check(lib.kf_kan_linear_forward(self._ptr, args, ws, ws_bytes))

    def backward(self, x, grid, base_weight, spline_weight, dy, spline_scaler=None, dx=None,
                 dbase_weight=None, dspline_weight=None, dspline_scaler=None,
                 accumulate=False, workspace=None):
        """kf_kan_linear_backward: dx (always overwritten), dbase_weight, dspline_weight,
        dspline_scaler (written, or added to with accumulate=True); each output may be None
        (its work is skipped). The grid gets no gradient. Tensors as for forward(). Releases
        the GIL."""
        args = _fill_args("kf_kan_linear_backward_args", lib.kf_kan_linear_backward_args_init,
                          _BWD_STRUCT, _BWD_FIELDS,
                          (x, grid, base_weight, spline_weight, spline_scaler, dy, dx,
                           dbase_weight, dspline_weight, dspline_scaler))
        ws, ws_bytes = _buffer(workspace)
        grad_mode = lib.KF_GRAD_ACCUMULATE if accumulate else lib.KF_GRAD_OVERWRITE
        check(lib.kf_kan_linear_backward(self._ptr, grad_mode, args, ws, ws_bytes))

    def __repr__(self):
        return ("kfuse.KanLinearPlan(in_features=%d, out_features=%d, grid_size=%d, "
                "spline_order=%d, standalone_scale=%r)" % (
                    self.in_features, self.out_features, self.grid_size, self.spline_order,
                    self.standalone_scale))
