"""What every kfuse.torch layer family shares: the per-(device, thread, thread count) contexts and
plans, the workspace hand-off, and `Op`, one kfuse operator as PyTorch sees it.

Tensors go to the plans' methods as they are: the methods take their kf_tensor fields and hold
them until the C call returns (kfuse._lowlevel.tensor_values, the one conversion every front end
shares), so no data pointer is taken here and a temporary (dy.contiguous()) stays alive.

Operators. Each layer's forward and backward is an operator in the `kfuse` namespace
(torch.ops.kfuse.*): on torch >= 2.4 defined with torch.library (Library.define/impl for the CPU
and CUDA keys, register_fake for shapes, register_autograd), so torch.compile(fullgraph=True),
torch.export, torch.jit.trace and vmap see one opaque op with known output shapes. Eager calls
skip the dispatcher and run the same kernel through an autograd.Function built from the same
setup_context/backward pair (or the kernel alone when nothing needs a gradient): that is the whole
path on torch 1.13, whose torch.library cannot register Python autograd or fake kernels, and the
cheaper one on 2.x (benches/python_overhead.py measures both). Kernels never write their inputs and
return fresh tensors.
"""
import contextlib
import threading

import torch

from kfuse._lowlevel import RnnPlan, thread_context
from kfuse.kan import KanConv2dPlan, KanLinearPlan
from kfuse.sklinear import SkLinearPlan

# torch.library with register_fake and register_autograd: torch >= 2.4.
HAS_TORCH_LIBRARY = (hasattr(torch.library, "register_fake")
                     and hasattr(torch.library, "register_autograd"))

# ---- per-(device, thread, thread count) contexts and plans -------------------------------------

_tls = threading.local()


def _context(device, num_threads):
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        ctx = thread_context("cuda", index)
        stream = torch.cuda.current_stream(torch.device("cuda", index)).cuda_stream
        if ctx._stream != stream:
            ctx.set_stream(stream)
        return ctx
    # "cpu", or a device kind kfuse has no backend for: the library rejects it by name.
    return thread_context(device.type, device.index or 0, num_threads=num_threads)


def _make_plan(ctx, key):
    kind = key[0]
    if kind == "sklinear":
        _, I, O, L, k, bias, dtype, act, dropout = key
        return SkLinearPlan(ctx, I, O, L, k, bias=bias, dtype=dtype, activation=act,
                            dropout=dropout)
    if kind == "kan_linear":
        _, I, O, G, k, standalone, dtype = key
        return KanLinearPlan(ctx, I, O, grid_size=G, spline_order=k, standalone_scale=standalone,
                             dtype=dtype)
    if kind == "kan_conv2d":
        _, I, O, kh, kw, sh, sw, ph, pw, dh, dw, G, k, standalone, dtype = key
        return KanConv2dPlan(ctx, I, O, (kh, kw), stride=(sh, sw), padding=(ph, pw),
                             dilation=(dh, dw), grid_size=G, spline_order=k,
                             standalone_scale=standalone, dtype=dtype)
    cell, I, H, L, batch_first, bidirectional, dropout, gamma, dtype = key
    return RnnPlan(ctx, cell, I, H, num_layers=L, batch_first=batch_first,
                   bidirectional=bidirectional, dropout=dropout, gamma=gamma, dtype=dtype)


def plan(key, device):
    """The calling thread's plan for descriptor `key` on `device` (a torch.device), on a context
    that uses torch.get_num_threads() CPU threads (one context per thread count, so a call never
    starts a thread pool of its own): an RnnPlan for (cell, I, H, L, batch_first, bidirectional,
    dropout, gamma, kf_dtype), a SkLinearPlan for ("sklinear", in, out, L, k, bias, kf_dtype,
    kf_activation, dropout), a
    KanLinearPlan for ("kan_linear", in, out, grid_size, spline_order, standalone_scale,
    kf_dtype), a KanConv2dPlan for ("kan_conv2d", in_channels, out_channels, kh, kw, sh, sw, ph,
    pw, dh, dw, grid_size, spline_order, standalone_scale, kf_dtype)."""
    try:
        cache = _tls.plans
    except AttributeError:
        cache = _tls.plans = {}
    if device.type == "cpu":  # the per-call path: one lookup; the thread's CPU context is fixed
        full = (key, torch.get_num_threads())
        p = cache.get(full)
        if p is None:
            p = cache[full] = _make_plan(_context(device, full[1]), key)
        return p
    full = (key, device.type, device.index)
    p = cache.get(full)
    ctx = _context(device, 0)  # CUDA: sets the context's stream to torch's current one
    if p is None or p.ctx is not ctx:
        p = cache[full] = _make_plan(ctx, key)
    return p


