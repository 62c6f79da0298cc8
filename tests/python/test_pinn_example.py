"""examples/python/pinn_poisson.py in a quick mode: kfuse's KAN and efficient-kan's (the
transcription in kan_reference.py, or the installed package) start from the same weights, so
their PINN losses (a Laplacian by double autograd) agree to float rounding at step 1, and
training lowers both; their Laplacians and the loss's weight gradients agree; the example's
Laplacian against central finite differences and its source term against the exact solution's
autograd Laplacian; --plot writes the figure."""
import importlib.util
import os
import sys

import pytest
import torch

from devices import cuda_ok

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "examples", "python"))
import pinn_poisson  # noqa: E402


QUICK = ["--steps", "6", "--points", "32", "--print-every", "1", "--test-grid", "16"]
DEVICES = ["cpu"] + (["cuda"] if cuda_ok() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype, tol", [("float32", 1e-5), ("float64", 1e-12)])
def test_losses_agree_and_decrease(device, dtype, tol, tmp_path):
    plot = (dtype, device) == ("float32", "cpu") and importlib.util.find_spec("matplotlib")
    out = tmp_path / "pinn.svg"
    history = pinn_poisson.main(QUICK + ["--dtype", dtype, "--device", device] +
                                (["--plot", str(out)] if plot else []))
    if plot:
        assert out.stat().st_size > 10000
        assert out.read_text().lstrip().startswith("<?xml")
    assert [r["step"] for r in history] == list(range(1, 7))
    k0, e0 = history[0]["kfuse"], history[0]["efficient-kan"]
    assert e0["loss"] > 0
    assert abs(k0["loss"] - e0["loss"]) <= tol * e0["loss"], (k0, e0)
    assert abs(k0["err"] - e0["err"]) <= tol * e0["err"], (k0, e0)
    for name in ("kfuse", "efficient-kan"):
        assert history[-1][name]["loss"] < 0.9 * history[0][name]["loss"], history
        assert all(r[name]["peak"] > 0 for r in history)
    if dtype == "float64":  # the same weights step by step: the whole curves agree
        for r in history:
            assert abs(r["kfuse"]["loss"] - r["efficient-kan"]["loss"]) <= 1e-9 * \
                r["efficient-kan"]["loss"], r


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_laplacian_matches_efficient_kan(device, dtype, tol):
    """At the start the loss is dominated by f (the Laplacian is small), so the loss check above
    sees little of the Laplacian: here the two Laplacians themselves, and the weight gradients
    of the loss, which the training step takes through them."""
    fused, ref = pinn_poisson.make_models(2, torch.device(device), dtype)
    interior, f, boundary = pinn_poisson.collocation(64, 4, device, dtype)
    (uk, lk), (ue, le) = (pinn_poisson.laplacian(m, interior) for m in (fused, ref))
    assert ((uk - ue).norm() / ue.norm()).item() < tol
    assert ((lk - le).norm() / le.norm()).item() < tol
    for m in (fused, ref):
        pinn_poisson.pinn_loss(m, interior, f, boundary, 10.0).backward()
    want = dict(ref.named_parameters())
    for name, pk in fused.named_parameters():
        pe = want[name]
        assert ((pk.grad - pe.grad).norm() / pe.grad.norm()).item() < tol, name


def test_laplacian_against_finite_differences():
    fused, ref = pinn_poisson.make_models(3, torch.device("cpu"), torch.float64)
    xy = torch.rand(16, 2, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    xy = xy * 1.8 - 0.9
    h = 1e-4
    with torch.no_grad():
        u0 = ref(xy).squeeze(-1)
        fd = sum((ref(xy + h * e).squeeze(-1) - 2 * u0 + ref(xy - h * e).squeeze(-1)) / h ** 2
                 for e in torch.eye(2, dtype=torch.float64))
    for model in (fused, ref):
        u, lap = pinn_poisson.laplacian(model, xy)
        assert torch.allclose(u, u0, rtol=1e-12, atol=1e-12)
        assert ((lap - fd).norm() / fd.norm()).item() < 1e-5


def test_source_is_minus_the_exact_laplacian():
    class Exact(torch.nn.Module):
        def forward(self, xy):
            return pinn_poisson.exact(xy).unsqueeze(-1)
    xy = torch.rand(50, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 2 - 1
    _, lap = pinn_poisson.laplacian(Exact(), xy)
    assert torch.allclose(-lap, pinn_poisson.source(xy), rtol=1e-12, atol=1e-12)
    _, _, boundary = pinn_poisson.collocation(40, 0, "cpu", torch.float64)
    assert (boundary.abs().amax(1) == 1).all()  # every boundary point on an edge
    assert pinn_poisson.exact(boundary).abs().max() < 1e-12
