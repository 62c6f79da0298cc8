//! KAN linear layer: KANLinear (efficient-kan), as `kf_kan_linear_plan`.
//!
//! With `G = grid_size`, `k = spline_order` and `C = G + k` coefficients per (output, input)
//! pair:
//!
//! ```text
//! y = SiLU(x) base_weight^T + B(x) (spline_weight * spline_scaler[..., None])^T
//! ```
//!
//! where `B(x)` holds the Cox-de Boor B-spline bases of order k of every input feature on its own
//! knots `grid [in, G + 2k + 1]` (non-decreasing rows; zero outside the grid; a term over a
//! zero-width knot span counts as 0). Parameters in efficient-kan's layout and names:
//! `base_weight [out, in]`, `spline_weight [out, in, C]`, `spline_scaler [out, in]` (only with
//! `standalone_scale`). x is `[..., in]` with any leading dims, y is `[..., out]`. The bases are
//! computed inside the product and never stored for the whole batch; backward recomputes them
//! from x (no reserve) and gives dx and the three parameter gradients (the grid gets none).
use crate::context::Context;
use crate::error::{check, Result};
use crate::grad::GradMode;
use crate::layer::{self, init_with, numel, opt_in, opt_out};
use crate::tensor::{Tensor, TensorMut};
use kfuse_sys as sys;
use std::ffi::c_void;
use std::ptr::{self, NonNull};

/// Describes a KANLinear layer (`kf_kan_linear_desc`). `grid_size`, `spline_order` and
/// `standalone_scale` start at the library's defaults (`kf_kan_linear_desc_init`: 5, 3, on, as
/// efficient-kan's). Nothing is checked here: [`KanLinearPlan::new`] passes it to the library,
/// whose error names the field.
///
/// ```
/// let d = kfuse::KanLinearDesc::new(64, 32).grid_size(8).spline_order(2);
/// assert_eq!((d.num_coeffs(), d.num_knots()), (10, 13));
/// assert_eq!(d.grid_shape(), [64, 13]);
/// assert_eq!(d.spline_weight_shape(), [32, 64, 10]);
/// assert!(d.has_standalone_scale());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KanLinearDesc {
    in_features: usize,
    out_features: usize,
    grid_size: u32,
    spline_order: u32,
    standalone_scale: bool,
}

impl KanLinearDesc {
    /// A layer from `in_features` to `out_features` with the default grid (G = 5, k = 3) and a
    /// standalone spline scaler.
    pub fn new(in_features: usize, out_features: usize) -> KanLinearDesc {
        let d = init_with(sys::kf_kan_linear_desc_init);
        KanLinearDesc {
            in_features,
            out_features,
            grid_size: u32::try_from(d.grid_size).unwrap_or(5),
            spline_order: u32::try_from(d.spline_order).unwrap_or(3),
            standalone_scale: d.standalone_scale != 0,
        }
    }
    /// G, the number of grid intervals (efficient-kan's `grid_size`, >= 1).
    pub fn grid_size(mut self, g: u32) -> Self {
        self.grid_size = g;
        self
    }
    /// k, the order of the splines (efficient-kan's `spline_order`; 0 gives step functions).
    pub fn spline_order(mut self, k: u32) -> Self {
        self.spline_order = k;
        self
    }
    /// Whether `spline_scaler [out, in]` multiplies `spline_weight` (efficient-kan's
    /// `enable_standalone_scale_spline`).
    pub fn standalone_scale(mut self, yes: bool) -> Self {
        self.standalone_scale = yes;
        self
    }

    /// in.
    pub fn in_features(&self) -> usize {
        self.in_features
    }
    /// out.
    pub fn out_features(&self) -> usize {
        self.out_features
    }
    /// G.
    pub fn get_grid_size(&self) -> u32 {
        self.grid_size
    }
    /// k.
    pub fn get_spline_order(&self) -> u32 {
        self.spline_order
    }
    /// Whether the layer has a spline scaler.
    pub fn has_standalone_scale(&self) -> bool {
        self.standalone_scale
    }
    /// C = G + k, the spline coefficients per (output, input) pair.
    pub fn num_coeffs(&self) -> usize {
        self.grid_size as usize + self.spline_order as usize
    }
    /// G + 2k + 1, the knots per input feature.
    pub fn num_knots(&self) -> usize {
        self.grid_size as usize + 2 * self.spline_order as usize + 1
    }

