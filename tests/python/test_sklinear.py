"""Tests of the kfuse Python package for the sketched linear layer (SKLinear, Panther's randomized
low-rank layer): the numpy and torch front ends against a float64 reference of DESIGN.md's
formula written here, finite differences, Panther's module layout (a transcription of
panther.nn.SKLinear's constructor below; the real package is compared too where it imports),
state_dict round trips, the parameter-count warning, the initialisation's statistics, errors and
threads.

    y = 1/(2L) * sum_i [ (x S1_i) U1_i + (x U2_i) S2_i ] + b
    S1s [L, in, k], S2s [L, k, out] learnable; U1s [L, k, out], U2s [L, in, k] fixed; b [out]

Accuracy bar (DESIGN.md): ||out - ref|| / ||ref|| < 1e-5 for fp32 against float64.
"""
import math
import threading
import warnings

import numpy as np
import pytest

import kfuse
import kfuse.numpy as knp
from kfuse.sklinear import SkLinearPlan

torch = pytest.importorskip("torch")
import kfuse.torch as kt  # noqa: E402
from devices import cuda_ok  # noqa: E402
from torch import nn  # noqa: E402

# Many cases exceed in*out on purpose; the warning itself is tested in
# test_warning_when_sketch_exceeds_dense (pytest.warns records whatever the filters say).
pytestmark = pytest.mark.filterwarnings(
    "ignore:The sketching layer uses more parameters:UserWarning")

TOL = 1e-5
FC_WARNING = ("The sketching layer uses more parameters than a fully connected layer. "
              "Consider reducing 'num_terms' or 'low_rank' for efficiency.")


def rel(out, want):
    out = torch.as_tensor(np.asarray(out) if not torch.is_tensor(out) else out).detach().double()
    want = torch.as_tensor(np.asarray(want) if not torch.is_tensor(want) else want)
    want = want.detach().double()
    assert out.shape == want.shape, (out.shape, want.shape)
    assert torch.isfinite(out).all()
    return ((out - want).norm() / want.norm()).item()


def quiet(fn, *args, **kwargs):
    """Calls fn with the parameter-count warning silenced (cases that exceed in*out on purpose)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return fn(*args, **kwargs)


# ---- the float64 reference (DESIGN.md's formula, term by term) ---------------------------------

def reference_forward(x, S1s, S2s, U1s, U2s, bias):
    """y for x [..., in], every tensor float64: the sum over the L terms as written."""
    L = S1s.shape[0]
    y = None
    for i in range(L):
        term = torch.matmul(torch.matmul(x, S1s[i]), U1s[i]) \
            + torch.matmul(torch.matmul(x, U2s[i]), S2s[i])
        y = term if y is None else y + term
    y = y / (2 * L)
    return y if bias is None else y + bias


def reference_grads(x, params, dy):
    """(y, dx, {name: grad}) of sum(y * dy) in float64 by torch autograd on reference_forward."""
    xd = torch.as_tensor(x).detach().double().requires_grad_(True)
    p = {n: (None if t is None else torch.as_tensor(t).detach().double()) for n, t in
         params.items()}
    for n in ("S1s", "S2s", "bias"):
        if p.get(n) is not None:
            p[n].requires_grad_(True)
    y = reference_forward(xd, p["S1s"], p["S2s"], p["U1s"], p["U2s"], p.get("bias"))
    (y * torch.as_tensor(dy).double()).sum().backward()
    grads = {n: p[n].grad for n in ("S1s", "S2s", "bias") if p.get(n) is not None}
    return y.detach(), xd.grad, grads


# ---- a transcription of panther.nn.SKLinear's constructor (layout and initialisation) ----------

class PantherLayoutSKLinear(nn.Module):
    """Panther's SKLinear as its source builds it (panther/nn/linear.py): buffers U1s (stacked
    scaled sign sketches [k, out]) and U2s (stacked transposed sketches [k, in]^T) registered
    first, then Parameters S1s = W U1s[i]^T and S2s = U2s[i]^T W with W [in, out] = W_init^T or
    Kaiming-uniform(a=sqrt(5)), then bias (U(-1/sqrt(fan_in(W)), ...)) or a None parameter.
    Forward is reference_forward (any dtype)."""

    def __init__(self, in_features, out_features, num_terms, low_rank, W_init=None, bias=True,
                 dtype=None, device=None):
        super().__init__()
        fk = {"dtype": dtype, "device": device}
        self.in_features, self.out_features = in_features, out_features
        self.num_terms, self.low_rank = num_terms, low_rank

        def sign_sketch(m, n):  # entries +-1/sqrt(m)
            s = torch.randint(0, 2, (m, n), device=device).to(dtype or torch.get_default_dtype())
            return (2 * s - 1) / math.sqrt(m)

        self.register_buffer("U1s", torch.stack(
            [sign_sketch(low_rank, out_features) for _ in range(num_terms)]).contiguous())
        self.register_buffer("U2s", torch.stack(
            [sign_sketch(low_rank, in_features).T for _ in range(num_terms)]).contiguous())
        if W_init is None:
            W = torch.empty(in_features, out_features, **fk)
            nn.init.kaiming_uniform_(W, a=math.sqrt(5))
        else:
            W = W_init.T.detach().clone()
        self.S1s = nn.Parameter(torch.stack([W @ self.U1s[i].T for i in range(num_terms)]))
        self.S2s = nn.Parameter(torch.stack([self.U2s[i].T @ W for i in range(num_terms)]))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, **fk))
            bound = 1 / math.sqrt(W.shape[1])
            nn.init.uniform_(self.bias, -bound, bound)
        else:
            self.register_parameter("bias", None)

    def forward(self, h_in):
        was_1d = h_in.dim() == 1
        x = h_in.unsqueeze(0) if was_1d else h_in
        y = reference_forward(x, self.S1s, self.S2s, self.U1s, self.U2s, self.bias)
        return y.view(self.out_features) if was_1d else y


def randomize_(module, seed=0):
    """Fresh random values in every tensor of a SKLinear (realistic scale, not the sign sketch
    structure), so the op tests do not lean on the initialisation."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            fan = t.shape[-2] if t.dim() == 3 else t.shape[0]
            t.copy_((torch.rand(t.shape, generator=g, dtype=torch.float64) * 2 - 1)
                    / math.sqrt(fan))
    return module


