//! Recurrent layers: GRU (torch.nn.GRU semantics) and A-GRU, as `kf_rnn_plan`.
use crate::context::{Context, Device};
use crate::error::{check, Error, Result, Status};
use crate::grad::GradMode;
use crate::layer::{self, WeightInfo};
use crate::tensor::{absent, Float, Tensor, TensorMut};
use kfuse_sys as sys;
use std::alloc::{self, Layout};
use std::ffi::c_void;
use std::marker::PhantomData;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU64, Ordering};

/// Alignment of the reserve buffers this crate allocates (the library's own rule).
const RESERVE_ALIGN: usize = sys::KF_ALIGN_BYTES as usize;

/// The recurrent cell of every layer of a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cell {
    /// `torch.nn.GRU` (gate order r, z, n).
    Gru,
    /// Antisymmetric GRU: `h' = h + eps * z * tanh(V_h x + b_h + (W_h - W_h^T - gamma I)(r * h))`.
    Agru,
}

/// Whether a forward call keeps what backward needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// `KF_MODE_INFERENCE`: no reserve written, no dropout.
    Inference,
    /// `KF_MODE_TRAINING`: writes the reserve that backward reads; dropout applied.
    Training,
}

impl Mode {
    fn raw(self) -> sys::kf_mode {
        match self {
            Mode::Inference => sys::kf_mode_KF_MODE_INFERENCE,
            Mode::Training => sys::kf_mode_KF_MODE_TRAINING,
        }
    }
}

/// Describes a stack of recurrent layers (`kf_rnn_desc`). Defaults are the library's own
/// (`kf_rnn_desc_init`): 1 layer, sequence-first, one direction, no dropout, gamma 0.01.
/// Nothing is checked here: [`RnnPlan::new`] passes it to the library, whose error names the
/// field.
///
/// ```
/// let d = kfuse::RnnDesc::gru(28, 128).layers(2).batch_first(true).dropout(0.1);
/// assert_eq!(d.num_layers(), 2);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct RnnDesc {
    cell: Cell,
    input_size: usize,
    hidden_size: usize,
    num_layers: u32,
    batch_first: bool,
    bidirectional: bool,
    dropout: f32,
    gamma: f32,
}

impl RnnDesc {
    /// `cell` layers mapping `input_size` features to `hidden_size` state.
    pub fn new(cell: Cell, input_size: usize, hidden_size: usize) -> RnnDesc {
        let d = raw_desc_defaults();
        RnnDesc {
            cell,
            input_size,
            hidden_size,
            num_layers: d.num_layers.max(0) as u32,
            batch_first: d.flags & sys::KF_RNN_BATCH_FIRST != 0,
            bidirectional: d.flags & sys::KF_RNN_BIDIRECTIONAL != 0,
            dropout: d.dropout,
            gamma: d.gamma,
        }
    }
    /// A GRU (`torch.nn.GRU(input_size, hidden_size)`).
    pub fn gru(input_size: usize, hidden_size: usize) -> RnnDesc {
        RnnDesc::new(Cell::Gru, input_size, hidden_size)
    }
    /// An A-GRU.
    pub fn agru(input_size: usize, hidden_size: usize) -> RnnDesc {
        RnnDesc::new(Cell::Agru, input_size, hidden_size)
    }
    /// Number of stacked layers L (>= 1).
    pub fn layers(mut self, num_layers: u32) -> Self {
        self.num_layers = num_layers;
        self
    }
    /// x and y are `[B, T, .]` instead of `[T, B, .]`.
    pub fn batch_first(mut self, yes: bool) -> Self {
        self.batch_first = yes;
        self
    }
    /// Two directions (GRU only; an A-GRU plan rejects it with `Unsupported`).
    pub fn bidirectional(mut self, yes: bool) -> Self {
        self.bidirectional = yes;
        self
    }
    /// Dropout probability in [0, 1) on every layer's output but the last, in training only.
    pub fn dropout(mut self, p: f32) -> Self {
        self.dropout = p;
        self
    }
    /// The A-GRU diffusion constant in `A = W_h - W_h^T - gamma I`.
    pub fn gamma(mut self, gamma: f32) -> Self {
        self.gamma = gamma;
        self
    }

