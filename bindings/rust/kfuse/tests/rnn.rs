//! The safe API against float64 references (forward directly, backward by central finite
//! differences of the float64 forward), and the error mapping.
mod common;
use common::*;
use kfuse::*;

struct Problem {
    x: Vec<f32>,
    h0: Vec<f32>,
    w: Vec<Vec<f32>>,
}

fn desc_of(c: &Cfg) -> RnnDesc {
    let d = if c.agru { RnnDesc::agru(c.i, c.h).gamma(c.gamma as f32) } else { RnnDesc::gru(c.i, c.h) };
    d.layers(c.l as u32).batch_first(c.batch_first).bidirectional(c.d == 2)
}

fn problem<T: Float>(plan: &RnnPlan<'_, T>, c: Cfg, seed: u64) -> Problem {
    let mut rng = Rng::new(seed);
    let k = 1.0 / (c.h as f64).sqrt();
    let w = plan
        .weight_info()
        .iter()
        .map(
            |wi| if wi.name.ends_with("epsilon") { rng.vec(1, 0.5, 1.5) } else { rng.vec(wi.numel(), -k, k) },
        )
        .collect();
    Problem { x: rng.vec(c.t * c.b * c.i, -1.0, 1.0), h0: rng.vec(c.l * c.d * c.b * c.h, -0.5, 0.5), w }
}

fn configs() -> Vec<Cfg> {
    let base = Cfg { agru: false, t: 5, b: 3, i: 4, h: 6, l: 1, d: 1, batch_first: false, gamma: 0.01 };
    vec![
        base,
        Cfg { l: 2, d: 2, batch_first: true, ..base },
        Cfg { agru: true, ..base },
        Cfg { agru: true, l: 2, batch_first: true, gamma: 0.1, ..base },
    ]
}

#[test]
fn forward_matches_f64_reference() {
    let ctx = Context::cpu().unwrap();
    for (n, c) in configs().into_iter().enumerate() {
        let mut plan = RnnPlan::new(&ctx, &desc_of(&c)).unwrap();
        let p = problem(&plan, c, 100 + n as u64);
        let w64: Vec<Vec<f64>> = p.w.iter().map(|v| to_f64(v)).collect();
        let (yr, hr) = forward(&c, &to_f64(&p.x), Some(&to_f64(&p.h0)), &w64);
        for mode in [Mode::Inference, Mode::Training] {
            let mut y = vec![f32::NAN; yr.len()]; // poisoned: every element must be written
            let mut hn = vec![f32::NAN; hr.len()];
            let args = ForwardArgs::new(
                Tensor::new(&p.x, &plan.x_shape(c.t, c.b)),
                &p.w,
                TensorMut::new(&mut y, &plan.y_shape(c.t, c.b)),
            )
            .h0(Tensor::new(&p.h0, &plan.state_shape(c.b)))
            .hn(TensorMut::new(&mut hn, &plan.state_shape(c.b)));
            let r = plan.forward(mode, &args).unwrap();
            assert_eq!(r.is_some(), mode == Mode::Training);
            let (ey, eh) = (rel_err(&y, &yr), rel_err(&hn, &hr));
            assert!(ey < 1e-5 && eh < 1e-5, "{c:?} {mode:?}: y rel err {ey:.3e}, hn rel err {eh:.3e}");
        }
    }
}

/// Central differences of L = sum(cy * y) + sum(ch * hn) through the float64 reference.
#[derive(Clone, Copy)]
enum Which {
    X(usize),
    H0(usize),
    W(usize, usize),
}

fn fd_grad(c: &Cfg, x: &[f64], h0: &[f64], w: &[Vec<f64>], cy: &[f64], ch: &[f64], which: Which) -> f64 {
    let loss = |x: &[f64], h0: &[f64], w: &[Vec<f64>]| {
        let (y, hn) = forward(c, x, Some(h0), w);
        y.iter().zip(cy).map(|(a, b)| a * b).sum::<f64>() + hn.iter().zip(ch).map(|(a, b)| a * b).sum::<f64>()
    };
    let eps = 1e-6;
    let at = |delta: f64| {
        let (mut xa, mut ha, mut wa) = (x.to_vec(), h0.to_vec(), w.to_vec());
        match which {
            Which::X(k) => xa[k] += delta,
            Which::H0(k) => ha[k] += delta,
            Which::W(j, k) => wa[j][k] += delta,
        }
        loss(&xa, &ha, &wa)
    };
    let (lp, lm) = (at(eps), at(-eps));
    (lp - lm) / (2.0 * eps)
}

