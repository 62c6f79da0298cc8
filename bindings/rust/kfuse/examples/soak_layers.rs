//! Soak of the safe crate's layers (issue 39): many forward + backward calls of each plan (a
//! bidirectional two-layer GRU and a two-layer A-GRU `RnnPlan`, `SkLinearPlan`, `KanLinearPlan`,
//! `KanConv2dPlan`) in `f32` and `bf16`, each configuration on a context of its own. After its
//! warm-up and at its end it records resident memory (/proc/self/statm), the context's arena
//! (bytes, grow count) and, for the recurrent plans, the owned `Reserve`'s capacity, and exits 1
//! unless the arena and the reserve stay exactly as they were and resident memory grows by at most
//! `--rss-slack` MiB (the largest of ten samples).
//!
//!     cargo run --release --example soak_layers -- [--calls N] [--warmup N] [--rss-slack MiB]
//!
//! Defaults: 100000 calls per configuration, warm-up max(30, calls / 50), slack 2 MiB.
//! scripts/test-rust.sh runs a few thousand calls; benches/results/reliability.md has a 10^5-call
//! run.
use kfuse::half::bf16;
use kfuse::*;
use std::time::Instant;

/// An element type this soak draws values in.
trait Val: Float + Copy {
    const NAME: &'static str;
    fn from_f32(v: f32) -> Self;
}
impl Val for f32 {
    const NAME: &'static str = "f32";
    fn from_f32(v: f32) -> Self {
        v
    }
}
impl Val for bf16 {
    const NAME: &'static str = "bf16";
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

struct Rng(u64);
impl Rng {
    /// n values uniform in [-k, k), in T.
    fn vec<T: Val>(&mut self, n: usize, k: f32) -> Vec<T> {
        (0..n)
            .map(|_| {
                self.0 = self.0.wrapping_add(0x9E3779B97F4A7C15);
                let mut z = self.0;
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
                let u = ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32;
                T::from_f32((2.0 * u - 1.0) * k)
            })
            .collect()
    }
}

fn rss_mib() -> f64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: f64 = statm.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    pages * 4096.0 / (1u64 << 20) as f64
}

struct Opts {
    calls: usize,
    warmup: usize,
    rss_slack: f64,
}

/// What a configuration's run leaves: (arena bytes, grow count, reserve bytes) after warm-up and
/// at the end, resident memory after warm-up and its largest sample, and the time per call.
struct Row {
    state: [(usize, u64, usize); 2],
    rss_warm: f64,
    rss_max: f64,
    us_per_call: f64,
}

fn measure(ctx: &Context, o: &Opts, reserve: impl Fn() -> usize, mut step: impl FnMut()) -> Row {
    let state = |reserve: usize| {
        let a = ctx.arena_info().unwrap();
        (a.bytes, a.grow_count, reserve)
    };
    for _ in 0..o.warmup {
        step();
    }
    let (warm, rss_warm) = (state(reserve()), rss_mib());
    let mut rss_max = rss_warm;
    let every = (o.calls / 10).max(1);
    let t0 = Instant::now();
    for i in 0..o.calls {
        step();
        if (i + 1) % every == 0 {
            rss_max = rss_max.max(rss_mib());
        }
    }
    let us_per_call = t0.elapsed().as_secs_f64() * 1e6 / o.calls.max(1) as f64;
    Row { state: [warm, state(reserve())], rss_warm, rss_max: rss_max.max(rss_mib()), us_per_call }
}

fn context() -> Context {
    Context::builder(Device::Cpu).with_threads(1).build().unwrap()
}

fn rnn<T: Val>(agru: bool, o: &Opts) -> Row {
    let ctx = context();
    let desc =
        if agru { RnnDesc::agru(8, 16).layers(2) } else { RnnDesc::gru(8, 16).layers(2).bidirectional(true) };
    let mut plan = RnnPlan::<T>::new_typed(&ctx, &desc).unwrap();
    let mut rng = Rng(1);
    let w: Vec<Vec<T>> = plan.weight_info().iter().map(|i| rng.vec(i.numel(), 0.25)).collect();
    let mut dw: Vec<Vec<T>> = w.iter().map(|v| vec![T::default(); v.len()]).collect();
    let (t, b) = (6, 4);
    let (xs, ys) = (plan.x_shape(t, b), plan.y_shape(t, b));
    let x: Vec<T> = rng.vec(xs.iter().product(), 0.8);
    let dy: Vec<T> = rng.vec(ys.iter().product(), 1.0);
    let (mut y, mut dx) = (vec![T::default(); dy.len()], vec![T::default(); x.len()]);
    let reserve = std::cell::RefCell::new(Reserve::new());
    measure(
        &ctx,
        o,
        || reserve.borrow().capacity_bytes(),
        || {
            let mut reserve = reserve.borrow_mut();
            let fwd = ForwardArgs::new(Tensor::new(&x, &xs), &w, TensorMut::new(&mut y, &ys));
            plan.forward_into(Mode::Training, &fwd, &mut reserve).unwrap();
            let bwd = BackwardArgs::from_forward(&fwd)
                .dy(Tensor::new(&dy, &ys))
                .dx(TensorMut::new(&mut dx, &xs))
                .dweights(WeightGrads::from_vecs(&mut dw));
            plan.backward(GradMode::Overwrite, &bwd, &reserve).unwrap();
        },
    )
}

