use super::*;
use crate::checkpoint::{Checkpoint, WeightSource};
use safetensors::Dtype;
use safetensors::tensor::TensorView;
use serde_json::json;

fn bits(x: bf16) -> u16 {
    x.to_bits()
}

#[test]
fn e4m3_values_are_exact() {
    assert_eq!(e4m3_to_f32(0x00).to_bits(), 0.0f32.to_bits());
    assert_eq!(e4m3_to_f32(0x80).to_bits(), (-0.0f32).to_bits());
    // subnormals: m/8 * 2^-6
    assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
    assert_eq!(e4m3_to_f32(0x04), 2f32.powi(-7));
    assert_eq!(e4m3_to_f32(0x07), 7.0 * 2f32.powi(-9));
    assert_eq!(e4m3_to_f32(0x87), -7.0 * 2f32.powi(-9));
    // normals
    assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6));
    assert_eq!(e4m3_to_f32(0x38), 1.0);
    assert_eq!(e4m3_to_f32(0x3C), 1.5);
    assert_eq!(e4m3_to_f32(0x40), 2.0);
    assert_eq!(e4m3_to_f32(0x7E), 448.0);
    assert_eq!(e4m3_to_f32(0xFE), -448.0);
    // float8_e4m3fn has no infinities: exponent 15 is finite except mantissa 7
    assert_eq!(e4m3_to_f32(0x78), 256.0);
    assert!(e4m3_to_f32(0x7F).is_nan());
    assert!(e4m3_to_f32(0xFF).is_nan());
    // strictly increasing over the non-negative finite codes
    for b in 0..0x7Eu8 {
        assert!(e4m3_to_f32(b) < e4m3_to_f32(b + 1), "{b:#x}");
        assert_eq!(e4m3_to_f32(b | 0x80), -e4m3_to_f32(b));
    }
}