/// One CPU thread: checks the bindings' plumbing of every gradient.
#[test]
fn backward_matches_f64_finite_differences_one_thread() {
    backward_vs_fd(1, 1);
}

/// The default context (all cores), as users get it; run a few times, since a race would show
/// only now and then.
#[test]
fn backward_matches_f64_finite_differences_default_threads() {
    backward_vs_fd(0, 3);
}

/// Every config's float32 plan on `threads` threads, `runs` times, against one reference each.
fn backward_vs_fd(threads: u32, runs: usize) {
    for n in 0..configs().len() {
        let case = fd_case(n, |_| {});
        for _ in 0..runs {
            check_plan::<f32>(threads, &case, 1e-5);
        }
    }
}

/// bfloat16 and float16 plans (`RnnPlan::<bf16>::new_typed`, `<f16>`): storage in the type,
/// float32 arithmetic, one rounding, so y, hn and every gradient (accumulated too) within
/// u + 1e-5 of the float64 reference on the same inputs (tests/c/test_lowp.c's bound). One
/// problem serves both: rounded to bfloat16 and then to float16, each value is both (8
/// significant bits within float16's range, or a multiple of 2^-24 with fewer below it).
#[test]
fn low_precision_plans_match_f64_reference() {
    for n in 0..configs().len() {
        let case = fd_case(n, |v| {
            round_to::<half::bf16>(v);
            round_to::<half::f16>(v);
        });
        check_plan::<half::bf16>(0, &case, half::bf16::TOL);
        check_plan::<half::f16>(0, &case, half::f16::TOL);
    }
}

/// What [`fwd_bwd`] returns: y, hn and every gradient (all poisoned with NaN before the calls).
struct FwdBwd<T> {
    y: Vec<T>,
    hn: Vec<T>,
    dx: Vec<T>,
    dh0: Vec<T>,
    dw: Vec<Vec<T>>,
}

/// A training forward with h0 and hn, then backward of L = sum(cy * y) + sum(ch * hn) with
/// every gradient output, through a plan of element type `T`; the weight gradients overwritten,
/// or with `dw0` added to them (GradMode::Accumulate).
#[allow(clippy::too_many_arguments)]
fn fwd_bwd<T: TestFloat>(
    plan: &mut RnnPlan<'_, T>,
    c: &Cfg,
    x: &[T],
    h0: &[T],
    w: &[Vec<T>],
    cy: &[T],
    ch: &[T],
    dw0: Option<&[Vec<T>]>,
) -> FwdBwd<T> {
    let nan = T::from_f32(f32::NAN);
    let (mut y, mut hn) = (vec![nan; cy.len()], vec![nan; ch.len()]);
    let (mut dx, mut dh0) = (vec![nan; x.len()], vec![nan; h0.len()]);
    let mut dw: Vec<Vec<T>> = match dw0 {
        Some(d) => d.to_vec(),
        None => w.iter().map(|v| vec![nan; v.len()]).collect(),
    };
    let fwd = ForwardArgs::new(
        Tensor::new(x, &plan.x_shape(c.t, c.b)),
        w,
        TensorMut::new(&mut y, &plan.y_shape(c.t, c.b)),
    )
    .h0(Tensor::new(h0, &plan.state_shape(c.b)))
    .hn(TensorMut::new(&mut hn, &plan.state_shape(c.b)));
    let reserve = plan.forward(Mode::Training, &fwd).unwrap().unwrap();
    let bwd = BackwardArgs::from_forward(&fwd)
        .dy(Tensor::new(cy, &plan.y_shape(c.t, c.b)))
        .dhn(Tensor::new(ch, &plan.state_shape(c.b)))
        .dx(TensorMut::new(&mut dx, &plan.x_shape(c.t, c.b)))
        .dh0(TensorMut::new(&mut dh0, &plan.state_shape(c.b)))
        .dweights(WeightGrads::from_vecs(&mut dw));
    let mode = if dw0.is_some() { GradMode::Accumulate } else { GradMode::Overwrite };
    plan.backward(mode, &bwd, &reserve).unwrap();
    drop((fwd, bwd));
    FwdBwd { y, hn, dx, dh0, dw }
}

