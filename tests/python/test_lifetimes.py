"""Tensor lifetimes and autograd-graph lifetimes, for every kfuse.torch module (GRU, AGRU,
SKLinear, KANLinear, KANConv2d) and the low-level plans (issue 14).

- Every tensor handed to the library stays alive until the call returns, whatever its strides:
  backward with an expanded (y.sum()), stride-0, transposed, sliced or offset dy, repeated with a
  dirtied allocator in between (freed blocks filled with 1e30), gives bit-identical gradients
  every time, equal to those of the same dy made contiguous, and matching a float64 reference.
  A dy that the front end copies (dy.contiguous()) used to be freed before the library read it.
- Forward with non-contiguous x, h0 and weights (transposed views, slices, a parametrization
  that returns a fresh non-contiguous tensor) likewise.
- A second backward through a retained graph works (the GRU/AGRU reserve is a saved tensor) and
  two losses give what their sum gives; a backward after the graph was freed raises torch's error.
"""
import gc
import os
import sys
import warnings

import numpy as np
import pytest

import kfuse
import kfuse.numpy as knp

torch = pytest.importorskip("torch")
import kfuse.torch as kt  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.utils import parametrize  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import agru_reference  # noqa: E402
from kan_reference import ref_forward as kan_ref_forward  # noqa: E402

TOL = 1e-4  # float32 kfuse against float64, relative to the norm
REPEATS = 3


def rel(out, want):
    out, want = out.detach().double(), want.detach().double()
    assert out.shape == want.shape, (out.shape, want.shape)
    assert torch.isfinite(out).all()
    n = want.norm().item()
    return (out - want).norm().item() / (n if n > 0 else 1.0)


def dirty():
    """Allocates and frees a few big blocks filled with 1e30 (torch's CPU allocator and numpy's),
    so that a read of freed memory sees garbage."""
    junk = [torch.full((4096 * (i + 1),), 1e30) for i in range(8)]
    junk += [np.full(4096 * (i + 1), 1e30, np.float32) for i in range(4)]
    del junk
    gc.collect()


def resolve(module, name):
    """(owner submodule, attribute name) of a dotted tensor name."""
    path, _, leaf = name.rpartition(".")
    return (module.get_submodule(path) if path else module), leaf


def leaf_param(module, name):
    """The leaf Parameter behind `name` (its parametrization's original when parametrized)."""
    owner, leaf = resolve(module, name)
    if parametrize.is_parametrized(owner, leaf):
        return owner.parametrizations[leaf].original
    return getattr(owner, leaf)


class Transposed(nn.Module):
    """A parametrization giving the same values as a fresh, non-contiguous tensor every call."""

    def forward(self, X):
        return X.transpose(-2, -1).contiguous().transpose(-2, -1)


# ---- the five modules: construction, inputs, float64 references --------------------------------

def _rnn_ref(ref_cls, kwargs):
    def ref(module, inputs, names):
        r = ref_cls(**kwargs, dtype=torch.float64)
        with torch.no_grad():
            for n in names:
                leaf_param(r, n).copy_(getattr(*resolve(module, n)))
        x, h0 = (t.detach().double().requires_grad_() for t in inputs)
        y, hn = r(x, h0)
        return (y, hn), [x, h0] + [leaf_param(r, n) for n in names]
    return ref


def _gru():
    kw = dict(input_size=3, hidden_size=5, num_layers=2, bidirectional=True)
    torch.manual_seed(1)
    m = kt.GRU(**kw)
    T, B = 4, 3
    inputs = [torch.randn(T, B, 3), 0.5 * torch.randn(4, B, 5)]
    return m, inputs, [n for n, _ in m.named_parameters()], _rnn_ref(nn.GRU, kw), \
        "weight_hh_l0"


def _agru():
    kw = dict(input_size=3, hidden_size=5, num_layers=2)
    torch.manual_seed(2)
    m = kt.AGRU(**kw)
    T, B = 4, 3
    inputs = [torch.randn(T, B, 3), 0.5 * torch.randn(2, B, 5)]
    return m, inputs, [n for n, _ in m.named_parameters()], \
        _rnn_ref(agru_reference.AGRU, kw), "cells.0.W_z.weight"