    /// The cell.
    pub fn cell(&self) -> Cell {
        self.cell
    }
    /// I.
    pub fn input_size(&self) -> usize {
        self.input_size
    }
    /// H.
    pub fn hidden_size(&self) -> usize {
        self.hidden_size
    }
    /// L.
    pub fn num_layers(&self) -> u32 {
        self.num_layers
    }
    /// Whether x and y are batch-first.
    pub fn is_batch_first(&self) -> bool {
        self.batch_first
    }
    /// (T, B) of an input of shape `x_shape`: `[T, B, input_size]`, or `[B, T, input_size]`
    /// batch-first; `None` when it is not 3-D. The one place the Rust crates read that rule
    /// (the Python bindings' is `kfuse._lowlevel.rnn_seq_dims`); the extents are kfuse's to check.
    ///
    /// ```
    /// let d = kfuse::RnnDesc::gru(28, 128).batch_first(true);
    /// assert_eq!(d.steps_and_batch(&[64, 10, 28]), Some((10, 64)));
    /// assert_eq!(d.steps_and_batch(&[10, 28]), None);
    /// ```
    pub fn steps_and_batch(&self, x_shape: &[usize]) -> Option<(usize, usize)> {
        match *x_shape {
            [a, b, _] if self.batch_first => Some((b, a)),
            [a, b, _] => Some((a, b)),
            _ => None,
        }
    }
    /// Whether there are two directions.
    pub fn is_bidirectional(&self) -> bool {
        self.bidirectional
    }
    /// D, the number of directions (1 or 2).
    pub fn num_directions(&self) -> usize {
        if self.bidirectional {
            2
        } else {
            1
        }
    }
    /// Dropout probability.
    pub fn dropout_p(&self) -> f32 {
        self.dropout
    }
    /// gamma.
    pub fn gamma_value(&self) -> f32 {
        self.gamma
    }

    /// The `kf_rnn_desc` this describes. Out-of-range values saturate so that the library
    /// rejects them with its own message.
    pub fn to_raw(&self) -> sys::kf_rnn_desc {
        let mut d = raw_desc_defaults();
        d.cell = match self.cell {
            Cell::Gru => sys::kf_rnn_cell_KF_RNN_GRU,
            Cell::Agru => sys::kf_rnn_cell_KF_RNN_AGRU,
        } as i32;
        d.num_layers = i32::try_from(self.num_layers).unwrap_or(i32::MAX);
        d.input_size = i64::try_from(self.input_size).unwrap_or(i64::MAX);
        d.hidden_size = i64::try_from(self.hidden_size).unwrap_or(i64::MAX);
        d.flags = 0;
        if self.batch_first {
            d.flags |= sys::KF_RNN_BATCH_FIRST;
        }
        if self.bidirectional {
            d.flags |= sys::KF_RNN_BIDIRECTIONAL;
        }
        d.dropout = self.dropout;
        d.gamma = self.gamma;
        d
    }
}

fn raw_desc_defaults() -> sys::kf_rnn_desc {
    layer::init_with(sys::kf_rnn_desc_init)
}

/// Bytes a call needs, from [`RnnPlan::workspace_size`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkspaceSize {
    /// Scratch for forward and backward (served by the context's arena in the safe calls).
    pub workspace_bytes: usize,
    /// Reserve a training forward writes and backward reads (0 for inference).
    pub reserve_bytes: usize,
}

#[derive(Clone, Copy, Debug)]
enum WeightSrc<'a, T: Float> {
    Slices(&'a [&'a [T]]),
    Vecs(&'a [Vec<T>]),
    Raw(&'a [*const T]),
}

/// The weights of a call, in the plan's canonical order ([`RnnPlan::weight_info`]); each entry's
/// shape is taken from the plan. Made from host data (`&[&[T]]`, `&[Vec<T>]`) or, unsafely,
/// from raw pointers; `T` is the plan's element type (`f32` unless the plan is `f64`).
#[derive(Clone, Copy, Debug)]
pub struct Weights<'a, T: Float = f32>(WeightSrc<'a, T>);

impl<'a, T: Float> Weights<'a, T> {
    /// Raw pointers, one per weight (device memory for a CUDA context).
    ///
    /// # Safety
    /// Each pointer must satisfy [`Tensor::from_raw`]'s contract for the shape the plan gives
    /// that weight.
    pub unsafe fn from_raw(ptrs: &'a [*const T]) -> Self {
        Weights(WeightSrc::Raw(ptrs))
    }
    fn len(&self) -> usize {
        match self.0 {
            WeightSrc::Slices(s) => s.len(),
            WeightSrc::Vecs(v) => v.len(),
            WeightSrc::Raw(r) => r.len(),
        }
    }
    /// (pointer, Some(len) for host data)
    fn get(&self, i: usize) -> (*const T, Option<usize>) {
        match self.0 {
            WeightSrc::Slices(s) => (s[i].as_ptr(), Some(s[i].len())),
            WeightSrc::Vecs(v) => (v[i].as_ptr(), Some(v[i].len())),
            WeightSrc::Raw(r) => (r[i], None),
        }
    }
}

impl<'a, T: Float> From<&'a [&'a [T]]> for Weights<'a, T> {
    fn from(s: &'a [&'a [T]]) -> Self {
        Weights(WeightSrc::Slices(s))
    }
}
impl<'a, T: Float> From<&'a Vec<&'a [T]>> for Weights<'a, T> {
    fn from(s: &'a Vec<&'a [T]>) -> Self {
        Weights(WeightSrc::Slices(s))
    }
}
impl<'a, T: Float> From<&'a [Vec<T>]> for Weights<'a, T> {
    fn from(v: &'a [Vec<T>]) -> Self {
        Weights(WeightSrc::Vecs(v))
    }
}
impl<'a, T: Float> From<&'a Vec<Vec<T>>> for Weights<'a, T> {
    fn from(v: &'a Vec<Vec<T>>) -> Self {
        Weights(WeightSrc::Vecs(v))
    }
}