/// Problem `n` of [`configs`] (T = 4, B = 2) with every value passed through `round`, the loss
/// L = sum(cy * y) + sum(ch * hn), random weight gradients to accumulate onto, and the float64
/// references: y and hn, and every gradient of L by central differences of the forward.
struct FdCase {
    c: Cfg,
    p: Problem,
    cy: Vec<f32>,
    ch: Vec<f32>,
    dw0: Vec<Vec<f32>>,
    yr: Vec<f64>,
    hr: Vec<f64>,
    gx: Vec<f64>,
    gh: Vec<f64>,
    gw: Vec<Vec<f64>>,
}

fn fd_case(n: usize, round: fn(&mut [f32])) -> FdCase {
    let c = Cfg { t: 4, b: 2, ..configs()[n] };
    let ctx = Context::cpu().unwrap();
    let mut p = problem(&RnnPlan::new(&ctx, &desc_of(&c)).unwrap(), c, 200 + n as u64);
    let mut rng = Rng::new(300 + n as u64);
    let mut cy = rng.vec(c.t * c.b * c.d * c.h, -1.0, 1.0);
    let mut ch = rng.vec(c.l * c.d * c.b * c.h, -1.0, 1.0);
    let mut dw0: Vec<Vec<f32>> = p.w.iter().map(|v| rng.vec(v.len(), -1.0, 1.0)).collect();
    for v in [&mut p.x, &mut p.h0, &mut cy, &mut ch].into_iter().chain(&mut p.w).chain(&mut dw0) {
        round(v);
    }
    let (x64, h064, cy64, ch64) = (to_f64(&p.x), to_f64(&p.h0), to_f64(&cy), to_f64(&ch));
    let w64: Vec<Vec<f64>> = p.w.iter().map(|v| to_f64(v)).collect();
    let (yr, hr) = forward(&c, &x64, Some(&h064), &w64);
    let fd = |which: &dyn Fn(usize) -> Which, len: usize| -> Vec<f64> {
        (0..len).map(|k| fd_grad(&c, &x64, &h064, &w64, &cy64, &ch64, which(k))).collect()
    };
    let (gx, gh) = (fd(&Which::X, x64.len()), fd(&Which::H0, h064.len()));
    let gw = (0..w64.len()).map(|j| fd(&|k| Which::W(j, k), w64[j].len())).collect();
    FdCase { c, p, cy, ch, dw0, yr, hr, gx, gh, gw }
}

/// A plan of element type `T` on `threads` threads (0: the default) with the case's values
/// (exact in `T`) against its references, each output within `tol`: y and hn of the training
/// forward, and every gradient overwritten, then accumulated onto the case's weight gradients
/// (dx and dh0 overwritten in both).
fn check_plan<T: TestFloat>(threads: u32, case: &FdCase, tol: f64) {
    let FdCase { c, p, yr, hr, gx, gh, gw, .. } = case;
    let at0 = format!("{} threads={threads} {c:?}", std::any::type_name::<T>());
    let ctx = Context::builder(Device::Cpu).with_threads(threads).build().unwrap();
    let exact = |v: &[f32]| -> Vec<T> {
        let t = cast::<T>(v);
        assert!(t.iter().zip(v).all(|(&a, &b)| a.into() == b as f64), "{at0}: a value not exact in the type");
        t
    };
    let mut plan = RnnPlan::<T>::new_typed(&ctx, &desc_of(c)).unwrap();
    let (x, h0, cy, ch) = (exact(&p.x), exact(&p.h0), exact(&case.cy), exact(&case.ch));
    let w: Vec<Vec<T>> = p.w.iter().map(|v| exact(v)).collect();
    let dw0: Vec<Vec<T>> = case.dw0.iter().map(|v| exact(v)).collect();
    for accumulate in [false, true] {
        let at = format!("{at0} accumulate={accumulate}");
        let out = fwd_bwd(&mut plan, c, &x, &h0, &w, &cy, &ch, accumulate.then_some(&dw0[..]));
        for (what, out, r) in
            [("y", &out.y, yr), ("hn", &out.hn, hr), ("dx", &out.dx, gx), ("dh0", &out.dh0, gh)]
        {
            let e = rel_err(out, r);
            assert!(e <= tol, "{at}: {what} rel err {e:.3e}");
        }
        for (j, info) in plan.weight_info().iter().enumerate() {
            let want: Vec<f64> = if accumulate {
                gw[j].iter().zip(&case.dw0[j]).map(|(&g, &g0)| g + g0 as f64).collect()
            } else {
                gw[j].clone()
            };
            let e = rel_err(&out.dw[j], &want);
            assert!(e <= tol, "{at}: d{} rel err {e:.3e}", info.name);
        }
    }
}

