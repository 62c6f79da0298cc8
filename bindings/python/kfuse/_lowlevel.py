"""Thin Python objects over the kfuse C ABI (capi/include/kfuse.h).

Nothing here validates shapes or computes anything: arguments are put into the ABI's structs as
given, and a failing status becomes a KfuseError subclass carrying the status and the library's
own detail message (kf_last_error_message(), read on the calling thread right after the call).

The GIL: the extension is built in cffi's out-of-line API mode, whose generated wrappers release
the GIL around every C call (Py_BEGIN_ALLOW_THREADS ... Py_END_ALLOW_THREADS), so a long forward
or backward lets other Python threads run. Each thread must use its own Context (the ABI's rule:
one thread at a time per context); kfuse.torch keeps one per (device, thread).
"""
import struct
import threading

from kfuse._kfuse_cffi import ffi, lib

__all__ = [
    "ffi", "lib", "KfuseError", "InvalidArgument", "Unsupported", "OutOfMemory",
    "WorkspaceTooSmall", "BackendUnavailable", "DeviceError", "InternalError", "check",
    "version", "version_string", "Context", "RnnPlan", "TensorRef", "tensor_values", "dtype_code",
    "kf_dtype_of", "param_list", "remembered", "ALIGN_BYTES",
    "DTYPE_F32", "DTYPE_F64", "DTYPE_F16", "DTYPE_BF16", "DTYPE_I32", "DTYPE_I64",
    "MODE_INFERENCE", "MODE_TRAINING", "GRAD_OVERWRITE", "GRAD_ACCUMULATE",
]

#: Alignment the ABI asks of workspace and reserve buffers (KF_ALIGN_BYTES, kfuse.h).
ALIGN_BYTES = lib.KF_ALIGN_BYTES

DTYPE_F32 = lib.KF_DTYPE_F32  #: KF_DTYPE_F32 (kfuse.h)
DTYPE_F64 = lib.KF_DTYPE_F64  #: KF_DTYPE_F64 (kfuse.h)
DTYPE_F16 = lib.KF_DTYPE_F16  #: KF_DTYPE_F16 (kfuse.h)
DTYPE_BF16 = lib.KF_DTYPE_BF16  #: KF_DTYPE_BF16 (kfuse.h)
DTYPE_I32 = lib.KF_DTYPE_I32  #: KF_DTYPE_I32 (kfuse.h)
DTYPE_I64 = lib.KF_DTYPE_I64  #: KF_DTYPE_I64 (kfuse.h)
MODE_INFERENCE = lib.KF_MODE_INFERENCE  #: KF_MODE_INFERENCE (kfuse.h)
MODE_TRAINING = lib.KF_MODE_TRAINING  #: KF_MODE_TRAINING (kfuse.h)
GRAD_OVERWRITE = lib.KF_GRAD_OVERWRITE  #: KF_GRAD_OVERWRITE (kfuse.h)
GRAD_ACCUMULATE = lib.KF_GRAD_ACCUMULATE  #: KF_GRAD_ACCUMULATE (kfuse.h)


# ---- errors ------------------------------------------------------------------------------------

class KfuseError(Exception):
    """A kfuse call returned a status other than KF_OK.

    .status is the kf_status value, .status_string its static name and meaning
    (kf_status_string) and .message the library's detail (kf_last_error_message)."""

    def __init__(self, status, message, status_string=None):
        self.status = int(status)
        self.message = message
        self.status_string = status_string
        super().__init__(message or status_string or "kfuse status %d" % self.status)

    def __str__(self):
        if self.message and self.status_string:
            return "%s (%s)" % (self.message, self.status_string)
        return self.message or self.status_string or "kfuse status %d" % self.status


class InvalidArgument(KfuseError, ValueError):
    """KF_ERR_INVALID_ARGUMENT: NULL, bad size, shape/dtype mismatch, unknown flag, ..."""


class Unsupported(KfuseError, NotImplementedError):
    """KF_ERR_UNSUPPORTED: a valid request this build or backend does not implement."""


class OutOfMemory(KfuseError, MemoryError):
    """KF_ERR_OUT_OF_MEMORY: host or device allocation failed."""


class WorkspaceTooSmall(KfuseError):
    """KF_ERR_WORKSPACE_TOO_SMALL: caller workspace/reserve, or a fixed arena, too small."""


class BackendUnavailable(KfuseError, RuntimeError):
    """KF_ERR_BACKEND_UNAVAILABLE: e.g. CUDA asked for in a CPU-only build or without a driver."""


