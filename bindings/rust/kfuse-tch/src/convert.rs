//! `tch::Tensor` <-> kfuse views: checks (defined, float32, device), contiguity, kfuse views of
//! tch storage without copies, and tch allocations for outputs and scratch.
use crate::error::{Error, Result};
use kfuse::{Context, Device};
use std::ffi::c_void;
use tch::{Kind, Tensor};

/// A kfuse context on the device of tch's `device`: `Context::cpu()` or `Context::cuda(i)`
/// (Apple's `Mps` is refused: kfuse has no Metal backend).
///
/// A CUDA context enqueues on the legacy default stream, which is PyTorch's default stream. The
/// layers' outputs and scratch come from PyTorch's caching allocator, which reuses freed memory
/// in the order of PyTorch's *current* stream, so kfuse must run on that stream: tch 0.10 has no
/// API that reads it, so code that made another stream current passes that stream to
/// [`Context::set_stream`].
pub fn context(device: tch::Device) -> Result<Context> {
    Ok(match device {
        tch::Device::Cpu => Context::cpu()?,
        tch::Device::Cuda(i) => Context::cuda(i32::try_from(i).unwrap_or(i32::MAX))?,
        tch::Device::Mps => {
            return Err(Error::arg(
                "kfuse_tch::context",
                "device Mps: kfuse runs on Cpu and Cuda devices only",
            ))
        }
    })
}

/// The tch device of a kfuse context.
pub(crate) fn device_of(ctx: &Context) -> tch::Device {
    match ctx.device() {
        Device::Cpu => tch::Device::Cpu,
        Device::Cuda(i) => tch::Device::Cuda(usize::try_from(i).unwrap_or(0)),
    }
}

/// An element type the layers take from tch tensors: `f32` (data), `i32` (sequence lengths).
pub(crate) trait Dtype: kfuse::Element {
    /// The tch kind holding it.
    const KIND: Kind;
    /// How a message names it.
    const NAME: &'static str;
}
impl Dtype for f32 {
    const KIND: Kind = Kind::Float;
    const NAME: &'static str = "Float (float32)";
}
impl Dtype for i32 {
    const KIND: Kind = Kind::Int;
    const NAME: &'static str = "Int (int32)";
}

/// `t` checked (defined, of `T`'s kind, on `device`) and made contiguous: a handle on the same
/// storage when `t` already is (no copy), a contiguous copy otherwise.
pub(crate) fn input_of<T: Dtype>(call: &str, name: &str, t: &Tensor, device: tch::Device) -> Result<Tensor> {
    let kind = t.f_kind().map_err(|_| Error::arg(call, format_args!("{name} is an undefined tensor")))?;
    if kind != T::KIND {
        return Err(Error::arg(call, format_args!("{name} has dtype {kind:?}, expected {}", T::NAME)));
    }
    if t.device() != device {
        return Err(Error::arg(
            call,
            format_args!("{name} is on {:?}, but the layer's context is on {device:?}", t.device()),
        ));
    }
    Ok(t.f_contiguous()?)
}

/// [`input_of`] for float32 data.
pub(crate) fn input(call: &str, name: &str, t: &Tensor, device: tch::Device) -> Result<Tensor> {
    input_of::<f32>(call, name, t, device)
}

/// As [`input`], for a parameter whose shape the caller knows: a wrong shape is refused here
/// (kfuse takes the shapes of some parameters, the RNN weights, from the plan).
pub(crate) fn param(
    call: &str,
    name: &str,
    t: &Tensor,
    shape: &[usize],
    device: tch::Device,
) -> Result<Tensor> {
    let t = input(call, name, t, device)?;
    if dims(&t) != shape {
        return Err(Error::arg(call, format_args!("{name} has shape {:?}, expected {shape:?}", dims(&t))));
    }
    Ok(t)
}

/// An optional parameter, checked as [`param`] against `shape`, which is `Some` exactly when the
/// descriptor has it (`what`: the descriptor's option, for the message).
pub(crate) fn opt_param(
    call: &str,
    name: &str,
    t: Option<&Tensor>,
    shape: Option<&[usize]>,
    what: &str,
    device: tch::Device,
) -> Result<Option<Tensor>> {
    match (t, shape) {
        (Some(t), Some(shape)) => Ok(Some(param(call, name, t, shape, device)?)),
        (None, None) => Ok(None),
        (t, shape) => Err(Error::arg(
            call,
            format_args!(
                "{name} is {}, but the descriptor has {what} = {}",
                if t.is_some() { "given" } else { "absent" },
                shape.is_some()
            ),
        )),
    }
}

/// y's shape for a linear map of x `[..., in]` to `[..., out]`, or why x is refused.
pub(crate) fn linear_y_shape(
    x: &[usize],
    inf: usize,
    outf: usize,
) -> std::result::Result<Vec<usize>, String> {
    match x.split_last() {
        Some((&last, lead)) if last == inf => Ok(lead.iter().copied().chain([outf]).collect()),
        _ => Err(format!("x has shape {x:?}, expected [..., {inf}] (in_features)")),
    }
}

