//! SKLinear through the safe API against a float64 reference written here, term by term
//! (y = 1/(2L) * sum_i [(x S1_i) U1_i + (x U2_i) S2_i] + b, and its hand-derived gradients, which
//! are themselves checked against central differences of the reference forward), Panther's
//! initialisation against its definition, and the error mapping.
// The reference is written with explicit indices, as the formulas are.
#![allow(clippy::needless_range_loop)]
mod common;
use common::*;
use kfuse::*;

#[derive(Clone, Copy, Debug)]
struct Cfg {
    inf: usize,
    outf: usize,
    l: usize,
    k: usize,
    bias: bool,
    /// x's leading dims (their product is N)
    lead: &'static [usize],
}

impl Cfg {
    fn n(&self) -> usize {
        self.lead.iter().product()
    }
    fn desc(&self) -> SkLinearDesc {
        SkLinearDesc::new(self.inf, self.outf, self.l as u32, self.k as u32).bias(self.bias)
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
        Cfg { inf: 5, outf: 3, l: 1, k: 1, bias: true, lead: &[4] },
        Cfg { inf: 8, outf: 6, l: 3, k: 17, bias: true, lead: &[7] }, // 2Lk > in, out
        Cfg { inf: 7, outf: 11, l: 2, k: 3, bias: false, lead: &[1] }, // batch 1, no bias
        Cfg { inf: 9, outf: 4, l: 3, k: 17, bias: true, lead: &[1] },
        Cfg { inf: 6, outf: 10, l: 2, k: 4, bias: true, lead: &[2, 3] }, // leading dims [2, 3]
        Cfg { inf: 33, outf: 20, l: 1, k: 5, bias: false, lead: &[2, 1, 5] },
    ]
}

/// Parameters and inputs in float32 (what kfuse gets), random and independent of kfuse's init.
struct Problem {
    x: Vec<f32>,
    s1: Vec<f32>,
    s2: Vec<f32>,
    u1: Vec<f32>,
    u2: Vec<f32>,
    b: Vec<f32>,
    dy: Vec<f32>,
}

fn problem(c: &Cfg, seed: u64) -> Problem {
    let mut rng = Rng::new(seed);
    let (li, lo) = (c.l * c.inf * c.k, c.l * c.k * c.outf);
    let u = 1.0 / (c.k as f64).sqrt();
    Problem {
        x: rng.vec(c.n() * c.inf, -1.0, 1.0),
        s1: rng.vec(li, -0.5, 0.5),
        s2: rng.vec(lo, -0.5, 0.5),
        u1: rng.vec(lo, -u, u),
        u2: rng.vec(li, -u, u),
        b: if c.bias { rng.vec(c.outf, -0.5, 0.5) } else { Vec::new() },
        dy: rng.vec(c.n() * c.outf, -1.0, 1.0),
    }
}

/// Views of S1s, S2s, U1s, U2s and (when `c` has one) the bias, of either element type.
fn sk_params<'a, T: Float>(
    c: &Cfg,
    s1: &'a [T],
    s2: &'a [T],
    u1: &'a [T],
    u2: &'a [T],
    b: &'a [T],
) -> SkParams<'a, T> {
    let d = c.desc();
    let p = SkParams::new(
        Tensor::new(s1, &d.s1s_shape()),
        Tensor::new(s2, &d.s2s_shape()),
        Tensor::new(u1, &d.u1s_shape()),
        Tensor::new(u2, &d.u2s_shape()),
    );
    if c.bias {
        p.bias(Tensor::new(b, &d.bias_shape()))
    } else {
        p
    }
}

impl Problem {
    fn params(&self, c: &Cfg) -> SkParams<'_> {
        sk_params(c, &self.s1, &self.s2, &self.u1, &self.u2, &self.b)
    }
}

/// The float64 reference, term by term. Layouts (row-major): x [N, in], S1s and U2s [L, in, k],
/// S2s and U1s [L, k, out], b [out] (empty: no bias).
struct Ref<'a> {
    c: Cfg,
    x: &'a [f64],
    s1: &'a [f64],
    s2: &'a [f64],
    u1: &'a [f64],
    u2: &'a [f64],
    b: &'a [f64],
}

struct Grads {
    dx: Vec<f64>,
    ds1: Vec<f64>,
    ds2: Vec<f64>,
    db: Vec<f64>,
}

