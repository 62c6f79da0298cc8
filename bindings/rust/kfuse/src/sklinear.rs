//! Sketched linear layer: SKLinear (Panther), as `kf_sklinear_plan`.
//!
//! `L = num_terms` terms of rank `k = low_rank` replace a dense `Linear(in, out)`:
//!
//! ```text
//! y = 1/(2L) * sum_i [ (x S1s[i]) U1s[i] + (x U2s[i]) S2s[i] ] + bias
//! ```
//!
//! with learnable `S1s [L, in, k]`, `S2s [L, k, out]`, fixed sketches `U1s [L, k, out]`,
//! `U2s [L, in, k]` and an optional `bias [out]`. x is `[..., in]` with any leading dims (at most
//! 6 dims in all), y is `[..., out]` with the same leading dims.
//!
//! Since 1.8 the layer may fuse an activation and dropout into its output store
//! ([`SkLinearDesc::activation`], [`SkLinearDesc::dropout`]): `y = dropout(act(pre))`, the mask
//! drawn per call from a seed and counter offset ([`SkForwardArgs::training`]), the same bits on
//! every backend (kfuse.h).
use crate::context::Context;
use crate::error::{check, Result};
use crate::grad::GradMode;
use crate::layer::{self, init_with, numel, opt_in, opt_out};
use crate::tensor::{Float, Tensor, TensorMut};
use kfuse_sys as sys;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::ptr::{self, NonNull};

/// Describes a sketched linear layer (`kf_sklinear_desc`). The bias defaults to the library's
/// default (`kf_sklinear_desc_init`: present). Nothing is checked here: [`SkLinearPlan::new`]
/// passes it to the library, whose error names the field.
///
/// ```
/// let d = kfuse::SkLinearDesc::new(1024, 512, 1, 16).bias(false);
/// assert_eq!(d.s1s_shape(), [1, 1024, 16]);
/// assert_eq!(d.s2s_shape(), [1, 16, 512]);
/// assert!(!d.has_bias());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SkLinearDesc {
    in_features: usize,
    out_features: usize,
    num_terms: u32,
    low_rank: u32,
    bias: bool,
    activation: Activation,
    dropout_bits: u32, // the f32's bits, so that the desc stays Eq and Hash
}

/// The activation of the fused epilogue (`kf_activation`, since 1.8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Activation {
    /// None (the default): y = pre.
    #[default]
    None,
    /// max(v, 0).
    Relu,
    /// v Phi(v), with erf (torch's default GELU).
    Gelu,
    /// GELU's tanh approximation.
    GeluTanh,
    /// v sigma(v).
    Silu,
}

impl Activation {
    /// The `kf_activation` value.
    pub fn raw(self) -> i32 {
        (match self {
            Activation::None => sys::kf_activation_KF_ACTIVATION_NONE,
            Activation::Relu => sys::kf_activation_KF_ACTIVATION_RELU,
            Activation::Gelu => sys::kf_activation_KF_ACTIVATION_GELU,
            Activation::GeluTanh => sys::kf_activation_KF_ACTIVATION_GELU_TANH,
            Activation::Silu => sys::kf_activation_KF_ACTIVATION_SILU,
        }) as i32
    }
}

