"""kfuse.torch.KANLinear (the drop-in for efficient_kan.KANLinear) and kfuse.torch.KANConv2d
(torch.nn.functional.unfold + efficient_kan.KANLinear), and their operators kfuse::kan_linear,
kfuse::kan_conv2d and their *_backward."""
import math

import torch
from torch import nn

from kfuse._lowlevel import dtype_code
from kfuse.kan import QUANTILES_TORCH1, QUANTILES_TORCH2, _pair
from kfuse.torch._common import (
    Op, autocast_now, check_devices, device_guard, empty_grad, module_attrs, plan, workspace,
)
from kfuse.torch.kan_deriv import _key, conv_double_backward, linear_double_backward

__all__ = ["KANLinear", "KANConv2d", "kan_linear_function", "kan_conv2d_function"]

_LAYERS = {"kan_linear": "KANLinear", "kan_conv2d": "KANConv2d"}
# efficient-kan's update_grid takes its quantile indices from this torch's int64 linspace
_QUANTILE_RULE = (QUANTILES_TORCH2 if int(torch.__version__.split(".")[0]) >= 2
                  else QUANTILES_TORCH1)
_TENSORS = ("grid", "base_weight", "spline_weight", "spline_scaler")
_RUN_ATTRS = ("base_activation",) + _TENSORS  # what _KANLayer._run reads


# ---- kernels -----------------------------------------------------------------------------------
#
# Both layers' operators share these kernels; `geometry` is () for KANLinear and
# (in_channels, kh, kw, sh, sw, ph, pw, dh, dw) for KANConv2d.

def _conv_geometry(spline_weight, kernel_size, stride, padding, dilation):
    kh, kw = kernel_size
    return (spline_weight.shape[1] // (kh * kw), kh, kw, *stride, *padding, *dilation)


def _forward_impl(geometry, x, grid, base_weight, spline_weight, spline_scaler):
    key = _key(geometry, grid, spline_weight, spline_scaler is not None)
    layer = _LAYERS[key[0]]
    tensors = (grid, base_weight, spline_weight, spline_scaler)
    check_devices(layer, x, _TENSORS, tensors)
    x, grid, spline_weight = x.contiguous(), grid.contiguous(), spline_weight.contiguous()
    base_weight = None if base_weight is None else base_weight.contiguous()
    spline_scaler = None if spline_scaler is None else spline_scaler.contiguous()
    device = x.device
    with device_guard(device):
        p = plan(key, device)
        y_shape = p.output_shape(x.shape)
        if y_shape is None:  # no output for such an x (its rank or size): the library reports it
            p.forward(x, grid, base_weight, spline_weight, None, spline_scaler=spline_scaler)
            raise ValueError("kfuse %s: no output shape for x of shape %s" % (
                layer, tuple(x.shape)))  # pragma: no cover
        y = x.new_empty(y_shape)
        dims = p.work_dims(x.shape)
        if dims is not None:  # None: an empty batch, for which y is empty too
            p.forward(x, grid, base_weight, spline_weight, y, spline_scaler=spline_scaler,
                      workspace=workspace(p, device, *dims))
    return y


def _forward_fake(geometry, x, grid, base_weight, spline_weight, spline_scaler):
    out = spline_weight.shape[0]
    if geometry:
        if x.dim() in (3, 4):
            # the library's output size (kf_kan_conv2d_output_size) takes concrete sizes: under
            # symbolic shapes the plan's sizes and the image's H and W are specialised (int())
            key = tuple(int(v) if isinstance(v, torch.SymInt) else v
                        for v in _key(geometry, grid, spline_weight, spline_scaler is not None))
            ho, wo = plan(key, torch.device("cpu")).output_hw(int(x.shape[-2]),
                                                              int(x.shape[-1]))
            return x.new_empty(x.shape[:-3] + (out, ho, wo))
    elif x.dim() >= 1:
        return x.new_empty(x.shape[:-1] + (out,))
    raise ValueError("kfuse %s: no output shape for x of shape %s"
                     % ("KANConv2d" if geometry else "KANLinear", tuple(x.shape)))


def _grads(x, base_weight, spline_weight, spline_scaler, output_mask):
    dx, dbw, dsw, dss = output_mask
    return (empty_grad(x, dx), _optional_grad(base_weight, dbw, spline_weight),
            empty_grad(spline_weight, dsw), _optional_grad(spline_scaler, dss, spline_weight))


def _optional_grad(t, needed, like):
    """empty_grad() of an optional input; an absent one gets a fresh empty tensor like `like`."""
    return empty_grad(t, needed) if t is not None else like.new_empty((0,))


def _backward_impl(geometry, dy, x, grid, base_weight, spline_weight, spline_scaler,
                   output_mask):
    """(dx, dbase_weight, dspline_weight, dspline_scaler); an output not in output_mask is an
    empty tensor."""
    key = _key(geometry, grid, spline_weight, spline_scaler is not None)
    out = _grads(x, base_weight, spline_weight, spline_scaler, output_mask)
    want = [t if need else None for t, need in zip(out, output_mask)]
    if base_weight is None:
        want[1] = None
    if spline_scaler is None:
        want[3] = None
    device = x.device
    with device_guard(device):
        p = plan(key, device)
        dims = p.work_dims(x.shape)
        if dims is None:  # an empty batch (forward checked its shape): nothing flows back
            for t in want[1:]:
                if t is not None:
                    t.zero_()
            return out
        p.backward(x.contiguous(), grid.contiguous(),
                   None if base_weight is None else base_weight.contiguous(),
                   spline_weight.contiguous(), dy.contiguous(),
                   spline_scaler=None if spline_scaler is None else spline_scaler.contiguous(),
                   dx=want[0], dbase_weight=want[1], dspline_weight=want[2],
                   dspline_scaler=want[3], workspace=workspace(p, device, *dims))
    return out


def _backward_fake(geometry, dy, x, grid, base_weight, spline_weight, spline_scaler,
                   output_mask):
    return _grads(x, base_weight, spline_weight, spline_scaler, output_mask)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:5])
    ctx.geometry = inputs[5:]  # KANConv2d's kernel_size, stride, padding, dilation


