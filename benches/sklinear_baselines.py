"""Baselines of the SKLinear benchmarks (benches/cpu_sklinear.py, benches/gpu_sklinear.py), in eager
PyTorch, one definition each:

  dense(in, out)            torch.nn.Linear, what SKLinear replaces;
  TwoGemm(in, out, L, k)    the same two GEMMs kfuse computes, on weights concatenated once ahead
                            of time: y = (x W1) W2 / (2L) + b, W1 [in, 2Lk], W2 [2Lk, out];
  PantherBmm(in, out, L, k) Panther's formulation as its CPU path (pawX/linear.cpp) writes it:
                            x expanded over the L terms, batched matmuls per term, mean over the
                            terms; autograd differentiates it. A transcription of the math and
                            of its kernel sequence, not Panther's code.
Parameters are random at Panther's scale; the baselines time, they are not checked against
anything here (the tests do that)."""
import torch


def dense(n_in, n_out, device):
    return torch.nn.Linear(n_in, n_out, device=device)


class TwoGemm(torch.nn.Module):
    def __init__(self, n_in, n_out, L, k, device):
        super().__init__()
        s = 1.0 / k ** 0.5
        self.W1 = torch.nn.Parameter((torch.rand(n_in, 2 * L * k, device=device) * 2 - 1) * s)
        self.W2 = torch.nn.Parameter((torch.rand(2 * L * k, n_out, device=device) * 2 - 1) * s)
        self.b = torch.nn.Parameter(torch.zeros(n_out, device=device))
        self.scale = 1.0 / (2 * L)

    def forward(self, x):
        return torch.addmm(self.b, x @ self.W1, self.W2, alpha=self.scale)


class PantherBmm(torch.nn.Module):
    def __init__(self, n_in, n_out, L, k, device):
        super().__init__()
        s = 1.0 / k ** 0.5

        def u(*shape):
            return (torch.rand(*shape, device=device) * 2 - 1) * s
        self.S1s = torch.nn.Parameter(u(L, n_in, k))
        self.S2s = torch.nn.Parameter(u(L, k, n_out))
        self.register_buffer("U1s", u(L, k, n_out))
        self.register_buffer("U2s", u(L, n_in, k))
        self.bias = torch.nn.Parameter(torch.zeros(n_out, device=device))

    def forward(self, x):
        xe = x.unsqueeze(0).expand(self.S1s.shape[0], x.shape[0], x.shape[1])
        t1 = xe.bmm(self.S1s).bmm(self.U1s)
        t2 = xe.bmm(self.U2s).bmm(self.S2s)
        return (t1 + t2).mean(0).div(2.0) + self.bias
