//! Wrong tensors are refused with a message naming the call and the argument, nothing written.
use kfuse_tch::{
    context, Error, Kan, KanConv2dDesc, KanLinearDesc, Mode, Rnn, RnnDesc, SkLinear, SkLinearDesc,
};
use tch::{Device, Kind, Tensor};

/// A tensor of `kind` (random when it is floating point).
fn x(shape: &[i64], kind: Kind) -> Tensor {
    match kind {
        Kind::Float | Kind::Double => Tensor::randn(shape, (kind, Device::Cpu)),
        _ => Tensor::ones(shape, (kind, Device::Cpu)),
    }
}

/// An `Error::Argument` whose message contains every one of `parts`.
fn argument<T>(r: kfuse_tch::Result<T>, parts: &[&str]) {
    match r {
        Err(Error::Argument(m)) => assert!(parts.iter().all(|p| m.contains(p)), "{m}"),
        Err(e) => panic!("expected Error::Argument with {parts:?}, got {e}"),
        Ok(_) => panic!("expected Error::Argument with {parts:?}, got Ok"),
    }
}

#[test]
fn wrong_dtype_rank_and_undefined_tensors_are_refused() {
    let ctx = context(Device::Cpu).unwrap();
    let mut gru = Rnn::new(&ctx, &RnnDesc::gru(3, 4)).unwrap();
    argument(
        gru.forward(&x(&[5, 2, 3], Kind::Double), None, Mode::Inference),
        &["Rnn::forward", "x", "Double", "float32"],
    );
    argument(
        gru.forward(&x(&[5, 3], Kind::Float), None, Mode::Inference),
        &["Rnn::forward", "x", "[5, 3]", "3 dimensions"],
    );
    argument(gru.forward(&Tensor::new(), None, Mode::Inference), &["x is an undefined tensor"]);
    let l64 = Tensor::of_slice(&[5i64, 3]);
    argument(
        gru.forward_with_lengths(&x(&[5, 2, 3], Kind::Float), None, &l64, Mode::Training),
        &["Rnn::forward_with_lengths", "lengths", "Int64", "Int (int32)"],
    );
    let h0 = x(&[1, 2, 4], Kind::Half);
    argument(gru.forward(&x(&[5, 2, 3], Kind::Float), Some(&h0), Mode::Inference), &["h0", "Half"]);

    let mut sk = SkLinear::new(&ctx, &SkLinearDesc::new(8, 4, 1, 2), 0, None).unwrap();
    argument(sk.forward(&x(&[2, 7], Kind::Float)), &["SkLinear::forward", "[2, 7]", "[..., 8]"]);
    argument(
        sk.backward(&x(&[2, 8], Kind::Float), &x(&[2, 4], Kind::Int)),
        &["SkLinear::backward", "dy", "Int"],
    );

    let mut conv = Kan::new(&ctx, &KanConv2dDesc::new(2, 3, (3, 3))).unwrap();
    argument(conv.forward(&x(&[1, 3, 5, 5], Kind::Float)), &["Kan::forward", "[1, 3, 5, 5]", "[B, 2, H, W]"]);
    argument(conv.forward(&x(&[1, 2, 2, 5], Kind::Float)), &["kernel fitting"]);
}

#[test]
fn what_kfuse_refuses_comes_back_with_its_message() {
    let ctx = context(Device::Cpu).unwrap();
    let mut gru = Rnn::new(&ctx, &RnnDesc::gru(3, 4)).unwrap();
    match gru.forward(&x(&[5, 2, 6], Kind::Float), None, Mode::Inference) {
        Err(Error::Kfuse(e)) => {
            assert_eq!(e.status(), kfuse_tch::kfuse::Status::InvalidArgument);
            assert!(e.message().contains("x") && e.message().contains('6'), "{e}");
        }
        r => panic!("expected Error::Kfuse, got {:?}", r.map(|_| ())),
    }
}

#[test]
fn parameters_are_checked_at_every_call() {
    let ctx = context(Device::Cpu).unwrap();
    let mut gru = Rnn::new(&ctx, &RnnDesc::gru(3, 4)).unwrap();
    gru.weights_mut()[1] = x(&[12, 5], Kind::Float);
    argument(
        gru.forward(&x(&[5, 2, 3], Kind::Float), None, Mode::Inference),
        &["weights[1] (weight_hh_l0)", "[12, 5]", "[12, 4]"],
    );
    let w: Vec<Tensor> = (0..3).map(|_| x(&[12, 3], Kind::Float)).collect();
    argument(
        Rnn::from_weights(&ctx, &RnnDesc::gru(3, 4), w),
        &["Rnn::from_weights", "3 weights, expected 4"],
    );

    let mut sk = SkLinear::new(&ctx, &SkLinearDesc::new(8, 4, 1, 2), 0, None).unwrap();
    sk.params.bias = None;
    argument(sk.forward(&x(&[2, 8], Kind::Float)), &["params.bias is absent", "bias = true"]);

    let mut kan = Kan::new(&ctx, &KanLinearDesc::new(3, 2)).unwrap();
    kan.params.grid = kan.params.grid.to_kind(Kind::Double);
    argument(kan.forward(&x(&[4, 3], Kind::Float)), &["params.grid", "Double"]);
}

#[test]
fn backward_takes_only_its_own_layers_saved_forward() {
    let ctx = context(Device::Cpu).unwrap();
    let (mut a, mut b) =
        (Rnn::new(&ctx, &RnnDesc::gru(3, 4)).unwrap(), Rnn::new(&ctx, &RnnDesc::gru(3, 4)).unwrap());
    let out = a.forward(&x(&[5, 2, 3], Kind::Float), None, Mode::Training).unwrap();
    argument(b.backward(out.saved.as_ref().unwrap(), None, None), &["Rnn::backward", "another layer"]);
    assert!(a.backward(out.saved.as_ref().unwrap(), None, None).is_ok());
}

#[test]
fn a_non_contiguous_input_gives_the_contiguous_result() {
    let ctx = context(Device::Cpu).unwrap();
    let mut kan = Kan::new(&ctx, &KanLinearDesc::new(3, 2)).unwrap();
    let xt = x(&[3, 6], Kind::Float).tr(); // [6, 3], strides [1, 6]
    assert_eq!(xt.stride(), [1, 6]);
    assert!(kan.forward(&xt).unwrap().equal(&kan.forward(&xt.contiguous()).unwrap()));
}