#[test]
fn accumulate_adds_and_reserve_is_reused_without_growth() {
    let ctx = Context::builder(Device::Cpu).with_threads(1).build().unwrap();
    let c = Cfg { agru: true, t: 6, b: 4, i: 3, h: 5, l: 1, d: 1, batch_first: false, gamma: 0.01 };
    let mut plan = RnnPlan::new(&ctx, &desc_of(&c)).unwrap();
    let p = problem(&plan, c, 7);
    let dy = Rng::new(8).vec(c.t * c.b * c.h, -1.0, 1.0);
    let mut y = vec![0.0f32; dy.len()];
    let mut reserve = Reserve::new();
    let mut once: Vec<Vec<f32>> = p.w.iter().map(|v| vec![0.0; v.len()]).collect();
    let mut twice = once.clone();
    let mut grows = Vec::new();
    for step in 0..4 {
        let fwd = ForwardArgs::new(
            Tensor::new(&p.x, &plan.x_shape(c.t, c.b)),
            &p.w,
            TensorMut::new(&mut y, &plan.y_shape(c.t, c.b)),
        );
        plan.forward_into(Mode::Training, &fwd, &mut reserve).unwrap();
        let target = if step == 0 { &mut once } else { &mut twice };
        let mode = if step <= 1 { GradMode::Overwrite } else { GradMode::Accumulate };
        let bwd = BackwardArgs::from_forward(&fwd)
            .dy(Tensor::new(&dy, &plan.y_shape(c.t, c.b)))
            .dweights(WeightGrads::from_vecs(target));
        plan.backward(mode, &bwd, &reserve).unwrap();
        grows.push((ctx.arena_info().unwrap().grow_count, reserve.capacity_bytes()));
    }
    // step 1 overwrote, steps 2 and 3 added: three times step 0's gradient
    for (a, b) in once.iter().flatten().zip(twice.iter().flatten()) {
        assert!((3.0 * a - b).abs() <= 1e-5 * (1.0 + b.abs()), "{a} * 3 != {b}");
    }
    assert!(grows.windows(2).all(|w| w[0] == w[1]), "arena or reserve grew in steady state: {grows:?}");
    assert!(reserve.len_bytes() > 0);
}

#[test]
fn weight_info_uses_reference_names() {
    let ctx = Context::cpu().unwrap();
    let plan = RnnPlan::new(&ctx, &RnnDesc::gru(3, 4).layers(2).bidirectional(true)).unwrap();
    let info = plan.weight_info();
    assert_eq!(info.len(), 16);
    assert_eq!(info[0], WeightInfo { name: "weight_ih_l0".into(), shape: vec![12, 3] });
    assert_eq!(info[4].name, "weight_ih_l0_reverse");
    assert_eq!(info[8], WeightInfo { name: "weight_ih_l1".into(), shape: vec![12, 8] });
    let plan = RnnPlan::new(&ctx, &RnnDesc::agru(3, 4)).unwrap();
    let names: Vec<String> = plan.weight_info().into_iter().map(|w| w.name).collect();
    assert_eq!(names[8], "cells.0.W_h");
    assert_eq!(names[9], "cells.0.epsilon");
}