_NO_GUARD = contextlib.nullcontext()  # reusable


def device_guard(device):
    """torch.cuda.device(device) for a CUDA tensor (allocations and the current stream then refer
    to the tensor's device), else a no-op."""
    if device.type == "cuda":
        return torch.cuda.device(device)
    return _NO_GUARD


def module_attrs(module, classes, names):
    """(getattr(module, n) for n in names) as a tuple, so that functional_call and
    parametrizations give theirs, on the per-call path without nn.Module.__getattr__: where
    `module`'s type is one of `classes` exactly (torch 1.13's functional_call and
    parametrizations make a subclass), each name is looked up where __getattr__ looks
    (_parameters, _buffers, _modules; torch 2.x's functional_call swaps the entries there),
    else by getattr."""
    if type(module) in classes:
        p, b, m = module._parameters, module._buffers, module._modules
        try:
            return tuple([p[n] if n in p else b[n] if n in b else m[n] for n in names])
        except KeyError:  # a name set as a plain attribute
            pass
    return tuple([getattr(module, n) for n in names])


# ---- autocast ------------------------------------------------------------------------------------
# torch.get_autocast_dtype(device_type) and is_autocast_enabled(device_type): torch >= 2.4.
_AUTOCAST_BY_DEVICE = hasattr(torch, "get_autocast_dtype")
# Whether autocast is on for any device: one call on the per-call path (torch 2.x has it).
_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", None) or (
    lambda: torch.is_autocast_cpu_enabled() or torch.is_autocast_enabled())


def autocast_dtype(device):
    """The dtype torch's autocast gives an nn.Linear on `device` now, or None where it is off."""
    kind = device.type
    if _AUTOCAST_BY_DEVICE:
        return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else None
    if kind == "cpu":
        return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None
    if kind == "cuda":
        return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else None
    return None


def autocast_now(x):
    """The autocast dtype for x's device, or None where autocast is off there."""
    return autocast_dtype(x.device) if _any_autocast() else None


def autocast_inputs(x, tensors):
    """A kfuse layer under autocast, as torch's autocast treats nn.Linear (and cuDNN's RNNs on
    CUDA): where autocast is on for x's device, x and the layer's floating tensors (parameters,
    buffers, h0) are cast to its dtype for this call, so the layer runs its plan of that dtype
    (bfloat16/float16 storage, float32 arithmetic) and its outputs have it; the casts are
    differentiable, so float32 master parameters receive float32 gradients. float64 tensors are
    left as they are, as autocast leaves them (a float64 module runs in float64). Returns
    (x, tensors), cast or as they were."""
    dt = autocast_now(x)
    if dt is None:
        return x, tensors

    def cast(t):
        if t is None or not t.is_floating_point() or t.dtype == torch.float64:
            return t
        return t.to(dt)
    return cast(x), [cast(t) for t in tensors]


def on_device(x, body, *args):
    """body(*args) with torch.cuda.device(x.device) current where x is a CUDA tensor (as
    device_guard; on the CPU without a `with`, which costs the per-call path more than the
    call)."""
    if x.is_cuda:
        with torch.cuda.device(x.device):
            return body(*args)
    return body(*args)


def workspace(p, device, *dims):
    """A workspace tensor from torch's caching allocator on CUDA (stream-ordered with the rest of
    the program); None on the CPU, where the context's arena serves. `dims`: the arguments of
    p.workspace_size."""
    if device.type != "cuda":
        return None
    nbytes = p.workspace_size(*dims)
    return torch.empty(nbytes, dtype=torch.uint8, device=device) if nbytes else None


def check_devices(layer, x, names, tensors):
    """The one check made here: a kfuse context reads memory of its own device only. `tensors`
    (None = absent) are named by `names`."""
    if not x.is_cuda:
        for t in tensors:
            if t is not None and t.is_cuda:
                break
        else:
            return  # all host memory (or meta, whose absent data the library reports)
    for name, t in zip(names, tensors):
        if t is not None and t.device != x.device:
            raise RuntimeError("kfuse %s: expected all tensors to be on the same device, but "
                               "input is on %s and %s on %s" % (layer, x.device, name, t.device))