class DeviceError(KfuseError, RuntimeError):
    """KF_ERR_DEVICE: a CUDA / cuBLAS call failed (the message has its error text)."""


class InternalError(KfuseError, RuntimeError):
    """KF_ERR_INTERNAL: a bug in kfuse; please report it with the message."""


_ERRORS = {
    lib.KF_ERR_INVALID_ARGUMENT: InvalidArgument,
    lib.KF_ERR_UNSUPPORTED: Unsupported,
    lib.KF_ERR_OUT_OF_MEMORY: OutOfMemory,
    lib.KF_ERR_WORKSPACE_TOO_SMALL: WorkspaceTooSmall,
    lib.KF_ERR_BACKEND_UNAVAILABLE: BackendUnavailable,
    lib.KF_ERR_DEVICE: DeviceError,
    lib.KF_ERR_INTERNAL: InternalError,
}


def check(status):
    """Raises the KfuseError subclass for `status` (with the thread's last error message) unless
    it is KF_OK. Call it right after the kfuse call, on the same thread."""
    if status != lib.KF_OK:
        message = ffi.string(lib.kf_last_error_message()).decode("utf-8", "replace")
        status_string = ffi.string(lib.kf_status_string(status)).decode("utf-8", "replace")
        raise _ERRORS.get(status, KfuseError)(status, message, status_string)


def version():
    """The loaded library's version as MAJOR*10000 + MINOR*100 + PATCH (kf_version)."""
    return int(lib.kf_version())


def version_string():
    """The loaded library's version, e.g. "1.0.0" (kf_version_string)."""
    return ffi.string(lib.kf_version_string()).decode()


# ---- tensors -----------------------------------------------------------------------------------
#
# The one way a tensor reaches the library. A plan method takes the tensor *objects* (a torch
# tensor, a numpy array or anything with __array_interface__, a TensorRef, or None = absent) and
# turns them into kf_tensor fields with tensor_values() inside its own frame, which holds every
# object it was given (and so its storage, including a temporary such as dy.contiguous() written
# in the call's argument list) until the C call returns. No front end takes a data pointer
# itself. A TensorRef made by TensorRef.of() holds the object it describes for the same reason.
# The raw (ptr, kf_dtype, shape, strides) tuple stays accepted by the low-level plans for
# memory the caller manages itself (and keeps alive across the call).

_MAXD = lib.KF_MAX_DIMS
_PAD = (0,) * _MAXD
_ABSENT = (0, lib.KF_DTYPE_F32, 0) + _PAD + _PAD

# kf_dtype by element type name: numpy's dtype names and torch's ("torch.float32") agree on these.
_DTYPE_NAMES = {"float32": DTYPE_F32, "float64": DTYPE_F64, "float16": DTYPE_F16,
                "bfloat16": DTYPE_BF16, "int32": DTYPE_I32, "int64": DTYPE_I64}
_dtype_codes = {}  # dtype object (numpy or torch) -> kf_dtype, filled on first use


def dtype_code(dt):
    """The kf_dtype of a numpy or torch dtype; 0 for one it has no code for (another element
    type, a non-native byte order): a tensor of such a dtype is refused before the library sees
    it (_no_kf_dtype)."""
    code = _dtype_codes.get(dt)
    if code is None:
        code = _dtype_codes[dt] = _DTYPE_NAMES.get(str(dt).rpartition(".")[2], 0)
    return code


def kf_dtype_of(name, t):
    """The kf_dtype of tensor `t`, argument `name` (a plan's dtype is its parameters'), or the
    InvalidArgument naming both where no kf_dtype describes its dtype."""
    code = dtype_code(t.dtype)
    if not code:
        raise _no_kf_dtype(name, t.dtype)
    return code


def _no_kf_dtype(name, dt):
    """The InvalidArgument for argument `name`, a torch tensor or numpy array of dtype `dt` that
    no kf_dtype describes (torch.complex64, torch.uint8, ...), naming dt as its library names it:
    the library itself could only report the 0 it would be given."""
    return InvalidArgument(
        lib.KF_ERR_INVALID_ARGUMENT,
        "kfuse: %s.dtype = %s, which kfuse has no kf_dtype for (its tensors are float32, "
        "float64, float16 or bfloat16, and int32 sequence lengths)" % (name, dt),
        ffi.string(lib.kf_status_string(lib.KF_ERR_INVALID_ARGUMENT)).decode())