impl Ref<'_> {
    fn ik(&self, i: usize, p: usize, c: usize) -> usize {
        (i * self.c.inf + p) * self.c.k + c
    }
    fn ko(&self, i: usize, c: usize, o: usize) -> usize {
        (i * self.c.k + c) * self.c.outf + o
    }
    /// x_n M_i for M = S1s or U2s ([L, in, k]): a k-vector.
    fn x_times(&self, m: &[f64], n: usize, i: usize) -> Vec<f64> {
        let x = &self.x[n * self.c.inf..(n + 1) * self.c.inf];
        (0..self.c.k).map(|c| (0..self.c.inf).map(|p| x[p] * m[self.ik(i, p, c)]).sum()).collect()
    }
    /// M_i g for M = U1s or S2s ([L, k, out]) and an out-vector g: a k-vector.
    fn times_g(&self, m: &[f64], i: usize, g: &[f64]) -> Vec<f64> {
        (0..self.c.k).map(|c| (0..self.c.outf).map(|o| m[self.ko(i, c, o)] * g[o]).sum()).collect()
    }

    fn forward(&self) -> Vec<f64> {
        let c = self.c;
        let s = 1.0 / (2.0 * c.l as f64);
        let mut y = vec![0.0; c.n() * c.outf];
        for n in 0..c.n() {
            for o in 0..c.outf {
                let mut acc = 0.0;
                for i in 0..c.l {
                    let a = self.x_times(self.s1, n, i); // x S1_i
                    let bb = self.x_times(self.u2, n, i); // x U2_i
                    for r in 0..c.k {
                        acc += a[r] * self.u1[self.ko(i, r, o)] + bb[r] * self.s2[self.ko(i, r, o)];
                    }
                }
                y[n * c.outf + o] = s * acc + if c.bias { self.b[o] } else { 0.0 };
            }
        }
        y
    }

    fn backward(&self, dy: &[f64]) -> Grads {
        let c = self.c;
        let s = 1.0 / (2.0 * c.l as f64);
        let mut g = Grads {
            dx: vec![0.0; c.n() * c.inf],
            ds1: vec![0.0; c.l * c.inf * c.k],
            ds2: vec![0.0; c.l * c.k * c.outf],
            db: vec![0.0; if c.bias { c.outf } else { 0 }],
        };
        for n in 0..c.n() {
            let gy = &dy[n * c.outf..(n + 1) * c.outf];
            let x = &self.x[n * c.inf..(n + 1) * c.inf];
            for i in 0..c.l {
                let u1g = self.times_g(self.u1, i, gy); // dL/d(x S1_i) / s
                let s2g = self.times_g(self.s2, i, gy); // dL/d(x U2_i) / s
                let bb = self.x_times(self.u2, n, i);
                for p in 0..c.inf {
                    for r in 0..c.k {
                        g.dx[n * c.inf + p] +=
                            s * (self.s1[self.ik(i, p, r)] * u1g[r] + self.u2[self.ik(i, p, r)] * s2g[r]);
                        g.ds1[self.ik(i, p, r)] += s * x[p] * u1g[r];
                    }
                }
                for r in 0..c.k {
                    for o in 0..c.outf {
                        g.ds2[self.ko(i, r, o)] += s * bb[r] * gy[o];
                    }
                }
            }
            for (db, &gy) in g.db.iter_mut().zip(gy) {
                *db += gy;
            }
        }
        g
    }
}

struct P64 {
    x: Vec<f64>,
    s1: Vec<f64>,
    s2: Vec<f64>,
    u1: Vec<f64>,
    u2: Vec<f64>,
    b: Vec<f64>,
    dy: Vec<f64>,
}

fn p64(p: &Problem) -> P64 {
    P64 {
        x: to_f64(&p.x),
        s1: to_f64(&p.s1),
        s2: to_f64(&p.s2),
        u1: to_f64(&p.u1),
        u2: to_f64(&p.u2),
        b: to_f64(&p.b),
        dy: to_f64(&p.dy),
    }
}

fn reference<'a>(c: Cfg, p: &'a P64) -> Ref<'a> {
    Ref { c, x: &p.x, s1: &p.s1, s2: &p.s2, u1: &p.u1, u2: &p.u2, b: &p.b }
}

/// The hand-derived reference gradients are those of the reference forward (central differences
/// of sum(dy * y)), so that the comparisons below test kfuse and not a shared mistake.
#[test]
fn reference_gradients_match_finite_differences() {
    for c in [configs()[0], configs()[2], Cfg { lead: &[2], ..configs()[1] }] {
        let p = p64(&problem(&c, 11));
        let g = reference(c, &p).backward(&p.dy);
        let loss = |q: &P64| -> f64 { reference(c, q).forward().iter().zip(&q.dy).map(|(a, b)| a * b).sum() };
        let fd = |which: usize, k: usize| {
            let eps = 1e-6;
            let at = |d: f64| {
                let mut q = p64(&problem(&c, 11));
                match which {
                    0 => q.x[k] += d,
                    1 => q.s1[k] += d,
                    2 => q.s2[k] += d,
                    _ => q.b[k] += d,
                }
                loss(&q)
            };
            (at(eps) - at(-eps)) / (2.0 * eps)
        };
        for (which, name, ours) in
            [(0, "dx", &g.dx), (1, "dS1s", &g.ds1), (2, "dS2s", &g.ds2), (3, "db", &g.db)]
        {
            for (k, &v) in ours.iter().enumerate() {
                let f = fd(which, k);
                assert!((v - f).abs() <= 1e-7 * (1.0 + f.abs()), "{c:?} {name}[{k}]: {v} vs fd {f}");
            }
        }
    }
}

#[test]
fn forward_matches_f64_reference() {
    for threads in [1, 0] {
        let ctx = Context::builder(Device::Cpu).with_threads(threads).build().unwrap();
        for (t, c) in configs().into_iter().enumerate() {
            let mut plan = SkLinearPlan::new(&ctx, &c.desc()).unwrap();
            let p = problem(&c, 100 + t as u64);
            let q = p64(&p);
            let yr = reference(c, &q).forward();
            let mut y = vec![f32::NAN; yr.len()]; // poisoned: every element must be written
            let args = SkForwardArgs::new(
                Tensor::new(&p.x, &c.x_shape()),
                p.params(&c),
                TensorMut::new(&mut y, &c.y_shape()),
            );
            plan.forward(&args).unwrap();
            let e = rel_err(&y, &yr);
            assert!(e < 1e-5, "threads={threads} {c:?}: y rel err {e:.3e}");
        }
    }
}