// ---- errors ------------------------------------------------------------------------------

#[test]
fn bad_descriptor_names_the_field() {
    let ctx = Context::cpu().unwrap();
    let e = RnnPlan::new(&ctx, &RnnDesc::gru(0, 4)).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().contains("input_size"), "{e}");
    let e = RnnPlan::new(&ctx, &RnnDesc::gru(3, 4).dropout(1.5)).unwrap_err();
    assert!(e.message().contains("dropout"), "{e}");
    let e = RnnPlan::new(&ctx, &RnnDesc::agru(3, 4).bidirectional(true)).unwrap_err();
    assert_eq!(e.status(), Status::Unsupported, "{e}");
    assert!(e.to_string().contains("KF_ERR_UNSUPPORTED"), "{e}");
}

#[test]
fn bad_shape_is_an_error_naming_the_argument() {
    let ctx = Context::cpu().unwrap();
    let mut plan = RnnPlan::new(&ctx, &RnnDesc::gru(3, 4)).unwrap();
    let w: Vec<Vec<f32>> = plan.weight_info().iter().map(|i| vec![0.1; i.numel()]).collect();
    let (t, b) = (5, 2);
    let mut y = vec![7.0f32; t * b * 4];

    // shape consistent with the slice but wrong for the plan: the library's message
    let x = vec![0.5f32; t * b * 6];
    let args = ForwardArgs::new(Tensor::new(&x, &[t, b, 6]), &w, TensorMut::new(&mut y, &[t, b, 4]));
    let e = plan.forward(Mode::Inference, &args).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().starts_with("kf_rnn_forward") && e.message().contains("args->x"), "{e}");
    assert!(y.iter().all(|&v| v == 7.0), "a failed call wrote y");

    // slice shorter than its shape: checked before the call
    let x = vec![0.5f32; t * b * 3 - 1];
    let args = ForwardArgs::new(Tensor::new(&x, &[t, b, 3]), &w, TensorMut::new(&mut y, &[t, b, 4]));
    let e = plan.forward(Mode::Inference, &args).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().contains("args.x has 29 elements"), "{e}");

    // y of the wrong width
    let x = vec![0.5f32; t * b * 3];
    let mut y5 = vec![0.0f32; t * b * 5];
    let args = ForwardArgs::new(Tensor::new(&x, &[t, b, 3]), &w, TensorMut::new(&mut y5, &[t, b, 5]));
    let e = plan.forward(Mode::Inference, &args).unwrap_err();
    assert!(e.message().contains("args->y"), "{e}");

    // a weight of the wrong length, and the wrong number of weights
    let mut w2 = w.clone();
    w2[3].pop();
    let args = ForwardArgs::new(Tensor::new(&x, &[t, b, 3]), &w2, TensorMut::new(&mut y, &[t, b, 4]));
    let e = plan.forward(Mode::Inference, &args).unwrap_err();
    assert!(e.message().contains("args.weights[3] (bias_hh_l0)"), "{e}");
    let args = ForwardArgs::new(Tensor::new(&x, &[t, b, 3]), &w[..3], TensorMut::new(&mut y, &[t, b, 4]));
    let e = plan.forward(Mode::Inference, &args).unwrap_err();
    assert!(e.message().contains("args.weights has 3 entries, expected 4"), "{e}");

    // too many dimensions
    let args =
        ForwardArgs::new(Tensor::new(&x, &[1, 1, 1, 1, 1, t, b * 3]), &w, TensorMut::new(&mut y, &[t, b, 4]));
    let e = plan.forward(Mode::Inference, &args).unwrap_err();
    assert!(e.message().contains("at most 6"), "{e}");

    // lengths out of range
    let lens = [5i32, 9];
    let args = ForwardArgs::new(Tensor::new(&x, &[t, b, 3]), &w, TensorMut::new(&mut y, &[t, b, 4]))
        .lengths(Tensor::new(&lens, &[b]));
    let e = plan.forward(Mode::Inference, &args).unwrap_err();
    assert!(e.message().contains("args->lengths[1]"), "{e}");
}

