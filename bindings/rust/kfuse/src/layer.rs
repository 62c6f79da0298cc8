//! Plumbing shared by the layers (`rnn`, `kan`, `sklinear`):
//! structs as their `*_init` functions fill them, plan creation, workspace queries and the raw
//! tensors of optional views.
use crate::context::Context;
use crate::error::{check, Error, Result, Status};
use crate::tensor::{absent, Element, Float, Tensor, TensorMut};
use kfuse_sys as sys;
use std::any::Any;
use std::cell::RefCell;
use std::ffi::CStr;
use std::mem::MaybeUninit;
use std::os::raw::c_char;
use std::ptr::{self, NonNull};

const MAX_DIMS: usize = sys::KF_MAX_DIMS as usize;

/// One state tensor of a plan (a recurrent layer's weight, a KAN or SKLinear parameter), in the
/// canonical order: its reference `state_dict` name and its shape (e.g. `weight_ih_l0` `[3H, I]`,
/// `cells.0.W_h` `[H, H]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WeightInfo {
    /// Reference parameter name.
    pub name: String,
    /// Shape in elements.
    pub shape: Vec<usize>,
}

impl WeightInfo {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

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

/// Name and shape of every state tensor of `plan` as the library lists them: `count` is a
/// `kf_*_param_count` (or `kf_rnn_weight_count`), `info` the matching `*_info`.
pub(crate) fn param_list<P>(
    plan: *const P,
    count: unsafe extern "C" fn(*const P, *mut i32) -> sys::kf_status,
    info: unsafe extern "C" fn(*const P, i32, *mut *const c_char, *mut i32, *mut i64) -> sys::kf_status,
) -> Result<Vec<WeightInfo>> {
    let mut n = 0i32;
    // SAFETY: a live plan handle and an out-pointer.
    check(unsafe { count(plan, &mut n) })?;
    let mut out = Vec::with_capacity(n.max(0) as usize);
    for i in 0..n {
        let mut name: *const c_char = ptr::null();
        let mut ndim = 0i32;
        let mut shape = [0i64; MAX_DIMS];
        // SAFETY: shape has room for KF_MAX_DIMS entries; name is static or lives as long as the
        // plan, and is copied at once.
        check(unsafe { info(plan, i, &mut name, &mut ndim, shape.as_mut_ptr()) })?;
        let name = unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned();
        let shape = shape[..ndim.clamp(0, MAX_DIMS as i32) as usize].iter().map(|&s| s as usize).collect();
        out.push(WeightInfo { name, shape });
    }
    Ok(out)
}

thread_local! {
    /// A CPU context of this thread for the descriptors' shape queries: the library forms every
    /// shape from a plan, and a plan needs a context (creating either allocates only the handle).
    static SHAPE_CONTEXT: Option<Context> = Context::cpu().ok();
}

/// `f` on this thread's shape-query context; `None` when there is none or `f` gives none.
pub(crate) fn on_shape_context<R>(f: impl FnOnce(&Context) -> Option<R>) -> Option<R> {
    SHAPE_CONTEXT.with(|c| c.as_ref().and_then(f))
}

thread_local! {
    /// The last descriptor whose state tensors this thread asked for, with the library's list
    /// (`param_list_of`).
    static LAST_PARAMS: RefCell<Option<(Box<dyn Any>, Option<Vec<WeightInfo>>)>> = RefCell::new(None);
}

/// The state tensors of a plan of `desc`, as `list` gets them from a plan it makes on this
/// thread's shape-query context; remembered for the last descriptor asked, so that a
/// descriptor's shape queries (one per tensor) make one plan between them, not one each.
pub(crate) fn param_list_of<D: Any + Clone + PartialEq>(
    desc: &D,
    list: impl FnOnce(&Context, &D) -> Option<Vec<WeightInfo>>,
) -> Option<Vec<WeightInfo>> {
    let hit = LAST_PARAMS.with(|m| match &*m.borrow() {
        Some((k, l)) if k.downcast_ref::<D>() == Some(desc) => Some(l.clone()),
        _ => None,
    });
    if let Some(l) = hit {
        return l;
    }
    let l = on_shape_context(|ctx| list(ctx, desc));
    LAST_PARAMS.with(|m| *m.borrow_mut() = Some((Box::new(desc.clone()), l.clone())));
    l
}

/// The shape of entry `name` of `list` (`[0; R]` when it has none of that rank: a tensor the
/// layer does not have, or a descriptor the library refused).
pub(crate) fn shape_of<const R: usize>(list: Option<Vec<WeightInfo>>, name: &str) -> [usize; R] {
    let mut out = [0usize; R];
    if let Some(w) = list.iter().flatten().find(|w| w.name == name && w.shape.len() == R) {
        out.copy_from_slice(&w.shape);
    }
    out
}

/// The number of elements of `shape`.
pub(crate) fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// A zero host vector for an optional part of a layer (`Some` when `present`).
pub(crate) fn zeros_if<T: Float>(present: bool, shape: &[usize]) -> Option<Vec<T>> {
    present.then(|| vec![T::default(); numel(shape)])
}

/// The raw tensor of an optional input, absent for `None`.
pub(crate) fn opt_in<T: Element>(
    t: &Option<Tensor<'_, T>>,
    call: &str,
    name: &str,
    ctx: &Context,
) -> Result<sys::kf_tensor> {
    t.as_ref().map_or_else(|| Ok(absent()), |t| t.raw(call, name, ctx))
}

/// The raw tensor of an optional output, absent for `None`.
pub(crate) fn opt_out<T: Element>(
    t: &Option<TensorMut<'_, T>>,
    call: &str,
    name: &str,
    ctx: &Context,
) -> Result<sys::kf_tensor> {
    t.as_ref().map_or_else(|| Ok(absent()), |t| t.raw(call, name, ctx))
}
