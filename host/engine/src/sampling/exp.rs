//! The exponential every weight goes through: a polynomial in plain IEEE
//! f32 operations, so the host, its AVX2 build and the device give the same
//! bits.

/// A logit's weight at temperature `t`: `e^((z - max) / t)`, the one
/// formula every path (and the device, bit for bit) uses.
#[inline(always)]
pub(crate) fn temp_weight(z: f32, max: f32, t: f32) -> f32 {
    exp_nonpos((z - max) / t)
}

/// `e^x` for `x <= 0`: larger `x` is taken as 0, NaN and anything below -87
/// give 0. Cephes' `expf` polynomial, ~1 ulp, in plain f32 arithmetic so it
/// vectorises and gives the same bits on every platform.
#[inline(always)]
pub(super) fn exp_nonpos(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let in_range = x >= -87.0;
    let x = if in_range { x } else { -87.0 };
    let x = if x < 0.0 { x } else { 0.0 };
    let t = x * std::f32::consts::LOG2_E + MAGIC;
    let n = t - MAGIC;
    let ni = (t.to_bits() as i32).wrapping_sub(MAGIC.to_bits() as i32);
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let p = (((((1.987_569_1e-4 * r + 1.398_2e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 0.5)
        * (r * r)
        + r
        + 1.0;
    let e = p * f32::from_bits(((ni + 127) as u32) << 23);
    if in_range { e } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::simd::{max_f32, weights};

    #[test]
    fn exp_matches_std() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x <= 0.0 {
            let e = (x as f64).exp();
            let rel = ((exp_nonpos(x) as f64 - e) / e).abs();
            worst = worst.max(rel);
            x += 0.001_3;
        }
        assert!(worst < 2.5e-7, "worst relative error {worst}");
        assert_eq!(exp_nonpos(0.0), 1.0);
        assert_eq!(exp_nonpos(-0.0), 1.0);
        assert!(exp_nonpos(f32::NEG_INFINITY) < 2e-38);
        assert!(exp_nonpos(f32::NAN) < 2e-38);
    }

    #[test]
    fn exp_bits_are_pinned() {
        // The weights' exact bits (and so seeded draws) must not depend on
        // the platform or the SIMD path; this checksum pins them.
        let mut sum = 0u64;
        let mut x = -90.0f32;
        while x <= 0.5 {
            sum = sum
                .wrapping_mul(31)
                .wrapping_add(exp_nonpos(x).to_bits() as u64);
            x += 0.003_7;
        }
        let mut w = vec![0f32; 3000];
        let z: Vec<f32> = (0..3000).map(|i| (i as f32 * 0.37).sin() * 20.0).collect();
        let mut blocks = Vec::new();
        let total = weights(&z, &mut w, &mut blocks, max_f32(&z), 0.7);
        for v in &w {
            sum = sum.wrapping_mul(31).wrapping_add(v.to_bits() as u64);
        }
        assert_eq!(
            (sum, total.to_bits()),
            PINNED_EXP,
            "{sum:#x} {:#x}",
            total.to_bits()
        );
    }
    const PINNED_EXP: (u64, u64) = (0x2aa1_8a0d_39b4_8f3c, 0x406c_2fbe_bc31_de9c);
}
