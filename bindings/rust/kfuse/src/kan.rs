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
//!
//! Every KAN layer ([`KanLinearPlan`] here, [`KanConv2dPlan`](crate::KanConv2dPlan) in
//! `kan_conv`) is a [`KanPlan`] over its descriptor ([`KanLayer`]): one implementation of the
//! plan's calls, the same parameter and argument structs, and the C entry points of each kind
//! from one macro ([`kan_raw_impl!`]).
use crate::context::Context;
use crate::error::{check, Result};
use crate::grad::GradMode;
use crate::layer::{self, init_with, numel, opt_in, opt_out};
use crate::tensor::{Float, Tensor, TensorMut};
use kfuse_sys as sys;
use std::ffi::c_void;
use std::fmt;
use std::marker::PhantomData;
use std::ptr::{self, NonNull};

/// The builder methods and getters of a KAN layer's splines, shared by the descriptors (whose
/// fields `grid_size: u32`, `spline_order: u32` and `standalone_scale: bool` they set and read).
macro_rules! spline_options {
    () => {
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
    };
}
pub(crate) use spline_options;

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
    spline_options!();

    /// in.
    pub fn in_features(&self) -> usize {
        self.in_features
    }
    /// out.
    pub fn out_features(&self) -> usize {
        self.out_features
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
    /// Shape of the knots: `[in, G + 2k + 1]`. The state shapes come from the library
    /// (`kf_kan_linear_param_info` of a layer like this one with a spline_scaler); all zeros
    /// for a descriptor it refuses.
    pub fn grid_shape(&self) -> [usize; 2] {
        self.param_shape("grid")
    }
    /// Shape of base_weight (and its gradient): `[out, in]`.
    pub fn base_weight_shape(&self) -> [usize; 2] {
        self.param_shape("base_weight")
    }
    /// Shape of spline_weight (and its gradient): `[out, in, G + k]`.
    pub fn spline_weight_shape(&self) -> [usize; 3] {
        self.param_shape("spline_weight")
    }
    /// Shape of spline_scaler (and its gradient): `[out, in]`.
    pub fn spline_scaler_shape(&self) -> [usize; 2] {
        self.param_shape("spline_scaler")
    }
    fn param_shape<const R: usize>(&self, name: &str) -> [usize; R] {
        let list = layer::param_list_of(&self.clone().standalone_scale(true), |ctx, d| {
            let plan = KanPlan::new(ctx, d).ok()?;
            layer::param_list(plan.as_raw(), sys::kf_kan_linear_param_count, sys::kf_kan_linear_param_info)
                .ok()
        });
        layer::shape_of(list, name)
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
/// host memory through [`Tensor::new`], device memory through [`Tensor::from_raw`]. Every KAN
/// layer takes them: a KANConv2d's are those of its per-patch KANLinear (in = F).
#[derive(Clone, Copy, Debug)]
pub struct KanParams<'a, T: Float = f32> {
    grid: Tensor<'a, T>,
    base_weight: Tensor<'a, T>,
    spline_weight: Tensor<'a, T>,
    spline_scaler: Option<Tensor<'a, T>>,
}

impl<'a, T: Float> KanParams<'a, T> {
    /// grid `[in, G + 2k + 1]`, base_weight `[out, in]`, spline_weight `[out, in, G + k]`; no
    /// scaler.
    pub fn new(grid: Tensor<'a, T>, base_weight: Tensor<'a, T>, spline_weight: Tensor<'a, T>) -> Self {
        KanParams { grid, base_weight, spline_weight, spline_scaler: None }
    }
    /// spline_scaler `[out, in]`: required when the plan has a standalone scale, refused
    /// otherwise.
    pub fn spline_scaler(mut self, s: Tensor<'a, T>) -> Self {
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
pub struct KanHostParams<T: Float = f32> {
    /// grid `[in, G + 2k + 1]` (a buffer: no gradient).
    pub grid: Vec<T>,
    /// base_weight `[out, in]`.
    pub base_weight: Vec<T>,
    /// spline_weight `[out, in, G + k]`.
    pub spline_weight: Vec<T>,
    /// spline_scaler `[out, in]`, `None` when the layer has no standalone scale.
    pub spline_scaler: Option<Vec<T>>,
    desc: KanLinearDesc,
}

impl KanHostParams {
    /// All zeros in float32, shaped for the layer `desc` describes (a scaler vector when it has a
    /// standalone scale): a [`KanLinearDesc`], or a [`KanConv2dDesc`](crate::KanConv2dDesc),
    /// whose parameters are those of its per-patch KANLinear ([`KanLayer::kan_linear`]).
    pub fn zeros<L: KanLayer>(desc: &L) -> KanHostParams {
        Self::zeros_typed(desc)
    }
}

impl<T: Float> KanHostParams<T> {
    /// As [`zeros`](KanHostParams::zeros), of element type `T` (`KanHostParams::<f64>::zeros_typed`
    /// for a float64 plan).
    pub fn zeros_typed<L: KanLayer>(desc: &L) -> KanHostParams<T> {
        let desc = &desc.kan_linear();
        KanHostParams {
            grid: vec![T::default(); numel(&desc.grid_shape())],
            base_weight: vec![T::default(); numel(&desc.base_weight_shape())],
            spline_weight: vec![T::default(); numel(&desc.spline_weight_shape())],
            spline_scaler: layer::zeros_if(desc.standalone_scale, &desc.spline_scaler_shape()),
            desc: desc.clone(),
        }
    }
    /// The descriptor the shapes come from (for a KANConv2d, its per-patch KANLinear).
    pub fn desc(&self) -> &KanLinearDesc {
        &self.desc
    }
    /// Views for a call (the scaler included when present).
    pub fn view(&self) -> KanParams<'_, T> {
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

/// Arguments of a forward call of any KAN layer (`kf_kan_linear_forward_args`,
/// `kf_kan_conv2d_forward_args`), borrowing the inputs for `'i` and
/// the output for `'o`, so that [`KanBackwardArgs::from_forward`] can keep the inputs while y is
/// read.
#[derive(Debug)]
pub struct KanForwardArgs<'i, 'o, T: Float = f32> {
    x: Tensor<'i, T>,
    params: KanParams<'i, T>,
    y: TensorMut<'o, T>,
}

impl<'i, 'o, T: Float> KanForwardArgs<'i, 'o, T> {
    /// Input x, the knots and parameters, output y: for KANLinear x `[..., in]` and y
    /// `[..., out]` (x's leading dims); for KANConv2d x `[B, C_in, H, W]` and y
    /// `[B, C_out, Ho, Wo]` (or both without B).
    pub fn new(x: Tensor<'i, T>, params: KanParams<'i, T>, y: TensorMut<'o, T>) -> Self {
        KanForwardArgs { x, params, y }
    }
}

/// Arguments of a backward call of any KAN layer (`kf_kan_linear_backward_args`,
/// `kf_kan_conv2d_backward_args`): the forward's x, knots and parameters, dy, and the gradients
/// wanted (each optional; the work for an absent one is skipped; dx is always overwritten, the
/// parameter gradients are written or accumulated per [`GradMode`]).
#[derive(Debug)]
pub struct KanBackwardArgs<'a, T: Float = f32> {
    x: Tensor<'a, T>,
    params: KanParams<'a, T>,
    dy: Tensor<'a, T>,
    dx: Option<TensorMut<'a, T>>,
    dbase_weight: Option<TensorMut<'a, T>>,
    dspline_weight: Option<TensorMut<'a, T>>,
    dspline_scaler: Option<TensorMut<'a, T>>,
}

impl<'a, T: Float> KanBackwardArgs<'a, T> {
    /// The forward's x and parameters, and dy (y's shape); no gradient output yet.
    pub fn new(x: Tensor<'a, T>, params: KanParams<'a, T>, dy: Tensor<'a, T>) -> Self {
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
    pub fn from_forward(fwd: &KanForwardArgs<'a, '_, T>, dy: Tensor<'a, T>) -> Self {
        KanBackwardArgs::new(fwd.x, fwd.params, dy)
    }
    /// Output: gradient w.r.t. x, x's shape (always overwritten).
    pub fn dx(mut self, dx: TensorMut<'a, T>) -> Self {
        self.dx = Some(dx);
        self
    }
    /// Output: gradient w.r.t. base_weight, `[out, in]`.
    pub fn dbase_weight(mut self, g: TensorMut<'a, T>) -> Self {
        self.dbase_weight = Some(g);
        self
    }
    /// Output: gradient w.r.t. spline_weight, `[out, in, G + k]`.
    pub fn dspline_weight(mut self, g: TensorMut<'a, T>) -> Self {
        self.dspline_weight = Some(g);
        self
    }
    /// Output: gradient w.r.t. spline_scaler, `[out, in]` (plans with a standalone scale only).
    pub fn dspline_scaler(mut self, g: TensorMut<'a, T>) -> Self {
        self.dspline_scaler = Some(g);
        self
    }
    /// Outputs d base_weight, d spline_weight and (when `grads` has one) d spline_scaler, from
    /// host buffers shaped like the parameters (e.g. [`KanHostParams::zeros`]); its grid is not
    /// used.
    pub fn dparams(self, grads: &'a mut KanHostParams<T>) -> Self {
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

/// A kind of KAN layer, named by its descriptor: [`KanLinearDesc`] (KANLinear) or
/// [`KanConv2dDesc`](crate::KanConv2dDesc) (KANConv2d). It picks the C API a [`KanPlan`] calls;
/// both kinds take the same knots and parameters ([`KanParams`], [`KanHostParams`]) and the same
/// argument structs ([`KanForwardArgs`], [`KanBackwardArgs`]). Sealed: implemented in this crate
/// only.
pub trait KanLayer: raw::KanRaw + Clone + fmt::Debug {
    /// The KANLinear the layer applies: to every row of x (a [`KanLinearDesc`] is its own), or to
    /// every patch of x (a KANConv2d's, over `F = C_in * kh * kw` features). The shapes of the
    /// knots and parameters are its.
    fn kan_linear(&self) -> KanLinearDesc;
}

impl KanLayer for KanLinearDesc {
    fn kan_linear(&self) -> KanLinearDesc {
        self.clone()
    }
}

/// The C entry points of one kind of KAN layer, behind [`KanLayer`] (a supertrait no one outside
/// the crate can name or implement).
pub(crate) mod raw {
    use kfuse_sys as sys;
    use std::ffi::c_void;

    /// The names of the safe calls, for the errors found before the library is called.
    pub struct Calls {
        pub forward: &'static str,
        pub backward: &'static str,
        pub forward_raw: &'static str,
        pub backward_raw: &'static str,
        pub uniform_grid: &'static str,
        pub uniform_grid_into: &'static str,
        pub update_grid: &'static str,
    }

    /// x, the knots and the parameters of a call (spline_scaler absent when not given).
    #[derive(Clone, Copy)]
    pub struct Inputs {
        pub x: sys::kf_tensor,
        pub grid: sys::kf_tensor,
        pub base_weight: sys::kf_tensor,
        pub spline_weight: sys::kf_tensor,
        pub spline_scaler: sys::kf_tensor,
    }

    /// dy and the gradient outputs of a backward call (each absent when not asked for).
    pub struct Grads {
        pub dy: sys::kf_tensor,
        pub dx: sys::kf_tensor,
        pub dbase_weight: sys::kf_tensor,
        pub dspline_weight: sys::kf_tensor,
        pub dspline_scaler: sys::kf_tensor,
    }

    /// `kf_kan_<kind>_*`, implemented by [`kan_raw_impl!`](crate::kan::kan_raw_impl).
    pub trait KanRaw {
        /// `kf_kan_<kind>_plan`.
        type Plan;
        /// `"kf_kan_<kind>_plan_create"`.
        const CREATE: &'static str;
        const CALLS: Calls;
        /// # Safety
        /// A live context handle and a writable out-pointer.
        unsafe fn create(
            &self,
            dtype: sys::kf_dtype,
            ctx: *mut sys::kf_context,
            out: *mut *mut Self::Plan,
        ) -> sys::kf_status;
        /// # Safety
        /// A plan from `create`, destroyed once.
        unsafe fn destroy(plan: *mut Self::Plan);
        /// # Safety
        /// A live plan; `grid` valid for writing as its shape says.
        unsafe fn uniform_grid(
            plan: *const Self::Plan,
            lo: f32,
            hi: f32,
            grid: *mut sys::kf_tensor,
        ) -> sys::kf_status;
        /// # Safety
        /// A live plan; the tensors in `args` valid as their shapes say.
        unsafe fn update_grid(
            plan: *mut Self::Plan,
            args: *const sys::kf_kan_update_grid_args,
        ) -> sys::kf_status;
        /// # Safety
        /// A live plan, tensors valid as their shapes say, and a workspace as `forward_raw` says.
        unsafe fn forward(
            plan: *mut Self::Plan,
            i: Inputs,
            y: sys::kf_tensor,
            ws: *mut c_void,
            ws_bytes: usize,
        ) -> sys::kf_status;
        /// # Safety
        /// As `forward`.
        unsafe fn backward(
            plan: *mut Self::Plan,
            grad_mode: sys::kf_grad_mode,
            i: Inputs,
            g: Grads,
            ws: *mut c_void,
            ws_bytes: usize,
        ) -> sys::kf_status;
    }
}

/// Implements [`raw::KanRaw`] for the descriptor `$desc` of the safe plan `$plan_name` over the C
/// functions `kf_kan_<kind>_*` given by the name of each (`$desc::to_raw()` makes the C
/// descriptor). One copy for every KAN layer: their argument structs have the same fields.
macro_rules! kan_raw_impl {
    ($desc:ty, $plan_name:literal, plan: $plan:ident, create: $create:ident, destroy: $destroy:ident,
     uniform_grid: $grid:ident, update_grid: $update:ident, forward: $forward:ident($fwd_args:ident, $fwd_init:ident),
     backward: $backward:ident($bwd_args:ident, $bwd_init:ident)) => {
        impl $crate::kan::raw::KanRaw for $desc {
            type Plan = kfuse_sys::$plan;
            const CREATE: &'static str = stringify!($create);
            const CALLS: $crate::kan::raw::Calls = $crate::kan::raw::Calls {
                forward: concat!($plan_name, "::forward"),
                backward: concat!($plan_name, "::backward"),
                forward_raw: concat!($plan_name, "::forward_raw"),
                backward_raw: concat!($plan_name, "::backward_raw"),
                uniform_grid: concat!($plan_name, "::uniform_grid"),
                uniform_grid_into: concat!($plan_name, "::uniform_grid_into"),
                update_grid: concat!($plan_name, "::update_grid"),
            };
            unsafe fn create(
                &self,
                dtype: kfuse_sys::kf_dtype,
                ctx: *mut kfuse_sys::kf_context,
                out: *mut *mut Self::Plan,
            ) -> kfuse_sys::kf_status {
                let mut d = self.to_raw();
                d.dtype = dtype as _;
                kfuse_sys::$create(ctx, &d, out)
            }
            unsafe fn destroy(plan: *mut Self::Plan) {
                kfuse_sys::$destroy(plan)
            }
            unsafe fn uniform_grid(
                plan: *const Self::Plan,
                lo: f32,
                hi: f32,
                grid: *mut kfuse_sys::kf_tensor,
            ) -> kfuse_sys::kf_status {
                kfuse_sys::$grid(plan, lo, hi, grid)
            }
            unsafe fn update_grid(
                plan: *mut Self::Plan,
                args: *const kfuse_sys::kf_kan_update_grid_args,
            ) -> kfuse_sys::kf_status {
                kfuse_sys::$update(plan, args)
            }
            unsafe fn forward(
                plan: *mut Self::Plan,
                i: $crate::kan::raw::Inputs,
                y: kfuse_sys::kf_tensor,
                ws: *mut std::ffi::c_void,
                ws_bytes: usize,
            ) -> kfuse_sys::kf_status {
                let a = kfuse_sys::$fwd_args {
                    x: i.x,
                    grid: i.grid,
                    base_weight: i.base_weight,
                    spline_weight: i.spline_weight,
                    spline_scaler: i.spline_scaler,
                    y,
                    ..$crate::layer::init_with(kfuse_sys::$fwd_init)
                };
                kfuse_sys::$forward(plan, &a, ws, ws_bytes)
            }
            unsafe fn backward(
                plan: *mut Self::Plan,
                grad_mode: kfuse_sys::kf_grad_mode,
                i: $crate::kan::raw::Inputs,
                g: $crate::kan::raw::Grads,
                ws: *mut std::ffi::c_void,
                ws_bytes: usize,
            ) -> kfuse_sys::kf_status {
                let a = kfuse_sys::$bwd_args {
                    x: i.x,
                    grid: i.grid,
                    base_weight: i.base_weight,
                    spline_weight: i.spline_weight,
                    spline_scaler: i.spline_scaler,
                    dy: g.dy,
                    dx: g.dx,
                    dbase_weight: g.dbase_weight,
                    dspline_weight: g.dspline_weight,
                    dspline_scaler: g.dspline_scaler,
                    ..$crate::layer::init_with(kfuse_sys::$bwd_init)
                };
                kfuse_sys::$backward(plan, grad_mode, &a, ws, ws_bytes)
            }
        }
    };
}
pub(crate) use kan_raw_impl;

kan_raw_impl!(KanLinearDesc, "KanLinearPlan", plan: kf_kan_linear_plan,
    create: kf_kan_linear_plan_create, destroy: kf_kan_linear_plan_destroy,
    uniform_grid: kf_kan_linear_uniform_grid, update_grid: kf_kan_linear_update_grid,
    forward: kf_kan_linear_forward(kf_kan_linear_forward_args, kf_kan_linear_forward_args_init),
    backward: kf_kan_linear_backward(kf_kan_linear_backward_args, kf_kan_linear_backward_args_init));

/// A plan for a KAN layer of kind `L` ([`KanLinearPlan`] or
/// [`KanConv2dPlan`](crate::KanConv2dPlan)), bound to the context it borrows. Destroyed on drop.
/// No reserve: backward recomputes the bases from x. Like [`RnnPlan`](crate::RnnPlan), a plan
/// is neither `Send` nor `Sync`. On a CUDA context every tensor is device memory.
///
/// The methods here are the same for every kind; the shapes of x and y and the workspace query
/// are the kind's (see the aliases).
#[derive(Debug)]
pub struct KanPlan<'ctx, L: KanLayer, T: Float = f32> {
    raw: NonNull<L::Plan>,
    ctx: &'ctx Context,
    desc: L,
    _dtype: PhantomData<T>,
}

/// A plan for a KANLinear layer (`kf_kan_linear_plan`): [`KanPlan`] over a [`KanLinearDesc`].
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
pub type KanLinearPlan<'ctx, T = f32> = KanPlan<'ctx, KanLinearDesc, T>;

impl<'ctx, L: KanLayer> KanPlan<'ctx, L> {
    /// Creates a float32 plan on `ctx` (`kf_kan_<kind>_plan_create`). A bad descriptor gives
    /// [`Status::InvalidArgument`](crate::Status::InvalidArgument) naming the field.
    pub fn new(ctx: &'ctx Context, desc: &L) -> Result<KanPlan<'ctx, L>> {
        Self::new_typed(ctx, desc)
    }
}

impl<'ctx, L: KanLayer, T: Float> KanPlan<'ctx, L, T> {
    /// Creates a plan computing in `T` (any [`Float`]): x, y, the knots, the parameters and
    /// every gradient of its calls hold `T`. A backend without `T` refuses it here with
    /// [`Status::Unsupported`](crate::Status::Unsupported) (all but `f32`: the CPU backend only).
    ///
    /// ```
    /// use kfuse::*;
    /// let ctx = Context::cpu()?;
    /// let desc = KanLinearDesc::new(4, 2);
    /// let mut plan = KanLinearPlan::<f64>::new_typed(&ctx, &desc)?;
    /// let mut p = KanHostParams::<f64>::zeros_typed(&desc);
    /// p.grid = plan.uniform_grid(-1.0, 1.0)?;
    /// let (x, mut y) = (vec![0.5f64; 4], vec![f64::NAN; 2]);
    /// plan.forward(&KanForwardArgs::new(Tensor::new(&x, &desc.x_shape(1)), p.view(),
    ///                                   TensorMut::new(&mut y, &desc.y_shape(1))))?;
    /// assert_eq!(y, [0.0, 0.0]); // zero weights
    /// # Ok::<(), kfuse::Error>(())
    /// ```
    pub fn new_typed(ctx: &'ctx Context, desc: &L) -> Result<KanPlan<'ctx, L, T>> {
        // SAFETY: valid context handle and out-pointer.
        let raw = layer::create_plan(L::CREATE, |out| unsafe { desc.create(T::DTYPE, ctx.as_raw(), out) })?;
        Ok(KanPlan { raw, ctx, desc: desc.clone(), _dtype: PhantomData })
    }

    /// The descriptor the plan was made from.
    pub fn desc(&self) -> &L {
        &self.desc
    }
    /// The context the plan runs on.
    pub fn context(&self) -> &'ctx Context {
        self.ctx
    }

    /// efficient-kan's initial knots in a new host vector `[F, G + 2k + 1]` (F = in for
    /// KANLinear; CPU contexts; on CUDA use [`uniform_grid_into`](Self::uniform_grid_into) with
    /// device memory): every row is `lo + (j - k) * (hi - lo) / G`, rounded as torch forms it in
    /// the plan's type. Requires finite `lo < hi`.
    pub fn uniform_grid(&self, lo: f32, hi: f32) -> Result<Vec<T>> {
        let shape = self.desc.kan_linear().grid_shape();
        let mut g = vec![T::default(); numel(&shape)];
        self.grid_impl(L::CALLS.uniform_grid, lo, hi, &TensorMut::new(&mut g, &shape))?;
        Ok(g)
    }

    /// As [`uniform_grid`](Self::uniform_grid), writing into a caller buffer (host or device
    /// memory of the context's device).
    pub fn uniform_grid_into(&self, lo: f32, hi: f32, grid: TensorMut<'_, T>) -> Result<()> {
        self.grid_impl(L::CALLS.uniform_grid_into, lo, hi, &grid)
    }

    /// efficient-kan's `update_grid` (`kf_kan_<kind>_update_grid`): new knots for every feature
    /// from the samples `x` (x as forward takes it; KANConv2d: its patches) mixed with a uniform
    /// grid by `grid_eps` (efficient-kan's default 0.02; `margin` 0.01), and `spline_weight`
    /// refitted in float64 (minimum-norm least squares by SVD) so that the splines on the new
    /// knots reproduce, on the samples, those on the old ones. Both are written only on success.
    /// Not a hot path: it synchronises and computes on the host.
    pub fn update_grid(
        &mut self,
        x: &Tensor<'_, T>,
        grid: TensorMut<'_, T>,
        spline_weight: TensorMut<'_, T>,
        margin: f32,
        grid_eps: f32,
    ) -> Result<()> {
        let call = L::CALLS.update_grid;
        let a = sys::kf_kan_update_grid_args {
            x: x.raw(call, "x", self.ctx)?,
            grid: grid.raw(call, "grid", self.ctx)?,
            spline_weight: spline_weight.raw(call, "spline_weight", self.ctx)?,
            margin,
            grid_eps,
            ..crate::layer::init_with(sys::kf_kan_update_grid_args_init)
        };
        // SAFETY: live borrows of the lengths their shapes need (or raw pointers under their
        // constructors' contracts), and a live plan.
        check(unsafe { L::update_grid(self.raw.as_ptr(), &a) })
    }

    /// y for all of x, with scratch from the context's arena. A grid row that decreases is
    /// [`Status::InvalidArgument`](crate::Status::InvalidArgument) naming `args->grid` and the
    /// feature.
    pub fn forward(&mut self, args: &KanForwardArgs<'_, '_, T>) -> Result<()> {
        // SAFETY: no caller buffers; every view in args is valid by construction.
        unsafe { self.forward_impl(L::CALLS.forward, args, ptr::null_mut(), 0) }
    }

    /// Gradients of x, base_weight, spline_weight and spline_scaler (those asked for in `args`);
    /// `grad_mode` applies to the parameter gradients. Scratch from the context's arena.
    pub fn backward(&mut self, grad_mode: GradMode, args: &KanBackwardArgs<'_, T>) -> Result<()> {
        // SAFETY: as in forward().
        unsafe { self.backward_impl(L::CALLS.backward, grad_mode, args, ptr::null_mut(), 0) }
    }

    /// `kf_kan_<kind>_forward` with a caller-provided workspace of the plan's `workspace_size`.
    /// A null workspace with 0 bytes uses the context's arena.
    ///
    /// # Safety
    /// `workspace` must be null or point to at least `workspace_bytes` writable bytes on the
    /// context's device, `KF_ALIGN_BYTES`-aligned, not used by anyone else until the call's work has
    /// finished (on CUDA: on the context's stream).
    pub unsafe fn forward_raw(
        &mut self,
        args: &KanForwardArgs<'_, '_, T>,
        workspace: *mut c_void,
        workspace_bytes: usize,
    ) -> Result<()> {
        self.forward_impl(L::CALLS.forward_raw, args, workspace, workspace_bytes)
    }

    /// `kf_kan_<kind>_backward` with a caller-provided workspace.
    ///
    /// # Safety
    /// As [`forward_raw`](Self::forward_raw).
    pub unsafe fn backward_raw(
        &mut self,
        grad_mode: GradMode,
        args: &KanBackwardArgs<'_, T>,
        workspace: *mut c_void,
        workspace_bytes: usize,
    ) -> Result<()> {
        self.backward_impl(L::CALLS.backward_raw, grad_mode, args, workspace, workspace_bytes)
    }

    /// The raw handle (`*mut kf_kan_<kind>_plan`), for calls into `kfuse-sys`. It stays owned by
    /// `self`.
    pub fn as_raw(&self) -> *mut L::Plan {
        self.raw.as_ptr()
    }

    fn grid_impl(&self, call: &str, lo: f32, hi: f32, grid: &TensorMut<'_, T>) -> Result<()> {
        let mut g = grid.raw(call, "grid", self.ctx)?;
        // SAFETY: a live host borrow of the length its shape needs, or a raw pointer under its
        // constructor's contract.
        check(unsafe { L::uniform_grid(self.raw.as_ptr(), lo, hi, &mut g) })
    }

    /// x, the knots and the parameters (the scaler absent when not given), checked in that
    /// order.
    fn raw_inputs(&self, call: &str, x: &Tensor<'_, T>, p: &KanParams<'_, T>) -> Result<raw::Inputs> {
        let ctx = self.ctx;
        Ok(raw::Inputs {
            x: x.raw(call, "args.x", ctx)?,
            grid: p.grid.raw(call, "args.grid", ctx)?,
            base_weight: p.base_weight.raw(call, "args.base_weight", ctx)?,
            spline_weight: p.spline_weight.raw(call, "args.spline_weight", ctx)?,
            spline_scaler: opt_in(&p.spline_scaler, call, "args.spline_scaler", ctx)?,
        })
    }

    unsafe fn forward_impl(
        &mut self,
        call: &str,
        args: &KanForwardArgs<'_, '_, T>,
        ws: *mut c_void,
        ws_bytes: usize,
    ) -> Result<()> {
        let i = self.raw_inputs(call, &args.x, &args.params)?;
        let y = args.y.raw(call, "args.y", self.ctx)?;
        check(L::forward(self.raw.as_ptr(), i, y, ws, ws_bytes))
    }

    unsafe fn backward_impl(
        &mut self,
        call: &str,
        grad_mode: GradMode,
        args: &KanBackwardArgs<'_, T>,
        ws: *mut c_void,
        ws_bytes: usize,
    ) -> Result<()> {
        let ctx = self.ctx;
        let i = self.raw_inputs(call, &args.x, &args.params)?;
        let g = raw::Grads {
            dy: args.dy.raw(call, "args.dy", ctx)?,
            dx: opt_out(&args.dx, call, "args.dx", ctx)?,
            dbase_weight: opt_out(&args.dbase_weight, call, "args.dbase_weight", ctx)?,
            dspline_weight: opt_out(&args.dspline_weight, call, "args.dspline_weight", ctx)?,
            dspline_scaler: opt_out(&args.dspline_scaler, call, "args.dspline_scaler", ctx)?,
        };
        check(L::backward(self.raw.as_ptr(), grad_mode.raw(), i, g, ws, ws_bytes))
    }
}

impl<'ctx, T: Float> KanLinearPlan<'ctx, T> {
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
}

impl<L: KanLayer, T: Float> Drop for KanPlan<'_, L, T> {
    fn drop(&mut self) {
        // SAFETY: created by the kind's kf_kan_*_plan_create, destroyed once, before its context
        // (borrowed).
        unsafe { L::destroy(self.raw.as_ptr()) }
    }
}
