//! kfuse's GRU against libtorch's own (`Tensor::gru`, torch.nn.GRU's kernel) and its A-GRU
//! against the cell written with tch ops, both in float64 with the same weights; gradients of
//! the reference by tch's autograd.
mod common;
use common::{assert_close, grads, leaf, randn};
use kfuse_tch::{context, Mode, Rnn, RnnDesc};
use tch::{Device, Kind, Tensor};

const T: usize = 6;
const B: usize = 3;
const I: usize = 5;
const H: usize = 4;

/// Runs `desc` forward (training; on sequences of `lengths` when given, else of B = 3 full ones)
/// and backward in kfuse, and `reference(x, h0, weights, names)` in float64 with autograd, and
/// compares y, hn and every gradient.
fn check(
    desc: &RnnDesc,
    lengths: Option<&[i32]>,
    reference: impl Fn(&Tensor, &Tensor, &[Tensor], &[String]) -> (Tensor, Tensor),
) {
    let ctx = context(Device::Cpu).unwrap();
    let mut rnn = Rnn::new(&ctx, desc).unwrap();
    let b = lengths.map_or(B, |l| l.len());
    let x = randn(&rnn.plan().x_shape(T, b).map(|d| d as i64), 1.0);
    let h0 = randn(&rnn.plan().state_shape(b).map(|d| d as i64), 0.5);
    let out = match lengths {
        Some(l) => rnn.forward_with_lengths(&x, Some(&h0), &Tensor::of_slice(l), Mode::Training),
        None => rnn.forward(&x, Some(&h0), Mode::Training),
    }
    .unwrap();
    let (dy, dhn) = (randn(&out.y.size(), 1.0), randn(&out.hn.size(), 1.0));
    let g = rnn.backward(out.saved.as_ref().unwrap(), Some(&dy), Some(&dhn)).unwrap();

    let names: Vec<String> = rnn.weight_info().iter().map(|w| w.name.clone()).collect();
    let (x64, h064) = (leaf(&x), leaf(&h0));
    let w64: Vec<Tensor> = rnn.weights().iter().map(leaf).collect();
    let (y, hn) = reference(&x64, &h064, &w64, &names);
    assert_close("y", &out.y, &y);
    assert_close("hn", &out.hn, &hn);
    let inputs: Vec<&Tensor> = [&x64, &h064].into_iter().chain(&w64).collect();
    let want = grads(&[(&y, &dy), (&hn, &dhn)], &inputs);
    assert_close("dx", &g.dx, &want[0]);
    assert_close("dh0", &g.dh0, &want[1]);
    for ((name, got), want) in names.iter().zip(&g.dweights).zip(&want[2..]) {
        assert_close(&format!("d{name}"), got, want);
    }
}

/// libtorch's GRU (the kernel behind torch.nn.GRU) with kfuse's weights, in kfuse's canonical
/// order (torch's `_flat_weights`).
fn torch_gru(desc: &RnnDesc) -> impl Fn(&Tensor, &Tensor, &[Tensor], &[String]) -> (Tensor, Tensor) + '_ {
    move |x, h0, w, _| {
        x.gru(
            h0,
            w,
            true,
            desc.num_layers() as i64,
            0.0,
            true,
            desc.is_bidirectional(),
            desc.is_batch_first(),
        )
    }
}

#[test]
fn gru_matches_torch() {
    tch::manual_seed(1);
    check(&RnnDesc::gru(I, H), None, torch_gru(&RnnDesc::gru(I, H)));
}

#[test]
fn gru_two_layers_bidirectional_batch_first_matches_torch() {
    tch::manual_seed(2);
    let d = RnnDesc::gru(I, H).layers(2).bidirectional(true).batch_first(true);
    check(&d, None, torch_gru(&d));
}

#[test]
fn gru_with_lengths_matches_torch_on_each_truncated_sequence() {
    tch::manual_seed(6);
    let d = RnnDesc::gru(I, H).layers(2).bidirectional(true);
    let lengths = [6, 2, 0, 4];
    let gru = torch_gru(&d);
    // Sample b alone through libtorch's GRU on its first lengths[b] steps; y zero after them, hn
    // its h0 for an empty sequence.
    check(&d, Some(&lengths), |x, h0, w, names| {
        let (ys, hns): (Vec<Tensor>, Vec<Tensor>) = lengths
            .iter()
            .enumerate()
            .map(|(b, &l)| {
                let (xb, h0b) = (x.narrow(1, b as i64, 1), h0.narrow(1, b as i64, 1));
                let zeros = |t: i64| Tensor::zeros(&[t, 1, 2 * H as i64], (Kind::Double, Device::Cpu));
                if l == 0 {
                    return (zeros(T as i64), h0b * 1.0);
                }
                let (y, hn) = gru(&xb.narrow(0, 0, l as i64), &h0b, w, names);
                (Tensor::cat(&[y, zeros(T as i64 - l as i64)], 0), hn)
            })
            .unzip();
        (Tensor::cat(&ys, 1), Tensor::cat(&hns, 1))
    });
}

