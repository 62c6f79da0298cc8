//! Criterion benchmarks of kfuse's GRU and A-GRU layers through the safe `kfuse` crate, on a CPU
//! context using all online cores. The same work as the C driver `benches/bench_rnn.c`, so the two
//! can be compared (see benches/results/rust_criterion.md):
//!
//! - `forward`: `RnnPlan::forward_into(Mode::Inference, ..)`, writing y and hn.
//! - `forward_backward`: `RnnPlan::forward_into(Mode::Training, .., &mut reserve)` into one reused
//!   `Reserve`, then `RnnPlan::backward(GradMode::Overwrite, ..)` with a random dy, writing dx and
//!   every weight gradient (A-GRU: epsilon's too).
//!
//! - group `overhead_T2_I3_H4_B2` (single-thread context): the same calls at a tiny shape where
//!   the kernels take a few microseconds, through the safe crate (`safe/...`) and straight through
//!   `kfuse-sys` with argument structs built once (`sys/...`); the difference is what the safe
//!   layer adds per call (argument conversion and checks, the reserve bookkeeping).
//!
//! Shapes: T=28 I=28 H=128 B=128 (Fashion-MNIST rows) and T=784 I=1 H=128 B=128 (pixel by pixel);
//! one layer, f32, h0 absent (zeros). Inputs and dy in U(-1, 1), weights in U(-1/sqrt(H), 1/sqrt(H)),
//! A-GRU epsilon in U(0.05, 0.15), as bench_rnn.c.
//!
//! Steady state: the context, plan, every buffer, the argument structs and the reserve are made
//! outside the timed closures, and one untimed call of each kind grows the context's arena and the
//! reserve before measuring; after each benchmark the arena's grow count is checked unchanged.
//!
//!     cd bindings/rust && OMP_WAIT_POLICY=PASSIVE cargo bench --offline -p kfuse-benches
//!     ... -- --warm-up-time 1 --measurement-time 3      # short run
//!     ... -- T28                                        # one shape (a criterion filter)
use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, SamplingMode};
use kfuse::sys;
use kfuse::{
    BackwardArgs, Context, ForwardArgs, GradMode, Mode, Reserve, RnnDesc, RnnPlan, Tensor, TensorMut,
    WeightGrads,
};
use std::alloc::{self, Layout};
use std::hint::black_box;
use std::ptr;

/// SplitMix64, mapped to [0, 1).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E3779B97F4A7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
        ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32
    }
    fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| lo + (hi - lo) * self.next()).collect()
    }
}

#[derive(Clone, Copy)]
struct Shape {
    t: usize,
    i: usize,
    h: usize,
    b: usize,
}

/// Everything one benchmark reads and writes, owned outside the timed closures.
struct Buffers {
    x: Vec<f32>,
    weights: Vec<Vec<f32>>,
    y: Vec<f32>,
    hn: Vec<f32>,
    dy: Vec<f32>,
    dx: Vec<f32>,
    dweights: Vec<Vec<f32>>,
}

impl Buffers {
    fn new(plan: &RnnPlan<'_>, s: Shape, seed: u64) -> Buffers {
        let mut rng = Rng(seed);
        let k = 1.0 / (s.h as f32).sqrt();
        let info = plan.weight_info();
        let weights = info
            .iter()
            .map(|w| {
                if w.name.ends_with("epsilon") {
                    rng.vec(w.numel(), 0.05, 0.15)
                } else {
                    rng.vec(w.numel(), -k, k)
                }
            })
            .collect();
        Buffers {
            x: rng.vec(s.t * s.b * s.i, -1.0, 1.0),
            weights,
            y: vec![0.0; s.t * s.b * s.h],
            hn: vec![0.0; s.b * s.h],
            dy: rng.vec(s.t * s.b * s.h, -1.0, 1.0),
            dx: vec![0.0; s.t * s.b * s.i],
            dweights: info.iter().map(|w| vec![0.0; w.numel()]).collect(),
        }
    }
}