def _sk_ref(module, inputs, names):
    p = {n: getattr(module, n).detach().double() for n in ("S1s", "S2s", "U1s", "U2s", "bias")}
    for n in names:
        p[n].requires_grad_()
    x = inputs[0].detach().double().requires_grad_()
    L = p["S1s"].shape[0]
    y = sum(x @ p["S1s"][i] @ p["U1s"][i] + x @ p["U2s"][i] @ p["S2s"][i] for i in range(L))
    y = y / (2 * L) + p["bias"]
    return (y,), [x] + [p[n] for n in names]


def _sklinear():
    torch.manual_seed(3)
    m = kt.SKLinear(16, 12, num_terms=1, low_rank=2)
    return m, [torch.randn(2, 5, 16)], ["S1s", "S2s", "bias"], _sk_ref, "S1s"


KAN_NAMES = ["base_weight", "spline_weight", "spline_scaler"]


def _kan_params(module, names):
    p = {n: getattr(module, n).detach().double() for n in KAN_NAMES + ["grid"]}
    for n in names:
        p[n].requires_grad_()
    return p


def _kan_ref(module, inputs, names):
    p = _kan_params(module, names)
    x = inputs[0].detach().double().requires_grad_()
    y = kan_ref_forward(x, p["grid"], p["base_weight"], p["spline_weight"], p["spline_scaler"],
                        module.spline_order)
    return (y,), [x] + [p[n] for n in names]


def _kan_linear():
    torch.manual_seed(4)
    m = kt.KANLinear(6, 4)
    return m, [torch.rand(9, 6) * 2 - 1], KAN_NAMES, _kan_ref, "spline_weight"


def _conv_ref(module, inputs, names):
    p = _kan_params(module, names)
    x = inputs[0].detach().double().requires_grad_()
    patches = F.unfold(x, module.kernel_size, dilation=module.dilation, padding=module.padding,
                       stride=module.stride)  # [B, F, L]
    B, L = x.shape[0], patches.shape[-1]
    rows = patches.transpose(1, 2).reshape(-1, module.in_features)
    y = kan_ref_forward(rows, p["grid"], p["base_weight"], p["spline_weight"],
                        p["spline_scaler"], module.spline_order)
    Ho, Wo = (x.shape[2] + 2 * module.padding[0] - module.kernel_size[0]) \
        // module.stride[0] + 1, \
        (x.shape[3] + 2 * module.padding[1] - module.kernel_size[1]) // module.stride[1] + 1
    assert Ho * Wo == L
    y = y.view(B, L, -1).transpose(1, 2).reshape(B, -1, Ho, Wo)
    return (y,), [x] + [p[n] for n in names]


def _kan_conv():
    torch.manual_seed(5)
    m = kt.KANConv2d(2, 3, 3, padding=1, stride=(1, 2))
    return m, [torch.rand(2, 2, 5, 6) * 2 - 1], KAN_NAMES, _conv_ref, "base_weight"


CASES = {"GRU": _gru, "AGRU": _agru, "SKLinear": _sklinear, "KANLinear": _kan_linear,
         "KANConv2d": _kan_conv}


def setup(case):
    m, inputs, names, ref, pname = CASES[case]()
    inputs = [t.requires_grad_() for t in inputs]
    return m, inputs, names, ref, pname


def outputs(module, inputs):
    out = module(*inputs)
    return tuple(out) if isinstance(out, tuple) else (out,)


def grads(module, inputs, names, dys, **kw):
    """Gradients of (inputs, parameters) with grad_outputs=dys (through torch.autograd.grad)."""
    outs = outputs(module, inputs)
    wrt = list(inputs) + [leaf_param(module, n) for n in names]
    return [g.clone() for g in torch.autograd.grad(outs, wrt, grad_outputs=dys, **kw)]


def ref_grads(module, inputs, names, ref, dys):
    outs, wrt = ref(module, inputs, names)
    return torch.autograd.grad(outs, wrt, grad_outputs=[d.double() for d in dys])


