//! Trains a one-layer A-GRU with a linear read-out on the adding problem through the safe `kfuse`
//! crate (no `unsafe` here): each sequence has T steps of (value, marker); exactly two markers
//! are 1, one in each half, and the target is the sum of the two marked values. Predicting the
//! mean (1.0) gives a mean squared error of about 0.167; the loss printed every 25 steps falls
//! well below that.
//!
//!     cargo run --release --example train_agru_step -- [--steps N] [--threads N]
use kfuse::{
    BackwardArgs, Context, Device, ForwardArgs, GradMode, Mode, Reserve, RnnDesc, RnnPlan, Tensor, TensorMut,
    WeightGrads,
};

const T: usize = 12;
const B: usize = 64;
const I: usize = 2;
const H: usize = 24;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E3779B97F4A7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
        ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32
    }
    fn uniform(&mut self, k: f32) -> f32 {
        (2.0 * self.next() - 1.0) * k
    }
    fn below(&mut self, n: usize) -> usize {
        ((self.next() * n as f32) as usize).min(n - 1)
    }
}

/// A batch of the adding problem: x [T, B, 2] (sequence-first) and targets [B].
fn batch(rng: &mut Rng) -> (Vec<f32>, Vec<f32>) {
    let mut x = vec![0.0f32; T * B * I];
    let mut target = vec![0.0f32; B];
    for b in 0..B {
        let (m1, m2) = (rng.below(T / 2), T / 2 + rng.below(T / 2));
        for t in 0..T {
            let v = rng.next();
            x[(t * B + b) * I] = v;
            if t == m1 || t == m2 {
                x[(t * B + b) * I + 1] = 1.0;
                target[b] += v;
            }
        }
    }
    (x, target)
}

/// Adam over a list of parameter vectors.
struct Adam {
    m: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    t: i32,
}
impl Adam {
    fn new(params: &[Vec<f32>]) -> Adam {
        let z: Vec<Vec<f32>> = params.iter().map(|p| vec![0.0; p.len()]).collect();
        Adam { m: z.clone(), v: z, t: 0 }
    }
    fn step(&mut self, params: &mut [Vec<f32>], grads: &[Vec<f32>], lr: f32) {
        let (b1, b2) = (0.9f32, 0.999f32);
        self.t += 1;
        let (c1, c2) = (1.0 - b1.powi(self.t), 1.0 - b2.powi(self.t));
        for ((p, g), (m, v)) in params.iter_mut().zip(grads).zip(self.m.iter_mut().zip(self.v.iter_mut())) {
            for k in 0..p.len() {
                m[k] = b1 * m[k] + (1.0 - b1) * g[k];
                v[k] = b2 * v[k] + (1.0 - b2) * g[k] * g[k];
                p[k] -= lr * (m[k] / c1) / ((v[k] / c2).sqrt() + 1e-8);
            }
        }
    }
}

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() -> Result<(), kfuse::Error> {
    let steps = arg("--steps", 300);
    let threads = arg("--threads", 0) as u32;
    let ctx = Context::builder(Device::Cpu).with_threads(threads).build()?;
    let mut plan = RnnPlan::new(&ctx, &RnnDesc::agru(I, H))?;
    println!(
        "kfuse {} | A-GRU I={I} H={H}, T={T} B={B}, adding problem, {steps} steps",
        kfuse::version_string()
    );

    // Parameters: the A-GRU's weights in the plan's canonical order, then the read-out (v, c).
    let mut rng = Rng(42);
    let k = 1.0 / (H as f32).sqrt();
    let info = plan.weight_info();
    let mut params: Vec<Vec<f32>> = info
        .iter()
        .map(|w| {
            if w.name.ends_with("epsilon") {
                vec![1.0]
            } else {
                (0..w.numel()).map(|_| rng.uniform(k)).collect()
            }
        })
        .collect();
    params.push((0..H).map(|_| rng.uniform(k)).collect()); // read-out v [H]
    params.push(vec![0.0]); // read-out c [1]
    let nw = info.len();
    let mut grads: Vec<Vec<f32>> = params.iter().map(|p| vec![0.0; p.len()]).collect();
    let mut adam = Adam::new(&params);

    let mut y = vec![0.0f32; T * B * H];
    let mut hn = vec![0.0f32; B * H];
    let mut dhn = vec![0.0f32; B * H];
    let mut reserve = Reserve::new(); // reused every step: grows once
    let (mut first, mut window, mut last) = (None, 0.0f32, 0.0f32);
    for step in 1..=steps {
        let (x, target) = batch(&mut rng);
        let (rnn_w, head) = params.split_at(nw);
        let (v, c) = (&head[0], head[1][0]);

        // forward through kfuse: hn = h_T, the last state
        let fwd = ForwardArgs::new(
            Tensor::new(&x, &plan.x_shape(T, B)),
            rnn_w,
            TensorMut::new(&mut y, &plan.y_shape(T, B)),
        )
        .hn(TensorMut::new(&mut hn, &plan.state_shape(B)));
        plan.forward_into(Mode::Training, &fwd, &mut reserve)?;
        let bwd = BackwardArgs::from_forward(&fwd); // keeps x and the weights, releases hn

        // read-out and mean squared error, with their gradients, in plain Rust
        let (rnn_g, head_g) = grads.split_at_mut(nw);
        let (dv, dc) = head_g.split_at_mut(1);
        dv[0].iter_mut().for_each(|g| *g = 0.0);
        dc[0][0] = 0.0;
        let mut loss = 0.0f32;
        for b in 0..B {
            let h = &hn[b * H..(b + 1) * H];
            let pred = c + h.iter().zip(v).map(|(a, w)| a * w).sum::<f32>();
            let err = pred - target[b];
            loss += err * err / B as f32;
            let dpred = 2.0 * err / B as f32;
            for j in 0..H {
                dv[0][j] += dpred * h[j];
                dhn[b * H + j] = dpred * v[j];
            }
            dc[0][0] += dpred;
        }

        // backward through kfuse: the A-GRU's weight gradients from dL/dh_T
        let bwd = bwd.dhn(Tensor::new(&dhn, &plan.state_shape(B))).dweights(WeightGrads::from_vecs(rnn_g));
        plan.backward(GradMode::Overwrite, &bwd, &reserve)?;
        drop(bwd);

        adam.step(&mut params, &grads, 1e-2);
        window += loss;
        if step % 25 == 0 || step == steps {
            let n = if step % 25 == 0 { 25 } else { step % 25 };
            let avg = window / n as f32;
            println!("step {step:4}  loss {avg:.4}");
            first.get_or_insert(avg);
            last = avg;
            window = 0.0;
        }
    }
    let first = first.unwrap_or(last);
    println!("mean squared error: {first:.4} (first 25 steps) -> {last:.4} (last 25 steps); predicting the mean gives 0.167");
    let decreased = last < first;
    if !decreased {
        eprintln!("the loss did not decrease");
        std::process::exit(1);
    }
    Ok(())
}
