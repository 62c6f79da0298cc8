//! A GRU (kfuse) with a linear head (tch autograd) learns the mean of a random sequence; each
//! step: kfuse forward, the head's loss and its gradient w.r.t. hn by tch's autograd, kfuse
//! backward from that gradient, SGD on both. Exits non-zero unless the loss falls by 10x.
//!
//!     cargo run --release --example train_gru   (scripts/test-tch.sh sets up the environment)
use kfuse_tch::{context, Mode, Rnn, RnnDesc};
use tch::{Device, Kind, Tensor};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tch::manual_seed(0);
    let (t, b, h, lr) = (12, 32, 16, 0.5);
    let ctx = context(Device::Cpu)?;
    let mut gru = Rnn::new(&ctx, &RnnDesc::gru(1, h))?;
    let head = (Tensor::randn(&[h as i64, 1], (Kind::Float, Device::Cpu)) * 0.1).set_requires_grad(true);
    let mut losses = Vec::new();
    for step in 0..400 {
        let x = Tensor::rand(&[t, b, 1], (Kind::Float, Device::Cpu)) * 2.0 - 1.0;
        let target = x.mean_dim(Some([0i64].as_slice()), false, Kind::Float); // [B, 1]

        let out = gru.forward(&x, None, Mode::Training)?;
        let hn = out.hn.get(0).detach().set_requires_grad(true); // [B, H], a leaf for tch
        let loss = (hn.matmul(&head) - &target).square().mean(Kind::Float);
        loss.backward(); // head.grad() and hn.grad()

        let g =
            gru.backward(out.saved.as_ref().expect("training forward"), None, Some(&hn.grad().unsqueeze(0)))?;
        tch::no_grad(|| -> Result<(), tch::TchError> {
            for (w, dw) in gru.weights_mut().iter_mut().zip(&g.dweights) {
                let _ = w.f_sub_(&(dw * lr))?;
            }
            let mut head = head.shallow_clone();
            let _ = head.f_sub_(&(head.grad() * lr))?;
            let _ = head.grad().f_zero_()?;
            Ok(())
        })?;
        losses.push(loss.double_value(&[]));
        if step % 100 == 0 {
            println!("step {step:3}: loss {:.5}", losses[step]);
        }
    }
    let (first, last) =
        (losses[..10].iter().sum::<f64>() / 10.0, losses[losses.len() - 10..].iter().sum::<f64>() / 10.0);
    println!("mean loss over the first 10 steps {first:.5}, over the last 10 {last:.5}");
    if last * 10.0 > first {
        return Err(format!("the loss did not fall by 10x ({first:.5} -> {last:.5})").into());
    }
    Ok(())
}
