//! KAN convolution: KANConv2d, as `kf_kan_conv2d_plan` (a [`KanPlan`] over a [`KanConv2dDesc`]).
//!
//! x `[B, C_in, H, W]` is unfolded into the patches of `torch.nn.functional.unfold` (kernel
//! `kh x kw`, stride, zero padding and dilation as in `torch.nn.Conv2d`), and a KANLinear with
//! `in = F = C_in * kh * kw` features and `out = C_out` maps every patch to one output pixel:
//!
//! ```text
//! y[b, :, oh, ow] = KANLinear(patch(b, oh, ow)),
//! patch(b, oh, ow)[(c * kh + i) * kw + j] = x[b, c, oh*sh - ph + i*dh, ow*sw - pw + j*dw]
//! ```
//!
//! (0 outside the image: padded values go through SiLU and the bases as zeros), with
//! `Ho = (H + 2 ph - dh (kh - 1) - 1) / sh + 1` and `Wo` likewise. The knots and parameters are
//! the KANLinear's over F features ([`KanConv2dDesc::kan_linear`](crate::KanLayer::kan_linear)),
//! so [`KanParams`](crate::KanParams), [`KanHostParams`](crate::KanHostParams) and the argument
//! structs are KANLinear's. x may also be `[C_in, H, W]` (one image; y is then
//! `[C_out, Ho, Wo]`). Neither the patches nor the bases are stored for the batch.
use crate::error::{check, Result};
use crate::kan::{kan_raw_impl, spline_options, KanLayer, KanLinearDesc, KanPlan};
use crate::layer::{self, init_with};
use crate::tensor::Float;
use kfuse_sys as sys;

/// Saturating `usize` to `i64`, so that the library rejects an out-of-range value itself.
fn sat64(v: usize) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Saturating `u32` to `i32`, likewise.
fn sat32(v: u32) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}

/// Describes a KANConv2d layer (`kf_kan_conv2d_desc`). Pairs are `(height, width)`. Stride,
/// padding, dilation, `grid_size`, `spline_order` and `standalone_scale` start at the library's
/// defaults (`kf_kan_conv2d_desc_init`: 1, 0, 1, 5, 3, on). Nothing is checked here:
/// [`KanPlan::new`] passes it to the library, whose error names the field.
///
/// ```
/// let d = kfuse::KanConv2dDesc::new(3, 8, (3, 3)).stride((2, 2)).padding((1, 1)).grid_size(4);
/// assert_eq!(d.num_features(), 27); // F = C_in * kh * kw
/// assert_eq!(d.output_size(28, 28), Some((14, 14)));
/// assert_eq!(d.x_shape(16, 28, 28), [16, 3, 28, 28]);
/// assert_eq!(d.y_shape(16, 28, 28), [16, 8, 14, 14]);
/// assert_eq!(d.grid_shape(), [27, 11]);
/// assert_eq!(d.spline_weight_shape(), [8, 27, 7]);
/// assert_eq!(kfuse::KanConv2dDesc::new(1, 1, (5, 5)).output_size(4, 9), None); // too small
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KanConv2dDesc {
    in_channels: usize,
    out_channels: usize,
    kernel: (u32, u32),
    stride: (u32, u32),
    padding: (u32, u32),
    dilation: (u32, u32),
    grid_size: u32,
    spline_order: u32,
    standalone_scale: bool,
}

impl KanConv2dDesc {
    /// A layer from `in_channels` to `out_channels` with a `kernel = (kh, kw)` kernel; stride 1,
    /// no padding, dilation 1, the default grid (G = 5, k = 3) and a standalone spline scaler.
    pub fn new(in_channels: usize, out_channels: usize, kernel: (u32, u32)) -> KanConv2dDesc {
        let d = init_with(sys::kf_kan_conv2d_desc_init);
        let pair =
            |h: i32, w: i32, dflt: u32| (u32::try_from(h).unwrap_or(dflt), u32::try_from(w).unwrap_or(dflt));
        KanConv2dDesc {
            in_channels,
            out_channels,
            kernel,
            stride: pair(d.stride_h, d.stride_w, 1),
            padding: pair(d.pad_h, d.pad_w, 0),
            dilation: pair(d.dilation_h, d.dilation_w, 1),
            grid_size: u32::try_from(d.grid_size).unwrap_or(5),
            spline_order: u32::try_from(d.spline_order).unwrap_or(3),
            standalone_scale: d.standalone_scale != 0,
        }
    }
    /// `(sh, sw)`, the step between patches (>= 1).
    pub fn stride(mut self, s: (u32, u32)) -> Self {
        self.stride = s;
        self
    }
    /// `(ph, pw)`, the zeros added on each side of the image.
    pub fn padding(mut self, p: (u32, u32)) -> Self {
        self.padding = p;
        self
    }
    /// `(dh, dw)`, the step between the taps of a patch (>= 1).
    pub fn dilation(mut self, d: (u32, u32)) -> Self {
        self.dilation = d;
        self
    }
    spline_options!();