/// Weight-gradient outputs of a backward call, one per weight in canonical order, borrowed
/// mutably for `'a`.
#[derive(Debug)]
pub struct WeightGrads<'a, T: Float = f32> {
    ptrs: Vec<(*mut T, Option<usize>)>,
    _borrow: PhantomData<&'a mut [T]>,
}

impl<'a, T: Float> WeightGrads<'a, T> {
    /// Host buffers.
    pub fn new<'b: 'a>(bufs: &'a mut [&'b mut [T]]) -> Self {
        WeightGrads {
            ptrs: bufs.iter_mut().map(|b| (b.as_mut_ptr(), Some(b.len()))).collect(),
            _borrow: PhantomData,
        }
    }
    /// Host buffers held as vectors (e.g. `Vec<Vec<T>>` shaped like the weights).
    pub fn from_vecs(bufs: &'a mut [Vec<T>]) -> Self {
        WeightGrads {
            ptrs: bufs.iter_mut().map(|b| (b.as_mut_ptr(), Some(b.len()))).collect(),
            _borrow: PhantomData,
        }
    }
    /// Raw pointers (device memory for a CUDA context).
    ///
    /// # Safety
    /// Each pointer must satisfy [`TensorMut::from_raw`]'s contract for the shape the plan gives
    /// that weight.
    pub unsafe fn from_raw(ptrs: &[*mut T]) -> Self {
        WeightGrads { ptrs: ptrs.iter().map(|&p| (p, None)).collect(), _borrow: PhantomData }
    }
}

/// What forward and backward both read: x, h0, the weights, lengths and the dropout key (a
/// backward call takes its forward's).
#[derive(Clone, Copy, Debug)]
struct Inputs<'a, T: Float> {
    x: Tensor<'a, T>,
    h0: Option<Tensor<'a, T>>,
    weights: Weights<'a, T>,
    lengths: Option<Tensor<'a, i32>>,
    dropout_seed: u64,
    dropout_offset: u64,
}

impl<'a, T: Float> Inputs<'a, T> {
    fn new(x: Tensor<'a, T>, weights: Weights<'a, T>) -> Self {
        Inputs { x, h0: None, weights, lengths: None, dropout_seed: 0, dropout_offset: 0 }
    }
}

/// Arguments of a forward call (`kf_rnn_forward_args`), borrowing the inputs for `'i` and the
/// outputs for `'o` (two lifetimes, so that [`BackwardArgs::from_forward`] can keep the inputs
/// while the outputs are read).
/// Shapes (`[T, B, I]` for x etc., or batch-first) are given by the caller and checked by the
/// library; [`RnnPlan::x_shape`] and friends compute them.
#[derive(Debug)]
pub struct ForwardArgs<'i, 'o, T: Float = f32> {
    inputs: Inputs<'i, T>,
    y: TensorMut<'o, T>,
    hn: Option<TensorMut<'o, T>>,
}

impl<'i, 'o, T: Float> ForwardArgs<'i, 'o, T> {
    /// Input `x`, the weights, and output `y` (every step of the last layer).
    pub fn new(x: Tensor<'i, T>, weights: impl Into<Weights<'i, T>>, y: TensorMut<'o, T>) -> Self {
        ForwardArgs { inputs: Inputs::new(x, weights.into()), y, hn: None }
    }
    /// Initial state `[L*D, B, H]` (default zeros).
    pub fn h0(mut self, h0: Tensor<'i, T>) -> Self {
        self.inputs.h0 = Some(h0);
        self
    }
    /// Output: the last state of every layer and direction, `[L*D, B, H]`.
    pub fn hn(mut self, hn: TensorMut<'o, T>) -> Self {
        self.hn = Some(hn);
        self
    }
    /// Per-sequence lengths `[B]` in 0..=T (default: all T).
    pub fn lengths(mut self, lengths: Tensor<'i, i32>) -> Self {
        self.inputs.lengths = Some(lengths);
        self
    }
    /// Key and counter offset of the dropout masks (training with dropout > 0 only).
    pub fn dropout(mut self, seed: u64, offset: u64) -> Self {
        self.inputs.dropout_seed = seed;
        self.inputs.dropout_offset = offset;
        self
    }
}

