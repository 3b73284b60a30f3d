//! The sampler's total order on `(logit, id)` as 64-bit keys: cut-offs and
//! ties are defined on it, and a backend that sorts on the device hands
//! keys of the same order back.

/// `z`'s bits mapped so that unsigned order is float order (-0.0 taken as
/// 0.0; `z` must not be NaN).
#[inline]
fn sortable(z: f32) -> u32 {
    let b = (z + 0.0).to_bits();
    if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// A total order on `(logit, id)`: larger logit first, then lower id.
#[inline]
pub(crate) fn key(z: f32, id: u32) -> u64 {
    ((sortable(z) as u64) << 32) | (!id) as u64
}

/// The histogram bucket of a logit: the top 16 bits of [`sortable`], so the
/// same as `key(z, _) >> 48`.
#[inline]
pub(super) fn z_bucket(z: f32) -> usize {
    (sortable(z) >> 16) as usize
}

#[inline]
pub(crate) fn key_id(k: u64) -> u32 {
    !(k as u32)
}

#[inline]
pub(crate) fn key_logit(k: u64) -> f32 {
    let s = (k >> 32) as u32;
    f32::from_bits(if s & 0x8000_0000 != 0 {
        s & 0x7FFF_FFFF
    } else {
        !s
    })
}
