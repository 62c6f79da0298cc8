"""PyTorch front end: drop-in `GRU` (torch.nn.GRU) and `AGRU` (the reference A-GRU model) modules
whose forward and backward run in the kfuse C library, through autograd Functions.

- CPU tensors run on the calling thread's CPU kfuse context (scratch from its arena; the reserve
  that backward reads is a torch uint8 tensor).
- CUDA tensors run on the calling thread's kfuse context for that device, set to
  torch.cuda.current_stream() before every call; workspace and reserve come from torch's caching
  allocator (torch.empty(..., dtype=torch.uint8, device=...)), so memory is stream-ordered with
  the rest of the program and nothing synchronises.
- Contexts and plans are cached per (device, thread): a kfuse context is used by one thread at a
  time, and autograd may run backward on another thread than forward.
- Every argument check is the library's: a bad shape, dtype or descriptor raises the matching
  kfuse.KfuseError subclass (InvalidArgument is a ValueError) with the library's message.
- Dropout between layers uses kfuse's counter-based generator, keyed by a seed drawn from torch's
  default generator at each training forward, so torch.manual_seed() makes it reproducible.
"""
import contextlib
import math
import threading
import warnings

import torch
from torch import nn
from torch.autograd.function import once_differentiable
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from kfuse._lowlevel import (
    DTYPE_BF16, DTYPE_F16, DTYPE_F32, DTYPE_F64, DTYPE_I32, DTYPE_I64, RnnPlan, TensorRef,
    thread_context,
)

__all__ = ["GRU", "AGRU", "AGRUCell", "rnn_function"]

_DTYPES = {
    torch.float32: DTYPE_F32, torch.float64: DTYPE_F64, torch.float16: DTYPE_F16,
    torch.bfloat16: DTYPE_BF16, torch.int32: DTYPE_I32, torch.int64: DTYPE_I64,
}


def _ref(t):
    """TensorRef of a torch tensor as it is (an unknown dtype goes as 0: the library names it)."""
    if t is None:
        return None
    return TensorRef(t.data_ptr(), _DTYPES.get(t.dtype, 0), t.shape, t.stride())


def _buf(t):
    return None if t is None else (t.data_ptr(), t.numel())


# ---- per-(device, thread) contexts and plans ---------------------------------------------------

_tls = threading.local()


def _context(device):
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        ctx = thread_context("cuda", index)
        stream = torch.cuda.current_stream(torch.device("cuda", index)).cuda_stream
        if ctx._stream != stream:
            ctx.set_stream(stream)
        return ctx
    # "cpu", or a device kind kfuse has no backend for: the library rejects it by name.
    return thread_context(device.type, device.index or 0)


def _plan(key, device):
    """The calling thread's plan for descriptor `key` on `device` (a torch.device)."""
    cache = getattr(_tls, "plans", None)
    if cache is None:
        cache = _tls.plans = {}
    ctx = _context(device)
    full = (device.type, device.index, key)
    plan = cache.get(full)
    if plan is None or plan.ctx is not ctx:
        cell, I, H, L, batch_first, bidirectional, dropout, gamma, dtype = key
        plan = cache[full] = RnnPlan(ctx, cell, I, H, num_layers=L, batch_first=batch_first,
                                     bidirectional=bidirectional, dropout=dropout, gamma=gamma,
                                     dtype=dtype)
    return plan


def _dims(plan, x):
    """(T, B) for allocation; an x that is not 3-D is passed on for the library to report."""
    if x.dim() != 3:
        return 1, 1
    return (x.shape[1], x.shape[0]) if plan.batch_first else (x.shape[0], x.shape[1])


# ---- autograd Function -------------------------------------------------------------------------

def _device_guard(device):
    """torch.cuda.device(device) for a CUDA tensor (allocations and the current stream then refer
    to the tensor's device), else a no-op."""
    if device.type == "cuda":
        return torch.cuda.device(device)
    return contextlib.nullcontext()


