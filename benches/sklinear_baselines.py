"""Baselines of the SKLinear benchmarks, in eager PyTorch, one definition each, used by both
benches/cpu_sklinear.py (CPU tensors) and benches/gpu_sklinear.py (CUDA tensors). Nothing here
is tied to a device: parameters and every intermediate live on the device of the tensors given.

  dense(in, out, device)      torch.nn.Linear(in, out), the dense layer SKLinear replaces.
  PantherCpuSKLinear(in, out, L, k, bias=True, device=None, dtype=None)
                              panther.nn.SKLinear's CPU path (pawX/linear.cpp, *_cpu) transcribed
                              to eager torch: same parameter and buffer names, shapes and
                              state_dict (S1s [L, in, k], S2s [L, k, out], bias [out]; buffers
                              U1s [L, k, out], U2s [L, in, k]), same forward wrapper (1-D and
                              N-D inputs), behind an autograd Function (PantherCpuFunction) as
                              Panther's module has. Forward: x expanded to [L, N, in], two bmm
                              chains (x S1 U1, x U2 S2), mean over the terms of each, times 0.5,
                              bias added in place. Backward: Panther's hand-written one (bmm
                              chains over the expanded g = dy / (2L), sums over the terms; g U1^T
                              formed twice, as Panther does). It transcribes the ATen calls, not
                              Panther's code; on CUDA tensors it runs that CPU-path kernel
                              sequence on the GPU (Panther's CUDA kernels are not transcribed).
                              Its parameters are uninitialised: load a state_dict (kfuse's, or
                              panther_construction_like's).
  panther_construction_like(in, out, L, k, bias=True, device=None)
                              the work of Panther's constructor (sign sketches U1s, U2s; Kaiming
                              W [in, out]; S1s = W U1^T, S2s = U2^T W per term by torch.matmul;
                              bias uniform in +-1/sqrt(out)), returned as a state_dict for
                              PantherCpuSKLinear: random parameters at Panther's scale, and the
                              construction-time comparison of cpu_sklinear.py.
  TwoGemm(m)                  the layer as two GEMMs on weights concatenated once (at
                              construction, outside any timing) from an SKLinear-like module m
                              (kfuse's or PantherCpuSKLinear): A = [S1_1..S1_L | U2_1..U2_L]
                              [in, 2Lk], B = [U1; S2] / (2L) [2Lk, out]; forward(x) =
                              addmm(bias, x A, B); forward_backward(x, dy) is the minimal set of
                              GEMMs written out by hand, no autograd: Z = x A, y = bias + Z B,
                              dZ = dy B^T, dx = dZ A^T, dS1s = x^T dZ[:, :Lk] (per term, in
                              Panther's layout), dS2s = Z[:, Lk:]^T dy / (2L), dbias = sum(dy):
                              the lower bound kfuse's two-GEMM design aims at.

The baselines time; they are checked against kfuse by cpu_sklinear.py before its timing and by
the tests, not here."""
import math

import torch
from torch import nn
from torch.nn import init


def dense(n_in, n_out, device=None):
    return nn.Linear(n_in, n_out, device=device)


# ---- Panther's CPU path, transcribed ------------------------------------------------------------

class PantherCpuFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, S1s, S2s, U1s, U2s, bias, use_gpu):
        L = S2s.size(0)
        xs = x.unsqueeze(0).expand(L, x.size(0), x.size(1))
        first = torch.bmm(torch.bmm(xs, S1s), U1s)
        second = torch.bmm(torch.bmm(xs, U2s), S2s)
        y = (first.mean(0) + second.mean(0)) * 0.5
        if bias is not None:
            y.add_(bias)
        # Panther's module saves its two flags as (host) tensors and reads them back with .item()
        ctx.save_for_backward(x, S1s, S2s, U1s, U2s, torch.tensor(use_gpu, dtype=torch.bool),
                              torch.tensor(bias is not None, dtype=torch.bool))
        return y

    @staticmethod
    def backward(ctx, gy):
        x, S1s, S2s, U1s, U2s, _use_gpu, has_bias = ctx.saved_tensors
        has_bias = bool(has_bias.item())
        L = S2s.size(0)
        g = (gy / (2 * L)).unsqueeze(0).expand(L, gy.size(0), gy.size(1))
        xt = x.unsqueeze(0).expand(L, x.size(0), x.size(1)).transpose(1, 2)
        U1t, S1t = U1s.transpose(1, 2), S1s.transpose(1, 2)
        U2t, S2t = U2s.transpose(1, 2), S2s.transpose(1, 2)
        gu = g.bmm(U1t)
        dx = gu.bmm(S1t).sum(0) + g.bmm(S2t).bmm(U2t).sum(0)
        dS2s = U2t.bmm(xt).bmm(g)
        dS1s = xt.bmm(g.bmm(U1t))  # Panther forms g U1^T a second time here
        db = gy.sum(0) if has_bias else None
        return dx, dS1s, dS2s, None, None, db, None


