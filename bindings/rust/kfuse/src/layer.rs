//! Plumbing shared by the layers (`rnn`, `kan`, `sklinear`):
//! structs as their `*_init` functions fill them, plan creation, workspace queries and the raw
//! tensors of optional views.
use crate::context::Context;
use crate::error::{check, Error, Result, Status};
use crate::tensor::{absent, Tensor, TensorMut};
use kfuse_sys as sys;
use std::mem::MaybeUninit;
use std::ptr::{self, NonNull};

/// A kfuse struct as its `*_init` function fills it (defaults and `struct_size`).
pub(crate) fn init_with<T>(init: unsafe extern "C" fn(*mut T)) -> T {
    let mut v = MaybeUninit::<T>::zeroed();
    // SAFETY: the kf_*_init functions write every field of their (plain-data) struct, which is
    // also valid all-zero.
    unsafe {
        init(v.as_mut_ptr());
        v.assume_init()
    }
}

/// A plan handle from `create`, a `kf_*_plan_create` call (named `name`) given the out-pointer.
pub(crate) fn create_plan<P>(
    name: &str,
    create: impl FnOnce(*mut *mut P) -> sys::kf_status,
) -> Result<NonNull<P>> {
    let mut raw: *mut P = ptr::null_mut();
    check(create(&mut raw))?;
    NonNull::new(raw).ok_or_else(|| Error::new(Status::Internal, format!("{name} returned KF_OK and NULL")))
}

/// Bytes of scratch for `n` rows from `query`, a `kf_*_workspace_size` call given the rows
/// (saturated) and the out-pointer.
pub(crate) fn workspace_size(
    n: usize,
    query: impl FnOnce(i64, *mut usize) -> sys::kf_status,
) -> Result<usize> {
    let mut ws = 0usize;
    check(query(i64::try_from(n).unwrap_or(i64::MAX), &mut ws))?;
    Ok(ws)
}

/// The number of elements of `shape`.
pub(crate) fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// A zero host vector for an optional part of a layer (`Some` when `present`).
pub(crate) fn zeros_if(present: bool, shape: &[usize]) -> Option<Vec<f32>> {
    present.then(|| vec![0.0; numel(shape)])
}

/// The raw tensor of an optional input, absent for `None`.
pub(crate) fn opt_in(
    t: &Option<Tensor<'_>>,
    call: &str,
    name: &str,
    ctx: &Context,
) -> Result<sys::kf_tensor> {
    t.as_ref().map_or_else(|| Ok(absent()), |t| t.raw(call, name, ctx))
}

/// The raw tensor of an optional output, absent for `None`.
pub(crate) fn opt_out(
    t: &Option<TensorMut<'_>>,
    call: &str,
    name: &str,
    ctx: &Context,
) -> Result<sys::kf_tensor> {
    t.as_ref().map_or_else(|| Ok(absent()), |t| t.raw(call, name, ctx))
}
