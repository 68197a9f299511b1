//! Statistics for the sampler tests: a test-data PRNG and the chi-square goodness-of-fit p-value.

/// SplitMix64, for test data only (independent of the sampler's Philox).
pub struct Mix(pub u64);

impl Mix {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn u32(&mut self) -> u32 {
        (self.next() >> 32) as u32
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Roughly normal(0, 1): sum of 12 uniforms minus 6.
    pub fn normal(&mut self) -> f64 {
        (0..12).map(|_| self.unit()).sum::<f64>() - 6.0
    }
}

/// ln Γ(x) for x > 0 (Lanczos, g = 7, n = 9).
pub fn ln_gamma(x: f64) -> f64 {
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    let x = x - 1.0;
    let mut a = C[0];
    let t = x + 7.5;
    for (i, &c) in C.iter().enumerate().skip(1) {
        a += c / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// Regularized upper incomplete gamma Q(a, x) (series below a + 1, Lentz continued fraction
/// above; Numerical Recipes §6.2).
pub fn gamma_q(a: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 1.0;
    }
    let front = (-x + a * x.ln() - ln_gamma(a)).exp();
    if x < a + 1.0 {
        let (mut ap, mut del, mut sum) = (a, 1.0 / a, 1.0 / a);
        for _ in 0..10_000 {
            ap += 1.0;
            del *= x / ap;
            sum += del;
            if del.abs() < sum.abs() * 1e-15 {
                break;
            }
        }
        1.0 - sum * front
    } else {
        let tiny = 1e-300;
        let mut b = x + 1.0 - a;
        let mut c = 1.0 / tiny;
        let mut d = 1.0 / b;
        let mut h = d;
        for i in 1..10_000 {
            let an = -(i as f64) * (i as f64 - a);
            b += 2.0;
            d = an * d + b;
            if d.abs() < tiny {
                d = tiny;
            }
            c = b + an / c;
            if c.abs() < tiny {
                c = tiny;
            }
            d = 1.0 / d;
            let del = d * c;
            h *= del;
            if (del - 1.0).abs() < 1e-15 {
                break;
            }
        }
        front * h
    }
}

/// Pearson chi-square of `counts` against probabilities `probs` (bins with expected count < 5
/// pooled). Returns (statistic, degrees of freedom, p-value). Bins of probability 0 must be
/// empty (checked by the callers; here they are simply skipped).
pub fn chi_square(counts: &[u64], probs: &[f64]) -> (f64, usize, f64) {
    let n: u64 = counts.iter().sum();
    let n = n as f64;
    let mut bins: Vec<(f64, f64)> = Vec::new(); // (observed, expected)
    let (mut pool_o, mut pool_e) = (0.0, 0.0);
    for (&c, &p) in counts.iter().zip(probs) {
        if p == 0.0 {
            continue;
        }
        let e = p * n;
        if e < 5.0 {
            pool_o += c as f64;
            pool_e += e;
        } else {
            bins.push((c as f64, e));
        }
    }
    if pool_e > 0.0 {
        if pool_e >= 5.0 || bins.is_empty() {
            bins.push((pool_o, pool_e));
        } else {
            let smallest = bins.iter_mut().min_by(|a, b| a.1.total_cmp(&b.1)).unwrap();
            smallest.0 += pool_o;
            smallest.1 += pool_e;
        }
    }
    let stat: f64 = bins.iter().map(|&(o, e)| (o - e) * (o - e) / e).sum();
    let df = bins.len().saturating_sub(1).max(1);
    (stat, df, gamma_q(df as f64 / 2.0, stat / 2.0))
}

/// An independent reference of the target distribution (f64 throughout, straight from the
/// spec's prose: softmax of l/T over the top-k set, nucleus by whole levels, min-p, renormalize).
pub fn reference_distribution(l: &[f32], t: f64, k: usize, top_p: f64, min_p: f64) -> Vec<f64> {
    let s: Vec<f64> = l.iter().map(|&x| x as f64 / t).collect();
    let mut sorted = s.clone();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let t_k = if k > 0 && k < s.len() { sorted[k - 1] } else { f64::NEG_INFINITY };
    let m = sorted[0];
    let w: Vec<f64> = s.iter().map(|&x| if x >= t_k { (x - m).exp() } else { 0.0 }).collect();
    let z: f64 = w.iter().sum();
    let mut t_p = t_k;
    if top_p < 1.0 {
        for &level in sorted.iter().filter(|&&x| x >= t_k) {
            let mass: f64 = s.iter().zip(&w).filter(|(&x, _)| x >= level).map(|(_, &w)| w).sum();
            t_p = level;
            if mass >= top_p * z {
                break;
            }
        }
    }
    let mut p: Vec<f64> =
        s.iter().zip(&w).map(|(&x, &w)| if x >= t_p && (x - m).exp() >= min_p { w } else { 0.0 }).collect();
    let z: f64 = p.iter().sum();
    p.iter_mut().for_each(|x| *x /= z);
    p
}