def empty_grad(t, needed):
    """A fresh contiguous tensor of t's shape where a gradient is needed (the library writes
    row-major tensors only), else a fresh empty one (an operator's outputs are tensors, never
    None; the autograd formula maps it back to None)."""
    return t.new_empty(t.shape if needed else (0,))


def check_rank(name, t, ndim, what):
    """Raises ValueError naming `name` unless t has `ndim` dimensions (`what` says which)."""
    if t.dim() != ndim:
        raise ValueError("kfuse: %s must be %s (%d-D), got shape %s"
                         % (name, what, ndim, tuple(t.shape)))


# ---- operators ---------------------------------------------------------------------------------

_LIB = torch.library.Library("kfuse", "DEF") if HAS_TORCH_LIBRARY else None


_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None) or (lambda: False)
_transforms_active = getattr(torch._C, "_are_functorch_transforms_active", None) or (lambda: False)
_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_mode", None) or (lambda: 0)
_grad_enabled = torch.is_grad_enabled


def _capturing(args):
    """True where the registered operator, not the eager shortcut, must run: torch.jit.trace, a
    functorch transform (vmap, grad, functionalize), a __torch_dispatch__ mode (make_fx,
    FlopCounterMode), or tensor subclasses (the fake tensors of torch.export). (Under
    torch.compile, Op.__call__ takes the operator before asking.)"""
    if _is_tracing() or _transforms_active() or _dispatch_modes() > 0:
        return True
    for a in args:
        if type(a) not in _PLAIN and isinstance(a, torch.Tensor):
            return True
    return False


_is_tracing = torch._C._is_tracing  # torch.jit.is_tracing() less its TorchScript branch
# argument types that are no tensor subclass (tested first: the per-call path)
_PLAIN = frozenset((torch.Tensor, torch.nn.Parameter, type(None), int, float, bool, str, list,
                    tuple))


class Op:
    """One kfuse operator: `impl` (the eager kernel on real tensors), `fake` (output shapes,
    torch >= 2.4), and where it is differentiable `setup_context(ctx, inputs, output)` and
    `backward(ctx, *grads)` with torch.library.register_autograd's meaning (a Tensor[] input
    gets a list of needs_input_grad flags and a list of gradients). `double_backward`, where
    given, is the backward autograd runs under create_graph=True (grad mode on during the
    backward): the same gradients computed by differentiable operations, so that they can be
    differentiated again; elsewhere `backward` runs (under no_grad). Calling the Op runs
    torch.ops.kfuse.<name> when a graph is being captured, else the kernel, through an
    autograd.Function when something needs a gradient."""

    def __init__(self, name, schema, impl, fake, setup_context=None, backward=None,
                 feature_dims=None, double_backward=None):
        self.name = name
        self.impl = impl
        self.op = None
        if backward is not None:
            backward = _first_order(name, backward, double_backward)
        if HAS_TORCH_LIBRARY:
            _LIB.define(name + schema)
            _LIB.impl(name, impl, "CPU")
            _LIB.impl(name, impl, "CUDA")
            torch.library.register_fake("kfuse::" + name, fake, lib=_LIB)
            if backward is not None:
                torch.library.register_autograd("kfuse::" + name, backward,
                                                setup_context=setup_context, lib=_LIB)
            self.op = getattr(torch.ops.kfuse, name).default
            if feature_dims is not None and hasattr(torch.library, "register_vmap"):
                torch.library.register_vmap("kfuse::" + name,
                                            _vmap_rule(self.op, feature_dims), lib=_LIB)
        self._function = None
        if backward is not None:
            self._function = _function(name, impl, setup_context, backward,
                                       "Tensor[]" in schema)

    def __call__(self, *args):
        if self.op is not None and _is_compiling():
            return self.op(*args)
        if _capturing(args):
            return self._captured(*args)
        if self._function is not None and _grad_enabled() and _any_requires_grad(args):
            return self._function(*args)
        return self.impl(*args)

    def _captured(self, *args):
        _refuse_derivative_transforms(self.name)
        if self.op is not None and not torch.jit.is_tracing():
            return self.op(*args)
        if torch.onnx.is_in_onnx_export():
            raise RuntimeError("kfuse.torch: the operator kfuse::%s has no ONNX equivalent; "
                               "torch.onnx.export of a kfuse module is not supported" % self.name)
        if self.op is None:
            raise _untransformable(self.name)
        return self.op(*args)