    /// C_in.
    pub fn in_channels(&self) -> usize {
        self.in_channels
    }
    /// C_out.
    pub fn out_channels(&self) -> usize {
        self.out_channels
    }
    /// `(kh, kw)`.
    pub fn kernel_size(&self) -> (u32, u32) {
        self.kernel
    }
    /// `(sh, sw)`.
    pub fn get_stride(&self) -> (u32, u32) {
        self.stride
    }
    /// `(ph, pw)`.
    pub fn get_padding(&self) -> (u32, u32) {
        self.padding
    }
    /// `(dh, dw)`.
    pub fn get_dilation(&self) -> (u32, u32) {
        self.dilation
    }
    /// F = C_in * kh * kw, the features of a patch (the per-patch KANLinear's `in`).
    pub fn num_features(&self) -> usize {
        self.in_channels * self.kernel.0 as usize * self.kernel.1 as usize
    }

    /// `(Ho, Wo)` for an image of `h x w`, as the library forms them
    /// ([`KanConv2dPlan::output_size`], torch.nn.Conv2d's formula); `None` where the library
    /// refuses the image or the descriptor (an image smaller than the dilated kernel, a zero
    /// kernel, stride or dilation).
    pub fn output_size(&self, h: usize, w: usize) -> Option<(usize, usize)> {
        layer::on_shape_context(|ctx| KanConv2dPlan::new(ctx, self).ok()?.output_size(h, w))
    }

    /// Shape of x (and dx) for `b` images of `h x w`: `[b, C_in, h, w]` (the 4-D form; one image
    /// may also be `[C_in, h, w]`).
    pub fn x_shape(&self, b: usize, h: usize, w: usize) -> [usize; 4] {
        [b, self.in_channels, h, w]
    }
    /// Shape of y (and dy) for `b` images of `h x w`: `[b, C_out, Ho, Wo]`, with
    /// [`output_size`](Self::output_size) (0, 0 where it is `None`: the library then refuses x).
    pub fn y_shape(&self, b: usize, h: usize, w: usize) -> [usize; 4] {
        let (ho, wo) = self.output_size(h, w).unwrap_or((0, 0));
        [b, self.out_channels, ho, wo]
    }
    /// Shape of the knots: `[F, G + 2k + 1]`.
    pub fn grid_shape(&self) -> [usize; 2] {
        self.kan_linear().grid_shape()
    }
    /// Shape of base_weight (and its gradient): `[C_out, F]`.
    pub fn base_weight_shape(&self) -> [usize; 2] {
        self.kan_linear().base_weight_shape()
    }
    /// Shape of spline_weight (and its gradient): `[C_out, F, G + k]`.
    pub fn spline_weight_shape(&self) -> [usize; 3] {
        self.kan_linear().spline_weight_shape()
    }
    /// Shape of spline_scaler (and its gradient): `[C_out, F]`.
    pub fn spline_scaler_shape(&self) -> [usize; 2] {
        self.kan_linear().spline_scaler_shape()
    }

    /// The `kf_kan_conv2d_desc` this describes. Out-of-range values saturate so that the library
    /// rejects them with its own message.
    pub fn to_raw(&self) -> sys::kf_kan_conv2d_desc {
        let mut d = init_with(sys::kf_kan_conv2d_desc_init);
        d.in_channels = sat64(self.in_channels);
        d.out_channels = sat64(self.out_channels);
        (d.kernel_h, d.kernel_w) = (sat32(self.kernel.0), sat32(self.kernel.1));
        (d.stride_h, d.stride_w) = (sat32(self.stride.0), sat32(self.stride.1));
        (d.pad_h, d.pad_w) = (sat32(self.padding.0), sat32(self.padding.1));
        (d.dilation_h, d.dilation_w) = (sat32(self.dilation.0), sat32(self.dilation.1));
        d.grid_size = sat32(self.grid_size);
        d.spline_order = sat32(self.spline_order);
        d.standalone_scale = i32::from(self.standalone_scale);
        d
    }
}

impl KanLayer for KanConv2dDesc {
    /// The KANLinear applied to every patch: `F = C_in * kh * kw` features to `C_out`, with this
    /// layer's grid and scale.
    fn kan_linear(&self) -> KanLinearDesc {
        KanLinearDesc::new(self.num_features(), self.out_channels)
            .grid_size(self.grid_size)
            .spline_order(self.spline_order)
            .standalone_scale(self.standalone_scale)
    }
}

kan_raw_impl!(KanConv2dDesc, "KanConv2dPlan", plan: kf_kan_conv2d_plan,
    create: kf_kan_conv2d_plan_create, destroy: kf_kan_conv2d_plan_destroy,
    uniform_grid: kf_kan_conv2d_uniform_grid, update_grid: kf_kan_conv2d_update_grid,
    forward: kf_kan_conv2d_forward(kf_kan_conv2d_forward_args, kf_kan_conv2d_forward_args_init),
    backward: kf_kan_conv2d_backward(kf_kan_conv2d_backward_args, kf_kan_conv2d_backward_args_init));

