"""The Python front ends take their shapes and alignment from the library (ABI 1.3's queries):
the modules' parameter shapes, the outputs' shapes and the workspace alignment equal what
kf_*_param_info, kf_rnn_output_shapes, kf_kan_conv2d_output_size and KF_ALIGN_BYTES say, asked
here through the raw cffi calls on plans of the test's own; a bad descriptor or extent raises
InvalidArgument naming the argument."""
import warnings

import numpy as np
import pytest

import kfuse
from kfuse._lowlevel import ffi, lib

torch = pytest.importorskip("torch")
import kfuse.torch as kt  # noqa: E402


def _ctx():
    return kfuse.Context("cpu")


def _raw_params(count_fn, info_fn, ptr):
    """{name: shape} straight from a kf_*_count / kf_*_info pair."""
    count = ffi.new("int32_t *")
    assert count_fn(ptr, count) == lib.KF_OK
    name, ndim, shape = ffi.new("const char **"), ffi.new("int32_t *"), ffi.new("int64_t[6]")
    out = {}
    for i in range(count[0]):
        assert info_fn(ptr, i, name, ndim, shape) == lib.KF_OK
        out[ffi.string(name[0]).decode()] = tuple(shape[k] for k in range(ndim[0]))
    return out


def _state_shapes(m):
    return {n: tuple(t.shape) for n, t in m.state_dict().items()}


RNN_CASES = [  # (module class, kwargs, x shape)
    (kt.GRU, dict(input_size=3, hidden_size=5), (4, 2, 3)),
    (kt.GRU, dict(input_size=3, hidden_size=5, num_layers=2, bidirectional=True,
                  batch_first=True), (2, 6, 3)),
    (kt.GRU, dict(input_size=4, hidden_size=2, num_layers=3, bias=False), (7, 1, 4)),
    (kt.AGRU, dict(input_size=3, hidden_size=6, num_layers=2, batch_first=True), (3, 5, 3)),
]


