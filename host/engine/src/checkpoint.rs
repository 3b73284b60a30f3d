//! Reading a model directory's safetensors files: one shard or many through
//! `model.safetensors.index.json`, memory-mapped, never copied whole. BF16
//! weights are borrowed from the map; block-FP8 weights (see [`crate::fp8`])
//! are checked against their scales and `quantization_config` here.

use crate::fp8::{self, Fp8Bytes, Fp8Format, Fp8Tensor};
use crate::tensor::{Mat, Storage};
use anyhow::{Context, Result, bail};
use half::{bf16, f16};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Prefixes under which the language model's tensors are stored: the
/// multimodal checkpoint nests it, text-only checkpoints do not.
const PREFIXES: &[&str] = &["model.language_model.", "model."];

struct Entry {
    file: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Byte offset of the data within the mapped file.
    offset: usize,
}

/// The tensors of a model directory, by full name.
pub struct Checkpoint {
    dir: PathBuf,
    files: Vec<(PathBuf, Arc<Mmap>)>,
    tensors: HashMap<String, Entry>,
    /// `quantization_config` of config.json, for FP8 checkpoints.
    quant: Option<Fp8Format>,
}

/// Anything that can hand out a model's weights by (unprefixed) name:
/// a checkpoint on disk, or generated weights.
pub trait WeightSource {
    /// A 2-D bf16 matrix `[rows, cols]`.
    fn mat(&self, name: &str, rows: usize, cols: usize) -> Result<Mat>;
    /// A 3-D bf16 tensor `[n, rows, cols]` as `n` matrices.
    fn mats(&self, name: &str, n: usize, rows: usize, cols: usize) -> Result<Vec<Mat>>;
    /// A small tensor of `len` elements (any float dtype) as f32; `shape` is what
    /// the checkpoint must declare.
    fn vector(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>>;
    /// Whether the tensor exists.
    fn has(&self, name: &str) -> bool;
}

impl Checkpoint {
    pub fn open(dir: &Path) -> Result<Self> {
        if !dir.is_dir() {
            bail!("model directory {} does not exist", dir.display());
        }
        let index_path = dir.join("model.safetensors.index.json");
        let single = dir.join("model.safetensors");
        let shard_names: Vec<String> = if index_path.exists() {
            let text = std::fs::read_to_string(&index_path)
                .with_context(|| format!("cannot read {}", index_path.display()))?;
            let index: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("{} is not valid JSON", index_path.display()))?;
            let map = index
                .get("weight_map")
                .and_then(|m| m.as_object())
                .with_context(|| format!("{} has no `weight_map` object", index_path.display()))?;
            let names: BTreeSet<String> = map
                .values()
                .map(|v| {
                    v.as_str().map(str::to_owned).with_context(|| {
                        format!(
                            "{}: weight_map values must be file names",
                            index_path.display()
                        )
                    })
                })
                .collect::<Result<_>>()?;
            names.into_iter().collect()
        } else if single.exists() {
            vec!["model.safetensors".to_owned()]
        } else {
            bail!(
                "no model.safetensors or model.safetensors.index.json in {}",
                dir.display()
            );
        };

        let mut files = Vec::new();
        let mut tensors = HashMap::new();
        for name in shard_names {
            let path = dir.join(&name);
            let file = std::fs::File::open(&path)
                .with_context(|| format!("cannot open weight file {}", path.display()))?;
            // SAFETY: the file is mapped read-only; like every mmap-based loader we
            // assume nobody truncates model files while the server runs.
            let map = unsafe { Mmap::map(&file) }
                .with_context(|| format!("cannot memory-map {}", path.display()))?;
            let parsed = SafeTensors::deserialize(&map)
                .map_err(|e| anyhow::anyhow!("corrupt safetensors file {}: {e}", path.display()))?;
            let base = map.as_ptr() as usize;
            for (tensor_name, view) in parsed.tensors() {
                let offset = view.data().as_ptr() as usize - base;
                tensors.insert(
                    tensor_name,
                    Entry {
                        file: files.len(),
                        dtype: view.dtype(),
                        shape: view.shape().to_vec(),
                        offset,
                    },
                );
            }
            drop(parsed);
            files.push((path, Arc::new(map)));
        }
        Ok(Checkpoint {
            dir: dir.to_owned(),
            files,
            tensors,
            quant: None,
        })
    }

    /// Declares the checkpoint's `quantization_config` (from [`crate::config::ModelConfig`]):
    /// FP8 tensors are refused without one.
    pub fn with_quantization(mut self, quant: Option<Fp8Format>) -> Self {
        self.quant = quant;
        self
    }

    /// Full name of a language-model tensor (`lm_head.weight` has no prefix).
    fn find(&self, name: &str) -> Result<(&str, &Entry)> {
        let candidates: Vec<String> = if name == "lm_head.weight" {
            vec![name.to_owned()]
        } else {
            PREFIXES.iter().map(|p| format!("{p}{name}")).collect()
        };
        for c in &candidates {
            if let Some((k, e)) = self.tensors.get_key_value(c.as_str()) {
                return Ok((k.as_str(), e));
            }
        }
        bail!(
            "missing tensor {} in {}",
            candidates.join(" / "),
            self.dir.display()
        )
    }

    fn file_of(&self, e: &Entry) -> &Path {
        &self.files[e.file].0
    }