#[test]
fn backward_matches_f64_reference() {
    for threads in [1, 0] {
        let ctx = Context::builder(Device::Cpu).with_threads(threads).build().unwrap();
        for (t, c) in configs().into_iter().enumerate() {
            let mut plan = SkLinearPlan::new(&ctx, &c.desc()).unwrap();
            let d = c.desc();
            let p = problem(&c, 200 + t as u64);
            let q = p64(&p);
            let g = reference(c, &q).backward(&q.dy);

            let mut dx = vec![f32::NAN; p.x.len()];
            let mut grads = SkHostParams::zeros(&d);
            for v in grads.s1s.iter_mut().chain(grads.s2s.iter_mut()).chain(grads.bias.iter_mut().flatten()) {
                *v = f32::NAN;
            }
            let bwd = SkBackwardArgs::new(
                Tensor::new(&p.x, &c.x_shape()),
                p.params(&c),
                Tensor::new(&p.dy, &c.y_shape()),
            )
            .dx(TensorMut::new(&mut dx, &c.x_shape()))
            .dparams(&mut grads);
            plan.backward(GradMode::Overwrite, &bwd).unwrap();
            let errs = [
                ("dx", rel_err(&dx, &g.dx)),
                ("dS1s", rel_err(&grads.s1s, &g.ds1)),
                ("dS2s", rel_err(&grads.s2s, &g.ds2)),
                ("dbias", if c.bias { rel_err(grads.bias.as_ref().unwrap(), &g.db) } else { 0.0 }),
            ];
            for (name, e) in errs {
                assert!(e < 1e-5, "threads={threads} {c:?}: {name} rel err {e:.3e}");
            }
            assert!(grads.u1s.iter().chain(&grads.u2s).all(|&v| v == 0.0), "U1s/U2s have no gradient");
        }
    }
}

/// Accumulate adds to dS1s, dS2s, dbias and still overwrites dx; outputs left out stay untouched.
#[test]
fn accumulate_adds_and_outputs_are_optional() {
    let ctx = Context::builder(Device::Cpu).with_threads(1).build().unwrap();
    let c = configs()[1];
    let d = c.desc();
    let mut plan = SkLinearPlan::new(&ctx, &d).unwrap();
    let p = problem(&c, 7);
    let q = p64(&p);
    let g = reference(c, &q).backward(&q.dy);

    let mut rng = Rng::new(8);
    let mut grads = SkHostParams::zeros(&d);
    grads.s1s = rng.vec(grads.s1s.len(), -1.0, 1.0);
    grads.s2s = rng.vec(grads.s2s.len(), -1.0, 1.0);
    grads.bias = Some(rng.vec(c.outf, -1.0, 1.0));
    let before = grads.clone();
    let mut dx = vec![f32::NAN; p.x.len()];
    let bwd =
        SkBackwardArgs::new(Tensor::new(&p.x, &c.x_shape()), p.params(&c), Tensor::new(&p.dy, &c.y_shape()))
            .dx(TensorMut::new(&mut dx, &c.x_shape()))
            .dparams(&mut grads);
    plan.backward(GradMode::Accumulate, &bwd).unwrap();
    let plus = |b: &[f32], g: &[f64]| -> Vec<f64> { b.iter().zip(g).map(|(&b, &g)| b as f64 + g).collect() };
    assert!(rel_err(&dx, &g.dx) < 1e-5, "dx must be overwritten in Accumulate mode");
    assert!(rel_err(&grads.s1s, &plus(&before.s1s, &g.ds1)) < 1e-5, "dS1s");
    assert!(rel_err(&grads.s2s, &plus(&before.s2s, &g.ds2)) < 1e-5, "dS2s");
    let (b0, b1) = (before.bias.as_ref().unwrap(), grads.bias.as_ref().unwrap());
    assert!(rel_err(b1, &plus(b0, &g.db)) < 1e-5, "dbias");

    // only dS2s asked for; dx alone; nothing at all
    let mut ds2 = vec![f32::NAN; p.s2.len()];
    let bwd =
        SkBackwardArgs::new(Tensor::new(&p.x, &c.x_shape()), p.params(&c), Tensor::new(&p.dy, &c.y_shape()))
            .ds2s(TensorMut::new(&mut ds2, &d.s2s_shape()));
    plan.backward(GradMode::Overwrite, &bwd).unwrap();
    assert!(rel_err(&ds2, &g.ds2) < 1e-5);
    let mut dx = vec![f32::NAN; p.x.len()];
    let bwd =
        SkBackwardArgs::new(Tensor::new(&p.x, &c.x_shape()), p.params(&c), Tensor::new(&p.dy, &c.y_shape()))
            .dx(TensorMut::new(&mut dx, &c.x_shape()));
    plan.backward(GradMode::Overwrite, &bwd).unwrap();
    assert!(rel_err(&dx, &g.dx) < 1e-5);
    let bwd =
        SkBackwardArgs::new(Tensor::new(&p.x, &c.x_shape()), p.params(&c), Tensor::new(&p.dy, &c.y_shape()));
    plan.backward(GradMode::Overwrite, &bwd).unwrap();
}

/// forward_raw/backward_raw with a caller workspace of workspace_size() bytes, against the
/// reference; one byte less is refused.
#[test]
fn caller_workspace_of_the_queried_size() {
    caller_workspace::<f32>(1e-5, |ws| ws - 1);
}

/// A 16-bit plan's scratch holds float32 copies of its tensors: its workspace_size() exceeds a
/// float32 plan's, a caller workspace of the float32 size is refused, and one of the queried size
/// works (results within u + 1e-5 of the reference).
#[test]
fn low_precision_caller_workspace_holds_float32_copies() {
    let ctx = Context::cpu().unwrap();
    let c = configs()[4];
    let ws32 = SkLinearPlan::new(&ctx, &c.desc()).unwrap().workspace_size(c.n()).unwrap();
    let float32_size = |ws: usize| {
        assert!(ws > ws32, "16-bit workspace {ws} bytes, float32's {ws32}");
        ws32
    };
    caller_workspace::<half::bf16>(half::bf16::TOL, float32_size);
    caller_workspace::<half::f16>(half::f16::TOL, float32_size);
}

