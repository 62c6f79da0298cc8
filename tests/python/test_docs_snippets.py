"""The programs of the API reference's migration and performance pages (docs/api/snippets/*.py,
shown there by literalinclude) run as written, and what each one builds is held to its reference
in float64: torch.nn.GRU itself, the transcription of efficient-kan's KANLinear
(kan_reference.py), Panther's formula term by term, unfold + KANLinear. A page whose program
stopped running, or whose one-line swap stopped giving the reference's layer, fails here."""
import runpy
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from kan_reference import EfficientKANRef, ref_forward, rel  # noqa: E402

SNIPPETS = Path(__file__).resolve().parents[2] / "docs/api/snippets"
TOL = 1e-5


def run(name):
    torch.manual_seed(0)
    return runpy.run_path(str(SNIPPETS / name), run_name="snippet")


def test_every_snippet_is_tested():
    tested = {"migrate_gru.py", "migrate_efficient_kan.py", "migrate_panther.py",
              "migrate_kan_conv.py", "batch_tiny_calls.py"}
    assert {p.name for p in SNIPPETS.glob("*.py")} == tested


def test_gru_swap():
    g = run("migrate_gru.py")
    rnn, x = g["rnn"], g["x"]
    assert type(rnn).__module__ == "kfuse.torch.rnn"
    ref = torch.nn.GRU(28, 128, num_layers=2, batch_first=True).double()
    ref.load_state_dict(rnn.state_dict())  # the snippet loaded torch.nn.GRU's weights
    with torch.no_grad():
        y, h_n = rnn(x)
        y_ref, h_ref = ref(x.double())
    assert rel(y, y_ref) < TOL and rel(h_n, h_ref) < TOL


def test_efficient_kan_swap():
    g = run("migrate_efficient_kan.py")
    layer, x = g["layer"], g["x"]
    assert layer.base_weight.grad is not None and layer.spline_weight.grad is not None
    ref = EfficientKANRef(64, 32)
    ref.load_state_dict(layer.state_dict())  # efficient-kan's names and shapes, both ways
    layer.load_state_dict(ref.state_dict())
    with torch.no_grad():
        want = ref_forward(x.double(), layer.grid.double(), layer.base_weight.double(),
                           layer.spline_weight.double(), layer.spline_scaler.double(), 3)
        assert rel(layer(x), want) < TOL


def test_panther_swap():
    g = run("migrate_panther.py")
    layer, x, y = g["layer"], g["x"], g["y"]
    p = {n: getattr(layer, n).detach().double() for n in ("S1s", "S2s", "U1s", "U2s", "bias")}
    L = p["S1s"].shape[0]
    xd = x.double()
    want = sum(xd @ p["S1s"][i] @ p["U1s"][i] + xd @ p["U2s"][i] @ p["S2s"][i]
               for i in range(L)) / (2 * L) + p["bias"]
    assert rel(y, want) < TOL
    assert layer.S1s.grad is not None and layer.bias.grad is not None


def test_kan_conv_swap():
    g = run("migrate_kan_conv.py")
    conv, x, y = g["conv"], g["x"], g["y"]
    patches = F.unfold(x.double(), 3, padding=1).transpose(1, 2)  # [B, 784, 9]
    want = ref_forward(patches, conv.grid.double(), conv.base_weight.double(),
                       conv.spline_weight.double(), conv.spline_scaler.double(), 3)
    assert rel(y, want.transpose(1, 2).reshape(16, 8, 28, 28)) < TOL


def test_batching_tiny_calls():
    g = run("batch_tiny_calls.py")  # asserts itself that the batched call gives the loop's rows
    assert g["y"].shape == (1024, 32)
