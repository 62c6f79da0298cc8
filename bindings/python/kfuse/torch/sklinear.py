"""kfuse.torch.SKLinear, the drop-in for panther.nn.SKLinear, and its operators
kfuse::sklinear / kfuse::sklinear_backward, and with the fused activation and dropout (kfuse.h's
epilogue, since 1.8) kfuse::sklinear_epi / kfuse::sklinear_epi_backward."""
import functools
import warnings

import torch
from torch import nn

from kfuse._lowlevel import dtype_code, kf_dtype_of, lib
from kfuse.sklinear import ACTIVATIONS
from kfuse.torch._common import (
    Op, autocast_inputs, check_devices, check_rank, device_guard, dropout_seed, empty_grad,
    grad_may_flow, module_attrs, on_device, plan, workspace,
)

__all__ = ["SKLinear", "sklinear_function"]

_MAX_DIMS = lib.KF_MAX_DIMS  # a plain int (torch.compile cannot guard on the cffi lib object)
_ACT_NONE, _ACT_RELU = int(lib.KF_ACTIVATION_NONE), int(lib.KF_ACTIVATION_RELU)  # likewise


# ---- kernels -----------------------------------------------------------------------------------

def _key(S1s, S2s, has_bias, act=0, dropout=0.0):
    """The plan key from the parameters' shapes (S1s [L, in, k], S2s [L, k, out]) and the
    epilogue (a kf_activation, the dropout probability)."""
    s1, s2 = S1s.shape, S2s.shape
    if len(s1) != 3 or len(s2) != 3:
        check_rank("S1s", S1s, 3, "[num_terms, in_features, low_rank]")
        check_rank("S2s", S2s, 3, "[num_terms, low_rank, out_features]")
    return ("sklinear", s1[1], s2[2], s1[0], s1[2], has_bias, kf_dtype_of("S1s", S1s), act,
            dropout)


_NAMES = ("S1s", "S2s", "U1s", "U2s", "bias")


def _check_param_shapes(p, params):
    """Raises ValueError naming the first of S1s, S2s, U1s, U2s, bias (`params`, bias None where
    there is none) whose shape is not plan p's: the library's rule (kf_sklinear_param_info) for
    the (in, out, L, k) that _key read off S1s and S2s. For the calls no library call checks:
    an empty batch (the library takes N >= 1 rows; every other call's tensors it checks itself)."""
    shapes = dict(p.param_info)
    for name, t in zip(_NAMES, params):
        if t is not None and tuple(t.shape) != tuple(shapes[name]):
            raise ValueError("kfuse: %s has shape %s, expected %s (kf_sklinear_param_info)"
                             % (name, tuple(t.shape), tuple(shapes[name])))


def _rows(x):
    return x.numel() // x.shape[-1] if x.dim() and x.shape[-1] else 0


def _forward_impl(x, S1s, S2s, U1s, U2s, bias):
    """y [..., out] from x [..., in] through kf_sklinear_forward."""
    return _forward_any(x, S1s, S2s, U1s, U2s, bias, 0, 0.0, False, False, None)[0]


def _epi_forward_impl(x, S1s, S2s, U1s, U2s, bias, act, dropout, training, save, seed):
    """(y, pre): y = dropout(act(s Z W2 + bias)) [..., out], the dropout in training calls;
    pre, the pre-activation, where `save` asks for what a backward needs and the activation's
    derivative needs it (GELU, GELU_TANH, SiLU), else an empty tensor (ReLU's backward reads y).
    The dropout mask is keyed by seed (an int64 tensor [1]; None: 0) at offset 0."""
    return _forward_any(x, S1s, S2s, U1s, U2s, bias, act, dropout, training, save, seed)


def _forward_any(x, S1s, S2s, U1s, U2s, bias, act, dropout, training, save, seed):
    key = _key(S1s, S2s, bias is not None, act, dropout)
    check_devices("SKLinear", x, _NAMES, (S1s, S2s, U1s, U2s, bias))
    return on_device(x, _forward, key, x.contiguous(), S1s.contiguous(), S2s.contiguous(),
                     U1s.contiguous(), U2s.contiguous(),
                     None if bias is None else bias.contiguous(), training, save,
                     0 if seed is None else int(seed.item()))