    /// Shape of x (and dx) for N rows: `[N, in]`. Any leading dims are allowed; this is the 2-D
    /// form.
    pub fn x_shape(&self, n: usize) -> [usize; 2] {
        [n, self.in_features]
    }
    /// Shape of y (and dy) for N rows: `[N, out]`.
    pub fn y_shape(&self, n: usize) -> [usize; 2] {
        [n, self.out_features]
    }
    /// Shape of the knots: `[in, G + 2k + 1]`.
    pub fn grid_shape(&self) -> [usize; 2] {
        [self.in_features, self.num_knots()]
    }
    /// Shape of base_weight (and its gradient): `[out, in]`.
    pub fn base_weight_shape(&self) -> [usize; 2] {
        [self.out_features, self.in_features]
    }
    /// Shape of spline_weight (and its gradient): `[out, in, G + k]`.
    pub fn spline_weight_shape(&self) -> [usize; 3] {
        [self.out_features, self.in_features, self.num_coeffs()]
    }
    /// Shape of spline_scaler (and its gradient): `[out, in]`.
    pub fn spline_scaler_shape(&self) -> [usize; 2] {
        [self.out_features, self.in_features]
    }

    /// The `kf_kan_linear_desc` this describes. Out-of-range values saturate so that the library
    /// rejects them with its own message.
    pub fn to_raw(&self) -> sys::kf_kan_linear_desc {
        let mut d = init_with(sys::kf_kan_linear_desc_init);
        d.in_features = i64::try_from(self.in_features).unwrap_or(i64::MAX);
        d.out_features = i64::try_from(self.out_features).unwrap_or(i64::MAX);
        d.grid_size = i32::try_from(self.grid_size).unwrap_or(i32::MAX);
        d.spline_order = i32::try_from(self.spline_order).unwrap_or(i32::MAX);
        d.standalone_scale = i32::from(self.standalone_scale);
        d
    }
}

/// Read-only views of a layer's knots and parameters for a call: grid, base_weight,
/// spline_weight and, for a plan with a standalone scale, spline_scaler. Shapes are given by the
/// caller and checked by the library ([`KanLinearDesc::grid_shape`] and friends compute them);
/// host memory through [`Tensor::new`], device memory through [`Tensor::from_raw`].
#[derive(Clone, Copy, Debug)]
pub struct KanParams<'a> {
    grid: Tensor<'a>,
    base_weight: Tensor<'a>,
    spline_weight: Tensor<'a>,
    spline_scaler: Option<Tensor<'a>>,
}

impl<'a> KanParams<'a> {
    /// grid `[in, G + 2k + 1]`, base_weight `[out, in]`, spline_weight `[out, in, G + k]`; no
    /// scaler.
    pub fn new(grid: Tensor<'a>, base_weight: Tensor<'a>, spline_weight: Tensor<'a>) -> Self {
        KanParams { grid, base_weight, spline_weight, spline_scaler: None }
    }
    /// spline_scaler `[out, in]`: required when the plan has a standalone scale, refused
    /// otherwise.
    pub fn spline_scaler(mut self, s: Tensor<'a>) -> Self {
        self.spline_scaler = Some(s);
        self
    }
}

/// A layer's knots and parameters in owned host vectors, in efficient-kan's layout (row-major,
/// the shapes of [`KanLinearDesc`]). Made by [`KanHostParams::zeros`] (handy as gradient
/// buffers too: the gradients have the parameters' shapes; the grid is then unused). The vectors
/// are public so that an optimiser (or a grid update) can change them; a vector whose length no
/// longer matches its shape is refused at the next call.
#[derive(Clone, Debug, PartialEq)]
pub struct KanHostParams {
    /// grid `[in, G + 2k + 1]` (a buffer: no gradient).
    pub grid: Vec<f32>,
    /// base_weight `[out, in]`.
    pub base_weight: Vec<f32>,
    /// spline_weight `[out, in, G + k]`.
    pub spline_weight: Vec<f32>,
    /// spline_scaler `[out, in]`, `None` when the layer has no standalone scale.
    pub spline_scaler: Option<Vec<f32>>,
    desc: KanLinearDesc,
}