def params_of(module):
    return {"S1s": module.S1s, "S2s": module.S2s, "U1s": module.U1s, "U2s": module.U2s,
            "bias": module.bias}


# ---- forward and backward against the float64 reference --------------------------------------

OP_CASES = [  # (in, out, L, k, leading dims of x, bias)
    (8, 8, 1, 1, (4,), True),            # L = 1, k = 1
    (40, 24, 3, 17, (6,), True),         # L = 3, k = 17; in != out; 2Lk > min(in, out)
    (33, 65, 2, 5, (1,), True),          # batch 1
    (20, 30, 2, 4, (2, 3), True),        # 3-D input
    (20, 30, 2, 4, (), True),            # 1-D input
    (16, 12, 2, 3, (5,), False),         # no bias
    (64, 128, 4, 32, (7,), True),        # 2Lk = 256 > in + out
    (12, 10, 2, 3, (2, 1, 2, 1, 1, 1, 3), True),  # 8-D input: more dims than KF_MAX_DIMS
    (300, 200, 2, 16, (64,), True),      # a GEMM-sized case
    (1, 1, 1, 1, (3,), True),
]


@pytest.mark.parametrize("inf,outf,L,k,lead,bias", OP_CASES)
def test_torch_forward_backward_vs_float64(inf, outf, L, k, lead, bias):
    torch.manual_seed(0)
    m = randomize_(quiet(kt.SKLinear, inf, outf, L, k, bias=bias))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(lead + (inf,), generator=g)
    dy = torch.randn(lead + (outf,), generator=g)
    xk = x.clone().requires_grad_(True)
    y = m(xk)
    assert y.shape == lead + (outf,) and y.dtype == torch.float32
    y.backward(dy)
    yr, dxr, gr = reference_grads(x, params_of(m), dy)
    errs = {"y": rel(y, yr), "dx": rel(xk.grad, dxr), "dS1s": rel(m.S1s.grad, gr["S1s"]),
            "dS2s": rel(m.S2s.grad, gr["S2s"])}
    if bias:
        errs["dbias"] = rel(m.bias.grad, gr["bias"])
    else:
        assert m.bias is None
    bad = {n: e for n, e in errs.items() if not e < TOL}
    assert not bad, bad
    assert m.U1s.grad is None and m.U2s.grad is None
    assert not m.U1s.requires_grad and not m.U2s.requires_grad


def test_only_some_gradients_requested():
    """Frozen S1s, no grad for x: backward writes just what autograd asks for."""
    torch.manual_seed(0)
    m = randomize_(kt.SKLinear(24, 16, 2, 3))
    m.S1s.requires_grad_(False)
    x = torch.randn(5, 24)
    dy = torch.randn(5, 16)
    m(x).backward(dy)
    _, _, gr = reference_grads(x, params_of(m), dy)
    assert m.S1s.grad is None
    assert rel(m.S2s.grad, gr["S2s"]) < TOL and rel(m.bias.grad, gr["bias"]) < TOL


def test_gradients_accumulate_like_torch():
    torch.manual_seed(0)
    m = randomize_(kt.SKLinear(24, 16, 2, 3))
    x = torch.randn(5, 24)
    for _ in range(2):
        m(x).pow(2).sum().backward()
    p = {n: t.detach().double().requires_grad_(n in ("S1s", "S2s", "bias"))
         for n, t in params_of(m).items()}
    for _ in range(2):
        reference_forward(x.double(), p["S1s"], p["S2s"], p["U1s"], p["U2s"], p["bias"]) \
            .pow(2).sum().backward()
    for n in ("S1s", "S2s", "bias"):
        assert rel(getattr(m, n).grad, p[n].grad) < TOL, n


def test_finite_differences():
    """y is linear in each of x, S1s, S2s and bias, so a central difference along a random
    direction equals the directional derivative up to float32 rounding of the loss."""
    torch.manual_seed(0)
    m = randomize_(kt.SKLinear(7, 5, 2, 3))
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 7, generator=g)
    w = torch.randn(4, 5, generator=g)

    def loss():
        with torch.no_grad():
            return float((m(x).double() * w.double()).sum())

    xg = x.clone().requires_grad_(True)
    (m(xg) * w).sum().backward()
    grads = {"x": xg.grad, "S1s": m.S1s.grad, "S2s": m.S2s.grad, "bias": m.bias.grad}
    for name, grad in grads.items():
        t = x if name == "x" else getattr(m, name)
        v = torch.randn(t.shape, generator=g)
        h = 0.5
        with torch.no_grad():
            t.add_(h * v)
            up = loss()
            t.sub_(2 * h * v)
            down = loss()
            t.add_(h * v)
        fd = (up - down) / (2 * h)
        an = float((grad.double() * v.double()).sum())
        assert abs(fd - an) <= 1e-4 * max(1.0, abs(an)), (name, fd, an)