def _make_backward(backward_op):
    def backward(ctx, dy):
        x, grid, base_weight, spline_weight, spline_scaler = ctx.saved_tensors
        need = ctx.needs_input_grad  # x, grid, base_weight, spline_weight, spline_scaler, ...
        mask = [bool(need[0]), bool(base_weight is not None and need[2]), bool(need[3]),
                bool(spline_scaler is not None and need[4])]
        nones = (None,) * (5 + len(ctx.geometry))
        if dy is None or not any(mask):
            return nones
        g = backward_op(dy, x, grid, base_weight, spline_weight, spline_scaler, *ctx.geometry,
                        mask)
        return (g[0] if mask[0] else None, None, g[1] if mask[1] else None,
                g[2] if mask[2] else None, g[3] if mask[3] else None) + nones[5:]
    return backward


_TENSOR_ARGS = "Tensor x, Tensor grid, Tensor? base_weight, Tensor spline_weight, " \
               "Tensor? spline_scaler"
_CONV_ARGS = "int[] kernel_size, int[] stride, int[] padding, int[] dilation"
_GRADS = "(Tensor, Tensor, Tensor, Tensor)"


def _linear(kernel):
    return lambda *args: kernel((), *args)


def _conv(kernel, backward=False):
    # the geometry arguments follow the tensors (and precede backward's output_mask)
    def call(*args):
        n = 6 if backward else 5
        tensors, (ks, st, pd, dl), rest = args[:n], args[n:n + 4], args[n + 4:]
        return kernel(_conv_geometry(tensors[-2], ks, st, pd, dl), *tensors, *rest)
    return call


kan_linear_backward = Op(
    "kan_linear_backward", "(Tensor dy, %s, bool[] output_mask) -> %s" % (_TENSOR_ARGS, _GRADS),
    _linear(_backward_impl), _linear(_backward_fake))
kan_linear = Op(
    "kan_linear", "(%s) -> Tensor" % _TENSOR_ARGS, _linear(_forward_impl),
    _linear(_forward_fake), _setup_context, _make_backward(kan_linear_backward), feature_dims=1,
    double_backward=linear_double_backward)
kan_conv2d_backward = Op(
    "kan_conv2d_backward",
    "(Tensor dy, %s, %s, bool[] output_mask) -> %s" % (_TENSOR_ARGS, _CONV_ARGS, _GRADS),
    _conv(_backward_impl, True), _conv(_backward_fake, True))
