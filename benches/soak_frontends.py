"""Soak of kfuse.torch (issue 39): many forward + backward calls of every module (GRU, AGRU,
SKLinear, KANLinear, KANConv2d) in float32 and bfloat16, eagerly and (torch >= 2.4) under
torch.compile, each configuration in turn in this one process. Per configuration, after its
warm-up and again at its end, it records

  rss      resident memory (/proc/self/statm), MiB
  objects  Python objects the garbage collector tracks (after gc.collect())
  plans    kfuse.torch's plans of this thread (kfuse.torch._common), the entries of their caches
           (argument structs, workspace sizes, output shapes per shape), this thread's contexts
           and the module-level caches of kfuse._lowlevel
  arena    bytes and grow count of this thread's contexts' arenas

and fails (exit status 1) unless, after the warm-up, the plans, their caches and the arena stay
exactly as they were, Python objects grow by at most --object-slack, and resident memory by at
most --rss-slack MiB (the largest sample, RSS sampled ten times per configuration). Eager calls
cycle through three batch sizes (so the per-shape caches see several entries); compiled ones
keep one shape (no recompilation). Gradients: y.backward(dy), then every parameter's .grad set to
None, as an optimizer's zero_grad does.

    python benches/soak_frontends.py [--calls N] [--warmup N] [--modes eager,compile]
                                     [--dtypes float32,bfloat16] [--modules GRU,...] [--json F]

CI (scripts/test-python.sh) runs a few hundred calls per configuration; benches/results/
reliability.md has a 10^5-call run. OMP_WAIT_POLICY=PASSIVE as the other scripts.
"""
import argparse
import gc
import json
import os
import sys
import time

import torch

import kfuse
import kfuse._lowlevel as ll
import kfuse.torch as kt
from kfuse.torch import _common

MODULES = ("GRU", "AGRU", "SKLinear", "KANLinear", "KANConv2d")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
BATCHES = (4, 7, 5)  # eager: the call's batch cycles through these


def make(name, dtype):
    """The module and a function batch -> (x, dy) of that batch."""
    torch.manual_seed(0)
    if name == "GRU":
        m = kt.GRU(8, 16, num_layers=2, bidirectional=True, dtype=dtype)
        shape, out = (lambda b: (6, b, 8)), (lambda b: (6, b, 32))
    elif name == "AGRU":
        m = kt.AGRU(8, 16, num_layers=2, dtype=dtype)
        shape, out = (lambda b: (6, b, 8)), (lambda b: (6, b, 16))
    elif name == "SKLinear":
        m = kt.SKLinear(48, 40, num_terms=2, low_rank=4, dtype=dtype)
        shape, out = (lambda b: (b, 48)), (lambda b: (b, 40))
    elif name == "KANLinear":
        m = kt.KANLinear(12, 10, dtype=dtype)
        shape, out = (lambda b: (b, 12)), (lambda b: (b, 10))
    else:
        m = kt.KANConv2d(2, 4, 3, padding=1, dtype=dtype)
        shape, out = (lambda b: (b, 2, 6, 6)), (lambda b: (b, 4, 6, 6))
    data = {b: ((torch.rand(shape(b)) * 1.6 - 0.8).to(dtype), torch.randn(out(b)).to(dtype))
            for b in BATCHES}
    return m, data


def step(fn, params, x, dy):
    y = fn(x)
    (y[0] if isinstance(y, tuple) else y).backward(dy)
    for p in params:
        p.grad = None


def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2.0 ** 20


def caches():
    """(plans, their cache entries, contexts, module-level cache entries) of this thread."""
    plans = getattr(_common._tls, "plans", {})
    entries = 0
    for p in plans.values():
        for v in (getattr(p, a, None) for a in dir(p) if not a.startswith("__")):
            if isinstance(v, dict):
                entries += len(v)
    contexts = getattr(ll._tls, "contexts", {})
    module = len(ll._RUNS) + len(ll._dtype_codes)
    return len(plans), entries, len(contexts), module


def arena():
    return tuple(sum(x) for x in zip((0, 0), *(c.arena_info() for c in
                                             getattr(ll._tls, "contexts", {}).values())))


def objects():
    gc.collect()
    return len(gc.get_objects())


