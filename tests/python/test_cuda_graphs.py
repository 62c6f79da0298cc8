"""kfuse.torch modules inside CUDA graphs (torch.cuda.graph, PyTorch's default global capture
mode): a whole training step (forward, loss, backward) of GRU, AGRU, SKLinear and KANLinear is
captured once and replayed on new data; every replay's output and parameter gradients match an
eager step on the same data (the same kernels, so the same bits up to the graph's memory
placement: compared at float32 rounding). The workspace and reserve come from torch's caching
allocator (the graph's private pool during capture), never from the context's arena, so the
first captured call needs no warm-up of the library itself; the warm-up below is torch's own
requirement for autograd. Dropout is off: its masks are drawn from a host seed per call, which a
replay would repeat (issue 19 owes device-side seeds).

Needs torch with CUDA and a CUDA build of kfuse; skipped otherwise (CPU-only CI)."""
import pytest

torch = pytest.importorskip("torch")
import kfuse.torch as kt  # noqa: E402
from devices import cuda_ok  # noqa: E402


pytestmark = pytest.mark.skipif(not cuda_ok(), reason="needs torch CUDA and a CUDA build of kfuse")


def rel(a, b):
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


# name: (module factory, input shape)
MODULES = {
    "GRU": (lambda: kt.GRU(24, 32, num_layers=2, batch_first=True), (8, 12, 24)),
    "AGRU": (lambda: kt.AGRU(24, 32, num_layers=1, batch_first=True), (8, 12, 24)),
    "SKLinear": (lambda: kt.SKLinear(96, 80, 2, 16), (64, 96)),
    "KANLinear": (lambda: kt.KANLinear(48, 40), (64, 48)),
}


def loss_of(name, module, x):
    y = module(x)
    y = y[0] if isinstance(y, tuple) else y
    return y, (y * y).sum()


@pytest.mark.parametrize("name", sorted(MODULES))
def test_training_step_captured_and_replayed(name):
    make, shape = MODULES[name]
    torch.manual_seed(0)
    module = make().cuda()
    params = [p for p in module.parameters() if p.requires_grad]
    static_x = torch.randn(shape, device="cuda")

    # torch's recipe: warm up on a side stream (autograd's lazy state), then capture.
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            module.zero_grad(set_to_none=True)
            _, loss = loss_of(name, module, static_x)
            loss.backward()
    torch.cuda.current_stream().wait_stream(s)

    g = torch.cuda.CUDAGraph()
    module.zero_grad(set_to_none=True)
    with torch.cuda.graph(g):  # capture_error_mode defaults to "global"
        static_y, static_loss = loss_of(name, module, static_x)
        static_loss.backward()
    static_grads = [p.grad for p in params]

    for seed in (1, 2):
        torch.manual_seed(seed)
        new_x = torch.randn(shape, device="cuda")
        static_x.copy_(new_x)
        g.replay()
        torch.cuda.synchronize()
        got_y = static_y.detach().clone()
        got_grads = [gr.detach().clone() for gr in static_grads]

        module.zero_grad(set_to_none=True)
        want_y, want_loss = loss_of(name, module, new_x)
        want_loss.backward()
        assert rel(got_y, want_y.detach()) < 1e-6, name
        for p, got in zip(params, got_grads):
            assert rel(got, p.grad) < 1e-6, name