/// `torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float32)`
/// as f32 bits (torch 2.15; NaN written as 0x7fc00000).
const TORCH_E4M3: [u32; 256] = [
    0x00000000, 0x3b000000, 0x3b800000, 0x3bc00000, 0x3c000000, 0x3c200000, 0x3c400000, 0x3c600000,
    0x3c800000, 0x3c900000, 0x3ca00000, 0x3cb00000, 0x3cc00000, 0x3cd00000, 0x3ce00000, 0x3cf00000,
    0x3d000000, 0x3d100000, 0x3d200000, 0x3d300000, 0x3d400000, 0x3d500000, 0x3d600000, 0x3d700000,
    0x3d800000, 0x3d900000, 0x3da00000, 0x3db00000, 0x3dc00000, 0x3dd00000, 0x3de00000, 0x3df00000,
    0x3e000000, 0x3e100000, 0x3e200000, 0x3e300000, 0x3e400000, 0x3e500000, 0x3e600000, 0x3e700000,
    0x3e800000, 0x3e900000, 0x3ea00000, 0x3eb00000, 0x3ec00000, 0x3ed00000, 0x3ee00000, 0x3ef00000,
    0x3f000000, 0x3f100000, 0x3f200000, 0x3f300000, 0x3f400000, 0x3f500000, 0x3f600000, 0x3f700000,
    0x3f800000, 0x3f900000, 0x3fa00000, 0x3fb00000, 0x3fc00000, 0x3fd00000, 0x3fe00000, 0x3ff00000,
    0x40000000, 0x40100000, 0x40200000, 0x40300000, 0x40400000, 0x40500000, 0x40600000, 0x40700000,
    0x40800000, 0x40900000, 0x40a00000, 0x40b00000, 0x40c00000, 0x40d00000, 0x40e00000, 0x40f00000,
    0x41000000, 0x41100000, 0x41200000, 0x41300000, 0x41400000, 0x41500000, 0x41600000, 0x41700000,
    0x41800000, 0x41900000, 0x41a00000, 0x41b00000, 0x41c00000, 0x41d00000, 0x41e00000, 0x41f00000,
    0x42000000, 0x42100000, 0x42200000, 0x42300000, 0x42400000, 0x42500000, 0x42600000, 0x42700000,
    0x42800000, 0x42900000, 0x42a00000, 0x42b00000, 0x42c00000, 0x42d00000, 0x42e00000, 0x42f00000,
    0x43000000, 0x43100000, 0x43200000, 0x43300000, 0x43400000, 0x43500000, 0x43600000, 0x43700000,
    0x43800000, 0x43900000, 0x43a00000, 0x43b00000, 0x43c00000, 0x43d00000, 0x43e00000, 0x7fc00000,
    0x80000000, 0xbb000000, 0xbb800000, 0xbbc00000, 0xbc000000, 0xbc200000, 0xbc400000, 0xbc600000,
    0xbc800000, 0xbc900000, 0xbca00000, 0xbcb00000, 0xbcc00000, 0xbcd00000, 0xbce00000, 0xbcf00000,
    0xbd000000, 0xbd100000, 0xbd200000, 0xbd300000, 0xbd400000, 0xbd500000, 0xbd600000, 0xbd700000,
    0xbd800000, 0xbd900000, 0xbda00000, 0xbdb00000, 0xbdc00000, 0xbdd00000, 0xbde00000, 0xbdf00000,
    0xbe000000, 0xbe100000, 0xbe200000, 0xbe300000, 0xbe400000, 0xbe500000, 0xbe600000, 0xbe700000,
    0xbe800000, 0xbe900000, 0xbea00000, 0xbeb00000, 0xbec00000, 0xbed00000, 0xbee00000, 0xbef00000,
    0xbf000000, 0xbf100000, 0xbf200000, 0xbf300000, 0xbf400000, 0xbf500000, 0xbf600000, 0xbf700000,
    0xbf800000, 0xbf900000, 0xbfa00000, 0xbfb00000, 0xbfc00000, 0xbfd00000, 0xbfe00000, 0xbff00000,
    0xc0000000, 0xc0100000, 0xc0200000, 0xc0300000, 0xc0400000, 0xc0500000, 0xc0600000, 0xc0700000,
    0xc0800000, 0xc0900000, 0xc0a00000, 0xc0b00000, 0xc0c00000, 0xc0d00000, 0xc0e00000, 0xc0f00000,
    0xc1000000, 0xc1100000, 0xc1200000, 0xc1300000, 0xc1400000, 0xc1500000, 0xc1600000, 0xc1700000,
    0xc1800000, 0xc1900000, 0xc1a00000, 0xc1b00000, 0xc1c00000, 0xc1d00000, 0xc1e00000, 0xc1f00000,
    0xc2000000, 0xc2100000, 0xc2200000, 0xc2300000, 0xc2400000, 0xc2500000, 0xc2600000, 0xc2700000,
    0xc2800000, 0xc2900000, 0xc2a00000, 0xc2b00000, 0xc2c00000, 0xc2d00000, 0xc2e00000, 0xc2f00000,
    0xc3000000, 0xc3100000, 0xc3200000, 0xc3300000, 0xc3400000, 0xc3500000, 0xc3600000, 0xc3700000,
    0xc3800000, 0xc3900000, 0xc3a00000, 0xc3b00000, 0xc3c00000, 0xc3d00000, 0xc3e00000, 0x7fc00000,
];

#[test]
fn e4m3_values_equal_torch() {
    for (b, &want) in TORCH_E4M3.iter().enumerate() {
        let got = e4m3_to_f32(b as u8);
        let want = f32::from_bits(want);
        assert!(
            got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
            "{b:#04x}: {got} vs torch {want}"
        );
    }
}

#[test]
fn product_is_rounded_once_to_bf16_nearest_even() {
    // 1 * (1 + 2^-8) lies halfway between two bf16 values: ties to even (down).
    assert_eq!(bits(dequant(0x38, 1.0 + 2f32.powi(-8))), 0x3F80);
    // 1 * (1 + 3 * 2^-8): halfway, ties to even (up).
    assert_eq!(bits(dequant(0x38, 1.0 + 3.0 * 2f32.powi(-8))), 0x3F82);
    // 1.875 * 1.1f32 = 2.0625000447..: rounds to 2.0625.
    assert_eq!(bits(dequant(0x3F, 1.1)), 0x4004);
    assert_eq!(bits(dequant(0x80, 3.0)), 0x8000);
    assert!(dequant(0x7F, 2.0).is_nan());
    assert!(dequant(0xFF, 0.5).is_nan());
}

