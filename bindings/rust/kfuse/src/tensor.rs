//! Borrowed tensor views: a data pointer and a row-major shape, like `kf_tensor`.
use crate::context::{Context, Device};
use crate::error::{check, Error, Result};
use kfuse_sys as sys;
use std::marker::PhantomData;

const MAX_DIMS: usize = sys::KF_MAX_DIMS as usize;

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
    impl Sealed for i32 {}
}

/// An element type a kfuse tensor can hold: the [`Float`]s (data) and `i32` (sequence lengths).
pub trait Element: Copy + sealed::Sealed + 'static {
    /// The matching `kf_dtype`.
    const DTYPE: sys::kf_dtype;
}
impl Element for f32 {
    const DTYPE: sys::kf_dtype = sys::kf_dtype_KF_DTYPE_F32;
}
impl Element for f64 {
    const DTYPE: sys::kf_dtype = sys::kf_dtype_KF_DTYPE_F64;
}
impl Element for half::f16 {
    const DTYPE: sys::kf_dtype = sys::kf_dtype_KF_DTYPE_F16;
}
impl Element for half::bf16 {
    const DTYPE: sys::kf_dtype = sys::kf_dtype_KF_DTYPE_BF16;
}
impl Element for i32 {
    const DTYPE: sys::kf_dtype = sys::kf_dtype_KF_DTYPE_I32;
}

/// A type a layer computes in, chosen by the plan (`RnnPlan::<T>::new_typed` and the like; every
/// tensor of its calls then holds `T`):
///
/// - `f32`: every op, every backend.
/// - `f64`: every op on the CPU backend (library 1.4 and later).
/// - [`half::bf16`] and [`half::f16`] (the `half` crate, re-exported as [`kfuse::half`]): every
///   op on the CPU backend (library 1.5 and later). Storage only: the tensors hold the 16-bit
///   type, the arithmetic is float32, and each result is the float32 one rounded once to nearest
///   even, so it is within about the type's unit roundoff (2^-8 bfloat16, 2^-11 float16) of
///   float32's, relative to the output's norm (docs/precision.md). Workspace sizes include the
///   float32 copies.
///
/// A plan whose backend cannot run `T` is refused at creation with [`Status::Unsupported`] (the
/// library's message names `desc->dtype`), before any call. Library 1.7 runs every element type
/// on both backends (CUDA: `bf16` and `f16` since 1.6, `f64` since 1.7); an older library
/// refuses those on a CUDA context.
/// Descriptor scalars (`RnnDesc::gamma`, `dropout`, the grid arguments) stay `f32` whatever `T`.
///
/// An example: [the crate docs](crate#element-types).
///
/// [`Status::Unsupported`]: crate::Status::Unsupported
/// [`kfuse::half`]: crate::half
pub trait Float: Element + Default {}
impl Float for f32 {}
impl Float for f64 {}
impl Float for half::f16 {}
impl Float for half::bf16 {}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shape {
    dims: [usize; MAX_DIMS],
    ndim: usize, // may exceed MAX_DIMS: reported at the call
}

impl Shape {
    pub(crate) fn new(shape: &[usize]) -> Shape {
        let mut dims = [0usize; MAX_DIMS];
        for (d, s) in dims.iter_mut().zip(shape) {
            *d = *s;
        }
        Shape { dims, ndim: shape.len() }
    }
    pub(crate) fn as_slice(&self) -> &[usize] {
        &self.dims[..self.ndim.min(MAX_DIMS)]
    }
    pub(crate) fn ndim(&self) -> usize {
        self.ndim
    }
    fn numel(&self) -> Option<usize> {
        self.as_slice().iter().try_fold(1usize, |a, &d| a.checked_mul(d))
    }
}

/// A read-only view: host data borrowed for `'a` ([`Tensor::new`]) or a raw pointer, e.g. into
/// CUDA device memory ([`Tensor::from_raw`]).
///
/// The shape is row-major (last dimension fastest) in elements. For a host slice, the slice's
/// length is checked against the shape when the view is passed to a call; the shape itself is
/// checked by the library, whose error names the argument.
#[derive(Clone, Copy, Debug)]
pub struct Tensor<'a, T: Element = f32> {
    ptr: *const T,
    len: Option<usize>, // Some: a host slice of that length; None: raw, unchecked
    shape: Shape,
    _borrow: PhantomData<&'a [T]>,
}

impl<'a, T: Element> Tensor<'a, T> {
    /// A view of host memory `data` with `shape` (at most 6 dimensions). Only valid on a CPU
    /// context; a CUDA context rejects it with an error.
    pub fn new(data: &'a [T], shape: &[usize]) -> Self {
        Tensor { ptr: data.as_ptr(), len: Some(data.len()), shape: Shape::new(shape), _borrow: PhantomData }
    }

    /// A view of memory the library will read through a raw pointer: device memory for a CUDA
    /// context, host memory for a CPU context.
    ///
    /// # Safety
    /// `ptr` must point to `shape`'s product of initialised, `T`-aligned elements on the device of
    /// the context the view is passed to, valid for reads for `'a` and not written by anyone
    /// while a call that reads it runs (on CUDA: until the work enqueued on the stream finishes).
    pub unsafe fn from_raw(ptr: *const T, shape: &[usize]) -> Self {
        Tensor { ptr, len: None, shape: Shape::new(shape), _borrow: PhantomData }
    }

    /// The shape in elements.
    pub fn shape(&self) -> &[usize] {
        self.shape.as_slice()
    }

