//! KANLinear through the safe API against a float64 reference written here: the Cox-de Boor
//! recurrence over every index (zero-width spans count as 0) carried with its derivative in x
//! (forward mode), SiLU and its derivative, the layer and its gradients by the chain rule
//! (themselves checked against central differences of the reference forward); efficient-kan's
//! initial grid; accumulation, optional outputs and the caller workspace; errors naming the
//! argument. KANConv2d likewise, its reference being naive unfold loops into patches, the
//! KANLinear reference over them, and the patch gradients folded back onto x.
// The reference is written with explicit indices, as the formulas are.
#![allow(clippy::needless_range_loop)]
mod common;
use common::*;
use kfuse::*;

#[derive(Clone, Copy, Debug)]
enum Grid {
    /// efficient-kan's initial grid on [-1, 1] (kf_kan_linear_uniform_grid)
    Uniform,
    /// sorted random knots per feature, with one repeated knot (a zero-width span)
    Random,
}

#[derive(Clone, Copy, Debug)]
struct Cfg {
    inf: usize,
    outf: usize,
    g: usize,
    k: usize,
    scale: bool,
    grid: Grid,
    /// x's leading dims (their product is N)
    lead: &'static [usize],
}

impl Cfg {
    fn n(&self) -> usize {
        self.lead.iter().product()
    }
    fn c(&self) -> usize {
        self.g + self.k
    }
    fn nk(&self) -> usize {
        self.g + 2 * self.k + 1
    }
    fn desc(&self) -> KanLinearDesc {
        KanLinearDesc::new(self.inf, self.outf)
            .grid_size(self.g as u32)
            .spline_order(self.k as u32)
            .standalone_scale(self.scale)
    }
    fn x_shape(&self) -> Vec<usize> {
        lead_shape(self.lead, self.inf)
    }
    fn y_shape(&self) -> Vec<usize> {
        lead_shape(self.lead, self.outf)
    }
}

fn configs() -> Vec<Cfg> {
    vec![
        Cfg { inf: 5, outf: 3, g: 5, k: 3, scale: true, grid: Grid::Uniform, lead: &[7] },
        Cfg { inf: 9, outf: 6, g: 5, k: 3, scale: false, grid: Grid::Random, lead: &[2, 3] },
        Cfg { inf: 4, outf: 5, g: 4, k: 0, scale: true, grid: Grid::Uniform, lead: &[6] }, // k = 0
        Cfg { inf: 6, outf: 4, g: 3, k: 0, scale: true, grid: Grid::Random, lead: &[5] },
        Cfg { inf: 7, outf: 2, g: 8, k: 1, scale: true, grid: Grid::Random, lead: &[1] }, // batch 1
        Cfg { inf: 33, outf: 20, g: 5, k: 2, scale: true, grid: Grid::Random, lead: &[40] },
        Cfg { inf: 3, outf: 3, g: 1, k: 3, scale: false, grid: Grid::Uniform, lead: &[9] },
    ]
}

/// Inputs and parameters in float32 (what kfuse gets).
struct Problem {
    x: Vec<f32>,
    p: KanHostParams,
    dy: Vec<f32>,
}

/// The problem of `c` for a plan of any KAN kind (its uniform grid is KANLinear's over c.inf).
fn problem<L: KanLayer>(c: &Cfg, plan: &KanPlan<'_, L>, seed: u64) -> Problem {
    let mut rng = Rng::new(seed);
    let d = c.desc();
    let mut p = KanHostParams::zeros(&d);
    p.grid = match c.grid {
        Grid::Uniform => plan.uniform_grid(-1.0, 1.0).unwrap(),
        Grid::Random => {
            let mut g = Vec::new();
            for _ in 0..c.inf {
                let mut row = rng.vec(c.nk(), -2.0, 2.0);
                if c.nk() >= 4 {
                    row[2] = row[1]; // a repeated knot
                }
                row.sort_by(|a, b| a.partial_cmp(b).unwrap());
                g.extend(row);
            }
            g
        }
    };
    // x mostly inside the grid, some rows outside (uniform grid spans [-1 - kh, 1 + kh])
    let x = rng.vec(c.n() * c.inf, -2.3, 2.3);
    p.base_weight = rng.vec(c.outf * c.inf, -0.5, 0.5);
    p.spline_weight = rng.vec(c.outf * c.inf * c.c(), -0.5, 0.5);
    if let Some(s) = &mut p.spline_scaler {
        *s = rng.vec(c.outf * c.inf, 0.5, 1.5);
    }
    let dy = rng.vec(c.n() * c.outf, -1.0, 1.0);
    Problem { x, p, dy }
}

// ---- the float64 reference ---------------------------------------------------------------

/// The C = nk - 1 - k bases of order k at x on knots t, and their derivatives in x: Cox-de Boor
/// over every index (order 0 on half-open intervals), a term over a zero-width span counting 0.
fn bases(t: &[f64], k: usize, x: f64) -> (Vec<f64>, Vec<f64>) {
    let nk = t.len();
    let mut b: Vec<f64> = (0..nk - 1).map(|j| if t[j] <= x && x < t[j + 1] { 1.0 } else { 0.0 }).collect();
    let mut db = vec![0.0; nk - 1];
    for p in 1..=k {
        let m = nk - 1 - p;
        let (mut nb, mut ndb) = (vec![0.0; m], vec![0.0; m]);
        for j in 0..m {
            let (w1, w2) = (t[j + p] - t[j], t[j + p + 1] - t[j + 1]);
            if w1 > 0.0 {
                nb[j] += (x - t[j]) / w1 * b[j];
                ndb[j] += b[j] / w1 + (x - t[j]) / w1 * db[j];
            }
            if w2 > 0.0 {
                nb[j] += (t[j + p + 1] - x) / w2 * b[j + 1];
                ndb[j] += -b[j + 1] / w2 + (t[j + p + 1] - x) / w2 * db[j + 1];
            }
        }
        b = nb;
        db = ndb;
    }
    (b, db)
}

fn silu(x: f64) -> (f64, f64) {
    let s = 1.0 / (1.0 + (-x).exp());
    (x * s, s * (1.0 + x * (1.0 - s)))
}

struct Ref {
    y: Vec<f64>,
    dx: Vec<f64>,
    dbw: Vec<f64>,
    dsw: Vec<f64>,
    dss: Vec<f64>,
}

