"""Python per-call overhead of kfuse.torch at tiny shapes (DESIGN.md: "Python per-call overhead
(tiny shapes): within 8 us of the bare C call on the CPU").

For each layer, side by side in one run, interleaved rep by rep on the same thread:
  module      the kfuse.torch module call, as a user makes it
  op          the registered operator called directly, torch.ops.kfuse.* (torch >= 2.4): the
              dispatcher path torch.compile/export/trace use, for comparison
  plan        the low-level plan call (kfuse.SkLinearPlan / KanLinearPlan / RnnPlan .forward on
              preallocated tensors): the tensors' conversion, the cffi call and the C work
  C           the bare C call (fwd): the library function on an argument struct filled once
              before timing, through cffi: the baseline of DESIGN.md's overhead target
  torch       the torch layer of the same size (torch.nn.Linear, torch.nn.GRU)
fwd: forward under torch.no_grad() (entered once around each rep's calls); fwd+bwd: x and the
parameters require grad, then y.backward(ones) (plan: its forward and backward calls). The
fastest of REPS reps of CALLS calls, us of process CPU time per call (time.process_time: every
thread of the process, not the time other jobs on a shared box take; the fastest rep is the one
they disturbed least); "module - C" is the Python path's cost (DESIGN.md's target: within 8 us on
the CPU, 15 us on CUDA).

--device cuda: the same on CUDA tensors (the plans on a CUDA context on torch's current stream;
the bare C call with no workspace, so the context's arena serves it after the warm-up), us of
wall time per call, each rep ended by torch.cuda.synchronize() inside its time: the host's cost
per call where it is larger than the device's, as a loop of calls sees it.

Run: python benches/python_overhead.py [--reps N] [--md FILE] [--device cuda]
(OMP_WAIT_POLICY=PASSIVE as scripts/test-python.sh.)
"""
import argparse
import contextlib
import os
import platform
import subprocess
import sys
import time
import warnings

import torch

import kfuse
import kfuse.torch as kt

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import isa  # noqa: E402

CALLS = 200


def timer(fn, context=contextlib.nullcontext, cuda=False):
    """us per call of fn over CALLS calls made inside one `context()` (torch.no_grad for the
    forward columns): the process's CPU time (time.process_time, every thread of it), so that
    time the shared box's other jobs take while this process waits is not counted; on CUDA wall
    time up to a device synchronisation after the calls."""
    clock = time.perf_counter if cuda else time.process_time

    def run():
        with context():
            t = clock()
            for _ in range(CALLS):
                fn()
            if cuda:
                torch.cuda.synchronize()
            return (clock() - t) / CALLS * 1e6
    return run


def make_context(dev):
    """A kfuse context for the plan columns: the CPU's with torch's thread count, or CUDA's on
    torch's current stream."""
    if dev.type == "cuda":
        return kfuse.Context("cuda", device_index=dev.index or 0,
                             stream=torch.cuda.current_stream(dev).cuda_stream)
    return kfuse.Context("cpu", num_threads=torch.get_num_threads())


def sklinear_case(dev):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = kt.SKLinear(32, 32, 1, 4).to(dev)
    lin = torch.nn.Linear(32, 32).to(dev)
    x = torch.randn(4, 32, device=dev)
    y = torch.empty(4, 32, device=dev)
    plan = kfuse.SkLinearPlan(make_context(dev), 32, 32, 1, 4)
    P = [m.S1s.detach(), m.S2s.detach(), m.U1s, m.U2s]
    b = m.bias.detach()
    dx, d1, d2, db = torch.empty(4, 32, device=dev), torch.empty_like(P[0]), \
        torch.empty_like(P[1]), torch.empty(32, device=dev)
    op = getattr(getattr(torch.ops, "kfuse", None), "sklinear", None)
    plan.forward(x, *P, y, bias=b)  # fills the plan's argument struct, reused below
    args = plan._args["kf_sklinear_forward_args"][0]
    keep = (x, P, y, b)
    return dict(
        bare=lambda: (kfuse.lib.kf_sklinear_forward(plan._ptr, args, kfuse.ffi.NULL, 0), keep),
        name="SKLinear(32, 32, 1, 4), x [4, 32]", torch_name="nn.Linear(32, 32)",
        module=lambda xx: m(xx), torch_fn=lambda xx: lin(xx),
        op=None if op is None else (lambda xx: op(xx, m.S1s, m.S2s, m.U1s, m.U2s, m.bias)),
        plan_fwd=lambda: plan.forward(x, *P, y, bias=b),
        plan_bwd=lambda: plan.backward(x, *P, y, dx=dx, dS1s=d1, dS2s=d2, dbias=db),
        x=x, params=list(m.parameters()) + list(lin.parameters()))


