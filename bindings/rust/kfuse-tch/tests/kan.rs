//! kfuse's KANLinear against efficient-kan's forward written with tch ops in float64 (its
//! `b_splines` recursion, SiLU base branch, scaled spline weight), and KANConv2d against
//! tch's im2col followed by the same; gradients of the reference by tch's autograd.
mod common;
use common::{assert_close, grads, leaf, randn};
use kfuse_tch::{context, Kan, KanConv2dDesc, KanKind, KanLinearDesc, KanTensors};
use tch::{Device, Kind, Tensor};

/// efficient-kan's `b_splines`: x `[N, F]`, grid `[F, G + 2k + 1]` -> `[N, F, G + k]`.
fn b_splines(x: &Tensor, grid: &Tensor, k: i64) -> Tensor {
    let x = x.unsqueeze(-1);
    let n = grid.size()[1];
    let g = |from: i64, to: i64| grid.narrow(1, from, to - from); // grid[:, from:to]
    let mut bases = x.ge_tensor(&g(0, n - 1)).logical_and(&x.lt_tensor(&g(1, n))).to_kind(x.kind());
    for j in 1..=k {
        let m = bases.size()[2];
        bases = (&x - g(0, n - j - 1)) / (g(j, n - 1) - g(0, n - j - 1)) * bases.narrow(2, 0, m - 1)
            + (g(j + 1, n) - &x) / (g(j + 1, n) - g(1, n - j)) * bases.narrow(2, 1, m - 1);
    }
    bases
}

/// efficient-kan's KANLinear forward on x `[N, F]`.
fn kan_linear(x: &Tensor, p: &[Tensor], k: i64) -> Tensor {
    let (grid, base_weight, spline_weight) = (&p[0], &p[1], &p[2]);
    let out = spline_weight.size()[0];
    let scaled = match p.get(3) {
        Some(s) => spline_weight * s.unsqueeze(-1),
        None => spline_weight.shallow_clone(),
    };
    let n = x.size()[0];
    x.silu().linear::<Tensor>(base_weight, None)
        + b_splines(x, grid, k).view([n, -1]).linear::<Tensor>(&scaled.view([out, -1]), None)
}

/// The layer's parameters as float64 leaves: grid (not differentiated), base_weight,
/// spline_weight, spline_scaler.
fn leaves(p: &KanTensors) -> Vec<Tensor> {
    [&p.grid, &p.base_weight, &p.spline_weight]
        .into_iter()
        .chain(p.spline_scaler.as_ref())
        .map(leaf)
        .collect()
}

/// Random parameters on the layer's uniform grid (spline_weight is zero after `new`).
fn randomise(p: &mut KanTensors) {
    p.base_weight = randn(&p.base_weight.size(), 0.5);
    p.spline_weight = randn(&p.spline_weight.size(), 0.5);
    if let Some(s) = p.spline_scaler.as_mut() {
        *s = randn(&s.size(), 1.0) + 0.5;
    }
}

/// kfuse's forward and backward on x against `reference(x64, params64)`.
fn check<L: KanKind>(desc: &L, x: &Tensor, reference: impl Fn(&Tensor, &[Tensor]) -> Tensor) {
    let ctx = context(Device::Cpu).unwrap();
    let mut kan = Kan::new(&ctx, desc).unwrap();
    randomise(&mut kan.params);
    let y = kan.forward(x).unwrap();
    let dy = randn(&y.size(), 1.0);
    let g = kan.backward(x, &dy).unwrap();

    let x64 = leaf(x);
    let p = leaves(&kan.params);
    let want = reference(&x64, &p);
    assert_close("y", &y, &want);
    let inputs: Vec<&Tensor> = [&x64].into_iter().chain(&p[1..]).collect();
    let w = grads(&[(&want, &dy)], &inputs);
    assert_close("dx", &g.dx, &w[0]);
    assert_close("dbase_weight", &g.dbase_weight, &w[1]);
    assert_close("dspline_weight", &g.dspline_weight, &w[2]);
    assert_eq!(g.dspline_scaler.is_some(), p.len() == 4);
    if let Some(ds) = &g.dspline_scaler {
        assert_close("dspline_scaler", ds, &w[3]);
    }
}

#[test]
fn kan_linear_matches_efficient_kan_in_tch() {
    tch::manual_seed(1);
    let desc = KanLinearDesc::new(6, 5);
    // Most samples inside the knots [-2.2, 2.2], some outside (bases zero there).
    check(&desc, &randn(&[40, 6], 1.2), |x, p| kan_linear(x, p, 3));
}

#[test]
fn kan_linear_order_2_without_scaler_on_3d_x_matches_efficient_kan_in_tch() {
    tch::manual_seed(2);
    let desc = KanLinearDesc::new(4, 3).grid_size(7).spline_order(2).standalone_scale(false);
    check(&desc, &randn(&[2, 5, 4], 0.8), |x, p| {
        let s = x.size();
        kan_linear(&x.view([-1, 4]), p, 2).view([s[0], s[1], 3])
    });
}

