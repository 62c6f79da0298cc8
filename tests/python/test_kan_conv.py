"""Tests of the kfuse Python package for KANConv2d (unfold + efficient-kan's KANLinear as an
implicit GEMM): kfuse.kan.KanConv2dPlan and kfuse.torch.KANConv2d against a float64 reference,
torch.nn.functional.unfold on x.double() followed by the transcription of efficient-kan's
KANLinear math in kan_reference.py (shared with test_kan.py); the module's layout,
initialisation and state_dict against KANLinear(F, out) with F = in_channels * kh * kw;
update_grid on the patches; errors.

    patches = unfold(x, kernel, dilation, padding, stride).transpose(1, 2)   [B, L, F]
    y = KANLinear(F, out)(patches).transpose(1, 2).view(B, out, Ho, Wo)

Accuracy bar (DESIGN.md): ||out - ref|| / ||ref|| < 1e-5 for fp32 against float64.
"""
import math

import numpy as np
import pytest

import kfuse
import kfuse.numpy as knp
from kfuse.kan import KanConv2dPlan

torch = pytest.importorskip("torch")
import kfuse.torch as kt  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from devices import cuda_ok  # noqa: E402
from kan_reference import (  # noqa: E402
    GRADS, TOL, EfficientKANRef, params_of, randomize_, ref_forward, reference_grads, rel, tol,
    uniform_grid_torch,
)


def _pair(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v)


def ref_conv_forward(geom, activation=F.silu):
    """The reference as a function of (x, grid, base_weight, spline_weight, spline_scaler, k),
    reference_grads' signature: F.unfold on x (3-D: one image), then efficient-kan's KANLinear
    math (with base activation `activation`) on the patches, folded back to [B, out, Ho, Wo]."""
    kernel, stride, padding, dilation = (_pair(v) for v in geom)

    def forward(x, grid, base_weight, spline_weight, spline_scaler, k):
        unbatched = x.dim() == 3
        x4 = x.unsqueeze(0) if unbatched else x
        B, _, H, W = x4.shape
        Ho = (H + 2 * padding[0] - dilation[0] * (kernel[0] - 1) - 1) // stride[0] + 1
        Wo = (W + 2 * padding[1] - dilation[1] * (kernel[1] - 1) - 1) // stride[1] + 1
        p = F.unfold(x4, kernel, dilation=dilation, padding=padding, stride=stride)  # [B, F, L]
        y = ref_forward(p.transpose(1, 2), grid, base_weight, spline_weight, spline_scaler, k,
                        activation)
        y = y.transpose(1, 2).reshape(B, base_weight.shape[0], Ho, Wo)
        return y[0] if unbatched else y

    return forward


def check_against_reference(m, x, dy, geom, activation=F.silu):
    """Runs m on x (autograd), compares y and every gradient with the float64 reference (base
    activation `activation`), to the bar of x's dtype."""
    xk = x.clone().requires_grad_(True)
    for p in m.parameters():
        p.grad = None
    y = m(xk)
    assert y.shape == dy.shape and y.dtype == x.dtype
    y.backward(dy)
    yr, dxr, gr = reference_grads(x, params_of(m), dy, m.spline_order,
                                  forward=ref_conv_forward(geom, activation))
    errs = {"y": rel(y, yr), "dx": rel(xk.grad, dxr)}
    for n in GRADS:
        if n in gr:
            errs["d" + n] = rel(getattr(m, n).grad, gr[n])
    bad = {n: e for n, e in errs.items() if not e < tol(x.dtype)}
    assert not bad, bad
    assert m.grid.grad is None
    return errs


def random_dy(m, x, geom, g):
    """An upstream gradient of m's output shape for x (the reference's), drawn from generator g
    in x's dtype."""
    with torch.no_grad():
        y_shape = ref_conv_forward(geom)(x.double(), *[
            None if t is None else t.double() for t in params_of(m).values()],
            m.spline_order).shape
    return torch.randn(y_shape, generator=g).to(x.dtype)


# ---- forward and backward against the float64 reference ---------------------------------------