def kan_case(dev):
    m = kt.KANLinear(8, 8).to(dev)
    lin = torch.nn.Linear(8, 8).to(dev)
    x = torch.randn(4, 8, device=dev)
    y = torch.empty(4, 8, device=dev)
    plan = kfuse.KanLinearPlan(make_context(dev), 8, 8)
    P = [m.grid, m.base_weight.detach(), m.spline_weight.detach()]
    ss = m.spline_scaler.detach()
    g = [torch.empty(4, 8, device=dev), torch.empty_like(P[1]), torch.empty_like(P[2]),
         torch.empty_like(ss)]
    op = getattr(getattr(torch.ops, "kfuse", None), "kan_linear", None)
    plan.forward(x, *P, y, spline_scaler=ss)  # fills the plan's argument struct, reused below
    args = plan._args["kf_kan_linear_forward_args"][0]
    keep = (x, P, y, ss)
    return dict(
        bare=lambda: (kfuse.lib.kf_kan_linear_forward(plan._ptr, args, kfuse.ffi.NULL, 0), keep),
        name="KANLinear(8, 8), x [4, 8]", torch_name="nn.Linear(8, 8)",
        module=lambda xx: m(xx), torch_fn=lambda xx: lin(xx),
        op=None if op is None else (lambda xx: op(xx, m.grid, m.base_weight, m.spline_weight,
                                                  m.spline_scaler)),
        plan_fwd=lambda: plan.forward(x, *P, y, spline_scaler=ss),
        plan_bwd=lambda: plan.backward(x, *P, y, spline_scaler=ss, dx=g[0], dbase_weight=g[1],
                                       dspline_weight=g[2], dspline_scaler=g[3]),
        x=x, params=list(m.parameters()) + list(lin.parameters()))


def gru_case(dev):
    m = kt.GRU(8, 16).to(dev)
    ref = torch.nn.GRU(8, 16).to(dev)
    x = torch.randn(4, 2, 8, device=dev)
    y, hn = torch.empty(4, 2, 16, device=dev), torch.empty(1, 2, 16, device=dev)
    plan = kfuse.RnnPlan(make_context(dev), "gru", 8, 16)
    W = [w.detach() for w in m._canonical_weights()]
    rs = torch.empty(plan.workspace_size(4, 2, True)[1], dtype=torch.uint8, device=dev)
    dW = [torch.empty_like(w) for w in W]
    dx = torch.empty_like(x)
    op = getattr(getattr(torch.ops, "kfuse", None), "rnn", None)

    def op_call(xx):
        return op(xx, None, None, m._canonical_weights(), "gru", 8, 16, 1, False, False, 0.0,
                  0.01, torch.is_grad_enabled(), None)[0]

    plan.forward(x, W, y, hn=hn)  # fills the plan's argument struct, reused below
    args = plan._args["kf_rnn_forward_args"].args
    keep = (x, W, y, hn)
    NULL = kfuse.ffi.NULL
    return dict(
        bare=lambda: (kfuse.lib.kf_rnn_forward(plan._ptr, kfuse.lib.KF_MODE_INFERENCE, args,
                                               NULL, 0, NULL, 0), keep),
        name="GRU(8, 16), x [T=4, B=2, 8]", torch_name="nn.GRU(8, 16)",
        module=lambda xx: m(xx)[0], torch_fn=lambda xx: ref(xx)[0],
        op=None if op is None else op_call,
        plan_fwd=lambda: plan.forward(x, W, y, hn=hn),
        plan_bwd=lambda: (plan.forward(x, W, y, hn=hn, training=True, reserve=rs),
                          plan.backward(x, W, rs, dy=y, dx=dx, dweights=dW)),
        x=x, params=list(m.parameters()) + list(ref.parameters()))