#[test]
fn kan_conv2d_matches_im2col_and_efficient_kan_in_tch() {
    tch::manual_seed(3);
    let desc = KanConv2dDesc::new(2, 3, (3, 2)).stride((2, 1)).padding((1, 1)).dilation((1, 2));
    let (b, h, w) = (2i64, 7i64, 6i64);
    let (ho, wo) = desc.output_size(h as usize, w as usize).unwrap();
    check(&desc, &randn(&[b, 2, h, w], 0.8), |x, p| {
        let cols = x.im2col(&[3, 2], &[1, 2], &[1, 1], &[2, 1]); // [B, F, Ho*Wo]
        let f = cols.size()[1];
        let rows = cols.transpose(1, 2).reshape(&[-1, f]);
        kan_linear(&rows, p, 3)
            .view([b, ho as i64 * wo as i64, 3])
            .transpose(1, 2)
            .reshape(&[b, 3, ho as i64, wo as i64])
    });
}

#[test]
fn new_gives_efficient_kans_grid() {
    let ctx = context(Device::Cpu).unwrap();
    let kan = Kan::new(&ctx, &KanLinearDesc::new(3, 2)).unwrap();
    // efficient-kan: h = 2 / G, grid = arange(-k, G + k + 1) * h - 1, the same row per feature.
    let want = (Tensor::arange_start(-3, 9, (tch::Kind::Double, Device::Cpu)) * (2.0 / 5.0) - 1.0)
        .expand(&[3, 12], false);
    assert_close("grid", &kan.params.grid, &want);
    assert!(kan.params.spline_weight.abs().max().double_value(&[]) == 0.0);
    // kaiming_uniform_(a = sqrt(5)): U(-1/sqrt(in), 1/sqrt(in)).
    for w in [&kan.params.base_weight, kan.params.spline_scaler.as_ref().unwrap()] {
        let m = w.abs().max().double_value(&[]);
        assert!(m > 0.0 && m <= 1.0 / 3f64.sqrt(), "{m}");
    }
}

#[test]
fn update_grid_gives_efficient_kans_knots_and_least_squares_refit() {
    tch::manual_seed(4);
    let ctx = context(Device::Cpu).unwrap();
    let (g, k, n, margin, eps) = (5i64, 3i64, 64i64, 0.01, 0.02);
    let mut kan = Kan::new(&ctx, &KanLinearDesc::new(3, 2).standalone_scale(false)).unwrap();
    randomise(&mut kan.params);
    let x = randn(&[n, 3], 0.6);
    let old = leaves(&kan.params);
    let grid_storage = kan.params.grid.data_ptr();
    kan.update_grid(&x, margin as f32, eps as f32).unwrap();
    assert_eq!(kan.params.grid.data_ptr(), grid_storage, "a contiguous grid is updated in place");

    // efficient-kan's update_grid, knots: quantiles of the sorted samples at torch's int64
    // linspace, mixed with a uniform grid over [min - margin, max + margin], extended by k steps.
    let xs = x.to_kind(Kind::Double).sort(0, false).0;
    let adaptive =
        xs.index_select(0, &Tensor::linspace(0.0, (n - 1) as f64, g + 1, (Kind::Int64, Device::Cpu)));
    let step = (xs.get(n - 1) - xs.get(0) + 2.0 * margin) / g as f64;
    let uniform =
        Tensor::arange(g + 1, (Kind::Double, Device::Cpu)).unsqueeze(1) * &step + xs.get(0) - margin;
    let inner = uniform * eps + adaptive * (1.0 - eps);
    let below = inner.narrow(0, 0, 1)
        - &step * Tensor::arange_start_step(k, 0, -1, (Kind::Double, Device::Cpu)).unsqueeze(1);
    let above = inner.narrow(0, g, 1)
        + &step * Tensor::arange_start(1, k + 1, (Kind::Double, Device::Cpu)).unsqueeze(1);
    let want = Tensor::cat(&[below, inner, above], 0).tr();
    assert_close("grid", &kan.params.grid, &want);

    // spline_weight: efficient-kan's curve2coeff, the least-squares coefficients on the new
    // knots of the old splines' values at the samples, per feature.
    let x64 = x.to_kind(Kind::Double);
    let old_values = b_splines(&x64, &old[0], k).permute(&[1, 0, 2]).bmm(&old[2].permute(&[1, 2, 0])); // [in, n, out]
    let a = b_splines(&x64, &kan.params.grid.to_kind(Kind::Double), k).permute(&[1, 0, 2]); // [in, n, G + k]
    let want = a.linalg_lstsq(&old_values, None, "gelsd").0.permute(&[2, 0, 1]); // [out, in, G + k]
    assert_close("spline_weight", &kan.params.spline_weight, &want);
}