OP_CASES = [  # (C_in, C_out, kernel, stride, padding, dilation, H, W, batch (None: 3-D x), G, k,
    #             standalone scaler, x scale)
    (4, 5, 3, 1, 1, 1, 8, 8, 2, 5, 3, True, 1.0),              # 3x3, stride 1, pad 1
    (3, 4, 3, 2, 1, 2, 9, 7, 2, 5, 3, True, 1.0),              # stride 2, pad 1, dilation 2, odd
    (3, 4, (2, 3), (1, 2), (0, 1), (2, 1), 9, 7, 2, 5, 3, True, 1.0),  # non-square everything
    (3, 6, (3, 1), 1, (1, 0), 1, 6, 5, 3, 5, 3, True, 1.0),    # non-square kernel 3x1
    (6, 5, 1, 1, 0, 1, 5, 6, 3, 5, 3, True, 1.0),              # 1x1 kernel
    (6, 5, 1, 2, 1, 1, 5, 6, 2, 5, 3, True, 1.0),              # 1x1 kernel, stride 2, padding 1
    (3, 4, 3, 1, 1, 1, 7, 7, 1, 5, 3, True, 1.0),              # batch 1
    (3, 4, 3, 1, 1, 1, 7, 5, None, 5, 3, True, 1.0),           # unbatched [C_in, H, W]
    (3, 4, 3, 1, 0, 1, 6, 6, 2, 5, 3, False, 1.0),             # no standalone scaler
    (3, 4, 3, 1, 1, 1, 7, 6, 2, 1, 0, True, 1.0),              # G = 1, k = 0
    (3, 4, 3, 1, 1, 1, 7, 6, 2, 1, 1, True, 1.0),              # G = 1, k = 1
    (3, 4, 3, 1, 1, 1, 7, 6, 2, 1, 3, True, 1.0),              # G = 1, k = 3
    (3, 4, 3, 1, 1, 1, 7, 6, 2, 5, 0, True, 1.0),              # G = 5, k = 0
    (3, 4, 3, 1, 1, 1, 7, 6, 2, 5, 1, True, 1.0),              # G = 5, k = 1
    (3, 4, 3, 2, 1, 1, 9, 7, 2, 5, 3, True, 3.0),              # x far outside grid_range
    (2, 3, 3, 1, 2, 1, 5, 5, 2, 1, 1, False, 2.5),             # outside, no scaler, pad 2
    (3, 4, 3, 1, 0, 1, 3, 3, 2, 5, 3, True, 1.0),              # the image is one patch
    (32, 32, 3, 1, 1, 1, 14, 14, 2, 5, 3, True, 1.0),          # F = 288: several tiles
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("cin,cout,ks,st,pad,dil,H,W,B,G,k,standalone,xs", OP_CASES)
def test_torch_forward_backward_vs_float64(cin, cout, ks, st, pad, dil, H, W, B, G, k,
                                           standalone, xs, dtype):
    """The module in float32 (< 1e-5) and in float64 (dtype=torch.float64: the library's float64
    kernels, < 1e-12) against the float64 reference."""
    torch.manual_seed(0)
    m = randomize_(kt.KANConv2d(cin, cout, ks, stride=st, padding=pad, dilation=dil,
                                grid_size=G, spline_order=k,
                                enable_standalone_scale_spline=standalone, dtype=dtype))
    geom = (ks, st, pad, dil)
    g = torch.Generator().manual_seed(1)
    lead = () if B is None else (B,)
    x = (torch.randn(lead + (cin, H, W), generator=g) * xs).to(dtype)
    check_against_reference(m, x, random_dy(m, x, geom, g), geom)
    assert hasattr(m, "spline_scaler") == standalone


def test_nonuniform_grid_after_update_grid():
    """update_grid(x) is KANLinear.update_grid on the patches of x (bit for bit the same as
    unfold + kfuse.torch.KANLinear); forward and backward then match the reference on the new,
    per-feature non-uniform knots."""
    torch.manual_seed(0)
    geom = (3, 2, 1, 1)
    m = randomize_(kt.KANConv2d(3, 4, 3, stride=2, padding=1))
    lin = kt.KANLinear(27, 4)
    lin.load_state_dict(m.state_dict(), strict=True)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, 3, 9, 7, generator=g) * 1.7
    m.update_grid(x)
    patches = F.unfold(x, 3, padding=1, stride=2).transpose(1, 2).reshape(-1, 27)
    lin.update_grid(patches)
    for n, t in lin.state_dict().items():
        assert torch.equal(m.state_dict()[n], t), n
    assert not torch.equal(m.grid, uniform_grid_torch(27, 5, 3, -1, 1))
    steps = m.grid[:, 1:] - m.grid[:, :-1]
    assert (steps.max(1).values - steps.min(1).values > 1e-3).all()  # non-uniform per feature
    assert not torch.equal(m.grid[0], m.grid[13])  # and per feature
    dy = torch.randn(4, 4, 5, 4, generator=g)
    check_against_reference(m, torch.randn(4, 3, 9, 7, generator=g) * 1.5, dy, geom)
    # unbatched x: the patches of the one image
    m2 = kt.KANConv2d(3, 4, 3, stride=2, padding=1)
    m2.load_state_dict(m.state_dict())
    m3 = kt.KANConv2d(3, 4, 3, stride=2, padding=1)
    m3.load_state_dict(m.state_dict())
    m2.update_grid(x[1])
    m3.update_grid(x[1:2])
    for n, t in m3.state_dict().items():
        assert torch.equal(m2.state_dict()[n], t), n
    with pytest.raises(ValueError, match=r"args->x\.shape\[1\] = 4, expected 3"):
        m.update_grid(torch.randn(2, 4, 9, 7))
    with pytest.raises(ValueError, match=r"args->x\.ndim = 2"):
        m.update_grid(torch.randn(27, 5))
    with pytest.raises(ValueError, match="args->x"):
        m.update_grid(torch.full((1, 3, 5, 5), float("nan")))