impl SkLinearDesc {
    /// A layer from `in_features` to `out_features` with `num_terms` (L) terms of rank
    /// `low_rank` (k).
    pub fn new(in_features: usize, out_features: usize, num_terms: u32, low_rank: u32) -> SkLinearDesc {
        let d = init_with(sys::kf_sklinear_desc_init);
        SkLinearDesc {
            in_features,
            out_features,
            num_terms,
            low_rank,
            bias: d.bias != 0,
            activation: Activation::None,
            dropout_bits: d.dropout.to_bits(),
        }
    }
    /// The activation fused into the output store (default [`Activation::None`]).
    pub fn activation(mut self, act: Activation) -> Self {
        self.activation = act;
        self
    }
    /// The dropout probability `p` in [0, 1) applied after the activation in training calls
    /// (default 0: none); the library rejects another value, naming `desc->dropout`.
    pub fn dropout(mut self, p: f32) -> Self {
        self.dropout_bits = p.to_bits();
        self
    }
    /// The fused activation.
    pub fn get_activation(&self) -> Activation {
        self.activation
    }
    /// The dropout probability.
    pub fn get_dropout(&self) -> f32 {
        f32::from_bits(self.dropout_bits)
    }
    /// Whether a bias `[out]` is added.
    pub fn bias(mut self, yes: bool) -> Self {
        self.bias = yes;
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
    /// L.
    pub fn num_terms(&self) -> u32 {
        self.num_terms
    }
    /// k.
    pub fn low_rank(&self) -> u32 {
        self.low_rank
    }
    /// Whether the layer has a bias.
    pub fn has_bias(&self) -> bool {
        self.bias
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
    /// Shape of S1s (and dS1s): `[L, in, k]`. The state shapes come from the library
    /// (`kf_sklinear_param_info` of a layer like this one with a bias); all zeros for a
    /// descriptor it refuses.
    pub fn s1s_shape(&self) -> [usize; 3] {
        self.param_shape("S1s")
    }
    /// Shape of S2s (and dS2s): `[L, k, out]`.
    pub fn s2s_shape(&self) -> [usize; 3] {
        self.param_shape("S2s")
    }
    /// Shape of U1s: `[L, k, out]`.
    pub fn u1s_shape(&self) -> [usize; 3] {
        self.param_shape("U1s")
    }
    /// Shape of U2s: `[L, in, k]`.
    pub fn u2s_shape(&self) -> [usize; 3] {
        self.param_shape("U2s")
    }
    /// Shape of the bias (and dbias): `[out]`.
    pub fn bias_shape(&self) -> [usize; 1] {
        self.param_shape("bias")
    }
    fn param_shape<const R: usize>(&self, name: &str) -> [usize; R] {
        let list = layer::param_list_of(&self.clone().bias(true), |ctx, d| {
            let plan = SkLinearPlan::new(ctx, d).ok()?;
            layer::param_list(plan.as_raw(), sys::kf_sklinear_param_count, sys::kf_sklinear_param_info).ok()
        });
        layer::shape_of(list, name)
    }
    /// Shape of a dense `Linear`'s weight, as `W_init` of [`SkLinearPlan::init_params`] takes it:
    /// `[out, in]`.
    pub fn w_init_shape(&self) -> [usize; 2] {
        [self.out_features, self.in_features]
    }

    /// The `kf_sklinear_desc` this describes. Out-of-range values saturate so that the library
    /// rejects them with its own message.
    pub fn to_raw(&self) -> sys::kf_sklinear_desc {
        let mut d = init_with(sys::kf_sklinear_desc_init);
        d.in_features = i64::try_from(self.in_features).unwrap_or(i64::MAX);
        d.out_features = i64::try_from(self.out_features).unwrap_or(i64::MAX);
        d.num_terms = i32::try_from(self.num_terms).unwrap_or(i32::MAX);
        d.low_rank = i32::try_from(self.low_rank).unwrap_or(i32::MAX);
        d.bias = i32::from(self.bias);
        d.activation = self.activation.raw();
        d.dropout = self.get_dropout();
        d
    }
}

/// Read-only views of a layer's parameters for a call (S1s, S2s, U1s, U2s and, for a plan with a
/// bias, the bias). Shapes are given by the caller and checked by the library
/// ([`SkLinearDesc::s1s_shape`] and friends compute them); host memory through [`Tensor::new`],
/// device memory through [`Tensor::from_raw`].
#[derive(Clone, Copy, Debug)]
pub struct SkParams<'a, T: Float = f32> {
    s1s: Tensor<'a, T>,
    s2s: Tensor<'a, T>,
    u1s: Tensor<'a, T>,
    u2s: Tensor<'a, T>,
    bias: Option<Tensor<'a, T>>,
}

impl<'a, T: Float> SkParams<'a, T> {
    /// S1s `[L, in, k]`, S2s `[L, k, out]`, U1s `[L, k, out]`, U2s `[L, in, k]`; no bias.
    pub fn new(s1s: Tensor<'a, T>, s2s: Tensor<'a, T>, u1s: Tensor<'a, T>, u2s: Tensor<'a, T>) -> Self {
        SkParams { s1s, s2s, u1s, u2s, bias: None }
    }
    /// The bias `[out]`: required when the plan has one, refused otherwise.
    pub fn bias(mut self, bias: Tensor<'a, T>) -> Self {
        self.bias = Some(bias);
        self
    }
}

/// Writable views of a layer's parameters, for [`SkLinearPlan::init_params_into`].
#[derive(Debug)]
pub struct SkParamsMut<'a, T: Float = f32> {
    s1s: TensorMut<'a, T>,
    s2s: TensorMut<'a, T>,
    u1s: TensorMut<'a, T>,
    u2s: TensorMut<'a, T>,
    bias: Option<TensorMut<'a, T>>,
}