/// y and (for dy) every gradient, in float64 from the float32 inputs.
fn reference(c: &Cfg, x: &[f32], p: &KanHostParams, dy: &[f32]) -> Ref {
    let (n, inf, outf, cc, nk) = (c.n(), c.inf, c.outf, c.c(), c.nk());
    let (g, bw, sw) = (to_f64(&p.grid), to_f64(&p.base_weight), to_f64(&p.spline_weight));
    let ss = p.spline_scaler.as_ref().map(|s| to_f64(s)).unwrap_or_else(|| vec![1.0; outf * inf]);
    let dy = to_f64(dy);
    let mut r = Ref {
        y: vec![0.0; n * outf],
        dx: vec![0.0; n * inf],
        dbw: vec![0.0; outf * inf],
        dsw: vec![0.0; outf * inf * cc],
        dss: vec![0.0; outf * inf],
    };
    for row in 0..n {
        for i in 0..inf {
            let xv = x[row * inf + i] as f64;
            let (b, db) = bases(&g[i * nk..(i + 1) * nk], c.k, xv);
            let (s, ds) = silu(xv);
            for o in 0..outf {
                let oi = o * inf + i;
                let spline: f64 = (0..cc).map(|q| sw[oi * cc + q] * b[q]).sum();
                let dspline: f64 = (0..cc).map(|q| sw[oi * cc + q] * db[q]).sum();
                let d = dy[row * outf + o];
                r.y[row * outf + o] += bw[oi] * s + ss[oi] * spline;
                r.dx[row * inf + i] += d * (bw[oi] * ds + ss[oi] * dspline);
                r.dbw[oi] += d * s;
                r.dss[oi] += d * spline;
                for q in 0..cc {
                    r.dsw[oi * cc + q] += d * ss[oi] * b[q];
                }
            }
        }
    }
    r
}

/// Forward and backward through a plan of any KAN kind and element type `T` (the problem's
/// float32 values converted exactly), x and y of the shapes `xs` and `ys`: [y, dx, d base_weight,
/// d spline_weight, d spline_scaler (empty without a scaler)].
fn run<L: KanLayer, T: TestFloat>(
    plan: &mut KanPlan<'_, L, T>,
    pr: &Problem,
    xs: &[usize],
    ys: &[usize],
    mode: GradMode,
    init: f32,
) -> [Vec<T>; 5] {
    let cv = cast::<T>;
    let mut p = KanHostParams::<T>::zeros_typed(plan.desc());
    p.grid = cv(&pr.p.grid);
    p.base_weight = cv(&pr.p.base_weight);
    p.spline_weight = cv(&pr.p.spline_weight);
    p.spline_scaler = pr.p.spline_scaler.as_deref().map(cv);
    let (x, dy) = (cv(&pr.x), cv(&pr.dy));
    let mut y = vec![T::from_f32(f32::NAN); ys.iter().product()];
    let mut dx = vec![T::from_f32(f32::NAN); x.len()];
    let mut grads = KanHostParams::<T>::zeros_typed(plan.desc());
    grads.base_weight.iter_mut().chain(&mut grads.spline_weight).for_each(|v| *v = T::from_f32(init));
    if let Some(s) = &mut grads.spline_scaler {
        s.iter_mut().for_each(|v| *v = T::from_f32(init));
    }
    let fwd = KanForwardArgs::new(Tensor::new(&x, xs), p.view(), TensorMut::new(&mut y, ys));
    plan.forward(&fwd).unwrap();
    let bwd = KanBackwardArgs::from_forward(&fwd, Tensor::new(&dy, ys))
        .dx(TensorMut::new(&mut dx, xs))
        .dparams(&mut grads);
    plan.backward(mode, &bwd).unwrap();
    let ss = grads.spline_scaler.take().unwrap_or_default();
    [y, dx, grads.base_weight, grads.spline_weight, ss]
}

const NAMES: [&str; 5] = ["y", "dx", "dbase_weight", "dspline_weight", "dspline_scaler"];

#[test]
fn reference_gradients_match_finite_differences() {
    // the reference's chain rule against central differences of its own forward (float64)
    let ctx = Context::cpu().unwrap();
    for c in configs().into_iter().filter(|c| c.k >= 1).take(3) {
        let plan = KanLinearPlan::new(&ctx, &c.desc()).unwrap();
        let pr = problem(&c, &plan, 11);
        let r = reference(&c, &pr.x, &pr.p, &pr.dy);
        let loss = |x: &[f32], p: &KanHostParams| -> f64 {
            let y = reference(&c, x, p, &pr.dy).y;
            y.iter().zip(&pr.dy).map(|(a, &b)| a * b as f64).sum()
        };
        // the loss is linear in the parameters: a unit step is exact up to rounding
        for (idx, want) in [(0usize, r.dbw[0]), (c.outf * c.inf - 1, r.dbw[c.outf * c.inf - 1])] {
            let mut p = pr.p.clone();
            p.base_weight[idx] += 1.0;
            let fd = loss(&pr.x, &p) - loss(&pr.x, &pr.p);
            assert!((fd - want).abs() <= 1e-6 * (1.0 + want.abs()), "{c:?} dbw[{idx}]: {fd} vs {want}");
        }
        let mut p = pr.p.clone();
        p.spline_weight[3] += 1.0;
        let fd = loss(&pr.x, &p) - loss(&pr.x, &pr.p);
        assert!((fd - r.dsw[3]).abs() <= 1e-6 * (1.0 + r.dsw[3].abs()), "{c:?} dsw[3]: {fd} vs {}", r.dsw[3]);
        // dx by a central difference in f64 of the reference (x perturbed through f64 directly)
        for idx in [0usize, c.inf / 2, c.n() * c.inf - 1] {
            let h = 1e-4f64;
            let f = |delta: f64| -> f64 {
                let (row, i) = (idx / c.inf, idx % c.inf);
                let xv = pr.x[idx] as f64 + delta;
                let g = to_f64(&pr.p.grid);
                let (b, _) = bases(&g[i * c.nk()..(i + 1) * c.nk()], c.k, xv);
                let (s, _) = silu(xv);
                (0..c.outf)
                    .map(|o| {
                        let oi = o * c.inf + i;
                        let sc = pr.p.spline_scaler.as_ref().map_or(1.0, |v| v[oi] as f64);
                        let sp: f64 =
                            (0..c.c()).map(|q| pr.p.spline_weight[oi * c.c() + q] as f64 * b[q]).sum();
                        pr.dy[row * c.outf + o] as f64 * (pr.p.base_weight[oi] as f64 * s + sc * sp)
                    })
                    .sum()
            };
            let fd = (f(h) - f(-h)) / (2.0 * h);
            let want = r.dx[idx];
            assert!((fd - want).abs() <= 1e-5 * (1.0 + want.abs()), "{c:?} dx[{idx}]: {fd} vs {want}");
        }
    }
}

