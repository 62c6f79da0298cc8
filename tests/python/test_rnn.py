"""Tests of the kfuse Python package for the recurrent ops (GRU, A-GRU): numpy and torch front
ends against float64 references (torch.nn.GRU in float64; the eager reference A-GRU in
agru_reference.py in float64), against torch.nn.GRU itself, state_dict round trips, unbatched,
batch_first, bidirectional, multi-layer, packed input, dropout, errors, threads and the GIL.

Accuracy bar (DESIGN.md): ||out - ref|| / ||ref|| < 1e-5 for fp32 against float64, on random
inputs and weights at the reference's own init scale, at short T.
"""
import copy
import os
import sys
import threading
import time

import numpy as np
import pytest

import kfuse
import kfuse.numpy as knp

torch = pytest.importorskip("torch")
import kfuse.torch as kt  # noqa: E402
from devices import cuda_ok  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import agru_reference as ref  # noqa: E402

TOL = 1e-5


def rel(out, want):
    out = torch.as_tensor(out).detach().double()
    want = torch.as_tensor(want).detach().double()
    assert out.shape == want.shape, (out.shape, want.shape)
    assert torch.isfinite(out).all()
    return ((out - want).norm() / want.norm()).item()


DEVICES = ["cpu"] + (["cuda"] if cuda_ok() else [])


def run_and_grads(module, x, h0, gy, gh, params):
    """Forward, then backward of sum(y*gy) + sum(hn*gh): (y, hn, dx, dh0, [dparams])."""
    x = x.detach().clone().requires_grad_(True)
    h0 = None if h0 is None else h0.detach().clone().requires_grad_(True)
    for p in params:
        p.grad = None
    y, hn = module(x, h0)
    ((y * gy).sum() + (hn * gh).sum()).backward()
    return (y.detach(), hn.detach(), x.grad, None if h0 is None else h0.grad,
            [p.grad for p in params])


def compare(kmod, rmod, x, h0, device="cpu", dtype=torch.float32, tol=TOL):
    """kfuse module (in `dtype`) vs reference module (float64) holding the same weights: fwd and
    bwd, every output within `tol`."""
    gen = torch.Generator().manual_seed(1)
    y_r, hn_r = rmod(x.double(), None if h0 is None else h0.double())
    gy = torch.randn(y_r.shape, generator=gen, dtype=torch.float64)
    gh = torch.randn(hn_r.shape, generator=gen, dtype=torch.float64)
    names = [n for n, _ in kmod.named_parameters()]
    rparams = dict(rmod.named_parameters())
    ko = run_and_grads(kmod, x.to(device, dtype), None if h0 is None else h0.to(device, dtype),
                       gy.to(device, dtype), gh.to(device, dtype),
                       [p for _, p in kmod.named_parameters()])
    ro = run_and_grads(rmod, x.double(), None if h0 is None else h0.double(), gy, gh,
                       [rparams[n] for n in names])
    errs = {"y": rel(ko[0].cpu(), ro[0]), "hn": rel(ko[1].cpu(), ro[1]),
            "dx": rel(ko[2].cpu(), ro[2])}
    if h0 is not None:
        errs["dh0"] = rel(ko[3].cpu(), ro[3])
    for n, a, b in zip(names, ko[4], ro[4]):
        errs["d" + n] = rel(a.cpu(), b)
    bad = {k: v for k, v in errs.items() if not v < tol}
    assert not bad, bad