impl<'a, T: Float> SkParamsMut<'a, T> {
    /// S1s, S2s, U1s, U2s, shaped as in [`SkParams::new`]; no bias.
    pub fn new(
        s1s: TensorMut<'a, T>,
        s2s: TensorMut<'a, T>,
        u1s: TensorMut<'a, T>,
        u2s: TensorMut<'a, T>,
    ) -> Self {
        SkParamsMut { s1s, s2s, u1s, u2s, bias: None }
    }
    /// The bias `[out]` (plans with a bias).
    pub fn bias(mut self, bias: TensorMut<'a, T>) -> Self {
        self.bias = Some(bias);
        self
    }
}

/// A layer's parameters in owned host vectors, in Panther's layout (row-major, the shapes of
/// [`SkLinearDesc`]). Made by [`SkLinearPlan::init_params`] or [`SkHostParams::zeros`] (also
/// handy as gradient buffers: dS1s, dS2s and dbias have the shapes of S1s, S2s and bias).
/// The vectors are public so that an optimiser can update them; a vector whose length no longer
/// matches its shape is refused at the next call.
#[derive(Clone, Debug, PartialEq)]
pub struct SkHostParams<T: Float = f32> {
    /// S1s `[L, in, k]` (learnable).
    pub s1s: Vec<T>,
    /// S2s `[L, k, out]` (learnable).
    pub s2s: Vec<T>,
    /// U1s `[L, k, out]` (fixed sketch).
    pub u1s: Vec<T>,
    /// U2s `[L, in, k]` (fixed sketch).
    pub u2s: Vec<T>,
    /// bias `[out]` (learnable), `None` when the layer has none.
    pub bias: Option<Vec<T>>,
    desc: SkLinearDesc,
}

impl SkHostParams {
    /// All zeros in float32, shaped for `desc` (a bias vector when `desc` has a bias).
    pub fn zeros(desc: &SkLinearDesc) -> SkHostParams {
        Self::zeros_typed(desc)
    }
}

impl<T: Float> SkHostParams<T> {
    /// As [`zeros`](SkHostParams::zeros), of element type `T` (`SkHostParams::<f64>::zeros_typed`
    /// for a float64 plan).
    pub fn zeros_typed(desc: &SkLinearDesc) -> SkHostParams<T> {
        SkHostParams {
            s1s: vec![T::default(); numel(&desc.s1s_shape())],
            s2s: vec![T::default(); numel(&desc.s2s_shape())],
            u1s: vec![T::default(); numel(&desc.u1s_shape())],
            u2s: vec![T::default(); numel(&desc.u2s_shape())],
            bias: layer::zeros_if(desc.bias, &desc.bias_shape()),
            desc: desc.clone(),
        }
    }
    /// The descriptor the shapes come from.
    pub fn desc(&self) -> &SkLinearDesc {
        &self.desc
    }
    /// Views for a call (the bias included when present).
    pub fn view(&self) -> SkParams<'_, T> {
        let d = &self.desc;
        let p = SkParams::new(
            Tensor::new(&self.s1s, &d.s1s_shape()),
            Tensor::new(&self.s2s, &d.s2s_shape()),
            Tensor::new(&self.u1s, &d.u1s_shape()),
            Tensor::new(&self.u2s, &d.u2s_shape()),
        );
        match &self.bias {
            Some(b) => p.bias(Tensor::new(b, &d.bias_shape())),
            None => p,
        }
    }
    /// Writable views (for [`SkLinearPlan::init_params_into`]).
    pub fn view_mut(&mut self) -> SkParamsMut<'_, T> {
        let d = &self.desc;
        let p = SkParamsMut::new(
            TensorMut::new(&mut self.s1s, &d.s1s_shape()),
            TensorMut::new(&mut self.s2s, &d.s2s_shape()),
            TensorMut::new(&mut self.u1s, &d.u1s_shape()),
            TensorMut::new(&mut self.u2s, &d.u2s_shape()),
        );
        match &mut self.bias {
            Some(b) => p.bias(TensorMut::new(b, &d.bias_shape())),
            None => p,
        }
    }
}

