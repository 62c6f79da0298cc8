"""PyTorch front end: drop-in `GRU` (torch.nn.GRU), `AGRU` (the reference A-GRU model),
`SKLinear` (panther.nn.SKLinear), `KANLinear` (efficient_kan.KANLinear) and `KANConv2d`
(torch.nn.functional.unfold + efficient_kan.KANLinear) modules whose forward and backward run in
the kfuse C library, as torch operators in the `kfuse` namespace (kfuse.torch._common.Op):

    kfuse::rnn, kfuse::rnn_backward                     GRU, AGRU           (kfuse.torch.rnn)
    kfuse::sklinear, kfuse::sklinear_backward           SKLinear            (kfuse.torch.sklinear)
    kfuse::kan_linear, kfuse::kan_conv2d (+ _backward)  KANLinear, KANConv2d (kfuse.torch.kan)

- On torch >= 2.4 they are registered with torch.library (fake kernels for shapes, autograd), so
  torch.compile(fullgraph=True), torch.export, torch.jit.trace (+ save/load in a process that
  imports kfuse.torch), torch.func.vmap and functional_call work; torch.onnx.export raises (there
  is no ONNX equivalent). On torch 1.13 the same kernels run through autograd.Functions; tracing
  raises a RuntimeError naming kfuse. torch.func.vmap has rules for the SKLinear and KAN
  operators (a vmapped input is one call; vmapped parameters, an ensemble, one call per sample);
  torch.func.grad/jvp over the operators are refused by torch itself (torch.library autograd
  formulas are not functorch-transformable).
- Gradients are first order: a gradient taken with create_graph=True has the usual values, and
  differentiating it again (gradgradcheck, a gradient penalty) raises a RuntimeError naming the
  kfuse operator (the backward kernels have no derivative of their own), never a silently wrong
  second-order result.
- CPU tensors run on the calling thread's CPU kfuse context for torch.get_num_threads() threads
  (scratch from its arena; the reserve that backward reads is a torch uint8 tensor).
- CUDA tensors run on the calling thread's kfuse context for that device, set to
  torch.cuda.current_stream() before every call; workspace and reserve come from torch's caching
  allocator, so memory is stream-ordered with the rest of the program and nothing synchronises.
- Contexts and plans are cached per (device, thread, thread count): a kfuse context is used by
  one thread at a time, and autograd may run backward on another thread than forward.
- Every argument check is the library's: a bad shape, dtype or descriptor raises the matching
  kfuse.KfuseError subclass (InvalidArgument is a ValueError) with the library's message.
- Dropout between layers uses kfuse's counter-based generator, keyed by a seed drawn from torch's
  default generator at each training forward, so torch.manual_seed() makes it reproducible.
  SKLinear's initialisation (kf_sklinear_init_params) is keyed the same way, by a seed drawn at
  construction.
- KANLinear draws its initialisation from torch's default generator in efficient-kan's order;
  its grid comes from kf_kan_linear_uniform_grid and update_grid is kf_kan_linear_update_grid
  (whose quantile knots are those of torch 1.13's int64 linspace; torch 2.x's linspace picks
  other samples in the upper half for some batch sizes, a difference the C API cannot express
  yet);
  the other rare calls (reset_parameters, curve2coeff, b_splines, regularization_loss) run in
  torch. KANConv2d is a KANLinear over the patches: the same parameters, initialisation and rare
  calls, with forward, backward and update_grid in kf_kan_conv2d_* (no patches stored).
"""
from kfuse.torch._common import HAS_TORCH_LIBRARY  # noqa: F401
from kfuse.torch.kan import KANConv2d, KANLinear, kan_conv2d_function, kan_linear_function
from kfuse.torch.rnn import AGRU, GRU, AGRUCell, rnn_function
from kfuse.torch.sklinear import SKLinear, sklinear_function

__all__ = ["GRU", "AGRU", "AGRUCell", "SKLinear", "KANLinear", "KANConv2d", "rnn_function",
           "sklinear_function", "kan_linear_function", "kan_conv2d_function"]