def assert_vs_reference(got, want, what):
    for i, (g, w) in enumerate(zip(got, want)):
        r = rel(g, w)
        assert r < TOL, "%s: gradient %d is %.3g off the float64 reference" % (what, i, r)


def assert_same(got, want, what):
    for i, (g, w) in enumerate(zip(got, want)):
        assert torch.equal(g, w), "%s: gradient %d differs (max |diff| %.3g, max |g| %.3g)" % (
            what, i, (g - w).abs().max().item(), g.abs().max().item())


# ---- strided gradients ---------------------------------------------------------------------------

def strided_dys(shape, seed):
    """{kind: dy} of `shape`, each with other strides than row-major (or a storage offset)."""
    g = torch.Generator().manual_seed(seed)
    n = len(shape)
    perm = list(range(n))[::-1]
    inv = [perm.index(i) for i in range(n)]
    return {
        "expanded": torch.ones(()).expand(shape),  # what y.sum().backward() hands in
        "stride0_row": torch.randn(shape[-1], generator=g).expand(shape),
        "transposed": torch.randn([shape[p] for p in perm], generator=g).permute(inv),
        "sliced": torch.randn(tuple(shape[:-1]) + (2 * shape[-1],), generator=g)[..., ::2],
        "offset": torch.randn((shape[0] + 1,) + tuple(shape[1:]), generator=g)[1:],
    }


@pytest.mark.parametrize("case", list(CASES))
def test_strided_dy_gives_bit_identical_gradients(case):
    m, inputs, names, ref, _ = setup(case)
    shapes = [o.shape for o in outputs(m, inputs)]
    per_output = [strided_dys(s, seed=10 + i) for i, s in enumerate(shapes)]
    for kind in per_output[0]:
        dys = [d[kind] for d in per_output]
        assert all(not d.is_contiguous() or d.storage_offset() for d in dys), kind
        want = grads(m, inputs, names, [d.contiguous() for d in dys])
        assert_vs_reference(want, ref_grads(m, inputs, names, ref, dys), "%s %s" % (case, kind))
        for rep in range(REPEATS):
            dirty()
            got = grads(m, inputs, names, dys)
            assert_same(got, want, "%s dy %s, repeat %d" % (case, kind, rep))


@pytest.mark.parametrize("case", list(CASES))
def test_sum_backward_repeated_with_dirty_allocator(case):
    m, inputs, names, ref, _ = setup(case)
    wrt = list(inputs) + [leaf_param(m, n) for n in names]
    ones = [torch.ones(o.shape) for o in outputs(m, inputs)]
    want = grads(m, inputs, names, ones)
    assert_vs_reference(want, ref_grads(m, inputs, names, ref, ones), case)
    for rep in range(REPEATS):
        for t in wrt:
            t.grad = None
        dirty()
        sum(o.sum() for o in outputs(m, inputs)).backward()
        assert_same([t.grad for t in wrt], want, "%s y.sum().backward(), repeat %d" % (case, rep))


# ---- non-contiguous forward inputs and weights -----------------------------------------------

def noncontiguous(t, kind):
    """A view of `t`'s values that is not row-major: 'transposed' (the first two dims stored
    swapped) or 'sliced' (every other element of a wider last dim)."""
    t = t.detach()
    if kind == "transposed":
        v = t.transpose(0, 1).contiguous().transpose(0, 1)
    else:
        wide = torch.zeros(tuple(t.shape[:-1]) + (2 * t.shape[-1],))
        wide[..., ::2] = t
        v = wide[..., ::2]
    assert torch.equal(v, t) and not v.is_contiguous()
    return v.requires_grad_()