impl KanHostParams {
    /// All zeros, shaped for `desc` (a scaler vector when `desc` has a standalone scale).
    pub fn zeros(desc: &KanLinearDesc) -> KanHostParams {
        KanHostParams {
            grid: vec![0.0; numel(&desc.grid_shape())],
            base_weight: vec![0.0; numel(&desc.base_weight_shape())],
            spline_weight: vec![0.0; numel(&desc.spline_weight_shape())],
            spline_scaler: layer::zeros_if(desc.standalone_scale, &desc.spline_scaler_shape()),
            desc: desc.clone(),
        }
    }
    /// The descriptor the shapes come from.
    pub fn desc(&self) -> &KanLinearDesc {
        &self.desc
    }
    /// Views for a call (the scaler included when present).
    pub fn view(&self) -> KanParams<'_> {
        let d = &self.desc;
        let p = KanParams::new(
            Tensor::new(&self.grid, &d.grid_shape()),
            Tensor::new(&self.base_weight, &d.base_weight_shape()),
            Tensor::new(&self.spline_weight, &d.spline_weight_shape()),
        );
        match &self.spline_scaler {
            Some(s) => p.spline_scaler(Tensor::new(s, &d.spline_scaler_shape())),
            None => p,
        }
    }
}

/// Arguments of a forward call (`kf_kan_linear_forward_args`), borrowing the inputs for `'i` and
/// the output for `'o`, so that [`KanBackwardArgs::from_forward`] can keep the inputs while y is
/// read.
#[derive(Debug)]
pub struct KanForwardArgs<'i, 'o> {
    x: Tensor<'i>,
    params: KanParams<'i>,
    y: TensorMut<'o>,
}

impl<'i, 'o> KanForwardArgs<'i, 'o> {
    /// Input x `[..., in]`, the knots and parameters, output y `[..., out]` (x's leading dims).
    pub fn new(x: Tensor<'i>, params: KanParams<'i>, y: TensorMut<'o>) -> Self {
        KanForwardArgs { x, params, y }
    }
}

/// Arguments of a backward call (`kf_kan_linear_backward_args`): the forward's x, knots and
/// parameters, dy, and the gradients wanted (each optional; the work for an absent one is
/// skipped; dx is always overwritten, the parameter gradients are written or accumulated per
/// [`GradMode`]).
#[derive(Debug)]
pub struct KanBackwardArgs<'a> {
    x: Tensor<'a>,
    params: KanParams<'a>,
    dy: Tensor<'a>,
    dx: Option<TensorMut<'a>>,
    dbase_weight: Option<TensorMut<'a>>,
    dspline_weight: Option<TensorMut<'a>>,
    dspline_scaler: Option<TensorMut<'a>>,
}

impl<'a> KanBackwardArgs<'a> {
    /// The forward's x and parameters, and dy `[..., out]`; no gradient output yet.
    pub fn new(x: Tensor<'a>, params: KanParams<'a>, dy: Tensor<'a>) -> Self {
        KanBackwardArgs {
            x,
            params,
            dy,
            dx: None,
            dbase_weight: None,
            dspline_weight: None,
            dspline_scaler: None,
        }
    }
    /// The inputs of `fwd` (x, knots and parameters), and dy.
    pub fn from_forward(fwd: &KanForwardArgs<'a, '_>, dy: Tensor<'a>) -> Self {
        KanBackwardArgs::new(fwd.x, fwd.params, dy)
    }
    /// Output: gradient w.r.t. x, x's shape (always overwritten).
    pub fn dx(mut self, dx: TensorMut<'a>) -> Self {
        self.dx = Some(dx);
        self
    }
    /// Output: gradient w.r.t. base_weight, `[out, in]`.
    pub fn dbase_weight(mut self, g: TensorMut<'a>) -> Self {
        self.dbase_weight = Some(g);
        self
    }
    /// Output: gradient w.r.t. spline_weight, `[out, in, G + k]`.
    pub fn dspline_weight(mut self, g: TensorMut<'a>) -> Self {
        self.dspline_weight = Some(g);
        self
    }
    /// Output: gradient w.r.t. spline_scaler, `[out, in]` (plans with a standalone scale only).
    pub fn dspline_scaler(mut self, g: TensorMut<'a>) -> Self {
        self.dspline_scaler = Some(g);
        self
    }
    /// Outputs d base_weight, d spline_weight and (when `grads` has one) d spline_scaler, from
    /// host buffers shaped like the parameters (e.g. [`KanHostParams::zeros`]); its grid is not
    /// used.
    pub fn dparams(self, grads: &'a mut KanHostParams) -> Self {
        let d = &grads.desc;
        let b = self
            .dbase_weight(TensorMut::new(&mut grads.base_weight, &d.base_weight_shape()))
            .dspline_weight(TensorMut::new(&mut grads.spline_weight, &d.spline_weight_shape()));
        match &mut grads.spline_scaler {
            Some(g) => b.dspline_scaler(TensorMut::new(g, &d.spline_scaler_shape())),
            None => b,
        }
    }
}

