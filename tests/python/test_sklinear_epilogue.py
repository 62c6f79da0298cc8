"""kfuse.torch.SKLinear's fused epilogue (activation= and dropout=, kfuse 1.8): y =
dropout(act(SKLinear(x))) against a float64 reference built from torch's own functions (F.relu,
F.gelu with approximate="none" / "tanh", F.silu) on test_sklinear.py's reference layer, with the
dropout mask replayed from the library's counter (seed, offset 0 + row * out + column) by a small
numpy implementation of its SplitMix64 mixer written here; gradients by torch autograd on that
reference; gradcheck in float64; every dtype; repeatability under torch.manual_seed; eval mode;
Panther's layer unchanged by the defaults; bad input; torch.compile (torch >= 2.4).

Bounds ||out - ref|| / ||ref||: float64 1e-10, float32 1e-5, bfloat16 / float16 4 units of
roundoff (y and pre rounded once each, as tests/c/test_sklinear_epilogue.c)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import kfuse  # noqa: E402
import kfuse.torch as kt  # noqa: E402
from kfuse.torch.sklinear import sklinear_epi  # noqa: E402
from devices import cuda_ok  # noqa: E402
from test_sklinear import reference_forward  # noqa: E402

ACTS = {None: lambda v: v, "relu": F.relu, "gelu": F.gelu,
        "gelu_tanh": lambda v: F.gelu(v, approximate="tanh"), "silu": F.silu}
CODES = {None: 0, "relu": 1, "gelu": 2, "gelu_tanh": 3, "silu": 4}
pytestmark = pytest.mark.filterwarnings(
    "ignore:The sketching layer uses more parameters:UserWarning")

TOLS = {torch.float64: 1e-10, torch.float32: 1e-5, torch.bfloat16: 4 * 2.0 ** -8,
        torch.float16: 4 * 2.0 ** -11}


# ---- the mask, replayed (common/counter_rng.h's definition, written again in numpy) ----------

def _mix(z):
    z = z.copy()
    with np.errstate(over="ignore"):
        z ^= z >> np.uint64(30)
        z *= np.uint64(0xBF58476D1CE4E5B9)
        z ^= z >> np.uint64(27)
        z *= np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return z


def mask(seed, n, p, offset=0):
    """Keep flags of elements 0..n-1 at counters offset + i: u >= p, u the top 24 bits of
    mix(mix(seed + golden) ^ counter) over 2^24."""
    with np.errstate(over="ignore"):
        key = _mix(np.array([seed], dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15))
    z = _mix(key ^ (np.arange(n, dtype=np.uint64) + np.uint64(offset)))
    u = (z >> np.uint64(40)).astype(np.float64) / 2.0 ** 24
    return torch.from_numpy(u >= np.float32(p))


def rel(out, want):
    out, want = out.detach().double(), want.detach().double()
    assert out.shape == want.shape and torch.isfinite(out).all()
    return ((out - want).norm() / want.norm()).item()


def layer(act, p, dtype=torch.float32, device="cpu", shape=(40, 24, 3, 4)):
    torch.manual_seed(1)
    i, o, L, k = shape
    return kt.SKLinear(i, o, L, k, activation=act, dropout=p, dtype=dtype, device=device)


def reference(m, x, seed, training):
    """(y, sum(y * dy)'s gradients w.r.t. x, S1s, S2s, bias) in float64."""
    xd = x.detach().double().requires_grad_(True)
    ps = {n: getattr(m, n).detach().double().requires_grad_(n in ("S1s", "S2s", "bias"))
          for n in ("S1s", "S2s", "U1s", "U2s", "bias")}
    pre = reference_forward(xd, ps["S1s"], ps["S2s"], ps["U1s"], ps["U2s"], ps["bias"])
    y = ACTS[m.activation](pre)
    if training and m.dropout > 0:
        keep = mask(seed, pre.numel(), m.dropout).view(pre.shape)
        y = y * keep.double() / (1.0 - np.float64(np.float32(m.dropout)))
    return y, xd, ps


def seed_of(s):
    """The seed SKLinear's forward draws first after torch.manual_seed(s)."""
    torch.manual_seed(s)
    return int(torch.randint(0, 2 ** 62, (1,), dtype=torch.int64).item())


@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("p", [0.0, 0.3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_against_torch_functions(act, p, dtype):
    m = layer(act, p, dtype)
    x = (torch.rand(33, 40, dtype=torch.float64) * 2 - 1).to(dtype).requires_grad_(True)
    dy = (torch.rand(33, 24, dtype=torch.float64) * 2 - 1).to(dtype)
    seed = seed_of(7)
    torch.manual_seed(7)
    y = m(x)
    (y * dy).sum().backward()
    y_ref, xd, ps = reference(m, x, seed, True)
    (y_ref * dy.double()).sum().backward()
    tol = TOLS[dtype]
    assert y.dtype == dtype and rel(y, y_ref) < tol
    assert rel(x.grad, xd.grad) < tol
    for n in ("S1s", "S2s", "bias"):
        assert rel(getattr(m, n).grad, ps[n].grad) < tol, n


def test_dropout_follows_training_and_manual_seed():
    m = layer("gelu", 0.5)
    x = torch.randn(16, 40)
    torch.manual_seed(3)
    a = m(x)
    torch.manual_seed(3)
    b = m(x)
    c = m(x)  # a fresh seed: a fresh mask
    assert torch.equal(a, b)
    assert not torch.equal((a == 0), (c == 0))
    assert 0.3 < (a == 0).double().mean().item() < 0.7
    m.eval()
    with torch.no_grad():
        y = m(x)
    y_ref, _, _ = reference(m, x, 0, False)
    assert rel(y, y_ref) < 1e-5  # no dropout in eval mode
    assert (y != 0).all()


def test_gradcheck_float64():
    m = layer("gelu_tanh", 0.25, torch.float64, shape=(6, 5, 2, 2))
    seed = torch.tensor([12345], dtype=torch.int64)  # one mask for every evaluation
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    S1s, S2s, b = (m.S1s.detach().clone().requires_grad_(True),
                   m.S2s.detach().clone().requires_grad_(True),
                   m.bias.detach().clone().requires_grad_(True))

    for act in ("relu", "gelu", "gelu_tanh", "silu"):
        if act == "relu":  # a kink at 0: keep the pre-activations away from it
            b2 = (b.detach() + 5.0).requires_grad_(True)
        else:
            b2 = b

        def f(x, S1s, S2s, bias, act=CODES[act]):
            return sklinear_epi(x, S1s, S2s, m.U1s, m.U2s, bias, act, 0.25, True, True, seed)[0]

        assert torch.autograd.gradcheck(f, (x, S1s, S2s, b2))


def test_defaults_leave_panthers_layer():
    torch.manual_seed(0)
    a = kt.SKLinear(20, 12, 2, 3)
    torch.manual_seed(0)
    b = kt.SKLinear(20, 12, 2, 3, activation=None, dropout=0.0)
    assert list(a.state_dict()) == list(b.state_dict())
    assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())
    x = torch.randn(5, 20)
    assert torch.equal(a(x), b(x))
    c = kt.SKLinear(20, 12, 2, 3, activation="silu", dropout=0.1)
    c.load_state_dict(a.state_dict(), strict=True)  # same keys, same shapes
    assert "activation='silu'" in repr(c)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="activation"):
        kt.SKLinear(8, 8, 1, 2, activation="tanh")
    for p in (1.0, -0.1, 1.5):
        with pytest.raises(kfuse.KfuseError, match="dropout"):
            kt.SKLinear(8, 8, 1, 2, dropout=p)


@pytest.mark.skipif(not cuda_ok(), reason="no usable CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_cuda_masks_are_the_cpus(dtype):
    m = layer("relu", 0.4, dtype)
    x = torch.randn(64, 40, dtype=dtype)
    torch.manual_seed(11)
    y_cpu = m(x)
    md = layer("relu", 0.4, dtype, device="cuda")
    md.load_state_dict(m.state_dict())
    torch.manual_seed(11)
    y_gpu = md(x.cuda()).cpu()
    assert torch.equal(y_cpu == 0, y_gpu == 0)
    assert rel(y_gpu, y_cpu) < TOLS[dtype] * 2


@pytest.mark.skipif(not hasattr(torch, "library") or not hasattr(torch.library, "register_fake"),
                    reason="torch.compile of kfuse operators needs torch >= 2.4")
def test_torch_compile_fullgraph():
    m = layer("gelu", 0.3)
    x = torch.randn(12, 40, requires_grad=True)
    cm = torch.compile(m, fullgraph=True, backend="aot_eager")
    torch.manual_seed(5)
    y = cm(x)
    y.sum().backward()
    g = x.grad.clone()
    x.grad = None
    torch.manual_seed(5)
    y_eager = m(x)
    y_eager.sum().backward()
    # the same draw from torch's generator, hence the same mask; the same kernels
    assert torch.equal(y == 0, y_eager == 0)
    assert rel(y, y_eager) < 1e-6 and rel(g, x.grad) < 1e-6
    m.eval()
    with torch.no_grad():
        assert rel(cm(x), m(x)) < 1e-6


@pytest.mark.skipif(not kt.HAS_TORCH_LIBRARY, reason="torch.library operators need torch >= 2.4")
def test_opcheck():
    """torch.library.opcheck of kfuse::sklinear_epi and its backward (schema, fake shapes,
    autograd registration), as test_torch_ops.py does for the other operators."""
    m = layer("gelu", 0.2, shape=(12, 10, 2, 3))
    x = torch.randn(5, 12, requires_grad=True)
    seed = torch.tensor([7], dtype=torch.int64)
    args = (x, m.S1s, m.S2s, m.U1s, m.U2s, m.bias, CODES["gelu"], 0.2, True, True, seed)
    torch.library.opcheck(torch.ops.kfuse.sklinear_epi.default, args)
    with torch.no_grad():
        y, pre = torch.ops.kfuse.sklinear_epi(*args)
    d = [t.detach() for t in (x, m.S1s, m.S2s, m.U1s, m.U2s)]
    torch.library.opcheck(torch.ops.kfuse.sklinear_epi_backward.default,
                          (torch.randn_like(y), *d, pre, True, CODES["gelu"], 0.2, True, seed,
                           [True, True, True, True]))
