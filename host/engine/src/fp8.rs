//! Block-FP8 weights as Qwen publishes them (`Qwen/Qwen3.6-35B-A3B-FP8`):
//! E4M3 values with one `weight_scale_inv` per 128x128 block, described by
//! `quantization_config` in config.json.
//!
//! Dequantization is exactly transformers' (`Fp8Dequantize._dequantize_one` in
//! `transformers/integrations/finegrained_fp8.py`): the E4M3 value and the scale
//! are each widened to f32, multiplied once in f32, and the product is rounded
//! to bf16 (round to nearest even), the dtype of the model's parameters. NaN
//! weights stay NaN, as in torch. The raw bytes and scales are kept so that a
//! GPU backend can later upload them as they are.

use anyhow::{Context, Result, bail};
use half::bf16;
use memmap2::Mmap;
use rayon::prelude::*;
use regex::Regex;
use serde_json::Value;
use std::sync::{Arc, OnceLock};

/// The only block size the published checkpoints use (and FP8 kernels expect).
pub const BLOCK: usize = 128;

/// `quantization_config` of a block-FP8 checkpoint.
#[derive(Clone, Debug)]
pub struct Fp8Format {
    /// `modules_to_not_convert`: transformers' patterns of modules kept in BF16.
    keep: Vec<(String, Regex)>,
}

impl PartialEq for Fp8Format {
    fn eq(&self, other: &Self) -> bool {
        self.keep.len() == other.keep.len()
            && self.keep.iter().zip(&other.keep).all(|(a, b)| a.0 == b.0)
    }
}

impl Fp8Format {
    /// Reads `quantization_config` from a parsed config.json; `None` when absent.
    /// Anything but transformers' fine-grained FP8 with E4M3 values, 128x128
    /// blocks, float scales and dynamic activations is refused.
    pub fn from_config(root: &Value) -> Result<Option<Self>> {
        let Some(q) = root
            .get("quantization_config")
            .or_else(|| root.get("text_config")?.get("quantization_config"))
        else {
            return Ok(None);
        };
        let q = q
            .as_object()
            .context("`quantization_config` must be an object")?;
        let field = |k: &str| q.get(k).filter(|v| !v.is_null());
        match field("quant_method").and_then(Value::as_str) {
            Some("fp8") => {}
            other => bail!(
                "unsupported quantization method {other:?} in `quantization_config` (supported: \"fp8\", block-wise E4M3 as in Qwen's -FP8 checkpoints)"
            ),
        }
        let require = |key: &str, want: &str| -> Result<()> {
            match field(key) {
                Some(v) if v.as_str() != Some(want) => {
                    bail!("unsupported `quantization_config.{key}` {v} (supported: \"{want}\")")
                }
                _ => Ok(()),
            }
        };
        require("fmt", "e4m3")?;
        require("activation_scheme", "dynamic")?;
        require("scale_fmt", "float")?;
        // transformers' default block is 128x128; an explicit null means per-tensor scales.
        match q.get("weight_block_size") {
            None => {}
            Some(b)
                if b.as_array().is_some_and(|a| {
                    a.len() == 2 && a.iter().all(|x| x.as_u64() == Some(BLOCK as u64))
                }) => {}
            Some(b) => bail!(
                "unsupported `quantization_config.weight_block_size` {b} (supported: [{BLOCK}, {BLOCK}])"
            ),
        }
        if field("modules_to_convert").is_some_and(|v| v.as_array().is_none_or(|a| !a.is_empty())) {
            bail!("`quantization_config.modules_to_convert` (FP8 embeddings) is not supported");
        }
        let keep = match field("modules_to_not_convert") {
            None => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    let p = v.as_str().with_context(|| {
                        format!("`modules_to_not_convert` entries must be strings, got {v}")
                    })?;
                    // transformers: `re.match(p, name)` (a prefix match) or `name.endswith(p)`.
                    let re = Regex::new(&format!("^(?:{p})")).with_context(|| {
                        format!("`modules_to_not_convert` entry {p:?} is not a valid pattern")
                    })?;
                    Ok((p.to_owned(), re))
                })
                .collect::<Result<_>>()?,
            Some(other) => bail!("`modules_to_not_convert` must be a list, got {other}"),
        };
        Ok(Some(Fp8Format { keep }))
    }

    /// transformers' defaults (128x128 blocks, nothing kept by name): the
    /// `-fp8` presets' format.
    pub fn block_128() -> Self {
        Fp8Format { keep: Vec::new() }
    }

    /// Whether `modules_to_not_convert` keeps the module of this checkpoint
    /// tensor in BF16 (transformers' `should_convert_module`). A routed expert
    /// (`...mlp.experts.3.gate_proj.weight`) is also kept when its parent
    /// `...mlp.experts` (transformers' module) is.
    pub fn keeps_bf16(&self, tensor: &str) -> bool {
        let module = tensor.strip_suffix(".weight").unwrap_or(tensor);
        let experts = module
            .find(".mlp.experts")
            .map(|i| &module[..i + ".mlp.experts".len()]);
        [Some(module), experts].into_iter().flatten().any(|m| {
            self.keep
                .iter()
                .any(|(p, re)| re.is_match(m) || m.ends_with(p.as_str()))
        })
    }

    /// Whether this config says a `[rows, cols]` checkpoint weight is FP8:
    /// transformers makes every `nn.Linear` and the routed experts FP8 unless
    /// `modules_to_not_convert` keeps them, but not the embedding
    /// (`nn.Embedding`) nor the MoE router (`mlp.gate`, a `TopKRouter`), and its
    /// quantizer (`Fp8Quantize`) leaves a weight BF16 when its dims are not
    /// whole blocks (the GDN's `in_proj_a`/`in_proj_b` [32, 2048], the
    /// shared-expert gate [1, 2048]), whatever the list says.
    pub fn expects_fp8(&self, tensor: &str, rows: usize, cols: usize) -> bool {
        let linear =
            !(tensor.ends_with("embed_tokens.weight") || tensor.ends_with(".mlp.gate.weight"));
        linear
            && rows.is_multiple_of(BLOCK)
            && cols.is_multiple_of(BLOCK)
            && !self.keeps_bf16(tensor)
    }
}

