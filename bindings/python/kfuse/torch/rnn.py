"""kfuse.torch.GRU (the drop-in for torch.nn.GRU) and kfuse.torch.AGRU (the reference A-GRU
model), and their operators kfuse::rnn / kfuse::rnn_backward."""
import math
import warnings

import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from kfuse._lowlevel import dtype_code, kf_dtype_of, rnn_seq_dims
from kfuse.torch._common import (
    Op, autocast_inputs, device_guard, dropout_seed, empty_grad, grad_may_flow, plan,
)

__all__ = ["GRU", "AGRU", "AGRUCell", "rnn_function"]


# ---- kernels -----------------------------------------------------------------------------------
#
# The descriptor travels as the operators' scalar arguments: cell ("gru" | "agru"), input_size,
# hidden_size, num_layers, batch_first, bidirectional, dropout (0 outside training), gamma.

def _key(x, weights, desc):
    return tuple(desc) + (kf_dtype_of("weights[0]", weights[0]) if weights else
                          kf_dtype_of("x", x),)


def _out_shapes(p, x, batch_first):
    """(y_shape, hn_shape, T, B): the library's shapes (kf_rnn_output_shapes, once per plan and
    (T, B)). Under symbolic shapes (torch.compile's dynamic sizes), and for an empty batch
    (B = 0, which torch.nn.GRU accepts and the library's extents do not), they are the plan's for
    one step of one sample with x's T and B put in their places (y keeps x's two leading dims,
    hn's middle one is B). An x that is not 3-D is passed on for the library to report (y
    absent)."""
    T, B = rnn_seq_dims(batch_first, x.shape)
    if isinstance(T, int) and isinstance(B, int) and B != 0:
        y, hn = p.output_shapes(T, B)
    else:
        y, hn = p.output_shapes(1, 1)
        y, hn = (x.shape[0], x.shape[1], y[2]), (hn[0], B, hn[2])
    return (y if x.dim() == 3 else (0,)), hn, T, B


def _prepared(x, hx, weights, desc, seed):
    """What forward and backward hand the library: (plan key, x, hx, weights) with the tensors
    made contiguous, the dropout seed as an int (None: 0), and the device."""
    key = _key(x, weights, desc)
    return (key, x.contiguous(), None if hx is None else hx.contiguous(),
            [w.contiguous() for w in weights], 0 if seed is None else int(seed.item()), x.device)


def _forward_impl(x, hx, lengths, weights, *desc_training_seed):
    *desc, training, seed = desc_training_seed
    key, x, hx, weights, seed, device = _prepared(x, hx, weights, desc, seed)
    with device_guard(device):
        p = plan(key, device)
        y_shape, hn_shape, T, B = _out_shapes(p, x, desc[4])
        if B == 0 and T != 0 and x.dim() == 3:  # no sample: nothing to run (torch.nn.GRU's)
            return x.new_zeros(y_shape), x.new_zeros(hn_shape), x.new_empty((0,), dtype=torch.uint8)
        y = x.new_empty(y_shape)
        hn = x.new_empty(hn_shape)
        ws_bytes, rs_bytes = p.workspace_size(T, B, training) if x.dim() == 3 else (0, 0)
        ws = None
        if device.type == "cuda" and ws_bytes:
            ws = torch.empty(ws_bytes, dtype=torch.uint8, device=device)
        reserve = torch.empty(rs_bytes if training else 0, dtype=torch.uint8, device=device)
        p.forward(x, weights, y if x.dim() == 3 else None, h0=hx, hn=hn, lengths=lengths,
                  training=training, dropout_seed=seed, dropout_offset=0, workspace=ws,
                  reserve=reserve if training else None)
    return y, hn, reserve


def _forward_fake(x, hx, lengths, weights, *desc_training_seed):
    *desc, training, seed = desc_training_seed
    if x.dim() != 3:
        raise ValueError("kfuse: x must be 3-D [T, B, input_size] (batch_first: [B, T, "
                         "input_size]), got shape %s" % (tuple(x.shape),))
    p = plan(_key(x, weights, desc), torch.device("cpu"))
    y_shape, hn_shape, T, B = _out_shapes(p, x, desc[4])
    rs_bytes = 0
    if training:
        if isinstance(T, int) and isinstance(B, int):
            rs_bytes = p.workspace_size(T, B, True)[1] if B != 0 else 0
        else:  # symbolic T or B: a size the graph learns when it runs
            rs_bytes = torch.library.get_ctx().new_dynamic_size()
    return (x.new_empty(y_shape), x.new_empty(hn_shape),
            x.new_empty((rs_bytes,), dtype=torch.uint8))


