"""Derivatives of any order through kfuse's KAN layers (docs/ops/kan.md, "Derivatives"): the
operators kfuse::kan_linear_deriv and kfuse::kan_linear_deriv_backward, a closed family whose
gradients are again its members, so that torch.autograd.grad(..., create_graph=True) of a
KANLinear or KANConv2d output can be differentiated again (u_xx, u_xxx of physics-informed
networks), and the double-backward formulas of kfuse::kan_linear and kfuse::kan_conv2d built on
them.

With phi_oi^(m)(x) = bw[o, i] SiLU^(m)(x) + sum_c S[o, i, c] B_c^(m)(x) (S the scaled spline
weight, formed here by torch so that the scaler's gradients are autograd's):
    F_m(x; w)[n, o] = sum_i w[n, i] phi_oi^(m)(x[n, i])              kan_linear_deriv
    G_m(x; g)[n, i] = sum_o g[n, o] phi_oi^(m)(x[n, i])
    H_m(x; g, w):     dbw[o, i] = sum_n g w SiLU^(m), dS[o, i, c] = sum_n g w B_c^(m)
kan_linear_deriv_backward gives (w G_{m+1}(x; g), G_m(x; g), H_m(x; g, w)), the gradients of
F_m; its own gradients are F and G at orders m and m + 1 (_deriv_backward_backward)."""
import torch

from kfuse._lowlevel import kf_dtype_of
from kfuse.torch._common import Op, check_rank, device_guard, empty_grad, plan, workspace

__all__ = []

def _key(geometry, grid, spline_weight, standalone):
    """The plan key from the tensors' shapes: grid [F, G + 2k + 1], spline_weight
    [out, F, G + k]."""
    if grid.dim() != 2 or spline_weight.dim() != 3:
        check_rank("grid", grid, 2, "[features, grid_size + 2 * spline_order + 1]")
        check_rank("spline_weight", spline_weight, 3, "[out, features, grid_size + spline_order]")
    out, F, C = spline_weight.shape
    k = grid.shape[1] - C - 1
    if geometry:  # ("kan_conv2d", in_channels, out_channels, kh, kw, sh, sw, ph, pw, dh, dw, ...)
        head = ("kan_conv2d", geometry[0], out) + tuple(geometry[1:])
    else:  # ("kan_linear", in, out, ...)
        head = ("kan_linear", F, out)
    return head + (C - k, k, standalone, kf_dtype_of("spline_weight", spline_weight))


def _plan(x, grid, S):
    """The float32/float64 KANLinear plan without a scaler over S's [out, in, C]."""
    return plan(_key((), grid, S, False), x.device)


def _forward_impl(x, grid, w, bw, S, order):
    with device_guard(x.device):
        p = _plan(x, grid, S)
        y = x.new_empty(x.shape[:-1] + (S.shape[0],))
        dims = p.work_dims(x.shape)
        if dims is not None:
            p.forward(x.contiguous(), grid.contiguous(), _c(bw), S.contiguous(), y,
                      workspace=workspace(p, x.device, *dims), input_weight=_c(w),
                      derivative_order=order)
        else:
            y.zero_()
    return y


def _c(t):
    return None if t is None else t.contiguous()


def _forward_fake(x, grid, w, bw, S, order):
    return x.new_empty(x.shape[:-1] + (S.shape[0],))


def _grads(x, w, bw, S, mask):
    return (empty_grad(x, mask[0]), empty_grad(x, mask[1]),
            empty_grad(bw, mask[2]) if bw is not None else S.new_empty((0,)),
            empty_grad(S, mask[3]))


def _backward_impl(g, x, grid, w, bw, S, order, output_mask):
    """(w G_{m+1}, G_m, dbw, dS) of F_m at x; an output not in output_mask is an empty tensor."""
    mask = [bool(m) for m in output_mask]
    mask[2] = mask[2] and bw is not None
    out = _grads(x, w, bw, S, mask)
    want = [t if need else None for t, need in zip(out, mask)]
    with device_guard(x.device):
        p = _plan(x, grid, S)
        dims = p.work_dims(x.shape)
        if dims is None:  # an empty batch: nothing flows back
            for t in want:
                if t is not None:
                    t.zero_()
            return out
        p.backward(x.contiguous(), grid.contiguous(), _c(bw), S.contiguous(), g.contiguous(),
                   dx=want[0], dbase_weight=want[2], dspline_weight=want[3],
                   workspace=workspace(p, x.device, *dims), input_weight=_c(w),
                   dinput_weight=want[1], derivative_order=order)
    return out


