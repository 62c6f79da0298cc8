"""kfuse: Python bindings of the kfuse C library (fused CPU/CUDA kernels behind a stable C ABI).

    kfuse.Context, kfuse.RnnPlan     thin objects over the C handles (kfuse._lowlevel)
    kfuse.SkLinearPlan               the same over the SKLinear (sketched linear layer) handle
                                     (kfuse.sklinear)
    kfuse.KanLinearPlan              the same over the KANLinear (efficient-kan) handle (kfuse.kan)
    kfuse.KanConv2dPlan              the same over the KANConv2d (unfold + KANLinear) handle
    kfuse.KfuseError and subclasses  one per kf_status, carrying .status and the library's message
    kfuse.numpy                      rnn_forward / rnn_backward, sklinear_* and kan_* (either
                                     KAN plan) on numpy arrays
    kfuse.torch                      GRU, AGRU, SKLinear, KANLinear and KANConv2d nn.Modules
                                     (imported on demand; needs PyTorch)

Every op runs in the one C implementation; nothing here re-validates arguments or computes.
"""
from kfuse._lowlevel import (  # noqa: F401
    ffi, lib, KfuseError, InvalidArgument, Unsupported, OutOfMemory, WorkspaceTooSmall,
    BackendUnavailable, DeviceError, InternalError, Context, RnnPlan, TensorRef, check,
    version, version_string, thread_context,
)
from kfuse.sklinear import SkLinearPlan  # noqa: F401
from kfuse.kan import KanConv2dPlan, KanLinearPlan  # noqa: F401

# The version of the library this package runs on (kfuse.h is its one source).
__version__ = version_string()


def __getattr__(name):
    # `kfuse.numpy` and `kfuse.torch` load lazily, so `import kfuse` never imports torch.
    if name in ("numpy", "torch"):
        import importlib
        return importlib.import_module("kfuse." + name)
    raise AttributeError("module 'kfuse' has no attribute %r" % name)