/// Name of the scale tensor of a quantized weight (transformers' convention).
pub fn scale_name(weight: &str) -> String {
    match weight.strip_suffix(".weight") {
        Some(module) => format!("{module}.weight_scale_inv"),
        None => format!("{weight}_scale_inv"),
    }
}

/// The value of an E4M3 (`float8_e4m3fn`: bias 7, no infinities, `S.1111.111`
/// is NaN) byte, exactly.
pub fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((b >> 3) & 0xF);
    let mant = f32::from(b & 0x7);
    if exp == 0xF && b & 0x7 == 0x7 {
        return f32::NAN;
    }
    let mag = if exp == 0 {
        mant / 8.0 * 2f32.powi(-6) // subnormal
    } else {
        (1.0 + mant / 8.0) * 2f32.powi(exp - 7)
    };
    sign * mag
}

/// One dequantized element, as transformers computes it.
fn dequant(b: u8, scale: f32) -> bf16 {
    bf16::from_f32(e4m3_to_f32(b) * scale)
}

/// Where the raw E4M3 bytes live.
pub enum Fp8Bytes {
    /// In a memory-mapped safetensors file at this byte offset.
    Mapped {
        map: Arc<Mmap>,
        offset: usize,
        len: usize,
    },
    Owned(Vec<u8>),
}

impl Fp8Bytes {
    pub fn as_slice(&self) -> &[u8] {
        match self {
            Fp8Bytes::Mapped { map, offset, len } => &map[*offset..*offset + *len],
            Fp8Bytes::Owned(v) => v,
        }
    }
}

/// A block-FP8 tensor `[slabs, rows, cols]` (a matrix is one slab, a fused
/// expert tensor has one slab per expert) with its f32 scales
/// `[slabs, ceil(rows / 128), ceil(cols / 128)]`.
pub struct Fp8Tensor {
    bytes: Fp8Bytes,
    scales: Vec<f32>,
    rows: usize,
    cols: usize,
    /// The whole tensor in bf16, made on first host use (the CPU backend).
    dequantized: OnceLock<Vec<bf16>>,
}

