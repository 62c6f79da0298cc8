//! Helpers shared by the tests: float32 inputs, float64 autograd leaves, and the comparison of a
//! kfuse float32 result with a float64 tch reference.
#![allow(dead_code)] // each test file uses its own subset

use tch::{Device, Kind, Tensor};

/// Relative error allowed: max |kfuse - reference| over max |reference|.
pub const RTOL: f64 = 1e-5;

/// A float32 tensor of N(0, 1) * scale on the CPU.
pub fn randn(shape: &[i64], scale: f64) -> Tensor {
    Tensor::randn(shape, (Kind::Float, Device::Cpu)) * scale
}

/// A float64 copy of `t` that autograd tracks (a leaf).
pub fn leaf(t: &Tensor) -> Tensor {
    t.to_kind(Kind::Double).detach().set_requires_grad(true)
}

/// A float64 copy of `t` that autograd does not track.
pub fn f64(t: &Tensor) -> Tensor {
    t.to_kind(Kind::Double).detach()
}

/// Gradients of `sum(out_i * dout_i)` w.r.t. `inputs`, by tch's autograd.
pub fn grads(outs: &[(&Tensor, &Tensor)], inputs: &[&Tensor]) -> Vec<Tensor> {
    let loss = outs.iter().map(|(o, d)| (*o * f64(d)).sum(Kind::Double)).reduce(|a, b| a + b).unwrap();
    Tensor::run_backward(&[loss], inputs, false, false)
}

/// `got` (kfuse, float32) against `want` (tch, float64): same shape, finite, and
/// max |got - want| <= RTOL * max |want|, with a reference that is not all zero (so the
/// comparison can fail).
pub fn assert_close(what: &str, got: &Tensor, want: &Tensor) {
    assert_eq!(got.kind(), Kind::Float, "{what}: kfuse's result is not float32");
    assert_eq!(got.size(), want.size(), "{what}: shapes differ");
    let (g, w) = (f64(got), want.detach());
    let scale = w.abs().max().double_value(&[]);
    let err = (&g - &w).abs().max().double_value(&[]);
    assert!(scale > 0.0, "{what}: the reference is all zero");
    assert!(err <= RTOL * scale, "{what}: max error {err:e} > {RTOL:e} * max |reference| {scale:e}");
}