/// Arguments of a backward call (`kf_rnn_backward_args`). x, h0, weights, lengths and the
/// dropout key must be the forward's; [`BackwardArgs::from_forward`] copies them.
#[derive(Debug)]
pub struct BackwardArgs<'a, T: Float = f32> {
    inputs: Inputs<'a, T>,
    dy: Option<Tensor<'a, T>>,
    dhn: Option<Tensor<'a, T>>,
    dx: Option<TensorMut<'a, T>>,
    dh0: Option<TensorMut<'a, T>>,
    dweights: Option<WeightGrads<'a, T>>,
}

impl<'a, T: Float> BackwardArgs<'a, T> {
    /// The forward's x and weights; every gradient input and output absent.
    pub fn new(x: Tensor<'a, T>, weights: impl Into<Weights<'a, T>>) -> Self {
        BackwardArgs {
            inputs: Inputs::new(x, weights.into()),
            dy: None,
            dhn: None,
            dx: None,
            dh0: None,
            dweights: None,
        }
    }
    /// The inputs of `fwd` (x, h0, weights, lengths, dropout key).
    pub fn from_forward(fwd: &ForwardArgs<'a, '_, T>) -> Self {
        let mut b = BackwardArgs::new(fwd.inputs.x, fwd.inputs.weights);
        b.inputs = fwd.inputs;
        b
    }
    /// The forward's h0.
    pub fn h0(mut self, h0: Tensor<'a, T>) -> Self {
        self.inputs.h0 = Some(h0);
        self
    }
    /// The forward's lengths.
    pub fn lengths(mut self, lengths: Tensor<'a, i32>) -> Self {
        self.inputs.lengths = Some(lengths);
        self
    }
    /// The forward's dropout key.
    pub fn dropout(mut self, seed: u64, offset: u64) -> Self {
        self.inputs.dropout_seed = seed;
        self.inputs.dropout_offset = offset;
        self
    }
    /// Gradient of the loss w.r.t. y (default zeros).
    pub fn dy(mut self, dy: Tensor<'a, T>) -> Self {
        self.dy = Some(dy);
        self
    }
    /// Gradient of the loss w.r.t. hn (default zeros).
    pub fn dhn(mut self, dhn: Tensor<'a, T>) -> Self {
        self.dhn = Some(dhn);
        self
    }
    /// Output: gradient w.r.t. x (always overwritten).
    pub fn dx(mut self, dx: TensorMut<'a, T>) -> Self {
        self.dx = Some(dx);
        self
    }
    /// Output: gradient w.r.t. h0 (always overwritten).
    pub fn dh0(mut self, dh0: TensorMut<'a, T>) -> Self {
        self.dh0 = Some(dh0);
        self
    }
    /// Output: gradients of every weight, written or accumulated per [`GradMode`].
    pub fn dweights(mut self, dweights: WeightGrads<'a, T>) -> Self {
        self.dweights = Some(dweights);
        self
    }
}

/// What a training forward leaves for backward: an owned, `KF_ALIGN_BYTES`-aligned host buffer (the
/// cuDNN reserveSpace model). Returned by [`RnnPlan::forward`] in [`Mode::Training`], borrowed by
/// [`RnnPlan::backward`]; [`RnnPlan::forward_into`] reuses one across steps without allocating.
#[derive(Debug)]
pub struct Reserve {
    ptr: *mut u8,
    capacity: usize,
    len: usize,
    written_by: Option<u64>, // id of the plan whose training forward wrote it
}

// SAFETY: plain owned host memory.
unsafe impl Send for Reserve {}
unsafe impl Sync for Reserve {}

impl Reserve {
    /// An empty reserve; the first training forward grows it.
    pub fn new() -> Reserve {
        Reserve { ptr: ptr::null_mut(), capacity: 0, len: 0, written_by: None }
    }
    /// Bytes the last training forward wrote.
    pub fn len_bytes(&self) -> usize {
        self.len
    }
    /// Bytes allocated.
    pub fn capacity_bytes(&self) -> usize {
        self.capacity
    }
    fn ensure(&mut self, bytes: usize) -> Result<()> {
        if bytes <= self.capacity {
            return Ok(());
        }
        let layout = Layout::from_size_align(bytes, RESERVE_ALIGN)
            .map_err(|_| Error::new(Status::OutOfMemory, format!("reserve of {bytes} bytes")))?;
        // SAFETY: bytes > capacity >= 0, so the layout has non-zero size. Zeroed, so the library
        // never reads uninitialised memory even from a reserve of another call.
        let p = unsafe { alloc::alloc_zeroed(layout) };
        if p.is_null() {
            return Err(Error::new(
                Status::OutOfMemory,
                format!("cannot allocate a reserve of {bytes} bytes"),
            ));
        }
        self.free();
        self.ptr = p;
        self.capacity = bytes;
        Ok(())
    }
    fn free(&mut self) {
        if !self.ptr.is_null() {
            // SAFETY: allocated in ensure() with this layout.
            unsafe {
                alloc::dealloc(self.ptr, Layout::from_size_align_unchecked(self.capacity, RESERVE_ALIGN))
            };
        }
        self.ptr = ptr::null_mut();
        self.capacity = 0;
        self.len = 0;
        self.written_by = None;
    }
}