def _backward_impl(dy, dhn, x, hx, lengths, weights, reserve, *desc_seed_mask):
    """(dx, dh0, dweights) through kf_rnn_backward; an output not in output_mask (dx, dh0, one
    flag per weight) is an empty tensor."""
    *desc, seed, output_mask = desc_seed_mask
    need_dx, need_dh0, need_dw = output_mask[0], output_mask[1], output_mask[2:]
    dx = empty_grad(x, need_dx)
    dh0 = empty_grad(hx, need_dh0) if hx is not None else x.new_empty((0,))
    dws = [empty_grad(w, n) for w, n in zip(weights, need_dw)]
    T, B = rnn_seq_dims(desc[4], x.shape)
    if B == 0:  # an empty batch (the forward ran nothing): zero gradients
        return dx, dh0, [d.zero_() for d in dws]
    key, x, hx, weights, seed, device = _prepared(x, hx, weights, desc, seed)
    with device_guard(device):
        p = plan(key, device)
        ws_bytes = p.workspace_size(T, B, True)[0]
        ws = None
        if device.type == "cuda" and ws_bytes:
            ws = torch.empty(ws_bytes, dtype=torch.uint8, device=device)
        p.backward(x, weights, reserve, h0=hx, lengths=lengths,
                   dy=None if dy is None else dy.contiguous(),
                   dhn=None if dhn is None else dhn.contiguous(),
                   dx=dx if need_dx else None, dh0=dh0 if need_dh0 and hx is not None else None,
                   dweights=[d if n else None for d, n in zip(dws, need_dw)]
                   if any(need_dw) else None,
                   dropout_seed=seed, dropout_offset=0, workspace=ws)
    return dx, dh0, dws


def _backward_fake(dy, dhn, x, hx, lengths, weights, reserve, *desc_seed_mask):
    output_mask = desc_seed_mask[-1]
    return (empty_grad(x, output_mask[0]),
            empty_grad(hx, output_mask[1]) if hx is not None else x.new_empty((0,)),
            [empty_grad(w, n) for w, n in zip(weights, output_mask[2:])])


def _setup_context(ctx, inputs, output):
    x, hx, lengths, weights, *desc, training, seed = inputs
    ctx.desc = desc
    ctx.training = training
    ctx.has_hx = hx is not None
    ctx.save_for_backward(x, hx, lengths, output[2], seed, *weights)


def _backward(ctx, dy, dhn, _dreserve):
    if not ctx.training:  # only rnn_function(training=False) on inputs requiring grad
        raise RuntimeError("kfuse: backward through a recurrent forward that ran with "
                           "training=False (inference mode writes no reserve)")
    x, hx, lengths, reserve, seed, *weights = ctx.saved_tensors
    need = ctx.needs_input_grad  # x, hx, lengths, [weights], *desc, training, seed
    mask = [bool(need[0]), bool(ctx.has_hx and need[1])] + [bool(n) for n in need[3]]
    nones = (None,) * (len(ctx.desc) + 2)
    if not any(mask) or (dy is None and dhn is None):
        return (None, None, None, [None] * len(weights)) + nones
    dx, dh0, dws = rnn_backward(dy, dhn, x, hx, lengths, weights, reserve, *ctx.desc, seed,
                                mask)
    return ((dx if mask[0] else None, dh0 if mask[1] else None, None,
             [d if n else None for d, n in zip(dws, mask[2:])]) + nones)


_DESC = ("str cell, int input_size, int hidden_size, int num_layers, bool batch_first, "
         "bool bidirectional, float dropout, float gamma")

