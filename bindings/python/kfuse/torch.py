"""PyTorch front end: drop-in `GRU` (torch.nn.GRU), `AGRU` (the reference A-GRU model),
`SKLinear` (panther.nn.SKLinear), `KANLinear` (efficient_kan.KANLinear) and `KANConv2d`
(torch.nn.functional.unfold + efficient_kan.KANLinear) modules whose forward and backward run in
the kfuse C library, through autograd Functions.

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
  SKLinear's initialisation (kf_sklinear_init_params) is keyed the same way, by a seed drawn at
  construction.
- KANLinear draws its initialisation from torch's default generator in efficient-kan's order;
  its grid comes from kf_kan_linear_uniform_grid and update_grid is kf_kan_linear_update_grid;
  the other rare calls (reset_parameters, curve2coeff, b_splines, regularization_loss) run in
  torch. KANConv2d is a KANLinear over the patches: the same parameters, initialisation and rare
  calls, with forward, backward and update_grid in kf_kan_conv2d_* (no patches stored).
"""
import contextlib
import math
import threading
import warnings

import torch
from torch import nn
from torch.autograd.function import once_differentiable
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from kfuse._lowlevel import RnnPlan, dtype_code, lib, thread_context
from kfuse.kan import KanConv2dPlan, KanLinearPlan, _pair
from kfuse.sklinear import SkLinearPlan

__all__ = ["GRU", "AGRU", "AGRUCell", "SKLinear", "KANLinear", "KANConv2d", "rnn_function",
           "sklinear_function", "kan_linear_function", "kan_conv2d_function"]

# Tensors go to the plans' methods as they are: the methods take their kf_tensor fields and hold
# them until the C call returns (kfuse._lowlevel.tensor_values, the one conversion every front end
# shares), so no data pointer is taken here and a temporary (dy.contiguous()) stays alive.


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


def _make_plan(ctx, key):
    if key[0] == "sklinear":
        _, I, O, L, k, bias, dtype = key
        return SkLinearPlan(ctx, I, O, L, k, bias=bias, dtype=dtype)
    if key[0] == "kan_linear":
        _, I, O, G, k, standalone, dtype = key
        return KanLinearPlan(ctx, I, O, grid_size=G, spline_order=k, standalone_scale=standalone,
                             dtype=dtype)
    if key[0] == "kan_conv2d":
        _, I, O, kh, kw, sh, sw, ph, pw, dh, dw, G, k, standalone, dtype = key
        return KanConv2dPlan(ctx, I, O, (kh, kw), stride=(sh, sw), padding=(ph, pw),
                             dilation=(dh, dw), grid_size=G, spline_order=k,
                             standalone_scale=standalone, dtype=dtype)
    cell, I, H, L, batch_first, bidirectional, dropout, gamma, dtype = key
    return RnnPlan(ctx, cell, I, H, num_layers=L, batch_first=batch_first,
                   bidirectional=bidirectional, dropout=dropout, gamma=gamma, dtype=dtype)


