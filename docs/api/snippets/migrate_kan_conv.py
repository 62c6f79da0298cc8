import torch
from kfuse.torch import KANConv2d  # was: unfold + efficient_kan.KANLinear over the patches

conv = KANConv2d(1, 8, kernel_size=3, padding=1)  # torch.nn.Conv2d's geometry arguments
x = torch.rand(16, 1, 28, 28)
y = conv(x)                      # [16, 8, 28, 28]; neither patches nor bases are stored
y.mean().backward()
