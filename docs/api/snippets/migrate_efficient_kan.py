import torch
from kfuse.torch import KANLinear  # was: from efficient_kan import KANLinear

layer = KANLinear(64, 32, grid_size=5, spline_order=3)
x = torch.rand(256, 64) * 2 - 1
y = layer(x)                           # [256, 32]; the B-spline bases are never stored
layer.update_grid(x)                   # efficient-kan's extras are there too
loss = layer(x).square().mean() + 1e-4 * layer.regularization_loss()
loss.backward()
