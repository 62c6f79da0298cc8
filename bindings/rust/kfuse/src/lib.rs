//! Safe Rust API over kfuse, a C library of fused CPU and CUDA kernels for structured neural
//! layers behind a stable C ABI (`capi/include/kfuse.h`; raw bindings in `kfuse-sys`).
//!
//! Today: stacked **GRU** (exactly `torch.nn.GRU`) and **A-GRU** layers, forward and backward
//! over a whole sequence in one call; and **SKLinear** (Panther's sketched linear layer,
//! [`SkLinearPlan`]), forward, backward and Panther's initialisation; and **KANLinear**
//! (efficient-kan's layer, [`KanLinearPlan`]) and **KANConv2d** (its convolution over unfolded
//! patches, [`KanConv2dPlan`]), forward and backward with the bases never stored; both are a
//! [`KanPlan`] and share its parameter and argument structs.
//!
//! - [`Context`]: device, stream, BLAS handle, arena. `Send`, not `Sync`.
//! - [`RnnPlan`]: made once from an [`RnnDesc`], called many times; borrows its context.
//! - [`ForwardArgs`] / [`BackwardArgs`]: borrowed views ([`Tensor`], [`TensorMut`]) of host
//!   slices, whose lengths are checked against their shapes before the call; shapes and
//!   everything else are checked by the library. Device memory goes in through the `unsafe`
//!   `from_raw` constructors.
//! - [`Reserve`]: what a training forward writes and backward reads, owned by the caller.
//! - Every failure is an [`Error`]: the [`Status`] and the library's detail message naming the
//!   argument, e.g. `kf_rnn_forward: args->x.shape[2] = 64, expected 128 (input_size)`.
//!
//! A training step on the CPU:
//!
//! ```
//! use kfuse::*;
//! let ctx = Context::cpu()?;
//! let mut plan = RnnPlan::new(&ctx, &RnnDesc::agru(2, 8))?;
//! let w: Vec<Vec<f32>> = plan.weight_info().iter()
//!     .map(|i| (0..i.numel()).map(|k| ((k % 7) as f32 - 3.0) * 0.05).collect()).collect();
//! let mut dw: Vec<Vec<f32>> = w.iter().map(|v| vec![0.0; v.len()]).collect();
//! let (t, b) = (6, 3);
//! let x = vec![0.5f32; t * b * 2];
//! let mut y = vec![0.0f32; t * b * 8];
//! let fwd = ForwardArgs::new(Tensor::new(&x, &plan.x_shape(t, b)), &w,
//!                            TensorMut::new(&mut y, &plan.y_shape(t, b)));
//! let reserve = plan.forward(Mode::Training, &fwd)?.expect("training forward gives a reserve");
//! let bwd = BackwardArgs::from_forward(&fwd); // keeps x and w, not y
//! drop(fwd);
//! let dy = y.clone(); // d(0.5 * sum(y^2)) / dy
//! let bwd = bwd.dy(Tensor::new(&dy, &plan.y_shape(t, b))).dweights(WeightGrads::from_vecs(&mut dw));
//! plan.backward(GradMode::Overwrite, &bwd, &reserve)?;
//! drop(bwd);
//! assert!(dw.iter().flatten().any(|g| *g != 0.0));
//! # Ok::<(), kfuse::Error>(())
//! ```
//!
//! # Element types
//!
//! Every plan computes in a [`Float`] chosen at creation: `f32` by default (`RnnPlan::new`),
//! or through `new_typed` `f64`, [`half::bf16`] or [`half::f16`] (the `half` crate, re-exported
//! here) on the CPU backend. The 16-bit types are storage types: every tensor of a call holds
//! them, the arithmetic is float32, and each result is rounded once. A CUDA context refuses a
//! plan of any but `f32` with [`Status::Unsupported`]. A bfloat16 SKLinear:
//!
//! ```
//! use kfuse::*;
//! use kfuse::half::bf16;
//! let ctx = Context::cpu()?;
//! let desc = SkLinearDesc::new(8, 4, 1, 2);
//! let mut plan = SkLinearPlan::<bf16>::new_typed(&ctx, &desc)?;
//! let params: SkHostParams<bf16> = plan.init_params(1, None)?; // Panther's init, in bfloat16
//! let x: Vec<bf16> = (0..3 * 8).map(|k| bf16::from_f32(k as f32 / 24.0 - 0.5)).collect();
//! let mut y = vec![bf16::NAN; 3 * 4];
//! plan.forward(&SkForwardArgs::new(Tensor::new(&x, &[3, 8]), params.view(),
//!                                  TensorMut::new(&mut y, &[3, 4])))?;
//! assert!(y.iter().all(|v| v.is_finite()));
//! # Ok::<(), kfuse::Error>(())
//! ```
//!
//! `use kfuse::*` leaves std's `Result` as it is (this crate's alias is
//! [`error::Result`]):
//!
//! ```
//! use kfuse::*;
//! fn parse(s: &str) -> Result<i32, std::num::ParseIntError> { s.parse() }
//! assert_eq!(parse("7"), Ok(7));
//! ```
//!
//! # Threads and lifetimes, checked at compile time
//!
//! A context is `Send` but not `Sync`:
//!
//! ```compile_fail
//! fn need_sync<T: Sync>() {}
//! need_sync::<kfuse::Context>();
//! ```
//!
//! so a plan, which borrows it, is not `Send`:
//!
//! ```compile_fail
//! fn need_send<T: Send>() {}
//! need_send::<kfuse::RnnPlan<'static>>();
//! ```
//!
//! and a plan cannot outlive its context:
//!
//! ```compile_fail
//! let plan = {
//!     let ctx = kfuse::Context::cpu().unwrap();
//!     kfuse::RnnPlan::new(&ctx, &kfuse::RnnDesc::gru(1, 1)).unwrap()
//! };
//! ```
//!
//! nor can an output be read while a call's arguments still borrow it:
//!
//! ```compile_fail
//! use kfuse::*;
//! let ctx = Context::cpu().unwrap();
//! let mut plan = RnnPlan::new(&ctx, &RnnDesc::gru(1, 1)).unwrap();
//! let w: Vec<Vec<f32>> = plan.weight_info().iter().map(|i| vec![0.0; i.numel()]).collect();
//! let (x, mut y) = (vec![0.0f32; 1], vec![0.0f32; 1]);
//! let args = ForwardArgs::new(Tensor::new(&x, &[1, 1, 1]), &w, TensorMut::new(&mut y, &[1, 1, 1]));
//! let first = y[0];
//! plan.forward(Mode::Inference, &args).unwrap();
//! ```
//!
//! and every view of a call holds the plan's element type (a bfloat16 plan takes no `f32` data):
//!
//! ```compile_fail
//! use kfuse::*;
//! let ctx = Context::cpu().unwrap();
//! let desc = SkLinearDesc::new(2, 2, 1, 1);
//! let mut plan = SkLinearPlan::<half::bf16>::new_typed(&ctx, &desc).unwrap();
//! let p = SkHostParams::<half::bf16>::zeros_typed(&desc);
//! let (x, mut y) = (vec![0.0f32; 2], vec![0.0f32; 2]);
//! plan.forward(&SkForwardArgs::new(Tensor::new(&x, &[1, 2]), p.view(), TensorMut::new(&mut y, &[1, 2])))
//!     .unwrap();
//! ```
//!
//! # tch-rs interop
//! The separate crate `kfuse-tch` (bindings/rust/kfuse-tch, its own workspace) wraps these plans
//! as layers taking and returning `tch::Tensor`; it is kept out of this workspace so that building
//! `kfuse` never needs tch or libtorch (see the crate README).
#![deny(missing_docs)]