def measure(case, reps, cuda):
    x = case["x"]
    xg = x.clone().requires_grad_(True)

    def fb(fn):
        def run():
            out = fn(xg)
            out.backward(torch.ones_like(out))
        return run

    def nograd(fn):  # timed inside torch.no_grad() (the "fwd" timers enter it once per rep)
        return lambda: fn(x)

    cols = {"fwd": {"module": nograd(case["module"]), "torch": nograd(case["torch_fn"]),
                    "plan": case["plan_fwd"], "C": case["bare"]},
            "fwd+bwd": {"module": fb(case["module"]), "torch": fb(case["torch_fn"]),
                        "plan": lambda: (case["plan_fwd"](), case["plan_bwd"]())}}
    if case["op"] is not None:
        cols["fwd"]["op"] = nograd(case["op"])
        cols["fwd+bwd"]["op"] = fb(case["op"])
    out = {}
    for mode, fns in cols.items():
        context = torch.no_grad if mode == "fwd" else contextlib.nullcontext
        timers = {k: timer(f, context, cuda) for k, f in fns.items()}
        for t in timers.values():  # warm-up
            t()
        samples = {k: [] for k in timers}
        for _ in range(reps):
            for k, t in timers.items():
                samples[k].append(t())
        for p in case["params"]:
            p.grad = None
        out[mode] = {k: min(v) for k, v in samples.items()}
    return out


def cpu_model():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--md", help="also write the table as markdown to this file")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    a = ap.parse_args()
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    rows = []
    for make in (sklinear_case, kan_case, gru_case):
        case = make(dev)
        res = measure(case, a.reps, cuda)
        for mode, r in res.items():
            rows.append((case["name"], case["torch_name"], mode, r))
    has_op = any("op" in r for *_, r in rows)
    head = ("| layer | pass | kfuse module | " + ("torch.ops.kfuse | " if has_op else "")
            + "plan call | bare C call | module - C | torch layer | module / torch |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for name, tname, mode, r in rows:
        cells = [name, mode, "%.1f" % r["module"]]
        if has_op:
            cells.append("%.1f" % r["op"] if "op" in r else "-")
        base = r.get("C")
        cells += ["%.1f" % r["plan"], "-" if base is None else "%.1f" % base,
                  "-" if base is None else "%.1f" % (r["module"] - base),
                  "%.1f (%s)" % (r["torch"], tname), "%.1fx" % (r["module"] / r["torch"])]
        lines.append("| " + " | ".join(cells) + " |")
    env = ["- machine: %s, %d online cores; %s" % (
               cpu_model(), os.cpu_count(),
               isa.isa_line(os.path.join(HERE, "..", "build", "main"),
                            isa.python_cmd(sys.executable))),
           "- torch %s (%d threads), Python %s, kfuse %s; OMP_WAIT_POLICY=%s" % (
               torch.__version__, torch.get_num_threads(), platform.python_version(),
               kfuse.version_string(), os.environ.get("OMP_WAIT_POLICY", "(unset)")),
           "- us of %s per call, fastest of %d reps of %d calls, columns interleaved rep by "
           "rep" % ("wall time up to a device synchronisation, on %s"
                    % torch.cuda.get_device_name(dev) if cuda else "process CPU time",
                    a.reps, CALLS)]
    text = "\n".join(lines + [""] + env)
    print(text)
    if a.md:
        with open(a.md, "a") as f:
            f.write(text + "\n\n")


if __name__ == "__main__":
    main()
