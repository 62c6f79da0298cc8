#!/usr/bin/env python3
"""A physics-informed KAN: solves the 2-D Poisson problem

    -Laplace(u) = f  on  [-1, 1]^2,   u = 0 on the boundary,   f = 2 pi^2 sin(pi x) sin(pi y)

whose solution is u = sin(pi x) sin(pi y), with a KAN [2, 32, 32, 1] (grid 5, order 3) built
from kfuse.torch.KANLinear and, side by side, the same network built from efficient-kan's
KANLinear (the efficient_kan package where it is installed, else the transcription of its
KANLinear in tests/python/kan_reference.py), from the same seed and the same initial weights
(efficient-kan's state_dict loaded into kfuse's). Loss: the mean squared PDE residual at the
interior collocation points, the Laplacian taken by torch.autograd.grad(..., create_graph=True)
twice, plus the mean squared u at the boundary points; Adam. Both models train in turn, step by
step, on the same points, so both see the same load on a shared machine.

Every --print-every steps it prints, for each model: the loss (at the weights the step starts
from), the relative L2 error against the exact solution on a 64 x 64 grid (--test-grid), the
median time of the steps since the last line, and, on the first and the last step (run under the
memory probe and left out of the times), the peak extra memory of a step: on CUDA
torch.cuda.max_memory_allocated above what was allocated before the step; on the CPU torch's
allocations (torch.profiler allocation events, as benches/cpu_kan.py counts them), plus, for
kfuse, the bytes its CPU context's arena holds (the library's own workspace, outside torch's
allocator).

    python3 examples/python/pinn_poisson.py                       # CPU: ~1 min, 2 busy cores
    python3 examples/python/pinn_poisson.py --points 1024 --steps 500  # a closer solution
    python3 examples/python/pinn_poisson.py --device cuda --points 8192 --steps 2000
    python3 examples/python/pinn_poisson.py --plot pinn.svg       # solution and error (matplotlib)

Needs the kfuse package (bash scripts/test-python.sh installs it into build/pyenv) and PyTorch.
"""
import argparse
import math
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from torch import nn  # noqa: E402

import kfuse.torch as kt  # noqa: E402
from kfuse._lowlevel import thread_context  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
sys.path.insert(0, os.path.join(REPO, "benches"))
from cpu_kan import peak_alloc  # noqa: E402  (torch's allocations during a call, CPU)

try:
    from efficient_kan import KANLinear as EfficientKANLinear
    EFFICIENT_KAN = "efficient_kan (installed package)"
except ImportError:
    from kan_reference import EfficientKANRef as EfficientKANLinear
    EFFICIENT_KAN = "efficient-kan's KANLinear as tests/python/kan_reference.py transcribes it"