/// Arguments of a forward call (`kf_sklinear_forward_args`), borrowing the inputs for `'i` and
/// the output for `'o`, so that [`SkBackwardArgs::from_forward`] can keep the inputs while y is
/// read.
#[derive(Debug)]
pub struct SkForwardArgs<'i, 'o, T: Float = f32> {
    x: Tensor<'i, T>,
    params: SkParams<'i, T>,
    y: TensorMut<'o, T>,
    pre: Option<TensorMut<'o, T>>,
    epi: Epilogue,
}

/// A call's epilogue fields: training (dropout applies), the mask's seed and counter offset.
#[derive(Clone, Copy, Debug, Default)]
struct Epilogue {
    training: bool,
    seed: u64,
    offset: u64,
}

impl Epilogue {
    fn mode(&self) -> i32 {
        (if self.training { sys::kf_mode_KF_MODE_TRAINING } else { sys::kf_mode_KF_MODE_INFERENCE }) as i32
    }
}

impl<'i, 'o, T: Float> SkForwardArgs<'i, 'o, T> {
    /// Input x `[..., in]`, the parameters, output y `[..., out]` (x's leading dims).
    pub fn new(x: Tensor<'i, T>, params: SkParams<'i, T>, y: TensorMut<'o, T>) -> Self {
        SkForwardArgs { x, params, y, pre: None, epi: Epilogue::default() }
    }
    /// A training call: the plan's dropout applies, its mask keyed by `seed`, element (n, o) of y
    /// at counter `offset + n * out + o` (a fresh seed per call gives a fresh mask).
    pub fn training(mut self, seed: u64, offset: u64) -> Self {
        self.epi = Epilogue { training: true, seed, offset };
        self
    }
    /// Output: the pre-activation `s Z W2 + bias`, y's shape, which the backward of a GELU or
    /// SiLU plan reads (a ReLU plan's backward reads y instead).
    pub fn pre(mut self, pre: TensorMut<'o, T>) -> Self {
        self.pre = Some(pre);
        self
    }
}

/// Arguments of a backward call (`kf_sklinear_backward_args`): the forward's x and parameters,
/// dy, and the gradients wanted (each optional; dx is always overwritten, dS1s, dS2s and dbias
/// are written or accumulated per [`GradMode`]).
#[derive(Debug)]
pub struct SkBackwardArgs<'a, T: Float = f32> {
    x: Tensor<'a, T>,
    params: SkParams<'a, T>,
    dy: Tensor<'a, T>,
    dx: Option<TensorMut<'a, T>>,
    ds1s: Option<TensorMut<'a, T>>,
    ds2s: Option<TensorMut<'a, T>>,
    dbias: Option<TensorMut<'a, T>>,
    pre: Option<Tensor<'a, T>>,
    epi: Epilogue,
}