/// A tensor whose byte `i` is `i % 0x7E` (no NaN) and scale `b` is `b + 1`.
fn sample(slabs: usize, rows: usize, cols: usize) -> Fp8Tensor {
    let n = slabs * rows * cols;
    let blocks = slabs * rows.div_ceil(BLOCK) * cols.div_ceil(BLOCK);
    let bytes = (0..n).map(|i| (i % 0x7E) as u8).collect();
    let scales = (0..blocks).map(|b| (b + 1) as f32).collect();
    Fp8Tensor::new(Fp8Bytes::Owned(bytes), scales, rows, cols).unwrap()
}

#[test]
fn partial_edge_blocks_use_their_own_scale() {
    let (rows, cols) = (130, 200); // blocks 2 x 2, the last ones partial
    let t = sample(1, rows, cols);
    let all = t.dequantized();
    let at = |r: usize, c: usize| all[r * cols + c];
    let want = |r: usize, c: usize, s: f32| dequant(((r * cols + c) % 0x7E) as u8, s);
    assert_eq!(at(127, 127), want(127, 127, 1.0));
    assert_eq!(at(0, 128), want(0, 128, 2.0));
    assert_eq!(at(128, 0), want(128, 0, 3.0));
    assert_eq!(at(129, 199), want(129, 199, 4.0));
    assert_eq!(t.dequantize_rows(128, 2), all[128 * cols..].to_vec());
}

#[test]
fn slabs_have_their_own_block_grids() {
    let (rows, cols) = (3, 4);
    let t = sample(2, rows, cols);
    let all = t.dequantized().to_vec();
    for r in 0..2 * rows {
        for c in 0..cols {
            let scale = if r < rows { 1.0 } else { 2.0 };
            assert_eq!(
                all[r * cols + c],
                dequant(((r * cols + c) % 0x7E) as u8, scale)
            );
        }
    }
    // an expert's matrix uploaded on its own: the same values, nothing cached
    let fresh = sample(2, rows, cols);
    let m = crate::tensor::Mat::new(
        2 * rows,
        cols,
        std::sync::Arc::new(crate::tensor::Storage::Fp8(fresh)),
        0,
    );
    let second = m.split_rows(2).pop().unwrap();
    assert_eq!(&*second.host_bf16(), &all[rows * cols..]);
    let (raw, first_row) = second.fp8().unwrap();
    assert_eq!((first_row, raw.bytes().len()), (rows, 2 * rows * cols));
    assert!(raw.cached().is_none());
    assert_eq!(second.data(), &all[rows * cols..]);
}

#[test]
fn bad_scales_are_refused() {
    let bytes = || Fp8Bytes::Owned(vec![0x38; 4]);
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let e = Fp8Tensor::new(bytes(), vec![bad], 2, 2).err().unwrap();
        assert!(e.to_string().contains("scale 0 is"), "{e}");
    }
    let e = Fp8Tensor::new(bytes(), vec![1.0, 1.0], 2, 2).err().unwrap();
    assert!(e.to_string().contains("2 scales for 1 blocks"), "{e}");
}

fn published() -> Value {
    json!({"quantization_config": {
        "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
        "weight_block_size": [128, 128],
        "modules_to_not_convert": ["lm_head", "model.language_model.embed_tokens",
            "model.language_model.layers.1.mlp.gate", "shared_expert_gate", "model.visual"]
    }})
}