def _plan(key, device):
    """The calling thread's plan for descriptor `key` on `device` (a torch.device): an RnnPlan,
    a SkLinearPlan for a key ("sklinear", in, out, L, k, bias, kf_dtype), a KanLinearPlan for
    a key ("kan_linear", in, out, grid_size, spline_order, standalone_scale, kf_dtype), or a
    KanConv2dPlan for a key ("kan_conv2d", in_channels, out_channels, kh, kw, sh, sw, ph, pw, dh,
    dw, grid_size, spline_order, standalone_scale, kf_dtype)."""
    cache = getattr(_tls, "plans", None)
    if cache is None:
        cache = _tls.plans = {}
    full = (device.type, device.index, key)
    plan = cache.get(full)
    if plan is not None and device.type == "cpu":
        return plan  # the thread's CPU context never changes; CUDA: its stream is set below
    ctx = _context(device)
    if plan is None or plan.ctx is not ctx:
        plan = cache[full] = _make_plan(ctx, key)
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
        plan.forward(x, weights, y if x.dim() == 3 else None, h0=h0, hn=hn, lengths=lengths,
                     training=training, dropout_seed=seed, dropout_offset=0, workspace=workspace,
                     reserve=reserve)
        ctx.key = key
        ctx.seed = seed
        # The reserve is a saved tensor: it lives as long as the graph (a second backward through
        # a retained graph reads it again; kf_rnn_backward only reads it) and goes with it.
        ctx.save_for_backward(x, h0, lengths, reserve, *weights)
        return y, hn

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dhn):
        x, h0, lengths, reserve, *weights = ctx.saved_tensors
        with _device_guard(x.device):
            return _RnnFunction._backward(ctx, dy, dhn, x, h0, lengths, reserve, weights)

    @staticmethod
    def _backward(ctx, dy, dhn, x, h0, lengths, reserve, weights):
        if reserve is None:  # only rnn_function(training=False, ...) on inputs requiring grad
            raise RuntimeError("kfuse: backward through a recurrent forward that ran with "
                               "training=False (inference mode writes no reserve)")
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
        plan.backward(x, weights, reserve, h0=h0, lengths=lengths, dy=dy, dhn=dhn, dx=dx,
                      dh0=dh0, dweights=dws if any_dw else None, dropout_seed=ctx.seed,
                      dropout_offset=0, workspace=workspace)
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
                float(dropout), float(getattr(self, "gamma", 0.01)), dtype_code(dtype))

    def _check_descriptor(self, dtype):
        # Construction-time checks are the library's: make (and cache) the plan on the CPU.
        _plan(self._key(dtype, self.dropout), torch.device("cpu"))

    def _canonical_weights(self):
        """The library's weights in its canonical order: the module's parameters, and zeros for
        the biases of a GRU(bias=False) (the cell with zero biases is the cell without them;
        their gradients are not asked for)."""
        plan = _plan(self._key(self._param_dtype(), 0.0), torch.device("cpu"))
        out = []
        for name in plan.weight_names:
            # by attribute, so that a parametrization (torch.nn.utils.parametrize) or anything
            # else that took a weight's name over gives its tensor
            t = self._weight(name)
            out.append(t if t is not None else self._zero_bias(name))
        return out

    def _weight(self, name):
        path, _, leaf = name.rpartition(".")
        return getattr(self.get_submodule(path) if path else self, leaf, None)

    def _zero_bias(self, name):
        w = self._weight(name.replace("bias_", "weight_"))  # its layer's weight
        return torch.zeros(w.shape[0], dtype=w.dtype, device=w.device)

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
    initialisation; same seed gives the same weights). With bias=False, as in torch, there are
    no bias parameters; the library runs the cell with zero biases."""

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
                if not bias:  # torch.nn.GRU(bias=False) registers the weights only
                    names, shapes = names[:2], shapes[:2]
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


# ---- SKLinear (Panther) ------------------------------------------------------------------------

def _workspace(plan, device, *dims):
    """A workspace tensor from torch's caching allocator on CUDA (stream-ordered with the rest of
    the program); None on the CPU, where the context's arena serves. `dims`: the arguments of
    plan.workspace_size (N rows; for KANConv2d batch, height, width)."""
    if device.type != "cuda":
        return None
    nbytes = plan.workspace_size(*dims)
    return torch.empty(nbytes, dtype=torch.uint8, device=device) if nbytes else None


def _empty_batch(plan, x):
    """x [..., in] with no rows: the library takes N >= 1, torch.nn.Linear and Panther take an
    empty batch (y is then empty; the weight gradients are zero)."""
    return x.dim() >= 2 and x.shape[-1] == plan.in_features and x.numel() == 0


def _check_devices(x, S1s, S2s, U1s, U2s, bias):
    """The one check made here: a kfuse context reads memory of its own device only."""
    ts = (("S1s", S1s), ("S2s", S2s), ("U1s", U1s), ("U2s", U2s), ("bias", bias))
    if not x.is_cuda and not any(t is not None and t.is_cuda for _, t in ts):
        return  # all host memory (or meta, whose absent data the library reports)
    for name, t in ts:
        if t is not None and t.device != x.device:
            raise RuntimeError("kfuse SKLinear: expected all tensors to be on the same device, "
                               "but input is on %s and %s on %s" % (x.device, name, t.device))


def _sk_forward(key, x, S1s, S2s, U1s, U2s, bias):
    """y from x through kf_sklinear_forward (no autograd)."""
    _check_devices(x, S1s, S2s, U1s, U2s, bias)
    device = x.device
    cuda = device.type == "cuda"
    with _device_guard(device) if cuda else contextlib.nullcontext():
        plan = _plan(key, device)
        if x.dim() == 0:  # the library reports it
            plan.forward(x, S1s, S2s, U1s, U2s, None, bias=bias)
        y = torch.empty(x.shape[:-1] + (plan.out_features,), dtype=x.dtype, device=device)
        N = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if N > 0 or not _empty_batch(plan, x):
            workspace = _workspace(plan, device, N) if cuda else None
            plan.forward(x, S1s, S2s, U1s, U2s, y, bias=bias, workspace=workspace)
    return y


class _SKLinearFunction(torch.autograd.Function):
    # inputs: key, x [..., in], S1s, S2s, U1s, U2s, bias (or None)   output: y [..., out]

    @staticmethod
    def forward(ctx, key, x, S1s, S2s, U1s, U2s, bias):
        y = _sk_forward(key, x, S1s, S2s, U1s, U2s, bias)
        ctx.key = key
        ctx.has_bias = bias is not None
        ctx.save_for_backward(x, S1s, S2s, U1s, U2s)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, S1s, S2s, U1s, U2s = ctx.saved_tensors
        need = ctx.needs_input_grad  # key, x, S1s, S2s, U1s, U2s, bias
        dx = torch.empty_like(x) if need[1] else None
        dS1s = torch.empty_like(S1s) if need[2] else None
        dS2s = torch.empty_like(S2s) if need[3] else None
        dbias = None
        if ctx.has_bias and need[6]:
            dbias = torch.empty(S2s.shape[-1], dtype=S2s.dtype, device=S2s.device)
        if dx is None and dS1s is None and dS2s is None and dbias is None:
            return None, None, None, None, None, None, None
        device = x.device
        cuda = device.type == "cuda"
        with _device_guard(device) if cuda else contextlib.nullcontext():
            plan = _plan(ctx.key, device)
            N = x.numel() // x.shape[-1] if x.shape[-1] else 0
            if N == 0:  # an empty batch (forward checked its shape): nothing flows back
                for t in (dS1s, dS2s, dbias):
                    if t is not None:
                        t.zero_()
                return None, dx, dS1s, dS2s, None, None, dbias
            workspace = _workspace(plan, device, N) if cuda else None
            plan.backward(x, S1s, S2s, U1s, U2s, dy.contiguous(), dx=dx, dS1s=dS1s, dS2s=dS2s,
                          dbias=dbias, workspace=workspace)
        return None, dx, dS1s, dS2s, None, None, dbias


def sklinear_function(key, x, S1s, S2s, U1s, U2s, bias=None):
    """Differentiable kfuse SKLinear call: y [..., out] from x [..., in] (contiguous tensors).
    `key` = ("sklinear", in, out, num_terms, low_rank, has_bias, kf_dtype). Gradients flow to x,
    S1s, S2s and bias; U1s and U2s get none (fixed sketches)."""
    return _SKLinearFunction.apply(key, x, S1s, S2s, U1s, U2s, bias)


class SKLinear(nn.Module):
    """Drop-in for panther.nn.SKLinear: SKLinear(in_features, out_features, num_terms, low_rank,
    W_init=None, bias=True, dtype=None, device=None).

    Same parameters and buffers as Panther's (learnable S1s [L, in, k], S2s [L, k, out] and bias
    [out] (or None); fixed sketch buffers U1s [L, k, out] and U2s [L, in, k]), so
    load_state_dict(strict=True) works both ways; same warning when the sketch has more
    parameters than the dense layer (2Lk(in+out) > in*out); same forward: x [..., in] with any
    leading dims -> [..., out], a 1-D x gives a 1-D y:

        y = 1/(2L) sum_i [ (x S1s[i]) U1s[i] + (x U2s[i]) S2s[i] ] + bias

    computed by kfuse as two GEMMs through the rank-2Lk bottleneck. Initialisation is Panther's
    (sign sketches with entries +-1/sqrt(k); S1s[i] = W U1s[i]^T, S2s[i] = U2s[i]^T W with
    W = W_init^T or Kaiming-uniform; bias U(-1/sqrt(out), 1/sqrt(out))) drawn by the library from
    a seed taken from torch's default generator, so torch.manual_seed() makes it repeatable (the
    values differ from Panther's own draws). float32 only: another dtype raises
    kfuse.Unsupported at construction. Panther's tensor-core warnings are not raised: they
    describe a limit of Panther's CUDA kernels that kfuse does not have."""

    __constants__ = ["in_features", "out_features", "num_terms", "low_rank"]
    WARNING_MSG_FC = (
        "The sketching layer uses more parameters than a fully connected layer. "
        "Consider reducing 'num_terms' or 'low_rank' for efficiency."
    )

    def __init__(self, in_features, out_features, num_terms, low_rank, W_init=None, bias=True,
                 dtype=None, device=None):
        factory_kwargs = {"dtype": dtype, "device": device}
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.num_terms = num_terms
        self.low_rank = low_rank
        self._keys = {}  # (parameter dtype, has bias) -> plan key
        dtype = dtype if dtype is not None else torch.get_default_dtype()
        # Descriptor checks are the library's (made and cached on the CPU context).
        plan = _plan(self._key(dtype, bias), torch.device("cpu"))
        if plan.param_ratio > 1.0:
            warnings.warn(self.WARNING_MSG_FC, category=UserWarning, stacklevel=2)
        L, k = num_terms, low_rank
        # Panther registers the buffers first, then S1s, S2s, bias.
        self.register_buffer("U1s", torch.empty((L, k, out_features), **factory_kwargs))
        self.register_buffer("U2s", torch.empty((L, in_features, k), **factory_kwargs))
        self.S1s = nn.Parameter(torch.empty((L, in_features, k), **factory_kwargs))
        self.S2s = nn.Parameter(torch.empty((L, k, out_features), **factory_kwargs))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, **factory_kwargs))
        else:
            self.register_parameter("bias", None)
        self._init_parameters(W_init)

    def _key(self, dtype, bias=None):
        if bias is None:
            bias = self.bias is not None
        return ("sklinear", self.in_features, self.out_features, self.num_terms, self.low_rank,
                bool(bias), dtype_code(dtype))

    @torch.no_grad()
    def _init_parameters(self, W_init=None):
        seed = int(torch.randint(0, 2 ** 62, (1,), dtype=torch.int64).item())
        device = self.S1s.device
        if device.type == "meta":
            return  # nothing to fill
        if W_init is not None:
            W_init = W_init.detach().to(device=device, dtype=self.S1s.dtype).contiguous()
        with _device_guard(device):
            plan = _plan(self._key(self.S1s.dtype), device)
            plan.init_params(seed, self.S1s, self.S2s, self.U1s, self.U2s, bias=self.bias,
                             W_init=W_init)

    def _tensor(self, name):
        # _parameters / _buffers first (nn.Module.__getattr__ costs a microsecond a call at this
        # layer's small shapes); anything that took the name over (parametrizations, hooks that
        # set an attribute) through getattr.
        t = self._parameters.get(name)
        if t is None:
            t = self._buffers.get(name)
        return t if t is not None else getattr(self, name)

    def forward(self, h_in):
        # x [..., in] -> y [..., out]; the library takes up to KF_MAX_DIMS dims as they are
        # (a 1-D x is one row and gives a 1-D y, as in Panther), more are flattened here.
        x = h_in
        lead = None
        if x.dim() > lib.KF_MAX_DIMS and x.shape[-1] > 0:
            lead = x.shape[:-1]
            x = x.reshape(-1, x.shape[-1])  # the library checks the last dim against in_features
        x = x.contiguous()
        S1s, S2s = self._tensor("S1s").contiguous(), self._tensor("S2s").contiguous()
        U1s, U2s = self._tensor("U1s").contiguous(), self._tensor("U2s").contiguous()
        bias = self._tensor("bias")
        if bias is not None:
            bias = bias.contiguous()
        kk = (S1s.dtype, bias is not None)
        key = self._keys.get(kk)
        if key is None:
            key = self._keys[kk] = self._key(*kk)
        if torch.is_grad_enabled() and (x.requires_grad or S1s.requires_grad
                                        or S2s.requires_grad
                                        or (bias is not None and bias.requires_grad)):
            y = _SKLinearFunction.apply(key, x, S1s, S2s, U1s, U2s, bias)
        else:  # nothing to differentiate: no autograd node
            y = _sk_forward(key, x, S1s, S2s, U1s, U2s, bias)
        return y if lead is None else y.view(*lead, self.out_features)

    def extra_repr(self):
        return "in_features={}, out_features={}, num_terms={}, low_rank={}, bias={}".format(
            self.in_features, self.out_features, self.num_terms, self.low_rank,
            self.bias is not None)