/// forward_raw/backward_raw of a plan of element type `T` with a caller workspace of
/// workspace_size() bytes, against the reference on the problem rounded to `T` (within `tol`);
/// `short(size)` bytes of the same buffer are refused with WorkspaceTooSmall.
fn caller_workspace<T: TestFloat>(tol: f64, short: impl Fn(usize) -> usize) {
    let ctx = Context::builder(Device::Cpu).with_threads(1).fixed_arena(true).build().unwrap();
    let c = configs()[4];
    let mut plan = SkLinearPlan::<T>::new_typed(&ctx, &c.desc()).unwrap();
    let mut p = problem(&c, 9);
    for v in [&mut p.x, &mut p.s1, &mut p.s2, &mut p.u1, &mut p.u2, &mut p.b, &mut p.dy] {
        round_to::<T>(v);
    }
    let q = p64(&p);
    let (x, dy) = (cast::<T>(&p.x), cast::<T>(&p.dy));
    let (s1, s2, u1, u2, b) = (cast(&p.s1), cast(&p.s2), cast(&p.u1), cast(&p.u2), cast(&p.b));
    let ws = plan.workspace_size(c.n()).unwrap();
    let buf = AlignedBuf::new(ws);
    let mut y = vec![T::from_f32(f32::NAN); c.n() * c.outf];
    let mut dx = vec![T::from_f32(f32::NAN); x.len()];
    {
        let fwd = SkForwardArgs::new(
            Tensor::new(&x, &c.x_shape()),
            sk_params(&c, &s1, &s2, &u1, &u2, &b),
            TensorMut::new(&mut y, &c.y_shape()),
        );
        // SAFETY: buf holds ws bytes, 64-byte aligned host memory on a CPU context.
        unsafe { plan.forward_raw(&fwd, buf.ptr(), ws) }.unwrap();
        let bwd = SkBackwardArgs::from_forward(&fwd, Tensor::new(&dy, &c.y_shape()))
            .dx(TensorMut::new(&mut dx, &c.x_shape()));
        // SAFETY: as above.
        unsafe { plan.backward_raw(GradMode::Overwrite, &bwd, buf.ptr(), ws) }.unwrap();
        if ws > 0 {
            // SAFETY: as above, with fewer bytes declared than the buffer holds.
            let e = unsafe { plan.forward_raw(&fwd, buf.ptr(), short(ws)) }.unwrap_err();
            assert_eq!(e.status(), Status::WorkspaceTooSmall, "{e}");
        }
    }
    drop(buf);
    assert!(rel_err(&y, &reference(c, &q).forward()) <= tol);
    assert!(rel_err(&dx, &reference(c, &q).backward(&q.dy).dx) <= tol);
    // the fixed arena was never needed
    assert_eq!(ctx.arena_info().unwrap().grow_count, 0);
}

#[test]
fn param_ratio_is_the_parameter_count_ratio() {
    let ctx = Context::cpu().unwrap();
    for (inf, outf, l, k) in [(1024usize, 1024usize, 1u32, 16u32), (8, 6, 3, 17), (5, 3, 1, 1)] {
        let plan = SkLinearPlan::new(&ctx, &SkLinearDesc::new(inf, outf, l, k)).unwrap();
        let want = 2.0 * (l * k) as f64 * (inf + outf) as f64 / (inf * outf) as f64;
        let got = plan.param_ratio().unwrap();
        assert!((got - want).abs() <= 1e-12 * want, "{inf}x{outf} L={l} k={k}: {got} vs {want}");
    }
}

#[test]
fn shape_queries_follow_their_descriptor() {
    // The queries share one plan per descriptor (the last one asked is remembered): asked in turn,
    // each descriptor still gets its own shapes, [L, in, k] and [L, k, out], with or without a bias.
    let descs = [(1024usize, 512usize, 1u32, 16u32, true), (300, 200, 3, 8, false), (5, 3, 2, 1, true)];
    for _ in 0..2 {
        for &(inf, outf, l, k, bias) in &descs {
            let d = SkLinearDesc::new(inf, outf, l, k).bias(bias);
            let (lu, ku) = (l as usize, k as usize);
            assert_eq!(d.s1s_shape(), [lu, inf, ku]);
            assert_eq!(d.s2s_shape(), [lu, ku, outf]);
            assert_eq!(d.u1s_shape(), [lu, ku, outf]);
            assert_eq!(d.u2s_shape(), [lu, inf, ku]);
            assert_eq!(d.bias_shape(), [outf]);
        }
    }
    // a descriptor the library refuses has no shapes
    assert_eq!(SkLinearDesc::new(0, 3, 1, 1).s1s_shape(), [0, 0, 0]);
}

// ---- initialisation ------------------------------------------------------------------------

#[test]
fn init_params_sketches_are_scaled_signs_and_s_follow_w_init() {
    init_params_case::<f32>(1e-6, 1e-5);
}

/// Panther's initialisation by bfloat16 and float16 plans: the same formulas, each value rounded
/// once to the type (the sketches within u of +-1/sqrt(k), S1s and S2s within u + 1e-5).
#[test]
fn low_precision_init_params() {
    init_params_case::<half::bf16>(half::bf16::UNIT_ROUNDOFF + 1e-6, half::bf16::TOL);
    init_params_case::<half::f16>(half::f16::UNIT_ROUNDOFF + 1e-6, half::f16::TOL);
}

