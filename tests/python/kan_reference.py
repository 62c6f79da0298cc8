"""Shared float64 references for the KAN tests (test_kan.py, test_kan_conv.py): a transcription
of efficient-kan's math (Blealtan/efficient-kan, src/efficient_kan/kan.py) written here, its
KANLinear module as a reference, the accuracy bar and the helpers around them.

Accuracy bar (DESIGN.md): ||out - ref|| / ||ref|| < 1e-5 for fp32 against float64; 1e-12 for
the library's float64 against it.
"""
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

TOL = 1e-5
TOL64 = 1e-12


def tol(dtype):
    """The accuracy bar of a result in `dtype` (torch or numpy) against the float64 reference."""
    return TOL64 if dtype in (torch.float64, np.float64) else TOL
GRADS = ("base_weight", "spline_weight", "spline_scaler")


def rel(out, want):
    out = torch.as_tensor(np.asarray(out) if not torch.is_tensor(out) else out).detach().double()
    want = torch.as_tensor(np.asarray(want) if not torch.is_tensor(want) else want)
    want = want.detach().double()
    assert out.shape == want.shape, (out.shape, want.shape)
    assert torch.isfinite(out).all()
    return ((out - want).norm() / want.norm()).item()



# ---- a transcription of efficient-kan's math (float64 where the tests ask for it) -------------

def ref_bases(x, grid, k):
    """efficient-kan's b_splines: x [N, in], grid [in, nk] -> [N, in, G + k] by the Cox-de Boor
    recurrence over the whole knot vector (0/0 = NaN over repeated knots, as there)."""
    x = x.unsqueeze(-1)
    b = ((x >= grid[:, :-1]) & (x < grid[:, 1:])).to(x.dtype)
    for p in range(1, k + 1):
        b = ((x - grid[:, :-(p + 1)]) / (grid[:, p:-1] - grid[:, :-(p + 1)]) * b[:, :, :-1]
             + (grid[:, p + 1:] - x) / (grid[:, p + 1:] - grid[:, 1:-p]) * b[:, :, 1:])
    return b


def ref_forward(x, grid, base_weight, spline_weight, spline_scaler, k, activation=F.silu):
    """efficient-kan's forward for x [..., in] (any dtype; all tensors the same), with its
    base_activation (a function; efficient-kan's default SiLU)."""
    inf, outf = base_weight.shape[1], base_weight.shape[0]
    lead = x.shape[:-1]
    x2 = x.reshape(-1, inf)
    w = spline_weight if spline_scaler is None else spline_weight * spline_scaler.unsqueeze(-1)
    y = F.linear(activation(x2), base_weight) \
        + F.linear(ref_bases(x2, grid, k).reshape(x2.shape[0], -1), w.reshape(outf, -1))
    return y.reshape(*lead, outf)


def reference_grads(x, params, dy, k, forward=None):
    """(y, dx, {name: grad}) of sum(y * dy) in float64 by torch autograd on `forward` (default
    ref_forward; same signature: x, grid, base_weight, spline_weight, spline_scaler, k)."""
    xd = torch.as_tensor(x).detach().double().requires_grad_(True)
    p = {n: (None if params.get(n) is None else torch.as_tensor(params[n]).detach().double())
         for n in ("grid",) + GRADS}
    for n in GRADS:
        if p[n] is not None:
            p[n].requires_grad_(True)
    y = (forward or ref_forward)(xd, p["grid"], p["base_weight"], p["spline_weight"],
                                 p["spline_scaler"], k)
    (y * torch.as_tensor(dy).double()).sum().backward()
    return y.detach(), xd.grad, {n: p[n].grad for n in GRADS if p[n] is not None}


