//! Float64 references (torch.nn.GRU and the A-GRU of DESIGN.md), random data, error norms, the
//! element types the tests run plans in.
#![allow(dead_code)]
use kfuse::half::{bf16, f16};
use kfuse::Float;

/// A small deterministic generator (SplitMix64), so the tests need no crate.
pub struct Rng(u64);
impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E3779B97F4A7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
        z ^ (z >> 31)
    }
    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64)
    }
    pub fn vec(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi) as f32).collect()
    }
}

/// `lead` followed by `last`: the shape of x or y with leading dims `lead`.
pub fn lead_shape(lead: &[usize], last: usize) -> Vec<usize> {
    lead.iter().copied().chain([last]).collect()
}

/// A zeroed, 64-byte aligned host buffer of at least `bytes` bytes (a caller workspace).
pub struct AlignedBuf {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}
impl AlignedBuf {
    pub fn new(bytes: usize) -> AlignedBuf {
        let layout = std::alloc::Layout::from_size_align(bytes.max(64), 64).unwrap();
        // SAFETY: non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        AlignedBuf { ptr, layout }
    }
    pub fn ptr(&self) -> *mut std::ffi::c_void {
        self.ptr as *mut std::ffi::c_void
    }
}
impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in new() with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

pub fn to_f64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

