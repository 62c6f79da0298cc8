#!/usr/bin/env python3
"""CPU KANLinear across grid sizes (issue 20, item 3: "KAN without the zeros"), in one run:

  kfuse          the C driver kf_bench_kan (public ABI, caller workspace), at --threads
  old kfuse      the same driver of another build (--old-build, e.g. main's), interleaved rep
                 block by rep block with the new one, so that both see the same box
  efficient-kan  benches/cpu_kan.py's eager-torch transcription of efficient-kan's KANLinear
  GEMM           torch.mm [B, in*(G+k)] x [in*(G+k), out], the issue's "dense GEMM of the same
                 size" (fwd: that product; fwd+bwd: the pass's three products)

at (B, in, out) = (1024, 256, 256) for G = 5, 10, 20 and (8192, 1024, 1024) for G = 5, k = 3,
fp32, torch and kfuse at the same thread count. Prints a table of medians and the issue's
targets as PASS/MISS lines:
  (8192, 1024, 1024) G=5: kfuse <= 0.7x the GEMM, fwd and fwd+bwd
  (1024, 256, 256) G=5:   kfuse >= 6x faster than efficient-kan, fwd and fwd+bwd

    /usr/bin/python3 benches/cpu_kan_sparse.py [--build-dir build/main] [--old-build DIR]
        [--threads 1] [--rounds 3] [--skip-large]
"""
import argparse, json, os, statistics, subprocess, sys

from cpu_kan import ekan_passes, find_driver, time_interleaved

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
K_ORD = 3
SMALL, LARGE = (1024, 256, 256), (8192, 1024, 1024)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build-dir", default=os.path.join(REPO, "build", "main"))
    p.add_argument("--old-build", default=None, help="a second build to time beside it")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds per kfuse build")
    p.add_argument("--skip-large", action="store_true", help="no (8192, 1024, 1024) row")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def cases(a):
    return [(SMALL, G) for G in (5, 10, 20)] + ([] if a.skip_large else [(LARGE, 5)])


def worker(spec):
    """Times efficient-kan and the GEMM for one case in this process (fresh torch threads)."""
    import torch
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    B, n_in, n_out, G, reps = (int(v) for v in spec.split(","))
    kan_fwd, kan_fb, dy, _, _, _ = ekan_passes(B, n_in, n_out, G, K_ORD)
    Kd = n_in * (G + K_ORD)
    A, W = torch.rand(B, Kd), torch.rand(Kd, n_out)

    out = {}
    for pas, fns in (("fwd", {"ekan": kan_fwd, "gemm": lambda: torch.mm(A, W)}),
                     ("fwdbwd", {"ekan": kan_fb, "gemm": lambda: (
                         torch.mm(A, W), torch.mm(dy, W.t()), torch.mm(dy.t(), A))})):
        for name, ts in time_interleaved(fns, reps, 1, 60.0).items():
            out["%s_%s" % (name, pas)] = statistics.median(ts)
    print(json.dumps(out), flush=True)
    return 0


def run_kfuse(exe, shape, G, threads, reps):
    cmd = [exe, "--B", str(shape[0]), "--in", str(shape[1]), "--out", str(shape[2]), "--G",
           str(G), "--k", str(K_ORD), "--threads", str(threads), "--reps", str(reps),
           "--warmup", "1", "--budget-s", "30"]
    r = json.loads(subprocess.run(cmd, capture_output=True, text=True).stdout.splitlines()[-1])
    if "error" in r:
        raise SystemExit("cpu_kan_sparse: %s: %s" % (" ".join(cmd), r["error"]))
    return r["fwd_ms_median"], r["fwdbwd_ms_median"]


def main(argv=None):
    a = parse_args(argv)
    if a.worker:
        return worker(a.worker)
    exe = find_driver(a.build_dir)[0]
    old = find_driver(a.old_build)[0] if a.old_build else None
    rows, targets = [], []
    print("| (B, in, out) | G | pass | kfuse ms | %sefficient-kan ms | GEMM ms | kfuse / GEMM "
          "| efficient-kan / kfuse |" % ("old kfuse ms | new / old | " if old else ""))
    print("|---|---:|---|---:|%s---:|---:|---:|---:|" % ("---:|---:|" if old else ""))
    for shape, G in cases(a):
        large = shape == LARGE
        reps = 2 if large else 10
        new_t, old_t = {"fwd": [], "fwdbwd": []}, {"fwd": [], "fwdbwd": []}
        for _ in range(1 if large else a.rounds):  # old and new in turn
            for exe_, acc in ((exe, new_t), (old, old_t)):
                if exe_:
                    f, fb = run_kfuse(exe_, shape, G, a.threads, reps)
                    acc["fwd"].append(f), acc["fwdbwd"].append(fb)
        env = dict(os.environ, OMP_NUM_THREADS=str(a.threads),
                   OPENBLAS_NUM_THREADS=str(a.threads))
        p = subprocess.run([sys.executable, __file__, "--worker", "%d,%d,%d,%d,%d" % (
            shape + (G, reps))], env=env, capture_output=True, text=True)
        if p.returncode:
            raise SystemExit("cpu_kan_sparse: torch worker failed:\n" + p.stderr)
        t = json.loads(p.stdout.splitlines()[-1])
        for pas in ("fwd", "fwdbwd"):
            k_ = min(new_t[pas])
            o_ = "%.2f | %.2fx | " % (min(old_t[pas]), k_ / min(old_t[pas])) if old else ""
            e_, g_ = t["ekan_" + pas], t["gemm_" + pas]
            print("| %s | %d | %s | %.2f | %s%.2f | %.2f | %.2fx | %.2fx |" % (
                shape, G, pas, k_, o_, e_, g_, k_ / g_, e_ / k_), flush=True)
            if large:
                targets.append(("%s G=%d %s: kfuse / dense GEMM" % (shape, G, pas), k_ / g_,
                                "<= 0.70x", k_ / g_ <= 0.70))
            elif G == 5:
                targets.append(("%s G=%d %s: efficient-kan / kfuse" % (shape, G, pas), e_ / k_,
                                ">= 6.00x", e_ / k_ >= 6.0))
    print("\nthreads %d (kfuse and torch), medians; kfuse: best of %d interleaved runs" % (
        a.threads, a.rounds))
    for name, v, lim, ok in targets:
        print("%s: %.2fx (target %s) %s" % (name, v, lim, "PASS" if ok else "MISS"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