def _backward_fake(g, x, grid, w, bw, S, order, output_mask):
    return _grads(x, w, bw, S, output_mask)


def check_order(order, k, what):
    """The derivative order the kernels can give: B-splines of order k have derivatives up to
    k + 1 (that one 0); a gradient that needs order k + 2 is refused here, naming both."""
    if order > k + 1:
        raise RuntimeError(
            "kfuse.torch: %s needs derivative order %d of a KAN layer with spline_order %d; its "
            "B-splines are piecewise polynomials of degree %d, differentiable up to order %d "
            "(B^(k+1) = 0) by kfuse" % (what, order, k, k, k + 1))


def _order_of(grid, S):
    return grid.shape[1] - S.shape[2] - 1  # k = nk - C - 1


def deriv_backward(g, x, grid, w, bw, S, order, mask):
    """(dx, dw, dbw, dS) of F_order, each None where mask says so (kan_linear_deriv_backward)."""
    mask = [bool(mask[0]), bool(mask[1]), bool(mask[2]) and bw is not None, bool(mask[3])]
    if not any(mask):
        return None, None, None, None
    if mask[0]:
        check_order(order + 1, _order_of(grid, S), "a gradient with respect to x")
    out = kan_linear_deriv_backward(g, x, grid, w, bw, S, order, mask)
    return tuple(t if need else None for t, need in zip(out, mask))


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:5])
    ctx.order = inputs[5]


def _deriv_forward_backward(ctx, gy):
    x, grid, w, bw, S = ctx.saved_tensors
    need = ctx.needs_input_grad  # x, grid, w, bw, S, order
    if gy is None:
        return (None,) * 6
    dx, dw, dbw, dS = deriv_backward(gy, x, grid, w, bw, S, ctx.order,
                                     [need[0], need[2] and w is not None, need[3], need[4]])
    return dx, None, dw, dbw, dS, None


def _add(a, b):
    return b if a is None else a if b is None else a + b


def _setup_backward_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:6])
    ctx.order = inputs[6]
    ctx.mask = [bool(m) for m in inputs[7]]


def _deriv_backward_backward(ctx, a, b, cbw, cS):
    """Gradients of (dx, dw, dbw, dS) = (w G_{m+1}(x; g), G_m(x; g), H_m(x; g, w)) with respect to
    g, x, w, bw and S, for the upstream gradients a, b, (cbw, cS) (None: that output absent):
      from a:   dg = F_{m+1}(x; a w), dx = a w G_{m+2}(x; g), dw = a G_{m+1}(x; g),
                dbw, dS = H_{m+1}(x; g, a w)
      from b:   dg = F_m(x; b), dx = b G_{m+1}(x; g), dbw, dS = H_m(x; g, b)
      from cbw, cS (H is bilinear in g and w, linear in the coefficients): with the coefficients
                (cbw, cS) in place of (bw, S), dg = F_m(x; w), dw = G_m(x; g),
                dx = w G_{m+1}(x; g)"""
    g, x, grid, w, bw, S = ctx.saved_tensors
    m, mask = ctx.order, ctx.mask
    a, b, cbw, cS = [t if on else None for t, on in zip((a, b, cbw, cS), mask)]
    need = ctx.needs_input_grad  # g, x, grid, w, bw, S, order, mask
    nx, nw, nbw, nS = need[1], need[3] and w is not None, need[4] and bw is not None, need[5]
    dg = dx = dw = dbw = dS = None
    if a is not None:
        aw = a if w is None else a * w
        if need[0]:
            check_order(m + 1, _order_of(grid, S), "a gradient")
            dg = kan_linear_deriv(x, grid, aw, bw, S, m + 1)
        if nx or nw or nbw or nS:
            ex, eg, ebw, eS = deriv_backward(g, x, grid, aw, bw, S, m + 1, [nx, nw, nbw, nS])
            dx, dbw, dS = ex, ebw, eS
            dw = None if eg is None else a * eg
    if b is not None:
        if need[0]:
            dg = _add(dg, kan_linear_deriv(x, grid, b, bw, S, m))
        ex, _, ebw, eS = deriv_backward(g, x, grid, b, bw, S, m, [nx, False, nbw, nS])
        dx, dbw, dS = _add(dx, ex), _add(dbw, ebw), _add(dS, eS)
    if cbw is not None or cS is not None:
        cS = torch.zeros_like(S) if cS is None else cS
        if need[0]:
            dg = _add(dg, kan_linear_deriv(x, grid, w, cbw, cS, m))
        ex, eg, _, _ = deriv_backward(g, x, grid, w, cbw, cS, m, [nx, nw, False, False])
        dx, dw = _add(dx, ex), _add(dw, eg)
    return dg, dx, None, dw, dbw, dS, None, None


