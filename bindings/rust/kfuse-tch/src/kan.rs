//! efficient-kan's KANLinear and the KANConv2d over its patches on tch tensors: kfuse's generic
//! `KanPlan` with the parameters held as tch tensors.
use crate::convert::{
    device_of, dims, empty, input, linear_y_shape, opt_param, param, view, view_mut, Scratch,
};
use crate::error::{Error, Result};
use kfuse::{
    Context, GradMode, KanBackwardArgs, KanConv2dDesc, KanForwardArgs, KanLayer, KanLinearDesc, KanParams,
    KanPlan,
};
use tch::Tensor;

/// The shape rules of a KAN layer kind: [`KanLinearDesc`] and [`KanConv2dDesc`].
pub trait KanKind: KanLayer {
    /// y's shape for x's, or why x's shape is refused.
    fn y_shape(&self, x: &[usize]) -> std::result::Result<Vec<usize>, String>;
    /// Bytes of scratch a call on x needs.
    fn workspace_size(plan: &KanPlan<'_, Self>, x: &[usize]) -> kfuse::error::Result<usize>;
}

impl KanKind for KanLinearDesc {
    fn y_shape(&self, x: &[usize]) -> std::result::Result<Vec<usize>, String> {
        linear_y_shape(x, self.in_features(), self.out_features())
    }
    fn workspace_size(plan: &KanPlan<'_, Self>, x: &[usize]) -> kfuse::error::Result<usize> {
        plan.workspace_size(x[..x.len() - 1].iter().product())
    }
}

impl KanKind for KanConv2dDesc {
    fn y_shape(&self, x: &[usize]) -> std::result::Result<Vec<usize>, String> {
        let c = self.in_channels();
        let bad = || {
            format!("x has shape {x:?}, expected [B, {c}, H, W] or [{c}, H, W] with the kernel fitting the padded image")
        };
        let (lead, chw) = match x.len() {
            3 => (&x[..0], x),
            4 => x.split_at(1),
            _ => return Err(bad()),
        };
        let (ho, wo) = self.output_size(chw[1], chw[2]).filter(|_| chw[0] == c).ok_or_else(bad)?;
        Ok(lead.iter().copied().chain([self.out_channels(), ho, wo]).collect())
    }
    fn workspace_size(plan: &KanPlan<'_, Self>, x: &[usize]) -> kfuse::error::Result<usize> {
        let (b, hw) = if x.len() == 4 { (x[0], &x[2..]) } else { (1, &x[1..]) };
        plan.workspace_size(b, hw[0], hw[1])
    }
}

/// KAN parameters in efficient-kan's names and layouts (F = in, or C_in kh kw for KANConv2d).
#[derive(Debug)]
pub struct KanTensors {
    /// The knots, `[F, G + 2k + 1]`, every row non-decreasing.
    pub grid: Tensor,
    /// `[out, F]`.
    pub base_weight: Tensor,
    /// `[out, F, G + k]`.
    pub spline_weight: Tensor,
    /// `[out, F]`, present exactly when the descriptor has `standalone_scale`.
    pub spline_scaler: Option<Tensor>,
}

/// What [`Kan::backward`] returns.
#[derive(Debug)]
pub struct KanGrads {
    /// Gradient of x (x's shape).
    pub dx: Tensor,
    /// Gradient of base_weight.
    pub dbase_weight: Tensor,
    /// Gradient of spline_weight.
    pub dspline_weight: Tensor,
    /// Gradient of spline_scaler (when the layer has one).
    pub dspline_scaler: Option<Tensor>,
}

/// A KAN layer on tch tensors: [`KanLinear`] (`y = SiLU(x) base_weight^T + B(x) (spline_weight *
/// spline_scaler[..., None])^T`) or [`KanConv2d`] (that map over every unfolded patch).
///
/// ```
/// use kfuse_tch::{context, KanLinear, KanLinearDesc};
/// use tch::{Device, Kind, Tensor};
/// let ctx = context(Device::Cpu)?;
/// let mut kan = KanLinear::new(&ctx, &KanLinearDesc::new(64, 32))?;
/// let x = Tensor::randn(&[128, 64], (Kind::Float, Device::Cpu));
/// let y = kan.forward(&x)?;                                // [128, 32]
/// let g = kan.backward(&x, &y.ones_like())?;
/// # Ok::<(), kfuse_tch::Error>(())
/// ```
pub struct Kan<'ctx, L: KanKind> {
    plan: KanPlan<'ctx, L>,
    device: tch::Device,
    /// The parameters; their shapes, dtype and device are checked at every call.
    pub params: KanTensors,
}

