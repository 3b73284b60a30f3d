//! Loading model directories: the supported layouts, and a clear one-line
//! error for every way a directory can be broken.

mod common;

use anyhow::Result;
use half::bf16;
use qwasi_engine::backend::Backend;
use qwasi_engine::checkpoint::WeightSource;
use qwasi_engine::config::ModelConfig;
use qwasi_engine::cpu::CpuModel;
use qwasi_engine::demo::RandomWeights;
use qwasi_engine::model::LoadedModel;
use qwasi_engine::tensor::Mat;
use qwasi_engine::weights::Weights;
use safetensors::{Dtype, tensor::TensorView};
use serde_json::{Value, json};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::Path;

fn config_json() -> Value {
    common::tiny_moe_config(299)
}

/// Tensors by full name: dtype, shape, little-endian bytes.
type Tensors = BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)>;

/// Records every tensor the loader asks a [`RandomWeights`] for, so the same
/// weights can be written to disk.
struct Recorder {
    inner: RandomWeights,
    seen: RefCell<Tensors>,
}

impl Recorder {
    fn record(&self, name: &str, dtype: Dtype, shape: Vec<usize>, bytes: Vec<u8>) {
        self.seen
            .borrow_mut()
            .insert(name.to_owned(), (dtype, shape, bytes));
    }
}

fn bf16_bytes(m: &[bf16]) -> Vec<u8> {
    m.iter().flat_map(|v| v.to_le_bytes()).collect()
}

impl WeightSource for Recorder {
    fn mat(&self, name: &str, rows: usize, cols: usize) -> Result<Mat> {
        let m = self.inner.mat(name, rows, cols)?;
        self.record(name, Dtype::BF16, vec![rows, cols], bf16_bytes(m.data()));
        Ok(m)
    }
    fn mats(&self, name: &str, n: usize, rows: usize, cols: usize) -> Result<Vec<Mat>> {
        let ms = self.inner.mats(name, n, rows, cols)?;
        let bytes = ms.iter().flat_map(|m| bf16_bytes(m.data())).collect();
        self.record(name, Dtype::BF16, vec![n, rows, cols], bytes);
        Ok(ms)
    }
    fn vector(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let v = self.inner.vector(name, shape)?;
        let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.record(name, Dtype::F32, shape.to_vec(), bytes);
        Ok(v)
    }
    fn has(&self, name: &str) -> bool {
        self.inner.has(name) || name == "lm_head.weight"
    }
}

/// Generates the tiny model's tensors with full on-disk names.
fn tensors(cfg: &Value) -> (ModelConfig, Tensors) {
    let mc = ModelConfig::from_json(cfg).unwrap();
    let rec = Recorder {
        inner: RandomWeights { seed: 7 },
        seen: RefCell::new(BTreeMap::new()),
    };
    Weights::load(&mc, &rec).unwrap();
    let named = rec
        .seen
        .into_inner()
        .into_iter()
        .map(|(k, v)| {
            let full = if k == "lm_head.weight" {
                k
            } else {
                format!("model.language_model.{k}")
            };
            (full, v)
        })
        .collect();
    (mc, named)
}

