"""Tests of the kfuse Python package for the KAN linear layer (KANLinear, efficient-kan's layer):
the numpy and torch front ends against a float64 transcription of efficient-kan's math (in
kan_reference.py, shared with test_kan_conv.py), its module layout and initialisation (a
transcription of efficient_kan.KANLinear there; the real package is compared too where it
imports), state_dict round trips, update_grid, curve2coeff, regularization_loss, errors and
threads.

    y = SiLU(x) base_weight^T + B(x) (spline_weight * spline_scaler[..., None])^T
    base_weight [out, in], spline_weight [out, in, G+k], spline_scaler [out, in] learnable;
    grid [in, G+2k+1] a buffer

Accuracy bar (DESIGN.md): ||out - ref|| / ||ref|| < 1e-5 for fp32 against float64.
"""
import math
import threading

import numpy as np
import pytest

import kfuse
import kfuse.numpy as knp
from kfuse._lowlevel import dtype_code
from kfuse.kan import KanLinearPlan

torch = pytest.importorskip("torch")
import kfuse.torch as kt  # noqa: E402
from devices import cuda_ok  # noqa: E402
from torch import nn  # noqa: E402

from kan_reference import (  # noqa: E402  (shared with test_kan_conv.py)
    GRADS, TOL, TOL64, EfficientKANRef, params_of, randomize_, ref_bases, ref_forward,
    reference_grads, rel, tol, uniform_grid_torch,
)


def greville(grid, k):
    """[in, G + k] Greville abscissae (t_{c+1} + .. + t_{c+k}) / k of each feature's knots:
    coefficients a * xi + b make the spline a x + b on [t_k, t_{G+k}] (k >= 1)."""
    C = grid.shape[1] - k - 1
    return torch.stack([grid[:, c + 1:c + k + 1].double().mean(1) for c in range(C)], 1)


# ---- forward and backward against the float64 transcription -----------------------------------

OP_CASES = [  # (in, out, G, k, leading dims of x, standalone scaler, x scale)
    (8, 8, 5, 3, (16,), True, 1.0),        # the defaults
    (13, 7, 1, 0, (9,), True, 1.0),        # G = 1, k = 0
    (13, 7, 1, 1, (9,), True, 1.0),        # G = 1, k = 1
    (13, 7, 1, 3, (9,), True, 1.0),        # G = 1, k = 3
    (10, 9, 5, 0, (11,), True, 1.0),       # G = 5, k = 0
    (10, 9, 5, 1, (11,), True, 1.0),       # G = 5, k = 1
    (21, 19, 5, 3, (1,), True, 1.0),       # batch 1
    (12, 10, 5, 3, (2, 3), True, 1.0),     # 3-D input
    (12, 10, 5, 3, (), True, 1.0),         # 1-D input
    (12, 10, 5, 3, (6,), False, 1.0),      # no standalone scaler
    (17, 11, 5, 3, (40,), True, 3.0),      # inputs far outside grid_range (and its extension)
    (9, 6, 1, 1, (7,), False, 2.5),        # outside, no scaler, G = 1
    (12, 10, 5, 3, (2, 1, 2, 1, 1, 1, 3), True, 1.0),  # 8-D input: more dims than KF_MAX_DIMS
    (150, 70, 5, 3, (200,), True, 1.0),    # a GEMM-sized case (several threads' worth)
    # the CPU backend's windowed path (out >= 256; cpu/kan_linear.c kan_sparse_pick)
    (20, 300, 10, 3, (150,), True, 1.0),   # both directions, 2 row blocks
    (12, 520, 5, 3, (30,), False, 2.0),    # forward only, inputs outside the grid
    (9, 256, 20, 5, (2, 20), True, 3.0),   # both directions, k = 5
    (1, 1, 5, 3, (4,), True, 1.0),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("inf,outf,G,k,lead,standalone,xs", OP_CASES)
def test_torch_forward_backward_vs_float64(inf, outf, G, k, lead, standalone, xs, dtype):
    """The module in float32 (the library's float32 kernels, < 1e-5) and in float64
    (dtype=torch.float64: its float64 kernels, < 1e-12) against the float64 reference."""
    torch.manual_seed(0)
    m = randomize_(kt.KANLinear(inf, outf, grid_size=G, spline_order=k,
                                enable_standalone_scale_spline=standalone, dtype=dtype))
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(lead + (inf,), generator=g) * xs).to(dtype)
    dy = torch.randn(lead + (outf,), generator=g).to(dtype)
    xk = x.clone().requires_grad_(True)
    y = m(xk)
    assert y.shape == lead + (outf,) and y.dtype == dtype
    y.backward(dy)
    yr, dxr, gr = reference_grads(x, params_of(m), dy, k)
    errs = {"y": rel(y, yr), "dx": rel(xk.grad, dxr),
            "dbase_weight": rel(m.base_weight.grad, gr["base_weight"]),
            "dspline_weight": rel(m.spline_weight.grad, gr["spline_weight"])}
    if standalone:
        errs["dspline_scaler"] = rel(m.spline_scaler.grad, gr["spline_scaler"])
    else:
        assert not hasattr(m, "spline_scaler")
    bad = {n: e for n, e in errs.items() if not e < tol(dtype)}
    assert not bad, bad
    assert m.grid.grad is None and not m.grid.requires_grad


# efficient-kan takes any activation module class; its tests use Identity
ACTIVATIONS = [(nn.Identity, lambda t: t), (nn.ReLU, torch.relu),
               (nn.GELU, torch.nn.functional.gelu), (nn.Tanh, torch.tanh)]