#[test]
fn backward_needs_a_training_reserve_of_the_same_plan() {
    let ctx = Context::cpu().unwrap();
    let mut plan = RnnPlan::new(&ctx, &RnnDesc::gru(3, 4)).unwrap();
    let mut other = RnnPlan::new(&ctx, &RnnDesc::gru(3, 4)).unwrap();
    let w: Vec<Vec<f32>> = plan.weight_info().iter().map(|i| vec![0.1; i.numel()]).collect();
    let x = vec![0.5f32; 2 * 2 * 3];
    let mut y = vec![0.0f32; 2 * 2 * 4];
    let mut reserve = Reserve::new();
    let fwd = ForwardArgs::new(Tensor::new(&x, &[2, 2, 3]), &w, TensorMut::new(&mut y, &[2, 2, 4]));
    plan.forward_into(Mode::Inference, &fwd, &mut reserve).unwrap();
    let bwd = BackwardArgs::from_forward(&fwd);
    let e = plan.backward(GradMode::Overwrite, &bwd, &reserve).unwrap_err();
    assert!(e.message().contains("reserve was not written"), "{e}");
    plan.forward_into(Mode::Training, &fwd, &mut reserve).unwrap();
    plan.backward(GradMode::Overwrite, &bwd, &reserve).unwrap();
    let e = other.backward(GradMode::Overwrite, &bwd, &reserve).unwrap_err();
    assert!(e.message().contains("of this plan"), "{e}");
}

#[test]
fn cuda_context_without_cuda_is_backend_unavailable() {
    match Context::cuda(0) {
        Ok(ctx) => {
            // a CUDA build on a GPU machine: host slices must be refused before the call
            assert_eq!(ctx.device(), Device::Cuda(0));
            let mut plan = RnnPlan::new(&ctx, &RnnDesc::gru(3, 4)).unwrap();
            let w: Vec<Vec<f32>> = plan.weight_info().iter().map(|i| vec![0.1; i.numel()]).collect();
            let (x, mut y) = (vec![0.5f32; 2 * 2 * 3], vec![0.0f32; 2 * 2 * 4]);
            let args = ForwardArgs::new(Tensor::new(&x, &[2, 2, 3]), &w, TensorMut::new(&mut y, &[2, 2, 4]));
            let e = plan.forward(Mode::Inference, &args).unwrap_err();
            assert!(e.message().contains("host memory"), "{e}");
        }
        Err(e) => assert_eq!(e.status(), Status::BackendUnavailable, "{e}"),
    }
    let e = Context::builder(Device::Cuda(-1)).build().unwrap_err();
    assert!(matches!(e.status(), Status::InvalidArgument | Status::BackendUnavailable), "{e}");
}

#[test]
fn stream_on_cpu_context() {
    let ctx = Context::cpu().unwrap();
    assert!(ctx.stream().unwrap().is_null());
    // SAFETY: null is always a valid argument.
    unsafe { ctx.set_stream(std::ptr::null_mut()).unwrap() };
    let mut fake = 0u8;
    // SAFETY: a CPU context rejects any non-null stream before using it.
    let e = unsafe { ctx.set_stream(&mut fake as *mut u8 as *mut _) }.unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    ctx.synchronize().unwrap();
}

#[test]
fn context_moves_to_another_thread() {
    fn assert_send<T: Send>() {}
    assert_send::<Context>();
    assert_send::<Reserve>();
    let ctx = Context::cpu().unwrap();
    let h = std::thread::spawn(move || {
        let plan = RnnPlan::new(&ctx, &RnnDesc::agru(2, 3)).unwrap();
        plan.weight_count()
    });
    assert_eq!(h.join().unwrap(), 10);
}

#[test]
fn version_is_the_headers() {
    assert_eq!(kfuse::version(), (sys::KF_VERSION_MAJOR, sys::KF_VERSION_MINOR, sys::KF_VERSION_PATCH));
    assert_eq!(
        kfuse::version_string(),
        format!("{}.{}.{}", sys::KF_VERSION_MAJOR, sys::KF_VERSION_MINOR, sys::KF_VERSION_PATCH)
    );
}