class _RnnFunction(torch.autograd.Function):
    # inputs: key, training, seed, x, h0, lengths, *weights   outputs: y, hn

    @staticmethod
    def forward(ctx, key, training, seed, x, h0, lengths, *weights):
        ctx.set_materialize_grads(False)
        with _device_guard(x.device):
            return _RnnFunction._forward(ctx, key, training, seed, x, h0, lengths, weights)

    @staticmethod
    def _forward(ctx, key, training, seed, x, h0, lengths, weights):
        plan = _plan(key, x.device)
        T, B = _dims(plan, x)
        D, H, L = plan.num_directions, plan.hidden_size, plan.num_layers
        if x.dim() == 3:
            y = torch.empty((x.shape[0], x.shape[1], D * H), dtype=x.dtype, device=x.device)
        else:
            y = torch.empty((0,), dtype=x.dtype, device=x.device)
        hn = torch.empty((L * D, B, H), dtype=x.dtype, device=x.device)
        ws_bytes, rs_bytes = plan.workspace_size(T, B, training) if x.dim() == 3 else (0, 0)
        workspace = None
        if x.device.type == "cuda" and ws_bytes:
            workspace = torch.empty(ws_bytes, dtype=torch.uint8, device=x.device)
        reserve = None
        if training:
            reserve = torch.empty(rs_bytes, dtype=torch.uint8, device=x.device)
        plan.forward(_ref(x), [_ref(w) for w in weights], _ref(y) if x.dim() == 3 else None,
                     h0=_ref(h0), hn=_ref(hn), lengths=_ref(lengths), training=training,
                     dropout_seed=seed, dropout_offset=0, workspace=_buf(workspace),
                     reserve=_buf(reserve))
        ctx.key = key
        ctx.seed = seed
        ctx.reserve = reserve
        ctx.save_for_backward(x, h0, lengths, *weights)
        return y, hn

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dhn):
        x, h0, lengths, *weights = ctx.saved_tensors
        with _device_guard(x.device):
            return _RnnFunction._backward(ctx, dy, dhn, x, h0, lengths, weights)

    @staticmethod
    def _backward(ctx, dy, dhn, x, h0, lengths, weights):
        if ctx.reserve is None:
            raise RuntimeError("kfuse: backward through a forward that ran without a reserve "
                               "(no input required grad at forward time)")
        plan = _plan(ctx.key, x.device)
        need = ctx.needs_input_grad
        dx = torch.empty_like(x) if need[3] else None
        dh0 = torch.empty_like(h0) if (h0 is not None and need[4]) else None
        dws = [torch.empty_like(w) if need[6 + i] else None for i, w in enumerate(weights)]
        T, B = _dims(plan, x)
        ws_bytes = plan.workspace_size(T, B, True)[0]
        workspace = None
        if x.device.type == "cuda" and ws_bytes:
            workspace = torch.empty(ws_bytes, dtype=torch.uint8, device=x.device)
        dy = None if dy is None else dy.contiguous()
        dhn = None if dhn is None else dhn.contiguous()
        any_dw = any(d is not None for d in dws)
        plan.backward(_ref(x), [_ref(w) for w in weights], _buf(ctx.reserve), h0=_ref(h0),
                      lengths=_ref(lengths), dy=_ref(dy), dhn=_ref(dhn), dx=_ref(dx),
                      dh0=_ref(dh0), dweights=[_ref(d) for d in dws] if any_dw else None,
                      dropout_seed=ctx.seed, dropout_offset=0, workspace=_buf(workspace))
        ctx.reserve = None  # a second backward would need retain_graph semantics we do not keep
        return (None, None, None, dx, dh0, None, *dws)


def rnn_function(key, training, seed, x, h0, lengths, weights):
    """Differentiable kfuse recurrent call: (y, hn). `key` = (cell, I, H, L, batch_first,
    bidirectional, dropout, gamma, kf_dtype); `weights` in the plan's canonical order."""
    return _RnnFunction.apply(key, training, seed, x, h0, lengths, *weights)


# ---- shared module machinery -------------------------------------------------------------------

class _KfuseRNNBase(nn.Module):
    """Forward plumbing shared by GRU and AGRU: unbatched input, PackedSequence (through the
    library's per-sample lengths), training mode and dropout seed, then one library call."""

    _cell = None

    def _key(self, dtype, dropout):
        return (self._cell, self.input_size, self.hidden_size, self.num_layers,
                bool(self.batch_first), bool(getattr(self, "bidirectional", False)),
                float(dropout), float(getattr(self, "gamma", 0.01)), _DTYPES.get(dtype, 0))

    def _check_descriptor(self, dtype):
        # Construction-time checks are the library's: make (and cache) the plan on the CPU.
        _plan(self._key(dtype, self.dropout), torch.device("cpu"))

    def _canonical_weights(self):
        plan = _plan(self._key(self._param_dtype(), 0.0), torch.device("cpu"))
        return [self.get_parameter(name) for name in plan.weight_names]

    def _param_dtype(self):
        for p in self.parameters():
            return p.dtype
        return torch.float32

    def _run(self, x, hx, lengths):
        weights = [w.contiguous() for w in self._canonical_weights()]
        dropout = self.dropout if self.training else 0.0
        need_grad = torch.is_grad_enabled() and (
            x.requires_grad or (hx is not None and hx.requires_grad)
            or any(w.requires_grad for w in weights))
        training = need_grad or (self.training and dropout > 0.0)
        seed = 0
        if self.training and dropout > 0.0:
            seed = int(torch.randint(0, 2 ** 62, (1,), dtype=torch.int64).item())
        key = self._key(weights[0].dtype if weights else x.dtype, dropout)
        return rnn_function(key, training, seed, x.contiguous(),
                            None if hx is None else hx.contiguous(), lengths, weights)

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
    initialisation; same seed gives the same weights). bias=False is not implemented yet."""

    _cell = "gru"

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, proj_size=0, device=None, dtype=None):
        factory_kwargs = {"device": device, "dtype": dtype}
        super().__init__()
        if proj_size != 0:
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        if not bias:
            raise NotImplementedError("kfuse.torch.GRU: bias=False is not supported yet")
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
        self._check_descriptor(dtype if dtype is not None else torch.get_default_dtype())
        # Registration order and shapes as torch.nn.GRU: per layer, per direction, w_ih, w_hh,
        # b_ih, b_hh (the library's canonical order, kf_rnn_weight_info, is the same).
        D = 2 if bidirectional else 1
        self._flat_weights_names = []
        self._all_weights = []
        for layer in range(num_layers):
            for direction in range(D):
                layer_in = input_size if layer == 0 else hidden_size * D
                sfx = "_reverse" if direction == 1 else ""
                names = ["weight_ih_l{}{}", "weight_hh_l{}{}", "bias_ih_l{}{}", "bias_hh_l{}{}"]
                names = [n.format(layer, sfx) for n in names]
                shapes = [(3 * hidden_size, layer_in), (3 * hidden_size, hidden_size),
                          (3 * hidden_size,), (3 * hidden_size,)]
                for n, s in zip(names, shapes):
                    setattr(self, n, nn.Parameter(torch.empty(s, **factory_kwargs)))
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
    and PackedSequence also accepted."""

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