/// A plan for a KANConv2d layer (`kf_kan_conv2d_plan`): [`KanPlan`] over a [`KanConv2dDesc`],
/// with the knots, parameters and argument structs of KANLinear.
///
/// ```
/// use kfuse::*;
/// let ctx = Context::cpu()?;
/// let desc = KanConv2dDesc::new(2, 4, (3, 3)).padding((1, 1)); // G = 5, k = 3, a scaler
/// let mut plan = KanConv2dPlan::new(&ctx, &desc)?;
/// let mut p = KanHostParams::zeros(&desc); // the per-patch KANLinear's, F = 18
/// p.grid = plan.uniform_grid(-1.0, 1.0)?;
/// p.base_weight.iter_mut().for_each(|w| *w = 0.1);
/// p.spline_weight.iter_mut().for_each(|w| *w = 0.05);
/// p.spline_scaler.as_mut().unwrap().iter_mut().for_each(|s| *s = 1.0);
/// let (b, h, w) = (2, 5, 6);
/// assert_eq!(plan.output_size(h, w), Some((5, 6)));
/// let x = vec![0.25f32; b * 2 * h * w];
/// let mut y = vec![f32::NAN; b * 4 * h * w];
/// let fwd = KanForwardArgs::new(Tensor::new(&x, &plan.x_shape(b, h, w)), p.view(),
///                               TensorMut::new(&mut y, &plan.y_shape(b, h, w)));
/// plan.forward(&fwd)?;
/// let dy = vec![1.0f32; b * 4 * h * w];
/// let mut dx = vec![0.0f32; x.len()];
/// let mut grads = KanHostParams::zeros(&desc);
/// let bwd = KanBackwardArgs::from_forward(&fwd, Tensor::new(&dy, &plan.y_shape(b, h, w)))
///     .dx(TensorMut::new(&mut dx, &plan.x_shape(b, h, w)))
///     .dparams(&mut grads);
/// plan.backward(GradMode::Overwrite, &bwd)?;
/// drop((fwd, bwd));
/// assert!(y.iter().chain(&dx).all(|v| v.is_finite()));
/// // the centre tap of channel 0 (feature 4) is x at every output pixel: d base_weight[o, 4]
/// // is the sum over the b * h * w pixels of SiLU(0.25) (dy = 1)
/// let silu = 0.25f32 / (1.0 + (-0.25f32).exp());
/// assert!((grads.base_weight[4] - (b * h * w) as f32 * silu).abs() < 1e-4);
/// # Ok::<(), kfuse::Error>(())
/// ```
///
/// ```compile_fail
/// fn need_send<T: Send>() {}
/// need_send::<kfuse::KanConv2dPlan<'static>>();
/// ```
pub type KanConv2dPlan<'ctx, T = f32> = KanPlan<'ctx, KanConv2dDesc, T>;

impl<'ctx, T: Float> KanConv2dPlan<'ctx, T> {
    /// `(Ho, Wo)` for an image of `h x w`, as the library forms them (`kf_kan_conv2d_output_size`,
    /// torch.nn.Conv2d's formula); `None` for an image it refuses (an empty output, an extent
    /// out of range).
    pub fn output_size(&self, h: usize, w: usize) -> Option<(usize, usize)> {
        let (mut ho, mut wo) = (0i64, 0i64);
        // SAFETY: valid plan and out-pointers.
        let st =
            unsafe { sys::kf_kan_conv2d_output_size(self.as_raw(), sat64(h), sat64(w), &mut ho, &mut wo) };
        check(st).ok()?;
        Some((ho as usize, wo as usize))
    }
    /// Shape of x for `b` images of `h x w`, `[b, C_in, h, w]` (as [`KanConv2dDesc::x_shape`]).
    pub fn x_shape(&self, b: usize, h: usize, w: usize) -> [usize; 4] {
        self.desc().x_shape(b, h, w)
    }
    /// Shape of y for `b` images of `h x w`, `[b, C_out, Ho, Wo]` with the library's
    /// [`output_size`](Self::output_size) (0, 0 where it is `None`: the library then refuses x).
    pub fn y_shape(&self, b: usize, h: usize, w: usize) -> [usize; 4] {
        let (ho, wo) = self.output_size(h, w).unwrap_or((0, 0));
        [b, self.desc().out_channels, ho, wo]
    }

    /// Bytes of scratch that forward and backward need for `batch` images of `height x width`
    /// (batch 1 for an unbatched x); bounded by tiles (on the CPU, for at most 16 output
    /// channels: by one image's B-spline windows per thread), not by the patches or the bases of
    /// the batch. The safe calls take it from the context's arena;
    /// [`forward_raw`](KanPlan::forward_raw) and [`backward_raw`](KanPlan::backward_raw) accept a
    /// caller buffer of this size.
    pub fn workspace_size(&self, batch: usize, height: usize, width: usize) -> Result<usize> {
        let mut ws = 0usize;
        // SAFETY: valid plan and out-pointer.
        check(unsafe {
            sys::kf_kan_conv2d_workspace_size(
                self.as_raw(),
                sat64(batch),
                sat64(height),
                sat64(width),
                &mut ws,
            )
        })?;
        Ok(ws)
    }
}
