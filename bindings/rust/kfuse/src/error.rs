//! `kf_status` plus the thread-local detail message, as a Rust `Result`.
use kfuse_sys as sys;
use std::ffi::CStr;
use std::fmt;

/// What went wrong: one variant per `kf_status` failure code of `kfuse.h`.
///
/// The C enum only ever gains values; a value this crate does not know yet arrives as
/// [`Status::Unknown`] with its number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Status {
    /// `KF_ERR_INVALID_ARGUMENT`: NULL, bad size, shape/dtype mismatch, unknown flag, ...
    InvalidArgument,
    /// `KF_ERR_UNSUPPORTED`: a valid request this build or backend does not implement.
    Unsupported,
    /// `KF_ERR_OUT_OF_MEMORY`: host or device allocation failed.
    OutOfMemory,
    /// `KF_ERR_WORKSPACE_TOO_SMALL`: caller workspace/reserve, or a fixed arena, too small.
    WorkspaceTooSmall,
    /// `KF_ERR_BACKEND_UNAVAILABLE`: e.g. CUDA asked for in a CPU-only build.
    BackendUnavailable,
    /// `KF_ERR_DEVICE`: a CUDA / cuBLAS call failed.
    Device,
    /// `KF_ERR_INTERNAL`: a bug in kfuse; please report it with the message.
    Internal,
    /// A status code newer than this crate.
    Unknown(u32),
}

impl Status {
    /// The status for a raw `kf_status`; `None` for `KF_OK`.
    pub fn from_raw(raw: sys::kf_status) -> Option<Status> {
        Some(match raw {
            sys::kf_status_KF_OK => return None,
            sys::kf_status_KF_ERR_INVALID_ARGUMENT => Status::InvalidArgument,
            sys::kf_status_KF_ERR_UNSUPPORTED => Status::Unsupported,
            sys::kf_status_KF_ERR_OUT_OF_MEMORY => Status::OutOfMemory,
            sys::kf_status_KF_ERR_WORKSPACE_TOO_SMALL => Status::WorkspaceTooSmall,
            sys::kf_status_KF_ERR_BACKEND_UNAVAILABLE => Status::BackendUnavailable,
            sys::kf_status_KF_ERR_DEVICE => Status::Device,
            sys::kf_status_KF_ERR_INTERNAL => Status::Internal,
            other => Status::Unknown(other),
        })
    }

    /// The raw `kf_status` value.
    pub fn as_raw(self) -> sys::kf_status {
        match self {
            Status::InvalidArgument => sys::kf_status_KF_ERR_INVALID_ARGUMENT,
            Status::Unsupported => sys::kf_status_KF_ERR_UNSUPPORTED,
            Status::OutOfMemory => sys::kf_status_KF_ERR_OUT_OF_MEMORY,
            Status::WorkspaceTooSmall => sys::kf_status_KF_ERR_WORKSPACE_TOO_SMALL,
            Status::BackendUnavailable => sys::kf_status_KF_ERR_BACKEND_UNAVAILABLE,
            Status::Device => sys::kf_status_KF_ERR_DEVICE,
            Status::Internal => sys::kf_status_KF_ERR_INTERNAL,
            Status::Unknown(v) => v,
        }
    }

    /// The library's static name and meaning (`kf_status_string`), e.g.
    /// `"KF_ERR_INVALID_ARGUMENT: invalid argument"`.
    pub fn describe(self) -> String {
        // SAFETY: kf_status_string never returns NULL and returns static storage.
        unsafe { CStr::from_ptr(sys::kf_status_string(self.as_raw())) }.to_string_lossy().into_owned()
    }
}

/// A failed kfuse call: the status and the library's detail message, which names the call, the
/// argument, what was expected and what was received, e.g.
/// `kf_rnn_forward: args->x.shape[2] = 64, expected 128 (input_size)`.
///
/// The few checks this crate makes itself (a host slice whose length does not match the shape
/// it is given, a reserve that no training forward wrote) produce the same kind of message with
/// the Rust method's name in front, e.g. `RnnPlan::forward: args.x has 10 elements, ...`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    status: Status,
    message: String,
}

impl Error {
    /// The status code.
    pub fn status(&self) -> Status {
        self.status
    }

    /// The detail message (never empty).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Reads `kf_last_error_message()` for a call that just failed with `raw` on this thread.
    pub(crate) fn from_last(raw: sys::kf_status) -> Error {
        let status = Status::from_raw(raw).unwrap_or(Status::Internal);
        // SAFETY: never NULL; valid until the next kfuse call on this thread, and copied now.
        let msg = unsafe { CStr::from_ptr(sys::kf_last_error_message()) }.to_string_lossy().into_owned();
        let message = if msg.is_empty() { status.describe() } else { msg };
        Error { status, message }
    }

    pub(crate) fn new(status: Status, message: String) -> Error {
        Error { status, message }
    }

    pub(crate) fn invalid(message: String) -> Error {
        Error::new(Status::InvalidArgument, message)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} [{}]", self.message, self.status.describe())
    }
}

impl std::error::Error for Error {}

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Turns a raw status into `Ok(())` or the error with the thread's detail message.
pub(crate) fn check(raw: sys::kf_status) -> Result<()> {
    if raw == sys::kf_status_KF_OK {
        Ok(())
    } else {
        Err(Error::from_last(raw))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_round_trips() {
        assert_eq!(Status::from_raw(sys::kf_status_KF_OK), None);
        for raw in 1..=8u32 {
            let s = Status::from_raw(raw).unwrap();
            assert_eq!(s.as_raw(), raw);
        }
        assert_eq!(Status::from_raw(8), Some(Status::Unknown(8)));
        assert!(Status::WorkspaceTooSmall.describe().starts_with("KF_ERR_WORKSPACE_TOO_SMALL"));
    }

    #[test]
    fn failure_carries_the_thread_message() {
        let mut t = crate::tensor::absent();
        // SAFETY: valid out-pointer; ndim 7 is rejected before shape is read.
        let raw = unsafe {
            sys::kf_tensor_init(&mut t, std::ptr::null_mut(), sys::kf_dtype_KF_DTYPE_F32, 7, std::ptr::null())
        };
        let e = check(raw).unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument);
        assert!(e.message().contains("ndim"), "{e}");
        assert!(e.to_string().contains("KF_ERR_INVALID_ARGUMENT"), "{e}");
    }
}