class PantherCpuSKLinear(nn.Module):
    """panther.nn.SKLinear with its CPU path's forward and backward (see the module docstring).
    Takes Panther's state_dict; constructs no values."""

    def __init__(self, in_features, out_features, num_terms, low_rank, bias=True, device=None,
                 dtype=None):
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        self.in_features, self.out_features = in_features, out_features
        self.num_terms, self.low_rank = num_terms, low_rank
        L, k = num_terms, low_rank
        self.register_buffer("U1s", torch.empty(L, k, out_features, **fk))
        self.register_buffer("U2s", torch.empty(L, in_features, k, **fk))
        self.S1s = nn.Parameter(torch.empty(L, in_features, k, **fk))
        self.S2s = nn.Parameter(torch.empty(L, k, out_features, **fk))
        self.bias = nn.Parameter(torch.empty(out_features, **fk)) if bias else None

    def forward(self, h_in):
        was_1d = h_in.dim() == 1
        if was_1d:
            h_in = h_in.unsqueeze(0)
        lead = h_in.shape[:-1]
        h_in = h_in.view(-1, self.in_features)
        out = PantherCpuFunction.apply(h_in, self.S1s, self.S2s, self.U1s, self.U2s, self.bias,
                                       False)
        return out.view(self.out_features) if was_1d else out.view(*lead, self.out_features)


def panther_construction_like(n_in, n_out, L, k, bias=True, device=None):
    """The work of Panther's constructor, as a state_dict for PantherCpuSKLinear (see the module
    docstring)."""
    def sketch(m, c):
        return (torch.randint(0, 2, (m, c), device=device).float() * 2 - 1) / math.sqrt(m)

    U1s = torch.stack([sketch(k, n_out) for _ in range(L)])        # [L, k, out]
    U2s = torch.stack([sketch(k, n_in).T for _ in range(L)])       # [L, in, k]
    W = torch.empty(n_in, n_out, device=device)
    init.kaiming_uniform_(W, a=math.sqrt(5))
    S1s = torch.stack([W @ U1s[i].T for i in range(L)])             # [L, in, k]
    S2s = torch.stack([U2s[i].T @ W for i in range(L)])             # [L, k, out]
    sd = {"S1s": S1s, "S2s": S2s}
    if bias:
        bound = 1.0 / math.sqrt(n_out)  # fan_in of W [in, out], as Panther computes it
        sd["bias"] = torch.empty(n_out, device=device).uniform_(-bound, bound)
    sd["U1s"], sd["U2s"] = U1s, U2s
    return sd


# ---- two GEMMs ---------------------------------------------------------------------------------

class TwoGemm:
    """The layer as two GEMMs on pre-concatenated weights; backward by hand (minimal GEMMs). Built
    from an SKLinear-like module's parameters, on their device (see the module docstring)."""

    def __init__(self, m):
        L, k = m.num_terms, m.low_rank
        self.L, self.r, self.k = L, L * k, k
        with torch.no_grad():
            S1 = m.S1s.detach().permute(1, 0, 2).reshape(m.in_features, self.r)
            U2 = m.U2s.detach().permute(1, 0, 2).reshape(m.in_features, self.r)
            self.A = torch.cat([S1, U2], 1).contiguous()                      # [in, 2r]
            self.Bm = (torch.cat([m.U1s.detach().reshape(self.r, -1),
                                  m.S2s.detach().reshape(self.r, -1)], 0)
                       / (2 * L)).contiguous()                                # [2r, out]
            self.bias = None if m.bias is None else m.bias.detach().clone()

    def _out(self, Z):
        if self.bias is None:
            return torch.mm(Z, self.Bm)
        return torch.addmm(self.bias, Z, self.Bm)

    def forward(self, x):
        return self._out(torch.mm(x, self.A))

    def forward_backward(self, x, dy):
        """(y, dx, dS1s, dS2s, dbias); dbias is None without a bias."""
        r, L, k = self.r, self.L, self.k
        Z = torch.mm(x, self.A)
        y = self._out(Z)
        dZ = torch.mm(dy, self.Bm.t())
        dx = torch.mm(dZ, self.A.t())
        # dS1s [L, in, k]: one GEMM per term, written in Panther's layout
        dS1s = torch.matmul(x.t(), dZ[:, :r].reshape(-1, L, k).transpose(0, 1))
        dS2s = torch.mm(Z[:, r:].t(), dy).mul_(1.0 / (2 * L)).view(L, k, -1)  # [L, k, out]
        db = None if self.bias is None else dy.sum(0)
        return y, dx, dS1s, dS2s, db
