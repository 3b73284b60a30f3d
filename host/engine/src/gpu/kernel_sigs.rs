// Kernel signatures from `kernels/*.cu` and the typed Rust launches made from
// them. Included by `build.rs` (which writes `OUT_DIR/kernels.rs` for the
// `cuda` and `hip` features) and by `gpu::kernel_sigs` for its tests, so the
// parser is checked over the real sources without a GPU toolchain. Plain `//`
// comments: an `include!`d file may not carry inner doc comments.
//
// A kernel is `QW_KERNEL void [bounds] name(params) {`, written out or
// instantiated by a function-like macro whose body holds one such definition
// (`ATTN_PREP(attn_prep_bf16, bf16_t)`); the macro's parameters are
// substituted by token. Preprocessor branches are not evaluated: a kernel
// defined in two branches (a CUDA and a HIP body) must have the same
// parameters in both.

/// The Rust type a kernel parameter is passed as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamTy {
    /// Any pointer: a device address.
    Ptr,
    I32,
    U32,
    I64,
    U64,
    F32,
}

impl ParamTy {
    pub fn rust(self) -> &'static str {
        match self {
            ParamTy::Ptr => "DevPtr",
            ParamTy::I32 => "i32",
            ParamTy::U32 => "u32",
            ParamTy::I64 => "i64",
            ParamTy::U64 => "u64",
            ParamTy::F32 => "f32",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Param {
    pub name: String,
    pub ty: ParamTy,
    /// The C declaration, for the wrapper's docs.
    pub decl: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelSig {
    pub name: String,
    pub params: Vec<Param>,
}

/// The kernels defined in one source file, in order of first definition.
pub fn parse_kernels(src: &str) -> Result<Vec<KernelSig>, String> {
    let text = strip_comments(src)
        .replace("\\\r\n", " ")
        .replace("\\\n", " ");
    let mut macros: Vec<(String, Vec<String>, String)> = Vec::new();
    let mut body = String::new();
    for line in text.lines() {
        let t = line.trim_start();
        if let Some(d) = t.strip_prefix('#') {
            let d = d.trim_start();
            if let Some(def) = d.strip_prefix("define")
                && def.contains("QW_KERNEL")
            {
                let def = def.trim_start();
                let open = def
                    .find('(')
                    .ok_or_else(|| format!("object-like macro: {def}"))?;
                let close = def[open..].find(')').ok_or("unclosed macro parameters")? + open;
                let name = def[..open].trim().to_string();
                let params = def[open + 1..close]
                    .split(',')
                    .map(|p| p.trim().to_string())
                    .collect();
                macros.push((name, params, def[close + 1..].to_string()));
            }
            body.push('\n');
            continue;
        }
        body.push_str(line);
        body.push('\n');
    }
    let mut out: Vec<KernelSig> = Vec::new();
    let mut add = |k: KernelSig| -> Result<(), String> {
        match out.iter().find(|o| o.name == k.name) {
            Some(o) if o.params != k.params => Err(format!(
                "kernel {} is defined twice with different parameters",
                k.name
            )),
            Some(_) => Ok(()),
            None => {
                out.push(k);
                Ok(())
            }
        }
    };
    let toks = tokens(&body);
    let mut i = 0;
    while i < toks.len() {
        if toks[i] == "QW_KERNEL" {
            let (k, next) = kernel_at(&toks, i)?;
            add(k)?;
            i = next;
        } else if let Some((_, params, mbody)) = macros.iter().find(|m| m.0 == toks[i])
            && toks.get(i + 1).is_some_and(|t| t == "(")
            && (i == 0 || matches!(toks[i - 1].as_str(), ";" | "}" | ")"))
        {
            let (args, next) = group(&toks, i + 1)?;
            let args = split_commas(args);
            if args.len() != params.len() {
                return Err(format!(
                    "{}: {} arguments for {} parameters",
                    toks[i],
                    args.len(),
                    params.len()
                ));
            }
            let expanded: Vec<String> = tokens(mbody)
                .into_iter()
                .flat_map(|t| match params.iter().position(|p| *p == t) {
                    Some(p) => args[p].to_vec(),
                    None => vec![t],
                })
                .collect();
            let at = expanded
                .iter()
                .position(|t| t == "QW_KERNEL")
                .ok_or("kernel macro without QW_KERNEL")?;
            add(kernel_at(&expanded, at)?.0)?;
            i = next;
        } else {
            i += 1;
        }
    }
    Ok(out)
}

/// The definition starting at the `QW_KERNEL` token `at`, and the index after its header.
fn kernel_at(toks: &[String], at: usize) -> Result<(KernelSig, usize), String> {
    // The header runs to the body's `{`; its last parenthesised group holds
    // the parameters and the identifier before it is the name (bounds macros
    // such as `QW_BOUNDS(256)` come earlier).
    let mut depth = 0usize;
    let mut last_group = None;
    let mut j = at + 1;
    while j < toks.len() {
        match toks[j].as_str() {
            "(" => {
                if depth == 0 {
                    last_group = Some(j);
                }
                depth += 1;
            }
            ")" => {
                depth = depth
                    .checked_sub(1)
                    .ok_or("unbalanced ) in a kernel header")?
            }
            "{" | ";" if depth == 0 => break,
            _ => {}
        }
        j += 1;
    }
    let open = last_group.ok_or("kernel header without parameters")?;
    if toks.get(at + 1).map(String::as_str) != Some("void") {
        return Err(format!(
            "kernel at `{}` does not return void",
            toks[at..open].join(" ")
        ));
    }
    let name = toks[open - 1].clone();
    if !is_ident(&name) {
        return Err(format!(
            "no kernel name before `(` in `{}`",
            toks[at..open].join(" ")
        ));
    }
    let (inner, _) = group(toks, open)?;
    let mut params = Vec::new();
    for p in split_commas(inner) {
        if p.len() == 1 && p[0] == "void" {
            continue;
        }
        params.push(param(p).map_err(|e| format!("kernel {name}: {e}"))?);
    }
    Ok((KernelSig { name, params }, j))
}

fn param(p: &[String]) -> Result<Param, String> {
    let decl = p.join(" ").replace(" *", "*");
    let name = p
        .last()
        .filter(|t| is_ident(t))
        .ok_or_else(|| format!("unnamed parameter `{decl}`"))?;
    let ty: Vec<&str> = p[..p.len() - 1]
        .iter()
        .map(String::as_str)
        .filter(|t| !matches!(*t, "const" | "volatile" | "__restrict__" | "__restrict"))
        .collect();
    let ty = if ty.contains(&"*") {
        ParamTy::Ptr
    } else {
        match ty.join(" ").as_str() {
            "int" | "signed" | "signed int" | "int32_t" => ParamTy::I32,
            "unsigned" | "unsigned int" | "uint32_t" => ParamTy::U32,
            "long long" | "long long int" | "int64_t" => ParamTy::I64,
            "unsigned long long" | "unsigned long long int" | "uint64_t" | "size_t" => ParamTy::U64,
            "float" => ParamTy::F32,
            other => return Err(format!("parameter `{decl}`: no Rust type for `{other}`")),
        }
    };
    Ok(Param {
        name: name.clone(),
        ty,
        decl,
    })
}

/// The tokens inside the parenthesised group opening at `open`, and the index after it.
fn group(toks: &[String], open: usize) -> Result<(&[String], usize), String> {
    let mut depth = 0usize;
    for (j, t) in toks.iter().enumerate().skip(open) {
        match t.as_str() {
            "(" => depth += 1,
            ")" => {
                depth -= 1;
                if depth == 0 {
                    return Ok((&toks[open + 1..j], j + 1));
                }
            }
            _ => {}
        }
    }
    Err("unclosed (".into())
}

fn split_commas(toks: &[String]) -> Vec<&[String]> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (j, t) in toks.iter().enumerate() {
        match t.as_str() {
            "(" | "<" | "[" => depth += 1,
            ")" | ">" | "]" => depth = depth.saturating_sub(1),
            "," if depth == 0 => {
                out.push(&toks[start..j]);
                start = j + 1;
            }
            _ => {}
        }
    }
    if start < toks.len() {
        out.push(&toks[start..]);
    }
    out
}

fn is_ident(t: &str) -> bool {
    t.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && t.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Identifiers, numbers and single punctuation characters (enough for headers).
fn tokens(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for c in s.chars() {
        if c.is_ascii_alphanumeric() || c == '_' || (c == '.' && !cur.is_empty()) {
            cur.push(c);
            continue;
        }
        if !cur.is_empty() {
            out.push(std::mem::take(&mut cur));
        }
        if !c.is_whitespace() {
            out.push(c.to_string());
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// The source without comments; string and character literals kept as they are.
fn strip_comments(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                    if b[i] == b'\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
                i += 2;
                out.push(' ');
            }
            q @ (b'"' | b'\'') => {
                let start = i;
                i += 1;
                while i < b.len() && b[i] != q {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
                out.push_str(&s[start..i.min(b.len())]);
            }
            _ => {
                let start = i;
                while i < b.len() && !matches!(b[i], b'/' | b'"' | b'\'') {
                    i += 1;
                }
                if i == start {
                    i += 1;
                }
                out.push_str(&s[start..i]);
            }
        }
    }
    out
}

/// A Rust identifier for a C parameter (keywords raw; the wrapper's own
/// `dev` and `launch` renamed).
fn rust_ident(name: &str) -> String {
    const KEYWORDS: &[&str] = &[
        "as", "break", "const", "continue", "crate", "else", "enum", "extern", "false", "fn",
        "for", "if", "impl", "in", "let", "loop", "match", "mod", "move", "mut", "pub", "ref",
        "return", "static", "struct", "trait", "true", "type", "unsafe", "use", "where", "while",
        "async", "await", "dyn", "abstract", "become", "box", "do", "final", "macro", "override",
        "priv", "typeof", "unsized", "virtual", "yield", "try", "gen",
    ];
    match name {
        "dev" | "launch" | "args" => format!("{name}_"),
        "self" | "Self" | "super" | "crate" => format!("{name}_"),
        n if KEYWORDS.contains(&n) => format!("r#{n}"),
        n => n.to_string(),
    }
}

/// The Rust source of the typed launches: a `Kernel` constant and a launch
/// function per kernel, a `sig` module with each launch's fn-pointer type and
/// a `typed` module pairing each kernel with its launch (for call sites that
/// pick one of several kernels of the same signature).
/// `modules` are (source file stem, its kernels).
pub fn rust_launches(modules: &[(String, Vec<KernelSig>)]) -> Result<String, String> {
    use std::fmt::Write;
    let mut seen = std::collections::HashSet::new();
    for (stem, ks) in modules {
        for k in ks {
            if !seen.insert(k.name.clone()) {
                return Err(format!(
                    "kernel {} defined in more than one module ({stem})",
                    k.name
                ));
            }
        }
    }
    let all: Vec<(&str, &KernelSig)> = modules
        .iter()
        .flat_map(|(m, ks)| ks.iter().map(move |k| (m.as_str(), k)))
        .collect();
    let mut s = String::from(
        "// Generated by build.rs from kernels/*.cu (src/gpu/kernel_sigs.rs). Do not edit.\n\n",
    );
    s.push_str("#[allow(non_upper_case_globals)]\nimpl Kernel {\n");
    for (idx, (m, k)) in all.iter().enumerate() {
        let _ = writeln!(
            s,
            "    /// `{}` in `kernels/{m}.cu`.\n    pub const {}: Kernel = Kernel::new({idx}, {:?}, {m:?});",
            k.name, k.name, k.name
        );
    }
    s.push_str("    /// Every kernel, in index order.\n    pub const ALL: &'static [Kernel] = &[");
    for (_, k) in &all {
        let _ = write!(s, "Kernel::{}, ", k.name);
    }
    s.push_str("];\n}\n\n");
    let params = |k: &KernelSig| {
        k.params
            .iter()
            .map(|p| format!("{}: {}", rust_ident(&p.name), p.ty.rust()))
            .collect::<Vec<_>>()
    };
    for (m, k) in &all {
        let ps = params(k);
        let decls: Vec<&str> = k.params.iter().map(|p| p.decl.as_str()).collect();
        let _ = writeln!(
            s,
            "/// Launches `{name}({})` (`kernels/{m}.cu`).\n\
             #[allow(non_snake_case, clippy::too_many_arguments)]\n\
             pub fn {name}(dev: &Device, launch: Launch{}) -> Result<()> {{\n    \
             let args: [*const c_void; {}] = [{}];\n    \
             // SAFETY: one argument per kernel parameter, of the parameter's size, in order.\n    \
             unsafe {{ dev.launch_raw(Kernel::{name}, launch, &args) }}\n}}\n",
            decls.join(", "),
            ps.iter().map(|p| format!(", {p}")).collect::<String>(),
            k.params.len(),
            k.params
                .iter()
                .map(|p| format!(
                    "&{} as *const {} as *const c_void",
                    rust_ident(&p.name),
                    p.ty.rust()
                ))
                .collect::<Vec<_>>()
                .join(", "),
            name = k.name,
        );
    }
    s.push_str(
        "/// The fn-pointer type of each launch function, for call sites that pick\n\
         /// one of several kernels with the same parameters.\n\
         #[allow(non_camel_case_types, clippy::type_complexity)]\npub mod sig {\n    use super::*;\n",
    );
    for (_, k) in &all {
        let tys: Vec<&str> = k.params.iter().map(|p| p.ty.rust()).collect();
        let _ = writeln!(
            s,
            "    pub type {} = fn(&Device, Launch{}) -> Result<()>;",
            k.name,
            tys.iter().map(|t| format!(", {t}")).collect::<String>()
        );
    }
    s.push_str(
        "}\n\n/// Each kernel with its launch function, for call sites that pick one\n\
         /// of several kernels and also query it (occupancy, name).\n\
         #[allow(non_upper_case_globals)]\npub mod typed {\n    use super::*;\n",
    );
    for (_, k) in &all {
        let _ = writeln!(
            s,
            "    pub const {n}: Typed<sig::{n}> = Typed {{ kernel: Kernel::{n}, launch: super::{n} }};",
            n = k.name
        );
    }
    s.push_str("}\n");
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sig(src: &str) -> Vec<KernelSig> {
        parse_kernels(src).unwrap()
    }

    fn tys(k: &KernelSig) -> Vec<(&str, ParamTy)> {
        k.params.iter().map(|p| (p.name.as_str(), p.ty)).collect()
    }

    #[test]
    fn plain_and_bounded_kernels() {
        let ks = sig("// QW_KERNEL void commented(int a) {}\n\
             QW_KERNEL void a(const float* __restrict__ x, int n, long long m) { }\n\
             /* QW_KERNEL void b(int) */\n\
             QW_KERNEL void QW_BOUNDS_MIN(512 / HPW, 1) b(unsigned long long seed, float s,\n\
                 unsigned int* out, const uint4* __restrict__ p) {}\n\
             __device__ void helper(int x) {}\n");
        assert_eq!(ks.len(), 2);
        assert_eq!(
            tys(&ks[0]),
            [
                ("x", ParamTy::Ptr),
                ("n", ParamTy::I32),
                ("m", ParamTy::I64)
            ]
        );
        assert_eq!(
            tys(&ks[1]),
            [
                ("seed", ParamTy::U64),
                ("s", ParamTy::F32),
                ("out", ParamTy::Ptr),
                ("p", ParamTy::Ptr)
            ]
        );
        assert_eq!(ks[1].params[2].decl, "unsigned int* out");
    }

    #[test]
    fn macro_instantiated_kernels() {
        let ks = sig("#define K(NAME, T, N) \\\n\
               QW_KERNEL void QW_BOUNDS(N * 32) NAME(const T* __restrict__ in, T* out, int n) { \\\n\
                 body<T, N>(in, out, n); \\\n\
               }\n\
             #define NOT_A_KERNEL(x) x\n\
             K(k_f32, float, 4)\n\
             K(k_bf16, bf16_t, 8)\n");
        assert_eq!(
            ks.iter().map(|k| k.name.as_str()).collect::<Vec<_>>(),
            ["k_f32", "k_bf16"]
        );
        assert_eq!(
            tys(&ks[1]),
            [
                ("in", ParamTy::Ptr),
                ("out", ParamTy::Ptr),
                ("n", ParamTy::I32)
            ]
        );
        assert_eq!(ks[1].params[0].decl, "const bf16_t* __restrict__ in");
    }

    #[test]
    fn branches_must_agree() {
        let same =
            "#if A\nQW_KERNEL void k(int n) {}\n#else\nQW_KERNEL void k(int n) { x(); }\n#endif\n";
        assert_eq!(sig(same).len(), 1);
        let differ =
            "#if A\nQW_KERNEL void k(int n) {}\n#else\nQW_KERNEL void k(long long n) {}\n#endif\n";
        assert!(
            parse_kernels(differ)
                .unwrap_err()
                .contains("different parameters")
        );
        let unknown = "QW_KERNEL void k(double d) {}";
        assert!(
            parse_kernels(unknown)
                .unwrap_err()
                .contains("no Rust type for `double`")
        );
    }

    fn real_kernels() -> Vec<(String, Vec<KernelSig>)> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels");
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "cu"))
            .collect();
        files.sort();
        assert!(
            files.len() >= 10,
            "kernel sources not found in {}",
            dir.display()
        );
        files
            .iter()
            .map(|f| {
                let stem = f.file_stem().unwrap().to_string_lossy().into_owned();
                let ks = parse_kernels(&std::fs::read_to_string(f).unwrap())
                    .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
                assert!(!ks.is_empty(), "{}: no kernels", f.display());
                (stem, ks)
            })
            .collect()
    }

    /// Every kernel of every source parses to a typed launch, names unique.
    #[test]
    fn real_sources_parse() {
        let mods = real_kernels();
        let src = rust_launches(&mods).unwrap();
        let mut n = 0;
        for (stem, ks) in &mods {
            let text = std::fs::read_to_string(
                std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join(format!("../../kernels/{stem}.cu")),
            )
            .unwrap();
            for k in ks {
                assert!(!k.params.is_empty(), "{}", k.name);
                // Every parameter name occurs in the source text (so the
                // macro substitution did not invent one).
                for p in &k.params {
                    assert!(text.contains(&p.name), "{}: {}", k.name, p.name);
                }
                assert!(src.contains(&format!("pub fn {}(dev: &Device, launch: Launch", k.name)));
                n += 1;
            }
        }
        assert!(n >= 90, "only {n} kernels found");
        let find = |name: &str| {
            mods.iter()
                .flat_map(|(_, ks)| ks)
                .find(|k| k.name == name)
                .unwrap_or_else(|| panic!("{name} not found"))
        };
        // Written out, with QW_BOUNDS.
        let (ptr, int) = (ParamTy::Ptr, ParamTy::I32);
        assert_eq!(
            tys(find("attn_wg_plan")),
            [
                ("T", int),
                ("G", int),
                ("nkv", int),
                ("pos0", int),
                ("ctas", int),
                ("plan", ptr)
            ]
        );
        assert_eq!(
            tys(find("add_inplace")),
            [("x", ptr), ("y", ptr), ("n", ParamTy::I64)]
        );
        assert_eq!(
            tys(find("fill_alog_f32")),
            [("p", ptr), ("n", ParamTy::I64), ("seed", ParamTy::U64)]
        );
        // Instantiated by macros (ATTN_PREP, ATTN_FLASH_WG), and defined in
        // two preprocessor branches (moe_gemm.cu).
        for k in [
            "attn_prep_bf16",
            "attn_prep_f32",
            "attn_flash_wg_bf16_d32",
            "moe_gemm_split128_wg256",
        ] {
            find(k);
        }
        assert_eq!(tys(find("attn_prep_bf16")), tys(find("attn_prep_f32")));
        assert_eq!(
            find("attn_prep_bf16").params[5].decl,
            "bf16_t* __restrict__ kc"
        );
        assert_eq!(
            find("attn_prep_f32").params[5].decl,
            "float* __restrict__ kc"
        );
        assert_eq!(find("attn_flash_wg_f32_d256").params.len(), 16);
    }
}