/// A plan for a KANLinear layer (`kf_kan_linear_plan`), bound to the context it borrows.
/// Destroyed on drop. No reserve: backward recomputes the bases from x. Like
/// [`RnnPlan`](crate::RnnPlan), a plan is neither `Send` nor `Sync`. CPU contexts run it; on a
/// CUDA context forward and backward return [`Status::Unsupported`] for now.
///
/// ```
/// use kfuse::*;
/// let ctx = Context::cpu()?;
/// let desc = KanLinearDesc::new(16, 8); // G = 5, k = 3, with a spline scaler
/// let mut plan = KanLinearPlan::new(&ctx, &desc)?;
/// let mut p = KanHostParams::zeros(&desc);
/// p.grid = plan.uniform_grid(-1.0, 1.0)?; // efficient-kan's initial knots
/// p.base_weight.iter_mut().for_each(|w| *w = 0.1);
/// p.spline_weight.iter_mut().for_each(|w| *w = 0.05);
/// p.spline_scaler.as_mut().unwrap().iter_mut().for_each(|s| *s = 1.0);
/// let n = 3;
/// let x = vec![0.25f32; n * 16];
/// let mut y = vec![f32::NAN; n * 8];
/// let fwd = KanForwardArgs::new(Tensor::new(&x, &desc.x_shape(n)), p.view(),
///                               TensorMut::new(&mut y, &desc.y_shape(n)));
/// plan.forward(&fwd)?;
/// let dy = vec![1.0f32; n * 8];
/// let mut dx = vec![0.0f32; n * 16];
/// let mut grads = KanHostParams::zeros(&desc);
/// let bwd = KanBackwardArgs::from_forward(&fwd, Tensor::new(&dy, &desc.y_shape(n)))
///     .dx(TensorMut::new(&mut dx, &desc.x_shape(n)))
///     .dparams(&mut grads);
/// plan.backward(GradMode::Overwrite, &bwd)?;
/// drop((fwd, bwd));
/// assert!(y.iter().all(|v| v.is_finite()));
/// // d base_weight[o, i] = sum over rows of SiLU(x[n, i]) (dy = 1)
/// let silu = 0.25f32 / (1.0 + (-0.25f32).exp());
/// assert!((grads.base_weight[0] - n as f32 * silu).abs() < 1e-5);
/// # Ok::<(), kfuse::Error>(())
/// ```
///
/// It borrows its context, so it is not `Send`, and cannot outlive the context:
///
/// ```compile_fail
/// fn need_send<T: Send>() {}
/// need_send::<kfuse::KanLinearPlan<'static>>();
/// ```
///
/// ```compile_fail
/// let plan = {
///     let ctx = kfuse::Context::cpu().unwrap();
///     kfuse::KanLinearPlan::new(&ctx, &kfuse::KanLinearDesc::new(4, 4)).unwrap()
/// };
/// ```
#[derive(Debug)]
pub struct KanLinearPlan<'ctx> {
    raw: NonNull<sys::kf_kan_linear_plan>,
    ctx: &'ctx Context,
    desc: KanLinearDesc,
}