@pytest.mark.parametrize("act,fn", ACTIVATIONS, ids=lambda v: getattr(v, "__name__", ""))
@pytest.mark.parametrize("standalone", [True, False])
def test_any_base_activation_vs_float64(act, fn, standalone):
    """A base_activation other than SiLU: its branch in torch, the splines in kfuse; y and every
    gradient against the float64 reference with that activation."""
    torch.manual_seed(0)
    m = randomize_(kt.KANLinear(9, 7, base_activation=act,
                                enable_standalone_scale_spline=standalone))
    assert type(m.base_activation) is act
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, 9, generator=g) * 1.5
    dy = torch.randn(3, 5, 7, generator=g)
    xk = x.clone().requires_grad_(True)
    y = m(xk)
    y.backward(dy)
    yr, dxr, gr = reference_grads(x, params_of(m), dy, 3,
                                  forward=lambda *a: ref_forward(*a, activation=fn))
    errs = {"y": rel(y, yr), "dx": rel(xk.grad, dxr)}
    errs.update({"d" + n: rel(getattr(m, n).grad, gr[n]) for n in gr})
    bad = {n: e for n, e in errs.items() if not e < TOL}
    assert not bad, bad


def test_only_some_gradients_requested():
    """Frozen spline_weight, no grad for x: backward writes just what autograd asks for."""
    torch.manual_seed(0)
    m = randomize_(kt.KANLinear(12, 8))
    m.spline_weight.requires_grad_(False)
    x = torch.randn(5, 12)
    dy = torch.randn(5, 8)
    m(x).backward(dy)
    _, _, gr = reference_grads(x, params_of(m), dy, 3)
    assert m.spline_weight.grad is None
    assert rel(m.base_weight.grad, gr["base_weight"]) < TOL
    assert rel(m.spline_scaler.grad, gr["spline_scaler"]) < TOL
    # x alone
    m.requires_grad_(False)
    xg = x.clone().requires_grad_(True)
    m(xg).backward(dy)
    _, dxr, _ = reference_grads(x, params_of(m), dy, 3)
    assert rel(xg.grad, dxr) < TOL and m.base_weight.grad is not None


def test_gradients_accumulate_like_torch():
    torch.manual_seed(0)
    m = randomize_(kt.KANLinear(10, 6, grid_size=4, spline_order=2))
    x = torch.randn(7, 10)
    for _ in range(2):
        m(x).pow(2).sum().backward()
    p = {n: (t.detach().double().requires_grad_(n != "grid")) for n, t in params_of(m).items()}
    for _ in range(2):
        ref_forward(x.double(), p["grid"], p["base_weight"], p["spline_weight"],
                    p["spline_scaler"], 2).pow(2).sum().backward()
    for n in GRADS:
        assert rel(getattr(m, n).grad, p[n].grad) < TOL, n


def test_finite_differences():
    """y is linear in each parameter, so a central difference along a random direction equals
    the directional derivative up to float32 rounding of the loss; in x (off the knots) the
    cubic pieces make a small central difference accurate to O(h^2)."""
    torch.manual_seed(0)
    m = randomize_(kt.KANLinear(7, 5, grid_size=3, spline_order=3))
    g = torch.Generator().manual_seed(3)
    x = torch.rand(4, 7, generator=g) * 1.6 - 0.8
    w = torch.randn(4, 5, generator=g)

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
    m = kt.KANLinear(6, 4)
    x = torch.randn(0, 6, requires_grad=True)
    y = m(x)
    assert y.shape == (0, 4)
    y.sum().backward()
    assert x.grad.shape == (0, 6)
    assert torch.count_nonzero(m.base_weight.grad) == 0
    assert torch.count_nonzero(m.spline_weight.grad) == 0
    assert m(torch.randn(2, 0, 6)).shape == (2, 0, 4)


def test_non_contiguous_input_and_no_grad():
    torch.manual_seed(0)
    m = randomize_(kt.KANLinear(10, 6))
    x = torch.randn(10, 4).T  # [4, 10], not contiguous
    with torch.no_grad():
        y = m(x)
    assert y.grad_fn is None
    assert rel(y, ref_forward(x.double(), *[t.double() for t in (
        m.grid, m.base_weight, m.spline_weight, m.spline_scaler)], 3)) < TOL


# ---- the module's layout: efficient-kan's names, shapes, Parameter/buffer split ----------------

@pytest.mark.parametrize("standalone", [True, False])
def test_layout_matches_efficient_kan(standalone):
    k = kt.KANLinear(12, 20, grid_size=4, spline_order=2,
                     enable_standalone_scale_spline=standalone)
    r = EfficientKANRef(12, 20, grid_size=4, spline_order=2,
                        enable_standalone_scale_spline=standalone)
    ks, rs = k.state_dict(), r.state_dict()
    assert list(ks) == list(rs)
    for n in rs:
        assert ks[n].shape == rs[n].shape and ks[n].dtype == rs[n].dtype, n
    assert [n for n, _ in k.named_parameters()] == [n for n, _ in r.named_parameters()]
    assert [n for n, _ in k.named_buffers()] == [n for n, _ in r.named_buffers()] == ["grid"]
    assert k.grid.shape == (12, 4 + 2 * 2 + 1) and not isinstance(k.grid, nn.Parameter)
    assert k.base_weight.shape == (20, 12) and k.spline_weight.shape == (20, 12, 6)
    if standalone:
        assert isinstance(k.spline_scaler, nn.Parameter) and k.spline_scaler.shape == (20, 12)
    else:
        assert not hasattr(k, "spline_scaler") and "spline_scaler" not in ks
    for attr in ("in_features", "out_features", "grid_size", "spline_order", "scale_noise",
                 "scale_base", "scale_spline", "enable_standalone_scale_spline", "grid_eps"):
        assert getattr(k, attr) == getattr(r, attr), attr
    assert isinstance(k.base_activation, nn.SiLU)