# ---- KANLinear (efficient-kan) and KANConv2d (unfold + KANLinear) ------------------------------

_KAN_TENSORS = ("grid", "base_weight", "spline_weight", "spline_scaler")


_KAN_LAYER_NAMES = {"kan_linear": "KANLinear", "kan_conv2d": "KANConv2d"}


def _kan_check_devices(key, x, tensors):
    """The one check made here: a kfuse context reads memory of its own device only."""
    if not x.is_cuda and not any(t is not None and t.is_cuda for t in tensors):
        return  # all host memory (or meta, whose absent data the library reports)
    for name, t in zip(_KAN_TENSORS, tensors):
        if t is not None and t.device != x.device:
            raise RuntimeError("kfuse %s: expected all tensors to be on the same device, but "
                               "input is on %s and %s on %s" % (
                                   _KAN_LAYER_NAMES[key[0]], x.device, name, t.device))


def _kan_forward(key, x, grid, base_weight, spline_weight, spline_scaler):
    """y from x through kf_kan_linear_forward (x [..., in] -> y [..., out]) or
    kf_kan_conv2d_forward (x [B, C_in, H, W] or [C_in, H, W] -> y [B, C_out, Ho, Wo] or
    [C_out, Ho, Wo]), per the plan `key` names (no autograd)."""
    _kan_check_devices(key, x, (grid, base_weight, spline_weight, spline_scaler))
    device = x.device
    cuda = device.type == "cuda"
    with _device_guard(device) if cuda else contextlib.nullcontext():
        plan = _plan(key, device)
        y_shape = plan.output_shape(x.shape)
        if y_shape is None:  # no output for such an x (its rank or size): the library reports it
            plan.forward(x, grid, base_weight, spline_weight, None, spline_scaler=spline_scaler)
            raise ValueError("kfuse %s: no output shape for x of shape %s" % (
                _KAN_LAYER_NAMES[key[0]], tuple(x.shape)))  # pragma: no cover
        y = torch.empty(y_shape, dtype=x.dtype, device=device)
        dims = plan.work_dims(x.shape)
        if dims is not None:  # None: an empty batch, for which y is empty too
            plan.forward(x, grid, base_weight, spline_weight, y, spline_scaler=spline_scaler,
                         workspace=_workspace(plan, device, *dims))
    return y


