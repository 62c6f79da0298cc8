#!/usr/bin/env python3
"""CPU benchmark of kfuse's KANLinear against efficient-kan's math and a dense GEMM, in one run:

  kfuse          the C driver kf_bench_kan (public ABI, all cores, caller workspace)
  efficient-kan  eager-torch transcription of efficient-kan's KANLinear.b_splines and forward
                 (Blealtan/efficient-kan, src/efficient_kan/kan.py); fwd+bwd by autograd
  GEMM           torch.mm [B, K] x [K, out], K = in*(G+k+1): kfuse's forward product; fwd+bwd:
                 the pass's three products (y, dA = dy W^T, dW = dy^T A)

at (B, in, out) = (1024, 256, 256) and (8192, 1024, 1024), G = 5, k = 3, fp32. torch: a fresh
process per thread setting (OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = set_num_threads), best
median kept, efficient-kan and GEMM interleaved rep by rep. Peak extra memory: kfuse's
kf_kan_linear_workspace_size; torch's from torch.profiler allocation events (running
allocations minus frees, op granularity) less the outputs, with the bases tensor and the
autograd-saved tensors (saved_tensors_hooks) listed.

    /usr/bin/python3 benches/cpu_kan.py [--build-dir build/main] [--out FILE.md] [--quick]

Driver: BUILD/benches/kf_bench_kan, else benches/bench_kan.c compiled with cc against
BUILD/libkfuse.so. Writes benches/results/cpu_kan.md (--quick: /tmp/kfuse-bench-quick).
"""
import argparse, datetime, json, os, platform, statistics, subprocess, sys, time

from isa import driver_cmd, isa_line
import plots

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
G, K_ORD = 5, 3
MIB = 1 << 20


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build-dir", default=os.path.join(REPO, "build", "main"))
    p.add_argument("--out", default=None)
    p.add_argument("--quick", action="store_true", help="small case only, few reps")
    p.add_argument("--threads", default="1,%d" % (os.cpu_count() or 1),
                   help="torch thread settings (the large shape: the last only)")
    p.add_argument("--budget", type=float, default=25.0,
                   help="seconds per timed loop at the large shape (reps stop after it)")
    p.add_argument("--max-wait", type=float, default=240.0, help="quiet-box wait, s")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--cases", default="", help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ---- the eager baseline and the memory probe (benches/cpu_kan_conv.py imports them too) -------

def b_splines(x, grid, k):  # efficient-kan's KANLinear.b_splines, transcribed
    x = x.unsqueeze(-1)
    bases = ((x >= grid[:, :-1]) & (x < grid[:, 1:])).to(x.dtype)
    for p in range(1, k + 1):
        left = (x - grid[:, :-(p + 1)]) / (grid[:, p:-1] - grid[:, :-(p + 1)])
        right = (grid[:, p + 1:] - x) / (grid[:, p + 1:] - grid[:, 1:(-p)])
        bases = left * bases[:, :, :-1] + right * bases[:, :, 1:]
    return bases.contiguous()


def kan_forward(x, grid, bw, sw, ss, k):  # efficient-kan's KANLinear.forward, x [N, in]
    import torch.nn.functional as F
    out = bw.shape[0]
    base_output = F.linear(F.silu(x), bw)
    spline_output = F.linear(b_splines(x, grid, k).view(x.size(0), -1),
                             (sw * ss.unsqueeze(-1)).view(out, -1))
    return base_output + spline_output


