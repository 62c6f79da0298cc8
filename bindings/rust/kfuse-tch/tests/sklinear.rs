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

/// The dropout mask at counter `ctr` (kfuse.h: SplitMix64's finaliser on the seed, then on it
/// xor the counter; kept when the top 24 bits over 2^24 are >= p), written for this test.
fn keep(seed: u64, ctr: u64, p: f32) -> bool {
    fn mix(mut z: u64) -> u64 {
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
        z ^ (z >> 31)
    }
    let z = mix(mix(seed.wrapping_add(0x9E3779B97F4A7C15)) ^ ctr);
    (z >> 40) as f64 / 16777216.0 >= p as f64
}

#[test]
fn fused_gelu_and_dropout_match_tch() {
    use kfuse_tch::Activation;
    tch::manual_seed(4);
    let ctx = context(Device::Cpu).unwrap();
    let (p, seed) = (0.3f32, 99u64);
    for (act, f) in [
        (Activation::Gelu, (|t: &tch::Tensor| t.gelu("none")) as fn(&tch::Tensor) -> tch::Tensor),
        (Activation::Relu, |t: &tch::Tensor| t.relu()),
        (Activation::Silu, |t: &tch::Tensor| t.silu()),
    ] {
        let desc = SkLinearDesc::new(24, 20, 2, 4).activation(act).dropout(p);
        let mut sk = SkLinear::new(&ctx, &desc, 11, None).unwrap();
        let x = randn(&[7, 24], 1.0);
        let (y, saved) = sk.forward_train(&x, seed).unwrap();
        let dy = randn(&y.size(), 1.0);
        let g = sk.backward_train(&x, &dy, &saved).unwrap();

        let pp = &sk.params;
        let (x64, s1s, s2s, u1s, u2s) = (leaf(&x), leaf(&pp.s1s), leaf(&pp.s2s), f64(&pp.u1s), f64(&pp.u2s));
        let bias = leaf(pp.bias.as_ref().unwrap());
        let lin = (0..2)
            .map(|i| x64.matmul(&s1s.get(i)).matmul(&u1s.get(i)) + x64.matmul(&u2s.get(i)).matmul(&s2s.get(i)))
            .reduce(|a, b| a + b)
            .unwrap()
            / 4.0
            + &bias;
        let m: Vec<f64> =
            (0..7 * 20).map(|i| if keep(seed, i as u64, p) { 1.0 / (1.0 - p as f64) } else { 0.0 }).collect();
        let mask = tch::Tensor::of_slice(&m).view([7, 20]);
        let want = f(&lin) * &mask;
        assert_close("y", &y, &want);
        let w = grads(&[(&want, &dy)], &[&x64, &s1s, &s2s, &bias]);
        assert_close("dx", &g.dx, &w[0]);
        assert_close("dS1s", &g.ds1s, &w[1]);
        assert_close("dS2s", &g.ds2s, &w[2]);
        assert_close("dbias", g.dbias.as_ref().unwrap(), &w[3]);
    }
}