/// A float64 plan (`RnnPlan::<f64>::new_typed`) computes in float64. Forward: y and hn within
/// 1e-12 of the float64 reference. Backward: for random directions v over x, h0 and every weight,
/// <gradient, v> against the fourth-order central difference of the reference's loss along v
/// (an error of about 1e-12, where float32 gradients would be 1e-6 off), within 1e-9.
#[test]
fn float64_plan_matches_f64_reference() {
    for threads in [1, 0] {
        let ctx = Context::builder(Device::Cpu).with_threads(threads).build().unwrap();
        // gamma exactly representable: kf_rnn_desc.gamma is a float
        for (n, mut c) in configs().into_iter().enumerate() {
            c.gamma = 0.0625;
            let mut plan = RnnPlan::<f64>::new_typed(&ctx, &desc_of(&c)).unwrap();
            let mut rng = Rng::new(500 + n as u64);
            let k = 1.0 / (c.h as f64).sqrt();
            let f = |v: Vec<f32>| to_f64(&v);
            let x = f(rng.vec(c.t * c.b * c.i, -1.0, 1.0));
            let h0 = f(rng.vec(c.l * c.d * c.b * c.h, -0.5, 0.5));
            let w: Vec<Vec<f64>> =
                plan.weight_info()
                    .iter()
                    .map(|wi| {
                        if wi.name.ends_with("epsilon") {
                            vec![0.75]
                        } else {
                            f(rng.vec(wi.numel(), -k, k))
                        }
                    })
                    .collect();
            let (yr, hr) = forward(&c, &x, Some(&h0), &w);
            let cy = f(rng.vec(yr.len(), -1.0, 1.0));
            let ch = f(rng.vec(hr.len(), -1.0, 1.0));

            let FwdBwd { y, hn, dx, dh0, dw } = fwd_bwd(&mut plan, &c, &x, &h0, &w, &cy, &ch, None);
            let (ey, eh) = (rel_err(&y, &yr), rel_err(&hn, &hr));
            assert!(ey < 1e-12 && eh < 1e-12, "threads={threads} {c:?}: y {ey:.3e}, hn {eh:.3e}");

            let loss = |x: &[f64], h0: &[f64], w: &[Vec<f64>]| {
                let (y, hn) = forward(&c, x, Some(h0), w);
                y.iter().zip(&cy).map(|(a, b)| a * b).sum::<f64>()
                    + hn.iter().zip(&ch).map(|(a, b)| a * b).sum::<f64>()
            };
            let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(p, q)| p * q).sum::<f64>();
            for trial in 0..3 {
                let mut r = Rng::new(900 + 10 * n as u64 + trial);
                let vx = f(r.vec(x.len(), -1.0, 1.0));
                let vh = f(r.vec(h0.len(), -1.0, 1.0));
                let vw: Vec<Vec<f64>> = w.iter().map(|v| f(r.vec(v.len(), -1.0, 1.0))).collect();
                let step = |s: f64| {
                    let add =
                        |a: &[f64], v: &[f64]| a.iter().zip(v).map(|(p, q)| p + s * q).collect::<Vec<_>>();
                    let ws: Vec<Vec<f64>> = w.iter().zip(&vw).map(|(a, v)| add(a, v)).collect();
                    loss(&add(&x, &vx), &add(&h0, &vh), &ws)
                };
                // fourth-order central difference: truncation ~ eps^4, about 1e-12 here
                let eps = 1e-3;
                let fd =
                    (8.0 * (step(eps) - step(-eps)) - (step(2.0 * eps) - step(-2.0 * eps))) / (12.0 * eps);
                let g =
                    dot(&dx, &vx) + dot(&dh0, &vh) + dw.iter().zip(&vw).map(|(d, v)| dot(d, v)).sum::<f64>();
                assert!(
                    (g - fd).abs() <= 1e-9 * (1.0 + fd.abs()),
                    "threads={threads} {c:?} direction {trial}: <grad, v> = {g}, central difference {fd}"
                );
            }
        }
    }
}