fn sklinear<T: Val>(o: &Opts) -> Row {
    let ctx = context();
    let desc = SkLinearDesc::new(48, 40, 2, 4);
    let mut plan = SkLinearPlan::<T>::new_typed(&ctx, &desc).unwrap();
    let params = plan.init_params(1, None).unwrap();
    let mut grads = SkHostParams::<T>::zeros_typed(&desc);
    let n = 16;
    let (xs, ys) = (plan.x_shape(n), plan.y_shape(n));
    let mut rng = Rng(2);
    let x: Vec<T> = rng.vec(xs.iter().product(), 1.0);
    let dy: Vec<T> = rng.vec(ys.iter().product(), 1.0);
    let (mut y, mut dx) = (vec![T::default(); dy.len()], vec![T::default(); x.len()]);
    measure(
        &ctx,
        o,
        || 0,
        || {
            let fwd = SkForwardArgs::new(Tensor::new(&x, &xs), params.view(), TensorMut::new(&mut y, &ys));
            plan.forward(&fwd).unwrap();
            let bwd = SkBackwardArgs::from_forward(&fwd, Tensor::new(&dy, &ys))
                .dx(TensorMut::new(&mut dx, &xs))
                .dparams(&mut grads);
            plan.backward(GradMode::Overwrite, &bwd).unwrap();
        },
    )
}

/// A KAN plan's parameters: efficient-kan's grid on [-1, 1], small random weights.
fn kan_params<L: KanLayer, T: Val>(plan: &KanPlan<'_, L, T>, rng: &mut Rng) -> KanHostParams<T> {
    let mut p = KanHostParams::<T>::zeros_typed(plan.desc());
    p.grid = plan.uniform_grid(-1.0, 1.0).unwrap();
    p.base_weight = rng.vec(p.base_weight.len(), 0.3);
    p.spline_weight = rng.vec(p.spline_weight.len(), 0.3);
    p.spline_scaler = p.spline_scaler.as_ref().map(|s| rng.vec(s.len(), 0.3));
    p
}

/// Forward and backward of a KAN plan, x and y of shapes xs and ys.
fn kan<L: KanLayer, T: Val>(
    ctx: &Context,
    mut plan: KanPlan<'_, L, T>,
    xs: &[usize],
    ys: &[usize],
    o: &Opts,
) -> Row {
    let mut rng = Rng(3);
    let p = kan_params(&plan, &mut rng);
    let mut grads = KanHostParams::<T>::zeros_typed(plan.desc());
    let x: Vec<T> = rng.vec(xs.iter().product(), 0.8);
    let dy: Vec<T> = rng.vec(ys.iter().product(), 1.0);
    let (mut y, mut dx) = (vec![T::default(); dy.len()], vec![T::default(); x.len()]);
    measure(
        ctx,
        o,
        || 0,
        || {
            let fwd = KanForwardArgs::new(Tensor::new(&x, xs), p.view(), TensorMut::new(&mut y, ys));
            plan.forward(&fwd).unwrap();
            let bwd = KanBackwardArgs::from_forward(&fwd, Tensor::new(&dy, ys))
                .dx(TensorMut::new(&mut dx, xs))
                .dparams(&mut grads);
            plan.backward(GradMode::Overwrite, &bwd).unwrap();
        },
    )
}

fn kan_linear<T: Val>(o: &Opts) -> Row {
    let ctx = context();
    let plan = KanLinearPlan::<T>::new_typed(&ctx, &KanLinearDesc::new(12, 10)).unwrap();
    let (xs, ys) = (plan.x_shape(16), plan.y_shape(16));
    kan(&ctx, plan, &xs, &ys, o)
}

fn kan_conv2d<T: Val>(o: &Opts) -> Row {
    let ctx = context();
    let desc = KanConv2dDesc::new(2, 4, (3, 3)).padding((1, 1));
    let plan = KanConv2dPlan::<T>::new_typed(&ctx, &desc).unwrap();
    let (xs, ys) = (plan.x_shape(2, 6, 6), plan.y_shape(2, 6, 6));
    kan(&ctx, plan, &xs, &ys, o)
}

fn arg<V: std::str::FromStr>(name: &str, default: V) -> V {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn configs<T: Val>(o: &Opts) -> Vec<(String, Row)> {
    vec![
        (format!("{} GRU", T::NAME), rnn::<T>(false, o)),
        (format!("{} A-GRU", T::NAME), rnn::<T>(true, o)),
        (format!("{} SKLinear", T::NAME), sklinear::<T>(o)),
        (format!("{} KANLinear", T::NAME), kan_linear::<T>(o)),
        (format!("{} KANConv2d", T::NAME), kan_conv2d::<T>(o)),
    ]
}

fn main() {
    let calls = arg("--calls", 100_000usize);
    let o = Opts { calls, warmup: arg("--warmup", (calls / 50).max(30)), rss_slack: arg("--rss-slack", 2.0) };
    println!(
        "kfuse {}: {} calls per configuration after {} warm-up calls",
        kfuse::version_string(),
        o.calls,
        o.warmup
    );
    let mut failed = 0;
    for (name, r) in configs::<f32>(&o).into_iter().chain(configs::<bf16>(&o)) {
        let mut bad = Vec::new();
        if r.state[0] != r.state[1] {
            bad.push(format!("arena/reserve {:?} -> {:?}", r.state[0], r.state[1]));
        }
        if r.rss_max - r.rss_warm > o.rss_slack {
            bad.push(format!("rss {:.1} -> max {:.1} MiB", r.rss_warm, r.rss_max));
        }
        failed += !bad.is_empty() as usize;
        println!(
            "{name:16} {:8.1} us/call  rss {:.1} -> max {:.1} MiB  arena bytes/grows/reserve {:?}  {}",
            r.us_per_call,
            r.rss_warm,
            r.rss_max,
            r.state[1],
            if bad.is_empty() { "flat".to_string() } else { format!("FAIL: {}", bad.join("; ")) }
        );
    }
    println!("soak_layers: {} ({failed} configuration(s) grew)", if failed > 0 { "FAILED" } else { "ok" });
    std::process::exit(if failed > 0 { 1 } else { 0 });
}
