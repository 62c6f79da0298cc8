//! `kf_grad_mode`, shared by every layer's backward call (RNN, SKLinear).
use kfuse_sys as sys;

/// How backward treats the weight-gradient buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GradMode {
    /// `KF_GRAD_OVERWRITE`: weight gradients are written.
    Overwrite,
    /// `KF_GRAD_ACCUMULATE`: weight gradients are added to what the buffers hold.
    Accumulate,
}

impl GradMode {
    pub(crate) fn raw(self) -> sys::kf_grad_mode {
        match self {
            GradMode::Overwrite => sys::kf_grad_mode_KF_GRAD_OVERWRITE,
            GradMode::Accumulate => sys::kf_grad_mode_KF_GRAD_ACCUMULATE,
        }
    }
}