/// The A-GRU of DESIGN.md step by step with tch ops (sequence-first, one direction):
/// z = sigmoid(W_z x + b_z + U_z h), r = sigmoid(W_r x + b_r + U_r h),
/// d = tanh(V_h x + b_h + A (r * h)) with A = W_h - W_h^T - gamma I, h' = h + eps * z * d.
fn agru(gamma: f64) -> impl Fn(&Tensor, &Tensor, &[Tensor], &[String]) -> (Tensor, Tensor) {
    move |x, h0, w, names| {
        let p = |l: usize, n: &str| &w[names.iter().position(|s| *s == format!("cells.{l}.{n}")).unwrap()];
        let layers = h0.size()[0] as usize;
        let mut inp = x.shallow_clone();
        let mut hn = Vec::new();
        for l in 0..layers {
            let a =
                p(l, "W_h") - p(l, "W_h").tr() - Tensor::eye(H as i64, (Kind::Double, Device::Cpu)) * gamma;
            let mut h = h0.get(l as i64);
            let mut ys = Vec::new();
            for t in 0..inp.size()[0] {
                let xt = inp.get(t);
                let z = (xt.linear(p(l, "W_z.weight"), Some(p(l, "W_z.bias")))
                    + h.matmul(&p(l, "U_z.weight").tr()))
                .sigmoid();
                let r = (xt.linear(p(l, "W_r.weight"), Some(p(l, "W_r.bias")))
                    + h.matmul(&p(l, "U_r.weight").tr()))
                .sigmoid();
                let d = (xt.linear(p(l, "V_h.weight"), Some(p(l, "V_h.bias"))) + (&r * &h).matmul(&a.tr()))
                    .tanh();
                h = &h + p(l, "epsilon") * z * d;
                ys.push(h.shallow_clone());
            }
            inp = Tensor::stack(&ys, 0);
            hn.push(h);
        }
        (inp, Tensor::stack(&hn, 0))
    }
}

#[test]
fn agru_matches_tch_ops() {
    tch::manual_seed(3);
    check(&RnnDesc::agru(I, H).layers(2).gamma(0.05), None, agru(0.05));
}

#[test]
fn inference_with_dropout_configured_matches_torch_without_it() {
    tch::manual_seed(4);
    let ctx = context(Device::Cpu).unwrap();
    let desc = RnnDesc::gru(I, H).layers(2).dropout(0.5);
    let mut rnn = Rnn::new(&ctx, &desc).unwrap();
    let x = randn(&[T as i64, B as i64, I as i64], 1.0);
    let out = rnn.forward(&x, None, Mode::Inference).unwrap();
    assert!(out.saved.is_none());
    let w: Vec<Tensor> = rnn.weights().iter().map(leaf).collect();
    let h0 = Tensor::zeros(&[2, B as i64, H as i64], (Kind::Double, Device::Cpu));
    let (y, hn) = leaf(&x).gru(&h0, &w, true, 2, 0.0, false, false, false);
    assert_close("y", &out.y, &y);
    assert_close("hn", &out.hn, &hn);
}

/// sum(y * dy) for a training forward of `rnn` on x after `tch::manual_seed(seed)`.
fn loss(rnn: &mut Rnn, x: &Tensor, dy: &Tensor, seed: i64) -> f64 {
    tch::manual_seed(seed);
    let y = rnn.forward(x, None, Mode::Training).unwrap().y;
    (y.to_kind(Kind::Double) * dy.to_kind(Kind::Double)).sum(Kind::Double).double_value(&[])
}

#[test]
fn training_dropout_masks_come_from_tch_generator_and_backward_applies_them() {
    let ctx = context(Device::Cpu).unwrap();
    tch::manual_seed(5);
    let mut rnn = Rnn::new(&ctx, &RnnDesc::gru(I, H).layers(2).dropout(0.5)).unwrap();
    let x = randn(&[T as i64, B as i64, I as i64], 1.0);
    let mut run = |seed| {
        tch::manual_seed(seed);
        rnn.forward(&x, None, Mode::Training).unwrap()
    };
    let (a, b, c) = (run(9), run(9), run(10));
    assert!(a.y.equal(&b.y), "the same tch seed gives the same dropout masks");
    assert!(!a.y.equal(&c.y), "another tch seed gives other masks");
    let inference = rnn.forward(&x, None, Mode::Inference).unwrap();
    assert!(!a.y.equal(&inference.y), "training applied dropout");

    // Backward with a's masks: <dx, v> against central differences of sum(y * dy) along v, the
    // forwards drawing a's masks again (tch seed 9). Without the masks the two differ by far more.
    let dy = randn(&a.y.size(), 1.0);
    let g = rnn.backward(a.saved.as_ref().unwrap(), Some(&dy), None).unwrap();
    let v = randn(&x.size(), 1.0);
    let eps = 1e-2;
    let fd =
        (loss(&mut rnn, &(&x + &v * eps), &dy, 9) - loss(&mut rnn, &(&x - &v * eps), &dy, 9)) / (2.0 * eps);
    let an = (g.dx.to_kind(Kind::Double) * v.to_kind(Kind::Double)).sum(Kind::Double).double_value(&[]);
    assert!((fd - an).abs() <= 1e-3 * an.abs(), "<dx, v> = {an}, central differences {fd}");
}
