import torch
from kfuse.torch import GRU  # was: from torch.nn import GRU

rnn = GRU(input_size=28, hidden_size=128, num_layers=2, batch_first=True)
x = torch.randn(64, 28, 28)  # [B, T, I]: 64 Fashion-MNIST images read as rows
y, h_n = rnn(x)              # y [64, 28, 128], h_n [2, 64, 128], as torch.nn.GRU gives
y.sum().backward()

# torch.nn.GRU's checkpoints load as they are (the same parameter names and shapes), both ways
rnn.load_state_dict(torch.nn.GRU(28, 128, num_layers=2, batch_first=True).state_dict())