def _untransformable(name):
    """The error of a kfuse operator traced or transformed where it has no torch.library
    registration (torch < 2.4: its forward in Op._captured, its backward in _first_order)."""
    return RuntimeError(
        "kfuse.torch: kfuse::%s cannot be traced or transformed on torch %s: kfuse's "
        "operators are registered with torch.library on torch >= 2.4 only (eager "
        "forward and backward work)" % (name, torch.__version__))


_has_storage = torch._C._has_storage


def _transformed_grads(grads):
    """Whether the gradients reaching a backward are being traced or transformed: _capturing's
    cases, and the storage-less batched tensors of torch's own legacy vmap
    (torch._vmap_internals, which gradcheck's batched-gradient check runs on torch 1.13), which
    neither is a tensor subclass nor makes a functorch transform active."""
    return _capturing(grads) or not all(_has_storage(g) for g in grads
                                        if isinstance(g, torch.Tensor))


try:  # torch >= 2.0: the functorch transforms active now, innermost last
    from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters as _levels
    _TT = torch._C._functorch.TransformType
    _DERIVATIVE_TRANSFORMS = {_TT.Jvp: "forward-mode (torch.func.jvp, jacfwd, hessian)",
                              _TT.Grad: "torch.func.grad, vjp, jacrev"}
except (ImportError, AttributeError):  # torch 1.13: _captured refuses every transform anyway
    _levels, _DERIVATIVE_TRANSFORMS = (lambda: ()), {}


def _refuse_derivative_transforms(name):
    """functorch's derivative transforms cannot differentiate a kfuse operator: torch.library's
    autograd formulas are not functorch-transformable, and under torch.func.jvp the operator's
    tangent came out as zeros, silently. So they are refused here, naming the operator and what
    works instead; vmap and functionalization (torch.export) pass."""
    for level in _levels():
        what = _DERIVATIVE_TRANSFORMS.get(level.key())
        if what is not None:
            raise RuntimeError(
                "kfuse.torch: kfuse::%s cannot be differentiated by functorch's %s transforms; "
                "take its gradients with torch.autograd (backward, torch.autograd.grad, "
                "torch.autograd.functional.jacobian)" % (name, what))


_DelayedError = torch._C._functions.DelayedError


def _first_order(name, backward, double_backward=None):
    """`backward` as autograd runs it. Under create_graph=True (grad mode on during backward) in
    eager mode, an op with a `double_backward` runs that instead (differentiable gradients: the
    KAN layers). Other kfuse backward kernels have no derivative of their own,
    so under create_graph=True the gradients come out depending on
    what they were computed from (the saved inputs and the incoming gradients) through a node
    that raises a clear error where they are differentiated again (gradgradcheck, a gradient
    penalty), instead of silently counting as constants there; a backward with create_graph=True
    whose kfuse gradients are not differentiated again works as before (the gradients' values
    are unchanged). Graph capture (torch.compile's tracing, functorch) is left to torch, which
    refuses double backward there."""
    msg = ("kfuse.torch: kfuse::%s has no double backward (its backward is a fused kernel without "
           "a derivative of its own), so a gradient through it cannot be differentiated again "
           "(create_graph=True, then a derivative of that gradient)" % name).encode()

    def wrapper(ctx, *grads):
        # without torch.library the backward kernel would meet the transform's tensors (a vmap
        # over the backward: torch's "Cannot access data pointer of Tensor that doesn't have
        # storage"); refused as the forward refuses it
        if not HAS_TORCH_LIBRARY and _transformed_grads(grads):
            raise _untransformable(name)
        if (double_backward is not None and torch.is_grad_enabled() and not _is_compiling()
                and not _capturing(grads)):
            return double_backward(ctx, *grads)
        with torch.no_grad():
            out = backward(ctx, *grads)
        if not torch.is_grad_enabled() or _is_compiling() or _capturing(grads):
            return out
        deps = [t for t in tuple(ctx.saved_tensors) + grads
                if isinstance(t, torch.Tensor) and t.requires_grad]
        if not deps:
            return out
        errs = _DelayedError(msg, len(deps))(*deps)
        # an exact 0 behind the error node (a sum over no elements: O(1), never NaN)
        zero = sum(e.reshape(-1)[:0].sum() for e in (errs if isinstance(errs, tuple) else (errs,)))

        def rebuild(o):
            if isinstance(o, (list, tuple)):
                return type(o)(rebuild(e) for e in o)
            return o + zero if isinstance(o, torch.Tensor) else o
        return rebuild(out)

    return wrapper


