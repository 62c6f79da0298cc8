//! The crate's error: a tensor the layer cannot take, a kfuse failure, or a libtorch failure.
use std::fmt;

/// Why a call failed. Every message names the call and the argument, e.g.
/// `Rnn::forward: x has dtype Double, expected Float (float32)` or kfuse's own
/// `kf_rnn_forward: args->x.shape[2] = 6, expected 3 (input_size)`.
#[derive(Debug)]
pub enum Error {
    /// A `tch::Tensor` this crate refused before calling kfuse: wrong dtype, wrong device, wrong
    /// rank, wrong number of parameters, an undefined tensor.
    Argument(String),
    /// kfuse refused the call or failed (its status and detail message).
    Kfuse(kfuse::Error),
    /// A libtorch operation of this crate (allocation, `contiguous`) failed.
    Tch(tch::TchError),
}

impl Error {
    pub(crate) fn arg(call: &str, msg: impl fmt::Display) -> Error {
        Error::Argument(format!("{call}: {msg}"))
    }

    /// The message (for [`Error::Kfuse`], kfuse's detail message without the status).
    pub fn message(&self) -> String {
        match self {
            Error::Argument(m) => m.clone(),
            Error::Kfuse(e) => e.message().to_string(),
            Error::Tch(e) => e.to_string(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Argument(m) => write!(f, "{m}"),
            Error::Kfuse(e) => write!(f, "{e}"),
            Error::Tch(e) => write!(f, "libtorch: {e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Argument(_) => None,
            Error::Kfuse(e) => Some(e),
            Error::Tch(e) => Some(e),
        }
    }
}

impl From<kfuse::Error> for Error {
    fn from(e: kfuse::Error) -> Error {
        Error::Kfuse(e)
    }
}

impl From<tch::TchError> for Error {
    fn from(e: tch::TchError) -> Error {
        Error::Tch(e)
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