impl Fp8Tensor {
    /// Checks sizes; scales must be finite.
    pub fn new(bytes: Fp8Bytes, scales: Vec<f32>, rows: usize, cols: usize) -> Result<Self> {
        let n = bytes.as_slice().len();
        if rows == 0 || cols == 0 || !n.is_multiple_of(rows * cols) {
            bail!("{n} FP8 bytes are not whole [{rows}, {cols}] matrices");
        }
        let want = n / (rows * cols) * rows.div_ceil(BLOCK) * cols.div_ceil(BLOCK);
        if scales.len() != want {
            bail!("{} scales for {want} blocks", scales.len());
        }
        if let Some(i) = scales.iter().position(|s| !s.is_finite()) {
            bail!("scale {i} is {}", scales[i]);
        }
        Ok(Fp8Tensor {
            bytes,
            scales,
            rows,
            cols,
            dequantized: OnceLock::new(),
        })
    }

    /// The raw E4M3 bytes, row-major.
    pub fn bytes(&self) -> &[u8] {
        self.bytes.as_slice()
    }

    /// The f32 block scales, row-major `[slabs, row blocks, col blocks]`.
    pub fn scales(&self) -> &[f32] {
        &self.scales
    }

    /// Elements (`slabs * rows * cols`).
    pub fn len(&self) -> usize {
        self.bytes().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// All elements in bf16, dequantized once and kept. Sequential on purpose:
    /// it runs inside the CPU backend's parallel loops, and a rayon join here
    /// could steal a task of the same loop that waits on this very cell.
    /// [`crate::weights::Weights::dequantize_fp8`] fills the cells ahead, in
    /// parallel across tensors.
    pub fn dequantized(&self) -> &[bf16] {
        self.dequantized.get_or_init(|| {
            let mut out = vec![bf16::ZERO; self.len()];
            out.chunks_mut(self.cols)
                .enumerate()
                .for_each(|(r, dst)| self.dequantize_row(r, dst));
            out
        })
    }

    /// The cached bf16 copy, if one was made.
    pub fn cached(&self) -> Option<&[bf16]> {
        self.dequantized.get().map(Vec::as_slice)
    }

    /// Global rows `[first, first + count)` (slabs stacked) in bf16, not kept,
    /// dequantized in parallel (device uploads).
    pub fn dequantize_rows(&self, first: usize, count: usize) -> Vec<bf16> {
        let mut out = vec![bf16::ZERO; count * self.cols];
        out.par_chunks_mut(self.cols)
            .enumerate()
            .for_each(|(i, dst)| self.dequantize_row(first + i, dst));
        out
    }

    /// Global rows `[first, first + count)` (slabs stacked) as raw E4M3 bytes
    /// and their block scales `[count / 128, ceil(cols / 128)]`, for a device
    /// that keeps the weights in FP8: `Some` when the rows are whole blocks of
    /// one slab (every quantized matrix of the published checkpoints).
    pub fn block_rows(&self, first: usize, count: usize) -> Option<(&[u8], &[f32])> {
        let (rows, cols) = (self.rows, self.cols);
        let local = first % rows;
        if !local.is_multiple_of(BLOCK) || !count.is_multiple_of(BLOCK) || local + count > rows {
            return None;
        }
        let cb = cols.div_ceil(BLOCK);
        let r0 = (first / rows) * rows.div_ceil(BLOCK) + local / BLOCK;
        Some((
            &self.bytes()[first * cols..(first + count) * cols],
            &self.scales[r0 * cb..(r0 + count / BLOCK) * cb],
        ))
    }

    /// Global row `r` (slabs stacked) into `dst`.
    fn dequantize_row(&self, r: usize, dst: &mut [bf16]) {
        let (rows, cols) = (self.rows, self.cols);
        let (rb, cb) = (rows.div_ceil(BLOCK), cols.div_ceil(BLOCK));
        let (slab, local) = (r / rows, r % rows);
        let scales = &self.scales[(slab * rb + local / BLOCK) * cb..][..cb];
        let row = &self.bytes()[r * cols..(r + 1) * cols];
        for (c, (d, &b)) in dst.iter_mut().zip(row).enumerate() {
            *d = dequant(b, scales[c / BLOCK]);
        }
    }
}

#[cfg(test)]
mod tests;