def _keeps_pre(act):
    """Whether the backward reads the pre-activation (else y, or nothing)."""
    return act not in (_ACT_NONE, _ACT_RELU)


def _forward(key, x, S1s, S2s, U1s, U2s, bias, training, save, seed):
    device = x.device
    p = plan(key, device)
    if x.dim() == 0:  # the library reports it
        p.forward(x, S1s, S2s, U1s, U2s, None, bias=bias)
    y = x.new_empty(x.shape[:-1] + (p.out_features,))
    pre = x.new_empty(y.shape if save and _keeps_pre(p.activation) else (0,))
    # an empty batch of the right width: y is empty (the library takes N >= 1)
    if x.numel() or x.dim() < 2 or x.shape[-1] != p.in_features:
        p.forward(x, S1s, S2s, U1s, U2s, y, bias=bias,
                  workspace=workspace(p, device, _rows(x)) if x.is_cuda else None,
                  pre=pre if pre.numel() else None, training=training, dropout_seed=seed)
    else:
        _check_param_shapes(p, (S1s, S2s, U1s, U2s, bias))
    return y, pre


def _forward_fake(x, S1s, S2s, U1s, U2s, bias):
    check_rank("S2s", S2s, 3, "[num_terms, low_rank, out_features]")
    if x.dim() == 0:
        raise ValueError("kfuse: x must be [..., in_features], got a 0-d tensor")
    return x.new_empty(x.shape[:-1] + (S2s.shape[2],))


def _epi_forward_fake(x, S1s, S2s, U1s, U2s, bias, act, dropout, training, save, seed):
    y = _forward_fake(x, S1s, S2s, U1s, U2s, bias)
    return y, x.new_empty(y.shape if save and _keeps_pre(act) else (0,))


def _backward_impl(dy, x, S1s, S2s, U1s, U2s, has_bias, output_mask):
    """(dx, dS1s, dS2s, dbias) through kf_sklinear_backward; an output not in output_mask is an
    empty tensor."""
    return _backward_any(dy, x, S1s, S2s, U1s, U2s, None, has_bias, 0, 0.0, False, None,
                         output_mask)


def _epi_backward_impl(dy, x, S1s, S2s, U1s, U2s, saved, has_bias, act, dropout, training, seed,
                       output_mask):
    """The same through the epilogue: `saved` is the forward's pre (GELU, GELU_TANH, SiLU) or
    y (ReLU), or empty (no activation)."""
    return _backward_any(dy, x, S1s, S2s, U1s, U2s, saved if saved.numel() else None, has_bias,
                         act, dropout, training, seed, output_mask)


def _backward_any(dy, x, S1s, S2s, U1s, U2s, saved, has_bias, act, dropout, training, seed,
                  output_mask):
    key = _key(S1s, S2s, has_bias, act, dropout)
    need_dx, need_d1, need_d2, need_db = output_mask
    dx, dS1s, dS2s, dbias = _grads(x, S1s, S2s, output_mask)
    if not x.numel():  # an empty batch (forward checked its shape): nothing flows back
        for t, need in ((dS1s, need_d1), (dS2s, need_d2), (dbias, need_db)):
            if need:
                t.zero_()
        return dx, dS1s, dS2s, dbias
    on_device(x, _backward_run, key, x.contiguous(), S1s.contiguous(), S2s.contiguous(),
              U1s.contiguous(), U2s.contiguous(), dy.contiguous(), dx if need_dx else None,
              dS1s if need_d1 else None, dS2s if need_d2 else None, dbias if need_db else None,
              None if saved is None else saved.contiguous(), training,
              0 if seed is None else int(seed.item()))
    return dx, dS1s, dS2s, dbias


def _backward_run(key, x, S1s, S2s, U1s, U2s, dy, dx, dS1s, dS2s, dbias, saved, training,
                  seed):
    device = x.device
    p = plan(key, device)
    p.backward(x, S1s, S2s, U1s, U2s, dy, dx=dx, dS1s=dS1s, dS2s=dS2s, dbias=dbias,
               workspace=workspace(p, device, _rows(x)) if x.is_cuda else None, pre=saved,
               training=training, dropout_seed=seed)