#[test]
fn forward_and_backward_match_f64_reference() {
    let ctx = Context::cpu().unwrap();
    for c in configs() {
        let mut plan = KanLinearPlan::new(&ctx, &c.desc()).unwrap();
        let pr = problem(&c, &plan, 1);
        let r = reference(&c, &pr.x, &pr.p, &pr.dy);
        let out = run(&mut plan, &pr, &c.x_shape(), &c.y_shape(), GradMode::Overwrite, f32::NAN);
        if c.k == 0 {
            // piecewise-constant bases: dx is SiLU' alone (B' = 0), still checked
            assert!(r.dx.iter().any(|&v| v != 0.0));
        }
        check_all(&c, &out, &r, 1e-5);
    }
}

/// Every output of [`run`] against the reference (d spline_scaler empty without a scaler):
/// relative error below `tol` (1e-5 for float32, 1e-12 for float64, u + 1e-5 for 16 bits).
fn check_all<T: TestFloat>(c: &dyn std::fmt::Debug, out: &[Vec<T>; 5], r: &Ref, tol: f64) {
    let refs = [&r.y, &r.dx, &r.dbw, &r.dsw, &r.dss];
    for (q, name) in NAMES.iter().enumerate() {
        if q == 4 && out[4].is_empty() {
            continue;
        }
        let e = rel_err(&out[q], refs[q]);
        assert!(e < tol, "{c:?}: {name} rel err {e:.3e}");
    }
}

/// The parameter gradients of a [`run`] in Accumulate mode over buffers that held 0.25, within
/// `tol` (d spline_scaler empty without a scaler).
fn check_accumulated<T: TestFloat>(c: &dyn std::fmt::Debug, out: &[Vec<T>; 5], r: &Ref, tol: f64) {
    for (q, want) in [(2, &r.dbw), (3, &r.dsw), (4, &r.dss)] {
        if q == 4 && out[4].is_empty() {
            continue;
        }
        let shifted: Vec<f64> = want.iter().map(|v| v + 0.25).collect();
        let e = rel_err(&out[q], &shifted);
        assert!(e < tol, "{c:?}: accumulate {}: rel err {e:.3e}", NAMES[q]);
    }
}

#[test]
fn accumulate_adds_and_outputs_are_optional() {
    let ctx = Context::cpu().unwrap();
    let c = configs()[0];
    let mut plan = KanLinearPlan::new(&ctx, &c.desc()).unwrap();
    let pr = problem(&c, &plan, 2);
    let r = reference(&c, &pr.x, &pr.p, &pr.dy);
    accumulate_and_single_outputs(&mut plan, &pr, &c.x_shape(), &c.y_shape(), &r);
}

/// Accumulate mode adds to the parameter gradients; then dx alone, d spline_weight alone and
/// (with a scaler) d spline_scaler alone, each into a buffer of NaNs that it must overwrite.
fn accumulate_and_single_outputs<L: KanLayer>(
    plan: &mut KanPlan<'_, L>,
    pr: &Problem,
    xs: &[usize],
    ys: &[usize],
    r: &Ref,
) {
    let out = run(plan, pr, xs, ys, GradMode::Accumulate, 0.25);
    check_accumulated(&xs, &out, r, 1e-5);
    let lin = plan.desc().kan_linear();
    let bwd = || KanBackwardArgs::new(Tensor::new(&pr.x, xs), pr.p.view(), Tensor::new(&pr.dy, ys));
    let mut dx = vec![f32::NAN; pr.x.len()];
    plan.backward(GradMode::Overwrite, &bwd().dx(TensorMut::new(&mut dx, xs))).unwrap();
    assert!(rel_err(&dx, &r.dx) < 1e-5);
    let mut dsw = vec![f32::NAN; r.dsw.len()];
    let g = TensorMut::new(&mut dsw, &lin.spline_weight_shape());
    plan.backward(GradMode::Overwrite, &bwd().dspline_weight(g)).unwrap();
    assert!(rel_err(&dsw, &r.dsw) < 1e-5);
    if lin.has_standalone_scale() {
        let mut dss = vec![f32::NAN; r.dss.len()];
        let g = TensorMut::new(&mut dss, &lin.spline_scaler_shape());
        plan.backward(GradMode::Overwrite, &bwd().dspline_scaler(g)).unwrap();
        assert!(rel_err(&dss, &r.dss) < 1e-5);
    }
}

#[test]
fn caller_workspace_of_the_queried_size() {
    let ctx = Context::cpu().unwrap();
    let c = configs()[5];
    let mut plan = KanLinearPlan::new(&ctx, &c.desc()).unwrap();
    let pr = problem(&c, &plan, 4);
    let r = reference(&c, &pr.x, &pr.p, &pr.dy);
    let ws_bytes = plan.workspace_size(c.n()).unwrap();
    assert!(ws_bytes > 0);
    assert!(plan.workspace_size(1 << 20).unwrap() < (1 << 20) * c.inf * c.c() * 4, "grows like the bases");
    raw_calls_with_caller_workspace(&mut plan, &pr, &c.x_shape(), &c.y_shape(), ws_bytes, &r);
}

/// forward_raw and backward_raw with a caller workspace of `ws_bytes`, checked against the
/// reference; one byte less is refused.
fn raw_calls_with_caller_workspace<L: KanLayer>(
    plan: &mut KanPlan<'_, L>,
    pr: &Problem,
    xs: &[usize],
    ys: &[usize],
    ws_bytes: usize,
    r: &Ref,
) {
    let ws = AlignedBuf::new(ws_bytes);
    let wp = ws.ptr();
    let mut y = vec![0.0f32; pr.dy.len()];
    let fwd = KanForwardArgs::new(Tensor::new(&pr.x, xs), pr.p.view(), TensorMut::new(&mut y, ys));
    // SAFETY: ws holds ws_bytes bytes, 64-byte aligned, owned here and unused elsewhere.
    unsafe { plan.forward_raw(&fwd, wp, ws_bytes) }.unwrap();
    let mut grads = KanHostParams::zeros(plan.desc());
    let bwd = KanBackwardArgs::from_forward(&fwd, Tensor::new(&pr.dy, ys)).dparams(&mut grads);
    // SAFETY: as above.
    unsafe { plan.backward_raw(GradMode::Overwrite, &bwd, wp, ws_bytes) }.unwrap();
    if ws_bytes > 0 {
        // one byte short is refused
        // SAFETY: as above (a smaller size of the same buffer).
        let e = unsafe { plan.forward_raw(&fwd, wp, ws_bytes - 1) }.unwrap_err();
        assert_eq!(e.status(), Status::WorkspaceTooSmall, "{e}");
    }
    assert!(rel_err(&y, &r.y) < 1e-5);
    assert!(rel_err(&grads.base_weight, &r.dbw) < 1e-5);
    assert!(rel_err(&grads.spline_weight, &r.dsw) < 1e-5);
}