WIDTHS = (2, 32, 32, 1)
MIB = 1 << 20


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    p.add_argument("--steps", type=int, default=200, help="training steps (default 200)")
    p.add_argument("--points", type=int, default=256,
                   help="interior collocation points (default 256); a quarter as many on the "
                        "boundary")
    p.add_argument("--lr", type=float, default=1e-2, help="Adam's learning rate (default 1e-2)")
    p.add_argument("--boundary-weight", type=float, default=10.0,
                   help="weight of the boundary loss (default 10)")
    p.add_argument("--grid-size", type=int, default=5)
    p.add_argument("--spline-order", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--print-every", type=int, default=25)
    p.add_argument("--test-grid", type=int, default=64,
                   help="the error is measured on an n x n grid (default 64)")
    p.add_argument("--plot", default=None, metavar="OUT.svg",
                   help="write the solutions and their errors (needs matplotlib)")
    a = p.parse_args(argv)
    if a.steps < 1 or a.print_every < 1 or a.points < 4 or a.test_grid < 2:
        p.error("--steps and --print-every must be >= 1, --points >= 4, --test-grid >= 2")
    return a


# ---- the problem -------------------------------------------------------------------------------

def exact(xy):
    return torch.sin(math.pi * xy[:, 0]) * torch.sin(math.pi * xy[:, 1])


def source(xy):
    """f = -Laplace(u) of the exact solution."""
    return 2 * math.pi ** 2 * exact(xy)


def collocation(points, seed, device, dtype):
    """(interior [points, 2] uniform in the square, f there, boundary [points // 4, 2] uniform
    on its four edges), from their own generator so the models' seed is untouched."""
    g = torch.Generator().manual_seed(seed + 1)
    interior = torch.rand(points, 2, generator=g, dtype=torch.float64) * 2 - 1
    nb = max(4, points // 4)
    t = torch.rand(nb, generator=g, dtype=torch.float64) * 2 - 1
    side = torch.arange(nb) % 4  # x = -1, x = 1, y = -1, y = 1
    fixed = torch.where(side % 2 == 0, -1.0, 1.0).double()
    boundary = torch.where((side < 2).unsqueeze(1), torch.stack([fixed, t], 1),
                           torch.stack([t, fixed], 1))
    to = dict(device=device, dtype=dtype)
    return interior.to(**to), source(interior).to(**to), boundary.to(**to)


def test_grid(n, device, dtype):
    s = torch.linspace(-1, 1, n, dtype=torch.float64)
    xy = torch.stack(torch.meshgrid(s, s, indexing="ij"), -1).reshape(-1, 2)
    return xy.to(device=device, dtype=dtype), exact(xy).to(device=device, dtype=dtype)


# ---- the models and the step -------------------------------------------------------------------

def kan(layer, grid_size, spline_order):
    return nn.Sequential(*[layer(a, b, grid_size=grid_size, spline_order=spline_order)
                           for a, b in zip(WIDTHS, WIDTHS[1:])])


def make_models(seed, device, dtype, grid_size=5, spline_order=3):
    """(kfuse's KAN, efficient-kan's KAN): efficient-kan's initialised from `seed`, then its
    state_dict (the same tensor names) loaded into kfuse's, so both start from the same
    weights."""
    torch.manual_seed(seed)
    ref = kan(EfficientKANLinear, grid_size, spline_order).to(device=device, dtype=dtype)
    fused = kan(kt.KANLinear, grid_size, spline_order).to(device=device, dtype=dtype)
    fused.load_state_dict(ref.state_dict(), strict=True)
    return fused, ref


def laplacian(model, xy):
    """(u [N], Laplace(u) [N]) at the points xy [N, 2], differentiable (create_graph) so the
    loss can be backpropagated to the weights."""
    xy = xy.detach().requires_grad_(True)
    u = model(xy).squeeze(-1)
    (du,) = torch.autograd.grad(u.sum(), xy, create_graph=True)  # rows are independent
    lap = 0
    for i in range(xy.shape[1]):
        (d2,) = torch.autograd.grad(du[:, i].sum(), xy, create_graph=True)
        lap = lap + d2[:, i]
    return u, lap


def pinn_loss(model, interior, f, boundary, boundary_weight):
    _, lap = laplacian(model, interior)
    residual = -lap - f
    ub = model(boundary).squeeze(-1)
    return residual.square().mean() + boundary_weight * ub.square().mean()


def train_step(model, opt, batch):
    """One training step: forward, the Laplacian by double autograd, the loss, backward to the
    weights, Adam. `batch`: (interior, f, boundary, boundary_weight). Returns the loss."""
    loss = pinn_loss(model, *batch)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)  # here, so a step allocates and frees its own gradients
    return loss.detach()


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def kfuse_arena_bytes():
    """The bytes the calling thread's kfuse CPU context (the one kfuse.torch uses at torch's
    thread count) holds in its arena: the library's workspace, outside torch's allocator."""
    return thread_context("cpu", 0, num_threads=torch.get_num_threads()).arena_info()[0]


def peak_extra(fn, device, arena=False):
    """(fn()'s result, the peak bytes allocated during fn() above those allocated before it):
    torch.cuda's peak on CUDA; on the CPU torch.profiler's allocation events, plus kfuse's arena
    where `arena`."""
    if device.type == "cuda":
        sync(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        out = fn()
        sync(device)
        return out, torch.cuda.max_memory_allocated(device) - before
    box = []
    peak = peak_alloc(lambda: box.append(fn()))
    return box[0], peak + (kfuse_arena_bytes() if arena else 0)


def rel_l2(model, xy, u):
    with torch.no_grad():
        return ((model(xy).squeeze(-1) - u).norm() / u.norm()).item()


# ---- the run -----------------------------------------------------------------------------------

def report(last, ms, peak):
    """The closing table: the last step's loss and error, the median time of every timed step,
    the last step's peak extra memory, and kfuse's ratios to efficient-kan."""
    print("after %d steps:\n%-13s %12s %10s %9s %15s" % (
        last["step"], "model", "loss", "rel. L2", "ms/step", "peak extra MiB"))
    for name in ms:
        print("%-13s %12.4e %10.3e %9.2f %15.2f" % (name, last[name]["loss"], last[name]["err"],
                                                     ms[name], peak[name] / MIB))
    print("kfuse: %.2fx the speed of efficient-kan, %s its peak extra memory" % (
        ms["efficient-kan"] / ms["kfuse"], "1/%.1f of" % (peak["efficient-kan"] / peak["kfuse"])
        if peak["kfuse"] else "none of"), flush=True)


def run(a):
    device, dtype = torch.device(a.device), getattr(torch, a.dtype)
    models = dict(zip(("kfuse", "efficient-kan"),
                      make_models(a.seed, device, dtype, a.grid_size, a.spline_order)))
    interior, f, boundary = collocation(a.points, a.seed, device, dtype)
    batch = (interior, f, boundary, a.boundary_weight)
    test_xy, test_u = test_grid(a.test_grid, device, dtype)
    opts = {n: torch.optim.Adam(m.parameters(), lr=a.lr) for n, m in models.items()}
    print("PINN, 2-D Poisson on [-1, 1]^2: KAN %s, grid %d, order %d, %d interior + %d boundary "
          "points, %s on %s, Adam lr %g; efficient-kan: %s" % (
              list(WIDTHS), a.grid_size, a.spline_order, a.points, boundary.shape[0], a.dtype,
              device, a.lr, EFFICIENT_KAN), flush=True)
    history, peak = [], {}
    times, every = ({n: [] for n in models} for _ in range(2))  # since the last line; all
    for step in range(1, a.steps + 1):
        probe = step in (1, a.steps)  # the memory probe: the first and the last step, untimed
        show = step == 1 or step % a.print_every == 0 or step == a.steps
        rec = {"step": step}
        for name, model in models.items():  # in turn, so both see the same machine load
            def one_step():
                return train_step(model, opts[name], batch)
            if probe:
                loss, peak[name] = peak_extra(one_step, device,
                                              arena=name == "kfuse" and device.type == "cpu")
            else:
                sync(device)
                t0 = time.perf_counter()
                loss = one_step()
                sync(device)
                times[name].append((time.perf_counter() - t0) * 1e3)
                every[name].append(times[name][-1])
            if show:
                rec[name] = {"loss": loss.item(), "err": rel_l2(model, test_xy, test_u),
                             "ms": statistics.median(times[name]) if times[name] else math.nan,
                             "peak": peak[name]}
                times[name] = []
        if show:
            history.append(rec)
            print("step %5d | " % step + " | ".join(
                "%s: loss %.4e, rel. L2 %.3e, %s%s" % (
                    n, rec[n]["loss"], rec[n]["err"], "%.2f ms/step" % rec[n]["ms"]
                    if not math.isnan(rec[n]["ms"]) else "(untimed)",
                    ", peak extra %.2f MiB" % (rec[n]["peak"] / MIB) if probe else "")
                for n in models), flush=True)
    if all(every.values()):
        report(history[-1], {n: statistics.median(t) for n, t in every.items()}, peak)
    return history, models, (test_xy, test_u)


def plot(path, history, models, test):
    """The exact solution, each model's solution and its error on the test grid, and the loss
    curves, as one figure."""
    import matplotlib
    matplotlib.use("svg" if path.endswith(".svg") else "agg")
    import matplotlib.pyplot as plt
    xy, u = test
    n = int(round(math.sqrt(u.numel())))
    grid = lambda t: t.detach().double().cpu().reshape(n, n).T.numpy()  # noqa: E731  [y, x]
    fig, ax = plt.subplots(2, 3, figsize=(13, 8))
    ext = (-1, 1, -1, 1)
    for row, name in enumerate(models):
        with torch.no_grad():
            pred = models[name](xy).squeeze(-1)
        for col, (title, img) in enumerate(((name + ": u", pred), (name + ": |u - exact|",
                                                                    (pred - u).abs()))):
            im = ax[row][col + 1].imshow(grid(img), origin="lower", extent=ext)
            ax[row][col + 1].set_title(title)
            fig.colorbar(im, ax=ax[row][col + 1])
    im = ax[0][0].imshow(grid(u), origin="lower", extent=ext)
    ax[0][0].set_title("exact u = sin(pi x) sin(pi y)")
    fig.colorbar(im, ax=ax[0][0])
    steps = [r["step"] for r in history]
    for name, style in zip(models, ({"lw": 3, "alpha": 0.5}, {"lw": 1})):  # the curves overlap
        ax[1][0].semilogy(steps, [r[name]["loss"] for r in history], "-", label=name + " loss",
                          **style)
        ax[1][0].semilogy(steps, [r[name]["err"] for r in history], "--",
                          label=name + " rel. L2 error", **style)
    ax[1][0].set_xlabel("step")
    ax[1][0].legend()
    fig.tight_layout()
    fig.savefig(path)
    print("wrote %s" % path)


def main(argv=None):
    """Runs the example; returns the history: one dict per printed step, {"step": s, "kfuse":
    {...}, "efficient-kan": {...}} with "loss", "err", "ms" and "peak" (bytes) for each."""
    a = parse_args(argv)
    history, models, test = run(a)
    if a.plot:
        plot(a.plot, history, models, test)
    return history


if __name__ == "__main__":
    main()
    sys.exit(0)