def ekan_passes(B, n_in, n_out, G, k):
    """efficient-kan's forward (no grad) and forward+backward (all gradients) on a seeded
    problem: efficient-kan's initial grid on [-1, 1], x U(-1.2, 1.2), weights U(-0.1, 0.1), the
    scaler U(0.5, 1.5). Returns (fwd, fwdbwd, dy, x leaf, grid, parameter leaves)."""
    import torch
    torch.manual_seed(0)
    h = 2.0 / G
    grid = (torch.arange(-k, G + k + 1) * h - 1.0).expand(n_in, -1).contiguous()
    x = torch.rand(B, n_in) * 2.4 - 1.2
    params = [torch.rand(n_out, n_in) * 0.2 - 0.1, torch.rand(n_out, n_in, G + k) * 0.2 - 0.1,
              torch.rand(n_out, n_in) + 0.5]
    dy = torch.rand(B, n_out) * 2 - 1
    xg = x.clone().requires_grad_(True)
    pg = [q.clone().requires_grad_(True) for q in params]

    def fwd():
        with torch.no_grad():
            kan_forward(x, grid, *params, k)

    def fwdbwd():
        xg.grad = None
        for q in pg:
            q.grad = None
        kan_forward(xg, grid, *pg, k).backward(dy)
    return fwd, fwdbwd, dy, xg, grid, pg


def peak_alloc(fn):
    """Peak bytes torch allocates during fn(): torch.profiler allocation events in time order,
    running allocations minus frees (op granularity)."""
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    run, top = 0, 0
    for e in sorted(prof.events(), key=lambda e: e.time_range.start):
        run += e.self_cpu_memory_usage
        top = max(top, run)
    return top


def eager_memory(fwd, fwdbwd, out_f, out_b, inputs):
    """Peak extra bytes of one fwd() and one fwdbwd() pass (peak_alloc less their outputs,
    out_f and out_b bytes) and the bytes autograd saves in fwdbwd() beyond the tensors `inputs`
    (saved_tensors_hooks)."""
    import torch
    saved = {}

    def pack(t):
        st = t.storage()
        if all(t.data_ptr() != q.data_ptr() for q in inputs):
            saved[st.data_ptr()] = st.size() * t.element_size()
        return t
    mem = {"fwd_peak": peak_alloc(fwd) - out_f}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        mem["fwdbwd_peak"] = peak_alloc(fwdbwd) - out_b
    mem["saved"] = sum(saved.values())
    return mem


def time_interleaved(fns, reps, warmup, budget):
    """{name: [ms, ...]}: the functions of `fns` run in turn, rep by rep; `warmup` reps untimed,
    then up to `reps` timed ones, stopping after the rep that passes `budget` s (0: no limit)."""
    times = {n: [] for n in fns}
    t_start = time.perf_counter()
    for rep in range(warmup + reps):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            if rep >= warmup:
                times[name].append((time.perf_counter() - t0) * 1e3)
        if rep >= warmup and budget > 0 and time.perf_counter() - t_start > budget:
            break
    return times


def cpu_line():
    """The machine as lscpu describes it, for the results file."""
    cpu = {k.strip(): v.strip() for k, _, v in (l.partition(":") for l in
                                                  sh(["lscpu"]).splitlines())}
    return "CPU (lscpu): %s; %s CPU(s), %s thread(s) per core; %s; L2 %s, L3 %s" % (
        cpu.get("Model name", "?"), cpu.get("CPU(s)", "?"), cpu.get("Thread(s) per core", "?"),
        "VM (%s)" % cpu.get("Hypervisor vendor") if cpu.get("Hypervisor vendor")
        else "bare metal", cpu.get("L2 cache", "?"), cpu.get("L3 cache", "?"))