@pytest.mark.parametrize("cls,kw,xs", RNN_CASES)
def test_rnn_shapes_are_the_library_s(cls, kw, xs):
    m = cls(**kw)
    bidir = kw.get("bidirectional", False)
    p = kfuse.RnnPlan(_ctx(), "gru" if cls is kt.GRU else "agru", kw["input_size"],
                      kw["hidden_size"], num_layers=kw.get("num_layers", 1),
                      batch_first=kw.get("batch_first", False), bidirectional=bidir)
    weights = _raw_params(lib.kf_rnn_weight_count, lib.kf_rnn_weight_info, p._ptr)
    if cls is kt.GRU:
        params = _state_shapes(m)
        assert params == {n: s for n, s in weights.items() if n in params}
        assert len(params) == (len(weights) if kw.get("bias", True) else len(weights) // 2)
    x = torch.randn(*xs)
    T, B = (xs[1], xs[0]) if kw.get("batch_first") else (xs[0], xs[1])
    y_shape, hn_shape = ffi.new("int64_t[3]"), ffi.new("int64_t[3]")
    assert lib.kf_rnn_output_shapes(p._ptr, T, B, y_shape, hn_shape) == lib.KF_OK
    y, hn = m(x)
    assert tuple(y.shape) == tuple(y_shape) and tuple(hn.shape) == tuple(hn_shape)
    # the numpy front end allocates the same shapes
    W = [t.detach().numpy() for t in m._canonical_weights()]
    y2, hn2, _ = kfuse.numpy.rnn_forward(p, x.numpy(), W)
    assert y2.shape == tuple(y_shape) and hn2.shape == tuple(hn_shape)
    np.testing.assert_allclose(y2, y.detach().numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("args,bias", [((16, 12, 2, 3), True), ((9, 30, 1, 4), False)])
def test_sklinear_shapes_are_the_library_s(args, bias):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = kt.SKLinear(*args, bias=bias)
    p = kfuse.SkLinearPlan(_ctx(), *args, bias=bias)
    want = _raw_params(lib.kf_sklinear_param_count, lib.kf_sklinear_param_info, p._ptr)
    assert _state_shapes(m) == want
    assert dict(p.param_info) == want


@pytest.mark.parametrize("kw", [dict(grid_size=5, spline_order=3),
                                dict(grid_size=2, spline_order=0,
                                     enable_standalone_scale_spline=False),
                                dict(grid_size=7, spline_order=5)])
def test_kan_linear_shapes_are_the_library_s(kw):
    m = kt.KANLinear(6, 4, **kw)
    p = kfuse.KanLinearPlan(_ctx(), 6, 4, grid_size=kw["grid_size"],
                            spline_order=kw["spline_order"],
                            standalone_scale=kw.get("enable_standalone_scale_spline", True))
    want = _raw_params(lib.kf_kan_linear_param_count, lib.kf_kan_linear_param_info, p._ptr)
    assert _state_shapes(m) == want
    assert dict(p.param_info) == want
    assert (p.in_features, p.num_knots) == want["grid"]
    assert p.num_coeffs == want["spline_weight"][2]


CONV_CASES = [  # (in, out, kernel, stride, padding, dilation, image H x W)
    (2, 3, 3, 1, 0, 1, (7, 6)),
    (2, 3, (3, 2), (2, 1), (1, 0), (1, 2), (9, 7)),
    (1, 2, 5, 3, 2, 2, (11, 13)),
]


@pytest.mark.parametrize("c_in,c_out,k,s,pad,d,hw", CONV_CASES)
def test_kan_conv2d_shapes_are_the_library_s(c_in, c_out, k, s, pad, d, hw):
    m = kt.KANConv2d(c_in, c_out, k, stride=s, padding=pad, dilation=d, grid_size=4)
    p = kfuse.KanConv2dPlan(_ctx(), c_in, c_out, k, stride=s, padding=pad, dilation=d,
                            grid_size=4)
    want = _raw_params(lib.kf_kan_conv2d_param_count, lib.kf_kan_conv2d_param_info, p._ptr)
    assert _state_shapes(m) == want
    ho, wo = ffi.new("int64_t *"), ffi.new("int64_t *")
    assert lib.kf_kan_conv2d_output_size(p._ptr, hw[0], hw[1], ho, wo) == lib.KF_OK
    assert p.output_hw(*hw) == (ho[0], wo[0])
    y = m(torch.randn(2, c_in, *hw))
    assert tuple(y.shape) == (2, c_out, ho[0], wo[0])
    assert tuple(m(torch.randn(c_in, *hw)).shape) == (c_out, ho[0], wo[0])
    # and torch.nn.Conv2d, the reference of the geometry, agrees
    conv = torch.nn.Conv2d(c_in, c_out, k, stride=s, padding=pad, dilation=d)
    assert tuple(conv(torch.randn(2, c_in, *hw)).shape) == tuple(y.shape)


def test_alignment_is_the_library_s():
    from kfuse._lowlevel import ALIGN_BYTES
    assert ALIGN_BYTES == lib.KF_ALIGN_BYTES
    for n in (1, 100, 4097):
        a = kfuse.numpy.aligned_empty(n)
        assert a.nbytes == n and a.__array_interface__["data"][0] % lib.KF_ALIGN_BYTES == 0


@pytest.mark.parametrize("make,field", [
    (lambda: kt.GRU(3, 0), "hidden_size"),
    (lambda: kt.AGRU(0, 4), "input_size"),
    (lambda: kt.SKLinear(16, 12, 0, 3), "num_terms"),
    (lambda: kt.KANLinear(4, 3, grid_size=0), "grid_size"),
    (lambda: kt.KANConv2d(2, 3, 3, stride=(1, 0)), "stride_w"),
])
def test_bad_descriptor_names_the_field(make, field):
    with pytest.raises(kfuse.InvalidArgument, match=r"desc->%s = " % field):
        make()


def test_bad_extent_names_the_argument():
    ctx = _ctx()
    with pytest.raises(kfuse.InvalidArgument, match="kf_kan_conv2d_output_size: height = 1"):
        kfuse.KanConv2dPlan(ctx, 2, 3, 3).output_hw(1, 9)
    assert kfuse.KanConv2dPlan(ctx, 2, 3, 3).output_shape((2, 2, 1, 9)) is None
    with pytest.raises(kfuse.InvalidArgument, match="kf_rnn_output_shapes: T = 0"):
        kfuse.RnnPlan(ctx, "gru", 3, 4).output_shapes(0, 2)
    with pytest.raises(kfuse.InvalidArgument, match="kf_kan_conv2d_forward"):
        kt.KANConv2d(2, 3, 3)(torch.randn(1, 2, 2, 2))