class EfficientKANRef(nn.Module):
    """efficient_kan.KANLinear as its source builds it (src/efficient_kan/kan.py): the uniform
    grid buffer, then base_weight, spline_weight, spline_scaler; reset_parameters drawing
    kaiming_uniform_ base_weight, the noise, kaiming_uniform_ spline_scaler; curve2coeff by
    torch.linalg.lstsq on its bases; update_grid and regularization_loss as there. dtype= is an
    extra of this transcription (efficient-kan takes the default dtype)."""

    def __init__(self, in_features, out_features, grid_size=5, spline_order=3, scale_noise=0.1,
                 scale_base=1.0, scale_spline=1.0, enable_standalone_scale_spline=True,
                 base_activation=torch.nn.SiLU, grid_eps=0.02, grid_range=[-1, 1], dtype=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.grid_size, self.spline_order = grid_size, spline_order
        h = (grid_range[1] - grid_range[0]) / grid_size
        knots = torch.arange(-spline_order, grid_size + spline_order + 1) * h + grid_range[0]
        self.register_buffer("grid", knots.expand(in_features, -1).contiguous().to(dtype))
        fk = {"dtype": dtype}
        self.base_weight = nn.Parameter(torch.empty(out_features, in_features, **fk))
        self.spline_weight = nn.Parameter(
            torch.empty(out_features, in_features, grid_size + spline_order, **fk))
        if enable_standalone_scale_spline:
            self.spline_scaler = nn.Parameter(torch.empty(out_features, in_features, **fk))
        self.scale_noise, self.scale_base, self.scale_spline = scale_noise, scale_base, scale_spline
        self.enable_standalone_scale_spline = enable_standalone_scale_spline
        self.base_activation = base_activation()
        self.grid_eps = grid_eps
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.kaiming_uniform_(self.base_weight, a=math.sqrt(5) * self.scale_base)
        with torch.no_grad():
            G, k = self.grid_size, self.spline_order
            noise = (torch.rand(G + 1, self.in_features, self.out_features) - 0.5) \
                * self.scale_noise / G
            scale = self.scale_spline if not self.enable_standalone_scale_spline else 1.0
            self.spline_weight.data.copy_(
                scale * self.curve2coeff(self.grid.T[k:-k], noise.to(self.grid.dtype)))
            if self.enable_standalone_scale_spline:
                nn.init.kaiming_uniform_(self.spline_scaler, a=math.sqrt(5) * self.scale_spline)

    def b_splines(self, x):
        return ref_bases(x, self.grid, self.spline_order)

    def curve2coeff(self, x, y):
        A = self.b_splines(x).transpose(0, 1)
        sol = torch.linalg.lstsq(A, y.transpose(0, 1)).solution
        return sol.permute(2, 0, 1).contiguous()

    @property
    def scaled_spline_weight(self):
        return self.spline_weight * (self.spline_scaler.unsqueeze(-1)
                                     if self.enable_standalone_scale_spline else 1.0)

    def forward(self, x):
        return ref_forward(x, self.grid, self.base_weight, self.spline_weight,
                           self.spline_scaler if self.enable_standalone_scale_spline else None,
                           self.spline_order)

    @torch.no_grad()
    def update_grid(self, x, margin=0.01):
        batch = x.size(0)
        G, k = self.grid_size, self.spline_order
        splines = self.b_splines(x).permute(1, 0, 2)
        unreduced = torch.bmm(splines, self.scaled_spline_weight.permute(1, 2, 0))
        unreduced = unreduced.permute(1, 0, 2)
        xs = torch.sort(x, dim=0)[0]
        adaptive = xs[torch.linspace(0, batch - 1, G + 1, dtype=torch.int64)]
        step = (xs[-1] - xs[0] + 2 * margin) / G
        uniform = torch.arange(G + 1, dtype=torch.float32).unsqueeze(1) * step + xs[0] - margin
        grid = self.grid_eps * uniform + (1 - self.grid_eps) * adaptive
        grid = torch.cat([grid[:1] - step * torch.arange(k, 0, -1).unsqueeze(1), grid,
                          grid[-1:] + step * torch.arange(1, k + 1).unsqueeze(1)], dim=0)
        self.grid.copy_(grid.T)
        self.spline_weight.data.copy_(self.curve2coeff(x, unreduced))

    def regularization_loss(self, regularize_activation=1.0, regularize_entropy=1.0):
        l1 = self.spline_weight.abs().mean(-1)
        act = l1.sum()
        p = l1 / act
        return regularize_activation * act + regularize_entropy * -torch.sum(p * p.log())


def randomize_(module, seed=0):
    """Fresh random parameters at a realistic scale (U(-1/sqrt(fan), 1/sqrt(fan)) with fan the
    number of terms per output), so the op tests do not lean on the initialisation."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in module.named_parameters():
            fan = module.in_features * (t.shape[-1] if name == "spline_weight" else 1)
            t.copy_((torch.rand(t.shape, generator=g, dtype=torch.float64) * 2 - 1)
                    / math.sqrt(fan) * (2.0 if name == "spline_scaler" else 1.0))
    return module


def params_of(m):
    return {"grid": m.grid, "base_weight": m.base_weight, "spline_weight": m.spline_weight,
            "spline_scaler": getattr(m, "spline_scaler", None)}


def uniform_grid_torch(inf, G, k, lo, hi):
    """efficient-kan's initial grid formed by torch, for its bits."""
    h = (hi - lo) / G
    return (torch.arange(-k, G + k + 1) * h + lo).expand(inf, -1).contiguous()