class _KANFunction(torch.autograd.Function):
    # inputs: key, x, grid, base_weight, spline_weight, spline_scaler (or None)   output: y
    # (KANLinear: x [..., in] -> y [..., out]; KANConv2d: x [B, C_in, H, W] -> y [B, C_out, Ho, Wo]
    # or unbatched; the plan `key` names which)

    @staticmethod
    def forward(ctx, key, x, grid, base_weight, spline_weight, spline_scaler):
        y = _kan_forward(key, x, grid, base_weight, spline_weight, spline_scaler)
        ctx.key = key
        ctx.save_for_backward(x, grid, base_weight, spline_weight, spline_scaler)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, grid, base_weight, spline_weight, spline_scaler = ctx.saved_tensors
        need = ctx.needs_input_grad  # key, x, grid, base_weight, spline_weight, spline_scaler
        dx = torch.empty_like(x) if need[1] else None
        dbw = torch.empty_like(base_weight) if need[3] else None
        dsw = torch.empty_like(spline_weight) if need[4] else None
        dss = torch.empty_like(spline_scaler) if (spline_scaler is not None and need[5]) else None
        if dx is None and dbw is None and dsw is None and dss is None:
            return None, None, None, None, None, None
        device = x.device
        cuda = device.type == "cuda"
        with _device_guard(device) if cuda else contextlib.nullcontext():
            plan = _plan(ctx.key, device)
            dims = plan.work_dims(x.shape)
            if dims is None:  # an empty batch (forward checked its shape): nothing flows back
                for t in (dbw, dsw, dss):
                    if t is not None:
                        t.zero_()
                return None, dx, None, dbw, dsw, dss
            workspace = _workspace(plan, device, *dims)
            plan.backward(x, grid, base_weight, spline_weight, dy.contiguous(),
                          spline_scaler=spline_scaler, dx=dx, dbase_weight=dbw,
                          dspline_weight=dsw, dspline_scaler=dss, workspace=workspace)
        return None, dx, None, dbw, dsw, dss


def kan_linear_function(key, x, grid, base_weight, spline_weight, spline_scaler=None):
    """Differentiable kfuse KANLinear call: y [..., out] from x [..., in] (contiguous tensors).
    `key` = ("kan_linear", in, out, grid_size, spline_order, standalone_scale, kf_dtype).
    Gradients flow to x, base_weight, spline_weight and spline_scaler; the grid gets none."""
    return _KANFunction.apply(key, x, grid, base_weight, spline_weight, spline_scaler)