@pytest.mark.parametrize("standalone", [True, False])
def test_state_dict_round_trip_both_ways(standalone):
    torch.manual_seed(0)
    x = torch.randn(3, 5, 12) * 1.5
    # efficient-kan's module -> kfuse (after a grid update there, so the grid is non-uniform)
    r = EfficientKANRef(12, 20, enable_standalone_scale_spline=standalone)
    r.update_grid(torch.randn(64, 12))
    k = kt.KANLinear(12, 20, enable_standalone_scale_spline=standalone)
    k.load_state_dict(r.state_dict(), strict=True)
    with torch.no_grad():
        assert rel(k(x), EfficientKANRef.forward(r.double(), x.double())) < TOL
    # kfuse -> efficient-kan's module (in float64, a dtype kfuse does not run)
    k2 = randomize_(kt.KANLinear(12, 20, enable_standalone_scale_spline=standalone))
    k2.update_grid(torch.randn(64, 12))
    r2 = EfficientKANRef(12, 20, enable_standalone_scale_spline=standalone,
                         dtype=torch.float64)
    r2.load_state_dict(k2.state_dict(), strict=True)
    with torch.no_grad():
        assert rel(k2(x), r2(x.double())) < TOL
    for n, t in k2.state_dict().items():
        assert torch.equal(r2.state_dict()[n].float(), t), n


# ---- initialisation ----------------------------------------------------------------------------

@pytest.mark.parametrize("inf,G,k,lo,hi", [(5, 5, 3, -1, 1), (3, 7, 2, -3, -1), (4, 1, 0, 0, 1),
                                           (2, 4, 1, -0.5, 2.25), (3, 10, 3, -1.0, 1.0)])
def test_grid_has_torch_bits(inf, G, k, lo, hi):
    m = kt.KANLinear(inf, 3, grid_size=G, spline_order=k, grid_range=[lo, hi])
    want = uniform_grid_torch(inf, G, k, lo, hi)
    assert m.grid.dtype == want.dtype and torch.equal(m.grid, want)
    plan = KanLinearPlan(kfuse.Context(), inf, 3, grid_size=G, spline_order=k)
    np.testing.assert_array_equal(knp.kan_linear_uniform_grid(plan, lo, hi), want.numpy())


@pytest.mark.parametrize("G,k,standalone", [(5, 3, True), (5, 1, True), (3, 2, False),
                                            (1, 1, True)])
def test_init_matches_efficient_kan_with_the_same_seed(G, k, standalone):
    """Same draws in the same order: base_weight and spline_scaler bit for bit; spline_weight
    up to the solver (efficient-kan's float32 lstsq against kfuse's float64 gelsd)."""
    kw = dict(grid_size=G, spline_order=k, enable_standalone_scale_spline=standalone,
              scale_base=0.7, scale_spline=1.3, scale_noise=0.2)
    torch.manual_seed(7)
    r = EfficientKANRef(24, 16, **kw)
    after_r = torch.rand(1)
    torch.manual_seed(7)
    m = kt.KANLinear(24, 16, **kw)
    after_m = torch.rand(1)
    assert torch.equal(after_r, after_m)  # the generator advanced by the same draws
    assert torch.equal(m.grid, r.grid) and torch.equal(m.base_weight, r.base_weight)
    if standalone:
        assert torch.equal(m.spline_scaler, r.spline_scaler)
    assert rel(m.spline_weight, r.spline_weight) < 1e-4
    # and the spline through the coefficients reproduces the noise at the G + 1 points
    torch.manual_seed(7)
    nn.init.kaiming_uniform_(torch.empty(16, 24), a=math.sqrt(5) * 0.7)
    noise = (torch.rand(G + 1, 24, 16) - 0.5) * 0.2 / G
    pts = m.grid.T[k:k + G + 1].double()
    vals = torch.einsum("bic,oic->bio", ref_bases(pts, m.grid.double(), k),
                        m.spline_weight.double())
    scale = 1.0 if standalone else 1.3
    assert rel(vals, scale * noise.double()) < 1e-5


def test_init_spline_order_zero():
    """efficient-kan's grid.T[k:-k] is empty for k = 0 (its constructor fails there); kfuse fits
    the noise at all G + 1 knots: the constant pieces take the values at their left knots."""
    torch.manual_seed(0)
    m = kt.KANLinear(6, 4, grid_size=5, spline_order=0)
    torch.manual_seed(0)
    nn.init.kaiming_uniform_(torch.empty(4, 6), a=math.sqrt(5))
    noise = (torch.rand(6, 6, 4) - 0.5) * 0.1 / 5
    assert rel(m.spline_weight, noise[:5].permute(2, 1, 0)) < 1e-6


def test_init_repeatable_with_torch_manual_seed():
    torch.manual_seed(42)
    a = kt.KANLinear(30, 20)
    b = kt.KANLinear(30, 20)
    torch.manual_seed(42)
    c = kt.KANLinear(30, 20)
    for n in a.state_dict():
        assert torch.equal(a.state_dict()[n], c.state_dict()[n]), n
    assert not torch.equal(a.base_weight, b.base_weight)


def test_reset_parameters_and_meta_device():
    m = kt.KANLinear(8, 6, device="meta")
    assert m.spline_weight.device.type == "meta" and m.grid.shape == (8, 12)
    torch.manual_seed(1)
    m2 = kt.KANLinear(8, 6)
    torch.manual_seed(1)
    m2.reset_parameters()
    torch.manual_seed(1)
    m3 = kt.KANLinear(8, 6)
    for n in ("base_weight", "spline_weight", "spline_scaler"):
        assert torch.equal(getattr(m2, n), getattr(m3, n)), n


# ---- b_splines, curve2coeff, update_grid, regularization_loss ----------------------------------