#[test]
fn quantization_config_is_parsed_and_checked() {
    assert!(Fp8Format::from_config(&json!({})).unwrap().is_none());
    let f = Fp8Format::from_config(&published()).unwrap().unwrap();
    assert!(f.keeps_bf16("lm_head.weight"));
    assert!(f.keeps_bf16("model.language_model.layers.1.mlp.gate.weight"));
    assert!(f.keeps_bf16("model.language_model.layers.7.mlp.shared_expert_gate.weight"));
    // transformers' `re.match` is a prefix match: the pattern keeps `gate_proj` too
    assert!(f.keeps_bf16("model.language_model.layers.1.mlp.gate_proj.weight"));
    assert!(!f.keeps_bf16("model.language_model.layers.1.mlp.shared_expert.gate_proj.weight"));
    assert!(!f.keeps_bf16("model.language_model.layers.2.mlp.gate.weight"));
    assert!(!f.keeps_bf16("model.language_model.layers.1.self_attn.q_proj.weight"));
    let experts = json!({"quantization_config": {"quant_method": "fp8",
        "modules_to_not_convert": ["layers.0.mlp.experts"]}});
    let f = Fp8Format::from_config(&experts).unwrap().unwrap();
    assert!(f.keeps_bf16("model.layers.0.mlp.experts.5.down_proj.weight"));

    let refused = [
        (
            "quant_method",
            json!("gptq"),
            "unsupported quantization method",
        ),
        (
            "fmt",
            json!("e5m2"),
            "unsupported `quantization_config.fmt`",
        ),
        ("weight_block_size", json!([64, 64]), "weight_block_size"),
        ("weight_block_size", json!(null), "weight_block_size"),
        ("scale_fmt", json!("ue8m0"), "scale_fmt"),
        ("activation_scheme", json!("static"), "activation_scheme"),
        (
            "modules_to_convert",
            json!(["embed_tokens"]),
            "modules_to_convert",
        ),
        (
            "modules_to_not_convert",
            json!(["("]),
            "not a valid pattern",
        ),
    ];
    for (key, value, msg) in refused {
        let mut c = published();
        c["quantization_config"][key] = value;
        let e = Fp8Format::from_config(&c).err().unwrap();
        assert!(format!("{e:#}").contains(msg), "{key}: {e:#}");
    }
}

