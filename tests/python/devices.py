"""Which devices the Python tests can run on (shared by the test files)."""
import kfuse


def cuda_ok():
    """torch has CUDA and this kfuse build can make a CUDA context on it."""
    import torch

    if not torch.cuda.is_available():
        return False
    try:
        kfuse.Context("cuda")
        return True
    except kfuse.KfuseError:
        return False