fn write_shard(path: &Path, tensors: &Tensors) {
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .map(|(k, (d, s, b))| (k.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// Writes a valid model directory in two shards plus an index, with visual
/// and MTP tensors that must be skipped.
fn write_model(dir: &Path, cfg: &Value, mut t: Tensors) {
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    t.insert(
        "model.visual.patch_embed.proj.weight".into(),
        (Dtype::BF16, vec![2, 2], vec![0; 8]),
    );
    t.insert("mtp.fc.weight".into(), (Dtype::F32, vec![3], vec![0; 12]));
    let mut a = Tensors::new();
    let mut b = Tensors::new();
    for (i, (k, v)) in t.into_iter().enumerate() {
        if i % 2 == 0 {
            a.insert(k, v)
        } else {
            b.insert(k, v)
        };
    }
    write_shard(&dir.join("model-00001-of-00002.safetensors"), &a);
    write_shard(&dir.join("model-00002-of-00002.safetensors"), &b);
    let mut map = serde_json::Map::new();
    for k in a.keys() {
        map.insert(k.clone(), json!("model-00001-of-00002.safetensors"));
    }
    for k in b.keys() {
        map.insert(k.clone(), json!("model-00002-of-00002.safetensors"));
    }
    let index = json!({"metadata": {}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
}

fn load_err(dir: &Path) -> String {
    match LoadedModel::from_dir(dir) {
        Ok(_) => panic!("{} loaded but should not", dir.display()),
        Err(e) => {
            let msg = format!("{e:#}");
            assert!(!msg.contains('\n'), "error is not one line: {msg}");
            msg
        }
    }
}

fn valid_dir() -> (tempfile::TempDir, ModelConfig, Tensors) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config_json();
    let (mc, t) = tensors(&cfg);
    write_model(dir.path(), &cfg, t.clone());
    (dir, mc, t)
}

#[test]
fn written_checkpoint_loads_and_computes_like_the_generated_weights() {
    let (dir, mc, _) = valid_dir();
    let loaded = LoadedModel::from_dir(dir.path()).unwrap();
    assert_eq!(loaded.config, mc);
    assert!(loaded.tokenizer.is_none());
    let from_disk = CpuModel::new(loaded.config, loaded.weights);
    let in_memory = CpuModel::new(
        mc.clone(),
        Weights::load(&mc, &RandomWeights { seed: 7 }).unwrap(),
    );
    let prompt = [1, 5, 9, 200, 7, 7, 3];
    let a = from_disk
        .forward(&mut from_disk.new_sequence(), &prompt)
        .unwrap();
    let b = in_memory
        .forward(&mut in_memory.new_sequence(), &prompt)
        .unwrap();
    assert_eq!(a, b);
}

#[test]
fn flat_config_single_file_and_model_prefix_load() {
    let dir = tempfile::tempdir().unwrap();
    let nested = config_json();
    let mut flat = nested["text_config"].clone();
    flat["architectures"] = json!(["Qwen3_5MoeForCausalLM"]);
    let (_, t) = tensors(&nested);
    let t: Tensors = t
        .into_iter()
        .map(|(k, v)| (k.replace("model.language_model.", "model."), v))
        .collect();
    std::fs::write(dir.path().join("config.json"), flat.to_string()).unwrap();
    write_shard(&dir.path().join("model.safetensors"), &t);
    let m = LoadedModel::from_dir(dir.path()).unwrap();
    assert_eq!(m.config.eos_token_ids, vec![299]);
}

#[test]
fn missing_directory_and_files() {
    let msg = load_err(Path::new("/nonexistent/qwasi-model"));
    assert!(msg.contains("/nonexistent/qwasi-model"), "{msg}");

    let (dir, _, _) = valid_dir();
    std::fs::remove_file(dir.path().join("config.json")).unwrap();
    let msg = load_err(dir.path());
    assert!(msg.contains("config.json"), "{msg}");

    let (dir, _, _) = valid_dir();
    std::fs::remove_file(dir.path().join("model-00002-of-00002.safetensors")).unwrap();
    let msg = load_err(dir.path());
    assert!(msg.contains("model-00002-of-00002.safetensors"), "{msg}");

    let (dir, _, _) = valid_dir();
    for f in [
        "model.safetensors.index.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ] {
        std::fs::remove_file(dir.path().join(f)).unwrap();
    }
    let msg = load_err(dir.path());
    assert!(msg.contains("no model.safetensors"), "{msg}");
}

#[test]
fn unsupported_architecture() {
    let (dir, _, _) = valid_dir();
    let mut cfg = config_json();
    cfg["architectures"] = json!(["LlamaForCausalLM"]);
    std::fs::write(dir.path().join("config.json"), cfg.to_string()).unwrap();
    let msg = load_err(dir.path());
    assert!(
        msg.contains("unsupported architecture \"LlamaForCausalLM\""),
        "{msg}"
    );
}

#[test]
fn bad_config_values() {
    let (dir, _, _) = valid_dir();
    std::fs::write(dir.path().join("config.json"), "{ not json").unwrap();
    assert!(load_err(dir.path()).contains("not valid JSON"));
    let mut cfg = config_json();
    cfg["text_config"]["hidden_size"] = json!("big");
    std::fs::write(dir.path().join("config.json"), cfg.to_string()).unwrap();
    let msg = load_err(dir.path());
    assert!(msg.contains("hidden_size"), "{msg}");
}

#[test]
fn corrupt_safetensors_header() {
    let (dir, _, _) = valid_dir();
    let shard = dir.path().join("model-00001-of-00002.safetensors");
    let mut bytes = std::fs::read(&shard).unwrap();
    bytes[8] = b'#'; // the JSON header's opening brace
    std::fs::write(&shard, &bytes).unwrap();
    let msg = load_err(dir.path());
    assert!(
        msg.contains("corrupt safetensors file") && msg.contains("model-00001-of-00002"),
        "{msg}"
    );

    std::fs::write(&shard, b"short").unwrap();
    let msg = load_err(dir.path());
    assert!(msg.contains("corrupt safetensors file"), "{msg}");
}

fn rewrite(dir: &Path, t: Tensors) {
    for f in std::fs::read_dir(dir).unwrap() {
        let p = f.unwrap().path();
        if p.extension().is_some_and(|e| e == "safetensors")
            || p.ends_with("model.safetensors.index.json")
        {
            std::fs::remove_file(p).unwrap();
        }
    }
    write_model(dir, &config_json(), t);
}

#[test]
fn missing_misshaped_and_wrong_dtype_tensors() {
    let name = "model.language_model.layers.1.linear_attn.in_proj_qkv.weight";
    let (dir, _, mut t) = valid_dir();
    t.remove(name);
    rewrite(dir.path(), t);
    let msg = load_err(dir.path());
    assert!(
        msg.contains("missing tensor") && msg.contains("layers.1.linear_attn.in_proj_qkv.weight"),
        "{msg}"
    );
    assert!(msg.contains("layer 1"), "{msg}");

    let z = "model.language_model.layers.1.linear_attn.in_proj_z.weight";
    let (dir, _, mut t) = valid_dir();
    let e = t.get_mut(z).unwrap();
    e.1 = vec![e.1[1], e.1[0]];
    rewrite(dir.path(), t);
    let msg = load_err(dir.path());
    assert!(msg.contains(&format!("tensor {z}")), "{msg}");
    assert!(
        msg.contains("has shape [32, 16], expected [16, 32]"),
        "{msg}"
    );

    let (dir, _, mut t) = valid_dir();
    let e = t.get_mut(name).unwrap();
    e.0 = Dtype::F16;
    rewrite(dir.path(), t);
    let msg = load_err(dir.path());
    assert!(
        msg.contains("unsupported dtype F16") && msg.contains(name),
        "{msg}"
    );
}

#[test]
fn quantization_config_must_be_fp8_and_match_the_weights() {
    let (dir, _, t) = valid_dir();
    let mut cfg = config_json();
    cfg["quantization_config"] = json!({"quant_method": "awq", "bits": 4});
    write_model(dir.path(), &cfg, t.clone());
    let msg = load_err(dir.path());
    assert!(
        msg.contains("unsupported quantization method") && msg.contains("config.json"),
        "{msg}"
    );

    // An FP8 config over BF16 weights that are not whole 128x128 blocks loads
    // (transformers' quantizer would have left them all BF16) ...
    cfg["quantization_config"] = json!({"quant_method": "fp8", "weight_block_size": [128, 128]});
    write_model(dir.path(), &cfg, t.clone());
    LoadedModel::from_dir(dir.path()).unwrap();

    // ... and an E4M3 weight without its scale is named.
    let name = "model.language_model.layers.1.linear_attn.in_proj_qkv.weight";
    let mut t = t;
    let e = t.get_mut(name).unwrap();
    e.0 = Dtype::F8_E4M3;
    e.2.truncate(e.2.len() / 2);
    write_model(dir.path(), &cfg, t);
    let msg = load_err(dir.path());
    assert!(
        msg.contains("layer 1")
            && msg.contains(&format!("FP8 tensor {name}"))
            && msg.contains("has no scale tensor"),
        "{msg}"
    );
}
