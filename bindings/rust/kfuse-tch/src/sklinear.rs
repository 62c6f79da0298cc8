//! Panther's SKLinear on tch tensors: kfuse's `SkLinearPlan` with the parameters held as tch
//! tensors.
use crate::convert::{
    device_of, dims, empty, input, linear_y_shape, opt_param, param, view, view_mut, Scratch,
};
use crate::error::{Error, Result};
use kfuse::{
    Activation, Context, GradMode, SkBackwardArgs, SkForwardArgs, SkLinearDesc, SkLinearPlan, SkParams,
    SkParamsMut,
};
use tch::Tensor;

/// SKLinear's parameters in Panther's names and layouts.
#[derive(Debug)]
pub struct SkTensors {
    /// `S1s [L, in, k]`.
    pub s1s: Tensor,
    /// `S2s [L, k, out]`.
    pub s2s: Tensor,
    /// `U1s [L, k, out]` (fixed sketch).
    pub u1s: Tensor,
    /// `U2s [L, in, k]` (fixed sketch).
    pub u2s: Tensor,
    /// `bias [out]`, present exactly when the descriptor has one.
    pub bias: Option<Tensor>,
}

/// What [`SkLinear::backward`] returns.
#[derive(Debug)]
pub struct SkGrads {
    /// Gradient of x (x's shape).
    pub dx: Tensor,
    /// Gradient of S1s.
    pub ds1s: Tensor,
    /// Gradient of S2s.
    pub ds2s: Tensor,
    /// Gradient of the bias (when the layer has one).
    pub dbias: Option<Tensor>,
}

/// What a training forward ([`SkLinear::forward_train`]) leaves for its backward
/// ([`SkLinear::backward_train`]): the dropout mask's seed and, where the activation's derivative
/// needs it, the pre-activation (GELU, GELU tanh, SiLU) or y (ReLU).
#[derive(Debug)]
pub struct SkSaved {
    seed: u64,
    saved: Option<Tensor>,
}

/// Panther's sketched linear layer,
/// `y = 1/(2L) * sum_i [(x S1s[i]) U1s[i] + (x U2s[i]) S2s[i]] + bias`, on tch tensors.
///
/// ```
/// use kfuse_tch::{context, SkLinear, SkLinearDesc};
/// use tch::{Device, Kind, Tensor};
/// let ctx = context(Device::Cpu)?;
/// let mut sk = SkLinear::new(&ctx, &SkLinearDesc::new(256, 128, 2, 16), 7, None)?;
/// let x = Tensor::randn(&[32, 256], (Kind::Float, Device::Cpu));
/// let y = sk.forward(&x)?;                              // [32, 128]
/// let g = sk.backward(&x, &y.ones_like())?;             // dx, dS1s, dS2s, dbias
/// # Ok::<(), kfuse_tch::Error>(())
/// ```
pub struct SkLinear<'ctx> {
    plan: SkLinearPlan<'ctx>,
    device: tch::Device,
    /// The parameters; their shapes, dtype and device are checked at every call.
    pub params: SkTensors,
}

