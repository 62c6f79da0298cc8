//! kfuse's SKLinear against Panther's formula written with tch matmuls in float64,
//! `y = 1/(2L) * sum_i [(x S1s[i]) U1s[i] + (x U2s[i]) S2s[i]] + bias`, gradients by tch's
//! autograd; and its initialisation against Panther's definition.
mod common;
use common::{assert_close, f64, grads, leaf, randn};
use kfuse_tch::{context, SkLinear, SkLinearDesc, SkTensors};
use tch::Device;

fn check(desc: &SkLinearDesc, x_shape: &[i64]) {
    let ctx = context(Device::Cpu).unwrap();
    let mut sk = SkLinear::new(&ctx, desc, 11, None).unwrap();
    let x = randn(x_shape, 1.0);
    let y = sk.forward(&x).unwrap();
    let dy = randn(&y.size(), 1.0);
    let g = sk.backward(&x, &dy).unwrap();

    let p = &sk.params;
    let (x64, s1s, s2s, u1s, u2s) = (leaf(&x), leaf(&p.s1s), leaf(&p.s2s), f64(&p.u1s), f64(&p.u2s));
    let bias = p.bias.as_ref().map(leaf);
    let l = desc.num_terms() as i64;
    let mut want = (0..l)
        .map(|i| x64.matmul(&s1s.get(i)).matmul(&u1s.get(i)) + x64.matmul(&u2s.get(i)).matmul(&s2s.get(i)))
        .reduce(|a, b| a + b)
        .unwrap()
        / (2 * l) as f64;
    if let Some(b) = &bias {
        want += b;
    }
    assert_close("y", &y, &want);
    let mut inputs = vec![&x64, &s1s, &s2s];
    inputs.extend(bias.as_ref());
    let w = grads(&[(&want, &dy)], &inputs);
    assert_close("dx", &g.dx, &w[0]);
    assert_close("dS1s", &g.ds1s, &w[1]);
    assert_close("dS2s", &g.ds2s, &w[2]);
    assert_eq!(g.dbias.is_some(), desc.has_bias());
    if let Some(db) = &g.dbias {
        assert_close("dbias", db, &w[3]);
    }
}

#[test]
fn sklinear_matches_tch_matmuls() {
    tch::manual_seed(1);
    check(&SkLinearDesc::new(24, 20, 2, 4), &[7, 24]);
}

#[test]
fn sklinear_without_bias_on_3d_x_matches_tch_matmuls() {
    tch::manual_seed(2);
    check(&SkLinearDesc::new(16, 12, 3, 5).bias(false), &[2, 3, 16]);
}

#[test]
fn init_follows_panthers_definition() {
    tch::manual_seed(3);
    let ctx = context(Device::Cpu).unwrap();
    let desc = SkLinearDesc::new(10, 6, 2, 3);
    let w = randn(&[6, 10], 0.3);
    let sk = SkLinear::new(&ctx, &desc, 5, Some(&w)).unwrap();
    let p = &sk.params;
    let k = 3f64;
    // Sketch entries are +-1/sqrt(k).
    for u in [&p.u1s, &p.u2s] {
        assert!(f64(u).abs().allclose(&(f64(u).ones_like() / k.sqrt()), 1e-6, 0.0, false));
    }
    let wt = f64(&w).tr();
    for i in 0..2 {
        assert_close("S1s[i] = W_init^T U1s[i]^T", &p.s1s.get(i), &wt.matmul(&f64(&p.u1s.get(i)).tr()));
        assert_close("S2s[i] = U2s[i]^T W_init^T", &p.s2s.get(i), &f64(&p.u2s.get(i)).tr().matmul(&wt));
    }
    // The seed decides the sketches.
    let again = SkLinear::new(&ctx, &desc, 5, Some(&w)).unwrap();
    let other = SkLinear::new(&ctx, &desc, 6, Some(&w)).unwrap();
    assert!(again.params.u1s.equal(&p.u1s));
    assert!(!other.params.u1s.equal(&p.u1s));
}

#[test]
fn from_params_takes_the_callers_tensors() {
    tch::manual_seed(4);
    let ctx = context(Device::Cpu).unwrap();
    let desc = SkLinearDesc::new(8, 4, 1, 2);
    let made = SkLinear::new(&ctx, &desc, 1, None).unwrap();
    let p = SkTensors {
        s1s: made.params.s1s.copy(),
        s2s: made.params.s2s.copy(),
        u1s: made.params.u1s.copy(),
        u2s: made.params.u2s.copy(),
        bias: made.params.bias.as_ref().map(|b| b.copy()),
    };
    let mut sk = SkLinear::from_params(&ctx, &desc, p).unwrap();
    let mut made = made;
    let x = randn(&[3, 8], 1.0);
    assert!(sk.forward(&x).unwrap().equal(&made.forward(&x).unwrap()));
}