    fn check_shape(&self, full: &str, e: &Entry, want: &[usize]) -> Result<()> {
        if e.shape != want {
            bail!(
                "tensor {full} in {} has shape {:?}, expected {:?}",
                self.file_of(e).display(),
                e.shape,
                want
            );
        }
        Ok(())
    }

    /// Storage of a weight `[slabs, rows, cols]` (`slabs` 1 for a matrix): BF16
    /// as stored, or FP8 with its scales, as the checkpoint and its
    /// `quantization_config` say (they must agree).
    fn weight_storage(
        &self,
        full: &str,
        e: &Entry,
        slabs: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Arc<Storage>> {
        let file = self.file_of(e).display();
        let scale = fp8::scale_name(full);
        match (e.dtype, &self.quant) {
            (Dtype::F8_E4M3, None) => {
                bail!(
                    "tensor {full} in {file} is F8_E4M3 but config.json has no `quantization_config`"
                )
            }
            (Dtype::F8_E4M3, Some(q)) => {
                if q.keeps_bf16(full) {
                    bail!(
                        "tensor {full} in {file} is F8_E4M3 but `quantization_config.modules_to_not_convert` keeps it in BF16"
                    );
                }
                let (_, s) = self.tensors.get_key_value(&scale).with_context(|| {
                    format!("FP8 tensor {full} in {file} has no scale tensor {scale}")
                })?;
                let grid = [rows.div_ceil(fp8::BLOCK), cols.div_ceil(fp8::BLOCK)];
                let want: Vec<usize> = if e.shape.len() == 3 {
                    vec![slabs, grid[0], grid[1]]
                } else {
                    grid.to_vec()
                };
                self.check_shape(&scale, s, &want)?;
                let scales = self.read_f32(&scale, s)?;
                let map = &self.files[e.file].1;
                let bytes = Fp8Bytes::Mapped {
                    map: map.clone(),
                    offset: e.offset,
                    len: slabs * rows * cols,
                };
                let t = Fp8Tensor::new(bytes, scales, rows, cols)
                    .with_context(|| format!("FP8 tensor {full} with scales {scale} in {file}"))?;
                Ok(Arc::new(Storage::Fp8(t)))
            }
            (dtype, quant) => {
                if self.tensors.contains_key(&scale) {
                    bail!("tensor {full} in {file} is {dtype:?} but has a scale tensor {scale}");
                }
                if quant
                    .as_ref()
                    .is_some_and(|q| q.expects_fp8(full, rows, cols))
                {
                    bail!(
                        "tensor {full} in {file} is {dtype:?}, but `quantization_config` says it is FP8 (no `modules_to_not_convert` entry keeps it)"
                    );
                }
                self.bf16_storage(full, e)
            }
        }
    }

    /// A whole small tensor (F32, BF16 or F16) as f32.
    fn read_f32(&self, full: &str, e: &Entry) -> Result<Vec<f32>> {
        let len: usize = e.shape.iter().product();
        let map = &self.files[e.file].1;
        let width = match e.dtype {
            Dtype::F32 => 4,
            Dtype::BF16 | Dtype::F16 => 2,
            other => bail!(
                "tensor {full} in {} has unsupported dtype {other:?} (expected F32, BF16 or F16)",
                self.file_of(e).display()
            ),
        };
        let bytes = &map[e.offset..e.offset + width * len];
        Ok(match e.dtype {
            Dtype::F32 => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::BF16 => bytes
                .chunks_exact(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            _ => bytes
                .chunks_exact(2)
                .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
        })
    }

    /// bf16 storage for a whole tensor: borrowed from the map when aligned.
    fn bf16_storage(&self, full: &str, e: &Entry) -> Result<Arc<Storage>> {
        if e.dtype != Dtype::BF16 {
            bail!(
                "tensor {full} in {} has unsupported dtype {:?} (weights must be BF16, or F8_E4M3 with block scales)",
                self.file_of(e).display(),
                e.dtype
            );
        }
        let len: usize = e.shape.iter().product();
        let map = &self.files[e.file].1;
        if (map.as_ptr() as usize + e.offset).is_multiple_of(2) {
            Ok(Arc::new(Storage::Mapped {
                map: map.clone(),
                offset: e.offset,
                len,
            }))
        } else {
            // Unaligned data (legal in safetensors, never written by the usual
            // tools): copy this one tensor.
            let bytes = &map[e.offset..e.offset + 2 * len];
            let v = bytes
                .chunks_exact(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]))
                .collect();
            Ok(Arc::new(Storage::Owned(v)))
        }
    }
}

impl WeightSource for Checkpoint {
    fn mat(&self, name: &str, rows: usize, cols: usize) -> Result<Mat> {
        let (full, e) = self.find(name)?;
        self.check_shape(full, e, &[rows, cols])?;
        Ok(Mat::new(
            rows,
            cols,
            self.weight_storage(full, e, 1, rows, cols)?,
            0,
        ))
    }

    fn mats(&self, name: &str, n: usize, rows: usize, cols: usize) -> Result<Vec<Mat>> {
        let (full, e) = self.find(name)?;
        self.check_shape(full, e, &[n, rows, cols])?;
        let all = Mat::new(
            n * rows,
            cols,
            self.weight_storage(full, e, n, rows, cols)?,
            0,
        );
        Ok(all.split_rows(n))
    }

    fn vector(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let (full, e) = self.find(name)?;
        self.check_shape(full, e, shape)?;
        self.read_f32(full, e)
    }

    fn has(&self, name: &str) -> bool {
        self.find(name).is_ok()
    }
}