def test_float64_gradcheck_update_grid_and_dtype_errors():
    """A float64 KANConv2d (.double() of a float32 one): gradcheck of the operator on x and every
    parameter (stride, padding and dilation); update_grid in float64 is KANLinear's on the
    unfolded patches, bit for bit; an input of another dtype is an InvalidArgument naming it."""
    torch.manual_seed(0)
    m = randomize_(kt.KANConv2d(2, 3, 3, stride=(2, 1), padding=1, dilation=(1, 2))).double()
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 2, 6, 7, generator=g, dtype=torch.float64) * 1.3
    p = params_of(m)
    args = tuple(t.detach().clone().requires_grad_(True) for t in (
        x, p["base_weight"], p["spline_weight"], p["spline_scaler"]))
    assert torch.autograd.gradcheck(
        lambda xx, bw, sw, sc: kt.kan_conv2d_function(xx, m.grid, bw, sw, sc, (3, 3), (2, 1),
                                                      (1, 1), (1, 2)), args)
    lin = kt.KANLinear(18, 3, dtype=torch.float64)
    lin.load_state_dict(m.state_dict(), strict=True)
    m.update_grid(x)
    lin.update_grid(F.unfold(x, 3, dilation=(1, 2), padding=1, stride=(2, 1))
                    .transpose(1, 2).reshape(-1, 18))
    for n, t in lin.state_dict().items():
        assert t.dtype == torch.float64 and torch.equal(m.state_dict()[n], t), n
    with pytest.raises(kfuse.InvalidArgument, match=r"args->x\.dtype"):
        m(x.float())


@pytest.mark.parametrize("act,fn", [(nn.Identity, lambda t: t), (nn.ReLU, torch.relu),
                                    (nn.GELU, F.gelu), (nn.Tanh, torch.tanh),
                                    (nn.Sigmoid, torch.sigmoid)],  # sigmoid(0) != 0: padding
                         ids=lambda v: getattr(v, "__name__", ""))
def test_any_base_activation_vs_float64(act, fn):
    """A base_activation other than SiLU (the base branch in torch over the padded image, the
    splines in kfuse): y and every gradient against the float64 reference."""
    torch.manual_seed(0)
    geom = (3, 2, 1, 1)
    m = randomize_(kt.KANConv2d(3, 4, 3, stride=2, padding=1, base_activation=act))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 7, 6, generator=g)
    dy = torch.randn(2, 4, 4, 3, generator=g)
    check_against_reference(m, x, dy, geom, activation=fn)


def test_only_some_gradients_requested_and_no_grad():
    torch.manual_seed(0)
    geom = (3, 1, 1, 1)
    m = randomize_(kt.KANConv2d(3, 4, 3, padding=1))
    x = torch.randn(2, 3, 6, 5)
    dy = torch.randn(2, 4, 6, 5)
    m.spline_weight.requires_grad_(False)
    m(x).backward(dy)
    _, _, gr = reference_grads(x, params_of(m), dy, 3, forward=ref_conv_forward(geom))
    assert m.spline_weight.grad is None
    assert rel(m.base_weight.grad, gr["base_weight"]) < TOL
    assert rel(m.spline_scaler.grad, gr["spline_scaler"]) < TOL
    m.requires_grad_(False)
    xg = x.clone().requires_grad_(True)
    m(xg).backward(dy)
    _, dxr, _ = reference_grads(x, params_of(m), dy, 3, forward=ref_conv_forward(geom))
    assert rel(xg.grad, dxr) < TOL
    m.requires_grad_(True)
    with torch.no_grad():
        y = m(x.permute(0, 1, 3, 2).contiguous().permute(0, 1, 3, 2))  # not contiguous
    assert y.grad_fn is None
    with torch.no_grad():
        yr = ref_conv_forward(geom)(x.double(), *[t.double() for t in params_of(m).values()], 3)
    assert rel(y, yr) < TOL