#[test]
fn uniform_grid_is_efficient_kans_buffer() {
    let ctx = Context::cpu().unwrap();
    for (g, k, lo, hi) in [(5u32, 3u32, -1.0f32, 1.0f32), (7, 2, -3.0, -1.0), (1, 0, 0.0, 2.5)] {
        let d = KanLinearDesc::new(3, 2).grid_size(g).spline_order(k);
        let plan = KanLinearPlan::new(&ctx, &d).unwrap();
        let grid = plan.uniform_grid(lo, hi).unwrap();
        let h = ((hi as f64 - lo as f64) / g as f64) as f32;
        for (idx, &v) in grid.iter().enumerate() {
            let j = (idx % d.num_knots()) as i64 - k as i64;
            assert_eq!(v, j as f32 * h + lo, "G={g} k={k} [{lo}, {hi}] knot {idx}");
        }
        let e = plan.uniform_grid(1.0, 1.0).unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    }
}

// ---- errors ------------------------------------------------------------------------------

#[test]
fn bad_descriptor_names_the_field() {
    let ctx = Context::cpu().unwrap();
    for (d, field) in [
        (KanLinearDesc::new(0, 4), "in_features"),
        (KanLinearDesc::new(4, 0), "out_features"),
        (KanLinearDesc::new(4, 4).grid_size(0), "grid_size"),
    ] {
        let e = KanLinearPlan::new(&ctx, &d).unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "{e}");
        assert!(e.message().contains(field), "{field}: {e}");
    }
}

#[test]
fn bad_input_is_an_error_naming_the_argument() {
    let ctx = Context::cpu().unwrap();
    let c = configs()[0];
    let d = c.desc();
    let mut plan = KanLinearPlan::new(&ctx, &d).unwrap();
    let pr = problem(&c, &plan, 3);
    let n = c.n();
    let mut y = vec![7.0f32; n * c.outf];

    // x of the wrong width (consistent with its slice): the library's message
    let x6 = vec![0.5f32; n * 6];
    let args = KanForwardArgs::new(Tensor::new(&x6, &[n, 6]), pr.p.view(), TensorMut::new(&mut y, &[n, 3]));
    let e = plan.forward(&args).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().starts_with("kf_kan_linear_forward") && e.message().contains("args->x"), "{e}");
    assert!(y.iter().all(|&v| v == 7.0), "a failed call wrote y");

    // a slice shorter than its shape: checked before the call
    let args =
        KanForwardArgs::new(Tensor::new(&pr.x[1..], &[n, 5]), pr.p.view(), TensorMut::new(&mut y, &[n, 3]));
    let e = plan.forward(&args).unwrap_err();
    assert!(e.message().contains("KanLinearPlan::forward: args.x has"), "{e}");

    // a decreasing grid row names the grid
    let mut bad = pr.p.clone();
    bad.grid.swap(c.nk() + 1, c.nk() + 5);
    let args = KanForwardArgs::new(Tensor::new(&pr.x, &[n, 5]), bad.view(), TensorMut::new(&mut y, &[n, 3]));
    let e = plan.forward(&args).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().contains("args->grid"), "{e}");

    // spline_weight with the wrong number of coefficients
    let sw = vec![0.1f32; c.outf * c.inf * (c.c() + 1)];
    let p = KanParams::new(
        Tensor::new(&pr.p.grid, &d.grid_shape()),
        Tensor::new(&pr.p.base_weight, &d.base_weight_shape()),
        Tensor::new(&sw, &[c.outf, c.inf, c.c() + 1]),
    )
    .spline_scaler(Tensor::new(pr.p.spline_scaler.as_ref().unwrap(), &d.spline_scaler_shape()));
    let args = KanForwardArgs::new(Tensor::new(&pr.x, &[n, 5]), p, TensorMut::new(&mut y, &[n, 3]));
    let e = plan.forward(&args).unwrap_err();
    assert!(e.message().contains("args->spline_weight"), "{e}");

    // the plan has a standalone scale and no scaler is given
    let p = KanParams::new(
        Tensor::new(&pr.p.grid, &d.grid_shape()),
        Tensor::new(&pr.p.base_weight, &d.base_weight_shape()),
        Tensor::new(&pr.p.spline_weight, &d.spline_weight_shape()),
    );
    let args = KanForwardArgs::new(Tensor::new(&pr.x, &[n, 5]), p, TensorMut::new(&mut y, &[n, 3]));
    let e = plan.forward(&args).unwrap_err();
    assert!(e.message().contains("spline_scaler"), "{e}");

    // backward: dy of the wrong width
    let dy4 = vec![0.5f32; n * 4];
    let bwd = KanBackwardArgs::new(Tensor::new(&pr.x, &[n, 5]), pr.p.view(), Tensor::new(&dy4, &[n, 4]));
    let e = plan.backward(GradMode::Overwrite, &bwd).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().starts_with("kf_kan_linear_backward") && e.message().contains("args->dy"), "{e}");
    assert!(y.iter().all(|&v| v == 7.0), "a failed call wrote y");
}

// ---- KANConv2d: naive unfold + the KANLinear reference above, folded back -----------------

#[derive(Clone, Copy, Debug)]
struct ConvCfg {
    /// images; None: one unbatched image, x [C_in, H, W]
    b: Option<usize>,
    cin: usize,
    cout: usize,
    h: usize,
    w: usize,
    kernel: (usize, usize),
    stride: (usize, usize),
    pad: (usize, usize),
    dil: (usize, usize),
    g: usize,
    k: usize,
    scale: bool,
    grid: Grid,
}

impl ConvCfg {
    fn nb(&self) -> usize {
        self.b.unwrap_or(1)
    }
    fn f(&self) -> usize {
        self.cin * self.kernel.0 * self.kernel.1
    }
    /// (Ho, Wo), written out here from the header's formula.
    fn out_hw(&self) -> (usize, usize) {
        let o = |n: usize, k: usize, s: usize, p: usize, d: usize| (n + 2 * p - d * (k - 1) - 1) / s + 1;
        (
            o(self.h, self.kernel.0, self.stride.0, self.pad.0, self.dil.0),
            o(self.w, self.kernel.1, self.stride.1, self.pad.1, self.dil.1),
        )
    }
    fn rows(&self) -> usize {
        let (ho, wo) = self.out_hw();
        self.nb() * ho * wo
    }
    fn desc(&self) -> KanConv2dDesc {
        let u = |(a, b): (usize, usize)| (a as u32, b as u32);
        KanConv2dDesc::new(self.cin, self.cout, u(self.kernel))
            .stride(u(self.stride))
            .padding(u(self.pad))
            .dilation(u(self.dil))
            .grid_size(self.g as u32)
            .spline_order(self.k as u32)
            .standalone_scale(self.scale)
    }
    fn x_shape(&self) -> Vec<usize> {
        self.b.into_iter().chain([self.cin, self.h, self.w]).collect()
    }
    fn y_shape(&self) -> Vec<usize> {
        let (ho, wo) = self.out_hw();
        self.b.into_iter().chain([self.cout, ho, wo]).collect()
    }
    /// The KANLinear over the patches: F features, one row per output pixel.
    fn lin(&self) -> Cfg {
        let lead: &'static [usize] = Box::leak(vec![self.rows()].into_boxed_slice());
        Cfg { inf: self.f(), outf: self.cout, g: self.g, k: self.k, scale: self.scale, grid: self.grid, lead }
    }
}

