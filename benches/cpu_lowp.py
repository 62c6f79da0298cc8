"""bfloat16 and float16 against float32 for every kfuse op on the CPU, at the CPU benchmark shapes
of DESIGN.md (kfuse.torch modules, forward and forward+backward).

A low-precision plan stores its tensors in the low type and runs the float32 arithmetic, its
kernels reading and writing the low types themselves (SKLinear since 1.7.1, the KAN layers since
1.7.3, the recurrent layers since 1.7.4; before, float32 copies of every tensor), so its time is
float32's plus the conversions, O(tensor size) against the kernels' O(flops); this prints the
ratio per op. The three dtypes are interleaved rep by rep
(a loaded box slows them alike) and the median of each is kept.

    python benches/cpu_lowp.py [--threads 1] [--reps 7] [--calls 1] [--only NAME] [--quick]

--calls N times N calls in a row per sample (their mean): a steady loop, where a layer's
tensors stay in cache from one call to the next as in a training or inference loop; with 1 (the
default) each sample is one call after the other dtypes' calls, closer to a cold call.
--only keeps the cases whose name contains NAME.
Environment: OMP_WAIT_POLICY=PASSIVE is set here before torch loads (DESIGN.md).
"""
import argparse
import os
import statistics
import time
import warnings

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

import kfuse  # noqa: E402
import kfuse.torch as kt  # noqa: E402

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def cases(quick):
    """(name, module factory(dtype), input shape)."""
    T, B = (8, 32) if quick else (28, 128)
    return [
        ("GRU T=%d I=28 H=128 B=%d" % (T, B), lambda dt: kt.GRU(28, 128, dtype=dt), (T, B, 28)),
        ("A-GRU T=%d I=28 H=128 B=%d" % (T, B), lambda dt: kt.AGRU(28, 128, dtype=dt),
         (T, B, 28)),
        ("SKLinear 256^2 L=1 k=16 B=64", lambda dt: _skl(256, dt), (64, 256)),
        ("SKLinear 8192^2 L=1 k=16 B=64", lambda dt: _skl(2048 if quick else 8192, dt),
         (64, 2048 if quick else 8192)),
        ("KANLinear (1024, 256, 256)", lambda dt: kt.KANLinear(256, 256, dtype=dt),
         (1024, 256)),
        ("KANConv2d 3x3 32->32 28x28 B=%d" % (4 if quick else 32),
         lambda dt: kt.KANConv2d(32, 32, 3, padding=1, dtype=dt),
         (4 if quick else 32, 32, 28, 28)),
    ]


def _skl(n, dt):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return kt.SKLinear(n, n, 1, 16, dtype=dt)


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def step(m, x, backward):
    if not backward:
        with torch.no_grad():
            _first(m(x))
        return
    x.grad = None  # (torch's own float16 accumulation on the CPU is slow: not kfuse's time)
    for p in m.parameters():
        p.grad = None
    y = _first(m(x))
    y.backward(torch.ones_like(y))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--calls", type=int, default=1, help="calls per timed sample (their mean)")
    ap.add_argument("--only", default="", help="only the cases whose name contains this")
    ap.add_argument("--quick", action="store_true", help="small shapes, for a smoke run")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print("kfuse %s, torch %s, %d thread(s), %d interleaved reps of %d call(s), median ms per call"
          % (kfuse.version_string(), torch.__version__, a.threads, a.reps, a.calls))
    print("| op | pass | float32 ms | bfloat16 ms | float16 ms | bf16/f32 | f16/f32 |")
    print("|---|---|---|---|---|---|---|")
    for name, make, shape in cases(a.quick):
        if a.only not in name:
            continue
        torch.manual_seed(0)
        mods = {dt: make(dt) for dt in DTYPES}
        xs = {dt: torch.randn(*shape).to(dt).requires_grad_(True) for dt in DTYPES}
        for backward in (False, True):
            times = {dt: [] for dt in DTYPES}
            for dt in DTYPES:
                step(mods[dt], xs[dt], backward)  # warm: plans, arena
            for _ in range(a.reps):
                for dt in DTYPES:
                    t0 = time.perf_counter()
                    for _ in range(a.calls):
                        step(mods[dt], xs[dt], backward)
                    times[dt].append((time.perf_counter() - t0) / a.calls)
            med = {dt: statistics.median(v) * 1e3 for dt, v in times.items()}
            f32 = med[torch.float32]
            print("| %s | %s | %.2f | %.2f | %.2f | %.2f | %.2f |"
                  % (name, "fwd+bwd" if backward else "fwd", f32, med[torch.bfloat16],
                     med[torch.float16], med[torch.bfloat16] / f32, med[torch.float16] / f32),
                  flush=True)


if __name__ == "__main__":
    main()
