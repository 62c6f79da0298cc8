#!/usr/bin/env python3
"""CPU benchmark of kfuse's sketched linear layer (SKLinear, Panther's randomized low-rank layer)
against its baselines, through PyTorch, in one run on one box:

  kfuse        kfuse.torch.SKLinear (the drop-in module; forward and backward in the C library)
  Panther CPU  panther.nn.SKLinear on CPU tensors when `panther` imports; otherwise a faithful
               eager-torch transcription of its CPU path (pawX/linear.cpp, *_cpu): x expanded
               to [L, N, in], two chains of bmm for the two terms, mean over terms times 0.5,
               bias added; backward as Panther's (bmm chains, sums over terms), behind an
               autograd Function as Panther's module has. The report says which one ran.
  two GEMMs    the same layer as two GEMMs in eager torch on pre-concatenated weights
               A = [S1_1..S1_L | U2_1..U2_L] [in, 2Lk], B = [U1; S2] / (2L) [2Lk, out]
               (concatenated once, outside the timing): y = addmm(bias, x A, B). Its
               forward+backward is the minimal set of GEMMs written out by hand (no autograd):
               dZ = dy B^T, dx = dZ A^T, dS1s = x^T dZ[:, :Lk] (per term), dS2s = Z[:, Lk:]^T dy
               / (2L), dbias = sum(dy): the lower bound kfuse's two-GEMM design aims at.
  nn.Linear    the dense layer it replaces, torch.nn.Linear(in, out)

(The transcription, the two GEMMs and Panther's construction work are defined once, in
benches/sklinear_baselines.py, which benches/gpu_sklinear.py shares.)

at in = out in {256, 1024, 8192}, B = 64 rows, (L, k) in {(1, 16), (4, 32)}, fp32:

  forward          torch.no_grad(): y = layer(x)
  forward+backward x and every learnable parameter require grad; y = layer(x); y.backward(dy)
                   (grads set to None before each rep). Two GEMMs: the hand-written pass.

Before timing, kfuse's outputs (y, dx, dS1s, dS2s, dbias) are compared with the Panther column's
and the two-GEMM column's (max |diff| over max |ref|), so the timing is of the same computation.
Implementations are timed interleaved rep by rep (a change in the box's load hits all alike);
median and min over the reps after warm-up, in ms.

Threads: OMP_WAIT_POLICY=PASSIVE and OPENBLAS_THREAD_TIMEOUT=4 are set before torch loads (two
thread pools spinning against each other on a small box can double torch's times otherwise).
Baselines run at their best setting: each thread count in {1, nproc} in a fresh process
(OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = torch.set_num_threads), the best median kept per
timing; kfuse runs on all cores (its context's default), taken from the nproc process.

    build/pyenv/bin/python benches/cpu_sklinear.py            # full run; writes
                                                              # benches/results/cpu_sklinear.md
    build/pyenv/bin/python benches/cpu_sklinear.py --quick    # CI smoke, < 30 s: 256 and 1024,
                                                              # 8192 at (1, 16) only, few reps,
                                                              # nproc threads only; report in
                                                              # /tmp/kfuse-bench-quick

(build/pyenv is the venv scripts/test-python.sh makes: Debian's python3-torch + the kfuse
package.) Options: --sizes 256,1024,8192, --terms 1x16,4x32, --threads 1,2 (torch settings),
--out FILE.md, --strict (exit 1 on a missed DESIGN.md target). Exit status 1 when a comparison
fails (non-finite, or a difference over --tol of max |ref|).
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings

# Must precede torch's import (OpenMP and OpenBLAS read them at load).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from isa import isa_line, python_cmd  # noqa: E402
import plots  # noqa: E402
B_ROWS = 64
ENV_KEYS = ("OMP_WAIT_POLICY", "OPENBLAS_THREAD_TIMEOUT", "OMP_NUM_THREADS",
            "OPENBLAS_NUM_THREADS")
IMPLS = ("kfuse", "panther", "gemm2", "linear")
IMPL_NAMES = {"kfuse": "kfuse", "panther": "Panther CPU", "gemm2": "two GEMMs",
              "linear": "nn.Linear"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="CI smoke run (< 30 s)")
    p.add_argument("--sizes", default=None, help="comma list of in=out sizes "
                   "(default 256,1024,8192)")
    p.add_argument("--terms", default=None, help="comma list of LxK (default 1x16,4x32)")
    p.add_argument("--threads", default=None, help="torch thread settings, comma list "
                   "(default 1,nproc; quick: nproc)")
    p.add_argument("--reps-scale", type=float, default=None,
                   help="multiply the repetition counts (default 1; quick 0.1)")
    p.add_argument("--tol", type=float, default=1e-3,
                   help="fail when max|diff| / max|ref| exceeds this (default 1e-3)")
    p.add_argument("--out", default=None, help="the report (default "
                   "benches/results/cpu_sklinear.md; quick: /tmp/kfuse-bench-quick/...)")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    p.add_argument("--quiet-threshold", type=float, default=0.15,
                   help="before each worker wait until the CPUs are less busy than this")
    p.add_argument("--max-wait", type=float, default=None,
                   help="longest wait for a quiet box per worker, s (default 300; quick 0)")
    # worker mode (internal): one process per torch thread setting
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--nthreads", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--cases", default="", help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ---- worker: measures every implementation at one torch thread setting ------------------------

def worker(a):
    import torch
    import kfuse
    import kfuse.torch as kt
    # the baselines (shared with gpu_sklinear.py); imported here since they import torch
    from sklinear_baselines import PantherCpuSKLinear, TwoGemm, panther_construction_like

    torch.set_num_threads(a.nthreads)
    panther_cls, panther_kind = None, "transcription"
    try:
        from panther.nn import SKLinear as panther_cls  # noqa: N813
        panther_kind = "panther"
    except Exception:
        panther_cls = None
    for case in a.cases.split(";"):
        n, L, k, reps, warmup = (int(v) for v in case.split(","))
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t0 = time.perf_counter()
            km = kt.SKLinear(n, n, L, k)
            t_kinit = time.perf_counter() - t0
            if panther_cls is not None:
                pm = panther_cls(n, n, L, k)
            else:
                pm = PantherCpuSKLinear(n, n, L, k)
        pm.load_state_dict(km.state_dict(), strict=True)
        t0 = time.perf_counter()
        panther_construction_like(n, n, L, k)
        t_pinit = time.perf_counter() - t0
        g2 = TwoGemm(km)
        lin = torch.nn.Linear(n, n)
        x = torch.randn(B_ROWS, n)
        dy = torch.randn(B_ROWS, n)

        # ---- agreement
        def fb_module(m):
            def run():
                for q in m.parameters():
                    q.grad = None
                xg = x.clone().requires_grad_(True)
                y = m(xg)
                y.backward(dy)
                return y, xg.grad, m.S1s.grad, m.S2s.grad, m.bias.grad
            return run

        ko = fb_module(km)()
        po = fb_module(pm)()
        go = g2.forward_backward(x, dy)
        with torch.no_grad():
            yk_f = km(x)
        gf = g2.forward(x)

        def diff(outs, refs):
            d, mx, finite = 0.0, 0.0, True
            for o, r in zip(outs, refs):
                o, r = o.detach().double(), r.detach().double()
                finite = finite and bool(torch.isfinite(o).all())
                d = max(d, float((o - r).abs().max()))
                mx = max(mx, float(r.abs().max()))
            return d / mx if mx > 0 else d, finite

        agree = {"panther": diff(ko, po), "gemm2": diff(list(ko) + [yk_f], list(go) + [gf])}

        # ---- timing, interleaved rep by rep
        def fwd(fn):
            def run():
                with torch.no_grad():
                    fn(x)
            return run

        xl = x.clone().requires_grad_(True)

        def fb_linear():
            for q in lin.parameters():
                q.grad = None
            xl.grad = None
            lin(xl).backward(dy)

        fns = {
            "fwd": {"kfuse": fwd(km), "panther": fwd(pm), "gemm2": fwd(g2.forward),
                    "linear": fwd(lin)},
            "fwdbwd": {"kfuse": fb_module(km), "panther": fb_module(pm),
                       "gemm2": lambda: g2.forward_backward(x, dy), "linear": fb_linear},
        }
        for pas, impls in fns.items():
            times = {i: [] for i in impls}
            for rep in range(warmup + reps):
                for name, fn in impls.items():
                    t0 = time.perf_counter()
                    fn()
                    t1 = time.perf_counter()
                    if rep >= warmup:
                        times[name].append((t1 - t0) * 1e3)
            for name, ts in times.items():
                rec = {"n": n, "L": L, "k": k, "pass": pas, "impl": name,
                       "threads": torch.get_num_threads(), "reps": reps, "warmup": warmup,
                       "med": statistics.median(ts), "min": min(ts),
                       "panther_kind": panther_kind}
                if name in agree:
                    rec["rel_diff"], rec["finite"] = agree[name]
                if name == "kfuse":
                    rec["init_s"] = t_kinit
                    rec["ratio_params"] = 2 * L * k * (2 * n) / (n * n)
                if name == "panther":
                    rec["init_s"] = t_pinit
                print(json.dumps(rec), flush=True)
    print(json.dumps({"done": True, "kfuse": kfuse.version_string(),
                      "torch": torch.__version__,
                      "parallel": torch.__config__.parallel_info().splitlines()[:4]}),
          flush=True)
    return 0


# ---- orchestration -----------------------------------------------------------------------------

def sh(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def lscpu():
    info = {}
    for line in sh(["lscpu"]).splitlines():
        k, _, v = line.partition(":")
        info[k.strip()] = v.strip()
    return info


def cpu_busy(interval=0.5):
    """Fraction of the box's CPU time in use over `interval` s (/proc/stat), or None."""
    def read():
        try:
            with open("/proc/stat") as f:
                v = [int(t) for t in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        idle = v[3] + (v[4] if len(v) > 4 else 0)
        return sum(v[:8]) - idle, sum(v[:8])
    a0 = read()
    time.sleep(interval)
    a1 = read()
    if a0 is None or a1 is None or a1[1] == a0[1]:
        return None
    return (a1[0] - a0[0]) / (a1[1] - a0[1])


def wait_quiet(threshold, max_wait):
    """Waits up to max_wait s until the CPUs are less than `threshold` busy (so a measurement
    does not start in the middle of someone's build); returns the last busy fraction seen."""
    t0 = time.time()
    busy = cpu_busy()
    while busy is not None and busy > threshold and time.time() - t0 < max_wait:
        time.sleep(2.0)
        busy = cpu_busy()
    return busy


def reps_for(n, scale):
    base = {256: (400, 40), 1024: (150, 15), 8192: (12, 2)}.get(n)
    if base is None:
        base = (max(5, int(4e6 / (n * n))), 2)
    return max(2, int(round(base[0] * scale))), max(1, int(round(base[1] * scale)))


def run_worker(a, threads, cases, scale):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    spec = ";".join("%d,%d,%d,%d,%d" % ((n, L, k) + reps_for(n, scale)) for n, L, k in cases)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--nthreads", str(threads),
           "--cases", spec]
    print("  torch threads %d: %s" % (threads, " ".join(cmd[1:2] + cmd[2:5])), flush=True)
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    recs, meta = [], {}
    for line in p.stdout:
        line = line.strip()
        if not line.startswith("{"):
            continue
        rec = json.loads(line)
        if rec.get("done"):
            meta = rec
            continue
        recs.append(rec)
        print("    in=out=%-5d L=%d k=%-3d %-6s %-8s %9.3f ms (min %.3f)" % (
            rec["n"], rec["L"], rec["k"], rec["pass"], rec["impl"], rec["med"], rec["min"]),
            flush=True)
    err = p.stderr.read()
    rc = p.wait()
    if rc != 0:
        print(err, file=sys.stderr)
        raise SystemExit("cpu_sklinear: worker (%d threads) failed with exit %d" % (threads, rc))
    return recs, meta