def worker(a):
    import torch
    nt = int(os.environ["OMP_NUM_THREADS"])
    torch.set_num_threads(nt)

    for case in a.cases.split(";"):
        B, n_in, n_out, reps, warmup, budget, want_mem = (float(v) for v in case.split(","))
        B, n_in, n_out, reps, warmup = int(B), int(n_in), int(n_out), int(reps), int(warmup)
        C = G + K_ORD
        kan_fwd, kan_fb, dy, xg, grid, pg = ekan_passes(B, n_in, n_out, G, K_ORD)
        Kd = n_in * (C + 1)
        A, W = torch.rand(B, Kd), torch.rand(Kd, n_out)

        def gemm_fwd():
            torch.mm(A, W)

        def gemm_fb():
            torch.mm(A, W), torch.mm(dy, W.t()), torch.mm(dy.t(), A)

        # ---- memory (one pass each, outside the timing)
        mem = {}
        if want_mem:  # the profiled passes also serve as warm-up
            out_f = B * n_out * 4
            out_b = out_f + (B * n_in + n_out * n_in * (C + 2)) * 4
            mem = eager_memory(kan_fwd, kan_fb, out_f, out_b, [xg, grid] + pg)
            mem["bases"] = B * n_in * C * 4

        for pas, fns in (("fwd", {"ekan": kan_fwd, "gemm": gemm_fwd}),
                         ("fwdbwd", {"ekan": kan_fb, "gemm": gemm_fb})):
            times = time_interleaved(fns, reps, warmup, budget)
            for name, ts in times.items():
                rec = {"B": B, "in": n_in, "out": n_out, "pass": pas, "impl": name,
                       "threads": nt, "reps": len(ts), "med": statistics.median(ts),
                       "min": min(ts)}
                if name == "ekan":
                    rec.update(mem)
                print(json.dumps(rec), flush=True)
    print(json.dumps({"done": True, "torch": torch.__version__}), flush=True)
    return 0


def sh(cmd, **kw):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def cpu_busy(interval=0.5):
    def read():
        with open("/proc/stat") as f:
            v = [int(t) for t in f.readline().split()[1:]]
        return sum(v[:8]) - v[3] - v[4], sum(v[:8])
    a0 = read()
    time.sleep(interval)
    a1 = read()
    return (a1[0] - a0[0]) / max(1, a1[1] - a0[1])


def wait_quiet(max_wait, threshold=0.15):
    t0, busy = time.time(), cpu_busy()
    while busy > threshold and time.time() - t0 < max_wait:
        time.sleep(2.0)
        busy = cpu_busy()
    return busy


def best_median(recs, key):
    """{key(r): the record of lowest median among those with that key}: the best thread setting
    (torch) or the better of the two runs (kfuse)."""
    best = {}
    for r in recs:
        kk = key(r)
        if kk not in best or r["med"] < best[kk]["med"]:
            best[kk] = r
    return best


def find_driver(build):
    exe = os.path.join(build, "benches", "kf_bench_kan")
    if os.access(exe, os.X_OK):
        return exe, "CMake target kf_bench_kan"
    exe = os.path.join("/tmp", "kfuse-bench-kan", "kf_bench_kan")
    os.makedirs(os.path.dirname(exe), exist_ok=True)
    lib = os.path.abspath(build)
    r = subprocess.run(["cc", "-O2", "-std=c11", "-I" + HERE, "-I" + os.path.join(REPO, "capi",
                        "include"), os.path.join(HERE, "bench_kan.c"), "-L" + lib, "-lkfuse",
                        "-lm", "-Wl,-rpath," + lib, "-o", exe], capture_output=True, text=True)
    if r.returncode:
        raise SystemExit("cpu_kan: cannot build bench_kan.c: " + r.stderr)
    return exe, "benches/bench_kan.c compiled by cc -O2 against %s/libkfuse.so" % build