kan_conv2d = Op(
    "kan_conv2d", "(%s, %s) -> Tensor" % (_TENSOR_ARGS, _CONV_ARGS), _conv(_forward_impl),
    _conv(_forward_fake), _setup_context, _make_backward(kan_conv2d_backward), feature_dims=3,
    double_backward=conv_double_backward)


def kan_linear_function(x, grid, base_weight, spline_weight, spline_scaler=None):
    """Differentiable kfuse KANLinear call (the operator kfuse::kan_linear): y [..., out] from
    x [..., in]. Gradients flow to x, base_weight, spline_weight and spline_scaler; the grid gets
    none. base_weight None: no base term (the spline branch alone)."""
    return kan_linear(x, grid, base_weight, spline_weight, spline_scaler)


def kan_conv2d_function(x, grid, base_weight, spline_weight, spline_scaler, kernel_size,
                        stride=(1, 1), padding=(0, 0), dilation=(1, 1)):
    """Differentiable kfuse KANConv2d call (the operator kfuse::kan_conv2d): y [B, C_out, Ho, Wo]
    from x [B, C_in, H, W] (or the unbatched 3-D forms), with (h, w) pairs as torch.nn.Conv2d.
    Gradients flow to x, base_weight, spline_weight and spline_scaler; the grid gets none.
    base_weight None: no base term (the spline branch alone)."""
    return kan_conv2d(x, grid, base_weight, spline_weight, spline_scaler, list(kernel_size),
                      list(stride), list(padding), list(dilation))


def _kan_bases(x, grid, k):
    """B-spline bases [N, in, G + k] of order k of x [N, in] on the knots grid [in, nk], in x's
    dtype, with the library's conventions (kfuse.h): half-open knot intervals, 0 outside the
    grid (x is first moved to the last knot there, so every term stays finite), and a term over
    a knot span narrower than FLT_MIN counts as 0 (efficient-kan divides 0 by 0 there and gets
    NaN, which then breaks its least-squares refit). Materialises the bases: for the rare calls
    (initialisation, curve2coeff, b_splines), never for forward, backward or update_grid."""
    x = x.unsqueeze(-1)  # [N, in, 1]
    outside = (x < grid[:, :1]) | (x >= grid[:, -1:])
    x = torch.where(outside, grid[:, -1:].expand_as(x), x)
    bases = ((x >= grid[:, :-1]) & (x < grid[:, 1:])).to(x.dtype)
    tiny = torch.finfo(torch.float32).tiny
    for p in range(1, k + 1):
        w1 = grid[:, p:-1] - grid[:, :-(p + 1)]
        w2 = grid[:, p + 1:] - grid[:, 1:-p]
        inv1 = torch.where(w1 >= tiny, 1.0 / torch.where(w1 >= tiny, w1, torch.ones_like(w1)),
                           torch.zeros_like(w1))
        inv2 = torch.where(w2 >= tiny, 1.0 / torch.where(w2 >= tiny, w2, torch.ones_like(w2)),
                           torch.zeros_like(w2))
        bases = ((x - grid[:, :-(p + 1)]) * inv1 * bases[:, :, :-1]
                 + (grid[:, p + 1:] - x) * inv2 * bases[:, :, 1:])
    return bases