def kan_conv2d_function(key, x, grid, base_weight, spline_weight, spline_scaler=None):
    """Differentiable kfuse KANConv2d call: y [B, C_out, Ho, Wo] from x [B, C_in, H, W] (or the
    unbatched 3-D forms; contiguous tensors). `key` = ("kan_conv2d", in_channels, out_channels,
    kh, kw, sh, sw, ph, pw, dh, dw, grid_size, spline_order, standalone_scale, kf_dtype).
    Gradients flow to x, base_weight, spline_weight and spline_scaler; the grid gets none."""
    return _KANFunction.apply(key, x, grid, base_weight, spline_weight, spline_scaler)


def _kan_bases(x, grid, k):
    """B-spline bases [N, in, G + k] of order k of x [N, in] on the knots grid [in, nk], in x's
    dtype, with the library's conventions (kfuse.h): half-open knot intervals, 0 outside the
    grid (x is first moved to the last knot there, so every term stays finite), and a term over
    a knot span narrower than FLT_MIN counts as 0 (efficient-kan divides 0 by 0 there and gets
    NaN, which then breaks its least-squares refit). Materialises the bases: for the rare calls
    (initialisation, curve2coeff, b_splines), never for forward, backward or update_grid."""
    x = x.unsqueeze(-1)  # [N, in, 1]
    outside = (x < grid[:, :1]) | (x >= grid[:, -1:])
    x = torch.where(outside, grid[:, -1:].expand_as(x), x)
    bases = ((x >= grid[:, :-1]) & (x < grid[:, 1:])).to(x.dtype)
    tiny = torch.finfo(torch.float32).tiny
    for p in range(1, k + 1):
        w1 = grid[:, p:-1] - grid[:, :-(p + 1)]
        w2 = grid[:, p + 1:] - grid[:, 1:-p]
        inv1 = torch.where(w1 >= tiny, 1.0 / torch.where(w1 >= tiny, w1, torch.ones_like(w1)),
                           torch.zeros_like(w1))
        inv2 = torch.where(w2 >= tiny, 1.0 / torch.where(w2 >= tiny, w2, torch.ones_like(w2)),
                           torch.zeros_like(w2))
        bases = ((x - grid[:, :-(p + 1)]) * inv1 * bases[:, :, :-1]
                 + (grid[:, p + 1:] - x) * inv2 * bases[:, :, 1:])
    return bases