_ARGS = "Tensor x, Tensor grid, Tensor? input_weight, Tensor? base_weight, Tensor spline_weight"

#: kfuse::kan_linear_deriv_backward(dy, x, grid, input_weight, base_weight, S, order,
#: output_mask) -> (w G_{m+1}, G_m, d base_weight, dS): the order-m backward (kf_kan_linear_backward
#: at derivative_order m), differentiable again (_deriv_backward_backward)
kan_linear_deriv_backward = Op(
    "kan_linear_deriv_backward",
    "(Tensor dy, %s, int order, bool[] output_mask) -> (Tensor, Tensor, Tensor, Tensor)" % _ARGS,
    _backward_impl, _backward_fake, _setup_backward_context, _deriv_backward_backward,
    double_backward=_deriv_backward_backward)
#: kfuse::kan_linear_deriv(x, grid, input_weight, base_weight, S, order) -> F_order(x; w): the
#: order-m forward (kf_kan_linear_forward at derivative_order m)
kan_linear_deriv = Op(
    "kan_linear_deriv", "(%s, int order) -> Tensor" % _ARGS, _forward_impl, _forward_fake,
    _setup_context, _deriv_forward_backward, double_backward=_deriv_forward_backward)


def scaled(spline_weight, spline_scaler):
    """S = spline_weight * spline_scaler[..., None] (spline_weight without a scaler), in torch,
    so that the scaler's higher derivatives are autograd's."""
    return spline_weight if spline_scaler is None else spline_weight * spline_scaler.unsqueeze(-1)


def _unscale(dS, spline_weight, spline_scaler, need_sw, need_ss):
    """d spline_weight and d spline_scaler from dS, through S = spline_weight * scaler."""
    if dS is None:
        return None, None
    if spline_scaler is None:
        return dS, None
    return (dS * spline_scaler.unsqueeze(-1) if need_sw else None,
            (dS * spline_weight).sum(-1) if need_ss else None)


def linear_double_backward(ctx, dy):
    """kfuse::kan_linear's backward under create_graph=True: the same gradients (x, base_weight,
    spline_weight, spline_scaler) through kan_linear_deriv_backward at order 0 and torch's
    product S = spline_weight * spline_scaler, all differentiable."""
    x, grid, bw, sw, ss = ctx.saved_tensors
    need = ctx.needs_input_grad
    nss = ss is not None and need[4]
    nones = (None,) * (5 + len(ctx.geometry))
    if dy is None:
        return nones
    dx, _, dbw, dS = deriv_backward(dy, x, grid, None, bw, scaled(sw, ss), 0,
                                    [need[0], False, need[2], need[3] or nss])
    dsw, dss = _unscale(dS, sw, ss, need[3], nss)
    return (dx, None, dbw, dsw, dss) + nones[5:]


def conv_double_backward(ctx, dy):
    """kfuse::kan_conv2d's backward under create_graph=True: the patches by torch's unfold (the
    rows the KANLinear sees), kan_linear_deriv_backward over them, and dx by fold (unfold's
    adjoint), all differentiable. The first-order backward stays the fused kernel."""
    x, grid, bw, sw, ss = ctx.saved_tensors
    ks, st, pd, dl = ctx.geometry
    need = ctx.needs_input_grad
    nss = ss is not None and need[4]
    nones = (None,) * 9
    if dy is None:
        return nones
    batched = x.dim() == 4
    x4, dy4 = (x, dy) if batched else (x.unsqueeze(0), dy.unsqueeze(0))
    B, F, out = x4.shape[0], sw.shape[1], sw.shape[0]
    rows = torch.nn.functional.unfold(x4, ks, dl, pd, st).transpose(1, 2)  # [B, L, F]
    L = rows.shape[1]
    dyr = dy4.reshape(B, out, L).transpose(1, 2).reshape(B * L, out)
    dxr, _, dbw, dS = deriv_backward(dyr, rows.reshape(B * L, F), grid, None, bw,
                                     scaled(sw, ss), 0,
                                     [need[0], False, need[2], need[3] or nss])
    dx = None
    if dxr is not None:
        dx = torch.nn.functional.fold(dxr.reshape(B, L, F).transpose(1, 2), x4.shape[-2:], ks,
                                      dl, pd, st)
        dx = dx if batched else dx.squeeze(0)
    dsw, dss = _unscale(dS, sw, ss, need[3], nss)
    return (dx, None, dbw, dsw, dss) + nones[5:]