impl<'ctx> KanLinearPlan<'ctx> {
    /// Creates a plan on `ctx` (`kf_kan_linear_plan_create`). A bad descriptor gives
    /// [`Status::InvalidArgument`] naming the field.
    pub fn new(ctx: &'ctx Context, desc: &KanLinearDesc) -> Result<KanLinearPlan<'ctx>> {
        let d = desc.to_raw();
        // SAFETY: valid context handle, descriptor and out-pointer.
        let raw = layer::create_plan("kf_kan_linear_plan_create", |out| unsafe {
            sys::kf_kan_linear_plan_create(ctx.as_raw(), &d, out)
        })?;
        Ok(KanLinearPlan { raw, ctx, desc: desc.clone() })
    }

    /// The descriptor the plan was made from.
    pub fn desc(&self) -> &KanLinearDesc {
        &self.desc
    }
    /// The context the plan runs on.
    pub fn context(&self) -> &'ctx Context {
        self.ctx
    }
    /// Shape of x for N rows, `[N, in]` (as [`KanLinearDesc::x_shape`]).
    pub fn x_shape(&self, n: usize) -> [usize; 2] {
        self.desc.x_shape(n)
    }
    /// Shape of y for N rows, `[N, out]` (as [`KanLinearDesc::y_shape`]).
    pub fn y_shape(&self, n: usize) -> [usize; 2] {
        self.desc.y_shape(n)
    }

    /// Bytes of scratch that forward and backward need for `n` rows (the product of x's leading
    /// dims); bounded by tiles, not by n times the bases. The safe calls take it from the
    /// context's arena; [`forward_raw`](Self::forward_raw) and
    /// [`backward_raw`](Self::backward_raw) accept a caller buffer of this size.
    pub fn workspace_size(&self, n: usize) -> Result<usize> {
        // SAFETY: valid plan and out-pointer.
        layer::workspace_size(n, |n, ws| unsafe {
            sys::kf_kan_linear_workspace_size(self.raw.as_ptr(), n, ws)
        })
    }

    /// efficient-kan's initial knots in a new host vector `[in, G + 2k + 1]` (CPU contexts; on
    /// CUDA use [`uniform_grid_into`](Self::uniform_grid_into) with device memory): every row is
    /// `lo + (j - k) * (hi - lo) / G`, rounded as torch forms it in float32. Requires finite
    /// `lo < hi`.
    pub fn uniform_grid(&self, lo: f32, hi: f32) -> Result<Vec<f32>> {
        let shape = self.desc.grid_shape();
        let mut g = vec![0.0f32; shape[0] * shape[1]];
        self.grid_impl("KanLinearPlan::uniform_grid", lo, hi, &TensorMut::new(&mut g, &shape))?;
        Ok(g)
    }

    /// As [`uniform_grid`](Self::uniform_grid), writing into a caller buffer (host or device
    /// memory of the context's device).
    pub fn uniform_grid_into(&self, lo: f32, hi: f32, grid: TensorMut<'_>) -> Result<()> {
        self.grid_impl("KanLinearPlan::uniform_grid_into", lo, hi, &grid)
    }

    /// y for every row of x, with scratch from the context's arena. A grid row that decreases is
    /// [`Status::InvalidArgument`] naming `args->grid` and the feature.
    pub fn forward(&mut self, args: &KanForwardArgs<'_, '_>) -> Result<()> {
        // SAFETY: no caller buffers; every view in args is valid by construction.
        unsafe { self.forward_impl("KanLinearPlan::forward", args, ptr::null_mut(), 0) }
    }

    /// Gradients of x, base_weight, spline_weight and spline_scaler (those asked for in `args`);
    /// `grad_mode` applies to the parameter gradients. Scratch from the context's arena.
    pub fn backward(&mut self, grad_mode: GradMode, args: &KanBackwardArgs<'_>) -> Result<()> {
        // SAFETY: as in forward().
        unsafe { self.backward_impl("KanLinearPlan::backward", grad_mode, args, ptr::null_mut(), 0) }
    }

    /// `kf_kan_linear_forward` with a caller-provided workspace. A null workspace with 0 bytes
    /// uses the context's arena.
    ///
    /// # Safety
    /// `workspace` must be null or point to at least `workspace_bytes` writable bytes on the
    /// context's device, 64-byte aligned, not used by anyone else until the call's work has
    /// finished (on CUDA: on the context's stream).
    pub unsafe fn forward_raw(
        &mut self,
        args: &KanForwardArgs<'_, '_>,
        workspace: *mut c_void,
        workspace_bytes: usize,
    ) -> Result<()> {
        self.forward_impl("KanLinearPlan::forward_raw", args, workspace, workspace_bytes)
    }