@pytest.mark.parametrize("kind", ["transposed", "sliced"])
@pytest.mark.parametrize("case", list(CASES))
def test_noncontiguous_inputs_and_parametrized_weight(case, kind):
    m, inputs, names, ref, pname = setup(case)
    shapes = [o.shape for o in outputs(m, inputs)]
    dys = [strided_dys(s, seed=20 + i)["transposed"].contiguous() for i, s in enumerate(shapes)]
    want_y = [o.detach() for o in outputs(m, inputs)]
    want = grads(m, inputs, names, dys)
    ref_outs, _ = ref(m, inputs, names)
    for o, r in zip(want_y, ref_outs):
        assert rel(o, r) < TOL
    assert_vs_reference(want, ref_grads(m, inputs, names, ref, dys), case)
    # the same values, strided: inputs as views, one weight through a parametrization
    owner, leaf = resolve(m, pname)
    parametrize.register_parametrization(owner, leaf, Transposed())
    assert not getattr(owner, leaf).is_contiguous()
    views = [noncontiguous(t, kind) for t in inputs]
    for rep in range(REPEATS):
        dirty()
        outs = outputs(m, views)
        assert_same([o.detach() for o in outs], want_y, "%s %s forward, repeat %d"
                    % (case, kind, rep))
        dirty()
        got = grads(m, views, names, dys)
        assert_same(got, want, "%s %s inputs, repeat %d" % (case, kind, rep))


# ---- retained graphs -----------------------------------------------------------------------------

def two_losses(outs):
    """Two losses over the outputs, each with a non-trivial incoming gradient."""
    l1 = sum((o * torch.linspace(-1, 1, o.numel()).view(o.shape)).sum() for o in outs)
    l2 = sum((o ** 2).sum() for o in outs)
    return l1, l2


@pytest.mark.parametrize("case", list(CASES))
def test_retain_graph_two_losses_equal_their_sum(case):
    m, inputs, names, ref, _ = setup(case)
    wrt = list(inputs) + [leaf_param(m, n) for n in names]
    l1, l2 = two_losses(outputs(m, inputs))
    l1.backward(retain_graph=True)
    dirty()
    l2.backward()
    got = [t.grad.clone() for t in wrt]
    for t in wrt:
        t.grad = None
    l1, l2 = two_losses(outputs(m, inputs))
    (l1 + l2).backward()
    want = [t.grad.clone() for t in wrt]
    for i, (g, w) in enumerate(zip(got, want)):
        assert rel(g, w) < 1e-5, (case, i)
    # and as the float64 reference does it
    routs, rwrt = ref(m, inputs, names)
    r1, r2 = two_losses(routs)
    r1.backward(retain_graph=True)
    r2.backward()
    assert_vs_reference(got, [t.grad for t in rwrt], case)


def test_gru_retained_graph_matches_torch_gru():
    torch.manual_seed(6)
    m = kt.GRU(3, 4, num_layers=2)
    r = nn.GRU(3, 4, num_layers=2)
    r.load_state_dict(m.state_dict())
    x = torch.randn(5, 2, 3)
    res = []
    for mod in (m, r):
        xx = x.clone().requires_grad_()
        y, hn = mod(xx)
        y.sum().backward(retain_graph=True)
        hn.pow(2).sum().backward(retain_graph=True)
        y.mean().backward()  # a third one through the same graph
        res.append([xx.grad] + [p.grad for p in mod.parameters()])
    for a, b in zip(*res):
        assert rel(a, b) < 1e-5


@pytest.mark.parametrize("case", list(CASES))
def test_backward_after_graph_freed_raises(case):
    m, inputs, names, ref, _ = setup(case)
    loss = sum(o.sum() for o in outputs(m, inputs))
    loss.backward()
    with pytest.raises(RuntimeError, match="second time"):
        loss.backward()


def test_rnn_function_without_reserve_says_so():
    m = kt.GRU(3, 4)
    x = torch.randn(2, 2, 3, requires_grad=True)
    y, hn = kt.rnn_function(x, None, None, m._canonical_weights(), "gru", 3, 4, training=False)
    with pytest.raises(RuntimeError, match="training=False"):
        y.sum().backward()


# ---- the low-level plans and the numpy front end -----------------------------------------------

def test_tensor_ref_holds_its_tensor():
    for make in (lambda: np.arange(12, dtype=np.float32).reshape(3, 4).T.copy(),
                 lambda: torch.arange(12, dtype=torch.float32).reshape(3, 4).t()):
        r = kfuse.TensorRef.of(make())
        gc.collect()
        dirty()
        assert r.owner is not None
        assert r.shape == (4, 3)
        assert np.array_equal(np.asarray(r.owner), np.arange(12, dtype=np.float32)
                              .reshape(3, 4).T)
        assert knp.tensor_ref(r.owner).owner is r.owner