def _vmap_rule(op, feature_dims):
    """torch.vmap for an operator whose first argument x takes any number of leading batch dims
    before its `feature_dims` trailing ones (1: [..., in]; 3 with at most one leading dim:
    [B, C, H, W]): a vmapped x alone becomes one call over the vmapped dim moved in front (folded
    into the batch for a 4-D image); vmapped parameters (a model ensemble) run one call per
    sample, stacked."""

    def rule(info, in_dims, x, *rest):
        # an int[] argument's in_dims entry is a list (of Nones): only an int is a vmapped dim
        in_dims = [d if isinstance(d, int) else None for d in in_dims]
        if in_dims[0] is not None and all(d is None for d in in_dims[1:]):
            xb = x.movedim(in_dims[0], 0)
            if feature_dims == 1 or xb.dim() == feature_dims + 1:
                return op(xb, *rest), 0
            y = op(xb.reshape((-1,) + tuple(xb.shape[2:])), *rest)
            return y.view(xb.shape[:2] + y.shape[1:]), 0
        args = (x,) + rest
        return torch.stack([
            op(*(a.select(d, i) if d is not None else a for a, d in zip(args, in_dims)))
            for i in range(info.batch_size)]), 0

    return rule


def _any_requires_grad(args):
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.requires_grad:
                return True
        elif isinstance(a, (list, tuple)):
            for t in a:
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    return True
    return False


def grad_may_flow(*args):
    """Whether a gradient may flow from a call on `args` (tensors, lists or tuples of them, None),
    so that a module keeps what its backward needs only then: grad mode on, or a trace being
    recorded (a trace must not depend on the grad mode it was recorded in: torch.jit.trace's check
    reruns under no_grad), and an argument that requires grad."""
    return (torch.is_grad_enabled() or torch.jit.is_tracing()) and _any_requires_grad(args)


def dropout_seed():
    """The key of a call's dropout masks, drawn from torch's default generator (torch.manual_seed
    repeats it), as a tensor, so a trace or a compiled graph draws a fresh one per call."""
    return torch.randint(0, 2 ** 62, (1,), dtype=torch.int64)


def _function(name, impl, setup_context, backward, has_lists):
    """An autograd.Function running `impl` with register_autograd's setup_context/backward. With
    `has_lists` (Tensor[] arguments), the lists are flattened into the Function's inputs so that
    autograd sees their tensors, and regrouped for the kernel, needs_input_grad and the returned
    gradients; without, the arguments go as they are."""

    def forward(ctx, *args):
        ctx.set_materialize_grads(False)
        out = impl(*args)
        setup_context(ctx, args, out)
        return out

    if not has_lists:
        cls = type("kfuse_" + name, (torch.autograd.Function,),
                   {"forward": staticmethod(forward), "backward": staticmethod(backward)})
        return cls.apply

    def forward_flat(ctx, spec, *flat):
        ctx.spec = spec
        out = forward(ctx, *_unflatten(spec, flat))
        if isinstance(out, tuple):  # integer outputs (a reserve) get no gradient
            ctx.mark_non_differentiable(*(o for o in out if not o.is_floating_point()))
        return out

    def backward_flat(ctx, *grads):
        grads_in = backward(_GroupedContext(ctx), *grads)
        flat = [None]
        for n, g in zip(ctx.spec, grads_in):
            if n is None:
                flat.append(g)
            else:
                flat.extend(g if g is not None else [None] * n)
        return tuple(flat)

    cls = type("kfuse_" + name, (torch.autograd.Function,),
               {"forward": staticmethod(forward_flat), "backward": staticmethod(backward_flat)})

    def call(*args):
        spec = tuple(len(a) if isinstance(a, (list, tuple)) else None for a in args)
        flat = []
        for n, a in zip(spec, args):
            if n is None:
                flat.append(a)
            else:
                flat.extend(a)
        return cls.apply(spec, *flat)

    return call


class _GroupedContext:
    """The Function's ctx as `backward` sees it: needs_input_grad regrouped per argument (torch
    1.13 does not let it be reassigned); everything else is the ctx's."""

    __slots__ = ("_ctx", "needs_input_grad")

    def __init__(self, ctx):
        self._ctx = ctx
        self.needs_input_grad = _unflatten(ctx.spec, ctx.needs_input_grad[1:])

    def __getattr__(self, name):
        return getattr(self._ctx, name)


def _unflatten(spec, flat):
    out, i = [], 0
    for n in spec:
        if n is None:
            out.append(flat[i])
            i += 1
        else:
            out.append(list(flat[i:i + n]))
            i += n
    return tuple(out)