impl<'a, T: Float> SkBackwardArgs<'a, T> {
    /// The forward's x and parameters, and dy `[..., out]`; no gradient output yet.
    pub fn new(x: Tensor<'a, T>, params: SkParams<'a, T>, dy: Tensor<'a, T>) -> Self {
        SkBackwardArgs {
            x,
            params,
            dy,
            dx: None,
            ds1s: None,
            ds2s: None,
            dbias: None,
            pre: None,
            epi: Epilogue::default(),
        }
    }
    /// The inputs of `fwd` (x, the parameters and its training seed and offset), and dy.
    pub fn from_forward(fwd: &SkForwardArgs<'a, '_, T>, dy: Tensor<'a, T>) -> Self {
        SkBackwardArgs { epi: fwd.epi, ..SkBackwardArgs::new(fwd.x, fwd.params, dy) }
    }
    /// The forward was a training call with this seed and offset (its dropout mask).
    pub fn training(mut self, seed: u64, offset: u64) -> Self {
        self.epi = Epilogue { training: true, seed, offset };
        self
    }
    /// Input: the forward's pre-activation (required with an activation; for ReLU its y serves).
    pub fn pre(mut self, pre: Tensor<'a, T>) -> Self {
        self.pre = Some(pre);
        self
    }
    /// Output: gradient w.r.t. x, x's shape (always overwritten).
    pub fn dx(mut self, dx: TensorMut<'a, T>) -> Self {
        self.dx = Some(dx);
        self
    }
    /// Output: gradient w.r.t. S1s, `[L, in, k]`.
    pub fn ds1s(mut self, ds1s: TensorMut<'a, T>) -> Self {
        self.ds1s = Some(ds1s);
        self
    }
    /// Output: gradient w.r.t. S2s, `[L, k, out]`.
    pub fn ds2s(mut self, ds2s: TensorMut<'a, T>) -> Self {
        self.ds2s = Some(ds2s);
        self
    }
    /// Output: gradient w.r.t. the bias, `[out]` (plans with a bias only).
    pub fn dbias(mut self, dbias: TensorMut<'a, T>) -> Self {
        self.dbias = Some(dbias);
        self
    }
    /// Outputs dS1s, dS2s and (when `grads` has one) dbias, from host buffers shaped like the
    /// parameters (e.g. [`SkHostParams::zeros`]); its U1s and U2s are not used.
    pub fn dparams(self, grads: &'a mut SkHostParams<T>) -> Self {
        let d = &grads.desc;
        let b = self
            .ds1s(TensorMut::new(&mut grads.s1s, &d.s1s_shape()))
            .ds2s(TensorMut::new(&mut grads.s2s, &d.s2s_shape()));
        match &mut grads.bias {
            Some(g) => b.dbias(TensorMut::new(g, &d.bias_shape())),
            None => b,
        }
    }
}

/// A plan for a sketched linear layer (`kf_sklinear_plan`), bound to the context it borrows.
/// Destroyed on drop. No reserve: backward recomputes what it needs from x. Like
/// [`RnnPlan`](crate::RnnPlan), a plan is neither `Send` nor `Sync`.
///
/// ```
/// use kfuse::*;
/// let ctx = Context::cpu()?;
/// let desc = SkLinearDesc::new(64, 32, 2, 4);
/// let mut plan = SkLinearPlan::new(&ctx, &desc)?;
/// assert!(plan.param_ratio()? < 1.0);
/// let params = plan.init_params(7, None)?; // Panther's initialisation, host vectors
/// let n = 3;
/// let x = vec![0.5f32; n * 64];
/// let mut y = vec![f32::NAN; n * 32];
/// let fwd = SkForwardArgs::new(Tensor::new(&x, &desc.x_shape(n)), params.view(),
///                              TensorMut::new(&mut y, &desc.y_shape(n)));
/// plan.forward(&fwd)?;
/// let dy = vec![1.0f32; n * 32];
/// let mut grads = SkHostParams::zeros(&desc);
/// let bwd = SkBackwardArgs::from_forward(&fwd, Tensor::new(&dy, &desc.y_shape(n)))
///     .dparams(&mut grads);
/// plan.backward(GradMode::Overwrite, &bwd)?;
/// drop((fwd, bwd));
/// assert!(y.iter().all(|v| v.is_finite()));
/// assert_eq!(grads.bias.as_ref().unwrap()[0], n as f32); // dbias = sum of dy over rows
/// # Ok::<(), kfuse::Error>(())
/// ```
///
/// It borrows its context, so it is not `Send`, and cannot outlive the context:
///
/// ```compile_fail
/// fn need_send<T: Send>() {}
/// need_send::<kfuse::SkLinearPlan<'static>>();
/// ```
///
/// ```compile_fail
/// let plan = {
///     let ctx = kfuse::Context::cpu().unwrap();
///     kfuse::SkLinearPlan::new(&ctx, &kfuse::SkLinearDesc::new(4, 4, 1, 2)).unwrap()
/// };
/// ```
#[derive(Debug)]
pub struct SkLinearPlan<'ctx, T: Float = f32> {
    raw: NonNull<sys::kf_sklinear_plan>,
    ctx: &'ctx Context,
    desc: SkLinearDesc,
    _dtype: PhantomData<T>,
}