mod context;
pub mod error;
mod grad;
mod kan;
mod kan_conv;
mod layer;
mod rnn;
mod sklinear;
mod tensor;

pub use context::{ArenaInfo, Context, ContextBuilder, Device};
// `Result` stays at kfuse::error::Result: re-exported here it would shadow std's through
// `use kfuse::*`.
pub use error::{Error, Status};
pub use grad::GradMode;
pub use kan::{
    KanBackwardArgs, KanForwardArgs, KanHostParams, KanLayer, KanLinearDesc, KanLinearPlan, KanParams,
    KanPlan,
};
pub use kan_conv::{KanConv2dDesc, KanConv2dPlan};
pub use layer::WeightInfo;
pub use rnn::{
    BackwardArgs, Cell, ForwardArgs, Mode, Reserve, RnnDesc, RnnPlan, WeightGrads, Weights, WorkspaceSize,
};
pub use sklinear::{
    Activation, SkBackwardArgs, SkForwardArgs, SkHostParams, SkLinearDesc, SkLinearPlan, SkParams,
    SkParamsMut,
};
pub use tensor::{Element, Float, Tensor, TensorMut};

/// The `half` crate (1.6), whose [`bf16`](half::bf16) and [`f16`](half::f16) are the 16-bit
/// [`Float`]s: re-exported so that callers use the very version this crate implements `Float`
/// for, with no dependency of their own to keep in step.
pub use half;

/// Raw bindings, re-exported for calls the safe API does not cover yet.
pub use kfuse_sys as sys;

/// Version of the library loaded at run time as (major, minor, patch).
pub fn version() -> (u32, u32, u32) {
    // SAFETY: no arguments, no state.
    let v = unsafe { sys::kf_version() };
    (v / 10000, v / 100 % 100, v % 100)
}

/// The loaded library's version string, e.g. `"1.0.0"`.
pub fn version_string() -> &'static str {
    // SAFETY: static storage, never NULL.
    unsafe { std::ffi::CStr::from_ptr(sys::kf_version_string()) }.to_str().unwrap_or("?")
}
