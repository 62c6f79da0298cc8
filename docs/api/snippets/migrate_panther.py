import torch
from kfuse.torch import SKLinear  # was: from panther.nn import SKLinear

layer = SKLinear(1024, 1024, num_terms=1, low_rank=16)  # Panther's arguments and defaults
x = torch.randn(64, 1024)
y = layer(x)                       # [64, 1024]: two GEMMs through the rank-2Lk bottleneck
y.sum().backward()                 # gradients of S1s, S2s and bias; U1s, U2s stay fixed buffers