impl<'ctx> SkLinearPlan<'ctx> {
    /// Creates a float32 plan on `ctx` (`kf_sklinear_plan_create`). A bad descriptor gives
    /// [`Status::InvalidArgument`](crate::Status::InvalidArgument) naming the field. A layer
    /// with more parameters than the dense one is allowed
    /// ([`param_ratio`](Self::param_ratio) > 1).
    pub fn new(ctx: &'ctx Context, desc: &SkLinearDesc) -> Result<SkLinearPlan<'ctx>> {
        Self::new_typed(ctx, desc)
    }
}

impl<'ctx, T: Float> SkLinearPlan<'ctx, T> {
    /// Creates a plan computing in `T` (any [`Float`]): every tensor of its calls holds `T`.
    /// A backend without `T` refuses it here with [`Status::Unsupported`] (all but `f32`: the
    /// CPU backend only).
    ///
    /// ```
    /// use kfuse::*;
    /// let ctx = Context::cpu()?;
    /// let desc = SkLinearDesc::new(8, 4, 1, 2);
    /// let mut plan = SkLinearPlan::<f64>::new_typed(&ctx, &desc)?;
    /// let params: SkHostParams<f64> = plan.init_params(1, None)?;
    /// let x = vec![1.0f64; 8];
    /// let mut y = vec![0.0f64; 4];
    /// plan.forward(&SkForwardArgs::new(Tensor::new(&x, &desc.x_shape(1)), params.view(),
    ///                                  TensorMut::new(&mut y, &desc.y_shape(1))))?;
    /// # Ok::<(), kfuse::Error>(())
    /// ```
    ///
    /// [`Status::Unsupported`]: crate::Status::Unsupported
    pub fn new_typed(ctx: &'ctx Context, desc: &SkLinearDesc) -> Result<SkLinearPlan<'ctx, T>> {
        let d = sys::kf_sklinear_desc { dtype: T::DTYPE as _, ..desc.to_raw() };
        // SAFETY: valid context handle, descriptor and out-pointer.
        let raw = layer::create_plan("kf_sklinear_plan_create", |out| unsafe {
            sys::kf_sklinear_plan_create(ctx.as_raw(), &d, out)
        })?;
        Ok(SkLinearPlan { raw, ctx, desc: desc.clone(), _dtype: PhantomData })
    }

    /// The descriptor the plan was made from.
    pub fn desc(&self) -> &SkLinearDesc {
        &self.desc
    }
    /// The context the plan runs on.
    pub fn context(&self) -> &'ctx Context {
        self.ctx
    }
    /// Shape of x for N rows, `[N, in]` (as [`SkLinearDesc::x_shape`]).
    pub fn x_shape(&self, n: usize) -> [usize; 2] {
        self.desc.x_shape(n)
    }
    /// Shape of y for N rows, `[N, out]` (as [`SkLinearDesc::y_shape`]).
    pub fn y_shape(&self, n: usize) -> [usize; 2] {
        self.desc.y_shape(n)
    }

    /// `2Lk(in+out) / (in*out)`: the sketched layer's parameter count over the dense layer's.
    /// Above 1 the sketch holds more parameters than the `Linear` it replaces.
    pub fn param_ratio(&self) -> Result<f64> {
        let mut r = 0.0f64;
        // SAFETY: valid plan and out-pointer.
        check(unsafe { sys::kf_sklinear_param_ratio(self.raw.as_ptr(), &mut r) })?;
        Ok(r)
    }

    /// Bytes of scratch that forward and backward need for `n` rows (the product of x's leading
    /// dims). The safe calls take it from the context's arena; [`forward_raw`](Self::forward_raw)
    /// and [`backward_raw`](Self::backward_raw) accept a caller buffer of this size.
    pub fn workspace_size(&self, n: usize) -> Result<usize> {
        // SAFETY: valid plan and out-pointer.
        layer::workspace_size(n, |n, ws| unsafe { sys::kf_sklinear_workspace_size(self.raw.as_ptr(), n, ws) })
    }

