//! `kf_context`: the device, its stream, the BLAS handle and the arena.
use crate::error::{check, Error, Result};
use kfuse_sys as sys;
use std::ffi::c_void;
use std::mem::MaybeUninit;
use std::ptr::{self, NonNull};

/// Where a context's work runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Device {
    /// The host CPU (OpenMP threads). Tensors are host memory.
    Cpu,
    /// A CUDA device by ordinal. Tensors are device memory on it.
    Cuda(i32),
}

/// Options for [`Context`] beyond the device: threads, arena size, a fixed arena.
///
/// ```
/// let ctx = kfuse::Context::builder(kfuse::Device::Cpu).with_threads(1).build()?;
/// assert_eq!(ctx.device(), kfuse::Device::Cpu);
/// # Ok::<(), kfuse::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct ContextBuilder {
    desc: sys::kf_context_desc,
    device: Device,
}

impl ContextBuilder {
    /// CPU threads a call may use; 0 (the default) means the CPUs the process may use (kfuse.h:
    /// OpenMP's limit, the affinity mask and a cgroup CPU quota).
    pub fn with_threads(mut self, threads: u32) -> Self {
        self.desc.num_threads = i32::try_from(threads).unwrap_or(i32::MAX);
        self
    }

    /// Bytes of arena to allocate at creation (default 0: grown on first need).
    pub fn arena_bytes(mut self, bytes: usize) -> Self {
        self.desc.arena_bytes = bytes;
        self
    }

    /// Never grow the arena (`KF_CONTEXT_FIXED_ARENA`): a call needing more than it holds fails
    /// with [`Status::WorkspaceTooSmall`](crate::Status::WorkspaceTooSmall) instead of allocating.
    pub fn fixed_arena(mut self, fixed: bool) -> Self {
        if fixed {
            self.desc.flags |= sys::KF_CONTEXT_FIXED_ARENA;
        } else {
            self.desc.flags &= !sys::KF_CONTEXT_FIXED_ARENA;
        }
        self
    }

    /// Creates the context (`kf_context_create`). A CUDA context in a CPU-only build, or without a
    /// usable driver, fails with [`Status::BackendUnavailable`](crate::Status::BackendUnavailable).
    pub fn build(self) -> Result<Context> {
        let mut raw: *mut sys::kf_context = ptr::null_mut();
        // SAFETY: desc was filled by kf_context_desc_init; raw is a valid out-pointer.
        check(unsafe { sys::kf_context_create(&self.desc, &mut raw) })?;
        let raw = NonNull::new(raw).ok_or_else(|| {
            Error::new(crate::Status::Internal, "kf_context_create returned KF_OK and NULL".into())
        })?;
        Ok(Context { raw, device: self.device })
    }
}

/// Arena state reported by [`Context::arena_info`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArenaInfo {
    /// Bytes the arena holds now.
    pub bytes: usize,
    /// How many times it has been (re)allocated since creation; a steady-state loop of calls
    /// leaves it unchanged.
    pub grow_count: u64,
}

/// A kfuse context (`kf_context`): owns the device, the stream, the BLAS handle and the arena.
/// Destroyed on drop.
///
/// A context may be moved to another thread (`Send`) but not shared between threads (not
/// `Sync`): the C contract is "used by one thread at a time". Plans borrow their context, so the
/// borrow checker also keeps every plan from outliving it and from crossing threads without it.
/// Separate contexts are independent and may run concurrently.
///
/// ```
/// let ctx = kfuse::Context::cpu()?;
/// ctx.reserve_arena(1 << 20)?;
/// assert!(ctx.arena_info()?.bytes >= 1 << 20);
/// # Ok::<(), kfuse::Error>(())
/// ```
#[derive(Debug)]
pub struct Context {
    raw: NonNull<sys::kf_context>,
    device: Device,
}

// SAFETY: kfuse.h: "A context, and every plan made from it, is used by one thread at a time";
// nothing in it is tied to the thread that created it, so moving it is allowed. It is not Sync:
// `&Context` gives access to calls that use the context, and two threads must not do that at once.
unsafe impl Send for Context {}

impl Context {
    /// Options for a context on `device`.
    pub fn builder(device: Device) -> ContextBuilder {
        let mut desc = MaybeUninit::<sys::kf_context_desc>::zeroed();
        // SAFETY: init writes every field of the struct.
        let mut desc = unsafe {
            sys::kf_context_desc_init(desc.as_mut_ptr());
            desc.assume_init()
        };
        match device {
            Device::Cpu => desc.device_type = sys::kf_device_type_KF_DEVICE_CPU as i32,
            Device::Cuda(index) => {
                desc.device_type = sys::kf_device_type_KF_DEVICE_CUDA as i32;
                desc.device_index = index;
            }
        }
        ContextBuilder { desc, device }
    }

    /// A CPU context with default options (every CPU the process may use).
    pub fn cpu() -> Result<Context> {
        Context::builder(Device::Cpu).build()
    }

    /// A CUDA context on device `index` with default options (the legacy default stream).
    pub fn cuda(index: i32) -> Result<Context> {
        Context::builder(Device::Cuda(index)).build()
    }

    /// The device this context runs on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Sets the CUDA stream (a `cudaStream_t`; null = the legacy default stream) that later calls
    /// enqueue on, e.g. PyTorch's current stream. On a CPU context only null is accepted.
    ///
    /// # Safety
    /// `stream` must be null or a live `cudaStream_t` of this context's device, and must stay
    /// alive until it is replaced by another `set_stream` or the context is dropped.
    pub unsafe fn set_stream(&self, stream: *mut c_void) -> Result<()> {
        check(sys::kf_context_set_stream(self.raw.as_ptr(), stream))
    }

    /// The stream calls enqueue on (null on a CPU context).
    pub fn stream(&self) -> Result<*mut c_void> {
        let mut s: *mut c_void = ptr::null_mut();
        // SAFETY: valid handle and out-pointer.
        check(unsafe { sys::kf_context_get_stream(self.raw.as_ptr(), &mut s) })?;
        Ok(s)
    }

    /// Grows the arena to at least `bytes` now, so later calls needing up to that much never
    /// allocate (also with a fixed arena). Never shrinks it.
    pub fn reserve_arena(&self, bytes: usize) -> Result<()> {
        // SAFETY: valid handle; the context is not shared between threads (not Sync).
        check(unsafe { sys::kf_context_reserve(self.raw.as_ptr(), bytes) })
    }

    /// Bytes the arena holds and how often it has been (re)allocated.
    pub fn arena_info(&self) -> Result<ArenaInfo> {
        let mut bytes = 0usize;
        let mut grow_count = 0u64;
        // SAFETY: valid handle and out-pointers.
        check(unsafe { sys::kf_context_arena_info(self.raw.as_ptr(), &mut bytes, &mut grow_count) })?;
        Ok(ArenaInfo { bytes, grow_count })
    }

    /// Waits for all work enqueued on the context's stream (no-op on the CPU); a CUDA error raised
    /// by that work comes back as [`Status::Device`](crate::Status::Device).
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: valid handle.
        check(unsafe { sys::kf_context_synchronize(self.raw.as_ptr()) })
    }

    /// The raw handle, for calls into `kfuse-sys`. It stays owned by `self`.
    pub fn as_raw(&self) -> *mut sys::kf_context {
        self.raw.as_ptr()
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: created by kf_context_create and destroyed once; plans borrow the context, so
        // none is alive any more.
        unsafe { sys::kf_context_destroy(self.raw.as_ptr()) }
    }
}
