#!/usr/bin/env python3
"""CPU benchmark of kfuse's KANConv2d against unfold + efficient-kan's math and a dense GEMM:

  kfuse          kfuse.torch.KANConv2d (kf_kan_conv2d_forward/backward through the Python
                 binding: the library's CPU context on all cores, its arena as workspace)
  unfold+ekan    torch.nn.functional.unfold, then the eager-torch transcription of efficient-kan's
                 KANLinear (benches/cpu_kan.py's b_splines and kan_forward: materialised bases),
                 the output folded back to [B, out, Ho, Wo]; fwd+bwd by autograd, all gradients
  GEMM           torch.mm [N, K] x [K, out] with N = B*Ho*Wo, K = F*(G+k+1), F = C_in*kh*kw:
                 the implicit GEMM's forward product; fwd+bwd: the pass's three products

for KANConv2d 3x3, padding 1, at (B, C_in, C_out, H, W) = (32, 32, 32, 28, 28) (DESIGN.md's CPU
target) and (32, 32, 64, 32, 32), G = 5, k = 3, fp32 (--large adds B = 128, the issue's
batch, for both). torch: a
fresh process per thread setting (OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = set_num_threads; the
first shape at every setting, the others at the last), best median kept, unfold+ekan and GEMM
interleaved rep by rep; kfuse in its own process before and after them. About 4 minutes on a
quiet 2-core box (unfold+ekan takes seconds per pass). Peak extra memory: kfuse's kf_kan_conv2d_workspace_size; torch's from
torch.profiler allocation events less the outputs (as benches/cpu_kan.py measures it).

    /usr/bin/python3 benches/cpu_kan_conv.py [--quick] [--write | --out FILE.md]
        [--python build/pyenv/bin/python]

The workers run under --python (default build/pyenv/bin/python, the virtual environment
scripts/test-python.sh installs kfuse into, else this interpreter). Prints the table; --write
writes benches/results/cpu_kan_conv.md, --out FILE writes FILE. --quick: one small shape, few
reps, no quiet-box wait (a CI smoke run).
"""
import argparse, datetime, json, os, platform, statistics, subprocess, sys, time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from cpu_kan import (  # noqa: E402  (the eager baseline, the memory probe, the box helpers)
    G, K_ORD, MIB, best_median, cpu_line, eager_memory, kan_forward, sh, time_interleaved,
    wait_quiet,
)
from isa import isa_line, python_cmd  # noqa: E402
import plots  # noqa: E402

