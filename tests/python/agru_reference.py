"""The reference A-GRU model in eager PyTorch: what users run today (a Python cell looped over
time), and what kfuse.torch.AGRU must replace without changes. Used by the tests as the float64
reference and by examples/python/train_agru.py as the baseline.

Per layer and step (x: B x I, h: B x H), DESIGN.md:
    z  = sigmoid(W_z x + b_z + U_z h)
    r  = sigmoid(W_r x + b_r + U_r h)
    A  = W_h - W_h^T - gamma * I
    d  = tanh(V_h x + b_h + A (r * h))
    h' = h + eps * (z * d)
Dropout between layers (not after the last), batch_first, h0 default zeros; returns
(y: the last layer at every step, h_n: [L, B, H] the last state of every layer).
"""
import math

import torch
from torch import nn


class AGRUCell(nn.Module):
    def __init__(self, input_size, hidden_size, gamma=0.01, epsilon=1.0, device=None, dtype=None):
        factory_kwargs = {"device": device, "dtype": dtype}
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.gamma = gamma
        self.W_z = nn.Linear(input_size, hidden_size, **factory_kwargs)
        self.U_z = nn.Linear(hidden_size, hidden_size, bias=False, **factory_kwargs)
        self.W_r = nn.Linear(input_size, hidden_size, **factory_kwargs)
        self.U_r = nn.Linear(hidden_size, hidden_size, bias=False, **factory_kwargs)
        self.V_h = nn.Linear(input_size, hidden_size, **factory_kwargs)
        bound = 1.0 / math.sqrt(hidden_size)
        self.W_h = nn.Parameter(torch.empty(hidden_size, hidden_size, **factory_kwargs)
                                .uniform_(-bound, bound))
        self.epsilon = nn.Parameter(torch.full((1,), float(epsilon), **factory_kwargs))

    def forward(self, x, h):
        eye = torch.eye(self.hidden_size, dtype=h.dtype, device=h.device)
        A = self.W_h - self.W_h.t() - self.gamma * eye  # rebuilt every step, as users do
        z = torch.sigmoid(self.W_z(x) + self.U_z(h))
        r = torch.sigmoid(self.W_r(x) + self.U_r(h))
        d = torch.tanh(self.V_h(x) + (r * h) @ A.t())
        return h + self.epsilon * (z * d)


class AGRU(nn.Module):
    def __init__(self, input_size, hidden_size, num_layers=1, batch_first=False, dropout=0.0,
                 gamma=0.01, epsilon=1.0, device=None, dtype=None):
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.batch_first = batch_first
        self.dropout = dropout
        self.gamma = gamma
        self.cells = nn.ModuleList(
            AGRUCell(input_size if l == 0 else hidden_size, hidden_size, gamma, epsilon,
                     device=device, dtype=dtype)
            for l in range(num_layers))
        self.drop = nn.Dropout(dropout)

    def forward(self, input, hx=None):
        unbatched = input.dim() == 2
        if unbatched:
            input = input.unsqueeze(0 if self.batch_first else 1)
            if hx is not None:
                hx = hx.unsqueeze(1)
        x = input.transpose(0, 1) if self.batch_first else input  # [T, B, I]
        T, B = x.shape[0], x.shape[1]
        if hx is None:
            hx = x.new_zeros(self.num_layers, B, self.hidden_size)
        hn = []
        for l, cell in enumerate(self.cells):
            h = hx[l]
            outs = []
            for t in range(T):
                h = cell(x[t], h)
                outs.append(h)
            hn.append(h)
            x = torch.stack(outs)
            if l < self.num_layers - 1:
                x = self.drop(x)
        y = x.transpose(0, 1) if self.batch_first else x
        hn = torch.stack(hn)
        if unbatched:
            y = y.squeeze(0 if self.batch_first else 1)
            hn = hn.squeeze(1)
        return y, hn