def test_b_splines_and_curve2coeff_match_the_transcription():
    torch.manual_seed(0)
    m = kt.KANLinear(6, 5)
    r = EfficientKANRef(6, 5, dtype=torch.float64)
    x = torch.rand(50, 6) * 2.4 - 1.2
    B = m.b_splines(x)
    assert B.shape == (50, 6, 8) and B.dtype == torch.float32
    assert rel(B, r.b_splines(x.double())) < 1e-6
    y = torch.randn(50, 6, 5)
    c = m.curve2coeff(x, y)
    assert c.shape == (5, 6, 8) and c.dtype == torch.float32
    assert rel(c, r.curve2coeff(x.double(), y.double())) < 1e-5
    with pytest.raises(ValueError, match="curve2coeff"):
        m.curve2coeff(x, y[:, :, :4])


def set_linear_splines_(m, seed=0):
    """spline_weight such that every spline is a x + b on grid_range (b alone for k = 0)."""
    g = torch.Generator().manual_seed(seed)
    o, i, k = m.out_features, m.in_features, m.spline_order
    a = torch.randn(o, i, 1, generator=g, dtype=torch.float64)
    b = torch.randn(o, i, 1, generator=g, dtype=torch.float64)
    with torch.no_grad():
        if k == 0:
            m.spline_weight.copy_(b.expand(o, i, m.grid_size))
        else:
            m.spline_weight.copy_(a * greville(m.grid, k)[None] + b)


@pytest.mark.parametrize("G,k", [(5, 3), (1, 0), (5, 1), (8, 2), (1, 1), (5, 0)])
@pytest.mark.parametrize("standalone", [True, False])
def test_update_grid_keeps_the_output(G, k, standalone):
    """efficient-kan's invariant: the refit on the new knots reproduces the spline output on the
    batch. Splines that are polynomials of degree <= k on the batch's range are reproduced
    exactly by any knots covering it, so the layer's output stays put up to float32 rounding;
    the new grid is non-decreasing per feature and passes the library's checks."""
    torch.manual_seed(0)
    m = kt.KANLinear(16, 12, grid_size=G, spline_order=k,
                     enable_standalone_scale_spline=standalone)
    set_linear_splines_(m)
    x = torch.rand(300, 16) * 1.98 - 0.99
    with torch.no_grad():
        y0 = m(x)
    old = m.grid.clone()
    m.update_grid(x)
    assert not torch.equal(m.grid, old)
    assert (m.grid[:, 1:] >= m.grid[:, :-1]).all()
    with torch.no_grad():
        y1 = m(x)
    assert rel(y1, y0) < TOL
    # the knots cover the batch: the first and last of the G + 1 inner knots bracket it
    assert (m.grid[:, k] <= x.min(0)[0]).all() and (m.grid[:, k + G] > x.max(0)[0]).all()


@pytest.mark.parametrize("G", [1, 2, 5, 7, 10, 13, 16, 20])
def test_update_grid_quantiles_are_the_torch_in_use_s(G):
    """efficient-kan's quantile indices are torch.linspace(0, M - 1, G + 1, dtype=torch.int64),
    which rounds differently on torch 1.13 and 2.x: a pure-quantile update (grid_eps = 0,
    margin = 0) of the samples 0..M-1 puts the inner knots on those indices of the torch in use;
    and efficient-kan's own update gives the same knots (batch 33, G = 10 is where the two
    torches differ)."""
    m = kt.KANLinear(1, 1, grid_size=G, spline_order=1, grid_eps=0.0)
    g = torch.Generator().manual_seed(G)
    for M in list(range(2, 70)) + [97, 128, 255, 1000]:
        x = torch.randperm(M, generator=g).to(torch.float32).unsqueeze(1)
        m.update_grid(x, margin=0.0)
        want = torch.linspace(0, M - 1, G + 1, dtype=torch.int64).to(torch.float32)
        assert torch.equal(m.grid[0, 1:G + 2], want), (M, G, m.grid[0, 1:G + 2], want)
    x = torch.randn(33, 4)
    k = randomize_(kt.KANLinear(4, 3, grid_size=10, enable_standalone_scale_spline=False))
    r = EfficientKANRef(4, 3, grid_size=10, enable_standalone_scale_spline=False)
    r.load_state_dict(k.state_dict())
    k.update_grid(x)
    r.update_grid(x)
    assert torch.equal(k.grid, r.grid)


def test_update_grid_general_case_is_the_float64_least_squares_fit():
    """For arbitrary splines the refit is a least-squares fit: the new grid has the bits of
    efficient-kan's update, and the new spline_weight is the float64 least-squares solution on
    it (without a standalone scaler exactly efficient-kan's update, which is then reproduced to
    float32 accuracy)."""
    torch.manual_seed(0)
    x = torch.randn(200, 9) * 1.3
    m = randomize_(kt.KANLinear(9, 7, enable_standalone_scale_spline=False))
    r = EfficientKANRef(9, 7, enable_standalone_scale_spline=False)
    r.load_state_dict(m.state_dict())
    old_grid, old_w = m.grid.double(), m.spline_weight.detach().double()
    m.update_grid(x)
    r.update_grid(x)
    assert torch.equal(m.grid, r.grid)
    assert (m.grid[:, 1:] >= m.grid[:, :-1]).all()
    target = torch.einsum("bic,oic->ibo", ref_bases(x.double(), old_grid, 3), old_w)
    A = ref_bases(x.double(), m.grid.double(), 3).transpose(0, 1)
    want = torch.linalg.lstsq(A, target, driver="gelsd").solution.permute(2, 0, 1)
    assert rel(m.spline_weight, want) < TOL
    assert rel(m.spline_weight, r.spline_weight) < 1e-3  # efficient-kan's float32 solve
    # with a standalone scaler the fit is of spline_weight's own splines (the output is kept)
    m2 = randomize_(kt.KANLinear(9, 7))
    old_grid, old_w = m2.grid.double(), m2.spline_weight.detach().double()
    m2.update_grid(x)
    target = torch.einsum("bic,oic->ibo", ref_bases(x.double(), old_grid, 3), old_w)
    A = ref_bases(x.double(), m2.grid.double(), 3).transpose(0, 1)
    want = torch.linalg.lstsq(A, target, driver="gelsd").solution.permute(2, 0, 1)
    assert rel(m2.spline_weight, want) < TOL