    /// y for every row of x, with scratch from the context's arena.
    pub fn forward(&mut self, args: &SkForwardArgs<'_, '_, T>) -> Result<()> {
        // SAFETY: no caller buffers; every view in args is valid by construction.
        unsafe { self.forward_impl("SkLinearPlan::forward", args, ptr::null_mut(), 0) }
    }

    /// Gradients of x, S1s, S2s and the bias (those asked for in `args`); `grad_mode` applies to
    /// dS1s, dS2s and dbias. Scratch from the context's arena.
    pub fn backward(&mut self, grad_mode: GradMode, args: &SkBackwardArgs<'_, T>) -> Result<()> {
        // SAFETY: as in forward().
        unsafe { self.backward_impl("SkLinearPlan::backward", grad_mode, args, ptr::null_mut(), 0) }
    }

    /// `kf_sklinear_forward` with a caller-provided workspace (e.g. device memory on a CUDA
    /// context). A null workspace with 0 bytes uses the context's arena.
    ///
    /// # Safety
    /// `workspace` must be null or point to at least `workspace_bytes` writable bytes on the
    /// context's device, `KF_ALIGN_BYTES`-aligned, not used by anyone else until the call's work has
    /// finished (on CUDA: on the context's stream).
    pub unsafe fn forward_raw(
        &mut self,
        args: &SkForwardArgs<'_, '_, T>,
        workspace: *mut c_void,
        workspace_bytes: usize,
    ) -> Result<()> {
        self.forward_impl("SkLinearPlan::forward_raw", args, workspace, workspace_bytes)
    }

    /// `kf_sklinear_backward` with a caller-provided workspace.
    ///
    /// # Safety
    /// As [`forward_raw`](Self::forward_raw).
    pub unsafe fn backward_raw(
        &mut self,
        grad_mode: GradMode,
        args: &SkBackwardArgs<'_, T>,
        workspace: *mut c_void,
        workspace_bytes: usize,
    ) -> Result<()> {
        self.backward_impl("SkLinearPlan::backward_raw", grad_mode, args, workspace, workspace_bytes)
    }

    /// Panther's initialisation into new host vectors (CPU contexts; on CUDA use
    /// [`init_params_into`](Self::init_params_into) with device memory): U1s and U2s are scaled
    /// sign sketches with entries ±1/sqrt(k); `S1s[i] = W U1s[i]^T`, `S2s[i] = U2s[i]^T W` with
    /// `W = w_init^T` when a dense weight `w_init [out, in]` is given, else drawn
    /// Kaiming-uniform; the bias is drawn from U(-1/sqrt(out), 1/sqrt(out)). Every draw is a pure
    /// function of `seed` and the element's position.
    pub fn init_params(&mut self, seed: u64, w_init: Option<Tensor<'_, T>>) -> Result<SkHostParams<T>> {
        let mut p = SkHostParams::zeros_typed(&self.desc);
        self.init_impl("SkLinearPlan::init_params", seed, w_init, &p.view_mut())?;
        Ok(p)
    }

    /// As [`init_params`](Self::init_params), writing into caller buffers (host or device
    /// memory). Not a hot path: it synchronises with the context's stream.
    pub fn init_params_into(
        &mut self,
        seed: u64,
        w_init: Option<Tensor<'_, T>>,
        out: SkParamsMut<'_, T>,
    ) -> Result<()> {
        self.init_impl("SkLinearPlan::init_params_into", seed, w_init, &out)
    }

    /// The raw handle, for calls into `kfuse-sys`. It stays owned by `self`.
    pub fn as_raw(&self) -> *mut sys::kf_sklinear_plan {
        self.raw.as_ptr()
    }