def test_gradients_accumulate_like_torch():
    torch.manual_seed(0)
    geom = ((2, 3), 1, (1, 0), 1)
    m = randomize_(kt.KANConv2d(2, 3, (2, 3), padding=(1, 0), grid_size=4, spline_order=2))
    x = torch.randn(2, 2, 5, 6)
    for _ in range(2):
        m(x).pow(2).sum().backward()
    p = {n: t.detach().double().requires_grad_(n != "grid") for n, t in params_of(m).items()}
    for _ in range(2):
        ref_conv_forward(geom)(x.double(), p["grid"], p["base_weight"], p["spline_weight"],
                               p["spline_scaler"], 2).pow(2).sum().backward()
    for n in GRADS:
        assert rel(getattr(m, n).grad, p[n].grad) < TOL, n


def test_finite_differences():
    """y is linear in each parameter (a central difference equals the directional derivative up
    to rounding); in x, off the knots, a small central difference is accurate to O(h^2)."""
    torch.manual_seed(0)
    m = randomize_(kt.KANConv2d(2, 3, 2, stride=1, padding=1, grid_size=3))
    g = torch.Generator().manual_seed(3)
    x = torch.rand(2, 2, 3, 4, generator=g) * 1.6 - 0.8
    w = torch.randn(2, 3, 4, 5, generator=g)

    def loss():
        with torch.no_grad():
            return float((m(x).double() * w.double()).sum())

    xg = x.clone().requires_grad_(True)
    (m(xg) * w).sum().backward()
    grads = {"x": xg.grad, "base_weight": m.base_weight.grad,
             "spline_weight": m.spline_weight.grad, "spline_scaler": m.spline_scaler.grad}
    for name, grad in grads.items():
        t = x if name == "x" else getattr(m, name)
        v = torch.randn(t.shape, generator=g)
        h = 1e-2 if name == "x" else 0.5
        tol = 2e-3 if name == "x" else 1e-4
        with torch.no_grad():
            t.add_(h * v)
            up = loss()
            t.sub_(2 * h * v)
            down = loss()
            t.add_(h * v)
        fd = (up - down) / (2 * h)
        an = float((grad.double() * v.double()).sum())
        assert abs(fd - an) <= tol * max(1.0, abs(an)), (name, fd, an)


def test_empty_batch():
    m = kt.KANConv2d(3, 4, 3, padding=1)
    x = torch.randn(0, 3, 5, 6, requires_grad=True)
    y = m(x)
    assert y.shape == (0, 4, 5, 6)
    y.sum().backward()
    assert x.grad.shape == x.shape
    assert torch.count_nonzero(m.base_weight.grad) == 0
    assert torch.count_nonzero(m.spline_weight.grad) == 0


# ---- the module: layout, initialisation, state_dict -------------------------------------------

@pytest.mark.parametrize("standalone", [True, False])
def test_layout_is_kanlinear_over_the_patch_features(standalone):
    m = kt.KANConv2d(3, 8, (2, 3), stride=(2, 1), padding=1, dilation=(1, 2), grid_size=4,
                     spline_order=2, enable_standalone_scale_spline=standalone)
    r = EfficientKANRef(18, 8, grid_size=4, spline_order=2,
                        enable_standalone_scale_spline=standalone)
    ms, rs = m.state_dict(), r.state_dict()
    assert list(ms) == list(rs)
    for n in rs:
        assert ms[n].shape == rs[n].shape and ms[n].dtype == rs[n].dtype, n
    assert [n for n, _ in m.named_parameters()] == [n for n, _ in r.named_parameters()]
    assert [n for n, _ in m.named_buffers()] == ["grid"]
    for attr in ("in_features", "out_features", "grid_size", "spline_order", "scale_noise",
                 "scale_base", "scale_spline", "enable_standalone_scale_spline", "grid_eps"):
        assert getattr(m, attr) == getattr(r, attr), attr
    assert (m.in_channels, m.out_channels) == (3, 8)
    assert (m.kernel_size, m.stride, m.padding, m.dilation) == ((2, 3), (2, 1), (1, 1), (1, 2))
    assert isinstance(m.base_activation, nn.SiLU)
    assert "kernel_size=(2, 3)" in repr(m)
    plan = KanConv2dPlan(kfuse.Context(), 3, 8, (2, 3), stride=(2, 1), padding=1,
                         dilation=(1, 2), grid_size=4, spline_order=2,
                         standalone_scale=standalone)
    assert plan.param_info == [(n, tuple(t.shape)) for n, t in ms.items()]