    /// `len`: Some for host memory of that many elements (checked at the call), None for raw.
    /// Safety: as `new` (a live borrow of `len` elements for 'a) or `from_raw`.
    pub(crate) unsafe fn from_parts(ptr: *const T, len: Option<usize>, shape: &[usize]) -> Self {
        Tensor { ptr, len, shape: Shape::new(shape), _borrow: PhantomData }
    }

    pub(crate) fn raw(&self, call: &str, name: &str, ctx: &Context) -> Result<sys::kf_tensor> {
        to_raw(call, name, ctx, self.ptr as *mut T, self.len, &self.shape)
    }
}

/// A writable view: host data borrowed mutably for `'a` ([`TensorMut::new`]) or a raw pointer
/// ([`TensorMut::from_raw`]). Checked as [`Tensor`] is.
#[derive(Debug)]
pub struct TensorMut<'a, T: Element = f32> {
    ptr: *mut T,
    len: Option<usize>,
    shape: Shape,
    _borrow: PhantomData<&'a mut [T]>,
}

impl<'a, T: Element> TensorMut<'a, T> {
    /// A writable view of host memory `data` with `shape`. Only valid on a CPU context.
    pub fn new(data: &'a mut [T], shape: &[usize]) -> Self {
        TensorMut {
            ptr: data.as_mut_ptr(),
            len: Some(data.len()),
            shape: Shape::new(shape),
            _borrow: PhantomData,
        }
    }

    /// A writable view through a raw pointer (device memory for a CUDA context).
    ///
    /// # Safety
    /// As [`Tensor::from_raw`], and valid for writes, with no other view of the same memory
    /// used while a call that writes it runs.
    pub unsafe fn from_raw(ptr: *mut T, shape: &[usize]) -> Self {
        TensorMut { ptr, len: None, shape: Shape::new(shape), _borrow: PhantomData }
    }

    /// The shape in elements.
    pub fn shape(&self) -> &[usize] {
        self.shape.as_slice()
    }

    /// As `Tensor::from_parts`, for writing.
    pub(crate) unsafe fn from_parts(ptr: *mut T, len: Option<usize>, shape: &[usize]) -> Self {
        TensorMut { ptr, len, shape: Shape::new(shape), _borrow: PhantomData }
    }

    pub(crate) fn raw(&self, call: &str, name: &str, ctx: &Context) -> Result<sys::kf_tensor> {
        to_raw(call, name, ctx, self.ptr, self.len, &self.shape)
    }
}

/// An absent tensor (`data` NULL): for optional arguments left out.
pub(crate) fn absent() -> sys::kf_tensor {
    sys::kf_tensor {
        data: std::ptr::null_mut(),
        dtype: 0,
        ndim: 0,
        shape: [0; MAX_DIMS],
        strides: [0; MAX_DIMS],
    }
}

pub(crate) fn host_on_cuda(call: &str, name: &str) -> Error {
    Error::invalid(format!(
        "{call}: {name} is host memory (a Rust slice) but the context is CUDA; pass device memory \
         through the unsafe from_raw constructors"
    ))
}

fn to_raw<T: Element>(
    call: &str,
    name: &str,
    ctx: &Context,
    ptr: *mut T,
    len: Option<usize>,
    shape: &Shape,
) -> Result<sys::kf_tensor> {
    if shape.ndim() > MAX_DIMS {
        return Err(Error::invalid(format!(
            "{call}: {name} has {} dimensions, expected at most {MAX_DIMS}",
            shape.ndim()
        )));
    }
    if let Some(len) = len {
        if let Device::Cuda(_) = ctx.device() {
            return Err(host_on_cuda(call, name));
        }
        // The one check the library cannot make: that the host slice holds the elements the
        // shape promises. Everything about the shape itself is checked in C.
        match shape.numel() {
            Some(n) if n == len => {}
            n => {
                let need = n.map_or_else(|| "overflowing".to_string(), |n| n.to_string());
                return Err(Error::invalid(format!(
                    "{call}: {name} has {len} elements, but its shape {:?} needs {need}",
                    shape.as_slice()
                )));
            }
        }
    }
    let mut ext = [0i64; MAX_DIMS];
    for (e, &d) in ext.iter_mut().zip(shape.as_slice()) {
        *e = i64::try_from(d).unwrap_or(i64::MAX);
    }
    let mut t = absent();
    // SAFETY: t and ext are valid; kf_tensor_init only fills t.
    check(unsafe {
        sys::kf_tensor_init(&mut t, ptr as *mut _, T::DTYPE, shape.ndim() as i32, ext.as_ptr())
    })?;
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_is_checked_against_the_shape() {
        let ctx = Context::cpu().unwrap();
        let data = [0.0f32; 6];
        assert!(Tensor::new(&data, &[2, 3]).raw("f", "a", &ctx).is_ok());
        let e = Tensor::new(&data, &[2, 4]).raw("f", "a", &ctx).unwrap_err();
        assert_eq!(e.message(), "f: a has 6 elements, but its shape [2, 4] needs 8");
        let e = Tensor::new(&data, &[usize::MAX, 2]).raw("f", "a", &ctx).unwrap_err();
        assert!(e.message().contains("needs overflowing"), "{e}");
        let t = Tensor::new(&data, &[3, 2]).raw("f", "a", &ctx).unwrap();
        assert_eq!((t.ndim, t.shape[0], t.shape[1], t.strides[0], t.strides[1]), (2, 3, 2, 2, 1));
        assert_eq!(t.dtype as u32, sys::kf_dtype_KF_DTYPE_F32);
    }
}