class _KANLayer(nn.Module):
    """What KANLinear and KANConv2d share: efficient-kan's KANLinear over `in_features` features
    (its tensors, initialisation, b_splines, curve2coeff, scaled_spline_weight,
    regularization_loss) and the calls into the library (forward, backward, update_grid). A
    subclass gives `plan_shape`, the head of its plan key (("kan_linear", in, out) or ("kan_conv2d", ...)),
    and its forward."""

    def __init__(self, plan_shape, in_features, out_features, grid_size, spline_order,
                 scale_noise, scale_base, scale_spline, enable_standalone_scale_spline,
                 base_activation, grid_eps, grid_range, device, dtype):
        factory_kwargs = {"device": device, "dtype": dtype}
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.grid_size = grid_size
        self.spline_order = spline_order
        self._plan_shape = tuple(plan_shape)
        self.enable_standalone_scale_spline = enable_standalone_scale_spline
        pdtype = dtype if dtype is not None else torch.get_default_dtype()
        # Descriptor checks are the library's (made and cached on the CPU context), and so are
        # the tensors' shapes (kf_kan_<layer>_param_info).
        shapes = dict(plan(self._key(pdtype), torch.device("cpu")).param_info)
        self.register_buffer("grid", torch.empty(shapes["grid"], **factory_kwargs))
        self._init_grid(grid_range[0], grid_range[1])
        self.base_weight = nn.Parameter(torch.empty(shapes["base_weight"], **factory_kwargs))
        self.spline_weight = nn.Parameter(torch.empty(shapes["spline_weight"],
                                                      **factory_kwargs))
        if enable_standalone_scale_spline:
            self.spline_scaler = nn.Parameter(torch.empty(shapes["spline_scaler"],
                                                          **factory_kwargs))
        self.scale_noise = scale_noise
        self.scale_base = scale_base
        self.scale_spline = scale_spline
        self.base_activation = base_activation()
        self.grid_eps = grid_eps
        self.reset_parameters()

    def _key(self, dtype):
        return self._plan_shape + (self.grid_size, self.spline_order,
                                   bool(self.enable_standalone_scale_spline),
                                   dtype_code(dtype))

    @torch.no_grad()
    def _init_grid(self, lo, hi):
        grid = self.grid
        if grid.device.type == "meta":
            return  # nothing to fill
        with device_guard(grid.device):
            plan(self._key(grid.dtype), grid.device).uniform_grid(lo, hi, grid)

    def reset_parameters(self):
        """efficient-kan's initialisation: base_weight kaiming_uniform_(a=sqrt(5)*scale_base);
        spline_weight the least-squares coefficients of noise U(-1/2, 1/2) * scale_noise / G at
        the G + 1 grid points (times scale_spline without a standalone scaler); spline_scaler
        kaiming_uniform_(a=sqrt(5)*scale_spline). The draws come from torch's default generator
        in efficient-kan's order (the noise on the CPU, as efficient-kan draws it)."""
        nn.init.kaiming_uniform_(self.base_weight, a=math.sqrt(5) * self.scale_base)
        with torch.no_grad():
            G, k = self.grid_size, self.spline_order
            noise = ((torch.rand(G + 1, self.in_features, self.out_features) - 1 / 2)
                     * self.scale_noise / G)
            if self.spline_weight.device.type != "meta":
                # the G + 1 knots of grid_range (efficient-kan's grid.T[k:-k], which is empty
                # for k = 0; here all G + 1 of them for every k)
                points = self.grid.T[k:k + G + 1]
                coeff = self.curve2coeff(points, noise.to(device=points.device,
                                                          dtype=self.spline_weight.dtype))
                scale = self.scale_spline if not self.enable_standalone_scale_spline else 1.0
                self.spline_weight.data.copy_(scale * coeff)
            if self.enable_standalone_scale_spline:
                nn.init.kaiming_uniform_(self.spline_scaler, a=math.sqrt(5) * self.scale_spline)

    def _check_x(self, x, what):
        if x.dim() != 2 or x.size(1) != self.in_features:
            raise ValueError("kfuse.torch.%s.%s: x must be [batch, in_features=%d], got %s"
                             % (type(self).__name__, what, self.in_features, tuple(x.shape)))

    def b_splines(self, x):
        """efficient-kan's b_splines (kept for API compatibility): the bases [batch, in, G + k]
        of x [batch, in] on the current grid (materialised; computed in float64 with kfuse's
        conventions, returned in x's dtype). The bases forward, backward and update_grid use are
        the library's own (common/bspline.h, inside the kernels); this materialised form is for
        callers of efficient-kan's API and for curve2coeff."""
        self._check_x(x, "b_splines")
        return _kan_bases(x.double(), self.grid.double(), self.spline_order).to(x.dtype)

    def curve2coeff(self, x, y):
        """efficient-kan's curve2coeff: coefficients [out, in, G + k] whose splines on the
        current grid fit y [batch, in, out] at x [batch, in] in the least-squares sense, per
        feature. Returned in y's dtype on y's device.

        The solve differs from efficient-kan's on purpose: its torch.linalg.lstsq on float32
        bases (default driver, gelsy on CPU) returns NaN or fails (LAPACK's SGELSY error,
        efficient-kan issue #20) when the bases hold NaN (0/0 over repeated knots, as after
        update_grid with grid_eps=0 on a batch with repeated values), and is poorly conditioned
        in float32 when knots are a hair apart. Here the bases are computed in float64 with
        kfuse's conventions (a zero-width span gives 0, never NaN) and the systems are solved on
        the CPU in float64 by torch.linalg.lstsq(driver="gelsd"): an SVD-based solver that
        handles rank-deficient systems (a basis no sample touches, fewer samples than
        coefficients) by returning the minimum-norm solution, as gelsy does where gelsy works."""
        self._check_x(x, "curve2coeff")
        if tuple(y.shape) != (x.size(0), self.in_features, self.out_features):
            raise ValueError("kfuse.torch.KANLinear.curve2coeff: y must be [batch, in, out] = "
                             "%s, got %s" % ((x.size(0), self.in_features, self.out_features),
                                             tuple(y.shape)))
        cpu = torch.device("cpu")
        A = _kan_bases(x.to(device=cpu, dtype=torch.float64),
                       self.grid.to(device=cpu, dtype=torch.float64), self.spline_order)
        A = A.transpose(0, 1)  # [in, batch, G + k]
        B = y.to(device=cpu, dtype=torch.float64).transpose(0, 1)  # [in, batch, out]
        solution = torch.linalg.lstsq(A, B, driver="gelsd").solution  # [in, G + k, out]
        return solution.permute(2, 0, 1).contiguous().to(device=y.device, dtype=y.dtype)

    @property
    def scaled_spline_weight(self):
        """spline_weight * spline_scaler[..., None] (spline_weight without a standalone scaler)."""
        return self.spline_weight * (self.spline_scaler.unsqueeze(-1)
                                     if self.enable_standalone_scale_spline else 1.0)

    def _run(self, x):
        """y from x through the layer's operator. With base_activation SiLU the library computes
        both branches; with another activation module the base branch base_activation(x) times
        base_weight is computed in torch (self._base_branch) and the spline branch by the library
        with no base_weight (no base term), so autograd gives every gradient either way.
        Parameters by attribute, so that functional_call and parametrizations give theirs."""
        act, grid, bw, sw, *ss = module_attrs(
            self, _PLAIN_LAYERS, _RUN_ATTRS if self.enable_standalone_scale_spline
            else _RUN_ATTRS[:-1])
        ss = ss[0] if ss else None
        # Under autocast the layer computes in its parameters' dtype and returns the autocast
        # dtype: the knots must not be rounded to it (efficient-kan's B-splines are no autocast
        # ops and keep float32 knots; in bfloat16 the knots of a grid away from 0, or of many
        # intervals, collide: 10-50x efficient-kan's error measured). float64 is left alone.
        cast = autocast_now(x) if sw.dtype != torch.float64 else None
        if cast is not None:
            x = x.to(sw.dtype)
        if type(act) is nn.SiLU:
            y = self._op(x, grid, bw, sw, ss)
        else:
            y = self._base_branch(x, bw) + self._op(x, grid, None, sw, ss)
        return y if cast is None else y.to(cast)

    @torch.no_grad()
    def update_grid(self, x, margin=0.01):
        """efficient-kan's grid update, by the library (kf_kan_linear_update_grid or
        kf_kan_conv2d_update_grid, the one implementation every front end shares): per feature,
        new knots grid_eps * uniform + (1 - grid_eps) * quantiles of the samples (G + 1 of them,
        the uniform ones on [min - margin, max + margin]) extended by k uniform steps each side,
        formed in the parameters' dtype exactly as efficient-kan forms them with the torch in use
        (whose int64 linspace picks the quantile indices: torch 1.13's and 2.x's differ; margin
        and grid_eps reach the library as float32 values, 0.01 as 0.0099999998, which in a
        float64 layer moves the knots by about 1e-9 from efficient-kan's); then spline_weight is
        refitted in float64 (minimum-norm least squares by SVD, which does not fail where
        efficient-kan's float32 lstsq does) so that the splines on the new knots reproduce, on
        the samples, the splines on the old knots. The samples are the rows of x [batch, in]
        for KANLinear, the patches of x for KANConv2d (see there).

        One deliberate difference: efficient-kan refits spline_weight to the output of the
        *scaled* weights (spline_weight * spline_scaler) and then multiplies by spline_scaler
        again in forward, so with enable_standalone_scale_spline=True its update changes the
        layer's output by that factor. Here the fit targets the splines of spline_weight itself,
        so the output on x is preserved in both modes; without a standalone scaler this is
        exactly efficient-kan's update. Non-finite values in x are an InvalidArgument (a
        ValueError) naming the first one; nothing is written then."""
        self._check_update_x(x)
        x = x.detach().to(dtype=self.spline_weight.dtype).contiguous()
        check_devices(type(self).__name__, x, ("grid", "spline_weight"),
                      (self.grid, self.spline_weight))
        grid, sw = self.grid, self.spline_weight.data
        # the library writes in place; a non-contiguous tensor gets a contiguous stand-in
        g = grid if grid.is_contiguous() else grid.contiguous()
        w = sw if sw.is_contiguous() else sw.contiguous()
        device = x.device
        with device_guard(device):
            plan(self._key(w.dtype), device).update_grid(x, g, w, margin=margin,
                                                         grid_eps=self.grid_eps,
                                                         quantile_rule=_QUANTILE_RULE)
        if g is not grid:
            grid.copy_(g)
        if w is not sw:
            sw.copy_(w)

    def _check_update_x(self, x):
        self._check_x(x, "update_grid")

    def regularization_loss(self, regularize_activation=1.0, regularize_entropy=1.0):
        """efficient-kan's regularisation: with l1 = mean |spline_weight| over the coefficients
        [out, in], regularize_activation * sum(l1) + regularize_entropy * entropy(l1 / sum(l1))."""
        l1_fake = self.spline_weight.abs().mean(-1)
        regularization_loss_activation = l1_fake.sum()
        p = l1_fake / regularization_loss_activation
        regularization_loss_entropy = -torch.sum(p * p.log())
        return (regularize_activation * regularization_loss_activation
                + regularize_entropy * regularization_loss_entropy)