/// Writes one safetensors file of (name, dtype, shape, bytes) into a temp dir.
/// The directory is removed on return: the checkpoint keeps its file mapped.
fn checkpoint(tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)], quant: bool) -> Checkpoint {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.to_string(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    let fmt = quant.then(|| Fp8Format::from_config(&published()).unwrap().unwrap());
    Checkpoint::open(dir).unwrap().with_quantization(fmt)
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

const Q: &str = "model.language_model.layers.0.self_attn.q_proj";

fn err(c: &Checkpoint, name: &str) -> String {
    format!("{:#}", c.mat(name, 2, 2).err().unwrap())
}

#[test]
fn checkpoint_loads_fp8_matrices_and_fused_experts() {
    let w = format!("{Q}.weight");
    let s = format!("{Q}.weight_scale_inv");
    let fused = "model.language_model.layers.0.mlp.experts.down_proj";
    let c = checkpoint(
        &[
            (&w, Dtype::F8_E4M3, vec![2, 2], vec![0x38, 0x40, 0xB8, 0x00]),
            (
                &s,
                Dtype::BF16,
                vec![1, 1],
                0.5f32.to_bits().to_le_bytes()[2..].to_vec(),
            ),
            (fused, Dtype::F8_E4M3, vec![2, 1, 2], vec![0x38; 4]),
            (
                "model.language_model.layers.0.mlp.experts.down_proj_scale_inv",
                Dtype::F32,
                vec![2, 1, 1],
                f32s(&[2.0, 3.0]),
            ),
        ],
        true,
    );
    let m = c.mat("layers.0.self_attn.q_proj.weight", 2, 2).unwrap();
    assert_eq!(m.data(), [0.5, 1.0, -0.5, 0.0].map(bf16::from_f32));
    let experts = c.mats("layers.0.mlp.experts.down_proj", 2, 1, 2).unwrap();
    assert_eq!(experts[1].data(), [3.0, 3.0].map(bf16::from_f32));
    assert_eq!(&*experts[0].host_bf16(), [2.0, 2.0].map(bf16::from_f32));
}

#[test]
fn checkpoint_errors_name_the_tensor() {
    let w = format!("{Q}.weight");
    let s = format!("{Q}.weight_scale_inv");
    let fp8 = (w.as_str(), Dtype::F8_E4M3, vec![2, 2], vec![0x38; 4]);
    let bf16w = (w.as_str(), Dtype::BF16, vec![2, 2], vec![0; 8]);
    let name = "layers.0.self_attn.q_proj.weight";

    let e = err(&checkpoint(std::slice::from_ref(&fp8), true), name);
    assert!(
        e.contains(&format!("FP8 tensor {w}")) && e.contains("has no scale tensor"),
        "{e}"
    );

    let wrong = (s.as_str(), Dtype::F32, vec![1, 2], f32s(&[1.0, 1.0]));
    let e = err(&checkpoint(&[fp8.clone(), wrong], true), name);
    assert!(
        e.contains(&format!("tensor {s}")) && e.contains("expected [1, 1]"),
        "{e}"
    );

    let nan = (s.as_str(), Dtype::F32, vec![1, 1], f32s(&[f32::NAN]));
    let e = err(&checkpoint(&[fp8.clone(), nan], true), name);
    assert!(
        e.contains(&format!("FP8 tensor {w} with scales {s}")) && e.contains("NaN"),
        "{e}"
    );

    let int = (s.as_str(), Dtype::I32, vec![1, 1], vec![0; 4]);
    let e = err(&checkpoint(&[fp8.clone(), int], true), name);
    assert!(
        e.contains(&format!("tensor {s}")) && e.contains("unsupported dtype"),
        "{e}"
    );

    let one = (s.as_str(), Dtype::F32, vec![1, 1], f32s(&[1.0]));
    let e = err(&checkpoint(&[fp8.clone(), one.clone()], false), name);
    assert!(
        e.contains(&w) && e.contains("no `quantization_config`"),
        "{e}"
    );

    // BF16 where the config says FP8: a Linear weight of whole 128x128 blocks
    // that no `modules_to_not_convert` entry keeps.
    let whole = (
        w.as_str(),
        Dtype::BF16,
        vec![128, 256],
        vec![0; 128 * 256 * 2],
    );
    let c = checkpoint(&[whole], true);
    let e = format!("{:#}", c.mat(name, 128, 256).err().unwrap());
    assert!(e.contains(&w) && e.contains("says it is FP8"), "{e}");
    // not whole blocks: transformers' quantizer leaves it BF16 too
    checkpoint(std::slice::from_ref(&bf16w), true)
        .mat(name, 2, 2)
        .unwrap();

    let e = err(&checkpoint(&[bf16w, one], true), name);
    assert!(e.contains(&w) && e.contains("has a scale tensor"), "{e}");

    let kept = "model.language_model.layers.1.mlp.gate.weight";
    let c = checkpoint(&[(kept, Dtype::F8_E4M3, vec![2, 2], vec![0x38; 4])], true);
    let e = err(&c, "layers.1.mlp.gate.weight");
    assert!(e.contains(kept) && e.contains("keeps it in BF16"), "{e}");

    // BF16 where the config keeps BF16, and the router / embedding, which
    // transformers never quantizes, load as they are.
    let c = checkpoint(
        &[
            ("lm_head.weight", Dtype::BF16, vec![2, 2], vec![0; 8]),
            (
                "model.language_model.layers.2.mlp.gate.weight",
                Dtype::BF16,
                vec![2, 2],
                vec![0; 8],
            ),
            (
                "model.language_model.embed_tokens.weight",
                Dtype::BF16,
                vec![2, 2],
                vec![0; 8],
            ),
        ],
        true,
    );
    for n in [
        "lm_head.weight",
        "layers.2.mlp.gate.weight",
        "embed_tokens.weight",
    ] {
        c.mat(n, 2, 2).unwrap();
    }
}

#[test]
fn block_rows_give_whole_blocks_of_one_slab_with_their_scales() {
    // Two slabs of [256, 200]: 2 x 2 row blocks, 2 column blocks (the second partial).
    let (rows, cols) = (256, 200);
    let bytes: Vec<u8> = (0..2 * rows * cols).map(|i| (i % 251) as u8).collect();
    let scales: Vec<f32> = (0..8).map(|i| i as f32 + 0.5).collect();
    let t = Fp8Tensor::new(Fp8Bytes::Owned(bytes.clone()), scales, rows, cols).unwrap();
    // Slab 1's second row block: global rows 384..512, scale rows 3.
    let (b, s) = t.block_rows(384, 128).unwrap();
    assert_eq!(b, &bytes[384 * cols..512 * cols]);
    assert_eq!(s, &[6.5, 7.5]);
    // A whole slab.
    let (b, s) = t.block_rows(256, 256).unwrap();
    assert_eq!((b.len(), s), (256 * cols, &[4.5, 5.5, 6.5, 7.5][..]));
    // Not block-aligned, partial, or across slabs.
    assert!(t.block_rows(64, 128).is_none());
    assert!(t.block_rows(0, 100).is_none());
    assert!(t.block_rows(128, 256).is_none());
}