def seq(T, B, I, batch_first, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (B, T, I) if batch_first else (T, B, I)
    return torch.randn(shape, generator=g)


# ---- GRU -------------------------------------------------------------------------------------

GRU_CASES = [  # (num_layers, bidirectional, batch_first, with_h0)
    (1, False, False, False), (1, False, True, True), (2, False, False, True),
    (1, True, False, True), (2, True, True, True), (3, False, True, False),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("L,bidir,bf,with_h0", GRU_CASES)
def test_gru_vs_float64_torch(L, bidir, bf, with_h0, device):
    torch.manual_seed(0)
    T, B, I, H = 9, 4, 6, 8
    kmod = kt.GRU(I, H, L, batch_first=bf, bidirectional=bidir, device=device)
    rmod = torch.nn.GRU(I, H, L, batch_first=bf, bidirectional=bidir, dtype=torch.float64)
    rmod.load_state_dict(kmod.state_dict(), strict=True)
    D = 2 if bidir else 1
    h0 = torch.randn(L * D, B, H) * 0.5 if with_h0 else None
    compare(kmod, rmod, seq(T, B, I, bf), h0, device)


@pytest.mark.parametrize("L,bidir,bf", [(1, False, False), (2, True, True)])
def test_gru_vs_torch_gru_fp32(L, bidir, bf):
    """Same weights in torch.nn.GRU (fp32) and kfuse.torch.GRU: outputs and gradients agree."""
    torch.manual_seed(0)
    kmod = kt.GRU(5, 7, L, batch_first=bf, bidirectional=bidir)
    tmod = torch.nn.GRU(5, 7, L, batch_first=bf, bidirectional=bidir)
    tmod.load_state_dict(kmod.state_dict())
    x = seq(11, 3, 5, bf)
    h0 = torch.randn(L * (2 if bidir else 1), 3, 7)
    gy = torch.randn(seq(11, 3, 7 * (2 if bidir else 1), bf).shape)
    gh = torch.randn(h0.shape)
    ko = run_and_grads(kmod, x, h0, gy, gh, list(kmod.parameters()))
    to = run_and_grads(tmod, x, h0, gy, gh, list(tmod.parameters()))
    for a, b in zip(ko[:4] + tuple(ko[4]), to[:4] + tuple(to[4])):
        assert a.dtype == b.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_gru_same_seed_same_init_and_names():
    torch.manual_seed(123)
    k = kt.GRU(4, 6, 2, bidirectional=True)
    torch.manual_seed(123)
    t = torch.nn.GRU(4, 6, 2, bidirectional=True)
    ks, ts = k.state_dict(), t.state_dict()
    assert list(ks) == list(ts)
    for n in ts:
        assert torch.equal(ks[n], ts[n]), n
    assert [n for n, _ in k.named_parameters()] == [n for n, _ in t.named_parameters()]
    assert k._flat_weights_names == t._flat_weights_names
    assert [[p.shape for p in ws] for ws in k.all_weights] == \
        [[p.shape for p in ws] for ws in t.all_weights]
    assert list(k.buffers()) == [] and list(t.buffers()) == []


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("L,bidir", [(1, False), (2, True)])
def test_gru_without_bias(L, bidir, device):
    """GRU(bias=False) as torch.nn.GRU(bias=False): the same parameters (weights only), names,
    initialisation from the same seed and repr; outputs and every gradient against torch's
    float64 GRU without bias."""
    torch.manual_seed(7)
    k = kt.GRU(5, 6, L, bias=False, bidirectional=bidir, device=device)
    torch.manual_seed(7)
    t = torch.nn.GRU(5, 6, L, bias=False, bidirectional=bidir, device=device)  # same generator
    assert list(k.state_dict()) == list(t.state_dict())
    for n, v in t.state_dict().items():
        assert torch.equal(k.state_dict()[n], v), n
    assert not any("bias" in n for n, _ in k.named_parameters())
    assert repr(k) == repr(t)
    r = torch.nn.GRU(5, 6, L, bias=False, bidirectional=bidir, dtype=torch.float64)
    r.load_state_dict(k.state_dict(), strict=True)
    D = 2 if bidir else 1
    compare(k, r, seq(8, 3, 5, False), torch.randn(L * D, 3, 6) * 0.5, device)


def test_gru_state_dict_round_trip_both_ways():
    t = torch.nn.GRU(3, 5, 2, batch_first=True, bidirectional=True)
    k = kt.GRU(3, 5, 2, batch_first=True, bidirectional=True)
    k.load_state_dict(t.state_dict(), strict=True)
    x = torch.randn(2, 7, 3)
    torch.testing.assert_close(k(x)[0], t(x)[0], rtol=1e-4, atol=1e-6)
    k2 = kt.GRU(3, 5, 2, batch_first=True, bidirectional=True)
    t.load_state_dict(k2.state_dict(), strict=True)
    torch.testing.assert_close(k2(x)[1], t(x)[1], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("bf", [False, True])
def test_gru_unbatched(bf):
    torch.manual_seed(0)
    k = kt.GRU(4, 5, 2, batch_first=bf, bidirectional=True)
    t = torch.nn.GRU(4, 5, 2, batch_first=bf, bidirectional=True)
    t.load_state_dict(k.state_dict())
    x = torch.randn(6, 4)
    h0 = torch.randn(4, 5)
    for args in [(x,), (x, h0)]:
        (ky, kh), (ty, th) = k(*args), t(*args)
        assert ky.shape == ty.shape == (6, 10) and kh.shape == th.shape == (4, 5)
        torch.testing.assert_close(ky, ty, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(kh, th, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("bf", [False, True])
@pytest.mark.parametrize("cls", ["GRU", "AGRU"])
def test_empty_batch_as_torch_gru(cls, bf):
    """A batch of no samples (B = 0), which torch.nn.GRU accepts: empty y and h_n of torch's
    shapes, empty dx, zero weight gradients (torch.nn.GRU's on the same input), with and without
    h0. (The library's extents start at 1; the operator runs nothing for it.)"""
    torch.manual_seed(0)
    m = getattr(kt, cls)(4, 5, num_layers=2, batch_first=bf)
    ref = torch.nn.GRU(4, 5, num_layers=2, batch_first=bf)
    x = torch.zeros((0, 3, 4) if bf else (3, 0, 4), requires_grad=True)
    y, hn = m(x)
    yr, hnr = ref(x)
    assert (y.shape, hn.shape) == (yr.shape, hnr.shape)
    (y.sum() + hn.sum()).backward()
    assert x.grad.shape == x.shape
    for n, p in m.named_parameters():
        assert p.grad is not None and not p.grad.any(), n
    y, hn = m(x, torch.zeros(2, 0, 5))
    assert (y.shape, hn.shape) == (yr.shape, hnr.shape)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bf", [False, True])
def test_gru_packed_sequence(bf, device):
    """PackedSequence in and out (unsorted lengths, with h0) vs torch.nn.GRU in float64 on the
    CPU: same packing (batch_sizes, permutation), outputs and gradients."""
    torch.manual_seed(0)
    k = kt.GRU(3, 4, 2, batch_first=bf, bidirectional=True, device=device)
    t = torch.nn.GRU(3, 4, 2, batch_first=bf, bidirectional=True, dtype=torch.float64)
    t.load_state_dict(k.state_dict())
    lengths = torch.tensor([3, 7, 5, 7])
    x = seq(7, 4, 3, bf)
    h0 = torch.randn(4, 4, 4)
    outs = []
    for mod, dev, dt in ((k, device, torch.float32), (t, "cpu", torch.float64)):
        xx = x.to(dev, dt).detach().clone().requires_grad_(True)
        hh = h0.to(dev, dt).detach().clone().requires_grad_(True)
        packed = torch.nn.utils.rnn.pack_padded_sequence(xx, lengths, batch_first=bf,
                                                         enforce_sorted=False)
        y, hn = mod(packed, hh)
        assert isinstance(y, torch.nn.utils.rnn.PackedSequence) and y.data.dtype == dt
        (y.data.sin().sum() + hn.pow(2).sum()).backward()
        outs.append((y.data, y.batch_sizes, y.sorted_indices, hn, xx.grad, hh.grad,
                     [p.grad for p in mod.parameters()]))
    (ky, kb, ks, kh, kdx, kdh, kdw), (ty, tb, ts, th, tdx, tdh, tdw) = outs
    assert torch.equal(kb, tb) and torch.equal(ks.cpu(), ts.cpu())
    for a, b in [(ky, ty), (kh, th), (kdx, tdx), (kdh, tdh)] + list(zip(kdw, tdw)):
        assert rel(a.cpu(), b) < TOL


def test_gru_lengths_vs_float64_reference():
    """Per-sample lengths through the numpy front end vs float64 torch.nn.GRU on each sample."""
    torch.manual_seed(0)
    k = kt.GRU(3, 5, 2, bidirectional=True)
    r = torch.nn.GRU(3, 5, 2, bidirectional=True, dtype=torch.float64)
    r.load_state_dict(k.state_dict())
    plan = kfuse.RnnPlan(kfuse.Context(), "gru", 3, 5, num_layers=2, bidirectional=True)
    x = seq(6, 3, 3, False)
    lengths = np.array([6, 2, 4], dtype=np.int32)
    w = {n: p.detach().numpy() for n, p in k.named_parameters()}
    y, hn, _ = knp.rnn_forward(plan, x.numpy(), w, lengths=lengths)
    for b, n in enumerate(lengths):
        yr, hr = r(x[:n, b:b + 1].double())
        assert rel(y[:n, b:b + 1], yr) < TOL and rel(hn[:, b:b + 1], hr) < TOL
        assert np.all(y[n:, b] == 0)


# ---- A-GRU -----------------------------------------------------------------------------------

AGRU_CASES = [(1, False, False), (1, True, True), (2, False, True), (3, True, False)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("L,bf,with_h0", AGRU_CASES)
def test_agru_vs_float64_reference(L, bf, with_h0, device):
    torch.manual_seed(0)
    T, B, I, H = 8, 3, 5, 7
    kmod = kt.AGRU(I, H, L, batch_first=bf, gamma=0.05, epsilon=0.7, device=device)
    rmod = ref.AGRU(I, H, L, batch_first=bf, gamma=0.05, epsilon=0.7, dtype=torch.float64)
    rmod.load_state_dict(kmod.state_dict(), strict=True)
    h0 = torch.randn(L, B, H) * 0.5 if with_h0 else None
    compare(kmod, rmod, seq(T, B, I, bf), h0, device)


def test_agru_same_seed_same_init_and_round_trip():
    torch.manual_seed(7)
    k = kt.AGRU(4, 6, 2, gamma=0.02, epsilon=0.5)
    torch.manual_seed(7)
    r = ref.AGRU(4, 6, 2, gamma=0.02, epsilon=0.5)
    ks, rs = k.state_dict(), r.state_dict()
    assert list(ks) == list(rs)
    for n in rs:
        assert torch.equal(ks[n], rs[n]), n
        assert ks[n].dtype == rs[n].dtype
    assert set(n for n, _ in k.named_parameters()) == set(n for n, _ in r.named_parameters())
    assert "cells.1.epsilon" in ks and ks["cells.1.epsilon"].shape == (1,)
    # both ways, strict
    r2 = ref.AGRU(4, 6, 2, gamma=0.02)
    k.load_state_dict(r2.state_dict(), strict=True)
    x = torch.randn(5, 2, 4)
    torch.testing.assert_close(k(x)[0], r2(x)[0], rtol=1e-4, atol=1e-6)
    k3 = kt.AGRU(4, 6, 2, gamma=0.02)
    r.load_state_dict(k3.state_dict(), strict=True)
    torch.testing.assert_close(k3(x)[1], r(x)[1], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("bf", [False, True])
def test_agru_unbatched(bf):
    torch.manual_seed(0)
    k = kt.AGRU(4, 5, 2, batch_first=bf)
    r = ref.AGRU(4, 5, 2, batch_first=bf, dtype=torch.float64)
    r.load_state_dict(k.state_dict())
    x = torch.randn(6, 4)
    h0 = torch.randn(2, 5)
    for args in [(x,), (x, h0)]:
        (ky, kh) = k(*args)
        (ry, rh) = r(*[a.double() for a in args])
        assert ky.shape == (6, 5) and kh.shape == (2, 5) and ky.dtype == torch.float32
        assert rel(ky, ry) < TOL and rel(kh, rh) < TOL


def test_agru_epsilon_gradient_accumulates_like_torch():
    """Two backward passes accumulate into .grad exactly as the reference's do."""
    torch.manual_seed(0)
    k = kt.AGRU(3, 4)
    r = ref.AGRU(3, 4, dtype=torch.float64)
    r.load_state_dict(k.state_dict())
    x = torch.randn(5, 2, 3)
    for _ in range(2):
        k(x)[0].sum().backward()
        r(x.double())[0].sum().backward()
    for (n, p), (_, q) in zip(k.named_parameters(), r.named_parameters()):
        assert rel(p.grad, q.grad) < TOL, n


# ---- dropout ---------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cls", ["gru", "agru"])
def test_dropout(cls, device):
    make = (lambda p: kt.GRU(4, 6, 3, dropout=p, device=device)) if cls == "gru" else \
        (lambda p: kt.AGRU(4, 6, 3, dropout=p, device=device))
    torch.manual_seed(0)
    m = make(0.5)
    m0 = make(0.0)
    m0.load_state_dict(m.state_dict())
    x = torch.randn(7, 5, 4).to(device)

    def train_run(seed):
        torch.manual_seed(seed)
        xx = x.clone().requires_grad_(True)
        y, hn = m(xx)
        y.sum().backward()
        grads = [p.grad.clone() for p in m.parameters()]
        m.zero_grad()
        return y.detach(), hn.detach(), xx.grad, grads

    m.train()
    a, b, c = train_run(1), train_run(1), train_run(2)
    for u, v in zip(a[:3] + tuple(a[3]), b[:3] + tuple(b[3])):
        assert torch.equal(u, v)  # deterministic for a given seed
    assert not torch.equal(a[0], c[0])  # fresh masks for another seed
    m0.train()
    y0, hn0 = m0(x)
    assert not torch.allclose(a[0], y0)  # dropout applied in training
    torch.testing.assert_close(a[1][0], hn0[0])  # ... between layers only: layer 0 untouched
    m.eval()
    ye, hne = m(x)
    torch.testing.assert_close(ye, y0)  # eval: no dropout
    torch.testing.assert_close(hne, hn0)
    with torch.no_grad():
        m.train()
        torch.manual_seed(1)
        yn, _ = m(x)  # training mode without autograd still drops, with the same masks
    assert torch.equal(yn, a[0])


def test_gru_dropout_warning_like_torch():
    with pytest.warns(UserWarning, match="dropout"):
        kt.GRU(3, 4, 1, dropout=0.2)


# ---- numpy front end -------------------------------------------------------------------------

def test_numpy_forward_backward_vs_float64():
    torch.manual_seed(0)
    ctx = kfuse.Context("cpu")
    plan = kfuse.RnnPlan(ctx, "agru", 5, 6, num_layers=2, batch_first=True, gamma=0.03)
    r = ref.AGRU(5, 6, 2, batch_first=True, gamma=0.03, dtype=torch.float64)
    params = dict(r.named_parameters())
    assert sorted(plan.weight_names) == sorted(params)  # the reference's names ...
    assert all(tuple(params[n].shape) == s for n, s in plan.weight_info)  # ... and shapes
    weights = [params[n].detach().float().numpy() for n in plan.weight_names]
    x = seq(7, 3, 5, True).numpy()
    h0 = (torch.randn(2, 3, 6) * 0.3).numpy()
    y, hn, reserve = knp.rnn_forward(plan, x, weights, h0=h0, training=True)
    assert reserve.nbytes == plan.workspace_size(7, 3, training=True)[1]
    xr = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    hr = torch.tensor(h0, dtype=torch.float64, requires_grad=True)
    yr, hnr = r(xr, hr)
    assert rel(y, yr) < TOL and rel(hn, hnr) < TOL
    dy = np.random.default_rng(0).standard_normal(y.shape).astype(np.float32)
    dhn = np.random.default_rng(1).standard_normal(hn.shape).astype(np.float32)
    ((yr * torch.tensor(dy).double()).sum() + (hnr * torch.tensor(dhn).double()).sum()).backward()
    dx, dh0, dw = knp.rnn_backward(plan, x, weights, reserve, dy=dy, dhn=dhn, h0=h0)
    assert rel(dx, xr.grad) < TOL and rel(dh0, hr.grad) < TOL
    for n, g in zip(plan.weight_names, dw):
        assert rel(g, params[n].grad) < TOL, n
    # accumulate mode adds into the given buffers
    acc = [g.copy() for g in dw]
    knp.rnn_backward(plan, x, weights, reserve, dy=dy, dhn=dhn, h0=h0, need_dx=False,
                     need_dh0=False, dweights=acc, accumulate=True)
    for a, g in zip(acc, dw):
        np.testing.assert_allclose(a, 2 * g, rtol=1e-6, atol=1e-7)


def test_numpy_inputs_dlpack_mapping_and_inference():
    plan = kfuse.RnnPlan(kfuse.Context(), "gru", 3, 4)
    t = torch.nn.GRU(3, 4)
    w = {n: p.detach() for n, p in t.named_parameters()}  # torch tensors: DLPack producers
    x = torch.randn(5, 2, 3)
    y, hn, reserve = knp.rnn_forward(plan, x, w)
    assert reserve is None and y.dtype == np.float32 and y.shape == (5, 2, 4)
    ty, th = t(x)
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-4, atol=1e-6)
    # a memoryview (buffer protocol) works too
    y2, _, _ = knp.rnn_forward(plan, memoryview(x.numpy()), [w[n].numpy() for n in w])
    np.testing.assert_array_equal(y, y2)


def test_every_output_element_written():
    """Outputs poisoned with NaN before the call come back finite (low-level API)."""
    ctx = kfuse.Context()
    for cell, bidir in [("gru", True), ("agru", False)]:
        plan = kfuse.RnnPlan(ctx, cell, 3, 4, num_layers=2, bidirectional=bidir)
        rng = np.random.default_rng(0)
        w = [rng.uniform(-0.5, 0.5, s).astype(np.float32) for _, s in plan.weight_info]
        x = rng.standard_normal((5, 2, 3)).astype(np.float32)
        D = 2 if bidir else 1
        y = np.full((5, 2, 4 * D), np.nan, np.float32)
        hn = np.full((2 * D, 2, 4), np.nan, np.float32)
        rs = knp.aligned_empty(plan.workspace_size(5, 2, True)[1])
        plan.forward(knp.tensor_ref(x), [knp.tensor_ref(a) for a in w], knp.tensor_ref(y),
                     hn=knp.tensor_ref(hn), training=True,
                     reserve=(rs.__array_interface__["data"][0], rs.nbytes))
        assert np.isfinite(y).all() and np.isfinite(hn).all()
        dx = np.full(x.shape, np.nan, np.float32)
        dh0 = np.full(hn.shape, np.nan, np.float32)
        dw = [np.full(a.shape, np.nan, np.float32) for a in w]
        plan.backward(knp.tensor_ref(x), [knp.tensor_ref(a) for a in w],
                      (rs.__array_interface__["data"][0], rs.nbytes),
                      dy=knp.tensor_ref(np.ones_like(y)), dx=knp.tensor_ref(dx),
                      dh0=knp.tensor_ref(dh0), dweights=[knp.tensor_ref(a) for a in dw])
        assert np.isfinite(dx).all() and np.isfinite(dh0).all()
        assert all(np.isfinite(a).all() for a in dw)


# ---- float64 ---------------------------------------------------------------------------------
# The modules follow their parameters' dtype: float64 runs the library's float64 CPU path, held
# to 1e-12 against the float64 references, and passes torch.autograd.gradcheck.

TOL64 = 1e-12


@pytest.mark.parametrize("L,bidir,bf,with_h0", [(1, False, False, True), (2, True, True, True),
                                                (3, False, False, False)])
def test_gru_float64_vs_torch(L, bidir, bf, with_h0):
    torch.manual_seed(0)
    T, B, I, H = 6, 3, 5, 7
    kmod = kt.GRU(I, H, L, batch_first=bf, bidirectional=bidir, dtype=torch.float64)
    assert all(p.dtype == torch.float64 for p in kmod.parameters())
    rmod = torch.nn.GRU(I, H, L, batch_first=bf, bidirectional=bidir, dtype=torch.float64)
    rmod.load_state_dict(kmod.state_dict(), strict=True)
    D = 2 if bidir else 1
    h0 = torch.randn(L * D, B, H) * 0.5 if with_h0 else None
    compare(kmod, rmod, seq(T, B, I, bf), h0, dtype=torch.float64, tol=TOL64)


@pytest.mark.parametrize("L,bf,with_h0", [(1, False, True), (2, True, True), (3, False, False)])
def test_agru_float64_vs_reference(L, bf, with_h0):
    torch.manual_seed(0)
    T, B, I, H = 6, 3, 5, 7
    # gamma = 1/16: kf_rnn_desc carries gamma as a float, so the library's A uses float(gamma);
    # 0.05 would differ from the reference's double by 7e-10 relative (3e-10 in y)
    kmod = kt.AGRU(I, H, L, batch_first=bf, gamma=0.0625, epsilon=0.7).double()
    assert all(p.dtype == torch.float64 for p in kmod.parameters())
    rmod = ref.AGRU(I, H, L, batch_first=bf, gamma=0.0625, epsilon=0.7, dtype=torch.float64)
    rmod.load_state_dict(kmod.state_dict(), strict=True)
    h0 = torch.randn(L, B, H) * 0.5 if with_h0 else None
    compare(kmod, rmod, seq(T, B, I, bf), h0, dtype=torch.float64, tol=TOL64)


@pytest.mark.parametrize("cls", ["gru", "agru"])
def test_float64_follows_parameters_both_ways(cls):
    """.double() then .float() on one module: each call runs in its parameters' dtype."""
    torch.manual_seed(0)
    k = kt.GRU(3, 4, 2) if cls == "gru" else kt.AGRU(3, 4, 2)
    x = torch.randn(5, 2, 3)
    y32, _ = k(x)
    k.double()
    y64, hn64 = k(x.double())
    assert y64.dtype == hn64.dtype == torch.float64
    assert rel(y32, y64) < TOL
    k.float()
    assert torch.equal(k(x)[0], y32)


@pytest.mark.parametrize("cls", ["gru", "agru"])
def test_float64_gradcheck(cls):
    """torch.autograd.gradcheck on x, h0 and every weight: two layers, h0, dropout between the
    layers (a fixed seed makes it deterministic); the GRU bidirectional."""
    torch.manual_seed(0)
    T, B, I, H, L = 4, 2, 3, 4, 2
    bidir = cls == "gru"
    k = (kt.GRU(I, H, L, bidirectional=True) if bidir else kt.AGRU(I, H, L, gamma=0.05)).double()
    D = 2 if bidir else 1
    weights = [w.detach().clone().requires_grad_(True) for w in k._canonical_weights()]
    x = torch.randn(T, B, I, dtype=torch.float64, requires_grad=True)
    h0 = (torch.randn(L * D, B, H, dtype=torch.float64) * 0.5).requires_grad_(True)
    seed = torch.tensor([1234], dtype=torch.int64)

    def fn(x, h0, *w):
        return kt.rnn_function(x, h0, None, list(w), cls, I, H, L, False, bidir, dropout=0.3,
                               gamma=0.05, training=True, seed=seed)

    assert torch.autograd.gradcheck(fn, (x, h0, *weights), eps=1e-6, atol=1e-8, rtol=1e-6)


@pytest.mark.parametrize("cls", ["gru", "agru"])
def test_input_dtype_must_match_parameters(cls):
    """An input whose dtype is not the parameters' is refused by the library: a ValueError
    (kfuse.InvalidArgument) naming the call, the argument and both dtypes."""
    k = (kt.GRU if cls == "gru" else kt.AGRU)(3, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"kf_rnn_forward: args->x.dtype = KF_DTYPE_F32, "
                                         r"expected KF_DTYPE_F64") as e:
        k(torch.randn(5, 2, 3))
    assert isinstance(e.value, kfuse.InvalidArgument)
    with pytest.raises(kfuse.InvalidArgument, match=r"args->h0.dtype = KF_DTYPE_F32"):
        k(torch.randn(5, 2, 3, dtype=torch.float64), torch.randn(1, 2, 4))
    k.float()
    with pytest.raises(kfuse.InvalidArgument, match=r"args->x.dtype = KF_DTYPE_F64, "
                                                    r"expected KF_DTYPE_F32"):
        k(torch.randn(5, 2, 3, dtype=torch.float64))


# ---- errors ----------------------------------------------------------------------------------

def test_errors_carry_status_and_library_message():
    k = kt.GRU(4, 5)
    with pytest.raises(kfuse.InvalidArgument) as e:
        k(torch.randn(3, 2, 6))
    assert isinstance(e.value, ValueError) and isinstance(e.value, kfuse.KfuseError)
    assert e.value.status == kfuse.lib.KF_ERR_INVALID_ARGUMENT
    assert e.value.message.startswith("kf_rnn_forward: ") and "x.shape[2] = 6" in e.value.message
    assert "KF_ERR_INVALID_ARGUMENT" in e.value.status_string
    assert e.value.message in str(e.value)
    with pytest.raises(kfuse.InvalidArgument, match="dtype"):
        k(torch.randn(3, 2, 4, dtype=torch.float64))
    with pytest.raises(kfuse.InvalidArgument, match="h0"):
        k(torch.randn(3, 2, 4), torch.randn(1, 3, 5))


def test_descriptor_errors_at_construction():
    with pytest.raises(kfuse.InvalidArgument, match="dropout"):
        kt.GRU(3, 4, 2, dropout=1.5)
    with pytest.raises(kfuse.InvalidArgument, match="hidden_size"):
        kt.AGRU(3, 0)
    with pytest.raises(kfuse.Unsupported) as e:
        kfuse.RnnPlan(kfuse.Context(), "agru", 3, 4, bidirectional=True)
    assert isinstance(e.value, NotImplementedError) and "kf_rnn_plan_create" in e.value.message
    with pytest.raises(kfuse.Unsupported, match="dtype"):
        kt.GRU(3, 4, dtype=torch.int32)
    with pytest.raises(kfuse.InvalidArgument, match="cell"):
        kfuse.RnnPlan(kfuse.Context(), "lstm", 3, 4)


def test_lowlevel_errors():
    ctx = kfuse.Context()
    plan = kfuse.RnnPlan(ctx, "gru", 3, 4)
    x = np.zeros((5, 2, 3), np.float32)
    w = [np.zeros(s, np.float32) for _, s in plan.weight_info]
    with pytest.raises(kfuse.InvalidArgument, match="contiguous|strides"):
        knp.rnn_forward(plan, np.zeros((2, 5, 3), np.float32).transpose(1, 0, 2), w)
    with pytest.raises(kfuse.InvalidArgument, match="num_weights|weights"):
        knp.rnn_forward(plan, x, w[:-1])
    _, rs = plan.workspace_size(5, 2, training=True)
    small = knp.aligned_empty(rs)
    y = np.empty((5, 2, 4), np.float32)
    with pytest.raises(kfuse.WorkspaceTooSmall):
        plan.forward(knp.tensor_ref(x), [knp.tensor_ref(a) for a in w], knp.tensor_ref(y),
                     training=True, reserve=(small.__array_interface__["data"][0], rs - 64))
    with pytest.raises(kfuse.InvalidArgument, match="reserve"):
        knp.rnn_backward(plan, x, w, None, dy=np.zeros_like(y))
    fixed = kfuse.Context(fixed_arena=True)
    fplan = kfuse.RnnPlan(fixed, "gru", 3, 4)
    with pytest.raises(kfuse.WorkspaceTooSmall):
        knp.rnn_forward(fplan, x, w)
    if not cuda_ok():
        with pytest.raises(kfuse.BackendUnavailable) as e:
            kfuse.Context("cuda")
        assert "kf_context_create" in e.value.message
    with pytest.raises(kfuse.InvalidArgument):
        kfuse.Context("cpu", num_threads=-1)


def test_context_and_version():
    assert kfuse.version() == kfuse.lib.KF_VERSION_NUMBER
    assert kfuse.version_string() == "%d.%d.%d" % (kfuse.lib.KF_VERSION_MAJOR,
                                                   kfuse.lib.KF_VERSION_MINOR,
                                                   kfuse.lib.KF_VERSION_PATCH)
    ctx = kfuse.Context("cpu", num_threads=1)
    assert ctx.device_type == kfuse.lib.KF_DEVICE_CPU and ctx.stream == 0
    plan = kfuse.RnnPlan(ctx, "agru", 3, 4)
    w = [np.full(s, 0.1, np.float32) for _, s in plan.weight_info]
    x = np.ones((4, 2, 3), np.float32)
    knp.rnn_forward(plan, x, w)
    _, grows = ctx.arena_info()
    for _ in range(3):
        knp.rnn_forward(plan, x, w)
    assert ctx.arena_info()[1] == grows  # steady state: the arena does not grow
    ctx.reserve(1 << 20)
    assert ctx.arena_info()[0] >= 1 << 20
    ctx.synchronize()


# ---- threads and the GIL ---------------------------------------------------------------------

def test_threads_use_their_own_contexts():
    torch.manual_seed(0)
    m = kt.AGRU(8, 32, 2)
    x = torch.randn(20, 8, 8)
    want = m(x)[0].detach()
    results, errors = [None] * 4, []

    def work(i):
        try:
            for _ in range(3):
                results[i] = m(x)[0].detach()
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


def test_gil_released_during_calls():
    """While one thread is inside a long kfuse call, another Python thread keeps running (at about
    a third of its free speed on a 2-core box); were the GIL held, it would stall for the call."""
    plan = kfuse.RnnPlan(kfuse.Context(num_threads=1), "gru", 64, 256, num_layers=2)
    rng = np.random.default_rng(0)
    w = [rng.uniform(-0.05, 0.05, s).astype(np.float32) for _, s in plan.weight_info]
    x = rng.standard_normal((300, 32, 64)).astype(np.float32)

    def spin(stop):
        ticks = 0
        while not stop.is_set():
            ticks += 1
        return ticks

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    try:
        inside, done = threading.Event(), threading.Event()

        def call():
            inside.set()
            knp.rnn_forward(plan, x, w)
            done.set()

        t = threading.Thread(target=call)
        t0 = time.perf_counter()
        t.start()
        inside.wait()
        busy = spin(done)
        elapsed = time.perf_counter() - t0
        t.join()
        stop = threading.Event()
        threading.Timer(elapsed, stop.set).start()
        free = spin(stop)  # the same loop for the same time with nothing else running
    finally:
        sys.setswitchinterval(old)
    assert busy > 0.05 * free, (busy, free, elapsed)  # held: ~0.004, released: ~0.35


# ---- CUDA (runs only where torch and kfuse both have CUDA) -----------------------------------

@pytest.mark.skipif(not cuda_ok(), reason="needs torch CUDA and a CUDA build of kfuse")
@pytest.mark.parametrize("cls", ["gru", "agru"])
def test_cuda_matches_cpu_on_current_stream(cls):
    torch.manual_seed(0)
    m = kt.GRU(5, 16, 2, bidirectional=True) if cls == "gru" else kt.AGRU(5, 16, 2)
    mc = (kt.GRU(5, 16, 2, bidirectional=True) if cls == "gru" else kt.AGRU(5, 16, 2)).cuda()
    mc.load_state_dict(m.state_dict())
    x = torch.randn(9, 4, 5)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        xc = x.cuda().requires_grad_(True)
        yc, hc = mc(xc)
        (yc.sum() + hc.sum()).backward()
    torch.cuda.synchronize()
    xx = x.clone().requires_grad_(True)
    y, h = m(xx)
    (y.sum() + h.sum()).backward()
    assert rel(yc.cpu(), y) < TOL and rel(hc.cpu(), h) < TOL and rel(xc.grad.cpu(), xx.grad) < TOL
    for p, q in zip(mc.parameters(), m.parameters()):
        assert rel(p.grad.cpu(), q.grad) < 1e-4


@pytest.mark.skipif(not cuda_ok(), reason="needs torch CUDA and a CUDA build of kfuse")
def test_cuda_dropout_masks_match_cpu():
    """The dropout generator is keyed by (seed, offset) alike on every backend."""
    torch.manual_seed(0)
    m = kt.AGRU(5, 16, 3, dropout=0.4)
    mc = kt.AGRU(5, 16, 3, dropout=0.4).cuda()
    mc.load_state_dict(m.state_dict())
    x = torch.randn(9, 4, 5)
    torch.manual_seed(3)
    y, _ = m(x)
    torch.manual_seed(3)
    yc, _ = mc(x.cuda())
    assert rel(yc.detach().cpu(), y.detach()) < TOL


@pytest.mark.skipif(not cuda_ok(), reason="needs torch CUDA and a CUDA build of kfuse")
@pytest.mark.parametrize("cls", ["gru", "agru"])
def test_cuda_float64_matches_cpu_and_gradcheck(cls):
    """Float64 GRU / A-GRU on CUDA (the library's float64 CUDA path): forward and gradients within
    1e-12 of the CPU's float64 module (held to the references above), and gradcheck on x, h0 and
    every weight with dropout between the layers (the GRU bidirectional)."""
    torch.manual_seed(0)
    T, B, I, H, L = 4, 2, 3, 4, 2
    bidir = cls == "gru"
    k = (kt.GRU(I, H, L, bidirectional=True) if bidir else kt.AGRU(I, H, L, gamma=0.05)).double()
    kc = copy.deepcopy(k).cuda()
    x = torch.randn(T, B, I, dtype=torch.float64)
    xc = x.cuda().requires_grad_(True)
    x.requires_grad_(True)
    y, _ = k(x)
    yc, _ = kc(xc)
    assert yc.dtype == torch.float64 and yc.is_cuda and rel(yc.detach().cpu(), y.detach()) < TOL64
    y.sum().backward()
    yc.sum().backward()
    assert rel(xc.grad.cpu(), x.grad) < TOL64
    for (n, p), pc in zip(k.named_parameters(), kc.parameters()):
        assert rel(pc.grad.cpu(), p.grad) < TOL64, n
    D = 2 if bidir else 1
    weights = [w.detach().clone().requires_grad_(True) for w in kc._canonical_weights()]
    h0 = (torch.randn(L * D, B, H, dtype=torch.float64, device="cuda") * 0.5).requires_grad_(True)
    seed = torch.tensor([1234], dtype=torch.int64)

    def fn(x, h0, *w):
        return kt.rnn_function(x, h0, None, list(w), cls, I, H, L, False, bidir, dropout=0.3,
                               gamma=0.05, training=True, seed=seed)

    assert torch.autograd.gradcheck(fn, (xc.detach().requires_grad_(True), h0, *weights),
                                    eps=1e-6, atol=1e-8, rtol=1e-6)