class KANLinear(_KANLayer):
    """Drop-in for efficient_kan.KANLinear: KANLinear(in_features, out_features, grid_size=5,
    spline_order=3, scale_noise=0.1, scale_base=1.0, scale_spline=1.0,
    enable_standalone_scale_spline=True, base_activation=torch.nn.SiLU, grid_eps=0.02,
    grid_range=[-1, 1], device=None, dtype=None).

    Same tensors as efficient-kan's (Parameters base_weight [out, in], spline_weight
    [out, in, G + k] and, with enable_standalone_scale_spline, spline_scaler [out, in]; the
    buffer grid [in, G + 2k + 1]), so load_state_dict(strict=True) works both ways; same
    forward: x [..., in] with any leading dims -> [..., out] (a 1-D x gives a 1-D y):

        y = SiLU(x) base_weight^T + B(x) (spline_weight * spline_scaler[..., None])^T

    computed by kfuse with the B-spline bases built inside the product, never stored for the
    batch; backward gives the gradients of x, base_weight, spline_weight and spline_scaler (none
    for the grid). Where efficient-kan computes 0/0 or inf*0 (repeated knots, |x| near 1e38)
    kfuse gives the mathematical value (kfuse.h). base_activation is any activation module class,
    as in efficient-kan: SiLU is computed inside the library; with another the base branch
    base_activation(x) base_weight^T is computed in torch and the spline branch by kfuse. The
    module follows its parameters' dtype: float32, bfloat16 or float16 (.bfloat16(), .half():
    storage in the type, float32 arithmetic), or float64 (dtype=torch.float64, .double(); on
    CUDA since kfuse 1.7); another dtype raises kfuse.Unsupported, and an input of another
    dtype than the parameters' a kfuse.InvalidArgument naming it. Autocast: under
    torch.autocast (CPU or CUDA, bfloat16 or float16) the layer computes in its parameters'
    dtype (x cast to it) and returns the autocast dtype: efficient-kan's B-splines keep float32
    knots under autocast, and knots rounded to bfloat16 collide on grids away from 0 or with
    many intervals; a float64 module is left alone; docs/precision.md.

    The initial grid comes from kf_kan_linear_uniform_grid (the same bits as efficient-kan's
    buffer); reset_parameters draws as efficient-kan does, from torch's default generator in the
    same order (kaiming_uniform_ base_weight, the noise, kaiming_uniform_ spline_scaler), so
    torch.manual_seed() gives efficient-kan's base_weight and spline_scaler exactly and its
    spline_weight up to the least-squares solver. update_grid(x, margin=0.01),
    curve2coeff(x, y), b_splines(x), scaled_spline_weight and regularization_loss(...) are
    efficient-kan's, computed in torch (see update_grid and curve2coeff for the two places
    where they deliberately differ)."""

    def __init__(self, in_features, out_features, grid_size=5, spline_order=3, scale_noise=0.1,
                 scale_base=1.0, scale_spline=1.0, enable_standalone_scale_spline=True,
                 base_activation=torch.nn.SiLU, grid_eps=0.02, grid_range=[-1, 1],
                 device=None, dtype=None):
        super().__init__(("kan_linear", in_features, out_features), in_features, out_features,
                         grid_size, spline_order, scale_noise, scale_base, scale_spline,
                         enable_standalone_scale_spline, base_activation, grid_eps, grid_range,
                         device, dtype)

    def forward(self, x):
        # x [..., in] -> y [..., out]: flattened to [N, in] (efficient-kan's view(-1, in)); a 1-D
        # x is one row and gives a 1-D y, as in efficient-kan. The library checks x's last dim.
        lead = None
        if x.dim() > 2 and x.shape[-1] > 0:  # (a 2-D x is [N, in] already)
            lead = x.shape[:-1]
            x = x.reshape(-1, x.shape[-1])
        y = self._run(x)
        return y if lead is None else y.view(*lead, self.out_features)

    @staticmethod
    def _op(x, grid, base_weight, spline_weight, spline_scaler):
        return kan_linear(x, grid, base_weight, spline_weight, spline_scaler)

    def _base_branch(self, x, base_weight):
        return torch.nn.functional.linear(self.base_activation(x), base_weight)

    def extra_repr(self):
        return ("in_features={}, out_features={}, grid_size={}, spline_order={}, "
                "enable_standalone_scale_spline={}".format(
                    self.in_features, self.out_features, self.grid_size, self.spline_order,
                    self.enable_standalone_scale_spline))