@pytest.mark.parametrize("k", [0, 1, 3])
@pytest.mark.parametrize("grid_eps", [0.02, 0.0])
def test_update_grid_with_repeated_values_does_not_fail(k, grid_eps):
    """Repeated values make knots a hair apart (grid_eps > 0) or repeated (grid_eps = 0: the
    knots are quantiles of x). Over a zero-width span efficient-kan's bases are 0/0 = NaN and its
    lstsq returns NaN or fails (the SGELSY error of efficient-kan issue #20). Here such spans
    count as 0, the solve is SVD-based in float64, and the layer stays finite and usable; a
    constant feature works too."""
    torch.manual_seed(0)
    m = kt.KANLinear(5, 4, spline_order=k, grid_eps=grid_eps)
    x = (torch.randint(0, 3, (64, 5)) / 2.0) - 0.5   # three values per feature
    x[:, 2] = 0.25                                   # a constant feature
    x[:40, 3] = 0.0                                  # mostly one value
    m.update_grid(x)
    assert torch.isfinite(m.grid).all() and torch.isfinite(m.spline_weight).all()
    assert (m.grid[:, 1:] >= m.grid[:, :-1]).all()
    if grid_eps == 0.0:
        assert ((m.grid[:, 1:] - m.grid[:, :-1]) == 0).any()  # repeated knots indeed
    if grid_eps == 0.0 and k > 0:  # (efficient-kan's constructor fails for k = 0)
        r = EfficientKANRef(5, 4, spline_order=k, grid_eps=grid_eps)
        r.load_state_dict(m.state_dict())
        with torch.no_grad():
            r.grid.copy_(uniform_grid_torch(5, 5, k, -1, 1))
        try:  # the transcription of efficient-kan: NaN, or LAPACK's error
            r.update_grid(x)
            assert not torch.isfinite(r.spline_weight).all()
        except RuntimeError:
            pass
    with torch.no_grad():
        assert torch.isfinite(m(x)).all()
    xx = (torch.rand(32, 5) - 0.5).requires_grad_(True)
    y = m(xx)
    y.sum().backward()
    assert torch.isfinite(y).all() and torch.isfinite(xx.grad).all()
    assert torch.isfinite(m.spline_weight.grad).all()
    m.update_grid(torch.randn(64, 5))  # and back to a regular grid
    assert torch.isfinite(m.spline_weight).all()
    with pytest.raises(ValueError, match="args->x"):
        m.update_grid(torch.full((8, 5), float("nan")))
    with pytest.raises(ValueError, match="update_grid"):
        m.update_grid(torch.randn(8, 6))


@pytest.mark.parametrize("ra,re", [(1.0, 1.0), (0.3, 2.0), (0.0, 1.0)])
def test_regularization_loss_matches_the_transcription(ra, re):
    torch.manual_seed(0)
    m = randomize_(kt.KANLinear(7, 5))
    r = EfficientKANRef(7, 5, dtype=torch.float64)
    r.load_state_dict(m.state_dict())
    got = m.regularization_loss(ra, re)
    want = r.regularization_loss(ra, re)
    assert abs(got.item() - want.item()) <= 1e-6 * max(1.0, abs(want.item()))
    got.backward()
    want.backward()
    assert rel(m.spline_weight.grad, r.spline_weight.grad) < 1e-6
    assert m.regularization_loss().item() == pytest.approx(r.regularization_loss().item(),
                                                           rel=1e-6)


def test_scaled_spline_weight():
    m = randomize_(kt.KANLinear(4, 3))
    torch.testing.assert_close(m.scaled_spline_weight,
                               m.spline_weight * m.spline_scaler.unsqueeze(-1))
    m2 = kt.KANLinear(4, 3, enable_standalone_scale_spline=False)
    torch.testing.assert_close(m2.scaled_spline_weight, m2.spline_weight)


# ---- numpy front end ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: d.__name__)
@pytest.mark.parametrize("standalone", [True, False])
def test_numpy_forward_backward_vs_float64(standalone, dtype):
    """The numpy front end on a float32 plan (< 1e-5) and a float64 one (< 1e-12): outputs and
    gradients in the plan's dtype."""
    plan = KanLinearPlan(kfuse.Context("cpu"), 20, 12, grid_size=4, spline_order=2,
                         standalone_scale=standalone, dtype=dtype_code(np.dtype(dtype)))
    want_info = [("base_weight", (12, 20)), ("spline_weight", (12, 20, 6))]
    if standalone:
        want_info.append(("spline_scaler", (12, 20)))
    assert plan.param_info == want_info + [("grid", (20, 9))]
    rng = np.random.default_rng(0)
    params = {n: rng.uniform(-0.3, 0.3, s).astype(dtype) for n, s in plan.param_info}
    params["grid"] = knp.kan_linear_uniform_grid(plan, -1.0, 1.0)
    assert params["grid"].dtype == dtype
    x = (rng.standard_normal((2, 4, 20)) * 1.2).astype(dtype)
    dy = rng.standard_normal((2, 4, 12)).astype(dtype)
    y = knp.kan_linear_forward(plan, x, params)
    yr, dxr, gr = reference_grads(x, params, dy, 2)
    assert y.dtype == dtype and y.shape == (2, 4, 12)
    assert rel(y, yr) < tol(dtype)
    y2 = knp.kan_linear_forward(plan, x, [params[n] for n in plan.param_names])
    np.testing.assert_array_equal(y, y2)
    dx, dp = knp.kan_linear_backward(plan, x, params, dy)
    assert sorted(dp) == sorted(n for n in GRADS if standalone or n != "spline_scaler")
    assert dx.dtype == dtype and rel(dx, dxr) < tol(dtype)
    for n in dp:
        assert dp[n].dtype == dtype and rel(dp[n], gr[n]) < tol(dtype), n
    # accumulate into given buffers; a subset of outputs
    acc = {n: a.copy() for n, a in dp.items()}
    dx_none, acc2 = knp.kan_linear_backward(plan, x, params, dy, need_dx=False, dparams=acc,
                                            accumulate=True)
    assert dx_none is None and acc2["base_weight"] is acc["base_weight"]
    for n in dp:
        np.testing.assert_allclose(acc[n], 2 * dp[n], rtol=1e-5, atol=1e-6)
    only = {"spline_weight": np.empty((12, 20, 6), dtype)}
    _, ob = knp.kan_linear_backward(plan, x, params, dy, need_dx=False, dparams=only)
    np.testing.assert_allclose(ob["spline_weight"], dp["spline_weight"], rtol=1e-6, atol=1e-7)


