"""SVG plots beside the CPU benchmark tables, drawn alike by every bench script (matplotlib from
Debian's python3-matplotlib, installed by scripts/install-deps.sh; where it is missing the plots
are skipped with a message and the tables are written as usual).

  times_chart(path, title, groups)    grouped bars, one group per shape/pass, one bar per
                                      implementation, time on a log axis
  targets_chart(path, title, rows)    one bar per target: how far the measured ratio is from its
                                      limit, as a factor (>= 1: met), so targets of different
                                      kinds (time ratios, speed-ups) share one axis
Each returns the path written, or None when matplotlib is absent.
"""
import os

try:
    import matplotlib
    matplotlib.use("svg")
    import matplotlib.pyplot as plt
except ImportError:  # the tables do not need it
    plt = None

# One colour per implementation family, the same in every plot; the first name a label contains
# decides (so "efficient-kan (eager torch)" is efficient-kan's).
_COLOURS = {"efficient-kan": "#9467bd", "panther": "#d62728", "onednn": "#2ca02c",
            "gemm": "#8c564b", "linear": "#e377c2", "kfuse": "#1f77b4", "torch": "#ff7f0e"}


def _styles(labels):
    """{label: (colour, hatch)}: the family's colour, and a hatch for its second, third member."""
    out, seen = {}, {}
    for i, label in enumerate(labels):
        low = label.lower()
        fam = next((k for k in _COLOURS if k in low), None)
        n = seen.get(fam, 0)
        seen[fam] = n + 1
        out[label] = (_COLOURS[fam] if fam else "C%d" % (i % 10), ("", "//", "..", "xx")[n % 4])
    return out


def _missing(path):
    print("plots: matplotlib not installed (apt-get install python3-matplotlib); %s not drawn"
          % os.path.basename(path))


def times_chart(path, title, groups, unit="ms"):
    """groups: [(group_label, [(impl_label, time or None), ...]), ...]."""
    if plt is None:
        _missing(path)
        return None
    impls = []
    for _, bars in groups:
        for name, _ in bars:
            if name not in impls:
                impls.append(name)
    width = 0.8 / max(len(impls), 1)
    style = _styles(impls)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(groups) + 2), 4.2))
    for k, name in enumerate(impls):
        xs, ys = [], []
        for g, (_, bars) in enumerate(groups):
            v = dict(bars).get(name)
            if v:
                xs.append(g - 0.4 + width * (k + 0.5))
                ys.append(v)
        ax.bar(xs, ys, width, label=name, color=style[name][0], hatch=style[name][1],
               edgecolor="white")
    ax.set_yscale("log")
    ax.set_ylabel("time per call (%s, log scale; lower is better)" % unit)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([g for g, _ in groups], fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def targets_chart(path, title, rows):
    """rows: [(label, measured, limit, higher_is_better), ...]; rows without a measurement or a
    limit are left out. The bar is measured/limit for a speed-up (>= limit is met) and
    limit/measured for a time ratio (<= limit is met): a factor of 1 is the target."""
    if plt is None:
        _missing(path)
        return None
    pts = [(lab, (m / lim) if hib else (lim / m)) for lab, m, lim, hib in rows
           if m and lim]
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(8.0, 0.42 * len(pts) + 1.4))
    ys = range(len(pts))
    ax.barh(list(ys), [f for _, f in pts],
            color=["#2ca02c" if f >= 1 else "#d62728" for _, f in pts])
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_yticks(list(ys))
    ax.set_yticklabels([lab for lab, _ in pts], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("margin to the target (x; >= 1 met, green)")
    ax.set_title(title, fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