impl<'ctx> SkLinear<'ctx> {
    /// A layer initialised by kfuse as Panther does (`SkLinearPlan::init_params_into`): sketches
    /// from `seed`, S1s and S2s from the dense weight `w_init [out, in]` when given (else a
    /// Kaiming-uniform one drawn from `seed`).
    pub fn new(
        ctx: &'ctx Context,
        desc: &SkLinearDesc,
        seed: u64,
        w_init: Option<&Tensor>,
    ) -> Result<SkLinear<'ctx>> {
        const CALL: &str = "SkLinear::new";
        let mut plan = SkLinearPlan::new(ctx, desc)?;
        let dev = device_of(ctx);
        let w_init = w_init.map(|w| input(CALL, "w_init", w, dev)).transpose()?;
        let mut p = SkTensors {
            s1s: empty(&desc.s1s_shape(), dev)?,
            s2s: empty(&desc.s2s_shape(), dev)?,
            u1s: empty(&desc.u1s_shape(), dev)?,
            u2s: empty(&desc.u2s_shape(), dev)?,
            bias: desc.has_bias().then(|| empty(&desc.bias_shape(), dev)).transpose()?,
        };
        let mut out = SkParamsMut::new(
            view_mut(&mut p.s1s),
            view_mut(&mut p.s2s),
            view_mut(&mut p.u1s),
            view_mut(&mut p.u2s),
        );
        if let Some(b) = p.bias.as_mut() {
            out = out.bias(view_mut(b));
        }
        plan.init_params_into(seed, w_init.as_ref().map(view), out)?;
        Ok(SkLinear { plan, device: dev, params: p })
    }

    /// A layer with the given parameters (float32 on `ctx`'s device, shapes as `desc` gives).
    pub fn from_params(ctx: &'ctx Context, desc: &SkLinearDesc, params: SkTensors) -> Result<SkLinear<'ctx>> {
        let layer = SkLinear { plan: SkLinearPlan::new(ctx, desc)?, device: device_of(ctx), params };
        layer.checked_params("SkLinear::from_params")?;
        Ok(layer)
    }

    /// The kfuse plan (descriptor, shapes, `param_ratio`, workspace sizes).
    pub fn plan(&self) -> &SkLinearPlan<'ctx> {
        &self.plan
    }

    /// y `[..., out]` for x `[..., in]` (at most 6 dims): an inference call (the descriptor's
    /// activation applies, its dropout does not).
    pub fn forward(&mut self, x: &Tensor) -> Result<Tensor> {
        Ok(self.forward_impl("SkLinear::forward", x, None)?.0)
    }

    /// A training call: y with the descriptor's activation and dropout (the mask keyed by
    /// `seed`: draw a fresh one per call), and what [`backward_train`](Self::backward_train)
    /// needs.
    pub fn forward_train(&mut self, x: &Tensor, seed: u64) -> Result<(Tensor, SkSaved)> {
        let (y, saved) = self.forward_impl("SkLinear::forward_train", x, Some(seed))?;
        Ok((y, SkSaved { seed, saved }))
    }

    fn forward_impl(
        &mut self,
        call: &str,
        x: &Tensor,
        seed: Option<u64>,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let x = input(call, "x", x, self.device)?;
        let p = self.checked_params(call)?;
        let (n, y_shape) = self.rows(call, &x)?;
        let scratch = Scratch::new(self.plan.workspace_size(n)?, self.device)?;
        let mut y = empty(&y_shape, self.device)?;
        let act = self.plan.desc().get_activation();
        let keep_pre = seed.is_some() && !matches!(act, Activation::None | Activation::Relu);
        let mut pre = if keep_pre { Some(empty(&y_shape, self.device)?) } else { None };
        let mut args = SkForwardArgs::new(view(&x), views(&p), view_mut(&mut y));
        if let Some(s) = seed {
            args = args.training(s, 0);
        }
        if let Some(t) = pre.as_mut() {
            args = args.pre(view_mut(t));
        }
        // SAFETY: a tch allocation of the plan's size on the context's device, aligned.
        unsafe { self.plan.forward_raw(&args, scratch.ptr(), scratch.bytes())? };
        drop(args);
        if seed.is_some() && act == Activation::Relu {
            pre = Some(y.shallow_clone()); // ReLU's backward reads y
        }
        Ok((y, pre))
    }

    /// Gradients of x, S1s, S2s and the bias for the forward on `x` and the gradient `dy` of y
    /// (a layer without an activation or dropout, or its inference calls).
    pub fn backward(&mut self, x: &Tensor, dy: &Tensor) -> Result<SkGrads> {
        self.backward_impl("SkLinear::backward", x, dy, None)
    }

    /// The same for a [`forward_train`](Self::forward_train) call, through its activation and
    /// dropout.
    pub fn backward_train(&mut self, x: &Tensor, dy: &Tensor, saved: &SkSaved) -> Result<SkGrads> {
        self.backward_impl("SkLinear::backward_train", x, dy, Some(saved))
    }

    fn backward_impl(
        &mut self,
        call: &str,
        x: &Tensor,
        dy: &Tensor,
        saved: Option<&SkSaved>,
    ) -> Result<SkGrads> {
        let x = input(call, "x", x, self.device)?;
        let dy = input(call, "dy", dy, self.device)?;
        let p = self.checked_params(call)?;
        let (n, _) = self.rows(call, &x)?;
        let scratch = Scratch::new(self.plan.workspace_size(n)?, self.device)?;
        let desc = self.plan.desc();
        let mut g = SkGrads {
            dx: empty(&dims(&x), self.device)?,
            ds1s: empty(&desc.s1s_shape(), self.device)?,
            ds2s: empty(&desc.s2s_shape(), self.device)?,
            dbias: desc.has_bias().then(|| empty(&desc.bias_shape(), self.device)).transpose()?,
        };
        let mut args = SkBackwardArgs::new(view(&x), views(&p), view(&dy))
            .dx(view_mut(&mut g.dx))
            .ds1s(view_mut(&mut g.ds1s))
            .ds2s(view_mut(&mut g.ds2s));
        if let Some(db) = g.dbias.as_mut() {
            args = args.dbias(view_mut(db));
        }
        if let Some(s) = saved {
            args = args.training(s.seed, 0);
            if let Some(t) = s.saved.as_ref() {
                args = args.pre(view(t));
            }
        }
        // SAFETY: as in forward.
        unsafe { self.plan.backward_raw(GradMode::Overwrite, &args, scratch.ptr(), scratch.bytes())? };
        Ok(g)
    }

    /// Rows (the product of x's leading dims) and y's shape.
    fn rows(&self, call: &str, x: &Tensor) -> Result<(usize, Vec<usize>)> {
        let (xs, d) = (dims(x), self.plan.desc());
        let y = linear_y_shape(&xs, d.in_features(), d.out_features()).map_err(|m| Error::arg(call, m))?;
        Ok((xs[..xs.len() - 1].iter().product(), y))
    }

    fn checked_params(&self, call: &str) -> Result<SkTensors> {
        let (d, p, dev) = (self.plan.desc(), &self.params, self.device);
        let bs = d.bias_shape();
        let bias_shape = d.has_bias().then_some(&bs[..]);
        Ok(SkTensors {
            s1s: param(call, "params.s1s", &p.s1s, &d.s1s_shape(), dev)?,
            s2s: param(call, "params.s2s", &p.s2s, &d.s2s_shape(), dev)?,
            u1s: param(call, "params.u1s", &p.u1s, &d.u1s_shape(), dev)?,
            u2s: param(call, "params.u2s", &p.u2s, &d.u2s_shape(), dev)?,
            bias: opt_param(call, "params.bias", p.bias.as_ref(), bias_shape, "bias", dev)?,
        })
    }
}

/// kfuse views of checked parameters.
fn views(p: &SkTensors) -> SkParams<'_> {
    let v = SkParams::new(view(&p.s1s), view(&p.s2s), view(&p.u1s), view(&p.u2s));
    match &p.bias {
        Some(b) => v.bias(view(b)),
        None => v,
    }
}