rnn_backward = Op(
    "rnn_backward",
    "(Tensor? dy, Tensor? dhn, Tensor x, Tensor? hx, Tensor? lengths, Tensor[] weights, "
    "Tensor reserve, %s, Tensor? seed, bool[] output_mask) -> (Tensor, Tensor, Tensor[])" % _DESC,
    _backward_impl, _backward_fake)
rnn = Op(
    "rnn",
    "(Tensor x, Tensor? hx, Tensor? lengths, Tensor[] weights, %s, bool training, Tensor? seed) "
    "-> (Tensor, Tensor, Tensor)" % _DESC,
    _forward_impl, _forward_fake, _setup_context, _backward)


def rnn_function(x, hx, lengths, weights, cell, input_size, hidden_size, num_layers=1,
                 batch_first=False, bidirectional=False, dropout=0.0, gamma=0.01, training=True,
                 seed=None):
    """Differentiable kfuse recurrent call (the operator kfuse::rnn): (y, hn). `weights` in the
    plan's canonical order (kfuse.RnnPlan.weight_names); `lengths` int32 per sample or None;
    `seed` an int64 tensor keying dropout (None: 0). training=False writes no reserve, so no
    backward."""
    y, hn, _ = rnn(x, hx, lengths, list(weights), cell, input_size, hidden_size, num_layers,
                   batch_first, bidirectional, float(dropout), float(gamma), training, seed)
    return y, hn


# ---- shared module machinery -------------------------------------------------------------------

class _KfuseRNNBase(nn.Module):
    """Forward plumbing shared by GRU and AGRU: unbatched input, PackedSequence (through the
    library's per-sample lengths), training mode and dropout seed, then one operator call."""

    _cell = None

    def _key(self, dtype, dropout):
        return (self._cell, self.input_size, self.hidden_size, self.num_layers,
                bool(self.batch_first), bool(getattr(self, "bidirectional", False)),
                float(dropout), float(getattr(self, "gamma", 0.01)), dtype_code(dtype))

    def _check_descriptor(self, dtype):
        """Construction-time checks are the library's: makes (and caches) the plan on the CPU,
        keeps the library's canonical weight order for forward and returns its weight shapes
        {name: shape} (kf_rnn_weight_info)."""
        p = plan(self._key(dtype, self.dropout), torch.device("cpu"))
        self._weight_names = p.weight_names
        return dict(p.weight_info)

    def _canonical_weights(self):
        """The library's weights in its canonical order: the module's parameters, and zeros for
        the biases of a GRU(bias=False) (the cell with zero biases is the cell without them;
        their gradients are not asked for). By attribute, so that functional_call, a
        parametrization or anything else that took a weight's name over gives its tensor."""
        out = []
        # a GRU's weights are its own parameters: read where nn.Module.__getattr__ finds them
        # (not for a subclass: parametrizations and torch 1.13's functional_call make one)
        params = self._parameters if type(self) is GRU else {}
        for name in self._weight_names:
            t = params[name] if name in params else self._weight(name)
            out.append(t if t is not None else self._zero_bias(name))
        return out

    def _weight(self, name):
        obj = self
        for part in name.split("."):
            obj = getattr(obj, part, None)
        return obj

    def _zero_bias(self, name):
        w = self._weight(name.replace("bias_", "weight_"))  # its layer's weight
        return torch.zeros(w.shape[0], dtype=w.dtype, device=w.device)

    def _run(self, x, hx, lengths):
        # torch.nn.GRU on the CPU under autocast returns h0's dtype (x's without h0): its state
        # keeps that dtype while its products run in the autocast dtype
        out_dtype = (hx if hx is not None else x).dtype
        x, (hx, *weights) = autocast_inputs(x, [hx] + self._canonical_weights())
        dropout = self.dropout if self.training else 0.0
        training = grad_may_flow(x, hx, weights) or dropout > 0.0
        seed = dropout_seed() if dropout > 0.0 else None
        # gamma: an AGRU's plain attribute; a GRU has none (read without the AttributeError
        # nn.Module.__getattr__ would raise: ~1 us a call)
        y, hn, _ = rnn(x, hx, lengths, weights, self._cell, self.input_size, self.hidden_size,
                       self.num_layers, bool(self.batch_first),
                       bool(getattr(self, "bidirectional", False)), float(dropout),
                       float(self.__dict__.get("gamma", 0.01)), training, seed)
        if y.dtype != out_dtype and not x.is_cuda:
            y, hn = y.to(out_dtype), hn.to(out_dtype)
        return y, hn

    def forward(self, input, hx=None):
        if isinstance(input, PackedSequence):
            padded, lens = pad_packed_sequence(input, batch_first=self.batch_first)
            lengths = lens.to(device=padded.device, dtype=torch.int32)
            y, hn = self._run(padded, hx, lengths)
            # Back to the input's packing (its batch_sizes and permutation), as torch does.
            sorted_idx = input.sorted_indices
            if sorted_idx is not None:
                y = y.index_select(0 if self.batch_first else 1, sorted_idx.to(y.device))
                lens = lens.index_select(0, sorted_idx.cpu())
            data = pack_padded_sequence(y, lens, batch_first=self.batch_first).data
            return PackedSequence(data, input.batch_sizes, input.sorted_indices,
                                  input.unsorted_indices), hn
        unbatched = input.dim() == 2
        if unbatched:
            input = input.unsqueeze(0 if self.batch_first else 1)
            if hx is not None and hx.dim() == 2:
                hx = hx.unsqueeze(1)
        y, hn = self._run(input, hx, None)
        if unbatched:
            y = y.squeeze(0 if self.batch_first else 1)
            hn = hn.squeeze(1)
        return y, hn