impl Default for Reserve {
    fn default() -> Self {
        Reserve::new()
    }
}

impl Drop for Reserve {
    fn drop(&mut self) {
        self.free();
    }
}

static NEXT_PLAN_ID: AtomicU64 = AtomicU64::new(1);

/// A plan for a stack of GRU or A-GRU layers (`kf_rnn_plan`), bound to the context it borrows.
/// Destroyed on drop. Runs whole sequences forward and backward.
///
/// A plan borrows its [`Context`], which is not `Sync`, so a plan is neither `Send` nor `Sync`:
/// it stays on the thread that uses the context.
///
/// ```
/// use kfuse::{Context, RnnDesc, RnnPlan, Mode, Tensor, TensorMut, ForwardArgs};
/// let ctx = Context::cpu()?;
/// let mut plan = RnnPlan::new(&ctx, &RnnDesc::gru(3, 4))?;
/// let weights: Vec<Vec<f32>> = plan.weight_info().iter().map(|w| vec![0.1; w.numel()]).collect();
/// let (t, b) = (5, 2);
/// let x = vec![1.0f32; t * b * 3];
/// let mut y = vec![f32::NAN; t * b * 4];
/// let args = ForwardArgs::new(
///     Tensor::new(&x, &plan.x_shape(t, b)),
///     &weights,
///     TensorMut::new(&mut y, &plan.y_shape(t, b)),
/// );
/// assert!(plan.forward(Mode::Inference, &args)?.is_none());
/// drop(args);
/// assert!(y.iter().all(|v| v.is_finite()));
/// # Ok::<(), kfuse::Error>(())
/// ```
#[derive(Debug)]
pub struct RnnPlan<'ctx, T: Float = f32> {
    raw: NonNull<sys::kf_rnn_plan>,
    ctx: &'ctx Context,
    desc: RnnDesc,
    id: u64,
    info: Vec<WeightInfo>,
    wbuf: Vec<sys::kf_tensor>,  // weights of the current call, reused
    dwbuf: Vec<sys::kf_tensor>, // weight gradients of the current call, reused
    _dtype: PhantomData<T>,
}

impl<'ctx> RnnPlan<'ctx> {
    /// Creates a float32 plan on `ctx` (`kf_rnn_plan_create`). A bad descriptor gives
    /// [`Status::InvalidArgument`] naming the field; an A-GRU with two directions,
    /// [`Status::Unsupported`].
    pub fn new(ctx: &'ctx Context, desc: &RnnDesc) -> Result<RnnPlan<'ctx>> {
        Self::new_typed(ctx, desc)
    }
}

impl<'ctx, T: Float> RnnPlan<'ctx, T> {
    /// Creates a plan computing in `T` (any [`Float`]): x, h, y, the weights and every gradient
    /// of its calls hold `T` (lengths stay `i32`). A backend without `T` refuses it here with
    /// [`Status::Unsupported`] (all but `f32`: the CPU backend only).
    ///
    /// ```
    /// use kfuse::*;
    /// let ctx = Context::cpu()?;
    /// let mut plan = RnnPlan::<f64>::new_typed(&ctx, &RnnDesc::agru(2, 3))?;
    /// let w: Vec<Vec<f64>> = plan.weight_info().iter().map(|w| vec![0.1; w.numel()]).collect();
    /// let x = vec![0.5f64; 4 * 1 * 2];
    /// let mut y = vec![0.0f64; 4 * 1 * 3];
    /// let args = ForwardArgs::new(Tensor::new(&x, &plan.x_shape(4, 1)), &w,
    ///                             TensorMut::new(&mut y, &plan.y_shape(4, 1)));
    /// plan.forward(Mode::Inference, &args)?;
    /// # Ok::<(), kfuse::Error>(())
    /// ```
    pub fn new_typed(ctx: &'ctx Context, desc: &RnnDesc) -> Result<RnnPlan<'ctx, T>> {
        let d = sys::kf_rnn_desc { dtype: T::DTYPE as _, ..desc.to_raw() };
        // SAFETY: valid context handle, descriptor and out-pointer.
        let raw = layer::create_plan("kf_rnn_plan_create", |out| unsafe {
            sys::kf_rnn_plan_create(ctx.as_raw(), &d, out)
        })?;
        let mut plan = RnnPlan {
            raw,
            ctx,
            desc: desc.clone(),
            id: NEXT_PLAN_ID.fetch_add(1, Ordering::Relaxed),
            info: Vec::new(),
            wbuf: Vec::new(),
            dwbuf: Vec::new(),
            _dtype: PhantomData,
        };
        plan.info = plan.query_weight_info()?;
        plan.wbuf = vec![absent(); plan.info.len()];
        plan.dwbuf = vec![absent(); plan.info.len()];
        Ok(plan)
    }

    fn query_weight_info(&self) -> Result<Vec<WeightInfo>> {
        layer::param_list(self.raw.as_ptr(), sys::kf_rnn_weight_count, sys::kf_rnn_weight_info)
    }

    /// The descriptor the plan was made from.
    pub fn desc(&self) -> &RnnDesc {
        &self.desc
    }
    /// The context the plan runs on.
    pub fn context(&self) -> &'ctx Context {
        self.ctx
    }
    /// Number of weight tensors a call takes (L*D*4 for a GRU, L*10 for an A-GRU).
    pub fn weight_count(&self) -> usize {
        self.info.len()
    }
    /// Name and shape of every weight, in the canonical order calls take them.
    pub fn weight_info(&self) -> Vec<WeightInfo> {
        self.info.clone()
    }