    /// `kf_kan_linear_backward` with a caller-provided workspace.
    ///
    /// # Safety
    /// As [`forward_raw`](Self::forward_raw).
    pub unsafe fn backward_raw(
        &mut self,
        grad_mode: GradMode,
        args: &KanBackwardArgs<'_>,
        workspace: *mut c_void,
        workspace_bytes: usize,
    ) -> Result<()> {
        self.backward_impl("KanLinearPlan::backward_raw", grad_mode, args, workspace, workspace_bytes)
    }

    /// The raw handle, for calls into `kfuse-sys`. It stays owned by `self`.
    pub fn as_raw(&self) -> *mut sys::kf_kan_linear_plan {
        self.raw.as_ptr()
    }

    fn grid_impl(&self, call: &str, lo: f32, hi: f32, grid: &TensorMut<'_>) -> Result<()> {
        let mut g = grid.raw(call, "grid", self.ctx)?;
        // SAFETY: a live host borrow of the length its shape needs, or a raw pointer under its
        // constructor's contract.
        check(unsafe { sys::kf_kan_linear_uniform_grid(self.raw.as_ptr(), lo, hi, &mut g) })
    }

    /// The forward's arguments but y: x, the knots and the parameters (the scaler absent when
    /// not given), checked in that order.
    fn raw_inputs(
        call: &str,
        ctx: &Context,
        x: &Tensor<'_>,
        p: &KanParams<'_>,
    ) -> Result<sys::kf_kan_linear_forward_args> {
        Ok(sys::kf_kan_linear_forward_args {
            x: x.raw(call, "args.x", ctx)?,
            grid: p.grid.raw(call, "args.grid", ctx)?,
            base_weight: p.base_weight.raw(call, "args.base_weight", ctx)?,
            spline_weight: p.spline_weight.raw(call, "args.spline_weight", ctx)?,
            spline_scaler: opt_in(&p.spline_scaler, call, "args.spline_scaler", ctx)?,
            ..init_with(sys::kf_kan_linear_forward_args_init)
        })
    }

    unsafe fn forward_impl(
        &mut self,
        call: &str,
        args: &KanForwardArgs<'_, '_>,
        ws: *mut c_void,
        ws_bytes: usize,
    ) -> Result<()> {
        let inputs = Self::raw_inputs(call, self.ctx, &args.x, &args.params)?;
        let a = sys::kf_kan_linear_forward_args { y: args.y.raw(call, "args.y", self.ctx)?, ..inputs };
        check(sys::kf_kan_linear_forward(self.raw.as_ptr(), &a, ws, ws_bytes))
    }

    unsafe fn backward_impl(
        &mut self,
        call: &str,
        grad_mode: GradMode,
        args: &KanBackwardArgs<'_>,
        ws: *mut c_void,
        ws_bytes: usize,
    ) -> Result<()> {
        let ctx = self.ctx;
        let i = Self::raw_inputs(call, ctx, &args.x, &args.params)?;
        let a = sys::kf_kan_linear_backward_args {
            x: i.x,
            grid: i.grid,
            base_weight: i.base_weight,
            spline_weight: i.spline_weight,
            spline_scaler: i.spline_scaler,
            dy: args.dy.raw(call, "args.dy", ctx)?,
            dx: opt_out(&args.dx, call, "args.dx", ctx)?,
            dbase_weight: opt_out(&args.dbase_weight, call, "args.dbase_weight", ctx)?,
            dspline_weight: opt_out(&args.dspline_weight, call, "args.dspline_weight", ctx)?,
            dspline_scaler: opt_out(&args.dspline_scaler, call, "args.dspline_scaler", ctx)?,
            ..init_with(sys::kf_kan_linear_backward_args_init)
        };
        check(sys::kf_kan_linear_backward(self.raw.as_ptr(), grad_mode.raw(), &a, ws, ws_bytes))
    }
}

impl Drop for KanLinearPlan<'_> {
    fn drop(&mut self) {
        // SAFETY: created by kf_kan_linear_plan_create, destroyed once, before its context
        // (borrowed).
        unsafe { sys::kf_kan_linear_plan_destroy(self.raw.as_ptr()) }
    }
}