# ---- GRU ---------------------------------------------------------------------------------------

class GRU(_KfuseRNNBase):
    """Drop-in for torch.nn.GRU (same arguments, defaults, parameter names, shapes and
    initialisation; same seed gives the same weights). With bias=False, as in torch, there are
    no bias parameters; the library runs the cell with zero biases. The dtype is the
    parameters' (dtype=, .double(), .float(), .bfloat16(), .half()): float32, bfloat16 or
    float16 (storage in the type, float32 arithmetic and state), or float64 (on CUDA since
    kfuse 1.7); another dtype raises kfuse.Unsupported with the library's message, and an
    input of another dtype than the parameters' kfuse.InvalidArgument (a
    ValueError) naming both. Autocast, as torch.nn.GRU (torch 1.13 and 2.x): under
    torch.autocast (CPU bfloat16 or float16; CUDA bfloat16 or float16), input, h0 and float32
    parameters are cast to the autocast dtype for the call (float32 master parameters get
    float32 gradients; a float64 module is left alone); output and h_n have the autocast dtype
    on CUDA, and on the CPU h0's dtype (x's without h0), as torch.nn.GRU returns them there; on
    CUDA the input-side products run on the tensor cores where H is not 64, 96 or 128 (those
    take the persistent float32 kernels); docs/precision.md.
    """

    _cell = "gru"

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, proj_size=0, device=None, dtype=None):
        factory_kwargs = {"device": device, "dtype": dtype}
        super().__init__()
        if proj_size != 0:
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        if (isinstance(dropout, (int, float)) and not isinstance(dropout, bool)
                and dropout > 0 and num_layers == 1):
            warnings.warn("dropout option adds dropout after all but last recurrent layer, so "
                          "non-zero dropout expects num_layers greater than 1, but got "
                          "dropout={} and num_layers={}".format(dropout, num_layers))
        self.mode = "GRU"
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bias = bias
        self.batch_first = batch_first
        self.dropout = float(dropout)
        self.bidirectional = bidirectional
        self.proj_size = proj_size
        shapes = self._check_descriptor(dtype if dtype is not None else torch.get_default_dtype())
        # Registration order as torch.nn.GRU: per layer, per direction, w_ih, w_hh, b_ih, b_hh
        # (the library's canonical order, kf_rnn_weight_info, is the same), with its shapes.
        D = 2 if bidirectional else 1
        self._flat_weights_names = []
        self._all_weights = []
        for layer in range(num_layers):
            for direction in range(D):
                sfx = "_reverse" if direction == 1 else ""
                names = ["weight_ih_l{}{}", "weight_hh_l{}{}", "bias_ih_l{}{}", "bias_hh_l{}{}"]
                names = [n.format(layer, sfx) for n in names]
                if not bias:  # torch.nn.GRU(bias=False) registers the weights only
                    names = names[:2]
                for n in names:
                    setattr(self, n, nn.Parameter(torch.empty(shapes[n], **factory_kwargs)))
                self._flat_weights_names.extend(names)
                self._all_weights.append(names)
        self.reset_parameters()

    def reset_parameters(self):
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for weight in self.parameters():
            nn.init.uniform_(weight, -stdv, stdv)

    @property
    def _flat_weights(self):
        return [getattr(self, n) for n in self._flat_weights_names]

    @property
    def all_weights(self):
        return [[getattr(self, w) for w in ws] for ws in self._all_weights]

    def flatten_parameters(self):
        """No-op (kept for torch.nn.GRU compatibility): kfuse reads the weights in place."""

    def extra_repr(self):
        s = "{input_size}, {hidden_size}"
        if self.num_layers != 1:
            s += ", num_layers={num_layers}"
        if self.bias is not True:
            s += ", bias={bias}"
        if self.batch_first is not False:
            s += ", batch_first={batch_first}"
        if self.dropout != 0:
            s += ", dropout={dropout}"
        if self.bidirectional is not False:
            s += ", bidirectional={bidirectional}"
        return s.format(**self.__dict__)