    fn init_impl(
        &mut self,
        call: &str,
        seed: u64,
        w_init: Option<Tensor<'_, T>>,
        out: &SkParamsMut<'_, T>,
    ) -> Result<()> {
        let ctx = self.ctx;
        let mut a = init_with(sys::kf_sklinear_init_args_init);
        a.seed = seed;
        if let Some(w) = &w_init {
            a.W_init = w.raw(call, "args.W_init", ctx)?;
        }
        a.S1s = out.s1s.raw(call, "args.S1s", ctx)?;
        a.S2s = out.s2s.raw(call, "args.S2s", ctx)?;
        a.U1s = out.u1s.raw(call, "args.U1s", ctx)?;
        a.U2s = out.u2s.raw(call, "args.U2s", ctx)?;
        a.bias = opt_out(&out.bias, call, "args.bias", ctx)?;
        // SAFETY: every view is a live host borrow of the length its shape needs, or a raw
        // pointer under its constructor's contract.
        check(unsafe { sys::kf_sklinear_init_params(self.raw.as_ptr(), &a) })
    }

    /// The forward's arguments but y: x and the parameters (the bias absent when not given),
    /// checked in that order.
    fn raw_inputs(
        call: &str,
        ctx: &Context,
        x: &Tensor<'_, T>,
        p: &SkParams<'_, T>,
    ) -> Result<sys::kf_sklinear_forward_args> {
        Ok(sys::kf_sklinear_forward_args {
            x: x.raw(call, "args.x", ctx)?,
            S1s: p.s1s.raw(call, "args.S1s", ctx)?,
            S2s: p.s2s.raw(call, "args.S2s", ctx)?,
            U1s: p.u1s.raw(call, "args.U1s", ctx)?,
            U2s: p.u2s.raw(call, "args.U2s", ctx)?,
            bias: opt_in(&p.bias, call, "args.bias", ctx)?,
            ..init_with(sys::kf_sklinear_forward_args_init)
        })
    }

    unsafe fn forward_impl(
        &mut self,
        call: &str,
        args: &SkForwardArgs<'_, '_, T>,
        ws: *mut c_void,
        ws_bytes: usize,
    ) -> Result<()> {
        let inputs = Self::raw_inputs(call, self.ctx, &args.x, &args.params)?;
        let a = sys::kf_sklinear_forward_args {
            y: args.y.raw(call, "args.y", self.ctx)?,
            mode: args.epi.mode(),
            dropout_seed: args.epi.seed,
            dropout_offset: args.epi.offset,
            pre: opt_out(&args.pre, call, "args.pre", self.ctx)?,
            ..inputs
        };
        check(sys::kf_sklinear_forward(self.raw.as_ptr(), &a, ws, ws_bytes))
    }

    unsafe fn backward_impl(
        &mut self,
        call: &str,
        grad_mode: GradMode,
        args: &SkBackwardArgs<'_, T>,
        ws: *mut c_void,
        ws_bytes: usize,
    ) -> Result<()> {
        let ctx = self.ctx;
        // kf_sklinear_backward_args has no bias input (backward does not read it); a bias in the
        // forward's parameters is only checked for its length, and then dropped.
        let i = Self::raw_inputs(call, ctx, &args.x, &args.params)?;
        let a = sys::kf_sklinear_backward_args {
            x: i.x,
            S1s: i.S1s,
            S2s: i.S2s,
            U1s: i.U1s,
            U2s: i.U2s,
            dy: args.dy.raw(call, "args.dy", ctx)?,
            dx: opt_out(&args.dx, call, "args.dx", ctx)?,
            dS1s: opt_out(&args.ds1s, call, "args.dS1s", ctx)?,
            dS2s: opt_out(&args.ds2s, call, "args.dS2s", ctx)?,
            dbias: opt_out(&args.dbias, call, "args.dbias", ctx)?,
            mode: args.epi.mode(),
            dropout_seed: args.epi.seed,
            dropout_offset: args.epi.offset,
            pre: opt_in(&args.pre, call, "args.pre", ctx)?,
            ..init_with(sys::kf_sklinear_backward_args_init)
        };
        check(sys::kf_sklinear_backward(self.raw.as_ptr(), grad_mode.raw(), &a, ws, ws_bytes))
    }
}

impl<T: Float> Drop for SkLinearPlan<'_, T> {
    fn drop(&mut self) {
        // SAFETY: created by kf_sklinear_plan_create, destroyed once, before its context
        // (borrowed).
        unsafe { sys::kf_sklinear_plan_destroy(self.raw.as_ptr()) }
    }
}