fn conv_configs() -> Vec<ConvCfg> {
    let base = ConvCfg {
        b: Some(2),
        cin: 3,
        cout: 4,
        h: 7,
        w: 9,
        kernel: (3, 3),
        stride: (2, 2),
        pad: (1, 1),
        dil: (2, 2),
        g: 5,
        k: 3,
        scale: true,
        grid: Grid::Uniform,
    };
    let one = (1, 1);
    vec![
        base,
        // 1x1 kernel, random knots, no scaler
        ConvCfg {
            h: 5,
            w: 4,
            cout: 2,
            kernel: one,
            stride: one,
            pad: (0, 0),
            dil: one,
            g: 4,
            k: 2,
            scale: false,
            grid: Grid::Random,
            ..base
        },
        // 1x1 kernel with stride and padding: the border pixels see only padding
        ConvCfg { b: Some(1), cin: 2, h: 3, w: 3, kernel: one, stride: (2, 2), pad: one, dil: one, ..base },
        // everything differs between the two axes
        ConvCfg {
            b: Some(1),
            cin: 2,
            cout: 3,
            h: 6,
            w: 5,
            kernel: (2, 3),
            stride: (1, 2),
            pad: (0, 1),
            dil: (2, 1),
            g: 3,
            k: 1,
            grid: Grid::Random,
            ..base
        },
        // one unbatched image [C_in, H, W], k = 0
        ConvCfg { b: None, cin: 2, cout: 2, h: 4, w: 4, stride: one, dil: one, k: 0, ..base },
    ]
}

/// The patches of x, `[B*Ho*Wo, F]` (row (b, oh, ow), feature (c, i, j)), and for each entry the
/// index into x it reads (None: padding, value 0).
fn unfold(c: &ConvCfg, x: &[f32]) -> (Vec<f32>, Vec<Option<usize>>) {
    let (ho, wo) = c.out_hw();
    let (kh, kw) = c.kernel;
    let (mut cols, mut src) = (Vec::new(), Vec::new());
    for b in 0..c.nb() {
        for oh in 0..ho {
            for ow in 0..wo {
                for ch in 0..c.cin {
                    for i in 0..kh {
                        for j in 0..kw {
                            let ih = (oh * c.stride.0 + i * c.dil.0) as i64 - c.pad.0 as i64;
                            let iw = (ow * c.stride.1 + j * c.dil.1) as i64 - c.pad.1 as i64;
                            let inside = ih >= 0 && iw >= 0 && ih < c.h as i64 && iw < c.w as i64;
                            let at =
                                inside.then(|| ((b * c.cin + ch) * c.h + ih as usize) * c.w + iw as usize);
                            cols.push(at.map_or(0.0, |a| x[a]));
                            src.push(at);
                        }
                    }
                }
            }
        }
    }
    (cols, src)
}

/// y and every gradient of the convolution in float64: the KANLinear reference over the patches,
/// y and dy moved between `[B, C_out, Ho, Wo]` and rows `[B*Ho*Wo, C_out]`, the patches' dx summed
/// back onto the pixels they read.
fn conv_reference(c: &ConvCfg, x: &[f32], p: &KanHostParams, dy: &[f32]) -> Ref {
    let (ho, wo) = c.out_hw();
    let (hw, cout) = (ho * wo, c.cout);
    let nchw = |row: usize, o: usize| ((row / hw) * cout + o) * hw + row % hw;
    let (cols, src) = unfold(c, x);
    let mut dy_rows = vec![0.0f32; dy.len()];
    for row in 0..c.rows() {
        for o in 0..cout {
            dy_rows[row * cout + o] = dy[nchw(row, o)];
        }
    }
    let r = reference(&c.lin(), &cols, p, &dy_rows);
    let mut y = vec![0.0; r.y.len()];
    for row in 0..c.rows() {
        for o in 0..cout {
            y[nchw(row, o)] = r.y[row * cout + o];
        }
    }
    let mut dx = vec![0.0; x.len()];
    for (q, at) in src.iter().enumerate() {
        if let Some(a) = at {
            dx[*a] += r.dx[q];
        }
    }
    Ref { y, dx, ..r }
}

/// A problem for `c`: the KANLinear problem over the patches (knots, parameters, dy) and an x of
/// the image's shape.
fn conv_problem(c: &ConvCfg, plan: &KanConv2dPlan<'_>, seed: u64) -> Problem {
    let mut pr = problem(&c.lin(), plan, seed);
    pr.x = Rng::new(seed ^ 0xC0).vec(c.nb() * c.cin * c.h * c.w, -2.3, 2.3);
    assert_eq!(pr.dy.len(), c.rows() * c.cout);
    pr
}

#[test]
fn conv2d_forward_and_backward_match_f64_reference() {
    let ctx = Context::cpu().unwrap();
    for c in conv_configs() {
        let mut plan = KanConv2dPlan::new(&ctx, &c.desc()).unwrap();
        assert_eq!(plan.output_size(c.h, c.w), Some(c.out_hw()), "{c:?}");
        if let Some(b) = c.b {
            assert_eq!(plan.x_shape(b, c.h, c.w).to_vec(), c.x_shape());
            assert_eq!(plan.y_shape(b, c.h, c.w).to_vec(), c.y_shape());
        }
        let pr = conv_problem(&c, &plan, 5);
        let r = conv_reference(&c, &pr.x, &pr.p, &pr.dy);
        let out = run(&mut plan, &pr, &c.x_shape(), &c.y_shape(), GradMode::Overwrite, f32::NAN);
        assert_eq!(out[4].is_empty(), !c.scale);
        check_all(&c, &out, &r, 1e-5);
    }
}

#[test]
fn conv2d_accumulate_adds_and_outputs_are_optional() {
    let ctx = Context::cpu().unwrap();
    let c = conv_configs()[0];
    let mut plan = KanConv2dPlan::new(&ctx, &c.desc()).unwrap();
    let pr = conv_problem(&c, &plan, 6);
    let r = conv_reference(&c, &pr.x, &pr.p, &pr.dy);
    accumulate_and_single_outputs(&mut plan, &pr, &c.x_shape(), &c.y_shape(), &r);
}