# ---- A-GRU -------------------------------------------------------------------------------------

class AGRUCell(nn.Module):
    """Parameter container of one A-GRU layer, laid out as the reference cell (W_z, U_z, W_r, U_r,
    V_h as nn.Linear, W_h [H, H], epsilon [1]); same creation order, so the same seed gives the
    same weights. Its step math lives only in the library; call the AGRU module."""

    def __init__(self, input_size, hidden_size, gamma=0.01, epsilon=1.0, device=None,
                 dtype=None):
        factory_kwargs = {"device": device, "dtype": dtype}
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.gamma = gamma
        self.W_z = nn.Linear(input_size, hidden_size, **factory_kwargs)
        self.U_z = nn.Linear(hidden_size, hidden_size, bias=False, **factory_kwargs)
        self.W_r = nn.Linear(input_size, hidden_size, **factory_kwargs)
        self.U_r = nn.Linear(hidden_size, hidden_size, bias=False, **factory_kwargs)
        self.V_h = nn.Linear(input_size, hidden_size, **factory_kwargs)
        bound = 1.0 / math.sqrt(hidden_size)
        self.W_h = nn.Parameter(torch.empty(hidden_size, hidden_size, **factory_kwargs)
                                .uniform_(-bound, bound))
        self.epsilon = nn.Parameter(torch.full((1,), float(epsilon), **factory_kwargs))

    def extra_repr(self):
        return "{}, {}, gamma={}".format(self.input_size, self.hidden_size, self.gamma)


class AGRU(_KfuseRNNBase):
    """Drop-in for the reference A-GRU model: AGRU(input_size, hidden_size, num_layers=1,
    batch_first=False, dropout=0.0, gamma=0.01, epsilon=1.0); parameters cells.{l}.W_z.weight,
    ...; forward(input, hx=None) -> (output [T, B, H], h_n [L, B, H]), with unbatched 2-D input
    and PackedSequence also accepted. Dtypes and autocast as GRU's."""

    _cell = "agru"

    def __init__(self, input_size, hidden_size, num_layers=1, batch_first=False, dropout=0.0,
                 gamma=0.01, epsilon=1.0, device=None, dtype=None):
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.batch_first = batch_first
        self.dropout = float(dropout)
        self.gamma = float(gamma)
        self.bidirectional = False
        self._check_descriptor(dtype if dtype is not None else torch.get_default_dtype())
        self.cells = nn.ModuleList(
            AGRUCell(input_size if l == 0 else hidden_size, hidden_size, gamma, epsilon,
                     device=device, dtype=dtype)
            for l in range(num_layers))

    def extra_repr(self):
        s = "{}, {}, num_layers={}".format(self.input_size, self.hidden_size, self.num_layers)
        if self.batch_first:
            s += ", batch_first=True"
        if self.dropout:
            s += ", dropout={}".format(self.dropout)
        return s + ", gamma={}".format(self.gamma)