@pytest.mark.parametrize("G,k,standalone", [(5, 3, True), (3, 2, False), (1, 1, True)])
def test_init_is_kanlinears_with_the_same_seed(G, k, standalone):
    """KANConv2d(C, out, kernel) draws what KANLinear(C*kh*kw, out) draws, in the same order (so
    efficient-kan's base_weight and spline_scaler bit for bit, spline_weight up to its solver)."""
    kw = dict(grid_size=G, spline_order=k, enable_standalone_scale_spline=standalone,
              scale_base=0.7, scale_spline=1.3, scale_noise=0.2, grid_range=[-1.5, 2])
    torch.manual_seed(7)
    m = kt.KANConv2d(4, 6, (3, 2), stride=2, **kw)
    after_m = torch.rand(1)
    torch.manual_seed(7)
    lin = kt.KANLinear(24, 6, **kw)
    after_lin = torch.rand(1)
    torch.manual_seed(7)
    r = EfficientKANRef(24, 6, **kw)
    after_r = torch.rand(1)
    assert torch.equal(after_m, after_lin) and torch.equal(after_m, after_r)
    for n, t in lin.state_dict().items():
        assert torch.equal(m.state_dict()[n], t), n
    assert torch.equal(m.grid, r.grid) and torch.equal(m.base_weight, r.base_weight)
    if standalone:
        assert torch.equal(m.spline_scaler, r.spline_scaler)
    assert rel(m.spline_weight, r.spline_weight) < 1e-4