/// init_params with W_init through a plan of element type `T` (W_init rounded to `T`): U1s and
/// U2s are +-1/sqrt(k) within `sign_tol` relative, S1s = W_init^T U1s^T and S2s = U2s^T W_init^T
/// within `tol` (relative, float64 products of the returned sketches), the bias in
/// U(-1/sqrt(out), 1/sqrt(out)) but for rounding.
fn init_params_case<T: TestFloat>(sign_tol: f64, tol: f64) {
    let name = std::any::type_name::<T>();
    let ctx = Context::cpu().unwrap();
    for c in [configs()[0], configs()[1], configs()[2]] {
        let d = c.desc();
        let mut plan = SkLinearPlan::<T>::new_typed(&ctx, &d).unwrap();
        let mut w = Rng::new(5).vec(c.outf * c.inf, -1.0, 1.0); // a Linear's weight [out, in]
        round_to::<T>(&mut w);
        let p = plan.init_params(42, Some(Tensor::new(&cast::<T>(&w), &d.w_init_shape()))).unwrap();
        let f = |v: &[T]| -> Vec<f64> { v.iter().map(|&a| a.into()).collect() };

        let u = 1.0 / (c.k as f64).sqrt();
        for (what, v) in [("U1s", f(&p.u1s)), ("U2s", f(&p.u2s))] {
            for &e in v.iter() {
                assert!(
                    (e.abs() - u).abs() <= sign_tol * u,
                    "{name} {c:?}: {what} entry {e}, expected +-{u}"
                );
            }
            if v.len() >= 32 {
                assert!(
                    v.iter().any(|&e| e > 0.0) && v.iter().any(|&e| e < 0.0),
                    "{name} {c:?}: {what} one sign"
                );
            }
        }
        // S1s[i] = W_init^T U1s[i]^T: S1[i,p,r] = sum_o W[o,p] U1[i,r,o]
        // S2s[i] = U2s[i]^T W_init^T: S2[i,r,o] = sum_p U2[i,p,r] W[o,p]
        let (wf, u1, u2) = (to_f64(&w), f(&p.u1s), f(&p.u2s));
        let mut s1 = vec![0.0; p.s1s.len()];
        let mut s2 = vec![0.0; p.s2s.len()];
        for i in 0..c.l {
            for r in 0..c.k {
                for pp in 0..c.inf {
                    for o in 0..c.outf {
                        let wv = wf[o * c.inf + pp];
                        s1[(i * c.inf + pp) * c.k + r] += wv * u1[(i * c.k + r) * c.outf + o];
                        s2[(i * c.k + r) * c.outf + o] += u2[(i * c.inf + pp) * c.k + r] * wv;
                    }
                }
            }
        }
        let (e1, e2) = (rel_err(&p.s1s, &s1), rel_err(&p.s2s, &s2));
        assert!(e1 < tol && e2 < tol, "{name} {c:?}: S1s rel err {e1:.3e}, S2s rel err {e2:.3e}");
        match &p.bias {
            Some(b) => {
                let bound = (1.0 + T::UNIT_ROUNDOFF) / (c.outf as f64).sqrt();
                assert!(
                    f(b).iter().all(|v| v.abs() <= bound),
                    "{name} {c:?}: bias outside U(-{bound}, {bound})"
                );
            }
            None => assert!(!c.bias),
        }
    }
}

#[test]
fn init_params_without_w_init_is_a_function_of_the_seed() {
    let ctx = Context::cpu().unwrap();
    let c = configs()[1];
    let d = c.desc();
    let mut plan = SkLinearPlan::new(&ctx, &d).unwrap();
    let a = plan.init_params(1, None).unwrap();
    let u = 1.0 / (c.k as f32).sqrt();
    assert!(a.u1s.iter().chain(&a.u2s).all(|e| (e.abs() - u).abs() <= 1e-6 * u));
    // S1s and S2s come from one W [in, out] in U(-1/sqrt(out), 1/sqrt(out)): each S1 entry is
    // a sum of `out` products bounded by 1/sqrt(out) * 1/sqrt(k), each S2 entry of `in` of them.
    let bound1 = c.outf as f32 / (c.outf as f32).sqrt() * u * 1.0001;
    let bound2 = c.inf as f32 / (c.outf as f32).sqrt() * u * 1.0001;
    assert!(a.s1s.iter().all(|v| v.is_finite() && v.abs() <= bound1));
    assert!(a.s2s.iter().all(|v| v.is_finite() && v.abs() <= bound2));
    assert!(a.s1s.iter().any(|&v| v != 0.0) && a.s2s.iter().any(|&v| v != 0.0));
    // a pure function of the seed: into caller buffers on another thread count, same values
    let ctx1 = Context::builder(Device::Cpu).with_threads(1).build().unwrap();
    let mut plan1 = SkLinearPlan::new(&ctx1, &d).unwrap();
    let mut b = SkHostParams::zeros(&d);
    plan1.init_params_into(1, None, b.view_mut()).unwrap();
    assert_eq!(a, b);
    let other = plan.init_params(2, None).unwrap();
    assert_ne!(a.u1s, other.u1s);
}

// ---- errors ------------------------------------------------------------------------------

#[test]
fn bad_descriptor_names_the_field() {
    let ctx = Context::cpu().unwrap();
    for (d, field) in [
        (SkLinearDesc::new(0, 4, 1, 2), "in_features"),
        (SkLinearDesc::new(4, 0, 1, 2), "out_features"),
        (SkLinearDesc::new(4, 4, 0, 2), "num_terms"),
        (SkLinearDesc::new(4, 4, 1, 0), "low_rank"),
    ] {
        let e = SkLinearPlan::new(&ctx, &d).unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "{e}");
        assert!(e.message().contains(field), "{field}: {e}");
    }
    // a sketch bigger than the dense layer is allowed
    let plan = SkLinearPlan::new(&ctx, &SkLinearDesc::new(2, 2, 4, 8)).unwrap();
    assert!(plan.param_ratio().unwrap() > 1.0);
}

