#!/usr/bin/python3
"""One training epoch of kfuse's main job in PyTorch: the baseline of examples/train_fmnist.c.

Model (as train_fmnist): an L-layer recurrent layer (torch.nn.GRU, or the Python A-GRU loop of
agru_ref.py) with H=128 over Fashion-MNIST read as 28 rows of 28 pixels (T=28, I=28; --pixels:
T=784, I=1), a linear head H -> 10 on the last layer's h_n, softmax cross-entropy, Adam (lr 1e-3),
batch 128, shuffled, the last partial batch kept (469 batches). Data: Debian's
dataset-fashion-mnist IDX files, read with gzip + numpy; nothing is downloaded.

Prints one JSON line: {"bench": "epoch_torch", "model": ..., "epoch_s": <training seconds>, ...}.
epoch_s times the training loop only (the data is decoded before; no test pass), as
train_fmnist's "train ... s" figure does.

    /usr/bin/python3 benches/epoch_torch.py --model agru|gru [--threads N] [--limit-batches N]
"""
import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples",
                                "python"))
import fmnist  # noqa: E402  (the IDX reader, shared with the examples)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=["agru", "gru"], default="agru")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--pixels", action="store_true", help="T=784, I=1 instead of rows")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave)")
    ap.add_argument("--limit-batches", type=int, default=0,
                    help="train only N batches; epoch_s is then extrapolated to a full epoch")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data-dir", default=fmnist.DATA_DIR)
    a = ap.parse_args(argv)

    import torch
    from torch import nn
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from agru_ref import AGRU

    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)

    t_load = time.perf_counter()
    images, labels = fmnist.load("train", a.data_dir)
    T, I = (784, 1) if a.pixels else (28, 28)
    X = torch.from_numpy(images.astype(np.float32) / 255.0).reshape(-1, T, I)
    Y = torch.from_numpy(labels.astype(np.int64))
    t_load = time.perf_counter() - t_load

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            if a.model == "gru":
                self.rnn = nn.GRU(I, a.hidden, num_layers=a.layers, batch_first=True)
            else:
                self.rnn = AGRU(I, a.hidden, num_layers=a.layers, batch_first=True)
            self.head = nn.Linear(a.hidden, 10)

        def forward(self, x):
            _, hn = self.rnn(x)
            return self.head(hn[-1])

    net = Net()
    opt = torch.optim.Adam(net.parameters(), lr=a.lr)
    loss_fn = nn.CrossEntropyLoss()

    n = X.shape[0]
    nbatches = (n + a.batch - 1) // a.batch
    run_batches = min(nbatches, a.limit_batches) if a.limit_batches > 0 else nbatches
    g = torch.Generator().manual_seed(a.seed)
    perm = torch.randperm(n, generator=g)

    net.train()
    loss_sum, seen = 0.0, 0
    t0 = time.perf_counter()
    for bi in range(run_batches):
        idx = perm[bi * a.batch:(bi + 1) * a.batch]
        xb, yb = X[idx], Y[idx]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(xb), yb)
        loss.backward()
        opt.step()
        loss_sum += loss.item() * xb.shape[0]
        seen += xb.shape[0]
    train_s = time.perf_counter() - t0
    epoch_s = train_s * nbatches / run_batches

    out = {
        "bench": "epoch_torch",
        "impl": "torch" if a.model == "gru" else "torch-loop",
        "model": a.model,
        "T": T, "I": I, "H": a.hidden, "B": a.batch, "layers": a.layers,
        "threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""),
        "batches": run_batches,
        "batches_per_epoch": nbatches,
        "extrapolated": run_batches < nbatches,
        "train_s": round(train_s, 4),
        "epoch_s": round(epoch_s, 4),
        "train_loss": round(loss_sum / max(seen, 1), 5),
        "data_load_s": round(t_load, 3),
        "torch": torch.__version__,
    }
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