#[test]
fn conv2d_caller_workspace_of_the_queried_size() {
    let ctx = Context::cpu().unwrap();
    let c = conv_configs()[0];
    let mut plan = KanConv2dPlan::new(&ctx, &c.desc()).unwrap();
    let pr = conv_problem(&c, &plan, 7);
    let r = conv_reference(&c, &pr.x, &pr.p, &pr.dy);
    let ws_bytes = plan.workspace_size(c.nb(), c.h, c.w).unwrap();
    let patches_of = |b: usize, h: usize, w: usize| b * h * w * c.f() * 4;
    assert!(plan.workspace_size(64, 256, 256).unwrap() < patches_of(64, 256, 256), "grows like the patches");
    assert!(ws_bytes > 0);
    raw_calls_with_caller_workspace(&mut plan, &pr, &c.x_shape(), &c.y_shape(), ws_bytes, &r);
}

#[test]
fn conv2d_grid_and_shapes_are_the_per_patch_kanlinears() {
    let ctx = Context::cpu().unwrap();
    let d = KanConv2dDesc::new(2, 3, (2, 3)).grid_size(4).spline_order(2).standalone_scale(false);
    let lin = d.kan_linear();
    assert_eq!(lin, KanLinearDesc::new(12, 3).grid_size(4).spline_order(2).standalone_scale(false));
    assert_eq!((d.grid_shape(), d.base_weight_shape()), ([12, 9], [3, 12]));
    assert_eq!((d.spline_weight_shape(), d.spline_scaler_shape()), ([3, 12, 6], [3, 12]));
    let p = KanHostParams::zeros(&d);
    assert_eq!((p.desc(), p.spline_scaler.is_none()), (&lin, true));
    let conv = KanConv2dPlan::new(&ctx, &d).unwrap();
    let linear = KanLinearPlan::new(&ctx, &lin).unwrap();
    assert_eq!(conv.uniform_grid(-1.5, 2.0).unwrap(), linear.uniform_grid(-1.5, 2.0).unwrap());
    let mut g = vec![0.0f32; 12 * 9];
    conv.uniform_grid_into(-1.5, 2.0, TensorMut::new(&mut g, &d.grid_shape())).unwrap();
    assert_eq!(g, linear.uniform_grid(-1.5, 2.0).unwrap());
    let e = conv.uniform_grid(1.0, 1.0).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    // output sizes: the formula, and None where the dilated kernel does not fit
    let d = KanConv2dDesc::new(1, 1, (3, 5)).stride((2, 3)).padding((1, 0)).dilation((2, 1));
    assert_eq!(d.output_size(5, 5), Some((2, 1)));
    assert_eq!(d.output_size(3, 5), Some((1, 1)));
    assert_eq!(d.output_size(2, 5), None);
    assert_eq!(d.output_size(5, 4), None);
    assert_eq!(d.y_shape(3, 2, 5), [3, 1, 0, 0]);
    assert_eq!(KanConv2dDesc::new(1, 1, (0, 1)).output_size(4, 4), None);
}

#[test]
fn conv2d_bad_descriptor_names_the_field() {
    let ctx = Context::cpu().unwrap();
    let d = KanConv2dDesc::new(3, 4, (3, 3));
    for (d, field) in [
        (KanConv2dDesc::new(0, 4, (3, 3)), "in_channels"),
        (KanConv2dDesc::new(3, 0, (3, 3)), "out_channels"),
        (KanConv2dDesc::new(3, 4, (0, 3)), "kernel_h"),
        (KanConv2dDesc::new(3, 4, (3, 0)), "kernel_w"),
        (d.clone().stride((1, 0)), "stride_w"),
        (d.clone().dilation((0, 1)), "dilation_h"),
        (d.clone().grid_size(0), "grid_size"),
    ] {
        let e = KanConv2dPlan::new(&ctx, &d).unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "{e}");
        assert!(e.message().starts_with("kf_kan_conv2d_plan_create"), "{e}");
        assert!(e.message().contains(field), "{field}: {e}");
    }
}

