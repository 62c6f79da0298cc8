//! A downstream crate's first program: one GRU layer through `kfuse`, checked against a float64
//! transcription of torch.nn.GRU's equations (gate order r, z, n;
//! n = tanh(W_in x + b_in + r * (W_hn h + b_hn)); h' = (1 - z) n + z h). Exits non-zero when they
//! disagree. scripts/test-rust-consumer.sh builds and runs it with the library found each way.
use kfuse::{Context, ForwardArgs, Mode, RnnDesc, RnnPlan, Tensor, TensorMut};

fn main() -> Result<(), kfuse::Error> {
    let (t, b, i, h) = (5usize, 3usize, 4usize, 6usize);
    let ctx = Context::cpu()?;
    let mut plan = RnnPlan::new(&ctx, &RnnDesc::gru(i, h))?;
    // weight_ih_l0 [3H, I], weight_hh_l0 [3H, H], bias_ih_l0 [3H], bias_hh_l0 [3H]
    let w: Vec<Vec<f32>> = plan
        .weight_info()
        .iter()
        .enumerate()
        .map(|(j, info)| (0..info.numel()).map(|k| wave(j * 1000 + k) * 0.4).collect())
        .collect();
    let x: Vec<f32> = (0..t * b * i).map(|k| wave(7777 + k)).collect();
    let mut y = vec![f32::NAN; t * b * h];
    let args = ForwardArgs::new(Tensor::new(&x, &plan.x_shape(t, b)), &w,
                                TensorMut::new(&mut y, &plan.y_shape(t, b)));
    plan.forward(Mode::Inference, &args)?;
    drop(args);

    let reference = gru_f64(&x, &w, t, b, i, h);
    let err = y.iter().zip(&reference).map(|(a, r)| (*a as f64 - r).abs()).fold(0.0, f64::max);
    println!("kfuse {}: GRU T={t} B={b} I={i} H={h}, max |kfuse - float64 reference| = {err:.2e}",
             kfuse::version_string());
    if !(err < 1e-5) {
        eprintln!("rust-consumer: kfuse's GRU disagrees with the reference");
        std::process::exit(1);
    }
    Ok(())
}

/// A deterministic value in (-1, 1).
fn wave(k: usize) -> f32 {
    ((k as f32) * 0.618_034).sin()
}

fn sigmoid(v: f64) -> f64 {
    1.0 / (1.0 + (-v).exp())
}

/// torch.nn.GRU, one layer, time-major x [T, B, I], h0 = 0; returns y [T, B, H].
fn gru_f64(x: &[f32], w: &[Vec<f32>], t: usize, b: usize, i: usize, h: usize) -> Vec<f64> {
    let (wih, whh, bih, bhh) = (&w[0], &w[1], &w[2], &w[3]);
    let mut state = vec![0.0f64; b * h];
    let mut y = Vec::with_capacity(t * b * h);
    for s in 0..t {
        let mut next = vec![0.0f64; b * h];
        for r in 0..b {
            let xr = &x[(s * b + r) * i..(s * b + r + 1) * i];
            let hr = &state[r * h..(r + 1) * h];
            let gate = |row: usize| -> (f64, f64) {
                let gx = (0..i).map(|k| wih[row * i + k] as f64 * xr[k] as f64).sum::<f64>()
                    + bih[row] as f64;
                let gh = (0..h).map(|k| whh[row * h + k] as f64 * hr[k]).sum::<f64>()
                    + bhh[row] as f64;
                (gx, gh)
            };
            for u in 0..h {
                let (rx, rh) = gate(u);
                let (zx, zh) = gate(h + u);
                let (nx, nh) = gate(2 * h + u);
                let (rg, zg) = (sigmoid(rx + rh), sigmoid(zx + zh));
                let n = (nx + rg * nh).tanh();
                next[r * h + u] = (1.0 - zg) * n + zg * hr[u];
            }
        }
        y.extend_from_slice(&next);
        state = next;
    }
    y
}