class _KANLayer(nn.Module):
    """What KANLinear and KANConv2d share: efficient-kan's KANLinear over `in_features` features
    (its tensors, initialisation, b_splines, curve2coeff, scaled_spline_weight,
    regularization_loss) and the calls into the library (forward, backward, update_grid). A subclass gives
    `plan_shape`, the head of its plan key (("kan_linear", in, out) or ("kan_conv2d", ...)),
    and its forward."""

    def __init__(self, plan_shape, in_features, out_features, grid_size, spline_order,
                 scale_noise, scale_base, scale_spline, enable_standalone_scale_spline,
                 base_activation, grid_eps, grid_range, device, dtype):
        factory_kwargs = {"device": device, "dtype": dtype}
        super().__init__()
        if base_activation is not nn.SiLU:
            raise ValueError("kfuse.torch.%s: base_activation must be torch.nn.SiLU (the only "
                             "activation the kfuse library implements), got %r"
                             % (type(self).__name__, base_activation))
        self.in_features = in_features
        self.out_features = out_features
        self.grid_size = grid_size
        self.spline_order = spline_order
        self._plan_shape = tuple(plan_shape)
        self._keys = {}  # parameter dtype -> plan key
        self.enable_standalone_scale_spline = enable_standalone_scale_spline
        pdtype = dtype if dtype is not None else torch.get_default_dtype()
        # Descriptor checks are the library's (made and cached on the CPU context).
        _plan(self._key(pdtype), torch.device("cpu"))
        nk = grid_size + 2 * spline_order + 1
        self.register_buffer("grid", torch.empty((in_features, nk), **factory_kwargs))
        self._init_grid(grid_range[0], grid_range[1])
        self.base_weight = nn.Parameter(torch.empty((out_features, in_features),
                                                    **factory_kwargs))
        self.spline_weight = nn.Parameter(torch.empty(
            (out_features, in_features, grid_size + spline_order), **factory_kwargs))
        if enable_standalone_scale_spline:
            self.spline_scaler = nn.Parameter(torch.empty((out_features, in_features),
                                                          **factory_kwargs))
        self.scale_noise = scale_noise
        self.scale_base = scale_base
        self.scale_spline = scale_spline
        self.base_activation = base_activation()
        self.grid_eps = grid_eps
        self.reset_parameters()

    def _key(self, dtype):
        return self._plan_shape + (self.grid_size, self.spline_order,
                                   bool(self.enable_standalone_scale_spline),
                                   dtype_code(dtype))

    @torch.no_grad()
    def _init_grid(self, lo, hi):
        grid = self.grid
        if grid.device.type == "meta":
            return  # nothing to fill
        with _device_guard(grid.device):
            plan = _plan(self._key(grid.dtype), grid.device)
            plan.uniform_grid(lo, hi, grid)

    def reset_parameters(self):
        """efficient-kan's initialisation: base_weight kaiming_uniform_(a=sqrt(5)*scale_base);
        spline_weight the least-squares coefficients of noise U(-1/2, 1/2) * scale_noise / G at
        the G + 1 grid points (times scale_spline without a standalone scaler); spline_scaler
        kaiming_uniform_(a=sqrt(5)*scale_spline). The draws come from torch's default generator
        in efficient-kan's order (the noise on the CPU, as efficient-kan draws it)."""
        nn.init.kaiming_uniform_(self.base_weight, a=math.sqrt(5) * self.scale_base)
        with torch.no_grad():
            G, k = self.grid_size, self.spline_order
            noise = ((torch.rand(G + 1, self.in_features, self.out_features) - 1 / 2)
                     * self.scale_noise / G)
            if self.spline_weight.device.type != "meta":
                # the G + 1 knots of grid_range (efficient-kan's grid.T[k:-k], which is empty
                # for k = 0; here all G + 1 of them for every k)
                points = self.grid.T[k:k + G + 1]
                coeff = self.curve2coeff(points, noise.to(device=points.device,
                                                          dtype=self.spline_weight.dtype))
                scale = self.scale_spline if not self.enable_standalone_scale_spline else 1.0
                self.spline_weight.data.copy_(scale * coeff)
            if self.enable_standalone_scale_spline:
                nn.init.kaiming_uniform_(self.spline_scaler, a=math.sqrt(5) * self.scale_spline)

    def _check_x(self, x, what):
        if x.dim() != 2 or x.size(1) != self.in_features:
            raise ValueError("kfuse.torch.%s.%s: x must be [batch, in_features=%d], got %s"
                             % (type(self).__name__, what, self.in_features, tuple(x.shape)))

    def b_splines(self, x):
        """efficient-kan's b_splines: the bases [batch, in, G + k] of x [batch, in] on the
        current grid (materialised; computed in float64 with kfuse's conventions, returned in
        x's dtype)."""
        self._check_x(x, "b_splines")
        return _kan_bases(x.double(), self.grid.double(), self.spline_order).to(x.dtype)

    def curve2coeff(self, x, y):
        """efficient-kan's curve2coeff: coefficients [out, in, G + k] whose splines on the
        current grid fit y [batch, in, out] at x [batch, in] in the least-squares sense, per
        feature. Returned in y's dtype on y's device.

        The solve differs from efficient-kan's on purpose: its torch.linalg.lstsq on float32
        bases (default driver, gelsy on CPU) returns NaN or fails (LAPACK's SGELSY error,
        efficient-kan issue #20) when the bases hold NaN (0/0 over repeated knots, as after
        update_grid with grid_eps=0 on a batch with repeated values), and is poorly conditioned
        in float32 when knots are a hair apart. Here the bases are computed in float64 with
        kfuse's conventions (a zero-width span gives 0, never NaN) and the systems are solved on
        the CPU in float64 by torch.linalg.lstsq(driver="gelsd"): an SVD-based solver that
        handles rank-deficient systems (a basis no sample touches, fewer samples than
        coefficients) by returning the minimum-norm solution, as gelsy does where gelsy works."""
        self._check_x(x, "curve2coeff")
        if tuple(y.shape) != (x.size(0), self.in_features, self.out_features):
            raise ValueError("kfuse.torch.KANLinear.curve2coeff: y must be [batch, in, out] = "
                             "%s, got %s" % ((x.size(0), self.in_features, self.out_features),
                                             tuple(y.shape)))
        cpu = torch.device("cpu")
        A = _kan_bases(x.to(device=cpu, dtype=torch.float64),
                       self.grid.to(device=cpu, dtype=torch.float64), self.spline_order)
        A = A.transpose(0, 1)  # [in, batch, G + k]
        B = y.to(device=cpu, dtype=torch.float64).transpose(0, 1)  # [in, batch, out]
        solution = torch.linalg.lstsq(A, B, driver="gelsd").solution  # [in, G + k, out]
        return solution.permute(2, 0, 1).contiguous().to(device=y.device, dtype=y.dtype)

    @property
    def scaled_spline_weight(self):
        """spline_weight * spline_scaler[..., None] (spline_weight without a standalone scaler)."""
        return self.spline_weight * (self.spline_scaler.unsqueeze(-1)
                                     if self.enable_standalone_scale_spline else 1.0)

    def _run(self, x):
        """y from a contiguous x through the library: an autograd node when something needs a
        gradient, else the forward call alone."""
        grid = self.grid.contiguous()
        bw = self.base_weight.contiguous()
        sw = self.spline_weight.contiguous()
        ss = self.spline_scaler.contiguous() if self.enable_standalone_scale_spline else None
        key = self._keys.get(sw.dtype)
        if key is None:
            key = self._keys[sw.dtype] = self._key(sw.dtype)
        if torch.is_grad_enabled() and (x.requires_grad or bw.requires_grad or sw.requires_grad
                                        or (ss is not None and ss.requires_grad)):
            return _KANFunction.apply(key, x, grid, bw, sw, ss)
        return _kan_forward(key, x, grid, bw, sw, ss)  # nothing to differentiate: no node

    @torch.no_grad()
    def update_grid(self, x, margin=0.01):
        """efficient-kan's grid update, by the library (kf_kan_linear_update_grid or
        kf_kan_conv2d_update_grid, the one implementation every front end shares): per feature,
        new knots grid_eps * uniform + (1 - grid_eps) * quantiles of the samples (G + 1 of them,
        the uniform ones on [min - margin, max + margin]) extended by k uniform steps each side,
        formed in float32 exactly as efficient-kan forms them with torch; then spline_weight is
        refitted in float64 (minimum-norm least squares by SVD, which does not fail where
        efficient-kan's float32 lstsq does) so that the splines on the new knots reproduce, on
        the samples, the splines on the old knots. The samples are the rows of x [batch, in]
        for KANLinear, the patches of x for KANConv2d (see there).

        One deliberate difference: efficient-kan refits spline_weight to the output of the
        *scaled* weights (spline_weight * spline_scaler) and then multiplies by spline_scaler
        again in forward, so with enable_standalone_scale_spline=True its update changes the
        layer's output by that factor. Here the fit targets the splines of spline_weight itself,
        so the output on x is preserved in both modes; without a standalone scaler this is
        exactly efficient-kan's update. Non-finite values in x are an InvalidArgument (a
        ValueError) naming the first one; nothing is written then."""
        self._check_update_x(x)
        x = x.detach().to(dtype=self.spline_weight.dtype).contiguous()
        _kan_check_devices(self._key(self.spline_weight.dtype), x,
                           (self.grid, None, self.spline_weight, None))
        grid, sw = self.grid, self.spline_weight.data
        # the library writes in place; a non-contiguous tensor gets a contiguous stand-in
        g = grid if grid.is_contiguous() else grid.contiguous()
        w = sw if sw.is_contiguous() else sw.contiguous()
        device = x.device
        with _device_guard(device) if device.type == "cuda" else contextlib.nullcontext():
            plan = _plan(self._key(w.dtype), device)
            plan.update_grid(x, g, w, margin=margin,
                             grid_eps=self.grid_eps)
        if g is not grid:
            grid.copy_(g)
        if w is not sw:
            sw.copy_(w)

    def _check_update_x(self, x):
        self._check_x(x, "update_grid")

    def regularization_loss(self, regularize_activation=1.0, regularize_entropy=1.0):
        """efficient-kan's regularisation: with l1 = mean |spline_weight| over the coefficients
        [out, in], regularize_activation * sum(l1) + regularize_entropy * entropy(l1 / sum(l1))."""
        l1_fake = self.spline_weight.abs().mean(-1)
        regularization_loss_activation = l1_fake.sum()
        p = l1_fake / regularization_loss_activation
        regularization_loss_entropy = -torch.sum(p * p.log())
        return (regularize_activation * regularization_loss_activation
                + regularize_entropy * regularization_loss_entropy)