def _pack(ptr, dt, shape, strides):
    """kf_tensor field values (data, dtype, ndim, shape[KF_MAX_DIMS], strides[KF_MAX_DIMS]);
    strides None = row-major. A rank beyond KF_MAX_DIMS goes on truncated with ndim kept, so the
    library reports it."""
    nd = len(shape)
    if strides is None:
        strides, acc = [0] * nd, 1
        for i in range(nd - 1, -1, -1):
            strides[i] = acc
            acc *= shape[i]
    if nd <= _MAXD:
        pad = _PAD[nd:]
        return (int(ptr), int(dt), nd, *shape, *pad, *strides, *pad)
    return (int(ptr), int(dt), nd, *shape[:_MAXD], *strides[:_MAXD])


def _torch_values(t):
    shape = t.shape
    nd = len(shape)
    dt = t.dtype
    code = _dtype_codes.get(dt)  # dtype_code(), inlined: this is the per-call hot path
    if code is None:
        code = dtype_code(dt)
    if nd > _MAXD:
        return _pack(t.data_ptr(), code, shape, t.stride())
    pad = _PAD[nd:]
    return (t.data_ptr(), code, nd, *shape, *pad, *t.stride(), *pad)


def _array_values(a):
    ai = a.__array_interface__
    item = a.itemsize
    # strides in elements; a byte stride that is not a whole number of elements goes on as is
    # (the library then rejects the layout)
    strides = None if ai.get("strides") is None else tuple(
        s // item if s % item == 0 else s for s in a.strides)
    return _pack(ai["data"][0], dtype_code(a.dtype), a.shape, strides)


def _ref_values(r):
    return _pack(r.ptr, r.dtype, r.shape, r.strides)


def _tuple_values(t):
    ptr, dt, shape, strides = t
    return _pack(ptr, dt, tuple(shape), None if strides is None else tuple(strides))


def _absent_values(_):
    return _ABSENT


_converters = {type(None): _absent_values, tuple: _tuple_values}
_TORCH_TYPES = set()  # the types _converter() found to be torch tensors (pack_tensors' fast path)


def _converter(tp):
    f = _converters.get(tp)
    if f is None:
        if issubclass(tp, TensorRef):
            f = _ref_values
        elif callable(getattr(tp, "data_ptr", None)) and callable(getattr(tp, "stride", None)):
            f = _torch_values  # torch.Tensor and its subclasses (Parameter, ...)
            _TORCH_TYPES.add(tp)
        elif hasattr(tp, "__array_interface__"):
            f = _array_values  # numpy arrays and other objects numpy describes
        if f is None:
            return None
        _converters[tp] = f
    return f


def tensor_values(obj, name="tensor"):
    """The kf_tensor field values (data, dtype, ndim, shape[KF_MAX_DIMS], strides[KF_MAX_DIMS])
    of `obj`: a torch tensor or numpy array as it is (its dtype and strides; one of a dtype no
    kf_dtype describes raises InvalidArgument naming `name` and the dtype), a TensorRef, a raw
    (ptr, kf_dtype, shape, strides) tuple, or None (absent). The values hold no reference to obj:
    only a caller that holds obj until the C call returns may use them (the plans' methods do);
    anything else raises TypeError naming `name`."""
    f = _converters.get(type(obj)) or _converter(type(obj))
    if f is None:
        raise TypeError("kfuse: %s must be a torch tensor, a numpy array, a kfuse.TensorRef or "
                        "None, got %s" % (name, type(obj).__name__))
    values = f(obj)
    if values[1] == 0 and f in (_torch_values, _array_values):
        raise _no_kf_dtype(name, obj.dtype)
    return values


class TensorRef:
    """What a kf_tensor needs: a data address (int; 0 = absent), a kf_dtype, a shape and strides in
    elements (None = row-major contiguous), and `owner`, the object whose memory it describes.
    TensorRef.of(obj) describes a torch tensor or numpy array and holds it, so the memory lives
    as long as the TensorRef does; TensorRef(ptr, ...) with no owner describes memory the caller
    keeps alive for the duration of the call (and, for a reserve, until the backward call)."""

    __slots__ = ("ptr", "dtype", "shape", "strides", "owner")

    def __init__(self, ptr, dtype, shape, strides=None, owner=None):
        self.ptr = int(ptr)
        self.dtype = int(dtype)
        self.shape = tuple(int(s) for s in shape)
        self.strides = None if strides is None else tuple(int(s) for s in strides)
        self.owner = owner

    @classmethod
    def of(cls, obj, name="tensor"):
        """A TensorRef describing `obj` (torch tensor, numpy array; None gives None) as it is, and
        holding it."""
        if obj is None or isinstance(obj, TensorRef):
            return obj
        v = tensor_values(obj, name)
        nd = min(v[2], _MAXD)
        return cls(v[0], v[1], v[3:3 + nd], v[3 + _MAXD:3 + _MAXD + nd], owner=obj)

    def __repr__(self):
        return "TensorRef(0x%x, dtype=%d, shape=%r, strides=%r)" % (
            self.ptr, self.dtype, self.shape, self.strides)


# kf_tensor as a struct.Struct (data, dtype, ndim, shape[], strides[]): one pack_into writes a
# whole tensor; None where the compiler laid the struct out otherwise (then field by field).
TENSOR_FMT = "Pii%dq%dq" % (_MAXD, _MAXD)
_TENSOR_STRUCT = struct.Struct("@" + TENSOR_FMT)
if (_TENSOR_STRUCT.size != ffi.sizeof("kf_tensor")
        or ffi.offsetof("kf_tensor", "shape") != struct.calcsize("@Pii")):  # pragma: no cover
    _TENSOR_STRUCT = None
_TENSOR_PTR = ffi.typeof("kf_tensor *")
_TENSOR_SIZE = ffi.sizeof("kf_tensor")


def _rank_fmt(code):
    """The struct format of one kf_tensor in a run (pack_tensors): code 0 takes all the fields
    (tensor_values()); code nd + 1 takes data, dtype, ndim and nd shape and nd stride entries,
    the entries past ndim being pad bytes, which pack_into writes as zeros."""
    if code == 0:
        return TENSOR_FMT
    pad = "%dx" % (8 * (_MAXD - code + 1))
    return "Pii%dq%s%dq%s" % (code - 1, pad, code - 1, pad)


_RUNS = {}  # pack_tensors' key -> struct.Struct of that run of kf_tensors
if any(struct.calcsize("@" + _rank_fmt(c)) != _TENSOR_SIZE
       for c in range(_MAXD + 2)):  # pragma: no cover - then field by field everywhere
    _TENSOR_STRUCT = None


def _run_struct(key):
    codes = []
    while key > 1:
        key, code = divmod(key, 8)
        codes.append(code)
    return struct.Struct("@" + "".join(_rank_fmt(c) for c in reversed(codes)))


def _entry_name(names, i):
    return names[i] if type(names) is tuple else "%s[%d]" % (names, i)


def pack_tensors(buf, offset, objs, names):
    """Writes `objs` (anything tensor_values() takes) as consecutive kf_tensors, every field (the
    zeros past ndim too: structs are reused), into the cffi buffer `buf` from byte `offset`, with
    one struct.pack_into: a torch tensor of rank <= KF_MAX_DIMS goes as its data pointer, dtype,
    shape and strides only (the per-call path), anything else as tensor_values() gives it; the
    Struct of each sequence of ranks is made once. `names`: a tuple naming each object, or a
    string naming an array (its entries are then name[i]), for the TypeError of an object
    tensor_values() does not take and the InvalidArgument of a dtype no kf_dtype describes. The
    caller holds objs until the C call returns."""
    values = []
    put = values.extend
    key = 1
    i = 0
    for obj in objs:
        if type(obj) in _TORCH_TYPES:
            shape = obj.shape
            nd = len(shape)
            if nd <= _MAXD:
                dt = obj.dtype
                code = _dtype_codes.get(dt) or dtype_code(dt)
                if not code:
                    raise _no_kf_dtype(_entry_name(names, i), dt)
                put((obj.data_ptr(), code, nd))
                put(shape)
                put(obj.stride())
                key = key * 8 + nd + 1
                i += 1
                continue
        put(_ABSENT if obj is None else tensor_values(obj, _entry_name(names, i)))
        key *= 8
        i += 1
    st = _RUNS.get(key)
    if st is None:
        st = _RUNS[key] = _run_struct(key)
    st.pack_into(buf, offset, *values)


def tensor_run(ctype, fields):
    """The byte offset of the kf_tensor fields `fields` of struct `ctype` when they follow one
    another there (one pack_tensors call writes them), else None (then field by field)."""
    if _TENSOR_STRUCT is None:  # pragma: no cover
        return None
    start = ffi.offsetof(ctype, fields[0])
    if all(ffi.offsetof(ctype, f) == start + i * _TENSOR_SIZE for i, f in enumerate(fields)):
        return start
    return None


def _fill_tensor(t, obj, name="tensor"):
    """Writes `obj` (anything tensor_values() takes) into the kf_tensor cdata `t`, every field
    (the zeros past ndim too: a plan's structs are reused). The caller holds obj until the C call
    returns."""
    v = tensor_values(obj, name)
    if _TENSOR_STRUCT is not None:
        _TENSOR_STRUCT.pack_into(
            ffi.buffer(t if ffi.typeof(t) is _TENSOR_PTR else ffi.addressof(t)), 0, *v)
        return
    t.data = ffi.cast("void *", v[0])
    t.dtype = v[1]
    t.ndim = v[2]
    for i in range(_MAXD):
        t.shape[i] = v[3 + i]
        t.strides[i] = v[3 + _MAXD + i]


def _tensor_array(objs, name="weights", cache=None):
    """A kf_tensor[len(objs)] array (or NULL for None): made once per (name, length) and kept in
    the dict `cache` when one is given (a plan's: used by one thread at a time), else new; every
    entry rewritten. The caller holds objs (a list or tuple) until the C call returns."""
    if objs is None:
        return ffi.NULL, 0
    key = (name, len(objs))
    entry = None if cache is None else cache.get(key)
    if entry is None:
        arr = ffi.new("kf_tensor[]", max(len(objs), 1))
        entry = (arr, ffi.buffer(arr))
        if cache is not None:
            cache[key] = entry
    arr, buf = entry
    if _TENSOR_STRUCT is not None:
        pack_tensors(buf, 0, objs, name)
    else:  # pragma: no cover
        for i, r in enumerate(objs):
            _fill_tensor(arr[i], r, "%s[%d]" % (name, i))
    return arr, len(objs)


class _ArgStruct:
    """An argument struct made and initialised once (its defaults by `init`) and refilled per
    call: a plan is used by one thread at a time, and every call rewrites each field it uses.
    put() writes consecutive kf_tensor fields with one struct.pack_into (pack_tensors)."""

    __slots__ = ("args", "buf", "ctype", "runs")

    def __init__(self, ctype, init):
        self.args = ffi.new(ctype + " *")
        init(self.args)
        self.buf = ffi.buffer(self.args)
        self.ctype = ctype
        self.runs = {}  # fields -> tensor_run(ctype, fields)

    def put(self, fields, objs):
        """Writes `objs` (anything tensor_values() takes) into the kf_tensor fields `fields` (a
        tuple of names, consecutive in the struct). The caller holds objs until the C call
        returns."""
        start = self.runs.get(fields, -1)
        if start == -1:
            start = self.runs[fields] = tensor_run(self.ctype, fields)
        if start is not None:
            pack_tensors(self.buf, start, objs, fields)
        else:  # pragma: no cover - a compiler laying the struct out with padding
            for f, obj in zip(fields, objs):
                _fill_tensor(getattr(self.args, f), obj, f)


def _buffer(buf, name="buffer"):
    """(pointer, bytes) from None, a torch tensor or numpy array (its whole storage from its data
    pointer: contiguous uint8 buffers, as the front ends make them), or a raw (ptr:int,
    nbytes:int) pair. The caller holds buf until the C call returns."""
    if buf is None:
        return ffi.NULL, 0
    if isinstance(buf, tuple):
        ptr, nbytes = buf
    elif callable(getattr(buf, "data_ptr", None)):
        ptr, nbytes = buf.data_ptr(), buf.numel() * buf.element_size()
    elif hasattr(buf, "__array_interface__"):
        ptr, nbytes = buf.__array_interface__["data"][0], buf.nbytes
    else:
        raise TypeError("kfuse: %s must be a torch tensor, a numpy array, a (ptr, nbytes) pair or "
                        "None, got %s" % (name, type(buf).__name__))
    return ffi.cast("void *", int(ptr)), int(nbytes)


def _fill_inputs(st, x, h0, weights, lengths, dropout_seed, dropout_offset, cache=None):
    """The fields kf_rnn_forward_args and kf_rnn_backward_args share (same names in both), into
    the _ArgStruct `st`. Returns the weight array, which the caller keeps alive (with the tensors)
    until the C call returns (`cache`: as for _tensor_array)."""
    st.put(("x", "h0"), (x, h0))
    warr, nw = _tensor_array(weights, "weights", cache)
    args = st.args
    args.weights = warr
    args.num_weights = nw
    st.put(("lengths",), (lengths,))
    args.dropout_seed = int(dropout_seed)
    args.dropout_offset = int(dropout_offset)
    return warr


# ---- what a plan asks the library once ---------------------------------------------------------

def remembered(cache, key, query):
    """cache[key], made by query(*key) on first use: a plan's pure queries (shapes, sizes) are
    asked once per plan and argument tuple, not per call."""
    value = cache.get(key)
    if value is None:
        value = cache[key] = query(*key)
    return value


def param_list(count_fn, info_fn, ptr, order=None):
    """[(name, shape), ...] of a plan's tensors as the library lists them through its
    kf_*_count / kf_*_info pair (`ptr` the plan): its canonical order, or with `order` (a
    sequence of names) the order of the names there. Queried once per plan by its owner."""
    count = ffi.new("int32_t *")
    check(count_fn(ptr, count))
    name = ffi.new("const char **")
    ndim = ffi.new("int32_t *")
    shape = ffi.new("int64_t[]", _MAXD)
    info = []
    for i in range(count[0]):
        check(info_fn(ptr, i, name, ndim, shape))
        info.append((ffi.string(name[0]).decode(), tuple(int(shape[k]) for k in range(ndim[0]))))
    if order is not None:
        info.sort(key=lambda entry: order.index(entry[0]))
    return info


# ---- context -----------------------------------------------------------------------------------

_DEVICE_TYPES = {"cpu": lib.KF_DEVICE_CPU, "cuda": lib.KF_DEVICE_CUDA}


class Context:
    """A kf_context: device, stream, BLAS handle and arena. Used by one thread at a time.

    Context("cpu", num_threads=0) or Context("cuda", device_index=0, stream=ptr). `stream` is a
    cudaStream_t as an int (e.g. torch.cuda.current_stream().cuda_stream); None/0 = the legacy
    default stream. Destroyed by close() or when garbage (after every plan made from it)."""

    def __init__(self, device="cpu", device_index=0, num_threads=0, arena_bytes=0,
                 fixed_arena=False, stream=None):
        desc = ffi.new("kf_context_desc *")
        lib.kf_context_desc_init(desc)
        desc.device_type = _DEVICE_TYPES.get(device, 0) if isinstance(device, str) else int(device)
        desc.device_index = int(device_index)
        desc.num_threads = int(num_threads)
        desc.flags = lib.KF_CONTEXT_FIXED_ARENA if fixed_arena else 0
        desc.arena_bytes = int(arena_bytes)
        out = ffi.new("kf_context **")
        check(lib.kf_context_create(desc, out))
        self._ptr = ffi.gc(out[0], lib.kf_context_destroy)
        self.device = device
        self.device_index = int(device_index)
        self.num_threads = int(num_threads)
        self._stream = 0
        if stream:
            self.set_stream(stream)

    @property
    def ptr(self):
        if self._ptr is None:
            raise ValueError("kfuse Context is closed")
        return self._ptr

    def close(self):
        """Drops this object's handle: the kf_context is destroyed once no plan made from it is
        alive either (plans keep their context alive)."""
        self._ptr = None

    @property
    def device_type(self):
        v = ffi.new("int32_t *")
        check(lib.kf_context_device_type(self.ptr, v))
        return int(v[0])

    def set_stream(self, stream):
        """Sets the cudaStream_t (int address, 0/None = legacy default) later calls enqueue on."""
        stream = int(stream or 0)
        check(lib.kf_context_set_stream(self.ptr, ffi.cast("void *", stream)))
        self._stream = stream

    @property
    def stream(self):
        v = ffi.new("void **")
        check(lib.kf_context_get_stream(self.ptr, v))
        return int(ffi.cast("uintptr_t", v[0]))

    def reserve(self, nbytes):
        """Grows the arena to at least `nbytes` now (kf_context_reserve)."""
        check(lib.kf_context_reserve(self.ptr, int(nbytes)))

    def arena_info(self):
        """(arena_bytes, grow_count) (kf_context_arena_info)."""
        b = ffi.new("size_t *")
        g = ffi.new("uint64_t *")
        check(lib.kf_context_arena_info(self.ptr, b, g))
        return int(b[0]), int(g[0])

    def synchronize(self):
        """Waits for the context's stream; reports an asynchronous CUDA error as DeviceError."""
        check(lib.kf_context_synchronize(self.ptr))

    def __repr__(self):
        return "kfuse.Context(%r, device_index=%d)" % (self.device, self.device_index)


# ---- recurrent plans ---------------------------------------------------------------------------

_CELLS = {"gru": lib.KF_RNN_GRU, "agru": lib.KF_RNN_AGRU}


def rnn_seq_dims(batch_first, shape):
    """(T, B) of a recurrent layer's input of `shape` ([T, B, input_size], or [B, T, input_size]
    batch-first), for sizing its outputs: the one place the Python bindings read that rule (the
    Rust crate's is RnnDesc::steps_and_batch). (1, 1) for a shape that is not 3-D, which is passed
    on for the library to report."""
    if len(shape) != 3:
        return 1, 1
    return (shape[1], shape[0]) if batch_first else (shape[0], shape[1])


class _Plan:
    """What every plan object shares (RnnPlan, kfuse.SkLinearPlan, kfuse.KanLinearPlan,
    kfuse.KanConv2dPlan): a kf_<op>_desc with the library's defaults, filled by the subclass and
    checked by the library (kf_<op>_plan_create); the plan destroyed with the object and its
    context kept alive until then; a cache of the argument structs its calls refill."""

    _prefix = None  # "kf_rnn", "kf_sklinear", "kf_kan_linear" or "kf_kan_conv2d"

    def _make_plan(self, ctx, fill):
        """Creates the plan from a desc that `fill(desc)` writes over the defaults."""
        p = self._prefix
        desc = ffi.new(p + "_desc *")
        getattr(lib, p + "_desc_init")(desc)
        fill(desc)
        out = ffi.new(p + "_plan **")
        check(getattr(lib, p + "_plan_create")(ctx.ptr, desc, out))
        destroy = getattr(lib, p + "_plan_destroy")
        ctx_ptr = ctx.ptr  # the closure keeps the context alive until the plan is destroyed

        def _destroy(ptr, _ctx=ctx_ptr):
            destroy(ptr)

        self._ptr = ffi.gc(out[0], _destroy)
        self.ctx = ctx
        self._args = {}  # argument structs (and weight arrays), refilled per call


class RnnPlan(_Plan):
    """A kf_rnn_plan (GRU or A-GRU stack) bound to a Context, which it keeps alive.

    RnnPlan(ctx, "gru" | "agru", input_size, hidden_size, num_layers=1, batch_first=False,
            bidirectional=False, dropout=0.0, gamma=0.01, dtype=DTYPE_F32)
    Every descriptor check is the library's (InvalidArgument / Unsupported with its message).
    .weight_info is the canonical weight list [(name, shape), ...] from kf_rnn_weight_info."""

    _prefix = "kf_rnn"

    def __init__(self, ctx, cell, input_size, hidden_size, num_layers=1, batch_first=False,
                 bidirectional=False, dropout=0.0, gamma=0.01, dtype=DTYPE_F32):
        def fill(desc):
            desc.cell = _CELLS.get(cell, 0) if isinstance(cell, str) else int(cell)
            desc.num_layers = int(num_layers)
            desc.input_size = int(input_size)
            desc.hidden_size = int(hidden_size)
            desc.flags = ((lib.KF_RNN_BATCH_FIRST if batch_first else 0)
                          | (lib.KF_RNN_BIDIRECTIONAL if bidirectional else 0))
            desc.dropout = float(dropout)
            desc.gamma = float(gamma)
            desc.dtype = int(dtype)

        self._make_plan(ctx, fill)
        self.cell = cell
        self.input_size = int(input_size)
        self.hidden_size = int(hidden_size)
        self.num_layers = int(num_layers)
        self.batch_first = bool(batch_first)
        self.bidirectional = bool(bidirectional)
        self.num_directions = 2 if bidirectional else 1
        self.dropout = float(dropout)
        self.gamma = float(gamma)
        self.dtype = int(dtype)
        self.weight_info = param_list(lib.kf_rnn_weight_count, lib.kf_rnn_weight_info, self._ptr)
        self._sizes = {}  # (T, B, training) -> workspace_size()
        self._shapes = {}  # (T, B) -> output_shapes()

    def _arg_struct(self, ctype, init):
        st = self._args.get(ctype)
        if st is None:
            st = self._args[ctype] = _ArgStruct(ctype, init)
        return st

    @property
    def num_weights(self):
        return len(self.weight_info)

    @property
    def weight_names(self):
        return [n for n, _ in self.weight_info]

    def output_shapes(self, T, B):
        """(y_shape, hn_shape) of T steps of B samples (kf_rnn_output_shapes: y [T, B, D*H], or
        [B, T, D*H] batch-first, and hn [L*D, B, H]; remembered per (T, B))."""
        return remembered(self._shapes, (int(T), int(B)), self._output_shapes)

    def _output_shapes(self, T, B):
        y = ffi.new("int64_t[3]")
        hn = ffi.new("int64_t[3]")
        check(lib.kf_rnn_output_shapes(self._ptr, T, B, y, hn))
        return tuple(int(v) for v in y), tuple(int(v) for v in hn)

    def workspace_size(self, T, B, training=False):
        """(workspace_bytes, reserve_bytes) for T steps of B samples (kf_rnn_workspace_size; a
        pure function of the plan and its arguments, remembered per (T, B, training))."""
        return remembered(self._sizes, (int(T), int(B), bool(training)), self._workspace_size)

    def _workspace_size(self, T, B, training):
        ws = ffi.new("size_t *")
        rs = ffi.new("size_t *")
        mode = lib.KF_MODE_TRAINING if training else lib.KF_MODE_INFERENCE
        check(lib.kf_rnn_workspace_size(self._ptr, int(T), int(B), mode, ws, rs))
        return int(ws[0]), int(rs[0])

    def forward(self, x, weights, y, h0=None, hn=None, lengths=None, training=False,
                dropout_seed=0, dropout_offset=0, workspace=None, reserve=None):
        """kf_rnn_forward. Tensors are torch tensors, numpy arrays or TensorRefs (None = absent),
        `weights` a sequence of them in canonical order; workspace/reserve are uint8 tensors or
        arrays (or raw (ptr, nbytes) pairs) or None. Every object given is held until the call
        returns. Releases the GIL."""
        weights = None if weights is None else tuple(weights)
        st = self._arg_struct("kf_rnn_forward_args", lib.kf_rnn_forward_args_init)
        # `keep` holds the weight array alive until the call returns
        keep = _fill_inputs(st, x, h0, weights, lengths, dropout_seed, dropout_offset,
                            self._args)
        st.put(("y", "hn"), (y, hn))
        args = st.args
        ws, ws_bytes = _buffer(workspace, "workspace")
        rs, rs_bytes = _buffer(reserve, "reserve")
        mode = lib.KF_MODE_TRAINING if training else lib.KF_MODE_INFERENCE
        check(lib.kf_rnn_forward(self._ptr, mode, args, ws, ws_bytes, rs, rs_bytes))
        del keep

    def backward(self, x, weights, reserve, h0=None, lengths=None, dy=None, dhn=None, dx=None,
                 dh0=None, dweights=None, accumulate=False, dropout_seed=0, dropout_offset=0,
                 workspace=None):
        """kf_rnn_backward. As forward(); `dweights` is None (no weight gradients) or a sequence
        of tensors/None in canonical order. The reserve is only read (the ABI's const). Releases
        the GIL."""
        weights = None if weights is None else tuple(weights)
        dweights = None if dweights is None else tuple(dweights)
        st = self._arg_struct("kf_rnn_backward_args", lib.kf_rnn_backward_args_init)
        # `keep` holds the weight array alive until the call returns
        keep = _fill_inputs(st, x, h0, weights, lengths, dropout_seed, dropout_offset,
                            self._args)
        st.put(("dy", "dhn", "dx", "dh0"), (dy, dhn, dx, dh0))
        args = st.args
        dwarr, ndw = _tensor_array(dweights, "dweights", self._args)
        args.dweights = dwarr
        args.num_dweights = ndw
        ws, ws_bytes = _buffer(workspace, "workspace")
        rs, rs_bytes = _buffer(reserve, "reserve")
        grad_mode = lib.KF_GRAD_ACCUMULATE if accumulate else lib.KF_GRAD_OVERWRITE
        check(lib.kf_rnn_backward(self._ptr, grad_mode, args, ws, ws_bytes, rs, rs_bytes))
        del keep, dwarr

    def __repr__(self):
        return ("kfuse.RnnPlan(%r, input_size=%d, hidden_size=%d, num_layers=%d, batch_first=%r, "
                "bidirectional=%r, dropout=%g, gamma=%g)" % (
                    self.cell, self.input_size, self.hidden_size, self.num_layers,
                    self.batch_first, self.bidirectional, self.dropout, self.gamma))


# ---- per-thread contexts -----------------------------------------------------------------------

_tls = threading.local()


def thread_context(device="cpu", device_index=0, num_threads=0):
    """The calling thread's cached Context for (device, device_index, num_threads), made on first
    use (num_threads: the CPU threads a call may use, 0 = every online core)."""
    cache = getattr(_tls, "contexts", None)
    if cache is None:
        cache = _tls.contexts = {}
    key = (device, int(device_index), int(num_threads))
    ctx = cache.get(key)
    if ctx is None:
        ctx = cache[key] = Context(device, device_index=device_index, num_threads=num_threads)
    return ctx