def test_numpy_accepts_a_torch_state_dict():
    torch.manual_seed(0)
    m = kt.KANLinear(16, 12)
    plan = KanLinearPlan(kfuse.Context(), 16, 12)
    x = torch.randn(5, 16)
    y = knp.kan_linear_forward(plan, x, m.state_dict())  # torch tensors through DLPack
    np.testing.assert_allclose(y, m(x).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_every_output_element_written():
    """Outputs poisoned with NaN before the call come back finite (low-level API)."""
    ctx = kfuse.Context()
    ref = knp.tensor_ref
    for standalone in (True, False):
        plan = KanLinearPlan(ctx, 19, 23, grid_size=5, spline_order=3,
                             standalone_scale=standalone)
        rng = np.random.default_rng(0)
        p = {n: rng.uniform(-0.5, 0.5, s).astype(np.float32) for n, s in plan.param_info}
        p["grid"] = np.full((19, 12), np.nan, np.float32)
        plan.uniform_grid(-1.0, 1.0, ref(p["grid"]))
        assert np.isfinite(p["grid"]).all()
        x = rng.standard_normal((6, 19)).astype(np.float32)
        y = np.full((6, 23), np.nan, np.float32)
        plan.forward(ref(x), ref(p["grid"]), ref(p["base_weight"]), ref(p["spline_weight"]),
                     ref(y), spline_scaler=ref(p.get("spline_scaler")))
        assert np.isfinite(y).all()
        dx = np.full(x.shape, np.nan, np.float32)
        d = {n: np.full(s, np.nan, np.float32) for n, s in plan.param_info if n != "grid"}
        plan.backward(ref(x), ref(p["grid"]), ref(p["base_weight"]), ref(p["spline_weight"]),
                      ref(np.ones_like(y)), spline_scaler=ref(p.get("spline_scaler")),
                      dx=ref(dx), dbase_weight=ref(d["base_weight"]),
                      dspline_weight=ref(d["spline_weight"]),
                      dspline_scaler=ref(d.get("spline_scaler")))
        assert np.isfinite(dx).all() and all(np.isfinite(v).all() for v in d.values())
        assert plan.workspace_size(6) >= 0


def test_packed_args_match_field_by_field_fill():
    import kfuse.kan as kk
    from kfuse.sklinear import _fill_args
    assert kk._FWD_STRUCT is not None and kk._BWD_STRUCT is not None
    a = np.zeros((2, 3, 5), np.float32)
    refs = [knp.tensor_ref(a), None, knp.tensor_ref(a[0]), (a.ctypes.data, 1, (7,), None),
            knp.tensor_ref(a.transpose(2, 0, 1)), None]
    blobs = []
    for st in (kk._FWD_STRUCT, None):
        args = _fill_args({}, "kf_kan_linear_forward_args",
                          kfuse.lib.kf_kan_linear_forward_args_init, st, kk._FWD_FIELDS, refs)
        blobs.append(bytes(kfuse.ffi.buffer(args)))
    assert blobs[0] == blobs[1]


# ---- errors ------------------------------------------------------------------------------------

def test_errors_carry_the_library_message():
    m = kt.KANLinear(8, 6)
    with pytest.raises(kfuse.InvalidArgument) as e:
        m(torch.randn(3, 9))
    assert e.value.message.startswith("kf_kan_linear_forward: ") and "x" in e.value.message
    with pytest.raises(kfuse.InvalidArgument, match="dtype"):
        m(torch.randn(3, 8, dtype=torch.float64))
    with pytest.raises(kfuse.InvalidArgument):
        m(torch.tensor(1.0))  # 0-d input
    # a decreasing grid is the library's to reject, naming the grid
    with torch.no_grad():
        m.grid[2, 5] = 10.0
    with pytest.raises(kfuse.InvalidArgument, match="grid"):
        m(torch.randn(3, 8))
    plan = KanLinearPlan(kfuse.Context(), 8, 6, standalone_scale=False)
    p = {n: np.zeros(s, np.float32) for n, s in plan.param_info}
    p["grid"] = knp.kan_linear_uniform_grid(plan)
    p["spline_scaler"] = np.zeros((6, 8), np.float32)
    with pytest.raises(kfuse.InvalidArgument, match="spline_scaler"):
        knp.kan_linear_forward(plan, np.zeros((2, 8), np.float32), p)


def test_constructor_errors():
    with pytest.raises(kfuse.InvalidArgument, match="grid_size"):
        kt.KANLinear(8, 6, grid_size=0)
    with pytest.raises(kfuse.InvalidArgument, match="spline_order"):
        kt.KANLinear(8, 6, spline_order=-1)
    with pytest.raises(kfuse.InvalidArgument, match="in_features"):
        KanLinearPlan(kfuse.Context(), 0, 6)
    with pytest.raises(kfuse.Unsupported, match="dtype"):
        kt.KANLinear(8, 6, dtype=torch.int32)
    with pytest.raises(kfuse.InvalidArgument):
        kt.KANLinear(8, 6, grid_range=[1, -1])


# ---- float64 -----------------------------------------------------------------------------------

def test_float64_module_follows_its_parameters():
    """dtype=torch.float64 and .double() of a float32 module run the library's float64 kernels:
    float64 tensors (the initial grid formed in float64 as torch forms efficient-kan's under a
    float64 default dtype), y against the float64 reference < 1e-12, gradcheck of the operator on
    every differentiable input; an input of another dtype than the parameters' is an
    InvalidArgument naming it."""
    torch.manual_seed(0)
    m = randomize_(kt.KANLinear(6, 5, dtype=torch.float64))
    assert all(t.dtype == torch.float64 for t in m.state_dict().values())
    h = 2.0 / 5
    assert torch.equal(m.grid[0], torch.arange(-3, 9, dtype=torch.float64) * h - 1.0)
    m2 = kt.KANLinear(6, 5).double()
    m2.load_state_dict(m.state_dict())
    x = torch.randn(11, 6, dtype=torch.float64) * 1.3
    p = params_of(m)
    want = ref_forward(x, p["grid"], p["base_weight"], p["spline_weight"], p["spline_scaler"], 3)
    for mod in (m, m2):
        y = mod(x)
        assert y.dtype == torch.float64 and rel(y, want) < TOL64
    args = tuple(t.detach().clone().requires_grad_(True) for t in (
        x[:4], p["base_weight"], p["spline_weight"], p["spline_scaler"]))
    assert torch.autograd.gradcheck(
        lambda xx, bw, sw, sc: kt.kan_linear_function(xx, m.grid, bw, sw, sc), args)
    with pytest.raises(kfuse.InvalidArgument, match=r"args->x\.dtype"):
        m(torch.randn(3, 6))
    with pytest.raises(kfuse.InvalidArgument, match=r"args->x\.dtype"):
        kt.KANLinear(6, 5)(x)


@pytest.mark.skipif(not kt.HAS_TORCH_LIBRARY, reason="torch.library operators need torch >= 2.4")
def test_float64_operators_opcheck():
    """The float64 operators of both layers, forward and backward, pass torch.library.opcheck
    (schema, autograd registration, fake kernel against the real one, AOT dispatch)."""
    torch.manual_seed(0)
    f64 = torch.float64
    kl = randomize_(kt.KANLinear(6, 4, dtype=f64))
    kc = randomize_(kt.KANConv2d(2, 3, 3, stride=2, padding=1, dtype=f64))
    geo = ([3, 3], [2, 2], [1, 1], [1, 1])
    xk = torch.randn(5, 6, dtype=f64, requires_grad=True)
    xc = torch.randn(2, 2, 7, 6, dtype=f64, requires_grad=True)
    ops = torch.ops.kfuse
    torch.library.opcheck(ops.kan_linear.default, (xk, kl.grid, kl.base_weight, kl.spline_weight,
                                                   kl.spline_scaler))
    torch.library.opcheck(ops.kan_conv2d.default, (xc, kc.grid, kc.base_weight, kc.spline_weight,
                                                   kc.spline_scaler, *geo))
    p = [t.detach() for t in (kl.base_weight, kl.spline_weight, kl.spline_scaler)]
    torch.library.opcheck(ops.kan_linear_backward.default,
                          (torch.randn(5, 4, dtype=f64), xk.detach(), kl.grid, *p,
                           [True, True, True, True]))
    p = [t.detach() for t in (kc.base_weight, kc.spline_weight, kc.spline_scaler)]
    torch.library.opcheck(ops.kan_conv2d_backward.default,
                          (torch.randn(2, 3, 4, 3, dtype=f64), xc.detach(), kc.grid, *p, *geo,
                           [True, False, True, True]))


def test_float64_update_grid_is_efficient_kan_s():
    """A float64 layer's update_grid (no standalone scaler: exactly efficient-kan's update) against
    efficient-kan's in float64: with margin and grid_eps exact in float32 the knots agree to
    rounding and the refit to efficient-kan's float64 solve (< 1e-12); with the defaults (0.01 and
    0.02, which reach the library as float32 values) the knots agree to 1e-8."""
    torch.manual_seed(0)
    x = torch.randn(200, 9, dtype=torch.float64) * 1.3
    for grid_eps, margin, knot_tol in ((0.25, 0.0625, 1e-14), (0.02, 0.01, 1e-8)):
        m = randomize_(kt.KANLinear(9, 7, enable_standalone_scale_spline=False, grid_eps=grid_eps,
                                    dtype=torch.float64))
        r = EfficientKANRef(9, 7, enable_standalone_scale_spline=False, grid_eps=grid_eps,
                            dtype=torch.float64)
        r.load_state_dict(m.state_dict())
        m.update_grid(x, margin=margin)
        r.update_grid(x, margin=margin)
        assert m.grid.dtype == torch.float64 and m.spline_weight.dtype == torch.float64
        assert (m.grid - r.grid).abs().max() < knot_tol
        if knot_tol < 1e-12:
            assert rel(m.spline_weight, r.spline_weight) < TOL64


# ---- threads -----------------------------------------------------------------------------------

def test_threads_use_their_own_contexts():
    torch.manual_seed(0)
    m = kt.KANLinear(128, 96)
    x = torch.randn(64, 128)
    want = m(x).detach()
    results, errors = [None] * 4, []

    def work(i):
        try:
            for _ in range(3):
                xx = x.clone().requires_grad_(True)
                y = m(xx)
                y.sum().backward()
                results[i] = y.detach()
        except Exception as e:  # pragma: no cover
            errors.append(e)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    for r in results:
        torch.testing.assert_close(r, want, rtol=0, atol=0)


# ---- the real efficient-kan, where it imports --------------------------------------------------

def _efficient_kan():
    try:
        from efficient_kan import KANLinear as EKANLinear
        return EKANLinear
    except Exception:  # not installed (no offline wheel of efficient-kan here)
        return None


@pytest.mark.skipif(_efficient_kan() is None, reason="efficient_kan is not importable")
@pytest.mark.parametrize("standalone", [True, False])
def test_differential_vs_efficient_kan(standalone):
    EKANLinear = _efficient_kan()
    torch.manual_seed(0)
    e = EKANLinear(24, 16, enable_standalone_scale_spline=standalone)
    torch.manual_seed(0)
    k = kt.KANLinear(24, 16, enable_standalone_scale_spline=standalone)
    assert list(k.state_dict()) == list(e.state_dict())
    assert torch.equal(k.grid, e.grid) and torch.equal(k.base_weight, e.base_weight)
    k.load_state_dict(e.state_dict(), strict=True)
    x = torch.randn(32, 24)
    dy = torch.randn(32, 16)
    outs = []
    for mod in (e, k):
        xx = x.clone().requires_grad_(True)
        y = mod(xx)
        y.backward(dy)
        outs.append([y.detach(), xx.grad] + [q.grad for q in mod.parameters()])
    for a, b in zip(*outs):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    assert k.regularization_loss().item() == pytest.approx(e.regularization_loss().item(),
                                                           rel=1e-5)
    e.load_state_dict(kt.KANLinear(24, 16, enable_standalone_scale_spline=standalone)
                      .state_dict(), strict=True)


# ---- CUDA (runs only where torch and kfuse both have CUDA) -------------------------------------

@pytest.mark.skipif(not cuda_ok(), reason="needs torch CUDA and a CUDA build of kfuse")
def test_cuda_routes_to_a_cuda_context():
    """CUDA tensors run on a CUDA context (the CUDA backend implements KANLinear in float32, so
    an Unsupported here is a regression, not a skip) and the result matches the CPU's."""
    torch.manual_seed(0)
    m = randomize_(kt.KANLinear(40, 24))
    mc = kt.KANLinear(40, 24, device="cuda")
    assert torch.equal(mc.grid.cpu(), m.grid)  # the uniform grid, written on the device
    mc.load_state_dict(m.state_dict())
    x = torch.randn(33, 40)
    xc = x.cuda().requires_grad_(True)
    yc = mc(xc)
    yc.sum().backward()
    xx = x.clone().requires_grad_(True)
    y = m(xx)
    y.sum().backward()
    assert rel(yc.detach().cpu(), y) < TOL and rel(xc.grad.cpu(), xx.grad) < TOL
    with pytest.raises(RuntimeError, match="same device"):
        mc(x)


@pytest.mark.skipif(not cuda_ok(), reason="needs torch CUDA and a CUDA build of kfuse")
def test_cuda_float64_matches_reference_and_gradcheck():
    """A float64 KANLinear on CUDA (the library's float64 CUDA path): y within 1e-12 of the
    float64 reference, gradcheck of the operator on every differentiable input, and update_grid
    equal to the CPU's float64 one."""
    torch.manual_seed(0)
    m = randomize_(kt.KANLinear(6, 5, dtype=torch.float64))
    mc = kt.KANLinear(6, 5, dtype=torch.float64, device="cuda")
    mc.load_state_dict(m.state_dict())
    x = torch.randn(11, 6, dtype=torch.float64) * 1.3
    p = params_of(m)
    want = ref_forward(x, p["grid"], p["base_weight"], p["spline_weight"], p["spline_scaler"], 3)
    y = mc(x.cuda())
    assert y.dtype == torch.float64 and y.is_cuda and rel(y.cpu(), want) < TOL64
    pc = params_of(mc)
    args = tuple(t.detach().clone().requires_grad_(True) for t in (
        x[:4].cuda(), pc["base_weight"], pc["spline_weight"], pc["spline_scaler"]))
    assert torch.autograd.gradcheck(
        lambda xx, bw, sw, sc: kt.kan_linear_function(xx, mc.grid, bw, sw, sc), args)
    m.update_grid(x)
    mc.update_grid(x.cuda())
    for n, t in m.state_dict().items():
        torch.testing.assert_close(mc.state_dict()[n].cpu(), t, rtol=1e-12, atol=1e-12)


@pytest.mark.skipif(not cuda_ok(), reason="needs torch CUDA and a CUDA build of kfuse")
@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
def test_cuda_autocast_keeps_float32_knots(dt):
    """Under torch.autocast("cuda"), KANLinear computes in its parameters' dtype (float32: the
    knots are not rounded) and returns y in the autocast dtype, its error against float64 within
    2x that of torch's own computation of the layer under the same autocast (efficient-kan's
    math in eager torch), float32 gradients for the float32 parameters."""
    torch.manual_seed(0)
    m = randomize_(kt.KANLinear(64, 48, device="cuda"))
    x = torch.randn(256, 64, device="cuda") * 1.2
    p = params_of(m)
    want = ref_forward(x.double(), p["grid"].double(), p["base_weight"].double(),
                       p["spline_weight"].double(), p["spline_scaler"].double(), 3)
    r = EfficientKANRef(64, 48).cuda()
    r.load_state_dict(m.state_dict())
    with torch.autocast("cuda", dtype=dt):
        y = m(x)
        yt = r(x)
    assert y.dtype == dt
    err, err_torch = rel(y.double(), want), rel(yt.double(), want)
    assert err <= 2 * err_torch + 1e-6, (err, err_torch)
    y.float().sum().backward()
    assert m.spline_weight.grad.dtype == torch.float32
    assert torch.isfinite(m.spline_weight.grad).all()