class KANLinear(_KANLayer):
    """Drop-in for efficient_kan.KANLinear: KANLinear(in_features, out_features, grid_size=5,
    spline_order=3, scale_noise=0.1, scale_base=1.0, scale_spline=1.0,
    enable_standalone_scale_spline=True, base_activation=torch.nn.SiLU, grid_eps=0.02,
    grid_range=[-1, 1], device=None, dtype=None).

    Same tensors as efficient-kan's (Parameters base_weight [out, in], spline_weight
    [out, in, G + k] and, with enable_standalone_scale_spline, spline_scaler [out, in]; the
    buffer grid [in, G + 2k + 1]), so load_state_dict(strict=True) works both ways; same
    forward: x [..., in] with any leading dims -> [..., out] (a 1-D x gives a 1-D y):

        y = SiLU(x) base_weight^T + B(x) (spline_weight * spline_scaler[..., None])^T

    computed by kfuse with the B-spline bases built inside the product, never stored for the
    batch; backward gives the gradients of x, base_weight, spline_weight and spline_scaler (none
    for the grid). Where efficient-kan computes 0/0 or inf*0 (repeated knots, |x| near 1e38)
    kfuse gives the mathematical value (kfuse.h). Only SiLU is implemented as base_activation
    (another raises ValueError); float32 only (another dtype raises kfuse.Unsupported).

    The initial grid comes from kf_kan_linear_uniform_grid (the same bits as efficient-kan's
    buffer); reset_parameters draws as efficient-kan does, from torch's default generator in the
    same order (kaiming_uniform_ base_weight, the noise, kaiming_uniform_ spline_scaler), so
    torch.manual_seed() gives efficient-kan's base_weight and spline_scaler exactly and its
    spline_weight up to the least-squares solver. update_grid(x, margin=0.01),
    curve2coeff(x, y), b_splines(x), scaled_spline_weight and regularization_loss(...) are
    efficient-kan's, computed in torch (see update_grid and curve2coeff for the two places
    where they deliberately differ)."""

    def __init__(self, in_features, out_features, grid_size=5, spline_order=3, scale_noise=0.1,
                 scale_base=1.0, scale_spline=1.0, enable_standalone_scale_spline=True,
                 base_activation=torch.nn.SiLU, grid_eps=0.02, grid_range=[-1, 1],
                 device=None, dtype=None):
        super().__init__(("kan_linear", in_features, out_features), in_features, out_features,
                         grid_size, spline_order, scale_noise, scale_base, scale_spline,
                         enable_standalone_scale_spline, base_activation, grid_eps, grid_range,
                         device, dtype)

    def forward(self, x):
        # x [..., in] -> y [..., out]: flattened to [N, in] (efficient-kan's view(-1, in)); a 1-D
        # x is one row and gives a 1-D y, as in efficient-kan. The library checks x's last dim.
        lead = None
        if x.dim() >= 2 and x.shape[-1] > 0:
            lead = x.shape[:-1]
            x = x.reshape(-1, x.shape[-1])
        y = self._run(x.contiguous())
        return y if lead is None else y.view(*lead, self.out_features)

    def extra_repr(self):
        return ("in_features={}, out_features={}, grid_size={}, spline_order={}, "
                "enable_standalone_scale_spline={}".format(
                    self.in_features, self.out_features, self.grid_size, self.spline_order,
                    self.enable_standalone_scale_spline))