#[test]
fn conv2d_bad_input_is_an_error_naming_the_argument() {
    let ctx = Context::cpu().unwrap();
    let c = conv_configs()[0];
    let d = c.desc();
    let mut plan = KanConv2dPlan::new(&ctx, &d).unwrap();
    let pr = conv_problem(&c, &plan, 8);
    let (b, h, w) = (2, c.h, c.w);
    let (xs, ys) = (c.x_shape(), c.y_shape());
    let mut y = vec![7.0f32; pr.dy.len()];
    let fwd_err = |plan: &mut KanConv2dPlan<'_>, x: Tensor<'_>, p: KanParams<'_>, y: TensorMut<'_>| {
        plan.forward(&KanForwardArgs::new(x, p, y)).unwrap_err()
    };

    // x with one channel too many (consistent with its slice)
    let x4 = vec![0.5f32; b * 4 * h * w];
    let e = fwd_err(&mut plan, Tensor::new(&x4, &[b, 4, h, w]), pr.p.view(), TensorMut::new(&mut y, &ys));
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().starts_with("kf_kan_conv2d_forward") && e.message().contains("args->x"), "{e}");
    assert!(y.iter().all(|&v| v == 7.0), "a failed call wrote y");

    // x of rank 2
    let e = fwd_err(&mut plan, Tensor::new(&pr.x, &[b * 3, h * w]), pr.p.view(), TensorMut::new(&mut y, &ys));
    assert!(e.message().contains("args->x"), "{e}");

    // an image smaller than the dilated kernel (5 x 5 with padding 1 needs 3 x 3)
    let (small, mut y1) = (vec![0.5f32; b * 3 * 2 * 2], vec![0.0f32; b * 4]);
    let e = fwd_err(
        &mut plan,
        Tensor::new(&small, &[b, 3, 2, 2]),
        pr.p.view(),
        TensorMut::new(&mut y1, &[b, 4, 1, 1]),
    );
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().contains("args->x"), "{e}");

    // y of the wrong spatial size
    let mut y2 = vec![0.0f32; b * 4 * 3 * 3];
    let e = fwd_err(&mut plan, Tensor::new(&pr.x, &xs), pr.p.view(), TensorMut::new(&mut y2, &[b, 4, 3, 3]));
    assert!(e.message().contains("args->y"), "{e}");

    // a slice shorter than its shape: checked before the call, named by the safe call
    let e = fwd_err(&mut plan, Tensor::new(&pr.x[1..], &xs), pr.p.view(), TensorMut::new(&mut y, &ys));
    assert!(e.message().contains("KanConv2dPlan::forward: args.x has"), "{e}");

    // spline_weight with the wrong number of coefficients; the scaler missing
    let f = c.f();
    let sw = vec![0.1f32; c.cout * f * (c.g + c.k + 1)];
    let p = KanParams::new(
        Tensor::new(&pr.p.grid, &d.grid_shape()),
        Tensor::new(&pr.p.base_weight, &d.base_weight_shape()),
        Tensor::new(&sw, &[c.cout, f, c.g + c.k + 1]),
    )
    .spline_scaler(Tensor::new(pr.p.spline_scaler.as_ref().unwrap(), &d.spline_scaler_shape()));
    let e = fwd_err(&mut plan, Tensor::new(&pr.x, &xs), p, TensorMut::new(&mut y, &ys));
    assert!(e.message().contains("args->spline_weight"), "{e}");
    let p = KanParams::new(
        Tensor::new(&pr.p.grid, &d.grid_shape()),
        Tensor::new(&pr.p.base_weight, &d.base_weight_shape()),
        Tensor::new(&pr.p.spline_weight, &d.spline_weight_shape()),
    );
    let e = fwd_err(&mut plan, Tensor::new(&pr.x, &xs), p, TensorMut::new(&mut y, &ys));
    assert!(e.message().contains("spline_scaler"), "{e}");

    // a decreasing grid row names the grid
    let mut bad = pr.p.clone();
    let nk = c.g + 2 * c.k + 1;
    bad.grid.swap(nk + 1, nk + 5);
    let e = fwd_err(&mut plan, Tensor::new(&pr.x, &xs), bad.view(), TensorMut::new(&mut y, &ys));
    assert!(e.message().contains("args->grid"), "{e}");
    assert!(y.iter().all(|&v| v == 7.0), "a failed call wrote y");

    // backward: dy of the wrong shape; dx of the wrong shape
    let dy = vec![0.5f32; b * 4 * 4 * 3];
    let bwd = KanBackwardArgs::new(Tensor::new(&pr.x, &xs), pr.p.view(), Tensor::new(&dy, &[b, 4, 4, 3]));
    let e = plan.backward(GradMode::Overwrite, &bwd).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().starts_with("kf_kan_conv2d_backward") && e.message().contains("args->dy"), "{e}");
    let mut dx = vec![0.0f32; pr.x.len()];
    let bwd = KanBackwardArgs::new(Tensor::new(&pr.x, &xs), pr.p.view(), Tensor::new(&pr.dy, &ys))
        .dx(TensorMut::new(&mut dx, &[b, 3, w, h]));
    let e = plan.backward(GradMode::Overwrite, &bwd).unwrap_err();
    assert!(e.message().contains("args->dx"), "{e}");
}

// ---- grid update ---------------------------------------------------------------------------

/// update_grid: the new knots are efficient-kan's formula on the sorted samples (G = 5: the
/// quantile indices are floor(j (N - 1) / G)), and the refit is a least-squares solution: the
/// residual of the old splines is orthogonal to every new basis (normal equations, checked with
/// the float64 reference bases). A bad margin is an error and writes nothing.
#[test]
fn update_grid_places_knots_and_refits() {
    update_grid_case::<f32>();
}

/// update_grid of bfloat16 and float16 plans: the knots and the refit as for float32, bounds
/// scaled to the type's unit roundoff.
#[test]
fn low_precision_update_grid() {
    update_grid_case::<half::bf16>();
    update_grid_case::<half::f16>();
}

/// update_grid through a plan of element type `T` (unit roundoff u): every knot within
/// u |knot| + 1e-5 of the formula on the samples; the coefficients a float64 least-squares
/// solution w* on the new knots rounded to `T` (w = w* + d, |d| <= u |w*|), so each entry of the
/// normal equations' residual B^T r = B^T B d is within u / (1 - u) (|B|^T |B| |w|) of 0, plus
/// 1e-9 |B^T u| for the float64 solve.
fn update_grid_case<T: TestFloat>() {
    let u_t = T::UNIT_ROUNDOFF;
    let name = std::any::type_name::<T>();
    let (inf, outf, g, k, n) = (3usize, 2usize, 5usize, 3usize, 40usize);
    let (c, nk) = (g + k, g + 2 * k + 1);
    let ctx = Context::cpu().unwrap();
    let d = KanLinearDesc::new(inf, outf).grid_size(g as u32).spline_order(k as u32);
    let mut plan = KanLinearPlan::<T>::new_typed(&ctx, &d).unwrap();
    let mut rng = Rng::new(91);
    let mut x = rng.vec(n * inf, -0.8, 0.8);
    round_to::<T>(&mut x);
    let mut old_w = rng.vec(outf * inf * c, -0.5, 0.5);
    round_to::<T>(&mut old_w);
    let (x, old_grid, old_w) = (cast::<T>(&x), plan.uniform_grid(-1.0, 1.0).unwrap(), cast::<T>(&old_w));
    let (mut grid, mut w) = (old_grid.clone(), old_w.clone());
    let e = plan
        .update_grid(
            &Tensor::new(&x, &[n, inf]),
            TensorMut::new(&mut grid, &[inf, nk]),
            TensorMut::new(&mut w, &[outf, inf, c]),
            -1.0,
            0.02,
        )
        .unwrap_err();
    assert!(e.message().contains("margin"), "{e}");
    let bits = |v: &[T]| -> Vec<u64> { v.iter().map(|&a| Into::<f64>::into(a).to_bits()).collect() };
    assert_eq!(bits(&grid), bits(&old_grid));
    assert_eq!(bits(&w), bits(&old_w));
    plan.update_grid(
        &Tensor::new(&x, &[n, inf]),
        TensorMut::new(&mut grid, &[inf, nk]),
        TensorMut::new(&mut w, &[outf, inf, c]),
        0.01,
        0.02,
    )
    .unwrap();
    for i in 0..inf {
        let mut s: Vec<f64> = (0..n).map(|r| x[r * inf + i].into()).collect();
        s.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let h = (s[n - 1] - s[0] + 0.02) / g as f64;
        for j in 0..nk {
            let want = if j < k {
                0.02 * (s[0] - 0.01) + 0.98 * s[0] - (k - j) as f64 * h
            } else if j > k + g {
                0.02 * (s[0] - 0.01 + g as f64 * h) + 0.98 * s[n - 1] + (j - k - g) as f64 * h
            } else {
                let q = j - k;
                0.02 * (s[0] - 0.01 + q as f64 * h) + 0.98 * s[q * (n - 1) / g]
            };
            let got: f64 = grid[i * nk + j].into();
            let bound = u_t * want.abs() + 1e-5;
            assert!((got - want).abs() < bound, "{name} grid[{i}][{j}] = {got}, want {want}");
        }
        let (to, tn): (Vec<f64>, Vec<f64>) = (
            old_grid[i * nk..(i + 1) * nk].iter().map(|&v| v.into()).collect(),
            grid[i * nk..(i + 1) * nk].iter().map(|&v| v.into()).collect(),
        );
        for o in 0..outf {
            let coef = |v: &[T], q: usize| v[(o * inf + i) * c + q].into();
            let (mut bt_r, mut bt_u, mut bb_w) = (vec![0.0; c], vec![0.0; c], vec![0.0; c]);
            for r in 0..n {
                let xv: f64 = x[r * inf + i].into();
                let (bo, bn) = (bases(&to, k, xv).0, bases(&tn, k, xv).0);
                let u: f64 = (0..c).map(|q| bo[q] * coef(&old_w, q)).sum();
                let fit: f64 = (0..c).map(|q| bn[q] * coef(&w, q)).sum();
                let abs_fit: f64 = (0..c).map(|q| (bn[q] * coef(&w, q)).abs()).sum();
                for q in 0..c {
                    bt_r[q] += bn[q] * (fit - u);
                    bt_u[q] += bn[q] * u;
                    bb_w[q] += bn[q].abs() * abs_fit;
                }
            }
            let norm_bt_u = bt_u.iter().map(|a| a * a).sum::<f64>().sqrt();
            for q in 0..c {
                let bound = u_t / (1.0 - u_t) * bb_w[q] + 1e-9 * norm_bt_u;
                let e = bt_r[q].abs();
                assert!(e <= bound, "{name} feature {i} output {o}: (B^T r)[{q}] = {e:e}, bound {bound:e}");
            }
        }
    }
}