def soak(name, dtype, mode, calls, warmup):
    m, data = make(name, dtype)
    params = [p for p in m.parameters() if p.requires_grad]
    fn = m
    batches = BATCHES if mode == "eager" else BATCHES[:1]
    if mode == "compile":
        torch._dynamo.reset()
        fn = torch.compile(m, fullgraph=True, dynamic=False)
    t0 = time.perf_counter()
    for i in range(warmup):
        step(fn, params, *data[batches[i % len(batches)]])
    warm = dict(rss=rss_mib(), objects=objects(), caches=caches(), arena=arena())
    rss_samples = []
    every = max(1, calls // 10)
    t1 = time.perf_counter()
    for i in range(calls):
        step(fn, params, *data[batches[i % len(batches)]])
        if (i + 1) % every == 0:
            rss_samples.append(rss_mib())
    t2 = time.perf_counter()
    end = dict(rss=rss_mib(), objects=objects(), caches=caches(), arena=arena())
    return dict(module=name, dtype=str(dtype).replace("torch.", ""), mode=mode, calls=calls,
                warmup=warmup, warmup_s=round(t1 - t0, 2), us_per_call=round(1e6 * (t2 - t1) / calls, 1),
                rss_warm=round(warm["rss"], 2), rss_end=round(end["rss"], 2),
                rss_max=round(max(rss_samples + [end["rss"]]), 2),
                rss_samples=[round(v, 2) for v in rss_samples],
                objects_warm=warm["objects"], objects_end=end["objects"],
                caches_warm=warm["caches"], caches_end=end["caches"],
                arena_warm=warm["arena"], arena_end=end["arena"])


def verdict(r, rss_slack, object_slack):
    bad = []
    if r["caches_end"] != r["caches_warm"]:
        bad.append(f"caches {r['caches_warm']} -> {r['caches_end']}")
    if r["arena_end"] != r["arena_warm"]:
        bad.append(f"arena {r['arena_warm']} -> {r['arena_end']}")
    if r["objects_end"] - r["objects_warm"] > object_slack:
        bad.append(f"objects {r['objects_warm']} -> {r['objects_end']}")
    if r["rss_max"] - r["rss_warm"] > rss_slack:
        bad.append(f"rss {r['rss_warm']} -> max {r['rss_max']} MiB")
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=100000)
    ap.add_argument("--warmup", type=int, default=0, help="default: max(100, calls / 50)")
    ap.add_argument("--modes", default="eager,compile")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--modules", default=",".join(MODULES))
    ap.add_argument("--rss-slack", type=float, default=4.0, help="MiB")
    ap.add_argument("--object-slack", type=int, default=100)
    ap.add_argument("--json", help="append one JSON line per configuration here")
    a = ap.parse_args()
    warmup = a.warmup or max(100, a.calls // 50)
    modes = a.modes.split(",")
    if "compile" in modes and not _common.HAS_TORCH_LIBRARY:
        print(f"torch {torch.__version__}: no torch.compile of kfuse operators (torch < 2.4), "
              "compile mode skipped")
        modes.remove("compile")
    print(f"kfuse {kfuse.version_string()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} torch thread(s); {a.calls} calls per configuration after "
          f"{warmup} warm-up calls")
    failed = 0
    for mode in modes:
        for dname in a.dtypes.split(","):
            for name in a.modules.split(","):
                r = soak(name, DTYPES[dname], mode, a.calls, warmup)
                bad = verdict(r, a.rss_slack, a.object_slack)
                failed += bool(bad)
                print(f"{mode:8s}{dname:9s}{name:10s} {r['us_per_call']:8.1f} us/call  rss "
                      f"{r['rss_warm']:.1f} -> {r['rss_end']:.1f} (max {r['rss_max']:.1f}) MiB  "
                      f"objects {r['objects_warm']} -> {r['objects_end']}  plans/entries/"
                      f"contexts/module {r['caches_end']}  arena {r['arena_end']}  "
                      + ("FAIL: " + "; ".join(bad) if bad else "flat"), flush=True)
                if a.json:
                    with open(a.json, "a") as f:
                        f.write(json.dumps(dict(r, torch=torch.__version__, ok=not bad)) + "\n")
    print("soak_frontends:", "FAILED" if failed else "ok", f"({failed} configuration(s) grew)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
