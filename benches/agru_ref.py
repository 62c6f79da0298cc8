"""The Python A-GRU that kfuse's users run today: an eager-PyTorch cell looped over time.

Equations (DESIGN.md, per layer and step; x: B x I, h: B x H):
    z  = sigmoid(W_z x + b_z + U_z h)
    r  = sigmoid(W_r x + b_r + U_r h)
    A  = W_h - W_h^T - gamma * I
    d  = tanh(V_h x + b_h + A (r * h))
    h' = h + eps * (z * d)

The cell is called once per step and rebuilds A each time, as the reference cell does (that
rebuild is one of the costs DESIGN.md lists). Parameter names match kfuse's canonical A-GRU
weights: cells.{l}.W_z.weight/bias, U_z.weight, W_r.weight/bias, U_r.weight, V_h.weight/bias,
W_h, epsilon.
"""
import math

import torch
from torch import nn


class AGRUCell(nn.Module):
    def __init__(self, input_size, hidden_size, gamma=0.01, epsilon=1.0):
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.gamma = gamma
        self.W_z = nn.Linear(input_size, hidden_size)
        self.U_z = nn.Linear(hidden_size, hidden_size, bias=False)
        self.W_r = nn.Linear(input_size, hidden_size)
        self.U_r = nn.Linear(hidden_size, hidden_size, bias=False)
        self.V_h = nn.Linear(input_size, hidden_size)
        k = 1.0 / math.sqrt(hidden_size)
        self.W_h = nn.Parameter(torch.empty(hidden_size, hidden_size).uniform_(-k, k))
        self.epsilon = nn.Parameter(torch.full((1,), float(epsilon)))
        self.register_buffer("eye", torch.eye(hidden_size), persistent=False)

    def forward(self, x, h):
        z = torch.sigmoid(self.W_z(x) + self.U_z(h))
        r = torch.sigmoid(self.W_r(x) + self.U_r(h))
        A = self.W_h - self.W_h.t() - self.gamma * self.eye
        d = torch.tanh(self.V_h(x) + (r * h) @ A.t())
        return h + self.epsilon * (z * d)


class AGRU(nn.Module):
    """Stacked A-GRU over a whole sequence: x [T, B, I] ([B, T, I] with batch_first) ->
    (y [T, B, H], h_n [L, B, H]), h0 default zeros."""

    def __init__(self, input_size, hidden_size, num_layers=1, gamma=0.01, epsilon=1.0,
                 batch_first=False):
        super().__init__()
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.batch_first = batch_first
        self.cells = nn.ModuleList(
            AGRUCell(input_size if l == 0 else hidden_size, hidden_size, gamma, epsilon)
            for l in range(num_layers))

    def forward(self, x, h0=None):
        if self.batch_first:
            x = x.transpose(0, 1)
        T, B = x.shape[0], x.shape[1]
        inp = x
        hn = []
        for l, cell in enumerate(self.cells):
            h = x.new_zeros(B, self.hidden_size) if h0 is None else h0[l]
            outs = []
            for t in range(T):
                h = cell(inp[t], h)
                outs.append(h)
            inp = torch.stack(outs)
            hn.append(h)
        y = inp.transpose(0, 1) if self.batch_first else inp
        return y, torch.stack(hn)