KERNEL, PAD = 3, 1
TARGET = (32, 32, 32, 28, 28)  # DESIGN.md: CPU KANConv2d 3x3, 32->32 on 28x28, B=32


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="one small shape, few reps, no wait")
    p.add_argument("--large", action="store_true", help="also B=128 for both shapes (torch: last "
                   "thread setting only)")
    p.add_argument("--write", action="store_true", help="write benches/results/cpu_kan_conv.md")
    p.add_argument("--out", default=None, help="write the results file here")
    p.add_argument("--python", default=None, help="interpreter of the workers (needs torch and "
                   "kfuse)")
    p.add_argument("--threads", default="1,%d" % (os.cpu_count() or 1),
                   help="torch thread settings")
    p.add_argument("--budget", type=float, default=20.0,
                   help="seconds per timed loop (reps stop after it)")
    p.add_argument("--max-wait", type=float, default=None,
                   help="quiet-box wait, s (default 120; --quick: 0)")
    p.add_argument("--worker", default="", help=argparse.SUPPRESS)
    p.add_argument("--cases", default="", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def out_hw(H, W):
    return (H + 2 * PAD - KERNEL) + 1, (W + 2 * PAD - KERNEL) + 1


def conv_kan_forward(x, grid, params, kernel=KERNEL, pad=PAD, k=K_ORD):
    """The unfold+ekan baseline (benches/gpu_kan.py imports it): F.unfold of x [B, C_in, H, W]
    (stride 1, dilation 1), efficient-kan's KANLinear over the F = C_in*kernel*kernel patch
    features (kan_forward: materialised bases; params = base_weight, spline_weight,
    spline_scaler), the output folded back to [B, C_out, Ho, Wo]."""
    import torch.nn.functional as F
    B, cin, H, W = x.shape
    Ho, Wo = H + 2 * pad - kernel + 1, W + 2 * pad - kernel + 1
    nF, N, cout = cin * kernel * kernel, B * Ho * Wo, params[0].shape[0]
    p = F.unfold(x, kernel, padding=pad).transpose(1, 2).reshape(N, nF)
    y = kan_forward(p, grid, *params, k)  # [N, out]
    return y.view(B, Ho * Wo, cout).transpose(1, 2).reshape(B, cout, Ho, Wo)


def worker(a):
    import torch
    kfuse_run = a.worker == "kfuse"
    if kfuse_run:  # the library's CPU context: its own threads, one per core
        import kfuse
        import kfuse.torch as kt
        nt = os.cpu_count() or 1
    else:
        nt = int(os.environ["OMP_NUM_THREADS"])
        torch.set_num_threads(nt)

    for case in a.cases.split(";"):
        B, cin, cout, H, W, reps, warmup, budget, want_mem = (float(v) for v in case.split(","))
        B, cin, cout, H, W, reps, warmup = (int(v) for v in (B, cin, cout, H, W, reps, warmup))
        if want_mem and not kfuse_run:
            warmup = 0  # the profiled passes below are the warm-up
        Ho, Wo = out_hw(H, W)
        nF, C, N = cin * KERNEL * KERNEL, G + K_ORD, B * Ho * Wo
        torch.manual_seed(0)
        h = 2.0 / G
        grid = (torch.arange(-K_ORD, G + K_ORD + 1) * h - 1.0).expand(nF, -1).contiguous()
        x = torch.rand(B, cin, H, W) * 2.4 - 1.2
        params = [torch.rand(cout, nF) * 0.2 - 0.1, torch.rand(cout, nF, C) * 0.2 - 0.1,
                  torch.rand(cout, nF) + 0.5]
        dy = torch.rand(B, cout, Ho, Wo) * 2 - 1
        xg = x.clone().requires_grad_(True)
        fns, mem = {}, {}
        if kfuse_run:
            m = kt.KANConv2d(cin, cout, KERNEL, padding=PAD)
            m.load_state_dict(dict(zip(("base_weight", "spline_weight", "spline_scaler"),
                                       params), grid=grid), strict=True)

            def kfuse_fwd():
                with torch.no_grad():
                    m(x)

            def kfuse_fb():
                xg.grad = None
                m.zero_grad(set_to_none=True)
                m(xg).backward(dy)

            fns = {"fwd": {"kfuse": kfuse_fwd}, "fwdbwd": {"kfuse": kfuse_fb}}
            plan = kfuse.KanConv2dPlan(kfuse.Context(), cin, cout, KERNEL, padding=PAD)
            mem = {"ws": plan.workspace_size(B, H, W), "version": kfuse.version_string()}
            kfuse_fb()  # warm the plan cache
        else:
            Kd = nF * (C + 1)
            A, Wt = torch.rand(N, Kd), torch.rand(Kd, cout)
            dyr = dy.permute(0, 2, 3, 1).reshape(N, cout)
            pg = [q.clone().requires_grad_(True) for q in params]

            def unfold_kan(xx, ps):  # F.unfold + efficient-kan's KANLinear, folded back
                return conv_kan_forward(xx, grid, ps)

            def ekan_fwd():
                with torch.no_grad():
                    unfold_kan(x, params)

            def ekan_fb():
                xg.grad = None
                for q in pg:
                    q.grad = None
                unfold_kan(xg, pg).backward(dy)

            def gemm_fwd():
                torch.mm(A, Wt)

            def gemm_fb():
                torch.mm(A, Wt), torch.mm(dyr, Wt.t()), torch.mm(dyr.t(), A)

            fns = {"fwd": {"ekan": ekan_fwd, "gemm": gemm_fwd},
                   "fwdbwd": {"ekan": ekan_fb, "gemm": gemm_fb}}
            if want_mem:  # the profiled passes also serve as warm-up
                out_f = B * cout * Ho * Wo * 4
                out_b = out_f + (x.numel() + cout * nF * (C + 2)) * 4
                mem = eager_memory(ekan_fwd, ekan_fb, out_f, out_b, [xg, grid] + pg)
                mem.update(bases=N * nF * C * 4, patches=N * nF * 4)

        for pas in ("fwd", "fwdbwd"):
            times = time_interleaved(fns[pas], reps, warmup, budget)
            for name, ts in times.items():
                rec = {"shape": [B, cin, cout, H, W], "pass": pas, "impl": name, "threads": nt,
                       "reps": len(ts), "med": statistics.median(ts), "min": min(ts)}
                if name in ("ekan", "kfuse"):
                    rec.update(mem)
                print(json.dumps(rec), flush=True)
    print(json.dumps({"done": True, "torch": torch.__version__}), flush=True)
    return 0


def main(argv=None):
    a = parse_args(argv)
    if a.worker:
        return worker(a)
    t0 = time.time()
    nproc = os.cpu_count() or 1
    max_wait = a.max_wait if a.max_wait is not None else (0.0 if a.quick else 120.0)
    shapes = ([(4, 8, 8, 12, 12)] if a.quick else
              [TARGET, (32, 32, 64, 32, 32)]
              + ([(128, 32, 32, 28, 28), (128, 32, 64, 32, 32)] if a.large else []))
    plan = {s: (3, 1, 0) if a.quick else (5, 1, a.budget) for s in shapes}
    threads = [int(t) for t in a.threads.split(",")]
    if a.quick:
        threads = threads[-1:]
    py = a.python or os.path.join(REPO, "build", "pyenv", "bin", "python")
    if not os.access(py, os.X_OK):
        py = sys.executable
    busy, recs, meta = [], [], {}

    def spec(ss, want_mem):
        return ";".join("%d,%d,%d,%d,%d,%d,%d,%g,%d" % (s + plan[s] + (want_mem,)) for s in ss)

    def run(kind, t, ss, want_mem):
        busy.append(wait_quiet(max_wait))  # max_wait 0: just the busy fraction
        env = dict(os.environ)
        if t:
            env.update(OMP_NUM_THREADS=str(t), OPENBLAS_NUM_THREADS=str(t))
        p = subprocess.run([py, os.path.abspath(__file__), "--worker", kind, "--cases",
                            spec(ss, want_mem)], env=env, capture_output=True, text=True)
        if p.returncode:
            raise SystemExit("cpu_kan_conv: %s worker failed:\n%s" % (kind, p.stderr))
        for line in p.stdout.splitlines():
            rec = json.loads(line)
            if rec.get("done"):
                meta.update(rec)
                continue
            rec["shape"] = tuple(rec["shape"])
            recs.append(rec)
            print("  %s %dt %s %-6s %-5s %9.2f ms (min %.2f, %d reps)" % (
                kind, rec["threads"], rec["shape"], rec["pass"], rec["impl"], rec["med"],
                rec["min"], rec["reps"]), flush=True)

    run("kfuse", 0, shapes, True)  # kfuse's own threads: all cores, whatever torch's setting
    for t in threads:  # the first shape at every setting, the others at the last only
        run("torch", t, [s for s in shapes if s == shapes[0] or t == threads[-1]],
            t == threads[-1])
    run("kfuse", 0, shapes, True)  # again after torch: the best of the two runs is kept

    best = best_median(recs, lambda r: (r["shape"], r["pass"], r["impl"]))
    ekan_mem = {r["shape"]: r for r in recs if "fwd_peak" in r}
    rows = ["| (B, C_in, C_out, H, W) | pass | kfuse ms | unfold+ekan ms | GEMM ms | "
            "unfold+ekan / kfuse | kfuse / GEMM | peak extra: kfuse | peak extra: unfold+ekan | "
            "memory ratio |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    targets = []
    for s in shapes:
        for pas in ("fwd", "fwdbwd"):
            k_, e_, g_ = (best[(s, pas, i)] for i in ("kfuse", "ekan", "gemm"))
            e_mem = ekan_mem[s][pas + "_peak"]
            ws = max(k_["ws"], 1)
            rows.append("| %s | %s | %.2f | %.2f (%dt) | %.2f (%dt) | %.2fx | %.2f | %.2f MiB | "
                        "%.1f MiB | 1/%.0f |" % (
                            s, "fwd" if pas == "fwd" else "fwd+bwd", k_["med"], e_["med"],
                            e_["threads"], g_["med"], g_["threads"], e_["med"] / k_["med"],
                            k_["med"] / g_["med"], k_["ws"] / MIB, e_mem / MIB, e_mem / ws))
            if s == TARGET and pas == "fwdbwd":
                sp, mr = e_["med"] / k_["med"], e_mem / ws
                targets += [("fwd+bwd: speed-up over unfold + efficient-kan", "%.2fx" % sp,
                             ">= 10x", "PASS" if sp >= 10 else "MISS"),
                            ("fwd+bwd: peak extra memory, unfold+ekan / kfuse", "%.0fx" % mr,
                             ">= 10x", "PASS" if mr >= 10 else "MISS")]
    mems = ["- %s: patches [N, F] %.1f MiB, bases tensor [N, F, G+k] %.1f MiB (N = B*Ho*Wo = %d, "
            "F = %d); autograd-saved tensors %.1f MiB" % (
                s, ekan_mem[s]["patches"] / MIB, ekan_mem[s]["bases"] / MIB,
                s[0] * out_hw(s[3], s[4])[0] * out_hw(s[3], s[4])[1], s[1] * KERNEL * KERNEL,
                ekan_mem[s]["saved"] / MIB) for s in shapes if s in ekan_mem]
    git = sh(["git", "-C", REPO, "rev-parse", "--short", "HEAD"]).strip()
    dirty = sh(["git", "-C", REPO, "status", "--porcelain", "--", "capi", "cpu", "common",
                "bindings/python"])
    load = os.getloadavg()
    kf = best[(shapes[0], "fwd", "kfuse")]
    md = ["# CPU KANConv2d benchmark (`benches/cpu_kan_conv.py%s`)" % (
              " --quick" if a.quick else ""),
          "", "kfuse's KANConv2d (kfuse.torch.KANConv2d: the C library's implicit GEMM, all "
          "cores) against F.unfold + efficient-kan's KANLinear math in eager torch (the "
          "transcription in benches/cpu_kan.py: materialised bases; fwd+bwd by autograd, all "
          "gradients) and a dense GEMM with N = B*Ho*Wo rows and K = C_in*%d*%d*(G+k+1) (fwd: "
          "the one product; fwd+bwd: the three products of the pass). Kernel %dx%d, padding %d, "
          "stride 1, G = %d, k = %d, fp32. Median ms; torch's best thread setting in "
          "parentheses. Peak extra memory: kfuse's workspace (kf_kan_conv2d_workspace_size); "
          "unfold+ekan's from torch.profiler allocation events, less its outputs (y, and for "
          "fwd+bwd dx and the parameter gradients)." % (
              KERNEL, KERNEL, KERNEL, KERNEL, PAD, G, K_ORD), "", "\n".join(rows), ""]
    if targets:
        md += ["| target (DESIGN.md, CPU KANConv2d 3x3, 32->32 on 28x28, B=32) | measured | "
               "limit | result |", "|---|---:|---:|---|"] + \
              ["| %s | %s | %s | %s |" % t for t in targets] + [""]
    md += ["Machine and settings:", "",
           "- date: %s; command: `/usr/bin/python3 benches/cpu_kan_conv.py %s`; wall time "
           "%.0f s" % (datetime.datetime.now(datetime.timezone.utc).strftime(
               "%Y-%m-%d %H:%M UTC"), " ".join(sys.argv[1:] if argv is None else argv),
               time.time() - t0),
           "- " + cpu_line(),
           "- ISA: " + isa_line(
                           os.environ.get("KFUSE_LIBRARY_DIR", os.path.join(REPO, "build", "main")),
                           python_cmd(py)),
           "- torch %s, Python %s (workers: %s); torch thread settings %s, a fresh process "
           "each; env %s" % (meta.get("torch", "?"), platform.python_version(), py, threads,
                             ", ".join("%s=%s" % (k, os.environ[k]) for k in (
                                 "OMP_WAIT_POLICY", "OPENBLAS_THREAD_TIMEOUT"))),
           "- kfuse %s (git %s%s) through kfuse.torch (Python binding, cffi); CPU context on all "
           "%d cores; workspace from the context's arena" % (
               kf.get("version", "?"), git, " + local changes" if dirty.strip() else "", nproc),
           "- reps (after warm-up), fwd+bwd: " + "; ".join(
               "%s %s: %s" % (s, i, best[(s, "fwdbwd", i)]["reps"]) for s in shapes
               for i in ("kfuse", "ekan")) + " (a loop stops after %g s)" % a.budget,
           "- CPUs busy before each measurement%s: %s; load average at the end %.2f %.2f %.2f"
           % (" (after waiting up to %.0f s for < 15%%)" % max_wait if max_wait > 0 else
              " (no wait)", ", ".join("%.0f%%" % (100 * b) for b in busy), *load)] + mems + [
           "- kfuse ran in its own process, not interleaved with the torch workers: every shape "
           "before them and again after them (best median kept); torch ran the first shape at "
           "every thread setting, the others at the last only (and measured memory there)."]
    if any(b > 0.15 for b in busy):
        md.append("- **Provisional:** the box was not quiet before every measurement (shared "
                  "with other jobs); times are inflated and noisy.")
    print("\n".join(rows + [""] + ["%s: %s (%s) %s" % t for t in targets]))
    out = a.out or (os.path.join(HERE, "results", "cpu_kan_conv.md") if a.write else None)
    if out:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w") as f:
            f.write("\n".join(md) + "\n")
        print("wrote %s" % out)
        plots.times_chart(
            os.path.splitext(out)[0] + "_times.svg",
            "CPU KANConv2d %dx%d, G=%d k=%d (best median)" % (KERNEL, KERNEL, G, K_ORD),
            [("B=%d %d->%d %dx%d %s" % (s[0], s[1], s[2], s[3], s[4],
                                       "fwd" if pas == "fwd" else "fwd+bwd"),
              [(name, best[(s, pas, impl)]["med"]) for impl, name in (
                  ("ekan", "efficient-kan on unfold (eager torch)"),
                  ("gemm", "GEMM of the same size"), ("kfuse", "kfuse"))])
             for s in shapes for pas in ("fwd", "fwdbwd")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