def main(argv=None):
    a = parse_args(argv)
    if a.worker:
        return worker(a)
    t0 = time.time()
    nproc = os.cpu_count() or 1
    shapes = [(1024, 256, 256)] + ([] if a.quick else [(8192, 1024, 1024)])
    plan = {s: ((5, 1, 0) if a.quick else (20, 3, 0) if s[0] <= 1024 else (2, 0, a.budget))
            for s in shapes}
    threads = [int(t) for t in a.threads.split(",")]
    exe, how = find_driver(a.build_dir)
    busy, recs, meta = [], [], {}
    def run_kfuse(s):  # all cores (the context's default)
        reps, warm, bud = plan[s]
        busy.append(wait_quiet(a.max_wait))
        out = sh([exe, "--B", str(s[0]), "--in", str(s[1]), "--out", str(s[2]), "--G", str(G),
                  "--k", str(K_ORD), "--reps", str(reps + 10 * (s[0] <= 1024)), "--warmup",
                  str(max(1, warm)), "--budget-s", str(int(bud))]).strip().splitlines()
        r = json.loads(out[-1]) if out else {"error": "no output"}
        if "error" in r:
            raise SystemExit("cpu_kan: kf_bench_kan: %s" % r["error"])
        for pas in ("fwd", "fwdbwd"):
            recs.append({"B": s[0], "in": s[1], "out": s[2], "pass": pas, "impl": "kfuse",
                         "threads": nproc, "reps": r[pas + "_reps"], "med":
                         r[pas + "_ms_median"], "min": r[pas + "_ms_min"],
                         "ws": r["workspace_bytes"], "version": r["version"]})
        print("  kfuse %s: fwd %.2f ms, fwd+bwd %.2f ms, workspace %.2f MiB" % (
            s, r["fwd_ms_median"], r["fwdbwd_ms_median"], r["workspace_bytes"] / MIB), flush=True)
    for s in shapes:
        run_kfuse(s)
    for t in threads:
        busy.append(wait_quiet(a.max_wait))
        env = dict(os.environ, OMP_NUM_THREADS=str(t), OPENBLAS_NUM_THREADS=str(t))
        spec = ";".join("%d,%d,%d,%d,%d,%g,%d" % (s + plan[s] + (t == threads[-1],))
                        for s in shapes if s[0] <= 1024 or t == threads[-1])
        p = subprocess.run([sys.executable, __file__, "--worker", "--cases", spec], env=env,
                           capture_output=True, text=True)
        if p.returncode:
            raise SystemExit("cpu_kan: torch worker (%d threads) failed:\n%s" % (t, p.stderr))
        for line in p.stdout.splitlines():
            rec = json.loads(line)
            if rec.get("done"):
                meta = rec
                continue
            recs.append(rec)
            print("  torch %dt %s %-6s %-4s %9.2f ms (min %.2f, %d reps)" % (
                t, (rec["B"], rec["in"], rec["out"]), rec["pass"], rec["impl"], rec["med"],
                rec["min"], rec["reps"]), flush=True)
    run_kfuse(shapes[0])  # again after torch: the best of the two runs is kept
    best = best_median(recs, lambda r: (r["B"], r["pass"], r["impl"]))
    best_mem = {r["B"]: r for r in recs if "fwd_peak" in r}
    rows = ["| (B, in, out) | pass | kfuse ms | efficient-kan ms | GEMM ms | efficient-kan / kfuse"
            " | kfuse / GEMM | peak extra: kfuse | peak extra: efficient-kan | memory ratio |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    targets = []
    for s in shapes:
        for pas in ("fwd", "fwdbwd"):
            k_, e_, g_ = (best[(s[0], pas, i)] for i in ("kfuse", "ekan", "gemm"))
            e_mem = best_mem[s[0]][pas + "_peak"]
            rows.append("| %s | %s | %.2f | %.2f (%dt) | %.2f (%dt) | %.2fx | %.2f | %.2f MiB | "
                        "%.1f MiB | 1/%.0f |" % (
                            s, "fwd" if pas == "fwd" else "fwd+bwd", k_["med"], e_["med"],
                            e_["threads"], g_["med"], g_["threads"], e_["med"] / k_["med"],
                            k_["med"] / g_["med"], k_["ws"] / MIB, e_mem / MIB, e_mem / k_["ws"]))
            if s == (1024, 256, 256):
                lim = 3.0 if pas == "fwd" else 4.0
                sp = e_["med"] / k_["med"]
                targets.append(("%s: speed-up over efficient-kan" % pas, "%.2fx" % sp,
                                ">= %.1fx" % lim, "PASS" if sp >= lim else "MISS"))
                mr = e_mem / k_["ws"]
                targets.append(("%s: peak extra memory, efficient-kan / kfuse" % pas, "%.0fx" % mr,
                                ">= 10x", "PASS" if mr >= 10 else "MISS"))
    mems = ["- %s: bases tensor [B, in, G+k] %.1f MiB; autograd-saved tensors %.1f MiB" % (
        s, best_mem[s[0]]["bases"] / MIB, best_mem[s[0]]["saved"] / MIB)
        for s in shapes]
    git = sh(["git", "-C", REPO, "rev-parse", "--short", "HEAD"]).strip()
    dirty = sh(["git", "-C", REPO, "status", "--porcelain", "--", "capi", "cpu", "common"])
    load = os.getloadavg()
    md = ["# CPU KANLinear benchmark (`benches/cpu_kan.py%s`)" % (" --quick" if a.quick else ""),
          "", "kfuse's KANLinear (C driver, all cores) against efficient-kan's KANLinear math in "
          "eager torch (a transcription of b_splines and forward; fwd+bwd by autograd, all "
          "gradients) and a dense GEMM with K = in*(G+k+1) (fwd: the one product; fwd+bwd: the "
          "three products of the pass). G = %d, k = %d, fp32. Median ms; torch's best thread "
          "setting in parentheses. Peak extra memory: kfuse's workspace; efficient-kan's from "
          "torch.profiler allocation events, less its outputs (y, and for fwd+bwd dx and the "
          "parameter gradients)." % (G, K_ORD), "", "\n".join(rows), "",
          "| target (DESIGN.md, CPU KANLinear (1024, 256, 256)) | measured | limit | result |",
          "|---|---:|---:|---|"] + ["| %s | %s | %s | %s |" % t for t in targets] + [
          "", "Machine and settings:", "",
          "- date: %s; command: `/usr/bin/python3 benches/cpu_kan.py %s`; wall time %.0f s" % (
              datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              " ".join(sys.argv[1:]), time.time() - t0),
          "- " + cpu_line(),
          "- ISA: " + isa_line(a.build_dir, driver_cmd(exe)),
          "- torch %s (Debian), Python %s; thread settings %s, a fresh process each; env %s" % (
              meta.get("torch", "?"), platform.python_version(), threads, ", ".join(
                  "%s=%s" % (k, os.environ[k]) for k in ("OMP_WAIT_POLICY",
                                                          "OPENBLAS_THREAD_TIMEOUT"))),
          "- kfuse %s (git %s%s), %s; CPU context on all %d cores; caller workspace" % (
              recs[0]["version"], git, " + local changes" if dirty.strip() else "", how, nproc),
          "- reps (after warm-up): " + "; ".join(
              "%s %s: %s" % (s, r_["impl"], r_["reps"]) for s in shapes for r_ in
              (best[(s[0], "fwdbwd", "kfuse")], best[(s[0], "fwdbwd", "ekan")])) +
          " (fwd+bwd; the large shape stops a loop after %g s and runs torch at %d threads "
          "only)" % (
              a.budget, threads[-1]),
          "- CPUs busy before each measurement (after waiting up to %.0f s for < 15%%): %s; load "
          "average at the end %.2f %.2f %.2f" % (a.max_wait, ", ".join(
              "%.0f%%" % (100 * b) for b in busy), *load)] + mems + [
          "- kfuse ran in its own process, not interleaved with the torch workers: both shapes "
          "before them, the small shape again after them (best median kept)."]
    if any(b > 0.15 for b in busy):
        md.append("- **Provisional:** the box was not quiet before every measurement (shared "
                  "with other jobs); times are inflated and noisy.")
    out = a.out or (os.path.join("/tmp", "kfuse-bench-quick", "cpu_kan.md") if a.quick else
                    os.path.join(HERE, "results", "cpu_kan.md"))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(rows[0:] + [""] + ["%s: %s (%s) %s" % t for t in targets]))
    print("wrote %s" % out)
    stem = os.path.splitext(out)[0]
    plots.times_chart(stem + "_times.svg", "CPU KANLinear, G=%d k=%d (best median)" % (G, K_ORD), [
        ("%s %s" % (s, "fwd" if pas == "fwd" else "fwd+bwd"),
         [(name, best[(s[0], pas, impl)]["med"]) for impl, name in (
             ("ekan", "efficient-kan (eager torch)"), ("gemm", "GEMM of the same size"),
             ("kfuse", "kfuse"))])
        for s in shapes for pas in ("fwd", "fwdbwd")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