/// Float64 plans (`KanLinearPlan::<f64>::new_typed`, `KanConv2dPlan::<f64>::new_typed`): y and
/// every gradient within 1e-12 of the float64 reference, and the uniform grid in float64.
#[test]
fn float64_plans_match_f64_reference() {
    let ctx = Context::cpu().unwrap();
    for c in configs() {
        let mut plan = KanLinearPlan::<f64>::new_typed(&ctx, &c.desc()).unwrap();
        let pr = problem(&c, &KanLinearPlan::new(&ctx, &c.desc()).unwrap(), 21);
        let r = reference(&c, &pr.x, &pr.p, &pr.dy);
        let out = run(&mut plan, &pr, &c.x_shape(), &c.y_shape(), GradMode::Overwrite, f32::NAN);
        check_all(&c, &out, &r, 1e-12);
        // efficient-kan's knots formed in float64: lo + (j - k) * h, h = (hi - lo) / G
        let g = plan.uniform_grid(-1.0, 1.0).unwrap();
        let h = 2.0 / c.g as f64;
        for (j, &v) in g[..c.nk()].iter().enumerate() {
            let want = (j as f64 - c.k as f64) * h - 1.0;
            assert!((v - want).abs() <= 1e-15, "{c:?}: grid[{j}] = {v}, expected {want}");
        }
    }
    for c in conv_configs() {
        let mut plan = KanConv2dPlan::<f64>::new_typed(&ctx, &c.desc()).unwrap();
        let pr = conv_problem(&c, &KanConv2dPlan::new(&ctx, &c.desc()).unwrap(), 23);
        let r = conv_reference(&c, &pr.x, &pr.p, &pr.dy);
        let out = run(&mut plan, &pr, &c.x_shape(), &c.y_shape(), GradMode::Overwrite, f32::NAN);
        check_all(&c, &out, &r, 1e-12);
    }
}

/// `pr` with every value rounded to `T` (exactly representable in it).
fn rounded<T: TestFloat>(mut pr: Problem) -> Problem {
    let p = &mut pr.p;
    for v in [&mut pr.x, &mut pr.dy, &mut p.grid, &mut p.base_weight, &mut p.spline_weight] {
        round_to::<T>(v);
    }
    p.spline_scaler.iter_mut().for_each(|s| round_to::<T>(s));
    pr
}

/// bfloat16 and float16 plans (`KanLinearPlan::<bf16>::new_typed`, `KanConv2dPlan::<f16>::...`):
/// y and every gradient, overwritten and accumulated, within u + 1e-5 of the float64 reference
/// on the same inputs (tests/c/test_lowp.c's bound); the uniform grid within u of efficient-kan's
/// formula.
#[test]
fn low_precision_plans_match_f64_reference() {
    low_precision_plans::<half::bf16>();
    low_precision_plans::<half::f16>();
}

fn low_precision_plans<T: Low>() {
    let ctx = Context::cpu().unwrap();
    for c in configs() {
        let mut plan = KanLinearPlan::<T>::new_typed(&ctx, &c.desc()).unwrap();
        let pr = rounded::<T>(problem(&c, &KanLinearPlan::new(&ctx, &c.desc()).unwrap(), 31));
        let r = reference(&c, &pr.x, &pr.p, &pr.dy);
        let (xs, ys) = (c.x_shape(), c.y_shape());
        let out = run(&mut plan, &pr, &xs, &ys, GradMode::Overwrite, f32::NAN);
        check_all(&(T::NAME, c), &out, &r, T::TOL);
        let out = run(&mut plan, &pr, &xs, &ys, GradMode::Accumulate, 0.25);
        check_accumulated(&(T::NAME, c), &out, &r, T::TOL);
        // efficient-kan's knots, lo + (j - k) * h with h = (hi - lo) / G, rounded once to T
        let g = plan.uniform_grid(-1.0, 1.0).unwrap();
        let h = 2.0 / c.g as f64;
        for (j, &v) in g[..c.nk()].iter().enumerate() {
            let (v, want) = (v.into(), (j as f64 - c.k as f64) * h - 1.0);
            let bound = T::UNIT_ROUNDOFF * want.abs() + 1e-6;
            assert!((v - want).abs() <= bound, "{} {c:?}: grid[{j}] = {v}, expected {want}", T::NAME);
        }
    }
    for c in conv_configs() {
        let mut plan = KanConv2dPlan::<T>::new_typed(&ctx, &c.desc()).unwrap();
        let pr = rounded::<T>(conv_problem(&c, &KanConv2dPlan::new(&ctx, &c.desc()).unwrap(), 33));
        let r = conv_reference(&c, &pr.x, &pr.p, &pr.dy);
        let (xs, ys) = (c.x_shape(), c.y_shape());
        let out = run(&mut plan, &pr, &xs, &ys, GradMode::Overwrite, f32::NAN);
        check_all(&(T::NAME, c), &out, &r, T::TOL);
        let out = run(&mut plan, &pr, &xs, &ys, GradMode::Accumulate, 0.25);
        check_accumulated(&(T::NAME, c), &out, &r, T::TOL);
    }
}