class KANConv2d(_KANLayer):
    """KANConv2d(in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
    grid_size=5, spline_order=3, scale_noise=0.1, scale_base=1.0, scale_spline=1.0,
    enable_standalone_scale_spline=True, base_activation=torch.nn.SiLU, grid_eps=0.02,
    grid_range=[-1, 1], device=None, dtype=None): a 2-D convolution whose per-patch map is
    efficient-kan's KANLinear.

    The reference is ``F.unfold + efficient_kan.KANLinear(F, out)`` with F = in_channels * kh * kw:

        patches = torch.nn.functional.unfold(x, kernel_size, dilation, padding, stride)
        y = KANLinear(F, out_channels)(patches.transpose(1, 2)).transpose(1, 2)
        y = y.view(B, out_channels, Ho, Wo)

    and this module's parameters are that KANLinear's, at top level and under its names:
    Parameters base_weight [out, F], spline_weight [out, F, G + k], spline_scaler [out, F] (with
    enable_standalone_scale_spline) and the buffer grid [F, G + 2k + 1], in unfold's feature
    order (c * kh + i) * kw + j; so load_state_dict(strict=True) works both ways with a KANLinear
    (efficient-kan's or kfuse.torch.KANLinear) of F inputs. The initialisation is that KANLinear's
    (KANLinear(F, out_channels) after the same torch.manual_seed() gives the same tensors, drawn in
    efficient-kan's order), and so are b_splines, curve2coeff (on patch rows [N, F]),
    scaled_spline_weight and regularization_loss; update_grid(x) takes images and fits the patches
    of x (see there). in_features (F) and out_features (out_channels) are set as on a KANLinear;
    in_channels, out_channels, kernel_size, stride, padding and dilation (pairs) as on
    torch.nn.Conv2d.

    kernel_size, stride, padding and dilation are ints or (h, w) pairs as in torch.nn.Conv2d;
    padding is zeros (padded pixels enter the KANLinear as 0, as unfold gives them); string
    paddings ('same', 'valid'), groups, bias and padding_mode are not part of this layer. forward:
    x [B, in_channels, H, W] -> [B, out_channels, Ho, Wo], or [in_channels, H, W] ->
    [out_channels, Ho, Wo], with Ho = (H + 2 ph - dh (kh - 1) - 1) // sh + 1 (Wo likewise), as
    an implicit GEMM in kfuse (kf_kan_conv2d_forward/backward): neither the patches nor their
    bases are stored for the batch. Backward gives the gradients of x, base_weight,
    spline_weight and spline_scaler (none for the grid). base_activation as in KANLinear (with
    another than SiLU, the base branch is a torch.nn.functional.conv2d of the activated, padded
    image); dtypes and autocast as in KANLinear; argument checks (a wrong
    channel count, an image smaller than the kernel's reach, a bad descriptor, a dtype) are the
    library's."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 grid_size=5, spline_order=3, scale_noise=0.1, scale_base=1.0, scale_spline=1.0,
                 enable_standalone_scale_spline=True, base_activation=torch.nn.SiLU,
                 grid_eps=0.02, grid_range=[-1, 1], device=None, dtype=None):
        owner = "kfuse.torch.KANConv2d"
        kh, kw = _pair(kernel_size, "kernel_size", owner)
        sh, sw = _pair(stride, "stride", owner)
        ph, pw = _pair(padding, "padding", owner)
        dh, dw = _pair(dilation, "dilation", owner)
        n_features = int(in_channels) * kh * kw
        super().__init__(("kan_conv2d", int(in_channels), int(out_channels), kh, kw, sh, sw, ph,
                          pw, dh, dw), n_features, out_channels, grid_size, spline_order,
                         scale_noise, scale_base, scale_spline, enable_standalone_scale_spline,
                         base_activation, grid_eps, grid_range, device, dtype)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = (kh, kw)
        self.stride = (sh, sw)
        self.padding = (ph, pw)
        self.dilation = (dh, dw)

    def forward(self, x):
        return self._run(x)

    def _op(self, x, grid, base_weight, spline_weight, spline_scaler):
        return kan_conv2d(x, grid, base_weight, spline_weight, spline_scaler,
                          list(self.kernel_size), list(self.stride), list(self.padding),
                          list(self.dilation))

    def _base_branch(self, x, base_weight):
        # The reference applies the activation to unfold's patches, padding zeros included:
        # pad first, so that an activation with act(0) != 0 is right too.
        (kh, kw), (ph, pw) = self.kernel_size, self.padding
        xp = torch.nn.functional.pad(x, (pw, pw, ph, ph))
        w = base_weight.view(self.out_channels, self.in_channels, kh, kw)
        return torch.nn.functional.conv2d(self.base_activation(xp), w, None, self.stride, 0,
                                          self.dilation)

    def unfold(self, x):
        """The patches of images x [B, in_channels, H, W] (or [in_channels, H, W]) as KANLinear
        rows [B * Ho * Wo, F] (torch.nn.functional.unfold, transposed): what the reference's
        KANLinear sees, for b_splines and curve2coeff, which take rows. Materialised: forward,
        backward and update_grid do not use it (the library gathers the patches per tile)."""
        if x.dim() not in (3, 4) or x.shape[-3] != self.in_channels:
            raise ValueError("kfuse.torch.KANConv2d: x must be [batch, in_channels=%d, H, W] or "
                             "[in_channels=%d, H, W], got %s"
                             % (self.in_channels, self.in_channels, tuple(x.shape)))
        if x.dim() == 3:
            x = x.unsqueeze(0)
        p = torch.nn.functional.unfold(x, self.kernel_size, dilation=self.dilation,
                                       padding=self.padding, stride=self.stride)  # [B, F, L]
        return p.transpose(1, 2).reshape(-1, self.in_features)

    def _check_update_x(self, x):
        """update_grid takes images x [B, in_channels, H, W] (or [in_channels, H, W]); its samples
        are their patches, zero padding included, exactly what the reference's
        KANLinear.update_grid gets from F.unfold (the library gathers them; nothing is
        unfolded here). The library checks the shape."""

    def extra_repr(self):
        return ("{}, {}, kernel_size={}, stride={}, padding={}, dilation={}, grid_size={}, "
                "spline_order={}, enable_standalone_scale_spline={}".format(
                    self.in_channels, self.out_channels, self.kernel_size, self.stride,
                    self.padding, self.dilation, self.grid_size, self.spline_order,
                    self.enable_standalone_scale_spline))


_PLAIN_LAYERS = (KANLinear, KANConv2d)  # module_attrs' exact types