fn desc(agru: bool, s: Shape) -> RnnDesc {
    if agru {
        RnnDesc::agru(s.i, s.h).gamma(0.01)
    } else {
        RnnDesc::gru(s.i, s.h)
    }
}

fn arena_grows(ctx: &Context) -> u64 {
    ctx.arena_info().expect("arena_info").grow_count
}

fn bench_forward(g: &mut BenchmarkGroup<'_, WallTime>, ctx: &Context, agru: bool, s: Shape) {
    let name = if agru { "agru/forward" } else { "gru/forward" };
    let mut plan = RnnPlan::new(ctx, &desc(agru, s)).expect("plan");
    let mut buf = Buffers::new(&plan, s, 1);
    let (xs, ys, hs) = (plan.x_shape(s.t, s.b), plan.y_shape(s.t, s.b), plan.state_shape(s.b));
    let fwd = ForwardArgs::new(Tensor::new(&buf.x, &xs), &buf.weights, TensorMut::new(&mut buf.y, &ys))
        .hn(TensorMut::new(&mut buf.hn, &hs));
    let mut reserve = Reserve::new(); // inference: only marked unwritten
    plan.forward_into(Mode::Inference, &fwd, &mut reserve).expect("warm-up forward");
    let grows = arena_grows(ctx);
    g.bench_function(name, |bch| {
        bch.iter(|| plan.forward_into(Mode::Inference, black_box(&fwd), &mut reserve).expect("forward"))
    });
    assert_eq!(arena_grows(ctx), grows, "{name}: the arena grew while timing");
    drop(fwd);
    assert!(buf.y.iter().all(|v| v.is_finite()), "{name}: y not finite");
}

fn bench_forward_backward(g: &mut BenchmarkGroup<'_, WallTime>, ctx: &Context, agru: bool, s: Shape) {
    let name = if agru { "agru/forward_backward" } else { "gru/forward_backward" };
    let mut plan = RnnPlan::new(ctx, &desc(agru, s)).expect("plan");
    let mut buf = Buffers::new(&plan, s, 2);
    let (xs, ys, hs) = (plan.x_shape(s.t, s.b), plan.y_shape(s.t, s.b), plan.state_shape(s.b));
    let fwd = ForwardArgs::new(Tensor::new(&buf.x, &xs), &buf.weights, TensorMut::new(&mut buf.y, &ys))
        .hn(TensorMut::new(&mut buf.hn, &hs));
    let bwd = BackwardArgs::from_forward(&fwd)
        .dy(Tensor::new(&buf.dy, &ys))
        .dx(TensorMut::new(&mut buf.dx, &xs))
        .dweights(WeightGrads::from_vecs(&mut buf.dweights));
    let mut reserve = Reserve::new();
    plan.forward_into(Mode::Training, &fwd, &mut reserve).expect("warm-up training forward");
    plan.backward(GradMode::Overwrite, &bwd, &reserve).expect("warm-up backward");
    let (grows, cap) = (arena_grows(ctx), reserve.capacity_bytes());
    g.bench_function(name, |bch| {
        bch.iter(|| {
            plan.forward_into(Mode::Training, black_box(&fwd), &mut reserve).expect("training forward");
            plan.backward(GradMode::Overwrite, black_box(&bwd), &reserve).expect("backward");
        })
    });
    assert_eq!(arena_grows(ctx), grows, "{name}: the arena grew while timing");
    assert_eq!(reserve.capacity_bytes(), cap, "{name}: the reserve grew while timing");
    drop((fwd, bwd));
    assert!(buf.dx.iter().chain(buf.dweights.iter().flatten()).all(|v| v.is_finite()), "{name}: grads");
}

fn bench_shape(c: &mut Criterion, s: Shape, long: bool) {
    // One context per shape, on all online cores (num_threads 0), as the C driver's --threads 0.
    let ctx = Context::cpu().expect("CPU context");
    let mut g = c.benchmark_group(format!("T{}_I{}_H{}_B{}", s.t, s.i, s.h, s.b));
    if long {
        // ~0.15-0.5 s per iteration: 10 samples of one iteration each.
        g.sample_size(10).sampling_mode(SamplingMode::Flat);
    } else {
        // ~5-20 ms per iteration: 20 samples keep a 3 s measurement within its budget.
        g.sample_size(20);
    }
    for agru in [false, true] {
        bench_forward(&mut g, &ctx, agru, s);
        bench_forward_backward(&mut g, &ctx, agru, s);
    }
    g.finish();
}