def main(argv=None):
    a = parse_args(argv)
    if a.worker:
        return worker(a)
    t_start = time.time()
    nproc = os.cpu_count() or 1
    sizes = [int(s) for s in (a.sizes or "256,1024,8192").split(",")]
    terms = [tuple(int(v) for v in t.lower().split("x")) for t in (a.terms or "1x16,4x32")
             .split(",")]
    cases = [(n, L, k) for n in sizes for (L, k) in terms]
    if a.quick and not a.sizes:
        cases = [c for c in cases if not (c[0] >= 8192 and (c[1], c[2]) != (1, 16))]
    threads = ([int(t) for t in a.threads.split(",")] if a.threads
               else ([nproc] if a.quick else sorted({1, nproc}, reverse=True)))
    if nproc not in threads:
        threads = [nproc] + threads  # kfuse is read from the all-cores process
    scale = a.reps_scale if a.reps_scale is not None else (0.05 if a.quick else 1.0)
    if a.max_wait is None:
        a.max_wait = 0.0 if a.quick else 300.0
    out = a.out or (os.path.join("/tmp", "kfuse-bench-quick", "cpu_sklinear.md") if a.quick
                    else os.path.join(HERE, "results", "cpu_sklinear.md"))
    cpu = lscpu()
    load_before = os.getloadavg()
    print("kfuse CPU SKLinear benchmark: %s, nproc %d; torch thread settings %s; %s" % (
        cpu.get("Model name", "?"), nproc, threads,
        ", ".join("%s=%s" % (k, os.environ[k]) for k in ENV_KEYS if k in os.environ)),
        flush=True)

    allrecs, meta = [], {}
    busy_seen = []
    for t in threads:
        if a.max_wait > 0:
            busy = wait_quiet(a.quiet_threshold, a.max_wait)
            busy_seen.append(busy)
            if busy is not None:
                print("  box %.0f%% busy before the %d-thread run" % (100 * busy, t), flush=True)
        if t == threads[0]:
            load_before = os.getloadavg()  # after waiting for a quiet box
        recs, m = run_worker(a, t, cases, scale)
        allrecs += recs
        meta = meta or m

    # best per (case, pass, impl): kfuse from the nproc process; baselines over settings
    best = {}
    for r in allrecs:
        if r["impl"] == "kfuse" and r["threads"] != nproc:
            continue
        key = (r["n"], r["L"], r["k"], r["pass"], r["impl"])
        if key not in best or r["med"] < best[key]["med"]:
            best[key] = r
    panther_kind = next((r["panther_kind"] for r in allrecs), "transcription")
    pname = ("the real panther.nn.SKLinear" if panther_kind == "panther" else
             "an eager-torch transcription: panther is not importable here")

    def t(n, L, k, pas, impl):
        r = best.get((n, L, k, pas, impl))
        return r["med"] if r else float("nan")

    def setting(r):
        return "" if r is None or r["impl"] == "kfuse" else " (%dt)" % r["threads"]

    rows = []
    head = ("| in=out | L | k | pass | kfuse ms | Panther CPU ms | two GEMMs ms | nn.Linear ms "
            "| Panther / kfuse | kfuse / two GEMMs | kfuse / nn.Linear | Panther / nn.Linear "
            "| max diff vs Panther, two GEMMs |")
    rows.append(head)
    rows.append("|" + "---:|" * 4 + "---:|" * 8 + "---|")
    bad = []
    for (n, L, k) in cases:
        for pas in ("fwd", "fwdbwd"):
            rk = best.get((n, L, k, pas, "kfuse"))
            cells = []
            for impl in IMPLS:
                r = best.get((n, L, k, pas, impl))
                cells.append("n/a" if r is None else "%.3f%s" % (r["med"], setting(r)))
            tk, tp, tg, tl = (t(n, L, k, pas, i) for i in IMPLS)
            dp = best.get((n, L, k, pas, "panther"), {}).get("rel_diff", float("nan"))
            dg = best.get((n, L, k, pas, "gemm2"), {}).get("rel_diff", float("nan"))
            for impl in ("panther", "gemm2"):
                r = best.get((n, L, k, pas, impl))
                if r and (not r.get("finite", True) or not r.get("rel_diff", 0) <= a.tol):
                    bad.append("%s in=out=%d L=%d k=%d" % (impl, n, L, k))
            rows.append("| %d | %d | %d | %s | %s | %s | %s | %s | %.2fx | %.2f | %.2f | %.2f "
                        "| %.1e, %.1e |" % (
                            n, L, k, "fwd" if pas == "fwd" else "fwd+bwd", *cells, tp / tk,
                            tk / tg, tk / tl, tp / tl, dp, dg))
    table = "\n".join(rows)

    # DESIGN.md's CPU SKLinear rows
    targets = []

    def target(name, val, kind, lim):
        if val != val:  # nan: not measured
            targets.append((name, "n/a", "%s %s" % (kind, lim), "not run"))
            return
        ok = val >= lim if kind == ">=" else val <= lim
        fmt = "%.2fx" if kind == ">=" else "%.2f"
        targets.append((name, fmt % val, "%s %s" % (kind, (fmt % lim)), "PASS" if ok else "MISS"))

    for pas, pn in (("fwd", "fwd"), ("fwdbwd", "fwd+bwd")):
        target("8192, L=1, k=16, %s: speed-up over Panther CPU" % pn,
               t(8192, 1, 16, pas, "panther") / t(8192, 1, 16, pas, "kfuse"), ">=", 2.5)
    # "every benchmark shape, fwd and fwd+bwd: <= 1.1x the two GEMMs"
    for (n, L, k) in cases:
        for pas, pn in (("fwd", "fwd"), ("fwdbwd", "fwd+bwd")):
            target("%d, L=%d, k=%d, %s: kfuse / two GEMMs" % (n, L, k, pn),
                   t(n, L, k, pas, "kfuse") / t(n, L, k, pas, "gemm2"), "<=", 1.1)
    # nn.Linear at 256: for a sketch with fewer parameters than the dense layer (at 256, L=4 k=32
    # has twice nn.Linear's parameters and multiply-adds: no fused kernel can be 0.8x of it)
    for (L, k) in terms:
        if 2 * L * k * (256 + 256) >= 256 * 256:
            continue
        for pas, pn in (("fwd", "fwd"), ("fwdbwd", "fwd+bwd")):
            target("256, L=%d, k=%d, %s: kfuse / nn.Linear" % (L, k, pn),
                   t(256, L, k, pas, "kfuse") / t(256, L, k, pas, "linear"), "<=", 0.8)
    ttab = ["| target (DESIGN.md, CPU SKLinear rows) | measured | limit | result |",
            "|---|---:|---:|---|"]
    ttab += ["| %s | %s | %s | %s |" % row for row in targets]
    ttab = "\n".join(ttab)

    inits = []
    for (n, L, k) in cases:
        rk = best.get((n, L, k, "fwd", "kfuse"))
        rp = next((r for r in allrecs if (r["n"], r["L"], r["k"], r["impl"], r["pass"]) ==
                   (n, L, k, "panther", "fwd") and r["threads"] == nproc), None)
        if rk and rp:
            inits.append("in=out=%d L=%d k=%d: %.2f s / %.2f s" % (n, L, k, rk["init_s"],
                                                                   rp["init_s"]))

    load_after = os.getloadavg()
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cmdline = " ".join([os.path.relpath(sys.executable, REPO)
                        if sys.executable.startswith(REPO) else sys.executable,
                        os.path.relpath(os.path.abspath(__file__), REPO)] + sys.argv[1:])
    git = sh(["git", "-C", REPO, "rev-parse", "--short", "HEAD"])
    dirty = sh(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=normal", "--",
                "capi", "cpu", "common", "bindings/python"])
    info = [
        "- date: %s; command: `%s`; wall time %.0f s" % (now, cmdline, time.time() - t_start),
        "- CPU (lscpu): %s; %s CPU(s), %s core(s) per socket, %s socket(s), %s thread(s) per "
        "core%s; L2 %s, L3 %s" % (
            cpu.get("Model name", "?"), cpu.get("CPU(s)", "?"), cpu.get("Core(s) per socket", "?"),
            cpu.get("Socket(s)", "?"), cpu.get("Thread(s) per core", "?"),
            ("; VM (%s)" % cpu["Hypervisor vendor"]) if cpu.get("Hypervisor vendor") else "",
            cpu.get("L2 cache", "?"), cpu.get("L3 cache", "?")),
        "- ISA: " + isa_line(
                        os.environ.get("KFUSE_LIBRARY_DIR", os.path.join(REPO, "build", "main")),
                        python_cmd(sys.executable)),
        "- torch %s, Python %s; torch thread settings measured: %s (fresh process each, "
        "OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = torch.set_num_threads); the baselines' best "
        "per timing is shown, its setting in parentheses (`2t` = 2 threads); torch parallel "
        "info: %s" % (meta.get("torch", "?"), platform.python_version(),
                      ", ".join(str(t) for t in threads),
                      "; ".join(s.strip() for s in meta.get("parallel", [])[1:4])),
        "- kfuse %s (git %s%s): kfuse.torch.SKLinear, CPU context on all %d online cores"
        % (meta.get("kfuse", "?"), git or "?",
           " + local changes to the library/bindings" if dirty else "", nproc),
        "- env (set before torch loads): " + ", ".join(
            "%s=%s" % (k, os.environ[k]) for k in ENV_KEYS[:2] if k in os.environ),
        "- Panther column: %s" % pname,
        "- B = %d rows, fp32; reps per timing (after warm-up): %s" % (
            B_ROWS, ", ".join("%d: %d+%d" % ((n,) + reps_for(n, scale)[::-1])
                              for n in sorted(set(c[0] for c in cases)))),
        "- load average at the first measurement / at the end (with this run's own threads): "
        "%.2f %.2f %.2f / %.2f %.2f %.2f" % (load_before +
           load_after),
    ]
    if busy_seen and all(b is not None for b in busy_seen):
        info.append("- CPUs busy just before each worker started (after waiting up to %.0f s "
                    "for < %.0f%%): %s" % (a.max_wait, 100 * a.quiet_threshold, ", ".join(
                        "%.0f%%" % (100 * b) for b in busy_seen)))
    if inits:
        info.append("- construction (not timed above), kfuse.torch.SKLinear "
                    "(kf_sklinear_init_params) / the work of Panther's constructor in torch "
                    "(sketches, Kaiming W, S = W U^T by torch.matmul): " + "; ".join(inits))
    shared = [b for b in busy_seen if b is not None and b > a.quiet_threshold]
    if load_before[0] > 1.0 or shared:
        info.append("- **Provisional:** the box was not quiet (1-minute load average %.2f at the "
                    "first measurement%s on a %d-core box shared with other jobs); times are "
                    "inflated and noisy (the interleaved order shares the disturbance between "
                    "the columns)." % (load_before[0], "; CPUs %s busy before a worker" % ", ".join(
                        "%.0f%%" % (100 * b) for b in shared) if shared else "", nproc))
    md = [
        "# CPU SKLinear benchmark (`benches/cpu_sklinear.py%s`)" % (" --quick" if a.quick
                                                                    else ""),
        "",
        "kfuse.torch.SKLinear against Panther's CPU path (%s), the same layer as two GEMMs in "
        "eager torch on pre-concatenated weights, and the dense torch.nn.Linear it replaces. "
        "Times in ms, median over the reps; ratios of medians. fwd = `torch.no_grad()` forward; "
        "fwd+bwd = forward with x and every learnable parameter requiring grad, then "
        "`y.backward(dy)` (two GEMMs: the minimal GEMMs of the pass by hand, no autograd). "
        "`Panther / kfuse` > 1: kfuse faster; `kfuse / X` < 1: kfuse faster. Last column "
        "(one check per shape, shown on both rows): max |diff| / max |ref| of kfuse's y, dx, "
        "dS1s, dS2s, dbias against the Panther and two-GEMM columns' (and of the no-grad "
        "forward's y against the two GEMMs')." % pname,
        "",
        table,
        "",
        ttab,
        "",
        "Machine and settings:",
        "",
    ] + info + [""]
    if panther_kind != "panther":
        md += ["The Panther column is a Python transcription of the ATen calls Panther's C++ "
               "CPU functions make (pawX/linear.cpp); Panther issues them from C++, so at the "
               "smallest sizes its real times would be lower by the Python cost of about a "
               "dozen op dispatches (a few microseconds each).", ""]
    if bad:
        md += ["**Comparison failures:** " + "; ".join(bad), ""]
    text = "\n".join(md)
    print()
    print(table)
    print()
    print(ttab)
    print()
    print("\n".join(info))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        f.write(text)
    print("wrote %s" % out)
    plots.times_chart(os.path.splitext(out)[0] + "_times.svg",
                      "CPU SKLinear, B=64 (best median)",
                      [("%d L=%d k=%d %s" % (n, L, k, "fwd" if pas == "fwd" else "fwd+bwd"),
                        [(IMPL_NAMES[i], best[(n, L, k, pas, i)]["med"])
                         for i in IMPLS if (n, L, k, pas, i) in best])
                       for (n, L, k) in cases for pas in ("fwd", "fwdbwd")])
    for b in bad:
        print("cpu_sklinear: outputs disagree: %s" % b, file=sys.stderr)
    if bad:
        return 1
    if a.strict and any(r[3] == "MISS" for r in targets):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