#[test]
fn bad_input_is_an_error_naming_the_argument() {
    let ctx = Context::cpu().unwrap();
    let c = Cfg { inf: 5, outf: 3, l: 2, k: 2, bias: true, lead: &[4] };
    let d = c.desc();
    let mut plan = SkLinearPlan::new(&ctx, &d).unwrap();
    let p = problem(&c, 3);
    let mut y = vec![7.0f32; c.n() * c.outf];
    let n = c.n();

    // x of the wrong width (consistent with its slice): the library's message
    let x6 = vec![0.5f32; n * 6];
    let args = SkForwardArgs::new(Tensor::new(&x6, &[n, 6]), p.params(&c), TensorMut::new(&mut y, &[n, 3]));
    let e = plan.forward(&args).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().starts_with("kf_sklinear_forward") && e.message().contains("args->x"), "{e}");
    assert!(y.iter().all(|&v| v == 7.0), "a failed call wrote y");

    // a slice shorter than its shape: checked before the call
    let args =
        SkForwardArgs::new(Tensor::new(&p.x[1..], &[n, 5]), p.params(&c), TensorMut::new(&mut y, &[n, 3]));
    let e = plan.forward(&args).unwrap_err();
    assert!(e.message().contains("SkLinearPlan::forward: args.x has 19 elements"), "{e}");

    // y whose leading dims are not x's
    let mut y2 = vec![0.0f32; 2 * n * 3];
    let args =
        SkForwardArgs::new(Tensor::new(&p.x, &[n, 5]), p.params(&c), TensorMut::new(&mut y2, &[2 * n, 3]));
    let e = plan.forward(&args).unwrap_err();
    assert!(e.message().contains("args->y"), "{e}");

    // a parameter of the wrong shape (S1s with k and in swapped, U2s with L+1 terms)
    let x = &p.x;
    let bad = SkParams::new(
        Tensor::new(&p.s1, &[2, 2, 5]),
        Tensor::new(&p.s2, &d.s2s_shape()),
        Tensor::new(&p.u1, &d.u1s_shape()),
        Tensor::new(&p.u2, &d.u2s_shape()),
    )
    .bias(Tensor::new(&p.b, &[3]));
    let args = SkForwardArgs::new(Tensor::new(x, &[n, 5]), bad, TensorMut::new(&mut y, &[n, 3]));
    let e = plan.forward(&args).unwrap_err();
    assert!(e.message().contains("args->S1s"), "{e}");
    let u2_3 = vec![0.1f32; 3 * 5 * 2];
    let bad = SkParams::new(
        Tensor::new(&p.s1, &d.s1s_shape()),
        Tensor::new(&p.s2, &d.s2s_shape()),
        Tensor::new(&p.u1, &d.u1s_shape()),
        Tensor::new(&u2_3, &[3, 5, 2]),
    )
    .bias(Tensor::new(&p.b, &[3]));
    let args = SkForwardArgs::new(Tensor::new(x, &[n, 5]), bad, TensorMut::new(&mut y, &[n, 3]));
    let e = plan.forward(&args).unwrap_err();
    assert!(e.message().contains("args->U2s"), "{e}");

    // the plan has a bias and none is given
    let nob = SkParams::new(
        Tensor::new(&p.s1, &d.s1s_shape()),
        Tensor::new(&p.s2, &d.s2s_shape()),
        Tensor::new(&p.u1, &d.u1s_shape()),
        Tensor::new(&p.u2, &d.u2s_shape()),
    );
    let args = SkForwardArgs::new(Tensor::new(x, &[n, 5]), nob, TensorMut::new(&mut y, &[n, 3]));
    let e = plan.forward(&args).unwrap_err();
    assert!(e.message().contains("args->bias"), "{e}");

    // a plan without a bias is given one, and asked for dbias
    let mut plan_nb = SkLinearPlan::new(&ctx, &d.clone().bias(false)).unwrap();
    let args = SkForwardArgs::new(Tensor::new(x, &[n, 5]), p.params(&c), TensorMut::new(&mut y, &[n, 3]));
    let e = plan_nb.forward(&args).unwrap_err();
    assert!(e.message().contains("args->bias"), "{e}");
    let mut db = vec![0.0f32; 3];
    let bwd = SkBackwardArgs::new(Tensor::new(x, &[n, 5]), nob, Tensor::new(&p.dy, &[n, 3]))
        .dbias(TensorMut::new(&mut db, &[3]));
    let e = plan_nb.backward(GradMode::Overwrite, &bwd).unwrap_err();
    assert!(e.message().starts_with("kf_sklinear_backward") && e.message().contains("args->dbias"), "{e}");

    // backward: dy of the wrong width, dS2s of the wrong shape, dx not x's shape
    let dy4 = vec![0.0f32; n * 4];
    let bwd = SkBackwardArgs::new(Tensor::new(x, &[n, 5]), p.params(&c), Tensor::new(&dy4, &[n, 4]));
    let e = plan.backward(GradMode::Overwrite, &bwd).unwrap_err();
    assert!(e.message().contains("args->dy"), "{e}");
    let mut ds2 = vec![0.0f32; p.s2.len()];
    let bwd = SkBackwardArgs::new(Tensor::new(x, &[n, 5]), p.params(&c), Tensor::new(&p.dy, &[n, 3]))
        .ds2s(TensorMut::new(&mut ds2, &[2, 3, 2]));
    let e = plan.backward(GradMode::Accumulate, &bwd).unwrap_err();
    assert!(e.message().contains("args->dS2s"), "{e}");
    let mut dx = vec![0.0f32; n * 5];
    let bwd = SkBackwardArgs::new(Tensor::new(x, &[n, 5]), p.params(&c), Tensor::new(&p.dy, &[n, 3]))
        .dx(TensorMut::new(&mut dx, &[n * 5]));
    let e = plan.backward(GradMode::Overwrite, &bwd).unwrap_err();
    assert!(e.message().contains("args->dx"), "{e}");

    // init: W_init of the wrong shape ([in, out] instead of [out, in]); output of the wrong length
    let w = vec![0.1f32; 5 * 3];
    let e = plan.init_params(1, Some(Tensor::new(&w, &[5, 3]))).unwrap_err();
    assert!(e.message().starts_with("kf_sklinear_init_params") && e.message().contains("W_init"), "{e}");
    let mut hp = SkHostParams::zeros(&d);
    hp.s2s.pop();
    let e = plan.init_params_into(1, None, hp.view_mut()).unwrap_err();
    assert!(e.message().contains("SkLinearPlan::init_params_into: args.S2s has 11 elements"), "{e}");
}

