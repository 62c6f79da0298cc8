//! GRU and A-GRU stacks on tch tensors: kfuse's `RnnPlan` with the weights held as tch tensors,
//! outputs, scratch and the reserve allocated by tch.
use crate::convert::{
    device_of, dims, empty, input, input_of, opt_input, param, ptrs, view, view_mut, Scratch,
};
use crate::error::{Error, Result};
use kfuse::{
    BackwardArgs, Context, ForwardArgs, GradMode, Mode, RnnDesc, RnnPlan, WeightGrads, WeightInfo, Weights,
};
use std::sync::atomic::{AtomicU64, Ordering};
use tch::{Kind, Tensor};

static NEXT_LAYER_ID: AtomicU64 = AtomicU64::new(1);

/// A stack of GRU (`torch.nn.GRU`) or A-GRU layers whose weights are tch tensors, run by kfuse
/// over whole sequences; forward and an explicit backward that returns the gradients.
///
/// ```
/// use kfuse_tch::{context, Mode, Rnn, RnnDesc};
/// use tch::{Device, Kind, Tensor};
/// let ctx = context(Device::Cpu)?;
/// let mut gru = Rnn::new(&ctx, &RnnDesc::gru(16, 32).layers(2))?;
/// let x = Tensor::randn(&[10, 4, 16], (Kind::Float, Device::Cpu)); // [T, B, I]
/// let out = gru.forward(&x, None, Mode::Training)?;               // y [10, 4, 32], hn [2, 4, 32]
/// let g = gru.backward(out.saved.as_ref().unwrap(), Some(&out.y.ones_like()), None)?;
/// assert_eq!(g.dweights.len(), gru.weights().len());
/// # Ok::<(), kfuse_tch::Error>(())
/// ```
pub struct Rnn<'ctx> {
    plan: RnnPlan<'ctx>,
    device: tch::Device,
    info: Vec<WeightInfo>,
    weights: Vec<Tensor>,
    id: u64,
}

/// What [`Rnn::forward`] returns.
#[derive(Debug)]
pub struct RnnOutput {
    /// Every step of the last layer: `[T, B, D*H]` (`[B, T, D*H]` batch-first).
    pub y: Tensor,
    /// The last state of every layer and direction, `[L*D, B, H]`.
    pub hn: Tensor,
    /// What [`Rnn::backward`] needs ([`Mode::Training`] only).
    pub saved: Option<RnnSaved>,
}

/// What a training forward keeps for backward: handles on x, h0 and the lengths (no copies:
/// they must not be changed in place before backward, nor must the weights) and the reserve
/// kfuse wrote.
#[derive(Debug)]
pub struct RnnSaved {
    layer: u64,
    x: Tensor,
    h0: Option<Tensor>,
    lengths: Option<Tensor>,
    t: usize,
    b: usize,
    dropout_seed: Option<u64>,
    reserve: Scratch,
}

/// What [`Rnn::backward`] returns.
#[derive(Debug)]
pub struct RnnGrads {
    /// Gradient of x (x's shape).
    pub dx: Tensor,
    /// Gradient of h0, `[L*D, B, H]` (of the zero h0 when none was given).
    pub dh0: Tensor,
    /// Gradient of every weight, in [`Rnn::weights`]' order (A-GRU: epsilon included).
    pub dweights: Vec<Tensor>,
}

