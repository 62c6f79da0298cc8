"""Second and third derivatives through kfuse.torch.KANLinear and KANConv2d (since 1.9:
kfuse.torch.kan_deriv, docs/ops/kan.md "Derivatives"), on torch 1.13 (autograd.Function) and
torch 2.x: torch.autograd.gradgradcheck in float64 for x and every parameter (uniform and
non-uniform knots, with and without a standalone scaler, without a base term); u_xx and u_xxx of
a KANLinear stack [2, 5, 1] and the parameter gradients of a PDE-residual loss against
efficient-kan's math by torch autograd (tests/python/kan_reference.py) at 1e-10 in float64;
float32 against float64; KANConv2d's u_xx against unfold + the reference; an order past what the
spline order allows refused naming both; the first-order gradient unchanged under
create_graph=True; CUDA against the CPU where a GPU is (skipped otherwise)."""
import pytest

torch = pytest.importorskip("torch")
import kfuse.torch as kt  # noqa: E402
from devices import cuda_ok  # noqa: E402
from torch.autograd import gradgradcheck  # noqa: E402

from kan_reference import randomize_, ref_forward  # noqa: E402

F = torch.nn.functional


def _layer(cls, *args, seed=0, nonuniform=False, **kw):
    m = randomize_(cls(*args, dtype=torch.float64, **kw), seed)
    if nonuniform:  # sorted random knots per feature, one repeated (a zero-width span)
        g = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            t = torch.sort(torch.rand(m.grid.shape, generator=g, dtype=torch.float64) * 3.2
                           - 1.6, dim=1)[0]
            t[:, t.shape[1] // 2] = t[:, t.shape[1] // 2 - 1]
            m.grid.copy_(t)
    return m


def _params(m):
    return [p.detach().clone().requires_grad_(True) for p in
            (m.base_weight, m.spline_weight, getattr(m, "spline_scaler", None)) if p is not None]


@pytest.mark.parametrize("scaled", [True, False])
@pytest.mark.parametrize("nonuniform", [False, True])
def test_gradgradcheck_kan_linear(scaled, nonuniform):
    m = _layer(kt.KANLinear, 3, 2, enable_standalone_scale_spline=scaled, nonuniform=nonuniform)
    x = (torch.rand(5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
         * 2.8 - 1.4).requires_grad_(True)
    ps = _params(m)

    def f(x, bw, sw, *ss):
        return kt.kan_linear_function(x, m.grid, bw, sw, ss[0] if ss else None)

    assert gradgradcheck(f, (x, *ps), check_batched_grad=False)


def test_gradgradcheck_kan_linear_no_base():
    m = _layer(kt.KANLinear, 2, 3, seed=4)
    x = (torch.rand(4, 2, dtype=torch.float64) * 2.4 - 1.2).requires_grad_(True)
    sw, ss = _params(m)[1:]
    assert gradgradcheck(lambda x, sw, ss: kt.kan_linear_function(x, m.grid, None, sw, ss),
                         (x, sw, ss), check_batched_grad=False)


@pytest.mark.parametrize("nonuniform", [False, True])
def test_gradgradcheck_kan_conv2d(nonuniform):
    m = _layer(kt.KANConv2d, 2, 2, 3, stride=1, padding=1, nonuniform=nonuniform)
    x = (torch.rand(2, 2, 4, 4, dtype=torch.float64) * 2.4 - 1.2).requires_grad_(True)
    ps = _params(m)

    def f(x, bw, sw, ss):
        return kt.kan_conv2d_function(x, m.grid, bw, sw, ss, (3, 3), (1, 1), (1, 1), (1, 1))

    assert gradgradcheck(f, (x, *ps), check_batched_grad=False)


def _stack(dtype=torch.float64):
    """A KANLinear stack [2, 5, 1] and its parameters, and the reference's forward on them."""
    layers = [_layer(kt.KANLinear, 2, 5, seed=1), _layer(kt.KANLinear, 5, 1, seed=2)]

    def ref(x):
        for m in layers:
            x = ref_forward(x, m.grid, m.base_weight, m.spline_weight, m.spline_scaler,
                            m.spline_order)
        return x

    net = torch.nn.Sequential(*layers).to(dtype)
    return net, ref, layers


def _derivs(u_of, x, order):
    """[u, u_x0, u_x0x0, ...] up to `order` along x's first coordinate, every one differentiable."""
    out = [u_of(x)]
    for _ in range(order):
        g, = torch.autograd.grad(out[-1].sum(), x, create_graph=True)
        out.append(g[:, :1])
    return out


def test_stack_derivatives_and_residual_grads_match_reference():
    net, ref, layers = _stack()
    x = (torch.rand(64, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
         * 2.0 - 1.0)
    xk, xr = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    got, want = _derivs(net, xk, 3), _derivs(ref, xr, 3)
    for o, (a, b) in enumerate(zip(got, want)):
        assert torch.allclose(a, b, rtol=0, atol=1e-10 * max(1.0, b.abs().max().item())), o
    # a PDE-residual loss (u_xx + u_xxx - u)^2: its gradient for every parameter
    params = [p for m in layers for p in m.parameters()]
    lk = (got[2] + got[3] - got[0]).pow(2).mean()
    lr = (want[2] + want[3] - want[0]).pow(2).mean()
    gk = torch.autograd.grad(lk, params + [xk])
    gr = torch.autograd.grad(lr, params + [xr])
    for a, b in zip(gk, gr):
        assert torch.allclose(a, b, rtol=0, atol=1e-10 * max(1.0, b.abs().max().item()))


def test_float32_against_float64():
    net64, _, _ = _stack()
    net32 = _stack()[0].float()
    x = torch.rand(32, 2, dtype=torch.float64) * 2 - 1
    d64 = _derivs(net64, x.clone().requires_grad_(True), 2)
    d32 = _derivs(net32, x.float().requires_grad_(True), 2)
    for a, b in zip(d32, d64):
        assert a.dtype == torch.float32
        assert (a.double() - b).norm() <= 1e-4 * b.norm() + 1e-6


def test_conv2d_second_derivative_matches_unfold_reference():
    m = _layer(kt.KANConv2d, 1, 2, 3, padding=1, seed=6)
    x = torch.rand(2, 1, 5, 5, dtype=torch.float64) * 2 - 1

    def ref(x):
        p = F.unfold(x, 3, 1, 1, 1).transpose(1, 2)
        y = ref_forward(p, m.grid, m.base_weight, m.spline_weight, m.spline_scaler,
                        m.spline_order)
        return y.transpose(1, 2).reshape(2, 2, 5, 5)

    xk, xr = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    gk, = torch.autograd.grad(m(xk).pow(2).sum(), xk, create_graph=True)
    gr, = torch.autograd.grad(ref(xr).pow(2).sum(), xr, create_graph=True)
    assert torch.allclose(gk, gr, atol=1e-12)
    hk, = torch.autograd.grad(gk.sin().sum(), xk, create_graph=True)
    hr, = torch.autograd.grad(gr.sin().sum(), xr, create_graph=True)
    assert torch.allclose(hk, hr, atol=1e-10)
    wk = torch.autograd.grad(hk.pow(2).sum(), [m.base_weight, m.spline_weight, m.spline_scaler])
    wr = torch.autograd.grad(hr.pow(2).sum(), [m.base_weight, m.spline_weight, m.spline_scaler])
    for a, b in zip(wk, wr):
        assert torch.allclose(a, b, atol=1e-9)


def test_order_past_spline_order_is_refused():
    m = _layer(kt.KANLinear, 1, 1, spline_order=1)
    x = torch.rand(4, 1, dtype=torch.float64, requires_grad=True)
    u_x, u_xx = _derivs(m, x, 2)[1:]  # orders 1 and 2 = k + 1 (B'' = 0) work
    with pytest.raises(RuntimeError, match="derivative order 3 .* spline_order 1"):
        torch.autograd.grad(u_xx.sum(), x)


def test_first_order_gradient_unchanged_under_create_graph():
    m = _layer(kt.KANLinear, 3, 4)
    x = torch.rand(8, 3, dtype=torch.float64, requires_grad=True)
    g1, = torch.autograd.grad(m(x).sum(), x, create_graph=True)
    g0, = torch.autograd.grad(m(x).sum(), x)
    assert torch.allclose(g1, g0, rtol=1e-14, atol=1e-15)


@pytest.mark.skipif(not cuda_ok(), reason="needs a CUDA device and a CUDA build")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_cuda_matches_cpu(dtype):
    """On CUDA (cuda/plain_kan.cuh's order-m path): u, u_x, u_xx, u_xxx of the [2, 5, 1] stack and
    the residual loss's parameter gradients equal the CPU's (float64 1e-10, float32 1e-4)."""
    net, _, _ = _stack()
    net = net.to(dtype)
    x = torch.rand(64, 2, dtype=dtype) * 2 - 1
    tol = 1e-10 if dtype == torch.float64 else 1e-4
    res = []
    for dev in ("cpu", "cuda"):
        n = net.to(dev)
        xd = x.to(dev).requires_grad_(True)
        d = _derivs(n, xd, 3)
        loss = (d[2] + d[3] - d[0]).pow(2).mean()
        res.append([t.detach().cpu().double() for t in
                    d + list(torch.autograd.grad(loss, list(n.parameters())))])
    for a, b in zip(*res):
        assert (a - b).norm() <= tol * (b.norm() + 1)