/// A plan of element type `T` (`SkLinearPlan::<T>::new_typed`) against the float64 reference on
/// the same inputs (the problem rounded to `T` first): y, then every gradient overwritten and
/// accumulated onto random gradients (dx overwritten in both), each within `tol`, 1 and all
/// threads.
fn typed_plan_matches_f64_reference<T: TestFloat>(tol: f64) {
    let name = std::any::type_name::<T>();
    for threads in [1, 0] {
        let ctx = Context::builder(Device::Cpu).with_threads(threads).build().unwrap();
        for (t, c) in configs().into_iter().enumerate() {
            let d = c.desc();
            let mut plan = SkLinearPlan::<T>::new_typed(&ctx, &d).unwrap();
            let mut p = problem(&c, 300 + t as u64);
            for v in [&mut p.x, &mut p.s1, &mut p.s2, &mut p.u1, &mut p.u2, &mut p.b, &mut p.dy] {
                round_to::<T>(v);
            }
            let q = p64(&p);
            let r = reference(c, &q);
            let (x, dy) = (cast::<T>(&p.x), cast::<T>(&p.dy));
            let (s1, s2, u1, u2, b) = (cast(&p.s1), cast(&p.s2), cast(&p.u1), cast(&p.u2), cast(&p.b));
            let params = || sk_params(&c, &s1, &s2, &u1, &u2, &b);
            let nan = T::from_f32(f32::NAN);
            let mut y = vec![nan; c.n() * c.outf];
            let fwd = SkForwardArgs::new(
                Tensor::new(&x, &c.x_shape()),
                params(),
                TensorMut::new(&mut y, &c.y_shape()),
            );
            plan.forward(&fwd).unwrap();
            let e = rel_err(&y, &r.forward());
            assert!(e <= tol, "{name} threads={threads} {c:?}: y rel err {e:.3e}");

            let g = r.backward(&q.dy);
            for mode in [GradMode::Overwrite, GradMode::Accumulate] {
                // Overwrite: every gradient poisoned; Accumulate: random finite gradients in T
                let mut rng = Rng::new(700 + t as u64);
                let mut start = |n: usize| -> Vec<f32> {
                    let mut v = rng.vec(n, -1.0, 1.0);
                    round_to::<T>(&mut v);
                    if mode == GradMode::Overwrite {
                        v.iter_mut().for_each(|a| *a = f32::NAN);
                    }
                    v
                };
                let (s1_0, s2_0) = (start(p.s1.len()), start(p.s2.len()));
                let b_0 = start(p.b.len());
                let mut grads = SkHostParams::<T>::zeros_typed(&d);
                grads.s1s = cast(&s1_0);
                grads.s2s = cast(&s2_0);
                grads.bias = c.bias.then(|| cast(&b_0));
                let mut dx = vec![nan; x.len()];
                let bwd = SkBackwardArgs::new(
                    Tensor::new(&x, &c.x_shape()),
                    params(),
                    Tensor::new(&dy, &c.y_shape()),
                )
                .dx(TensorMut::new(&mut dx, &c.x_shape()))
                .dparams(&mut grads);
                plan.backward(mode, &bwd).unwrap();
                let plus = |g0: &[f32], g: &[f64]| -> Vec<f64> {
                    if mode == GradMode::Overwrite {
                        g.to_vec()
                    } else {
                        g0.iter().zip(g).map(|(&a, &b)| a as f64 + b).collect()
                    }
                };
                let errs = [
                    ("dx", rel_err(&dx, &g.dx)),
                    ("dS1s", rel_err(&grads.s1s, &plus(&s1_0, &g.ds1))),
                    ("dS2s", rel_err(&grads.s2s, &plus(&s2_0, &g.ds2))),
                    (
                        "dbias",
                        if c.bias { rel_err(grads.bias.as_ref().unwrap(), &plus(&b_0, &g.db)) } else { 0.0 },
                    ),
                ];
                for (what, e) in errs {
                    assert!(e <= tol, "{name} threads={threads} {c:?} {mode:?}: {what} rel err {e:.3e}");
                }
            }
        }
    }
}

/// A float64 plan (`SkLinearPlan::<f64>::new_typed`) computes in float64: forward and every
/// gradient within 1e-12 of the float64 reference, accumulation included. (Mixing element types
/// cannot be written through the safe API: every view of a call has the plan's `T`.)
#[test]
fn float64_plan_matches_f64_reference() {
    typed_plan_matches_f64_reference::<f64>(1e-12);
}