fn rnn_t28(c: &mut Criterion) {
    bench_shape(c, Shape { t: 28, i: 28, h: 128, b: 128 }, false);
}

fn rnn_t784(c: &mut Criterion) {
    bench_shape(c, Shape { t: 784, i: 1, h: 128, b: 128 }, true);
}

/// A raw `kf_tensor` over a host buffer.
fn raw_tensor(data: *const f32, shape: &[usize]) -> sys::kf_tensor {
    let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    let mut t = std::mem::MaybeUninit::<sys::kf_tensor>::zeroed();
    // SAFETY: valid out-pointer and shape array of `dims.len()` entries.
    let st = unsafe {
        sys::kf_tensor_init(
            t.as_mut_ptr(),
            data as *mut std::ffi::c_void,
            sys::kf_dtype_KF_DTYPE_F32,
            dims.len() as i32,
            dims.as_ptr(),
        )
    };
    assert_eq!(st, sys::kf_status_KF_OK, "kf_tensor_init");
    unsafe { t.assume_init() }
}

/// The safe layer's cost per call: safe crate vs kfuse-sys with prebuilt argument structs, at a
/// shape where the library's own work is a few microseconds.
fn bench_overhead_cell(g: &mut BenchmarkGroup<'_, WallTime>, ctx: &Context, agru: bool, s: Shape) {
    let cell = if agru { "agru" } else { "gru" };
    let mut plan = RnnPlan::new(ctx, &desc(agru, s)).expect("plan");
    let mut buf = Buffers::new(&plan, s, 3);
    let (xs, ys, hs) = (plan.x_shape(s.t, s.b), plan.y_shape(s.t, s.b), plan.state_shape(s.b));
    let info = plan.weight_info();
    let rs_bytes = plan.workspace_size(s.t, s.b, Mode::Training).expect("workspace_size").reserve_bytes;

    // kfuse-sys: every struct built once, before timing.
    let w: Vec<sys::kf_tensor> =
        buf.weights.iter().zip(&info).map(|(v, i)| raw_tensor(v.as_ptr(), &i.shape)).collect();
    let dw: Vec<sys::kf_tensor> =
        buf.dweights.iter_mut().zip(&info).map(|(v, i)| raw_tensor(v.as_mut_ptr(), &i.shape)).collect();
    let mut fa = std::mem::MaybeUninit::<sys::kf_rnn_forward_args>::zeroed();
    let mut ba = std::mem::MaybeUninit::<sys::kf_rnn_backward_args>::zeroed();
    // SAFETY: the init functions write every field.
    let (mut fa, mut ba) = unsafe {
        sys::kf_rnn_forward_args_init(fa.as_mut_ptr());
        sys::kf_rnn_backward_args_init(ba.as_mut_ptr());
        (fa.assume_init(), ba.assume_init())
    };
    fa.x = raw_tensor(buf.x.as_ptr(), &xs);
    fa.weights = w.as_ptr();
    fa.num_weights = w.len() as i32;
    fa.y = raw_tensor(buf.y.as_mut_ptr(), &ys);
    fa.hn = raw_tensor(buf.hn.as_mut_ptr(), &hs);
    ba.x = fa.x;
    ba.weights = w.as_ptr();
    ba.num_weights = w.len() as i32;
    ba.dy = raw_tensor(buf.dy.as_ptr(), &ys);
    ba.dx = raw_tensor(buf.dx.as_mut_ptr(), &xs);
    ba.dweights = dw.as_ptr();
    ba.num_dweights = dw.len() as i32;
    let layout = Layout::from_size_align(rs_bytes.max(64), 64).unwrap();
    // SAFETY: non-zero size.
    let rs = unsafe { alloc::alloc_zeroed(layout) } as *mut std::ffi::c_void;
    assert!(!rs.is_null());
    let plan_raw = plan.as_raw();
    let sys_fwd = |mode: sys::kf_mode, rs: *mut std::ffi::c_void, n: usize| {
        // SAFETY: every pointer in fa is a live buffer of the shape given; rs holds n bytes.
        let st = unsafe { sys::kf_rnn_forward(plan_raw, mode, black_box(&fa), ptr::null_mut(), 0, rs, n) };
        assert_eq!(st, sys::kf_status_KF_OK, "kf_rnn_forward");
    };
    let sys_bwd = || {
        // SAFETY: as above; rs holds what the training forward wrote.
        let st = unsafe {
            sys::kf_rnn_backward(
                plan_raw,
                sys::kf_grad_mode_KF_GRAD_OVERWRITE,
                black_box(&ba),
                ptr::null_mut(),
                0,
                rs,
                rs_bytes,
            )
        };
        assert_eq!(st, sys::kf_status_KF_OK, "kf_rnn_backward");
    };
    sys_fwd(sys::kf_mode_KF_MODE_INFERENCE, ptr::null_mut(), 0);
    sys_fwd(sys::kf_mode_KF_MODE_TRAINING, rs, rs_bytes);
    sys_bwd();
    g.bench_function(format!("sys/{cell}/forward"), |bch| {
        bch.iter(|| sys_fwd(sys::kf_mode_KF_MODE_INFERENCE, ptr::null_mut(), 0))
    });
    g.bench_function(format!("sys/{cell}/forward_backward"), |bch| {
        bch.iter(|| {
            sys_fwd(sys::kf_mode_KF_MODE_TRAINING, rs, rs_bytes);
            sys_bwd();
        })
    });

    // The safe crate, on the same plan and buffers (the raw structs are no longer used).
    {
        let fwd = ForwardArgs::new(Tensor::new(&buf.x, &xs), &buf.weights, TensorMut::new(&mut buf.y, &ys))
            .hn(TensorMut::new(&mut buf.hn, &hs));
        let bwd = BackwardArgs::from_forward(&fwd)
            .dy(Tensor::new(&buf.dy, &ys))
            .dx(TensorMut::new(&mut buf.dx, &xs))
            .dweights(WeightGrads::from_vecs(&mut buf.dweights));
        let mut reserve = Reserve::new();
        plan.forward_into(Mode::Training, &fwd, &mut reserve).expect("warm-up training forward");
        plan.backward(GradMode::Overwrite, &bwd, &reserve).expect("warm-up backward");
        g.bench_function(format!("safe/{cell}/forward"), |bch| {
            bch.iter(|| plan.forward_into(Mode::Inference, black_box(&fwd), &mut reserve).expect("forward"))
        });
        g.bench_function(format!("safe/{cell}/forward_backward"), |bch| {
            bch.iter(|| {
                plan.forward_into(Mode::Training, black_box(&fwd), &mut reserve).expect("training forward");
                plan.backward(GradMode::Overwrite, black_box(&bwd), &reserve).expect("backward");
            })
        });
    }
    // SAFETY: allocated above with this layout; no call uses it any more.
    unsafe { alloc::dealloc(rs as *mut u8, layout) };
}

fn rnn_overhead(c: &mut Criterion) {
    // One thread: the per-call cost of the safe layer does not depend on it, and the tiny kernels
    // then carry no OpenMP fork/join noise.
    let ctx = Context::builder(kfuse::Device::Cpu).with_threads(1).build().expect("CPU context");
    let s = Shape { t: 2, i: 3, h: 4, b: 2 };
    let mut g = c.benchmark_group(format!("overhead_T{}_I{}_H{}_B{}", s.t, s.i, s.h, s.b));
    g.sample_size(50);
    for agru in [false, true] {
        bench_overhead_cell(&mut g, &ctx, agru, s);
    }
    g.finish();
}

criterion_group!(benches, rnn_t28, rnn_t784, rnn_overhead);
criterion_main!(benches);