def test_empty_batch():
    m = kt.SKLinear(6, 4, 1, 2)
    x = torch.randn(0, 6, requires_grad=True)
    y = m(x)
    assert y.shape == (0, 4)
    y.sum().backward()
    assert x.grad.shape == (0, 6)
    assert torch.count_nonzero(m.S1s.grad) == 0 and torch.count_nonzero(m.bias.grad) == 0
    assert m(torch.randn(2, 0, 6)).shape == (2, 0, 4)


# ---- the module's layout: Panther's names, shapes, Parameter/buffer split ----------------------

@pytest.mark.parametrize("bias", [True, False])
def test_layout_matches_panther(bias):
    k = kt.SKLinear(12, 20, 3, 4, bias=bias)
    p = PantherLayoutSKLinear(12, 20, 3, 4, bias=bias)
    ks, ps = k.state_dict(), p.state_dict()
    assert list(ks) == list(ps)
    for n in ps:
        assert ks[n].shape == ps[n].shape and ks[n].dtype == ps[n].dtype, n
    assert [n for n, _ in k.named_parameters()] == [n for n, _ in p.named_parameters()]
    assert [n for n, _ in k.named_buffers()] == [n for n, _ in p.named_buffers()] == ["U1s", "U2s"]
    assert isinstance(k.S1s, nn.Parameter) and isinstance(k.S2s, nn.Parameter)
    assert not isinstance(k.U1s, nn.Parameter) and not isinstance(k.U2s, nn.Parameter)
    assert k.S1s.shape == (3, 12, 4) and k.S2s.shape == (3, 4, 20)
    assert k.U1s.shape == (3, 4, 20) and k.U2s.shape == (3, 12, 4)
    if bias:
        assert isinstance(k.bias, nn.Parameter) and k.bias.shape == (20,)
    else:
        assert k.bias is None and "bias" not in ks
    assert (k.in_features, k.out_features, k.num_terms, k.low_rank) == (12, 20, 3, 4)


@pytest.mark.parametrize("bias", [True, False])
def test_state_dict_round_trip_both_ways(bias):
    torch.manual_seed(0)
    x = torch.randn(3, 5, 12)
    # Panther's module -> kfuse
    p = PantherLayoutSKLinear(12, 20, 3, 4, bias=bias)
    k = kt.SKLinear(12, 20, 3, 4, bias=bias)
    k.load_state_dict(p.state_dict(), strict=True)
    with torch.no_grad():
        assert rel(k(x), p(x).double()) < TOL
    # kfuse -> Panther's module (in float64, a dtype kfuse does not run)
    k2 = kt.SKLinear(12, 20, 3, 4, bias=bias)
    p2 = PantherLayoutSKLinear(12, 20, 3, 4, bias=bias, dtype=torch.float64)
    p2.load_state_dict(k2.state_dict(), strict=True)
    with torch.no_grad():
        assert rel(k2(x), p2(x.double())) < TOL
    for n, t in k2.state_dict().items():
        assert torch.equal(p2.state_dict()[n].float(), t), n


def test_one_dimensional_and_leading_dims_like_panther():
    torch.manual_seed(0)
    k = kt.SKLinear(10, 6, 2, 2)
    p = PantherLayoutSKLinear(10, 6, 2, 2, dtype=torch.float64)
    p.load_state_dict(k.state_dict())
    for shape in [(10,), (1, 10), (4, 10), (2, 3, 10), (2, 1, 3, 10)]:
        x = torch.randn(shape)
        y = k(x)
        assert y.shape == shape[:-1] + (6,)
        assert rel(y, p(x.double())) < TOL
    # a non-contiguous input
    x = torch.randn(10, 4).T
    assert rel(k(x), p(x.double())) < TOL


# ---- the parameter-count warning ---------------------------------------------------------------