    /// Shape of x for T steps of B samples: `[T, B, I]`, or `[B, T, I]` batch-first.
    pub fn x_shape(&self, t: usize, b: usize) -> [usize; 3] {
        let y = self.y_shape(t, b);
        if y == [0; 3] {
            return y;
        }
        // x has y's layout with I columns.
        [y[0], y[1], self.desc.input_size]
    }
    /// Shape of y (and dy): `[T, B, D*H]`, or `[B, T, D*H]` batch-first, as the library gives it
    /// (`kf_rnn_output_shapes`); `[0, 0, 0]` for extents it refuses (T or B of 0, or too large),
    /// which a call then reports by name.
    pub fn y_shape(&self, t: usize, b: usize) -> [usize; 3] {
        self.output_shapes(t, b).0
    }
    /// Shape of h0, hn and their gradients: `[L*D, B, H]`, as the library gives it; `[0, 0, 0]`
    /// for a B it refuses.
    pub fn state_shape(&self, b: usize) -> [usize; 3] {
        self.output_shapes(1, b).1
    }
    fn output_shapes(&self, t: usize, b: usize) -> ([usize; 3], [usize; 3]) {
        let (mut y, mut hn) = ([0i64; 3], [0i64; 3]);
        // SAFETY: valid plan; each out-array has the 3 entries the call writes.
        let st = unsafe {
            sys::kf_rnn_output_shapes(
                self.raw.as_ptr(),
                i64::try_from(t).unwrap_or(i64::MAX),
                i64::try_from(b).unwrap_or(i64::MAX),
                y.as_mut_ptr(),
                hn.as_mut_ptr(),
            )
        };
        if check(st).is_err() {
            return ([0; 3], [0; 3]);
        }
        (y.map(|v| v as usize), hn.map(|v| v as usize))
    }

    /// Bytes of scratch and reserve a call on T steps of B samples needs in `mode`.
    pub fn workspace_size(&self, t: usize, b: usize, mode: Mode) -> Result<WorkspaceSize> {
        let (mut ws, mut rs) = (0usize, 0usize);
        // SAFETY: valid plan and out-pointers.
        check(unsafe {
            sys::kf_rnn_workspace_size(
                self.raw.as_ptr(),
                i64::try_from(t).unwrap_or(i64::MAX),
                i64::try_from(b).unwrap_or(i64::MAX),
                mode.raw(),
                &mut ws,
                &mut rs,
            )
        })?;
        Ok(WorkspaceSize { workspace_bytes: ws, reserve_bytes: rs })
    }

    /// Runs the layers over the whole sequence with scratch from the context's arena. In
    /// [`Mode::Training`] returns the [`Reserve`] that [`backward`](Self::backward) needs (host
    /// memory, so CPU contexts only: on CUDA use [`forward_raw`](Self::forward_raw)); in
    /// [`Mode::Inference`] returns `None`.
    pub fn forward(&mut self, mode: Mode, args: &ForwardArgs<'_, '_, T>) -> Result<Option<Reserve>> {
        match mode {
            Mode::Inference => {
                // SAFETY: no caller buffers; every view in args is valid by construction.
                unsafe {
                    self.forward_impl("RnnPlan::forward", mode, args, ptr::null_mut(), 0, ptr::null_mut(), 0)?
                };
                Ok(None)
            }
            Mode::Training => {
                let mut r = Reserve::new();
                self.forward_into(mode, args, &mut r)?;
                Ok(Some(r))
            }
        }
    }