/// ||out - ref|| / ||ref||, for an output of any element type.
pub fn rel_err<T: Copy + Into<f64>>(out: &[T], r: &[f64]) -> f64 {
    assert_eq!(out.len(), r.len());
    let (mut num, mut den) = (0.0, 0.0);
    for (&o, &e) in out.iter().zip(r) {
        let d = o.into() - e;
        num += d * d;
        den += e * e;
    }
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

/// The element types the tests run plans in, made from the float32 problems: exactly for `f32`
/// and `f64`; for the 16-bit types rounded to nearest by the `half` crate (not by kfuse), which
/// is exact too on a problem first passed through [`round_to`].
pub trait TestFloat: Float + Into<f64> + std::fmt::Debug {
    /// The unit roundoff: half the spacing of the type's values at 1 (2^-p, p significant bits).
    const UNIT_ROUNDOFF: f64;
    fn from_f32(v: f32) -> Self;
}
impl TestFloat for f32 {
    const UNIT_ROUNDOFF: f64 = f32::EPSILON as f64 / 2.0;
    fn from_f32(v: f32) -> f32 {
        v
    }
}
impl TestFloat for f64 {
    const UNIT_ROUNDOFF: f64 = f64::EPSILON / 2.0;
    fn from_f32(v: f32) -> f64 {
        v as f64
    }
}
impl TestFloat for bf16 {
    const UNIT_ROUNDOFF: f64 = 1.0 / 256.0; // 2^-8
    fn from_f32(v: f32) -> bf16 {
        bf16::from_f32(v)
    }
}
impl TestFloat for f16 {
    const UNIT_ROUNDOFF: f64 = 1.0 / 2048.0; // 2^-11
    fn from_f32(v: f32) -> f16 {
        f16::from_f32(v)
    }
}

/// `v` in `T`.
pub fn cast<T: TestFloat>(v: &[f32]) -> Vec<T> {
    v.iter().map(|&a| T::from_f32(a)).collect()
}

/// A 16-bit storage type and the bound of tests/c/test_lowp.c: its outputs are the float32
/// results rounded once to nearest, so ||out - ref|| / ||ref|| <= u + 1e-5 against float64 on
/// the same inputs, u the unit roundoff and 1e-5 the float32 computation's own bar.
pub trait Low: TestFloat {
    const NAME: &'static str;
    const TOL: f64 = Self::UNIT_ROUNDOFF + 1e-5;
}
impl Low for bf16 {
    const NAME: &'static str = "bf16";
}
impl Low for f16 {
    const NAME: &'static str = "f16";
}

/// Rounds every value of `v` to the nearest `T` in place (nothing to do for f32 and f64): the
/// values stay float32s (every bfloat16 and float16 value is one), so the float64 reference and a
/// `T` plan then see the same numbers.
pub fn round_to<T: TestFloat>(v: &mut [f32]) {
    v.iter_mut().for_each(|a| *a = Into::<f64>::into(T::from_f32(*a)) as f32);
}

#[derive(Clone, Copy, Debug)]
pub struct Cfg {
    pub agru: bool,
    pub t: usize,
    pub b: usize,
    pub i: usize,
    pub h: usize,
    pub l: usize,
    pub d: usize,
    pub batch_first: bool,
    pub gamma: f64,
}

impl Cfg {
    pub fn layer_in(&self, l: usize) -> usize {
        if l == 0 {
            self.i
        } else if self.agru {
            self.h
        } else {
            self.d * self.h
        }
    }
    fn xi(&self, t: usize, b: usize, w: usize) -> usize {
        if self.batch_first {
            (b * self.t + t) * w
        } else {
            (t * self.b + b) * w
        }
    }
}

fn sig(v: f64) -> f64 {
    1.0 / (1.0 + (-v).exp())
}

/// y (plan layout) and hn [L*D, B, H] for x (plan layout), h0 (or zeros) and the weights in the
/// canonical order of kfuse.h.
pub fn forward(c: &Cfg, x: &[f64], h0: Option<&[f64]>, w: &[Vec<f64>]) -> (Vec<f64>, Vec<f64>) {
    let (t_n, b_n, h_n) = (c.t, c.b, c.h);
    let mut input: Vec<f64> = x.to_vec(); // layer input in plan layout, width layer_in(l)
    let mut hn = vec![0.0; c.l * c.d * b_n * h_n];
    for l in 0..c.l {
        let iw = c.layer_in(l);
        let ow = c.d * h_n;
        let mut out = vec![0.0; t_n * b_n * ow];
        for d in 0..c.d {
            let k = l * c.d + d;
            for b in 0..b_n {
                let mut h: Vec<f64> = match h0 {
                    Some(h0) => h0[(k * b_n + b) * h_n..(k * b_n + b + 1) * h_n].to_vec(),
                    None => vec![0.0; h_n],
                };
                for s in 0..t_n {
                    let t = if d == 0 { s } else { t_n - 1 - s };
                    let xo = c.xi(t, b, iw);
                    let xt = &input[xo..xo + iw];
                    h = if c.agru {
                        agru_step(c, &w[l * 10..l * 10 + 10], xt, &h)
                    } else {
                        gru_step(h_n, &w[k * 4..k * 4 + 4], xt, &h)
                    };
                    let yo = c.xi(t, b, ow) + d * h_n;
                    out[yo..yo + h_n].copy_from_slice(&h);
                }
                hn[(k * b_n + b) * h_n..(k * b_n + b + 1) * h_n].copy_from_slice(&h);
            }
        }
        input = out;
    }
    (input, hn)
}

fn matvec(m: &[f64], rows: std::ops::Range<usize>, cols: usize, v: &[f64]) -> Vec<f64> {
    rows.map(|r| (0..cols).map(|j| m[r * cols + j] * v[j]).sum()).collect()
}

fn gru_step(h_n: usize, w: &[Vec<f64>], x: &[f64], h: &[f64]) -> Vec<f64> {
    let (wih, whh, bih, bhh) = (&w[0], &w[1], &w[2], &w[3]);
    let iw = x.len();
    let gi = matvec(wih, 0..3 * h_n, iw, x);
    let gh = matvec(whh, 0..3 * h_n, h_n, h);
    (0..h_n)
        .map(|j| {
            let r = sig(gi[j] + bih[j] + gh[j] + bhh[j]);
            let z = sig(gi[h_n + j] + bih[h_n + j] + gh[h_n + j] + bhh[h_n + j]);
            let n = (gi[2 * h_n + j] + bih[2 * h_n + j] + r * (gh[2 * h_n + j] + bhh[2 * h_n + j])).tanh();
            (1.0 - z) * n + z * h[j]
        })
        .collect()
}

fn agru_step(c: &Cfg, w: &[Vec<f64>], x: &[f64], h: &[f64]) -> Vec<f64> {
    let h_n = c.h;
    let iw = x.len();
    let (wz, bz, uz, wr, br, ur, vh, bh, whh, eps) =
        (&w[0], &w[1], &w[2], &w[3], &w[4], &w[5], &w[6], &w[7], &w[8], w[9][0]);
    let zx = matvec(wz, 0..h_n, iw, x);
    let zh = matvec(uz, 0..h_n, h_n, h);
    let rx = matvec(wr, 0..h_n, iw, x);
    let rh = matvec(ur, 0..h_n, h_n, h);
    let vx = matvec(vh, 0..h_n, iw, x);
    let r: Vec<f64> = (0..h_n).map(|j| sig(rx[j] + br[j] + rh[j])).collect();
    let rhv: Vec<f64> = (0..h_n).map(|j| r[j] * h[j]).collect();
    (0..h_n)
        .map(|j| {
            let z = sig(zx[j] + bz[j] + zh[j]);
            let mut a = 0.0;
            for k in 0..h_n {
                let akk = whh[j * h_n + k] - whh[k * h_n + j] - if j == k { c.gamma } else { 0.0 };
                a += akk * rhv[k];
            }
            let d = (vx[j] + bh[j] + a).tanh();
            h[j] + eps * z * d
        })
        .collect()
}