impl<'ctx> Rnn<'ctx> {
    /// A stack described by `desc` on `ctx`'s device, its weights drawn from tch's generator
    /// (`tch::manual_seed` makes them reproducible) as `torch.nn.GRU` draws every weight:
    /// U(-1/sqrt(H), 1/sqrt(H)); an A-GRU's epsilon starts at 1.
    pub fn new(ctx: &'ctx Context, desc: &RnnDesc) -> Result<Rnn<'ctx>> {
        let plan = RnnPlan::new(ctx, desc)?;
        let device = device_of(ctx);
        let bound = 1.0 / (desc.hidden_size().max(1) as f64).sqrt();
        let weights = plan
            .weight_info()
            .iter()
            .map(|w| {
                let mut t = empty(&w.shape, device)?;
                Ok(if w.name.ends_with("epsilon") { t.f_fill_(1.0)? } else { t.f_uniform_(-bound, bound)? })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Rnn::with_plan(plan, device, weights))
    }

    /// A stack with the given weights, in the canonical order and shapes of
    /// [`weight_info`](Self::weight_info) (`torch.nn.GRU`'s `_flat_weights` order for a GRU):
    /// float32 tensors on `ctx`'s device. Checked here and at every call.
    pub fn from_weights(ctx: &'ctx Context, desc: &RnnDesc, weights: Vec<Tensor>) -> Result<Rnn<'ctx>> {
        const CALL: &str = "Rnn::from_weights";
        let plan = RnnPlan::new(ctx, desc)?;
        let layer = Rnn::with_plan(plan, device_of(ctx), weights);
        layer.checked_weights(CALL)?;
        Ok(layer)
    }

    fn with_plan(plan: RnnPlan<'ctx>, device: tch::Device, weights: Vec<Tensor>) -> Rnn<'ctx> {
        let info = plan.weight_info();
        Rnn { plan, device, info, weights, id: NEXT_LAYER_ID.fetch_add(1, Ordering::Relaxed) }
    }

    /// The kfuse plan (descriptor, shapes, workspace sizes).
    pub fn plan(&self) -> &RnnPlan<'ctx> {
        &self.plan
    }
    /// Name and shape of every weight, in the order of [`weights`](Self::weights).
    pub fn weight_info(&self) -> &[WeightInfo] {
        &self.info
    }
    /// The weights.
    pub fn weights(&self) -> &[Tensor] {
        &self.weights
    }
    /// The weights, e.g. for an optimiser step in place or to load a checkpoint; their count,
    /// shapes, dtype and device are checked at every call.
    pub fn weights_mut(&mut self) -> &mut [Tensor] {
        &mut self.weights
    }

    /// Runs the stack over the sequence `x` (`[T, B, I]`, or `[B, T, I]` batch-first) from `h0`
    /// (`[L*D, B, H]`; zeros when `None`). [`Mode::Training`] also returns what backward needs,
    /// and applies the descriptor's dropout with a key drawn from tch's generator.
    pub fn forward(&mut self, x: &Tensor, h0: Option<&Tensor>, mode: Mode) -> Result<RnnOutput> {
        self.forward_impl("Rnn::forward", x, h0, None, mode)
    }

    /// As [`forward`](Self::forward) on sequences of `lengths` (`[B]`, int32 in 0..=T, on the
    /// context's device; ascending order not required): steps past `lengths[b]` leave sample b's
    /// state unchanged and give y = 0 there (torch's packed sequences, without the packing); the
    /// reverse direction starts at `lengths[b] - 1`.
    pub fn forward_with_lengths(
        &mut self,
        x: &Tensor,
        h0: Option<&Tensor>,
        lengths: &Tensor,
        mode: Mode,
    ) -> Result<RnnOutput> {
        self.forward_impl("Rnn::forward_with_lengths", x, h0, Some(lengths), mode)
    }

    fn forward_impl(
        &mut self,
        call: &str,
        x: &Tensor,
        h0: Option<&Tensor>,
        lengths: Option<&Tensor>,
        mode: Mode,
    ) -> Result<RnnOutput> {
        let dev = self.device;
        let x = input(call, "x", x, dev)?;
        let h0 = opt_input(call, "h0", h0, dev)?;
        let lengths = lengths.map(|l| input_of::<i32>(call, "lengths", l, dev)).transpose()?;
        let weights = self.checked_weights(call)?;
        let (t, b) = self.steps_and_batch(call, &x)?;
        let ws = self.plan.workspace_size(t, b, mode)?;
        let scratch = Scratch::new(ws.workspace_bytes, dev)?;
        let reserve = Scratch::new(ws.reserve_bytes, dev)?;
        let dropout_seed = (mode == Mode::Training && self.plan.desc().dropout_p() > 0.0)
            .then(|| {
                Tensor::f_randint(i64::MAX, &[1], (Kind::Int64, tch::Device::Cpu))
                    .map(|s| s.int64_value(&[0]) as u64)
            })
            .transpose()?;
        let mut y = empty(&self.plan.y_shape(t, b), dev)?;
        let mut hn = empty(&self.plan.state_shape(b), dev)?;
        let wp = ptrs(&weights);
        {
            // SAFETY: every pointer is a checked weight of the plan's shape (see checked_weights).
            let mut args = ForwardArgs::new(view(&x), unsafe { Weights::from_raw(&wp) }, view_mut(&mut y))
                .hn(view_mut(&mut hn));
            if let Some(h0) = &h0 {
                args = args.h0(view(h0));
            }
            if let Some(l) = &lengths {
                args = args.lengths(view(l));
            }
            if let Some(seed) = dropout_seed {
                args = args.dropout(seed, 0);
            }
            // SAFETY: scratch and reserve are tch allocations of the sizes the plan asked for,
            // aligned, on the context's device, alive until the call's work is enqueued (CUDA:
            // the caching allocator reuses them only in stream order).
            unsafe {
                self.plan.forward_raw(
                    mode,
                    &args,
                    scratch.ptr(),
                    scratch.bytes(),
                    reserve.ptr(),
                    reserve.bytes(),
                )?
            };
        }
        let saved = (mode == Mode::Training).then(|| RnnSaved {
            layer: self.id,
            x,
            h0,
            lengths,
            t,
            b,
            dropout_seed,
            reserve,
        });
        Ok(RnnOutput { y, hn, saved })
    }

    /// Gradients of x, h0 and every weight from what a training forward of this layer `saved`,
    /// given the gradients of y and hn (zeros when `None`).
    pub fn backward(
        &mut self,
        saved: &RnnSaved,
        dy: Option<&Tensor>,
        dhn: Option<&Tensor>,
    ) -> Result<RnnGrads> {
        const CALL: &str = "Rnn::backward";
        if saved.layer != self.id {
            return Err(Error::arg(CALL, "saved comes from a forward of another layer"));
        }
        let dev = self.device;
        let dy = opt_input(CALL, "dy", dy, dev)?;
        let dhn = opt_input(CALL, "dhn", dhn, dev)?;
        let weights = self.checked_weights(CALL)?;
        let scratch =
            Scratch::new(self.plan.workspace_size(saved.t, saved.b, Mode::Training)?.workspace_bytes, dev)?;
        let mut dx = empty(&dims(&saved.x), dev)?;
        let mut dh0 = empty(&self.plan.state_shape(saved.b), dev)?;
        let mut dweights = self.info.iter().map(|w| empty(&w.shape, dev)).collect::<Result<Vec<_>>>()?;
        let wp = ptrs(&weights);
        let dwp: Vec<*mut f32> = dweights.iter_mut().map(|g| g.data_ptr() as *mut f32).collect();
        {
            // SAFETY: checked weights as in forward; the gradients are new tensors of the
            // weights' shapes, written only by this call.
            let mut args = BackwardArgs::new(view(&saved.x), unsafe { Weights::from_raw(&wp) })
                .dx(view_mut(&mut dx))
                .dh0(view_mut(&mut dh0))
                .dweights(unsafe { WeightGrads::from_raw(&dwp) });
            if let Some(h0) = &saved.h0 {
                args = args.h0(view(h0));
            }
            if let Some(l) = &saved.lengths {
                args = args.lengths(view(l));
            }
            if let Some(seed) = saved.dropout_seed {
                args = args.dropout(seed, 0);
            }
            if let Some(dy) = &dy {
                args = args.dy(view(dy));
            }
            if let Some(dhn) = &dhn {
                args = args.dhn(view(dhn));
            }
            // SAFETY: as in forward; the reserve is the one this layer's training forward wrote
            // for these inputs (checked by id; its size by kfuse).
            unsafe {
                self.plan.backward_raw(
                    GradMode::Overwrite,
                    &args,
                    scratch.ptr(),
                    scratch.bytes(),
                    saved.reserve.ptr(),
                    saved.reserve.bytes(),
                )?
            };
        }
        Ok(RnnGrads { dx, dh0, dweights })
    }

    /// T and B of x, which must be 3-D (its extents are checked by kfuse).
    fn steps_and_batch(&self, call: &str, x: &Tensor) -> Result<(usize, usize)> {
        let xs = dims(x);
        self.plan.desc().steps_and_batch(&xs).ok_or_else(|| {
            Error::arg(
                call,
                format_args!(
                    "x has shape {xs:?}, expected 3 dimensions ([T, B, I], or [B, T, I] batch-first)"
                ),
            )
        })
    }

    /// The weights checked against the plan (count, shapes, dtype, device) and contiguous: kfuse
    /// takes their shapes from the plan, so a wrong one must never reach it.
    fn checked_weights(&self, call: &str) -> Result<Vec<Tensor>> {
        if self.weights.len() != self.info.len() {
            return Err(Error::arg(
                call,
                format_args!(
                    "{} weights, expected {} (Rnn::weight_info)",
                    self.weights.len(),
                    self.info.len()
                ),
            ));
        }
        self.weights
            .iter()
            .zip(&self.info)
            .enumerate()
            .map(|(i, (w, info))| {
                param(call, &format!("weights[{i}] ({})", info.name), w, &info.shape, self.device)
            })
            .collect()
    }
}