def test_warning_when_sketch_exceeds_dense():
    with pytest.warns(UserWarning) as rec:
        kt.SKLinear(64, 64, 1, 17)  # 2*17*128 = 4352 > 4096
    msgs = [str(w.message) for w in rec]
    assert FC_WARNING in msgs
    assert any(w.filename == __file__ for w in rec if str(w.message) == FC_WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kt.SKLinear(64, 64, 1, 16)  # 2*16*128 = 4096 = in*out: no warning (strict '>')
        kt.SKLinear(1024, 512, 2, 32)


def test_panther_class_attributes():
    """Panther's public class attributes, for code that matches warnings against them (as
    Panther's own tests do): the texts and their format fields."""
    assert kt.SKLinear.WARNING_MSG_FC == FC_WARNING
    assert kt.SKLinear.WARNING_MSG_BATCH.format(15) == (
        "Batch size 15 is not a multiple of 16. Tensor Core optimizations disabled.")
    assert kt.SKLinear.WARNING_MSG_TC.format(30, 32, 16).endswith(
        "are multiples of 16 (current: 30, 32, 16).")
    assert kt.SKLinear.__constants__ == ["in_features", "out_features", "num_terms", "low_rank"]
    for name in ("in_features", "out_features", "num_terms", "low_rank"):
        assert kt.SKLinear.__annotations__[name] is int


def test_panther_instance_attributes():
    """Panther's instance attributes that users read: the sizes, has_tensor_core (its rule: CUDA
    with compute capability >= 7.0) and use_gpu (True: kfuse has no shape restriction to fall
    back from); none of them is state (the state_dict holds the tensors only); the repr names
    the sizes."""
    m = kt.SKLinear(40, 24, 2, 4, bias=False)
    assert (m.in_features, m.out_features, m.num_terms, m.low_rank) == (40, 24, 2, 4)
    want_tc = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (7, 0)
    assert m.has_tensor_core is want_tc
    assert m.use_gpu is True
    assert list(m.state_dict()) == ["S1s", "S2s", "U1s", "U2s"]
    assert repr(m) == ("SKLinear(in_features=40, out_features=24, num_terms=2, low_rank=4, "
                       "bias=False)")


def test_param_ratio():
    ctx = kfuse.Context()
    for (i, o, L, k) in [(64, 64, 1, 16), (40, 24, 3, 17), (8192, 8192, 1, 16)]:
        plan = SkLinearPlan(ctx, i, o, L, k)
        assert plan.param_ratio == pytest.approx(2 * L * k * (i + o) / (i * o), rel=1e-12)
    assert SkLinearPlan(ctx, 64, 64, 1, 16).param_ratio == 1.0


# ---- initialisation ----------------------------------------------------------------------------

def test_init_sketches_are_scaled_signs():
    torch.manual_seed(0)
    L, k = 3, 7
    m = kt.SKLinear(200, 150, L, k)
    for name, n_el in (("U1s", L * k * 150), ("U2s", L * 200 * k)):
        u = getattr(m, name)
        mags = torch.unique(u.abs())
        assert mags.numel() == 1, (name, mags)
        assert mags.item() == pytest.approx(1 / math.sqrt(k), rel=2e-7)
        frac = (u > 0).double().mean().item()
        assert abs(frac - 0.5) < 4 / math.sqrt(n_el), (name, frac)
    # independent draws: the terms differ, and U1s and U2s are not one pattern
    assert not torch.equal(m.U1s[0], m.U1s[1]) and not torch.equal(m.U2s[1], m.U2s[2])
    agree = (torch.sign(m.U1s[0, :, :7].reshape(-1)) == torch.sign(m.U2s[0, :7, :].reshape(-1)))
    assert agree.double().mean().item() < 0.9


def recover_W(m):
    """W [in, out] from S1s = W U1s^T when L*k >= out (least squares, float64)."""
    U1 = m.U1s.detach().double().reshape(-1, m.out_features)              # [r, out]
    S1 = m.S1s.detach().double().permute(1, 0, 2).reshape(m.in_features, -1)  # [in, r]
    return torch.linalg.lstsq(U1, S1.T).solution.T                      # S1 = W U1^T


def test_init_W_is_kaiming_uniform_and_shared():
    torch.manual_seed(0)
    inf, outf, L, k = 600, 16, 2, 16  # r = 32 >= out: W is recoverable from S1s
    m = kt.SKLinear(inf, outf, L, k)
    W = recover_W(m)
    b = 1 / math.sqrt(outf)  # kaiming_uniform_(a=sqrt(5)) on [in, out]: fan_in = out
    assert W.abs().max().item() <= b * (1 + 1e-4)
    assert abs(W.mean().item()) < 0.05 * b
    assert W.std().item() == pytest.approx(b / math.sqrt(3), rel=0.05)
    assert (W.abs() < b / 2).double().mean().item() == pytest.approx(0.5, abs=0.03)  # uniform
    # S2s comes from the same W: S2s[i] = U2s[i]^T W
    for i in range(L):
        assert rel(m.S2s[i], m.U2s[i].double().T @ W) < 1e-5
    # and, without recovering W, U2s[i]^T S1s[j] = S2s[i] U1s[j]^T (= U2s[i]^T W U1s[j]^T)
    m2 = kt.SKLinear(96, 80, 3, 8)
    d = {n: t.detach().double() for n, t in m2.state_dict().items()}
    for i in range(3):
        for j in range(3):
            assert rel(d["U2s"][i].T @ d["S1s"][j], d["S2s"][i] @ d["U1s"][j].T) < 1e-5


def test_init_scales_and_bias():
    torch.manual_seed(0)
    inf, outf, L, k = 256, 2000, 2, 8
    m = kt.SKLinear(inf, outf, L, k)
    # var S1 = out * var(W) * 1/k = 1/(3k); var S2 = in/(3 out k)
    assert m.S1s.std().item() == pytest.approx(1 / math.sqrt(3 * k), rel=0.1)
    assert m.S2s.std().item() == pytest.approx(math.sqrt(inf / (3 * outf * k)), rel=0.1)
    b = 1 / math.sqrt(outf)
    assert m.bias.abs().max().item() <= b
    assert m.bias.std().item() == pytest.approx(b / math.sqrt(3), rel=0.1)
    assert abs(m.bias.mean().item()) < 0.1 * b


@pytest.mark.parametrize("bias", [True, False])
def test_init_with_W_init(bias):
    torch.manual_seed(0)
    lin = nn.Linear(48, 20, bias=bias)  # weight [out, in]
    m = kt.SKLinear(48, 20, 3, 5, W_init=lin.weight, bias=bias)
    W = lin.weight.detach().double().T  # [in, out]
    for i in range(3):
        assert rel(m.S1s[i], W @ m.U1s[i].double().T) < 1e-6
        assert rel(m.S2s[i], m.U2s[i].double().T @ W) < 1e-6
    if bias:
        assert m.bias.abs().max().item() <= 1 / math.sqrt(20)
    assert lin.weight.grad is None and not m.S1s.grad_fn  # W_init is only read
    # a W_init of another dtype is converted, as the module's dtype is float32
    m2 = kt.SKLinear(48, 20, 3, 5, W_init=lin.weight.double(), bias=bias)
    assert m2.S1s.dtype == torch.float32
    with pytest.raises(kfuse.InvalidArgument, match="W_init"):
        kt.SKLinear(48, 20, 3, 5, W_init=lin.weight.T)  # [in, out]: wrong shape


def test_init_repeatable_with_torch_manual_seed():
    torch.manual_seed(42)
    a = kt.SKLinear(30, 20, 2, 4)
    b = kt.SKLinear(30, 20, 2, 4)
    torch.manual_seed(42)
    c = kt.SKLinear(30, 20, 2, 4)
    for n in a.state_dict():
        assert torch.equal(a.state_dict()[n], c.state_dict()[n]), n
    assert not torch.equal(a.S1s, b.S1s) and not torch.equal(a.U1s, b.U1s)


def test_numpy_init_is_a_function_of_the_seed_only():
    """Same seed -> the same tensors whatever the context's thread count; another seed differs."""
    p1 = SkLinearPlan(kfuse.Context(num_threads=1), 70, 50, 2, 6)
    p2 = SkLinearPlan(kfuse.Context(num_threads=2), 70, 50, 2, 6)
    a, b = knp.sklinear_init(p1, 123), knp.sklinear_init(p2, 123)
    c = knp.sklinear_init(p1, 124)
    assert list(a) == ["S1s", "S2s", "bias", "U1s", "U2s"]
    for n in a:
        np.testing.assert_array_equal(a[n], b[n])
        assert not np.array_equal(a[n], c[n]), n
    big = knp.sklinear_init(p1, 2 ** 64 - 1)
    assert all(np.isfinite(v).all() for v in big.values())


# ---- numpy front end ---------------------------------------------------------------------------

def test_numpy_forward_backward_vs_float64():
    ctx = kfuse.Context("cpu")
    plan = SkLinearPlan(ctx, 36, 28, 3, 5)
    assert plan.param_info == [("S1s", (3, 36, 5)), ("S2s", (3, 5, 28)), ("bias", (28,)),
                               ("U1s", (3, 5, 28)), ("U2s", (3, 36, 5))]
    rng = np.random.default_rng(0)
    params = {n: rng.uniform(-0.3, 0.3, s).astype(np.float32) for n, s in plan.param_info}
    x = rng.standard_normal((2, 4, 36)).astype(np.float32)
    dy = rng.standard_normal((2, 4, 28)).astype(np.float32)
    y = knp.sklinear_forward(plan, x, params)
    yr, dxr, gr = reference_grads(x, params, dy)
    assert y.dtype == np.float32 and y.shape == (2, 4, 28)
    assert rel(y, yr) < TOL
    # a sequence in plan.param_names order works as well as the mapping
    y2 = knp.sklinear_forward(plan, x, [params[n] for n in plan.param_names])
    np.testing.assert_array_equal(y, y2)
    dx, dp = knp.sklinear_backward(plan, x, params, dy)
    assert sorted(dp) == ["S1s", "S2s", "bias"]
    assert rel(dx, dxr) < TOL
    for n in dp:
        assert rel(dp[n], gr[n]) < TOL, n
    # accumulate into given buffers; a subset of outputs
    acc = {n: a.copy() for n, a in dp.items()}
    dx_none, acc2 = knp.sklinear_backward(plan, x, params, dy, need_dx=False, dparams=acc,
                                          accumulate=True)
    assert dx_none is None and acc2["S1s"] is acc["S1s"]
    for n in dp:
        np.testing.assert_allclose(acc[n], 2 * dp[n], rtol=1e-6, atol=1e-7)
    only_bias = {"bias": np.empty(28, np.float32)}
    _, ob = knp.sklinear_backward(plan, x, params, dy, need_dx=False, dparams=only_bias)
    np.testing.assert_allclose(ob["bias"], dp["bias"], rtol=1e-6, atol=1e-7)


def test_numpy_accepts_a_torch_state_dict():
    torch.manual_seed(0)
    m = kt.SKLinear(16, 12, 2, 3)
    plan = SkLinearPlan(kfuse.Context(), 16, 12, 2, 3)
    x = torch.randn(5, 16)
    y = knp.sklinear_forward(plan, x, m.state_dict())  # torch tensors through DLPack
    np.testing.assert_allclose(y, m(x).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_every_output_element_written():
    """Outputs poisoned with NaN before the call come back finite (low-level API)."""
    ctx = kfuse.Context()
    for bias in (True, False):
        plan = SkLinearPlan(ctx, 19, 23, 2, 5, bias=bias)
        rng = np.random.default_rng(0)
        p = {n: rng.uniform(-0.5, 0.5, s).astype(np.float32) for n, s in plan.param_info}
        x = rng.standard_normal((6, 19)).astype(np.float32)
        y = np.full((6, 23), np.nan, np.float32)
        ref = knp.tensor_ref
        plan.forward(ref(x), ref(p["S1s"]), ref(p["S2s"]), ref(p["U1s"]), ref(p["U2s"]), ref(y),
                     bias=ref(p.get("bias")))
        assert np.isfinite(y).all()
        dx = np.full(x.shape, np.nan, np.float32)
        d = {n: np.full(s, np.nan, np.float32) for n, s in plan.param_info}
        plan.backward(ref(x), ref(p["S1s"]), ref(p["S2s"]), ref(p["U1s"]), ref(p["U2s"]),
                      ref(np.ones_like(y)), dx=ref(dx), dS1s=ref(d["S1s"]), dS2s=ref(d["S2s"]),
                      dbias=ref(d.get("bias")))
        assert np.isfinite(dx).all() and np.isfinite(d["S1s"]).all()
        assert np.isfinite(d["S2s"]).all() and (not bias or np.isfinite(d["bias"]).all())
        init = {n: np.full(s, np.nan, np.float32) for n, s in plan.param_info}
        plan.init_params(5, ref(init["S1s"]), ref(init["S2s"]), ref(init["U1s"]),
                         ref(init["U2s"]), bias=ref(init.get("bias")))
        assert all(np.isfinite(v).all() for v in init.values())


def test_packed_args_match_field_by_field_fill():
    """The argument structs written in one struct.pack_into hold what setting each kf_tensor field
    through cffi gives (the layout check at import picked the packed path here)."""
    import kfuse.sklinear as ks
    assert ks._FWD_STRUCT is not None and ks._BWD_STRUCT is not None
    a = np.zeros((2, 3, 5), np.float32)
    refs = [knp.tensor_ref(a), None, knp.tensor_ref(a[0]), (a.ctypes.data, 1, (7,), None),
            knp.tensor_ref(a.transpose(2, 0, 1)), None,
            knp.tensor_ref(np.zeros((1,) * 8, np.float32))]  # 8-D: passed on truncated
    for st in (ks._FWD_STRUCT, None):
        args = ks._fill_args({}, "kf_sklinear_forward_args",
                             kfuse.lib.kf_sklinear_forward_args_init, st, ks._FWD_FIELDS, refs)
        blob = bytes(kfuse.ffi.buffer(args))
        if st is not None:
            packed = blob
    assert packed == blob


def _cffi_fill(t, obj):
    """kf_tensor `t` set field by field through cffi from a torch tensor (or None = absent)."""
    ffi = kfuse.ffi
    ffi.buffer(ffi.addressof(t))[:] = bytes(ffi.sizeof("kf_tensor"))
    if obj is None:
        t.dtype = kfuse.lib.KF_DTYPE_F32
        return
    t.data = ffi.cast("void *", obj.data_ptr())
    t.dtype = {torch.float32: kfuse.lib.KF_DTYPE_F32, torch.float64: kfuse.lib.KF_DTYPE_F64,
               torch.int32: kfuse.lib.KF_DTYPE_I32,
               torch.float16: kfuse.lib.KF_DTYPE_F16, torch.int64: kfuse.lib.KF_DTYPE_I64}[obj.dtype]
    t.ndim = obj.dim()
    for i in range(min(obj.dim(), kfuse.lib.KF_MAX_DIMS)):
        t.shape[i] = obj.shape[i]
        t.strides[i] = obj.stride(i)


@pytest.mark.parametrize("ranks", [(2, 3, 3, 3, 3, 1, 2), (0, 1, 4, 5, 6, 7, 8)])
def test_packed_torch_args_match_cffi_fill(ranks):
    """The per-call path (a torch tensor of rank <= KF_MAX_DIMS packed from its shape and
    strides, the entries past its rank zeroed) writes what setting each field through cffi gives:
    every rank, strided views, other dtypes, None, a Parameter, more dims than KF_MAX_DIMS (ndim
    kept, the rest truncated), and a struct reused with other ranks. (A dtype no kf_dtype
    describes is refused before packing: test_torch_ops.py's
    test_input_dtype_without_kf_dtype_named_as_torch_names_it.)"""
    import kfuse.sklinear as ks
    dtypes = (torch.float32, torch.float64, torch.int32, torch.float16, torch.int64)
    objs = []
    for i, r in enumerate(ranks):
        t = torch.zeros((2,) * r, dtype=dtypes[i % len(dtypes)])
        if r >= 2 and i % 2:
            t = t.transpose(0, r - 1)
        objs.append(nn.Parameter(t, requires_grad=False) if i == 3 else t)
    objs[5] = None
    cache = {}
    for refs in (objs, objs[::-1]):  # the second call rewrites every entry the first wrote
        args = ks._fill_args(cache, "kf_sklinear_forward_args",
                             kfuse.lib.kf_sklinear_forward_args_init, ks._FWD_STRUCT,
                             ks._FWD_FIELDS, refs)
        want = kfuse.ffi.new("kf_sklinear_forward_args *")
        kfuse.lib.kf_sklinear_forward_args_init(want)
        for f, obj in zip(ks._FWD_FIELDS, refs):
            _cffi_fill(getattr(want, f), obj)
        assert bytes(kfuse.ffi.buffer(args)) == bytes(kfuse.ffi.buffer(want))


# ---- errors ------------------------------------------------------------------------------------

def test_errors_carry_the_library_message():
    m = kt.SKLinear(8, 6, 1, 2)
    with pytest.raises(kfuse.InvalidArgument) as e:
        m(torch.randn(3, 9))
    assert e.value.message.startswith("kf_sklinear_forward: ") and "args->x" in e.value.message
    with pytest.raises(kfuse.InvalidArgument, match="dtype"):
        m(torch.randn(3, 8, dtype=torch.float64))
    with pytest.raises(kfuse.InvalidArgument):
        m(torch.tensor(1.0))  # 0-d input
    plan = SkLinearPlan(kfuse.Context(), 8, 6, 1, 2, bias=False)
    p = {n: np.zeros(s, np.float32) for n, s in plan.param_info}
    p["bias"] = np.zeros(6, np.float32)
    with pytest.raises(kfuse.InvalidArgument, match="bias"):
        knp.sklinear_forward(plan, np.zeros((2, 8), np.float32), p)
    with pytest.raises(kfuse.InvalidArgument, match="contiguous|strides"):
        knp.sklinear_forward(plan, np.zeros((8, 2), np.float32).T, p)


def test_parameter_shapes_are_the_keyed_plans():
    # (in, out, L, k) come from S1s [L, in, k] and S2s [L, k, out]; the other tensors must then
    # have the library's shapes for them: S2s with L = 2 against S1s's L = 1 is refused, naming
    # S2s and what [L, k, out] = [1, 2, 6] expects, with rows (the library's check) or without
    # (an empty batch, which no library call sees: the plan's kf_sklinear_param_info).
    S1s, U2s = torch.randn(1, 8, 2), torch.randn(1, 8, 2)
    S2s, U1s, bias = torch.randn(2, 2, 6), torch.randn(1, 2, 6), torch.randn(6)
    with pytest.raises(kfuse.InvalidArgument) as e:
        kt.sklinear_function(torch.randn(3, 8), S1s, S2s, U1s, U2s, bias)
    assert "args->S2s.shape[0] = 2, expected 1" in e.value.message
    with pytest.raises(ValueError, match=r"S2s has shape \(2, 2, 6\), expected \(1, 2, 6\)"):
        kt.sklinear_function(torch.randn(0, 8), S1s, S2s, U1s, U2s, bias)
    with pytest.raises(ValueError, match=r"bias has shape \(5,\), expected \(6,\)"):
        kt.sklinear_function(torch.randn(0, 8), S1s, S2s[:1], U1s, U2s, torch.randn(5))


def test_descriptor_errors_at_construction():
    with pytest.raises(kfuse.InvalidArgument, match="low_rank"):
        kt.SKLinear(8, 6, 1, 0)
    with pytest.raises(kfuse.InvalidArgument, match="num_terms"):
        kt.SKLinear(8, 6, 0, 2)
    with pytest.raises(kfuse.InvalidArgument, match="in_features"):
        SkLinearPlan(kfuse.Context(), 0, 6, 1, 2)
    with pytest.raises(kfuse.Unsupported, match="dtype"):
        kt.SKLinear(8, 6, 1, 2, dtype=torch.int32)


# ---- float64 (CPU) -----------------------------------------------------------------------------

@pytest.mark.parametrize("bias", [True, False])
def test_float64_matches_the_formula(bias):
    """A float64 module follows its parameters' dtype: y and every gradient within 1e-12 of the
    term-by-term formula in float64 (out = 20, k = 16: ragged columns of the library's GEMMs)."""
    torch.manual_seed(3)
    m = quiet(kt.SKLinear, 24, 20, 2, 16, bias=bias, dtype=torch.float64)
    assert m.S1s.dtype == m.U1s.dtype == torch.float64
    x = torch.rand(2, 5, 24, dtype=torch.float64, requires_grad=True)
    dy = torch.rand(2, 5, 20, dtype=torch.float64)
    y = m(x)
    assert y.dtype == torch.float64
    names = ["S1s", "S2s"] + (["bias"] if bias else [])
    y.backward(dy)
    xr = x.detach().clone().requires_grad_(True)
    ps = {n: getattr(m, n).detach().clone().requires_grad_(True) for n in names}
    yr = reference_forward(xr, ps["S1s"], ps["S2s"], m.U1s, m.U2s, ps.get("bias"))
    yr.backward(dy)
    assert rel(y, yr) < 1e-12
    assert rel(x.grad, xr.grad) < 1e-12
    for n in names:
        assert rel(getattr(m, n).grad, ps[n].grad) < 1e-12, n


def test_float64_gradcheck():
    """torch.autograd.gradcheck through the library's float64 forward and backward, every input."""
    torch.manual_seed(4)
    m = kt.SKLinear(5, 4, 2, 2, dtype=torch.float64)
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    params = {n: getattr(m, n).detach().clone().requires_grad_(True)
              for n in ("S1s", "S2s", "bias")}
    buffers = {"U1s": m.U1s, "U2s": m.U2s}

    def f(x, S1s, S2s, bias):
        return _functional_call(m, {"S1s": S1s, "S2s": S2s, "bias": bias, **buffers}, x)

    assert torch.autograd.gradcheck(f, (x, params["S1s"], params["S2s"], params["bias"]))


def _functional_call(module, tensors, x):
    fc = getattr(getattr(torch, "func", None), "functional_call", None)
    if fc is None:
        from torch.nn.utils.stateless import functional_call as fc
    return fc(module, tensors, (x,))


def test_meta_device_builds_without_data():
    m = kt.SKLinear(8, 6, 2, 2, device="meta")
    assert m.S1s.device.type == "meta" and m.U2s.shape == (2, 8, 2)


# ---- threads -----------------------------------------------------------------------------------

def test_threads_use_their_own_contexts():
    torch.manual_seed(0)
    m = kt.SKLinear(256, 192, 2, 16)
    x = torch.randn(32, 256)
    want = m(x).detach()
    results, errors = [None] * 4, []

    def work(i):
        try:
            for _ in range(5):
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


# ---- the real Panther, where it imports --------------------------------------------------------

def _panther():
    try:
        from panther.nn import SKLinear as PantherSKLinear
        return PantherSKLinear
    except Exception:  # not installed (panther-ml needs Python >= 3.12 and its C++ extension)
        return None


@pytest.mark.skipif(_panther() is None, reason="panther (panther-ml) is not importable")
@pytest.mark.parametrize("bias", [True, False])
def test_differential_vs_panther(bias):
    PantherSKLinear = _panther()
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = PantherSKLinear(48, 32, 2, 16, bias=bias)
        k = kt.SKLinear(48, 32, 2, 16, bias=bias)
    assert list(k.state_dict()) == list(p.state_dict())
    assert [n for n, _ in k.named_parameters()] == [n for n, _ in p.named_parameters()]
    assert [n for n, _ in k.named_buffers()] == [n for n, _ in p.named_buffers()]
    assert (k.has_tensor_core, k.use_gpu) == (p.has_tensor_core, p.use_gpu)  # sizes % 16 == 0
    k.load_state_dict(p.state_dict(), strict=True)
    x = torch.randn(16, 48)
    dy = torch.randn(16, 32)
    outs = []
    for mod in (p, k):
        xx = x.clone().requires_grad_(True)
        y = mod(xx)
        y.backward(dy)
        outs.append([y.detach(), xx.grad] + [q.grad for q in mod.parameters()])
    for a, b in zip(*outs):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    p2 = PantherSKLinear(48, 32, 2, 16, bias=bias)
    p2.load_state_dict(kt.SKLinear(48, 32, 2, 16, bias=bias).state_dict(), strict=True)
    # 1-D input returns 1-D in both
    assert p(x[0]).shape == k(x[0]).shape == (32,)


# ---- CUDA (runs only where torch and kfuse both have CUDA) -------------------------------------

@pytest.mark.skipif(not cuda_ok(), reason="needs torch CUDA and a CUDA build of kfuse")
def test_cuda_matches_cpu_on_current_stream():
    torch.manual_seed(0)
    m = randomize_(kt.SKLinear(96, 80, 2, 16))
    mc = kt.SKLinear(96, 80, 2, 16, device="cuda")
    mc.load_state_dict(m.state_dict())
    x = torch.randn(33, 96)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        xc = x.cuda().requires_grad_(True)
        yc = mc(xc)
        yc.sum().backward()
    torch.cuda.synchronize()
    xx = x.clone().requires_grad_(True)
    y = m(xx)
    y.sum().backward()
    assert rel(yc.detach().cpu(), y) < TOL and rel(xc.grad.cpu(), xx.grad) < TOL
    for n in ("S1s", "S2s", "bias"):
        assert rel(getattr(mc, n).grad.cpu(), getattr(m, n).grad) < 1e-4, n
    # the same seed gives the same layer on either device
    torch.manual_seed(5)
    a = kt.SKLinear(40, 30, 2, 4)
    torch.manual_seed(5)
    b = kt.SKLinear(40, 30, 2, 4, device="cuda")
    for n, t in a.state_dict().items():
        torch.testing.assert_close(b.state_dict()[n].cpu(), t, rtol=1e-6, atol=1e-7)
    with pytest.raises(RuntimeError, match="same device"):
        mc(x)


@pytest.mark.skipif(not cuda_ok(), reason="needs torch CUDA and a CUDA build of kfuse")
def test_cuda_float64_matches_reference_and_gradcheck():
    """A float64 SKLinear on CUDA (the library's float64 CUDA path): y and every gradient within
    1e-12 of the float64 reference, and torch.autograd.gradcheck on every input."""
    torch.manual_seed(4)
    m = kt.SKLinear(24, 20, 3, 4, dtype=torch.float64, device="cuda")
    x = torch.randn(2, 5, 24, dtype=torch.float64, device="cuda", requires_grad=True)
    dy = torch.randn(2, 5, 20, dtype=torch.float64, device="cuda")
    y = m(x)
    assert y.dtype == torch.float64 and y.is_cuda
    y.backward(dy)
    xr = x.detach().clone().requires_grad_(True)
    ps = {n: getattr(m, n).detach().clone().requires_grad_(True) for n in ("S1s", "S2s", "bias")}
    yr = reference_forward(xr, ps["S1s"], ps["S2s"], m.U1s, m.U2s, ps["bias"])
    yr.backward(dy)
    assert rel(y, yr) < 1e-12 and rel(x.grad, xr.grad) < 1e-12
    for n in ps:
        assert rel(getattr(m, n).grad, ps[n].grad) < 1e-12, n
    small = kt.SKLinear(5, 4, 2, 2, dtype=torch.float64, device="cuda")
    args = (torch.randn(3, 5, dtype=torch.float64, device="cuda", requires_grad=True),) + tuple(
        getattr(small, n).detach().clone().requires_grad_(True) for n in ("S1s", "S2s", "bias"))
    assert torch.autograd.gradcheck(
        lambda xx, s1, s2, b: kt.sklinear_function(xx, s1, s2, small.U1s, small.U2s, b), args)


@pytest.mark.skipif(not cuda_ok(), reason="needs torch CUDA and a CUDA build of kfuse")
@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
def test_cuda_autocast_runs_low_precision(dt):
    """Under torch.autocast("cuda"), SKLinear runs its low plan (both products on the tensor
    cores): y in the autocast dtype, its error against float64 within 2x that of torch's own
    computation of the layer under the same autocast (the reference formula in eager torch, as
    Panther computes it), float32 gradients for the float32 parameters."""
    torch.manual_seed(0)
    m = kt.SKLinear(256, 192, 2, 16, device="cuda")
    x = torch.randn(64, 256, device="cuda")
    want = reference_forward(*(t.double() for t in (x, m.S1s, m.S2s, m.U1s, m.U2s, m.bias)))
    with torch.autocast("cuda", dtype=dt):
        y = m(x)
        yt = reference_forward(x, m.S1s, m.S2s, m.U1s, m.U2s, m.bias)
    assert y.dtype == dt
    err, err_torch = rel(y, want), rel(yt, want)
    assert err <= 2 * err_torch + 1e-6, (err, err_torch)
    y.float().sum().backward()
    for n in ("S1s", "S2s", "bias"):
        g = getattr(m, n).grad
        assert g.dtype == torch.float32 and torch.isfinite(g).all(), n