    /// As [`forward`](Self::forward), writing a training forward's reserve into `reserve`, which
    /// grows only when this shape needs more than it holds (a steady-state loop allocates
    /// nothing). In [`Mode::Inference`] `reserve` is only marked unwritten.
    pub fn forward_into(
        &mut self,
        mode: Mode,
        args: &ForwardArgs<'_, '_, T>,
        reserve: &mut Reserve,
    ) -> Result<()> {
        const CALL: &str = "RnnPlan::forward";
        reserve.written_by = None;
        reserve.len = 0;
        if mode == Mode::Inference {
            // SAFETY: as in forward().
            return unsafe { self.forward_impl(CALL, mode, args, ptr::null_mut(), 0, ptr::null_mut(), 0) };
        }
        if let Device::Cuda(_) = self.ctx.device() {
            return Err(Error::new(
                Status::Unsupported,
                format!("{CALL}: the owned Reserve is host memory and the context is CUDA; use forward_raw with a device reserve"),
            ));
        }
        // Size the reserve from x's shape; if x is malformed, the call below reports it.
        let mut need = 0usize;
        if let Some((t, b)) = self.desc.steps_and_batch(args.inputs.x.shape()) {
            // A failed size query (e.g. T = 0) is left to the forward call, whose message names
            // the argument; the reserve stays as it is and the library checks its size.
            if let Ok(sz) = self.workspace_size(t, b, Mode::Training) {
                need = sz.reserve_bytes;
                reserve.ensure(need)?;
            }
        }
        // SAFETY: the reserve is host memory of `capacity` bytes, `KF_ALIGN_BYTES`-aligned, on a CPU context.
        unsafe {
            self.forward_impl(
                CALL,
                mode,
                args,
                ptr::null_mut(),
                0,
                reserve.ptr as *mut c_void,
                reserve.capacity,
            )?;
        }
        reserve.len = need;
        reserve.written_by = Some(self.id);
        Ok(())
    }

    /// Gradients of x, h0 and every weight (A-GRU: including epsilon) from the reserve that a
    /// training forward of this plan on the same inputs wrote.
    pub fn backward(
        &mut self,
        grad_mode: GradMode,
        args: &BackwardArgs<'_, T>,
        reserve: &Reserve,
    ) -> Result<()> {
        const CALL: &str = "RnnPlan::backward";
        if reserve.written_by != Some(self.id) {
            return Err(Error::invalid(format!(
                "{CALL}: reserve was not written by a Mode::Training forward of this plan"
            )));
        }
        // SAFETY: the reserve holds what the library wrote (len bytes), on a CPU context.
        unsafe {
            self.backward_impl(
                CALL,
                grad_mode,
                args,
                ptr::null_mut(),
                0,
                reserve.ptr as *const c_void,
                reserve.len,
            )
        }
    }

    /// `kf_rnn_forward` with caller-provided workspace and reserve, e.g. device memory on a CUDA
    /// context. A null workspace with 0 bytes uses the context's arena; the reserve may be null
    /// in [`Mode::Inference`].
    ///
    /// # Safety
    /// `workspace` and `reserve` must be null or point to at least `workspace_bytes` /
    /// `reserve_bytes` writable bytes on the context's device, `KF_ALIGN_BYTES`-aligned, not used by anyone
    /// else until the call's work has finished (on CUDA: on the context's stream).
    pub unsafe fn forward_raw(
        &mut self,
        mode: Mode,
        args: &ForwardArgs<'_, '_, T>,
        workspace: *mut c_void,
        workspace_bytes: usize,
        reserve: *mut c_void,
        reserve_bytes: usize,
    ) -> Result<()> {
        self.forward_impl(
            "RnnPlan::forward_raw",
            mode,
            args,
            workspace,
            workspace_bytes,
            reserve,
            reserve_bytes,
        )
    }

    /// `kf_rnn_backward` with caller-provided workspace and reserve.
    ///
    /// # Safety
    /// As [`forward_raw`](Self::forward_raw); `reserve` must hold what a training forward of this
    /// plan wrote for the same inputs.
    pub unsafe fn backward_raw(
        &mut self,
        grad_mode: GradMode,
        args: &BackwardArgs<'_, T>,
        workspace: *mut c_void,
        workspace_bytes: usize,
        reserve: *const c_void,
        reserve_bytes: usize,
    ) -> Result<()> {
        self.backward_impl(
            "RnnPlan::backward_raw",
            grad_mode,
            args,
            workspace,
            workspace_bytes,
            reserve,
            reserve_bytes,
        )
    }

    /// The raw handle, for calls into `kfuse-sys`. It stays owned by `self`.
    pub fn as_raw(&self) -> *mut sys::kf_rnn_plan {
        self.raw.as_ptr()
    }

    fn fill_weights(&mut self, call: &str, w: &Weights<'_, T>) -> Result<()> {
        if w.len() != self.info.len() {
            return Err(Error::invalid(format!(
                "{call}: args.weights has {} entries, expected {} (RnnPlan::weight_count)",
                w.len(),
                self.info.len()
            )));
        }
        for i in 0..self.info.len() {
            let (p, len) = w.get(i);
            let name = format!("args.weights[{i}] ({})", self.info[i].name);
            // SAFETY: p/len come from a slice borrowed for the call's arguments, or from
            // Weights::from_raw's promise.
            let t = unsafe { Tensor::from_parts(p, len, &self.info[i].shape) };
            self.wbuf[i] = t.raw(call, &name, self.ctx)?;
        }
        Ok(())
    }