def _grads(x, S1s, S2s, output_mask):
    """(dx, dS1s, dS2s, dbias), each a fresh tensor, empty where output_mask says no."""
    need_dx, need_d1, need_d2, need_db = output_mask
    return (empty_grad(x, need_dx), empty_grad(S1s, need_d1), empty_grad(S2s, need_d2),
            S2s.new_empty((S2s.shape[-1],) if need_db else (0,)))


def _backward_fake(dy, x, S1s, S2s, U1s, U2s, has_bias, output_mask):
    return _grads(x, S1s, S2s, output_mask)


def _epi_backward_fake(dy, x, S1s, S2s, U1s, U2s, saved, has_bias, act, dropout, training, seed,
                       output_mask):
    return _grads(x, S1s, S2s, output_mask)


def _setup_context(ctx, inputs, output):
    x, S1s, S2s, U1s, U2s, bias = inputs
    ctx.has_bias = bias is not None
    ctx.save_for_backward(x, S1s, S2s, U1s, U2s)


def _grad_mask(ctx):
    need = ctx.needs_input_grad  # x, S1s, S2s, U1s, U2s, bias, ...
    return [bool(need[0]), bool(need[1]), bool(need[2]), bool(ctx.has_bias and need[5])]


def _grads_out(mask, grads, extra):
    dx, dS1s, dS2s, dbias = grads
    return (dx if mask[0] else None, dS1s if mask[1] else None, dS2s if mask[2] else None,
            None, None, dbias if mask[3] else None) + (None,) * extra


def _backward(ctx, dy):
    x, S1s, S2s, U1s, U2s = ctx.saved_tensors
    mask = _grad_mask(ctx)
    if dy is None or not any(mask):
        return (None,) * 6
    return _grads_out(mask, sklinear_backward(dy, x, S1s, S2s, U1s, U2s, ctx.has_bias, mask), 0)


def _epi_setup_context(ctx, inputs, output):
    x, S1s, S2s, U1s, U2s, bias, act, dropout, training, save, seed = inputs
    y, pre = output
    ctx.has_bias = bias is not None
    ctx.epi = (act, dropout, training)
    ctx.save_for_backward(x, S1s, S2s, U1s, U2s, y if act == _ACT_RELU else pre,
                          seed)


def _epi_backward(ctx, dy, dpre):
    x, S1s, S2s, U1s, U2s, saved, seed = ctx.saved_tensors
    mask = _grad_mask(ctx)
    if dy is None or not any(mask):
        return (None,) * 11
    act, dropout, training = ctx.epi
    return _grads_out(mask, sklinear_epi_backward(dy, x, S1s, S2s, U1s, U2s, saved, ctx.has_bias,
                                                  act, dropout, training, seed, mask), 5)


sklinear_backward = Op(
    "sklinear_backward",
    "(Tensor dy, Tensor x, Tensor S1s, Tensor S2s, Tensor U1s, Tensor U2s, bool has_bias, "
    "bool[] output_mask) -> (Tensor, Tensor, Tensor, Tensor)",
    _backward_impl, _backward_fake)

sklinear = Op(
    "sklinear",
    "(Tensor x, Tensor S1s, Tensor S2s, Tensor U1s, Tensor U2s, Tensor? bias) -> Tensor",
    _forward_impl, _forward_fake, _setup_context, _backward, feature_dims=1)


sklinear_epi_backward = Op(
    "sklinear_epi_backward",
    "(Tensor dy, Tensor x, Tensor S1s, Tensor S2s, Tensor U1s, Tensor U2s, Tensor saved, "
    "bool has_bias, int activation, float dropout, bool training, Tensor? seed, "
    "bool[] output_mask) -> (Tensor, Tensor, Tensor, Tensor)",
    _epi_backward_impl, _epi_backward_fake)

sklinear_epi = Op(
    "sklinear_epi",
    "(Tensor x, Tensor S1s, Tensor S2s, Tensor U1s, Tensor U2s, Tensor? bias, int activation, "
    "float dropout, bool training, bool save, Tensor? seed) -> (Tensor, Tensor)",
    _epi_forward_impl, _epi_forward_fake, _epi_setup_context, _epi_backward)