def test_plans_hold_temporaries_during_the_call():
    """Temporaries written in a plan call's argument list (numpy copies, torch .contiguous())
    stay alive until the C call returns."""
    torch.manual_seed(7)
    m = kt.KANLinear(6, 4)
    plan = kfuse.KanLinearPlan(kfuse.Context("cpu"), 6, 4)
    x = (torch.rand(40, 6) * 2 - 1)
    params = {n: getattr(m, n).detach() for n in KAN_NAMES + ["grid"]}
    want = m(x).detach()
    for rep in range(REPEATS):
        y = torch.empty(40, 4)
        dirty()
        plan.forward(x.t().contiguous().t().contiguous(), params["grid"].clone(),
                     params["base_weight"].numpy().copy(), params["spline_weight"].clone(),
                     y, spline_scaler=kfuse.TensorRef.of(params["spline_scaler"].clone()))
        assert torch.equal(y, want), rep
        dirty()
        yn = knp.kan_forward(plan, np.ascontiguousarray(x.numpy()[::-1][::-1]),
                             {n: t.numpy().copy() for n, t in params.items()})
        assert np.array_equal(yn, want.numpy()), rep


def test_bad_tensor_argument_names_it_and_writes_nothing():
    plan = kfuse.KanLinearPlan(kfuse.Context("cpu"), 6, 4)
    y = torch.full((3, 4), 7.0)
    m = kt.KANLinear(6, 4)
    p = {n: getattr(m, n).detach() for n in KAN_NAMES + ["grid"]}
    with pytest.raises(TypeError, match="base_weight"):
        plan.forward(torch.zeros(3, 6), p["grid"], "not a tensor", p["spline_weight"], y,
                     spline_scaler=p["spline_scaler"])
    assert torch.equal(y, torch.full((3, 4), 7.0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rplan = kfuse.RnnPlan(kfuse.Context("cpu"), "gru", 3, 4)
    with pytest.raises(TypeError, match=r"weights\[1\]"):
        rplan.forward(np.zeros((2, 1, 3), np.float32), [np.zeros((12, 3), np.float32), 5],
                      np.zeros((2, 1, 4), np.float32))


def test_reused_argument_structs_carry_nothing_over():
    """A plan refills its argument structs every call: calls alternating present and absent
    tensors (h0, lengths, dx, weight gradients) on one plan give what fresh plans give."""
    torch.manual_seed(5)
    m = kt.GRU(3, 4, num_layers=2)
    W = [w.detach() for w in m._canonical_weights()]
    x, h0 = torch.randn(5, 2, 3), torch.randn(2, 2, 4)
    lengths = torch.tensor([5, 2], dtype=torch.int32)
    dy = torch.randn(5, 2, 4)

    def run(plan, with_h0, with_len):
        y, hn = torch.empty(5, 2, 4), torch.empty(2, 2, 4)
        rs = torch.empty(plan.workspace_size(5, 2, True)[1], dtype=torch.uint8)
        h, ln = (h0 if with_h0 else None), (lengths if with_len else None)
        plan.forward(x, W, y, h0=h, hn=hn, lengths=ln, training=True, reserve=rs)
        dx = torch.empty_like(x) if with_h0 else None
        dW = [torch.empty_like(w) for w in W] if with_len else None
        plan.backward(x, W, rs, h0=h, lengths=ln, dy=dy, dx=dx, dweights=dW)
        return [y, hn] + ([dx] if dx is not None else []) + (dW or [])

    shared = kfuse.RnnPlan(kfuse.Context("cpu"), "gru", 3, 4, num_layers=2)
    for case in [(True, True), (False, False), (True, False), (False, True), (True, True)]:
        fresh = kfuse.RnnPlan(kfuse.Context("cpu"), "gru", 3, 4, num_layers=2)
        for a, b in zip(run(shared, *case), run(fresh, *case)):
            assert torch.equal(a, b), case