/// bfloat16 and float16 plans (`SkLinearPlan::<bf16>::new_typed`, `<f16>`): storage in the type,
/// float32 arithmetic, one rounding, so within u + 1e-5 of the float64 reference on the same
/// inputs (tests/c/test_lowp.c's bound), accumulation included.
#[test]
fn low_precision_plans_match_f64_reference() {
    typed_plan_matches_f64_reference::<half::bf16>(half::bf16::TOL);
    typed_plan_matches_f64_reference::<half::f16>(half::f16::TOL);
}

// ---- the fused epilogue (since 1.8) --------------------------------------------------------

/// erf by its Maclaurin series (|v| < 4 here), written for this test.
fn erf(v: f64) -> f64 {
    let (mut term, mut sum) = (v, v);
    for n in 1..80 {
        term *= -v * v / n as f64;
        sum += term / (2 * n + 1) as f64;
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

/// act(v) and act'(v) from their definitions (kfuse.h's kf_activation).
fn act_ref(a: Activation, v: f64) -> (f64, f64) {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    match a {
        Activation::None => (v, 1.0),
        Activation::Relu => (v.max(0.0), if v > 0.0 { 1.0 } else { 0.0 }),
        Activation::Gelu => {
            let phi = 0.5 * (1.0 + erf(v / 2f64.sqrt()));
            (v * phi, phi + v * (-0.5 * v * v).exp() / (2.0 * std::f64::consts::PI).sqrt())
        }
        Activation::GeluTanh => {
            let t = (c * (v + 0.044715 * v * v * v)).tanh();
            (
                0.5 * v * (1.0 + t),
                0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * v * v),
            )
        }
        Activation::Silu => {
            let s = 1.0 / (1.0 + (-v).exp());
            (v * s, s * (1.0 + v * (1.0 - s)))
        }
    }
}

/// The dropout mask at counter `ctr`: SplitMix64's finaliser on the seed, then on it xor the
/// counter; kept when the top 24 bits over 2^24 are >= p (written here from kfuse.h's words).
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
fn fused_activation_and_dropout_match_f64_reference() {
    let ctx = Context::cpu().unwrap();
    let c = Cfg { inf: 40, outf: 24, l: 2, k: 3, bias: true, lead: &[3, 5] };
    let (seed, offset) = (0x1234_5678_9abc_u64, 11_u64);
    for act in [Activation::None, Activation::Relu, Activation::Gelu, Activation::GeluTanh, Activation::Silu]
    {
        for p in [0.0f32, 0.3] {
            let d = c.desc().activation(act).dropout(p);
            let mut plan = SkLinearPlan::new(&ctx, &d).unwrap();
            let pr = problem(&c, 77);
            let q = p64(&pr);
            let pre_ref = reference(c, &q).forward();
            let scale = if p > 0.0 { 1.0 / (1.0 - p as f64) } else { 1.0 };
            let m: Vec<f64> = (0..pre_ref.len())
                .map(|i| if p == 0.0 || keep(seed, offset + i as u64, p) { scale } else { 0.0 })
                .collect();
            let y_ref: Vec<f64> = pre_ref.iter().zip(&m).map(|(&v, &m)| m * act_ref(act, v).0).collect();
            let g_ref: Vec<f64> =
                pre_ref.iter().zip(&m).zip(&q.dy).map(|((&v, &m), &g)| g * m * act_ref(act, v).1).collect();
            let (mut y, mut pre) = (vec![f32::NAN; y_ref.len()], vec![f32::NAN; y_ref.len()]);
            let fwd = SkForwardArgs::new(
                Tensor::new(&pr.x, &c.x_shape()),
                pr.params(&c),
                TensorMut::new(&mut y, &c.y_shape()),
            )
            .pre(TensorMut::new(&mut pre, &c.y_shape()))
            .training(seed, offset);
            plan.forward(&fwd).unwrap();
            drop(fwd);
            let (ey, ep) = (rel_err(&y, &y_ref), rel_err(&pre, &pre_ref));
            assert!(ey < 1e-5 && ep < 1e-5, "{act:?} p={p}: y {ey:.3e} pre {ep:.3e}");

            let gr = reference(c, &q).backward(&g_ref);
            let mut dx = vec![f32::NAN; pr.x.len()];
            let mut grads = SkHostParams::zeros(&d);
            let saved = if act == Activation::Relu { &y } else { &pre }; // ReLU: y serves
            let mut bwd = SkBackwardArgs::new(
                Tensor::new(&pr.x, &c.x_shape()),
                pr.params(&c),
                Tensor::new(&pr.dy, &c.y_shape()),
            )
            .training(seed, offset)
            .dx(TensorMut::new(&mut dx, &c.x_shape()))
            .dparams(&mut grads);
            if act != Activation::None {
                bwd = bwd.pre(Tensor::new(saved, &c.y_shape()));
            }
            plan.backward(GradMode::Overwrite, &bwd).unwrap();
            drop(bwd);
            let e = [
                rel_err(&dx, &gr.dx),
                rel_err(&grads.s1s, &gr.ds1),
                rel_err(&grads.s2s, &gr.ds2),
                rel_err(grads.bias.as_ref().unwrap(), &gr.db),
            ];
            assert!(e.iter().all(|&v| v < 1e-5), "{act:?} p={p}: dx dS1 dS2 db {e:?}");
        }
    }
}

#[test]
fn fused_epilogue_bad_input_names_the_field() {
    let ctx = Context::cpu().unwrap();
    for p in [1.0f32, -0.5] {
        let e = SkLinearPlan::new(&ctx, &SkLinearDesc::new(8, 8, 1, 2).dropout(p)).unwrap_err();
        assert!(e.to_string().contains("desc->dropout"), "{e}");
    }
}
