//! KANLinear through the safe API against a float64 reference written here: the Cox-de Boor
//! recurrence over every index (zero-width spans count as 0) carried with its derivative in x
//! (forward mode), SiLU and its derivative, the layer and its gradients by the chain rule
//! (themselves checked against central differences of the reference forward); efficient-kan's
//! initial grid; accumulation, optional outputs and the caller workspace; errors naming the
//! argument.
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

fn problem(c: &Cfg, plan: &KanLinearPlan<'_>, seed: u64) -> Problem {
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

fn run(c: &Cfg, plan: &mut KanLinearPlan<'_>, pr: &Problem, mode: GradMode, init: f32) -> [Vec<f32>; 5] {
    let d = c.desc();
    let mut y = vec![f32::NAN; c.n() * c.outf];
    let mut dx = vec![f32::NAN; c.n() * c.inf];
    let mut grads = KanHostParams::zeros(&d);
    grads.base_weight.iter_mut().chain(&mut grads.spline_weight).for_each(|v| *v = init);
    if let Some(s) = &mut grads.spline_scaler {
        s.iter_mut().for_each(|v| *v = init);
    }
    let fwd = KanForwardArgs::new(
        Tensor::new(&pr.x, &c.x_shape()),
        pr.p.view(),
        TensorMut::new(&mut y, &c.y_shape()),
    );
    plan.forward(&fwd).unwrap();
    let bwd = KanBackwardArgs::from_forward(&fwd, Tensor::new(&pr.dy, &c.y_shape()))
        .dx(TensorMut::new(&mut dx, &c.x_shape()))
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
        let out = run(&c, &mut plan, &pr, GradMode::Overwrite, f32::NAN);
        let refs = [&r.y, &r.dx, &r.dbw, &r.dsw, &r.dss];
        for (q, name) in NAMES.iter().enumerate() {
            if q == 4 && !c.scale {
                continue;
            }
            if q == 1 && c.k == 0 {
                // piecewise-constant bases: dx is SiLU' alone (B' = 0), still checked
                assert!(r.dx.iter().any(|&v| v != 0.0));
            }
            let e = rel_err(&out[q], refs[q]);
            assert!(e < 1e-5, "{c:?}: {name} rel err {e:.3e}");
        }
    }
}

#[test]
fn accumulate_adds_and_outputs_are_optional() {
    let ctx = Context::cpu().unwrap();
    let c = configs()[0];
    let d = c.desc();
    let mut plan = KanLinearPlan::new(&ctx, &d).unwrap();
    let pr = problem(&c, &plan, 2);
    let r = reference(&c, &pr.x, &pr.p, &pr.dy);
    let out = run(&c, &mut plan, &pr, GradMode::Accumulate, 0.25);
    for (q, want) in [(2, &r.dbw), (3, &r.dsw), (4, &r.dss)] {
        let shifted: Vec<f64> = want.iter().map(|v| v + 0.25).collect();
        let e = rel_err(&out[q], &shifted);
        assert!(e < 1e-5, "accumulate {}: rel err {e:.3e}", NAMES[q]);
    }
    // dx alone: no parameter gradient is touched
    let mut dx = vec![0.0f32; c.n() * c.inf];
    let bwd = KanBackwardArgs::new(
        Tensor::new(&pr.x, &c.x_shape()),
        pr.p.view(),
        Tensor::new(&pr.dy, &c.y_shape()),
    )
    .dx(TensorMut::new(&mut dx, &c.x_shape()));
    plan.backward(GradMode::Overwrite, &bwd).unwrap();
    assert!(rel_err(&dx, &r.dx) < 1e-5);
    // d spline_scaler alone
    let mut dss = vec![9.0f32; c.outf * c.inf];
    let bwd = KanBackwardArgs::new(
        Tensor::new(&pr.x, &c.x_shape()),
        pr.p.view(),
        Tensor::new(&pr.dy, &c.y_shape()),
    )
    .dspline_scaler(TensorMut::new(&mut dss, &d.spline_scaler_shape()));
    plan.backward(GradMode::Overwrite, &bwd).unwrap();
    assert!(rel_err(&dss, &r.dss) < 1e-5);
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
    let ws = AlignedBuf::new(ws_bytes);
    let wp = ws.ptr();
    let mut y = vec![0.0f32; c.n() * c.outf];
    let fwd = KanForwardArgs::new(
        Tensor::new(&pr.x, &c.x_shape()),
        pr.p.view(),
        TensorMut::new(&mut y, &c.y_shape()),
    );
    // SAFETY: ws holds ws_bytes bytes, 64-byte aligned, owned here and unused elsewhere.
    unsafe { plan.forward_raw(&fwd, wp, ws_bytes) }.unwrap();
    let mut grads = KanHostParams::zeros(&c.desc());
    let bwd = KanBackwardArgs::from_forward(&fwd, Tensor::new(&pr.dy, &c.y_shape())).dparams(&mut grads);
    // SAFETY: as above.
    unsafe { plan.backward_raw(GradMode::Overwrite, &bwd, wp, ws_bytes) }.unwrap();
    // one byte short is refused
    // SAFETY: as above (a smaller size of the same buffer).
    let e = unsafe { plan.forward_raw(&fwd, wp, ws_bytes - 1) }.unwrap_err();
    assert_eq!(e.status(), Status::WorkspaceTooSmall, "{e}");
    assert!(rel_err(&y, &r.y) < 1e-5);
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