/// efficient-kan's KANLinear on tch tensors.
pub type KanLinear<'ctx> = Kan<'ctx, KanLinearDesc>;
/// KANConv2d (unfold + KANLinear) on tch tensors.
pub type KanConv2d<'ctx> = Kan<'ctx, KanConv2dDesc>;

impl<'ctx, L: KanKind> Kan<'ctx, L> {
    /// A layer with efficient-kan's initial knots on [-1, 1] (kfuse's `uniform_grid`, the same
    /// bits), base_weight and spline_scaler drawn from tch's generator as efficient-kan's
    /// `kaiming_uniform_` does (U(-1/sqrt(F), 1/sqrt(F))), and spline_weight zero (efficient-kan
    /// fits it to small noise by least squares; load its values with
    /// [`from_params`](Self::from_params) to match a trained layer).
    pub fn new(ctx: &'ctx Context, desc: &L) -> Result<Kan<'ctx, L>> {
        let plan = KanPlan::new(ctx, desc)?;
        let (d, dev) = (desc.kan_linear(), device_of(ctx));
        let bound = 1.0 / (d.in_features().max(1) as f64).sqrt();
        let uniform =
            |shape: &[usize]| -> Result<Tensor> { Ok(empty(shape, dev)?.f_uniform_(-bound, bound)?) };
        let mut grid = empty(&d.grid_shape(), dev)?;
        plan.uniform_grid_into(-1.0, 1.0, view_mut(&mut grid))?;
        let params = KanTensors {
            grid,
            base_weight: uniform(&d.base_weight_shape())?,
            spline_weight: empty(&d.spline_weight_shape(), dev)?.f_zero_()?,
            spline_scaler: d.has_standalone_scale().then(|| uniform(&d.spline_scaler_shape())).transpose()?,
        };
        Ok(Kan { plan, device: dev, params })
    }

    /// A layer with the given parameters (float32 on `ctx`'s device, shapes as `desc` gives).
    pub fn from_params(ctx: &'ctx Context, desc: &L, params: KanTensors) -> Result<Kan<'ctx, L>> {
        let layer = Kan { plan: KanPlan::new(ctx, desc)?, device: device_of(ctx), params };
        layer.checked_params("Kan::from_params")?;
        Ok(layer)
    }

    /// The kfuse plan (descriptor, `update_grid`, workspace sizes).
    pub fn plan(&self) -> &KanPlan<'ctx, L> {
        &self.plan
    }

    /// y for x: `[..., in]` -> `[..., out]` (KANLinear), `[B, C_in, H, W]` -> `[B, C_out, Ho, Wo]`
    /// or unbatched (KANConv2d).
    pub fn forward(&mut self, x: &Tensor) -> Result<Tensor> {
        const CALL: &str = "Kan::forward";
        let x = input(CALL, "x", x, self.device)?;
        let p = self.checked_params(CALL)?;
        let xs = dims(&x);
        let y_shape = self.plan.desc().y_shape(&xs).map_err(|m| Error::arg(CALL, m))?;
        let scratch = Scratch::new(L::workspace_size(&self.plan, &xs)?, self.device)?;
        let mut y = empty(&y_shape, self.device)?;
        let args = KanForwardArgs::new(view(&x), views(&p), view_mut(&mut y));
        // SAFETY: a tch allocation of the plan's size on the context's device, aligned.
        unsafe { self.plan.forward_raw(&args, scratch.ptr(), scratch.bytes())? };
        Ok(y)
    }

    /// Gradients of x and every parameter for the forward on `x` and the gradient `dy` of y.
    pub fn backward(&mut self, x: &Tensor, dy: &Tensor) -> Result<KanGrads> {
        const CALL: &str = "Kan::backward";
        let x = input(CALL, "x", x, self.device)?;
        let dy = input(CALL, "dy", dy, self.device)?;
        let p = self.checked_params(CALL)?;
        let xs = dims(&x);
        self.plan.desc().y_shape(&xs).map_err(|m| Error::arg(CALL, m))?;
        let scratch = Scratch::new(L::workspace_size(&self.plan, &xs)?, self.device)?;
        let d = self.plan.desc().kan_linear();
        let mut g = KanGrads {
            dx: empty(&xs, self.device)?,
            dbase_weight: empty(&d.base_weight_shape(), self.device)?,
            dspline_weight: empty(&d.spline_weight_shape(), self.device)?,
            dspline_scaler: p
                .spline_scaler
                .as_ref()
                .map(|_| empty(&d.spline_scaler_shape(), self.device))
                .transpose()?,
        };
        let mut args = KanBackwardArgs::new(view(&x), views(&p), view(&dy))
            .dx(view_mut(&mut g.dx))
            .dbase_weight(view_mut(&mut g.dbase_weight))
            .dspline_weight(view_mut(&mut g.dspline_weight));
        if let Some(ds) = g.dspline_scaler.as_mut() {
            args = args.dspline_scaler(view_mut(ds));
        }
        // SAFETY: as in forward.
        unsafe { self.plan.backward_raw(GradMode::Overwrite, &args, scratch.ptr(), scratch.bytes())? };
        Ok(g)
    }

    /// efficient-kan's `update_grid` (kfuse's `KanPlan::update_grid`): new knots from the samples
    /// x (x as forward takes it) mixed with a uniform grid by `grid_eps` (efficient-kan: 0.02,
    /// `margin` 0.01), and spline_weight refitted so that the splines on the new knots reproduce
    /// those on the old ones at the samples. Written into `params.grid` and
    /// `params.spline_weight` (in place when they are contiguous), only on success.
    pub fn update_grid(&mut self, x: &Tensor, margin: f32, grid_eps: f32) -> Result<()> {
        const CALL: &str = "Kan::update_grid";
        let x = input(CALL, "x", x, self.device)?;
        let mut p = self.checked_params(CALL)?;
        self.plan.update_grid(
            &view(&x),
            view_mut(&mut p.grid),
            view_mut(&mut p.spline_weight),
            margin,
            grid_eps,
        )?;
        self.params.grid = p.grid;
        self.params.spline_weight = p.spline_weight;
        Ok(())
    }

    fn checked_params(&self, call: &str) -> Result<KanTensors> {
        let (d, p, dev) = (self.plan.desc().kan_linear(), &self.params, self.device);
        let ss = d.spline_scaler_shape();
        let scaler_shape = d.has_standalone_scale().then_some(&ss[..]);
        Ok(KanTensors {
            grid: param(call, "params.grid", &p.grid, &d.grid_shape(), dev)?,
            base_weight: param(call, "params.base_weight", &p.base_weight, &d.base_weight_shape(), dev)?,
            spline_weight: param(
                call,
                "params.spline_weight",
                &p.spline_weight,
                &d.spline_weight_shape(),
                dev,
            )?,
            spline_scaler: opt_param(
                call,
                "params.spline_scaler",
                p.spline_scaler.as_ref(),
                scaler_shape,
                "standalone_scale",
                dev,
            )?,
        })
    }
}

/// kfuse views of checked parameters.
fn views(p: &KanTensors) -> KanParams<'_> {
    let v = KanParams::new(view(&p.grid), view(&p.base_weight), view(&p.spline_weight));
    match &p.spline_scaler {
        Some(s) => v.spline_scaler(view(s)),
        None => v,
    }
}