    fn fill_dweights(&mut self, call: &str, g: &WeightGrads<'_, T>) -> Result<()> {
        if g.ptrs.len() != self.info.len() {
            return Err(Error::invalid(format!(
                "{call}: args.dweights has {} entries, expected {} (RnnPlan::weight_count)",
                g.ptrs.len(),
                self.info.len()
            )));
        }
        for (i, &(p, len)) in g.ptrs.iter().enumerate() {
            let name = format!("args.dweights[{i}] ({})", self.info[i].name);
            // SAFETY: p/len come from a slice borrowed mutably for the arguments' lifetime
            // (WeightGrads::new) or from WeightGrads::from_raw's promise.
            let t = unsafe { TensorMut::from_parts(p, len, &self.info[i].shape) };
            self.dwbuf[i] = t.raw(call, &name, self.ctx)?;
        }
        Ok(())
    }

    /// The raw x, h0 and lengths of `inp`, its weights into `wbuf`: the inputs forward and
    /// backward share, checked in the same order by both.
    fn fill_inputs(&mut self, call: &str, inp: &Inputs<'_, T>) -> Result<RawInputs> {
        let ctx = self.ctx;
        let x = inp.x.raw(call, "args.x", ctx)?;
        let h0 = layer::opt_in(&inp.h0, call, "args.h0", ctx)?;
        self.fill_weights(call, &inp.weights)?;
        let lengths = match &inp.lengths {
            Some(l) => l.raw(call, "args.lengths", ctx)?,
            None => absent(),
        };
        Ok(RawInputs { x, h0, lengths })
    }

    #[allow(clippy::too_many_arguments)]
    unsafe fn forward_impl(
        &mut self,
        call: &str,
        mode: Mode,
        args: &ForwardArgs<'_, '_, T>,
        ws: *mut c_void,
        ws_bytes: usize,
        rs: *mut c_void,
        rs_bytes: usize,
    ) -> Result<()> {
        let ctx = self.ctx;
        let mut a: sys::kf_rnn_forward_args = layer::init_with(sys::kf_rnn_forward_args_init);
        let inp = self.fill_inputs(call, &args.inputs)?;
        (a.x, a.h0, a.lengths) = (inp.x, inp.h0, inp.lengths);
        a.weights = self.wbuf.as_ptr();
        a.num_weights = self.wbuf.len() as i32;
        a.dropout_seed = args.inputs.dropout_seed;
        a.dropout_offset = args.inputs.dropout_offset;
        a.y = args.y.raw(call, "args.y", ctx)?;
        a.hn = layer::opt_out(&args.hn, call, "args.hn", ctx)?;
        check(sys::kf_rnn_forward(self.raw.as_ptr(), mode.raw(), &a, ws, ws_bytes, rs, rs_bytes))
    }

    #[allow(clippy::too_many_arguments)]
    unsafe fn backward_impl(
        &mut self,
        call: &str,
        grad_mode: GradMode,
        args: &BackwardArgs<'_, T>,
        ws: *mut c_void,
        ws_bytes: usize,
        rs: *const c_void,
        rs_bytes: usize,
    ) -> Result<()> {
        let ctx = self.ctx;
        let mut a: sys::kf_rnn_backward_args = layer::init_with(sys::kf_rnn_backward_args_init);
        let inp = self.fill_inputs(call, &args.inputs)?;
        (a.x, a.h0, a.lengths) = (inp.x, inp.h0, inp.lengths);
        a.weights = self.wbuf.as_ptr();
        a.num_weights = self.wbuf.len() as i32;
        a.dropout_seed = args.inputs.dropout_seed;
        a.dropout_offset = args.inputs.dropout_offset;
        a.dy = layer::opt_in(&args.dy, call, "args.dy", ctx)?;
        a.dhn = layer::opt_in(&args.dhn, call, "args.dhn", ctx)?;
        a.dx = layer::opt_out(&args.dx, call, "args.dx", ctx)?;
        a.dh0 = layer::opt_out(&args.dh0, call, "args.dh0", ctx)?;
        if let Some(g) = &args.dweights {
            self.fill_dweights(call, g)?;
            a.dweights = self.dwbuf.as_ptr();
            a.num_dweights = self.dwbuf.len() as i32;
        }
        check(sys::kf_rnn_backward(self.raw.as_ptr(), grad_mode.raw(), &a, ws, ws_bytes, rs, rs_bytes))
    }
}

/// The raw tensors of an [`Inputs`] (the weights live in the plan's `wbuf`).
struct RawInputs {
    x: sys::kf_tensor,
    h0: sys::kf_tensor,
    lengths: sys::kf_tensor,
}

impl<T: Float> Drop for RnnPlan<'_, T> {
    fn drop(&mut self) {
        // SAFETY: created by kf_rnn_plan_create, destroyed once, before its context (borrowed).
        unsafe { sys::kf_rnn_plan_destroy(self.raw.as_ptr()) }
    }
}
