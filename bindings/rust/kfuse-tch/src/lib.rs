//! kfuse's layers on [tch](https://github.com/LaurentMazare/tch-rs) tensors (tch 0.10, libtorch
//! 1.13): stacked **GRU** / **A-GRU** ([`Rnn`]), **SKLinear** ([`SkLinear`]), **KANLinear** and
//! **KANConv2d** ([`Kan`]), forward and backward, taking and returning `tch::Tensor`.
//!
//! - Each layer borrows a [`kfuse::Context`] on the tensors' device ([`context`]) and holds its
//!   parameters as tch tensors (float32, on that device).
//! - Inputs are read in place through kfuse tensor views of their storage (`data_ptr` and
//!   `size`): no copy for a contiguous tensor; a non-contiguous one is first made contiguous.
//! - Outputs, gradients, kfuse's scratch and the RNN reserve are allocated by tch (PyTorch's
//!   caching allocator on CUDA).
//! - Backward is an explicit call that returns the gradients: tch 0.10 offers no custom autograd
//!   function, so the layers' outputs carry no autograd graph.
//! - A tensor of another dtype or device, or of the wrong rank, is an [`Error::Argument`] naming
//!   the call and the argument; what kfuse refuses (e.g. an extent) is an [`Error::Kfuse`] with
//!   the library's message, which names the argument too.
//!
//! CUDA: a context from [`context`]`(Device::Cuda(i))` enqueues on the legacy default stream,
//! PyTorch's default stream; kfuse must run on PyTorch's *current* stream, which tch 0.10 cannot
//! read: code that made another stream current passes it to [`kfuse::Context::set_stream`]. The
//! CUDA path is compiled but has not run on a GPU.
#![deny(missing_docs)]

mod convert;
mod error;
mod kan;
mod rnn;
mod sklinear;

pub use convert::context;
pub use error::{Error, Result};
pub use kan::{Kan, KanConv2d, KanGrads, KanKind, KanLinear, KanTensors};
pub use kfuse::{Activation, KanConv2dDesc, KanLinearDesc, Mode, RnnDesc, SkLinearDesc, WeightInfo};
pub use rnn::{Rnn, RnnGrads, RnnOutput, RnnSaved};
pub use sklinear::{SkGrads, SkLinear, SkSaved, SkTensors};

/// The safe kfuse crate, re-exported (contexts, descriptors, plans).
pub use kfuse;
/// The tch crate this one is built against, re-exported.
pub use tch;