class KANConv2d(_KANLayer):
    """KANConv2d(in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
    grid_size=5, spline_order=3, scale_noise=0.1, scale_base=1.0, scale_spline=1.0,
    enable_standalone_scale_spline=True, base_activation=torch.nn.SiLU, grid_eps=0.02,
    grid_range=[-1, 1], device=None, dtype=None): a 2-D convolution whose per-patch map is
    efficient-kan's KANLinear.

    The reference is ``F.unfold + efficient_kan.KANLinear(F, out)`` with F = in_channels * kh * kw:

        patches = torch.nn.functional.unfold(x, kernel_size, dilation, padding, stride)
        y = KANLinear(F, out_channels)(patches.transpose(1, 2)).transpose(1, 2)
        y = y.view(B, out_channels, Ho, Wo)

    and this module's parameters are that KANLinear's, at top level and under its names:
    Parameters base_weight [out, F], spline_weight [out, F, G + k], spline_scaler [out, F] (with
    enable_standalone_scale_spline) and the buffer grid [F, G + 2k + 1], in unfold's feature
    order (c * kh + i) * kw + j; so load_state_dict(strict=True) works both ways with a KANLinear
    (efficient-kan's or kfuse.torch.KANLinear) of F inputs. The initialisation is that KANLinear's
    (KANLinear(F, out_channels) after the same torch.manual_seed() gives the same tensors, drawn in
    efficient-kan's order), and so are b_splines, curve2coeff (on patch rows [N, F]),
    scaled_spline_weight and regularization_loss; update_grid(x) takes images and fits the patches
    of x (see there). in_features (F) and out_features (out_channels) are set as on a KANLinear;
    in_channels, out_channels, kernel_size, stride, padding and dilation (pairs) as on
    torch.nn.Conv2d.

    kernel_size, stride, padding and dilation are ints or (h, w) pairs as in torch.nn.Conv2d;
    padding is zeros (padded pixels enter the KANLinear as 0, as unfold gives them); string
    paddings ('same', 'valid'), groups, bias and padding_mode are not part of this layer. forward:
    x [B, in_channels, H, W] -> [B, out_channels, Ho, Wo], or [in_channels, H, W] ->
    [out_channels, Ho, Wo], with Ho = (H + 2 ph - dh (kh - 1) - 1) // sh + 1 (Wo likewise), as
    an implicit GEMM in kfuse (kf_kan_conv2d_forward/backward): neither the patches nor their
    bases are stored for the batch. Backward gives the gradients of x, base_weight,
    spline_weight and spline_scaler (none for the grid). Only SiLU is implemented as
    base_activation; float32 only; argument checks (a wrong channel count, an image smaller than
    the kernel's reach, a bad descriptor) are the library's."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 grid_size=5, spline_order=3, scale_noise=0.1, scale_base=1.0, scale_spline=1.0,
                 enable_standalone_scale_spline=True, base_activation=torch.nn.SiLU,
                 grid_eps=0.02, grid_range=[-1, 1], device=None, dtype=None):
        owner = "kfuse.torch.KANConv2d"
        kh, kw = _pair(kernel_size, "kernel_size", owner)
        sh, sw = _pair(stride, "stride", owner)
        ph, pw = _pair(padding, "padding", owner)
        dh, dw = _pair(dilation, "dilation", owner)
        n_features = int(in_channels) * kh * kw
        super().__init__(("kan_conv2d", int(in_channels), int(out_channels), kh, kw, sh, sw, ph,
                          pw, dh, dw), n_features, out_channels, grid_size, spline_order,
                         scale_noise, scale_base, scale_spline, enable_standalone_scale_spline,
                         base_activation, grid_eps, grid_range, device, dtype)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = (kh, kw)
        self.stride = (sh, sw)
        self.padding = (ph, pw)
        self.dilation = (dh, dw)

    def forward(self, x):
        return self._run(x.contiguous())

    def unfold(self, x):
        """The patches of images x [B, in_channels, H, W] (or [in_channels, H, W]) as KANLinear
        rows [B * Ho * Wo, F] (torch.nn.functional.unfold, transposed): what the reference's
        KANLinear sees, for b_splines and curve2coeff, which take rows. Materialised: forward,
        backward and update_grid do not use it (the library gathers the patches per tile)."""
        if x.dim() not in (3, 4) or x.shape[-3] != self.in_channels:
            raise ValueError("kfuse.torch.KANConv2d: x must be [batch, in_channels=%d, H, W] or "
                             "[in_channels=%d, H, W], got %s"
                             % (self.in_channels, self.in_channels, tuple(x.shape)))
        if x.dim() == 3:
            x = x.unsqueeze(0)
        p = torch.nn.functional.unfold(x, self.kernel_size, dilation=self.dilation,
                                       padding=self.padding, stride=self.stride)  # [B, F, L]
        return p.transpose(1, 2).reshape(-1, self.in_features)

    def _check_update_x(self, x):
        """update_grid takes images x [B, in_channels, H, W] (or [in_channels, H, W]); its samples
        are their patches, zero padding included, exactly what the reference's
        KANLinear.update_grid gets from F.unfold (the library gathers them; nothing is
        unfolded here). The library checks the shape."""

    def extra_repr(self):
        return ("{}, {}, kernel_size={}, stride={}, padding={}, dilation={}, grid_size={}, "
                "spline_order={}, enable_standalone_scale_spline={}".format(
                    self.in_channels, self.out_channels, self.kernel_size, self.stride,
                    self.padding, self.dilation, self.grid_size, self.spline_order,
                    self.enable_standalone_scale_spline))