def sklinear_function(x, S1s, S2s, U1s, U2s, bias=None):
    """Differentiable kfuse SKLinear call (the operator kfuse::sklinear): y [..., out] from
    x [..., in]. Gradients flow to x, S1s, S2s and bias; U1s and U2s get none (fixed
    sketches)."""
    return sklinear(x, S1s, S2s, U1s, U2s, bias)


# ---- module ------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _has_tensor_core():
    """Panther's has_tensor_core_support(): CUDA is available and the current device's compute
    capability is 7.0 or above."""
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (7, 0)


class SKLinear(nn.Module):
    """Drop-in for panther.nn.SKLinear: SKLinear(in_features, out_features, num_terms, low_rank,
    W_init=None, bias=True, dtype=None, device=None, activation=None, dropout=None).

    Same parameters and buffers as Panther's (learnable S1s [L, in, k], S2s [L, k, out] and bias
    [out] (or None); fixed sketch buffers U1s [L, k, out] and U2s [L, in, k]), so
    load_state_dict(strict=True) works both ways; same warning when the sketch has more
    parameters than the dense layer (2Lk(in+out) > in*out); same forward: x [..., in] with any
    leading dims -> [..., out], a 1-D x gives a 1-D y:

        y = 1/(2L) sum_i [ (x S1s[i]) U1s[i] + (x U2s[i]) S2s[i] ] + bias

    computed by kfuse as two GEMMs through the rank-2Lk bottleneck (the operator kfuse::sklinear).
    Initialisation is Panther's (sign sketches with entries +-1/sqrt(k); S1s[i] = W U1s[i]^T,
    S2s[i] = U2s[i]^T W with W = W_init^T or Kaiming-uniform; bias U(-1/sqrt(out), 1/sqrt(out)))
    drawn by the library from a seed taken from torch's default generator, so torch.manual_seed()
    makes it repeatable (the values differ from Panther's own draws). The dtype is the
    parameters': float32, bfloat16 or float16 (storage in the type, float32 arithmetic;
    Panther's kernel tests run float16), or float64 (on CUDA since kfuse 1.7); another dtype
    raises kfuse.Unsupported at construction with the library's message.
    Autocast: under torch.autocast (CPU or CUDA, bfloat16 or float16; on CUDA the layer's two
    products run on the tensor cores), input and float32 parameters are cast to the autocast
    dtype for the call and the output has it, as torch's autocast treats nn.Linear (float32
    master parameters get float32 gradients); docs/precision.md.

    Panther's public attributes are here: the class attributes WARNING_MSG_FC, WARNING_MSG_TC and
    WARNING_MSG_BATCH with its texts (the tensor-core warnings are not raised: they describe a
    limit of Panther's CUDA kernels that kfuse does not have), `has_tensor_core` (Panther's rule:
    a CUDA device of compute capability >= 7.0 is present; read-only, asked on first read so that
    construction initialises no CUDA context) and `use_gpu` (True: kfuse's kernels take every
    shape on the tensors' device, so Panther's fallback for sizes that are not multiples of 16
    never applies; it has no effect when set).

    Beyond Panther (kfuse 1.8): `activation` (None, "relu", "gelu" (erf, torch's default),
    "gelu_tanh", "silu") and `dropout` (p in [0, 1); None or 0: none) make the layer
    y = dropout(act(SKLinear(x))), fused into the layer's one output store (the operator
    kfuse::sklinear_epi) instead of two more passes over y. Dropout follows module.training;
    its mask is drawn from a seed taken from torch's default generator per call (so
    torch.manual_seed makes it repeatable) by the library's counter-based generator, the same
    on CPU and CUDA (kfuse.h). The defaults leave the layer, its state_dict and its operator
    exactly Panther's."""

    __constants__ = ["in_features", "out_features", "num_terms", "low_rank"]
    in_features: int
    out_features: int
    num_terms: int
    low_rank: int
    WARNING_MSG_TC = (
        "Tensor Core not utilized. Ensure 'in_features', 'out_features', "
        "and 'low_rank' are multiples of 16 (current: {}, {}, {})."
    )
    WARNING_MSG_BATCH = (
        "Batch size {} is not a multiple of 16. Tensor Core optimizations disabled."
    )
    WARNING_MSG_FC = (
        "The sketching layer uses more parameters than a fully connected layer. "
        "Consider reducing 'num_terms' or 'low_rank' for efficiency."
    )

    def __init__(self, in_features, out_features, num_terms, low_rank, W_init=None, bias=True,
                 dtype=None, device=None, activation=None, dropout=None):
        factory_kwargs = {"dtype": dtype, "device": device}
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError("kfuse.torch.SKLinear: activation=%r, expected one of None, %s"
                             % (activation, ", ".join(repr(a) for a in ACTIVATIONS if a)))
        self.activation = activation
        self.dropout = 0.0 if dropout is None else float(dropout)  # the library checks it
        self.in_features = in_features
        self.out_features = out_features
        self.num_terms = num_terms
        self.low_rank = low_rank
        self.use_gpu = True
        dtype = dtype if dtype is not None else torch.get_default_dtype()
        # Descriptor checks are the library's (made and cached on the CPU context).
        p = plan(self._key(dtype, bias), torch.device("cpu"))
        if p.param_ratio > 1.0:
            warnings.warn(self.WARNING_MSG_FC, category=UserWarning, stacklevel=2)
        shapes = dict(p.param_info)  # the library's (kf_sklinear_param_info)
        # Panther registers the buffers first, then S1s, S2s, bias.
        self.register_buffer("U1s", torch.empty(shapes["U1s"], **factory_kwargs))
        self.register_buffer("U2s", torch.empty(shapes["U2s"], **factory_kwargs))
        self.S1s = nn.Parameter(torch.empty(shapes["S1s"], **factory_kwargs))
        self.S2s = nn.Parameter(torch.empty(shapes["S2s"], **factory_kwargs))
        if bias:
            self.bias = nn.Parameter(torch.empty(shapes["bias"], **factory_kwargs))
        else:
            self.register_parameter("bias", None)
        self._init_parameters(W_init)

    @property
    def has_tensor_core(self):
        return _has_tensor_core()

    def _key(self, dtype, bias):
        return ("sklinear", self.in_features, self.out_features, self.num_terms, self.low_rank,
                bool(bias), dtype_code(dtype), ACTIVATIONS[self.activation], self.dropout)

    @torch.no_grad()
    def _init_parameters(self, W_init=None):
        seed = int(torch.randint(0, 2 ** 62, (1,), dtype=torch.int64).item())
        device = self.S1s.device
        if device.type == "meta":
            return  # nothing to fill
        if W_init is not None:
            W_init = W_init.detach().to(device=device, dtype=self.S1s.dtype).contiguous()
        with device_guard(device):
            p = plan(self._key(self.S1s.dtype, self.bias is not None), device)
            p.init_params(seed, self.S1s, self.S2s, self.U1s, self.U2s, bias=self.bias,
                          W_init=W_init)

    def forward(self, h_in):
        # x [..., in] -> y [..., out]; the library takes up to KF_MAX_DIMS dims as they are
        # (a 1-D x is one row and gives a 1-D y, as in Panther), more are flattened here.
        x, tensors = autocast_inputs(h_in, self._tensors())
        if x.dim() > _MAX_DIMS and x.shape[-1] > 0:
            lead = x.shape[:-1]
            y = self._layer(x.reshape(-1, x.shape[-1]), tensors)
            y = y.view(*lead, y.shape[-1])
        else:
            y = self._layer(x, tensors)
        return y

    def _layer(self, x, tensors):
        act = ACTIVATIONS[self.activation]
        if act == _ACT_NONE and not self.dropout:
            return sklinear(x, *tensors)  # Panther's layer, its operator
        training = self.training and self.dropout > 0.0
        # what the backward needs (the pre-activation) is kept only where a gradient may flow
        save = grad_may_flow(x, tensors)
        seed = dropout_seed() if training else None
        return sklinear_epi(x, *tensors, act, self.dropout, training, save, seed)[0]

    def _tensors(self):
        return module_attrs(self, (SKLinear,), _NAMES)

    def extra_repr(self):
        s = "in_features={}, out_features={}, num_terms={}, low_rank={}, bias={}".format(
            self.in_features, self.out_features, self.num_terms, self.low_rank,
            self.bias is not None)
        if self.activation is not None or self.dropout:
            s += ", activation={!r}, dropout={}".format(self.activation, self.dropout)
        return s