/// An optional input, checked as [`input`].
pub(crate) fn opt_input(
    call: &str,
    name: &str,
    t: Option<&Tensor>,
    device: tch::Device,
) -> Result<Option<Tensor>> {
    t.map(|t| input(call, name, t, device)).transpose()
}

/// The extents of `t`.
pub(crate) fn dims(t: &Tensor) -> Vec<usize> {
    t.size().iter().map(|&d| d as usize).collect()
}

/// A kfuse view of a contiguous tensor's storage (no copy) as elements `T`.
pub(crate) fn view<T: Dtype>(t: &Tensor) -> kfuse::Tensor<'_, T> {
    // SAFETY: every tensor viewed here came from `input_of::<T>`/`param` (T's kind, contiguous,
    // on the context's device) or `empty` (float32); `shape` is its own, so the pointer covers
    // the shape's elements; the borrow of `t` keeps the storage alive while the view lives.
    unsafe { kfuse::Tensor::from_raw(t.data_ptr() as *const T, &dims(t)) }
}

/// A writable kfuse view of a tensor from [`empty`] (contiguous float32, not shared).
pub(crate) fn view_mut(t: &mut Tensor) -> kfuse::TensorMut<'_> {
    // SAFETY: as `view`; the exclusive borrow keeps every other view of this new tensor away.
    unsafe { kfuse::TensorMut::from_raw(t.data_ptr() as *mut f32, &dims(t)) }
}

/// The data pointers of checked parameters, for kfuse's `Weights::from_raw`.
pub(crate) fn ptrs(ts: &[Tensor]) -> Vec<*const f32> {
    ts.iter().map(|t| t.data_ptr() as *const f32).collect()
}

/// A new uninitialised float32 tensor of `shape` on `device` (tch's allocator).
pub(crate) fn empty(shape: &[usize], device: tch::Device) -> Result<Tensor> {
    let s: Vec<i64> = shape.iter().map(|&d| i64::try_from(d).unwrap_or(i64::MAX)).collect();
    Ok(Tensor::f_empty(&s, (Kind::Float, device))?)
}

/// Bytes of device memory for kfuse (scratch, or an RNN reserve) from tch's allocator (PyTorch's
/// caching allocator on CUDA), `KF_ALIGN_BYTES`-aligned.
pub(crate) struct Scratch {
    _buf: Option<Tensor>, // owns the memory `ptr` points into
    ptr: *mut c_void,
    bytes: usize,
}

const ALIGN: usize = kfuse::sys::KF_ALIGN_BYTES as usize;

impl Scratch {
    /// `bytes` of scratch on `device`; none (a null pointer) for 0.
    pub(crate) fn new(bytes: usize, device: tch::Device) -> Result<Scratch> {
        if bytes == 0 {
            return Ok(Scratch { _buf: None, ptr: std::ptr::null_mut(), bytes: 0 });
        }
        let n = bytes.checked_add(ALIGN).and_then(|n| i64::try_from(n).ok()).ok_or_else(|| {
            Error::Argument(format!("kfuse_tch: a scratch buffer of {bytes} bytes is too large"))
        })?;
        let buf = Tensor::f_empty(&[n], (Kind::Uint8, device))?;
        let base = buf.data_ptr() as usize;
        let ptr = (base + (ALIGN - base % ALIGN) % ALIGN) as *mut c_void;
        Ok(Scratch { _buf: Some(buf), ptr, bytes })
    }
    pub(crate) fn ptr(&self) -> *mut c_void {
        self.ptr
    }
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }
}

impl std::fmt::Debug for Scratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Scratch({} bytes)", self.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_contiguous_input_is_not_copied_and_a_strided_one_is() {
        let t = Tensor::randn(&[4, 3], (Kind::Float, tch::Device::Cpu));
        let c = input("f", "x", &t, tch::Device::Cpu).unwrap();
        assert_eq!(c.data_ptr(), t.data_ptr());
        let tt = t.tr();
        let c = input("f", "x", &tt, tch::Device::Cpu).unwrap();
        assert_ne!(c.data_ptr(), tt.data_ptr());
        assert!(c.equal(&tt));
    }

    #[test]
    fn scratch_is_aligned_and_large_enough() {
        for bytes in [1, 63, 64, 1000] {
            let s = Scratch::new(bytes, tch::Device::Cpu).unwrap();
            assert_eq!(s.ptr() as usize % ALIGN, 0);
            let buf = s._buf.as_ref().unwrap();
            let end = buf.data_ptr() as usize + buf.numel();
            assert!(s.ptr() as usize + bytes <= end && s.bytes() == bytes);
        }
        assert!(Scratch::new(0, tch::Device::Cpu).unwrap().ptr().is_null());
    }
}