class UnfoldKAN(nn.Module):
    """The reference layer as a user would write it: F.unfold + a KANLinear(F, out) at top level
    of the state_dict (its parameters under KANLinear's names)."""

    def __init__(self, linear, kernel, stride=1, padding=0, dilation=1):
        super().__init__()
        self.kan = linear
        self.geom = (kernel, stride, padding, dilation)

    def forward(self, x):
        kernel, stride, padding, dilation = self.geom
        B, _, H, W = x.shape
        p = F.unfold(x, kernel, dilation=dilation, padding=padding, stride=stride)
        y = self.kan(p.transpose(1, 2))  # [B, L, out]
        Ho = (H + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1
        return y.transpose(1, 2).reshape(B, -1, Ho, y.shape[1] // Ho)


@pytest.mark.parametrize("standalone", [True, False])
def test_state_dict_round_trip(standalone):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 9, 7) * 1.3
    # unfold + kfuse.torch.KANLinear (after a grid update there) -> KANConv2d, strict
    ref = UnfoldKAN(kt.KANLinear(27, 5, enable_standalone_scale_spline=standalone), 3,
                    stride=2, padding=1, dilation=1)
    randomize_(ref.kan)
    ref.kan.update_grid(torch.randn(64, 27))
    m = kt.KANConv2d(3, 5, 3, stride=2, padding=1, enable_standalone_scale_spline=standalone)
    m.load_state_dict(ref.kan.state_dict(), strict=True)
    with torch.no_grad():
        assert rel(m(x), ref(x)) < TOL
        # and the float64 transcription of efficient-kan with those tensors
        want = ref_conv_forward((3, 2, 1, 1))(x.double(), *[
            None if t is None else t.double() for t in params_of(m).values()], 3)
        assert rel(m(x), want) < TOL
    # KANConv2d -> efficient-kan's KANLinear (the transcription, float64), strict, both ways
    m2 = randomize_(kt.KANConv2d(3, 5, 3, stride=2, padding=1,
                                 enable_standalone_scale_spline=standalone))
    m2.update_grid(x)
    r = EfficientKANRef(27, 5, enable_standalone_scale_spline=standalone, dtype=torch.float64)
    r.load_state_dict(m2.state_dict(), strict=True)
    with torch.no_grad():
        assert rel(m2(x), UnfoldKAN(r, 3, stride=2, padding=1)(x.double())) < TOL
    m3 = kt.KANConv2d(3, 5, 3, stride=2, padding=1, enable_standalone_scale_spline=standalone)
    m3.load_state_dict({n: t.float() for n, t in r.state_dict().items()}, strict=True)
    for n, t in m2.state_dict().items():
        assert torch.equal(m3.state_dict()[n], t), n
    # a state_dict of the wrong patch size is refused by torch
    with pytest.raises(RuntimeError, match="size mismatch"):
        kt.KANConv2d(3, 5, 2, enable_standalone_scale_spline=standalone).load_state_dict(
            m2.state_dict())


def test_regularization_loss_and_rare_calls_are_kanlinears():
    torch.manual_seed(0)
    m = randomize_(kt.KANConv2d(2, 3, 3))
    lin = kt.KANLinear(18, 3)
    lin.load_state_dict(m.state_dict())
    assert m.regularization_loss(0.3, 2.0).item() == lin.regularization_loss(0.3, 2.0).item()
    torch.testing.assert_close(m.scaled_spline_weight, lin.scaled_spline_weight)
    x = torch.randn(2, 2, 5, 5)
    rows = m.unfold(x)
    assert rows.shape == (2 * 9, 18)
    torch.testing.assert_close(rows, F.unfold(x, 3).transpose(1, 2).reshape(-1, 18))
    torch.testing.assert_close(m.b_splines(rows), lin.b_splines(rows))


# ---- numpy-level plan --------------------------------------------------------------------------

@pytest.mark.parametrize("standalone", [True, False])
def test_plan_forward_backward_vs_float64(standalone):
    geom = ((3, 2), (2, 1), (1, 0), (1, 2))
    plan = KanConv2dPlan(kfuse.Context("cpu"), 3, 4, *geom, grid_size=4, spline_order=2,
                         standalone_scale=standalone)
    assert plan.in_features == 18 and plan.out_features == 4
    assert plan.output_shape((2, 3, 9, 7)) == (2, 4, 5, 5)
    assert plan.output_shape((3, 9, 7)) == (4, 5, 5)
    assert plan.output_shape((3, 9)) is None and plan.output_shape((2, 3, 1, 1)) is None
    assert plan.workspace_size(2, 9, 7) >= 0
    ref = knp.tensor_ref
    rng = np.random.default_rng(0)
    p = {n: rng.uniform(-0.3, 0.3, s).astype(np.float32) for n, s in plan.param_info}
    p["grid"] = np.full((18, 9), np.nan, np.float32)
    plan.uniform_grid(-1.0, 1.0, ref(p["grid"]))
    np.testing.assert_array_equal(p["grid"], uniform_grid_torch(18, 4, 2, -1, 1).numpy())
    x = (rng.standard_normal((2, 3, 9, 7)) * 1.2).astype(np.float32)
    dy = rng.standard_normal((2, 4, 5, 5)).astype(np.float32)
    y = np.full((2, 4, 5, 5), np.nan, np.float32)  # poisoned: every element must be written
    ss = ref(p.get("spline_scaler"))
    plan.forward(ref(x), ref(p["grid"]), ref(p["base_weight"]), ref(p["spline_weight"]), ref(y),
                 spline_scaler=ss)
    yr, dxr, gr = reference_grads(x, p, dy, 2, forward=ref_conv_forward(geom))
    assert rel(y, yr) < TOL
    dx = np.full(x.shape, np.nan, np.float32)
    d = {n: np.full(s, np.nan, np.float32) for n, s in plan.param_info if n in GRADS}
    plan.backward(ref(x), ref(p["grid"]), ref(p["base_weight"]), ref(p["spline_weight"]),
                  ref(dy), spline_scaler=ss, dx=ref(dx), dbase_weight=ref(d["base_weight"]),
                  dspline_weight=ref(d["spline_weight"]),
                  dspline_scaler=ref(d.get("spline_scaler")))
    assert rel(dx, dxr) < TOL
    assert sorted(d) == sorted(gr)
    for n in d:
        assert rel(d[n], gr[n]) < TOL, n
    # accumulate, a subset of outputs, a caller workspace
    acc = {n: a.copy() for n, a in d.items()}
    nbytes = plan.workspace_size(2, 9, 7)
    ws = knp.aligned_empty(nbytes)
    plan.backward(ref(x), ref(p["grid"]), ref(p["base_weight"]), ref(p["spline_weight"]),
                  ref(dy), spline_scaler=ss, dbase_weight=ref(acc["base_weight"]),
                  dspline_weight=ref(acc["spline_weight"]),
                  dspline_scaler=ref(acc.get("spline_scaler")), accumulate=True,
                  workspace=(ws.ctypes.data, nbytes))
    for n in d:
        np.testing.assert_allclose(acc[n], 2 * d[n], rtol=1e-5, atol=1e-6)
    # unbatched x
    y1 = np.full((4, 5, 5), np.nan, np.float32)
    plan.forward(ref(x[1]), ref(p["grid"]), ref(p["base_weight"]), ref(p["spline_weight"]),
                 ref(y1), spline_scaler=ss)
    np.testing.assert_allclose(y1, y[1], rtol=1e-5, atol=1e-6)


def test_numpy_front_end_and_update_grid():
    """kfuse.numpy's kan_* functions take a KanConv2dPlan: forward and backward against the
    float64 reference; kan_update_grid returns new arrays (the inputs untouched) equal to what
    kfuse.torch.KANConv2d.update_grid gives, and equal to kan_update_grid of a KanLinearPlan on
    the explicitly unfolded patches."""
    geom = ((3, 3), (2, 2), (1, 1), (2, 2))
    plan = KanConv2dPlan(kfuse.Context("cpu"), 3, 4, *geom)
    rng = np.random.default_rng(3)
    p = {n: rng.uniform(-0.3, 0.3, s).astype(np.float32) for n, s in plan.param_info}
    p["grid"] = knp.kan_uniform_grid(plan)
    x = (rng.standard_normal((2, 3, 9, 7)) * 1.2).astype(np.float32)
    dy = rng.standard_normal(plan.output_shape(x.shape)).astype(np.float32)
    yr, dxr, gr = reference_grads(x, p, dy, 3, forward=ref_conv_forward(geom))
    assert rel(knp.kan_forward(plan, x, p), yr) < TOL
    dx, d = knp.kan_backward(plan, x, p, dy)
    assert rel(dx, dxr) < TOL and all(rel(d[n], gr[n]) < TOL for n in gr)
    before = {n: a.copy() for n, a in p.items()}
    grid, sw = knp.kan_update_grid(plan, x, p)
    for n in p:
        np.testing.assert_array_equal(p[n], before[n])
    assert not np.array_equal(grid, p["grid"]) and (np.diff(grid, axis=1) >= 0).all()
    m = kt.KANConv2d(3, 4, *geom)
    m.load_state_dict({n: torch.from_numpy(a) for n, a in p.items()})
    m.update_grid(torch.from_numpy(x))
    np.testing.assert_array_equal(m.grid.numpy(), grid)
    np.testing.assert_array_equal(m.spline_weight.detach().numpy(), sw)
    lin = kfuse.kan.KanLinearPlan(kfuse.Context("cpu"), 27, 4)
    patches = F.unfold(torch.from_numpy(x), 3, dilation=2, padding=1, stride=2)
    patches = patches.transpose(1, 2).reshape(-1, 27).contiguous().numpy()
    g2, sw2 = knp.kan_update_grid(lin, patches, p)
    np.testing.assert_array_equal(g2, grid)
    np.testing.assert_array_equal(sw2, sw)


def test_packed_args_match_field_by_field_fill():
    import kfuse.kan as kk
    from kfuse.sklinear import _fill_args
    assert kk._CONV_FWD_STRUCT is not None and kk._CONV_BWD_STRUCT is not None
    a = np.zeros((2, 3, 5, 4), np.float32)
    refs = [knp.tensor_ref(a), None, knp.tensor_ref(a[0]), (a.ctypes.data, 1, (7,), None),
            knp.tensor_ref(a.transpose(2, 0, 1, 3)), None]
    blobs = []
    for st in (kk._CONV_FWD_STRUCT, None):
        args = _fill_args({}, "kf_kan_conv2d_forward_args",
                          kfuse.lib.kf_kan_conv2d_forward_args_init, st, kk._FWD_FIELDS, refs)
        blobs.append(bytes(kfuse.ffi.buffer(args)))
    assert blobs[0] == blobs[1]


# ---- errors ------------------------------------------------------------------------------------

def test_wrong_channel_count_is_a_clear_error():
    m = kt.KANConv2d(3, 4, 3, padding=1)
    for x in (torch.randn(2, 4, 8, 8), torch.randn(5, 8, 8)):
        with pytest.raises(kfuse.InvalidArgument) as e:
            m(x)
        msg = e.value.message
        assert msg.startswith("kf_kan_conv2d_forward: ") and "x" in msg, msg
        assert "3" in msg and ("4" in msg or "5" in msg), msg  # what was wanted, what came
    with pytest.raises(kfuse.InvalidArgument):
        m(torch.randn(3, 8, requires_grad=True))  # 2-D input
    with pytest.raises(kfuse.InvalidArgument):
        m(torch.randn(1, 1, 3, 8, 8))  # 5-D input
    with pytest.raises(kfuse.InvalidArgument):
        kt.KANConv2d(3, 4, 5)(torch.randn(1, 3, 4, 4))  # image smaller than the kernel
    with pytest.raises(kfuse.InvalidArgument, match="dtype"):
        m(torch.randn(1, 3, 8, 8, dtype=torch.float64))
    with torch.no_grad():
        m.grid[2, 5] = 10.0  # a decreasing grid: the library's to reject, naming it
    with pytest.raises(kfuse.InvalidArgument, match="grid"):
        m(torch.randn(1, 3, 8, 8))


def test_constructor_errors():
    with pytest.raises(ValueError, match="padding"):
        kt.KANConv2d(3, 4, 3, padding="same")
    with pytest.raises(ValueError, match="kernel_size"):
        kt.KANConv2d(3, 4, (3, 3, 3))
    for kw, field in ((dict(kernel_size=0), "kernel"), (dict(kernel_size=3, stride=0), "stride"),
                      (dict(kernel_size=3, padding=-1), "pad"),
                      (dict(kernel_size=3, dilation=0), "dilation"),
                      (dict(kernel_size=3, grid_size=0), "grid_size")):
        with pytest.raises(kfuse.InvalidArgument, match=field):
            kt.KANConv2d(3, 4, **kw)
    with pytest.raises(kfuse.InvalidArgument, match="in_channels"):
        KanConv2dPlan(kfuse.Context(), 0, 4, 3)
    with pytest.raises(kfuse.Unsupported, match="dtype"):
        kt.KANConv2d(3, 4, 3, dtype=torch.int32)


def test_default_init_scale_is_sane():
    """A freshly built layer (no randomize_) gives finite outputs of a sensible size."""
    torch.manual_seed(0)
    m = kt.KANConv2d(8, 16, 3, padding=1)
    y = m(torch.randn(2, 8, 10, 10))
    assert torch.isfinite(y).all() and 0 < y.std().item() < 10
    assert m.base_weight.abs().max().item() <= 1 / math.sqrt(72)  # kaiming_uniform_(a=sqrt(5))


# ---- CUDA (runs only where torch and kfuse both have CUDA) -------------------------------------

@pytest.mark.skipif(not cuda_ok(), reason="needs torch CUDA and a CUDA build of kfuse")
@pytest.mark.parametrize("cin,cout,ks,st,pad,dil,H,W,B", [
    (1, 5, 3, 1, 0, 1, 28, 28, 16),   # KKAN (Small)'s first layer
    (3, 4, 3, 2, 1, 2, 9, 7, 2),      # stride, padding, dilation
    (32, 32, 3, 1, 1, 1, 14, 14, 2),  # F = 288: several tiles
])
def test_cuda_forward_backward_vs_float64(cin, cout, ks, st, pad, dil, H, W, B):
    """CUDA tensors run on a CUDA context (the CUDA backend implements KANConv2d in float32, so
    an Unsupported here is a regression, not a skip): y and every gradient against the float64
    reference (on the device), and a CPU input is refused."""
    torch.manual_seed(0)
    m = randomize_(kt.KANConv2d(cin, cout, ks, stride=st, padding=pad, dilation=dil))
    geom = (ks, st, pad, dil)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(B, cin, H, W, generator=g)
    dy = random_dy(m, x, geom, g)
    m.cuda()
    check_against_reference(m, x.cuda(), dy.cuda(), geom)
    with pytest.raises(RuntimeError, match="same device"):
        m(x)


@pytest.mark.skipif(not cuda_ok(), reason="needs torch CUDA and a CUDA build of kfuse")
def test_cuda_float64_gradcheck():
    """A float64 KANConv2d on CUDA (the library's float64 CUDA path): the CPU's float64 result
    within 1e-12 (the CPU's is held to the reference above), and gradcheck of the operator on x
    and every parameter with stride, padding and dilation."""
    torch.manual_seed(0)
    m = randomize_(kt.KANConv2d(2, 3, 3, stride=(2, 1), padding=1, dilation=(1, 2))).double()
    mc = kt.KANConv2d(2, 3, 3, stride=(2, 1), padding=1, dilation=(1, 2), dtype=torch.float64,
                      device="cuda")
    mc.load_state_dict(m.state_dict())
    x = torch.randn(2, 2, 6, 7, dtype=torch.float64) * 1.3
    assert rel(mc(x.cuda()).cpu(), m(x)) < 1e-12
    p = params_of(mc)
    args = tuple(t.detach().clone().requires_grad_(True) for t in (
        x.cuda(), p["base_weight"], p["spline_weight"], p["spline_scaler"]))
    assert torch.autograd.gradcheck(
        lambda xx, bw, sw, sc: kt.kan_conv2d_function(xx, mc.grid, bw, sw, sc, (3, 3), (2, 1),
                                                      (1, 1), (1, 2)), args)
