//! Criterion benchmarks of kfuse's sketched linear layer (SKLinear) through the safe `kfuse`
//! crate, on a CPU context using all online cores, at in = out = 1024, B = 64 rows, L = 1 term of
//! rank k = 16, with a bias (Panther's initialisation, seed 1; x and dy in U(-1, 1)):
//!
//! - `forward`: `SkLinearPlan::forward`, writing y.
//! - `forward_backward`: `forward`, then `SkLinearPlan::backward(GradMode::Overwrite, ..)`
//!   writing dx, dS1s, dS2s and dbias.
//!
//! Steady state: plan, buffers and argument structs are made outside the timed closures, one
//! untimed call of each kind grows the context's arena first, and the arena's grow count is
//! checked unchanged afterwards.
//!
//!     cd bindings/rust && OMP_WAIT_POLICY=PASSIVE cargo bench --offline -p kfuse-benches --bench sklinear
use criterion::{black_box, criterion_group, criterion_main, Criterion};
use kfuse::{
    Context, GradMode, SkBackwardArgs, SkForwardArgs, SkHostParams, SkLinearDesc, SkLinearPlan, Tensor,
    TensorMut,
};

/// SplitMix64 in U(-1, 1).
fn uniform(n: usize, mut s: u64) -> Vec<f32> {
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9E3779B97F4A7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
            ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn sklinear(c: &mut Criterion) {
    let (inf, outf, b, l, k) = (1024, 1024, 64, 1, 16);
    let ctx = Context::cpu().expect("CPU context");
    let desc = SkLinearDesc::new(inf, outf, l, k);
    let mut plan = SkLinearPlan::new(&ctx, &desc).expect("plan");
    let params = plan.init_params(1, None).expect("init_params");
    let x = uniform(b * inf, 2);
    let dy = uniform(b * outf, 3);
    let mut y = vec![0.0f32; b * outf];
    let mut dx = vec![0.0f32; b * inf];
    let mut grads = SkHostParams::zeros(&desc);
    let (xs, ys) = (desc.x_shape(b), desc.y_shape(b));

    let mut g = c.benchmark_group(format!("sklinear_in{inf}_out{outf}_B{b}_L{l}_k{k}"));
    let fwd = SkForwardArgs::new(Tensor::new(&x, &xs), params.view(), TensorMut::new(&mut y, &ys));
    let bwd = SkBackwardArgs::from_forward(&fwd, Tensor::new(&dy, &ys))
        .dx(TensorMut::new(&mut dx, &xs))
        .dparams(&mut grads);
    plan.forward(&fwd).expect("warm-up forward");
    plan.backward(GradMode::Overwrite, &bwd).expect("warm-up backward");
    let grows = ctx.arena_info().expect("arena_info").grow_count;
    g.bench_function("forward", |bch| bch.iter(|| plan.forward(black_box(&fwd)).expect("forward")));
    g.bench_function("forward_backward", |bch| {
        bch.iter(|| {
            plan.forward(black_box(&fwd)).expect("forward");
            plan.backward(GradMode::Overwrite, black_box(&bwd)).expect("backward");
        })
    });
    g.finish();
    assert_eq!(ctx.arena_info().expect("arena_info").grow_count, grows, "the arena grew while timing");
    assert!(y.iter().chain(&dx).chain(&grads.s1s).all(|v| v.is_finite()), "non-finite output");
}

criterion_group!(benches, sklinear);
criterion_main!(benches);
