"""kfuse.torch from several Python threads (issue 39).

- Every module (GRU, AGRU, SKLinear, KANLinear, KANConv2d) in every dtype (float32, float64,
  bfloat16, float16), shared by the threads of a ThreadPoolExecutor, forward then backward
  (torch.autograd.grad: no shared .grad to race on): each call's output and gradients equal, bit
  for bit, those of the same calls made one at a time on one worker thread. kfuse.torch keeps a
  context and plans per thread (a kfuse context is used by one thread at a time), so the threads
  share only the read-only parameters.
- The C call does not hold the GIL: the extension is cffi's out-of-line API mode, whose wrappers
  release the GIL around every C call (Py_BEGIN_ALLOW_THREADS); shown by a Python thread that
  keeps running while another thread is inside a long kfuse forward.
"""
import importlib.machinery
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

torch = pytest.importorskip("torch")
import kfuse  # noqa: E402
import kfuse.torch as kt  # noqa: E402

DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
_INT = {8: torch.int64, 4: torch.int32, 2: torch.int16}


def bits(t):
    return t.detach().contiguous().view(_INT[t.element_size()])


def cases():
    """(name, module, x, dy) for every module in every dtype; inputs within the KAN grid."""
    torch.manual_seed(0)
    out = []
    for dt in DTYPES:
        mods = [
            ("GRU", kt.GRU(6, 8, num_layers=2, bidirectional=True, dtype=dt), (5, 3, 6)),
            ("AGRU", kt.AGRU(6, 8, num_layers=2, dtype=dt), (5, 3, 6)),
            ("SKLinear", kt.SKLinear(24, 20, num_terms=2, low_rank=2, dtype=dt), (7, 24)),
            ("KANLinear", kt.KANLinear(6, 5, dtype=dt), (7, 6)),
            ("KANConv2d", kt.KANConv2d(2, 3, 3, padding=1, dtype=dt), (2, 2, 5, 5)),
        ]
        for name, m, shape in mods:
            x = (torch.rand(shape) * 1.6 - 0.8).to(dt)
            y = call(m, x)[0]
            out.append((f"{name} {dt}", m, x, torch.randn(y.shape).to(dt)))
    return out


def call(m, x, dy=None):
    """y, and with dy the gradients of x and every parameter (torch.autograd.grad)."""
    x = x.clone().requires_grad_(dy is not None)
    y = m(x)
    y = y[0] if isinstance(y, tuple) else y
    if dy is None:
        return [y.detach()]
    params = [p for p in m.parameters() if p.requires_grad]
    return [y.detach()] + list(torch.autograd.grad(y, [x] + params, dy))


def test_modules_from_threads_bit_identical():
    work = cases()
    # the reference on one worker thread, as the pool's threads (same torch thread count)
    with ThreadPoolExecutor(max_workers=1) as ex:
        ref = [ex.submit(call, m, x, dy).result() for _, m, x, dy in work]
    with ThreadPoolExecutor(max_workers=4) as ex:
        futures = [(i, ex.submit(call, *work[i][1:])) for _ in range(3) for i in range(len(work))]
        for i, f in futures:
            got = f.result()
            assert len(got) == len(ref[i])
            for k, (a, b) in enumerate(zip(got, ref[i])):
                assert a.dtype == b.dtype and a.shape == b.shape
                assert torch.equal(bits(a), bits(b)), (
                    f"{work[i][0]}: result {k} (0 = y, 1 = dx, then the parameters') differs "
                    "from the single-threaded call's")


def test_c_call_releases_the_gil():
    # out-of-line API mode: a compiled extension module (ABI mode would be ffi.dlopen, no module)
    mod = kfuse._lowlevel.lib.__class__.__module__, kfuse._kfuse_cffi.__file__
    assert mod[1].endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)), mod
    torch.manual_seed(0)
    m = kt.GRU(64, 256)
    x = torch.randn(400, 32, 64)
    with torch.no_grad():
        m(x[:4])  # plans made, arena grown
        stamps, stop = [], threading.Event()

        def spin():
            while not stop.is_set():
                stamps.append(time.perf_counter())

        for _ in range(3):  # a loaded machine may starve the spinner once
            stamps.clear()
            stop.clear()
            th = threading.Thread(target=spin)
            th.start()
            time.sleep(0.02)
            t0 = time.perf_counter()
            m(x)
            t1 = time.perf_counter()
            stop.set()
            th.join()
            inside = [t0] + [s for s in stamps if t0 < s < t1] + [t1]
            gap = max(b - a for a, b in zip(inside, inside[1:]))
            # holding the GIL through the C call would stop the spinner for all of it
            if gap < 0.5 * (t1 - t0):
                break
        assert gap < 0.5 * (t1 - t0), (
            f"no Python thread ran for {gap:.3f} s of a {t1 - t0:.3f} s kfuse forward: "
            "the GIL was held across the C call")
