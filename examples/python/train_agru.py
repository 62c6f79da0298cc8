#!/usr/bin/env python3
"""Trains the reference A-GRU classifier (eager PyTorch, a Python cell looped over time) and the
same model with kfuse.torch.AGRU side by side on Fashion-MNIST read as 28 rows of 28 pixels, from
the same seed and the same initial weights, on the same batches in the same order, and prints the
time per epoch of each and kfuse's speedup.

Model: AGRU(28, H, L) -> last layer's final state h_n[-1] -> Linear(H, 10); cross-entropy; Adam.
Data: Debian's dataset-fashion-mnist (gzip'd IDX under /usr/share/datasets/fashion-mnist);
nothing is downloaded.

    python3 examples/python/train_agru.py --epochs 1 --limit-batches 50

Needs the kfuse package (bash scripts/test-python.sh installs it into build/pyenv:
build/pyenv/bin/python examples/python/train_agru.py ...), PyTorch and tqdm. Set
OMP_WAIT_POLICY=PASSIVE on small machines (done here by default) so torch's OpenMP threads do
not spin against everything else.
"""
import argparse
import os
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from tqdm import tqdm  # noqa: E402

import kfuse.torch as kt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "python"))
import agru_reference  # noqa: E402  (the eager reference A-GRU, shared with the tests)
import fmnist  # noqa: E402  (the IDX reader, shared with the benches)


def load(data_dir, split):
    images, labels = fmnist.load(split, data_dir)
    x = torch.from_numpy(images.astype(np.float32) / 255.0)  # [N, 28, 28]: 28 steps of 28
    return x, torch.from_numpy(labels.astype(np.int64))


class Classifier(nn.Module):
    def __init__(self, rnn, hidden):
        super().__init__()
        self.rnn = rnn
        self.head = nn.Linear(hidden, 10)

    def forward(self, x):  # x: [B, T, I]
        _, hn = self.rnn(x)
        return self.head(hn[-1])


def batches(n, batch, order, limit):
    count = (n + batch - 1) // batch
    if limit:
        count = min(count, limit)
    for i in range(count):
        yield order[i * batch:(i + 1) * batch]


def train_epoch(name, model, opt, x, y, order, args):
    model.train()
    n_batches = (len(order) + args.batch - 1) // args.batch
    if args.limit_batches:
        n_batches = min(n_batches, args.limit_batches)
    total, correct, loss_sum = 0, 0, 0.0
    t0 = time.perf_counter()
    bar = tqdm(batches(len(order), args.batch, order, args.limit_batches), total=n_batches,
               desc="%-9s" % name, unit="batch", leave=True)
    for idx in bar:
        xb, yb = x[idx], y[idx]
        opt.zero_grad(set_to_none=True)
        logits = model(xb)
        loss = nn.functional.cross_entropy(logits, yb)
        loss.backward()
        opt.step()
        total += len(idx)
        correct += (logits.argmax(1) == yb).sum().item()
        loss_sum += loss.item() * len(idx)
        bar.set_postfix(loss="%.4f" % (loss_sum / total), acc="%.3f" % (correct / total))
    return time.perf_counter() - t0, loss_sum / total, correct / total


@torch.no_grad()
def evaluate(model, x, y, args):
    model.eval()
    correct = total = 0
    order = torch.arange(len(x))
    for idx in batches(len(x), args.batch, order, args.limit_batches):
        correct += (model(x[idx]).argmax(1) == y[idx]).sum().item()
        total += len(idx)
    return correct / total


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--limit-batches", type=int, default=0,
                   help="train (and evaluate) on at most this many batches per epoch (0: all)")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch default)")
    p.add_argument("--data-dir", default=fmnist.DATA_DIR)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    try:
        x_train, y_train = load(args.data_dir, "train")
        x_test, y_test = load(args.data_dir, "test")
    except (OSError, ValueError) as e:
        sys.exit("train_agru: cannot read Fashion-MNIST from %s: %s (Debian package "
                 "dataset-fashion-mnist)" % (args.data_dir, e))

    torch.manual_seed(args.seed)
    ref = Classifier(agru_reference.AGRU(28, args.hidden, args.layers, batch_first=True,
                                         dropout=args.dropout), args.hidden)
    fast = Classifier(kt.AGRU(28, args.hidden, args.layers, batch_first=True,
                              dropout=args.dropout), args.hidden)
    fast.load_state_dict(ref.state_dict(), strict=True)  # same weights, parameter for parameter
    opt_ref = torch.optim.Adam(ref.parameters(), lr=args.lr)
    opt_fast = torch.optim.Adam(fast.parameters(), lr=args.lr)
    print("A-GRU classifier on Fashion-MNIST rows (T=28, I=28, H=%d, L=%d, B=%d), CPU, "
          "torch %s with %d threads" % (args.hidden, args.layers, args.batch, torch.__version__,
                                        torch.get_num_threads()))

    gen = torch.Generator().manual_seed(args.seed)
    for epoch in range(1, args.epochs + 1):
        order = torch.randperm(len(x_train), generator=gen)  # the same batches for both
        torch.manual_seed(args.seed + epoch)  # dropout streams start alike (masks differ)
        t_ref, loss_ref, acc_ref = train_epoch("reference", ref, opt_ref, x_train, y_train,
                                               order, args)
        torch.manual_seed(args.seed + epoch)
        t_fast, loss_fast, acc_fast = train_epoch("kfuse", fast, opt_fast, x_train, y_train,
                                                  order, args)
        test_ref = evaluate(ref, x_test, y_test, args)
        test_fast = evaluate(fast, x_test, y_test, args)
        drift = max((a - b).abs().max().item()
                    for a, b in zip(ref.state_dict().values(), fast.state_dict().values()))
        print("epoch %d: reference %.2f s (loss %.4f, train acc %.3f, test acc %.3f) | "
              "kfuse %.2f s (loss %.4f, train acc %.3f, test acc %.3f) | speedup %.2fx | "
              "max weight difference %.2e"
              % (epoch, t_ref, loss_ref, acc_ref, test_ref, t_fast, loss_fast, acc_fast,
                 test_fast, t_ref / t_fast, drift))


if __name__ == "__main__":
    main()
