//! What a raw-text tool parameter may say: the regexes (llguidance's Lark
//! `/…/` dialect) that its value must match whole, from its schema's
//! `minLength`/`maxLength`, `pattern` and `format`.
//!
//! In JSON these keywords are llguidance's business; a raw-text value is
//! not JSON, so they are turned into regexes here. `pattern` is read as
//! llguidance reads it in a JSON schema (Rust `regex` syntax, `\d` and `\w`
//! ASCII) with JSON Schema's search semantics: the value must contain a
//! match unless the pattern is anchored with a leading `^` / trailing `$`.
//! The formats are written after their RFCs (RFC 3339 `date-time`, `date`,
//! `time`, `duration`; RFC 5321 `email`; RFC 1123 `hostname`; `ipv4`,
//! `ipv6`, RFC 4122 `uuid`); where a format's full language is not regular
//! or not worth it (an `email`'s 64-byte local part), the regex allows a
//! subset, never more.

use regex_syntax::hir::{Hir, HirKind, Look};
use serde_json::{Map, Value};

/// Why a keyword cannot be enforced on raw text.
pub struct Unenforceable {
    pub keyword: &'static str,
    pub why: String,
}

/// The regexes a value must match (all of them), and the keywords that
/// cannot be enforced.
pub fn value_regexes(schema: &Map<String, Value>) -> (Vec<String>, Vec<Unenforceable>) {
    let (mut rx, mut bad) = (Vec::new(), Vec::new());
    let bound = |k: &str| schema.get(k).and_then(Value::as_u64);
    let (lo, hi) = (bound("minLength").unwrap_or(0), bound("maxLength"));
    match hi {
        Some(hi) => rx.push(format!("(?s:.{{{lo},{}}})", hi.max(lo))),
        None if lo > 0 => rx.push(format!("(?s:.{{{lo},}})")),
        None => {}
    }
    match schema.get("pattern") {
        None => {}
        Some(Value::String(p)) => match search(p) {
            Ok(r) => rx.push(r),
            Err(why) => bad.push(Unenforceable {
                keyword: "pattern",
                why,
            }),
        },
        Some(_) => bad.push(Unenforceable {
            keyword: "pattern",
            why: "'pattern' must be a string".into(),
        }),
    }
    match schema.get("format") {
        None => {}
        Some(Value::String(f)) => match format(f) {
            Some(rs) => rx.extend(rs.iter().map(|r| r.to_string())),
            None => bad.push(Unenforceable {
                keyword: "format",
                why: format!("the format '{f}' cannot be enforced on a raw-text parameter"),
            }),
        },
        Some(_) => bad.push(Unenforceable {
            keyword: "format",
            why: "'format' must be a string".into(),
        }),
    }
    (rx, bad)
}

/// A JSON-schema `pattern` as a regex over the whole value: `.*` around it
/// where it is not anchored.
pub fn search(pattern: &str) -> Result<String, String> {
    // llguidance's own reading of a JSON-schema pattern: `\d`/`\w` ASCII.
    let rx = llguidance::regex_to_lark(pattern, "dw");
    let mut hir = regex_syntax::ParserBuilder::new()
        .build()
        .parse(&rx)
        .map_err(|e| format!("'pattern' is not a valid regex: {e}"))?;
    while let HirKind::Capture(c) = hir.kind() {
        hir = (*c.sub).clone();
    }
    let mut parts = match hir.kind() {
        HirKind::Concat(parts) => parts.clone(),
        _ => vec![hir],
    };
    let is = |h: &Hir, l: Look| matches!(h.kind(), HirKind::Look(x) if *x == l);
    let mut start = false;
    while parts.first().is_some_and(|h| is(h, Look::Start)) {
        parts.remove(0);
        start = true;
    }
    let mut end = false;
    while parts.last().is_some_and(|h| is(h, Look::End)) {
        parts.pop();
        end = true;
    }
    let middle = Hir::concat(parts);
    if !middle.properties().look_set().is_empty() {
        return Err(format!(
            "'pattern' {pattern:?} uses an assertion ({:?}) other than a leading '^' or a trailing '$', which cannot be enforced",
            middle.properties().look_set()
        ));
    }
    let any = "(?s:.*)";
    Ok(format!(
        "{}(?:{}){}",
        if start { "" } else { any },
        lark_escape(&middle.to_string()),
        if end { "" } else { any }
    ))
}

/// A regex made fit for a Lark `/…/` literal.
fn lark_escape(rx: &str) -> String {
    let mut out = String::with_capacity(rx.len());
    for c in rx.chars() {
        match c {
            '/' => out.push_str(r"\/"),
            '\n' => out.push_str(r"\n"),
            '\r' => out.push_str(r"\r"),
            c => out.push(c),
        }
    }
    out
}

const H16: &str = "[0-9a-fA-F]{1,4}";

/// The regexes (all must match) of a string `format`; `None`: not supported.
pub fn format(name: &str) -> Option<Vec<String>> {
    let leap = "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)";
    let date = format!(
        "(?:[0-9]{{4}}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))|{leap}-02-29)"
    );
    // Leap seconds (:60) only at 23:59 UTC: left out.
    let time = "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]+)?(?:[zZ]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])";
    let label = "[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?";
    let octet = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])";
    let atext = r"[a-zA-Z0-9!#$%&'*+\-\/=?^_`{|}~]";
    let one = |r: String| Some(vec![r]);
    match name {
        "date" => one(date),
        "time" => one(time.into()),
        "date-time" => one(format!("{date}[tT]{time}")),
        "duration" => {
            let (s, m, h) = (
                "[0-9]+S",
                "[0-9]+M(?:[0-9]+S)?",
                "[0-9]+H(?:[0-9]+M(?:[0-9]+S)?)?",
            );
            let t = format!("T(?:{h}|{m}|{s})");
            let (d, mo, y) = (
                "[0-9]+D",
                "[0-9]+M(?:[0-9]+D)?",
                "[0-9]+Y(?:[0-9]+M(?:[0-9]+D)?)?",
            );
            one(format!("P(?:(?:{d}|{mo}|{y})(?:{t})?|{t}|[0-9]+W)"))
        }
        // Local part at most 32 + 2 × 16 bytes (≤ 64), domain at most
        // three labels (≤ 191 bytes).
        "email" => one(format!(
            "{atext}{{1,32}}(?:\\.{atext}{{1,15}}){{0,2}}@{label}(?:\\.{label}){{0,2}}"
        )),
        "hostname" => Some(vec![
            format!("{label}(?:\\.{label})*"),
            "(?s:.{1,253})".into(),
        ]),
        "ipv4" => one(format!("{octet}(?:\\.{octet}){{3}}")),
        "ipv6" => {
            let g = format!("{H16}:");
            let alts = [
                format!("(?:{g}){{7}}{H16}"),
                format!("(?:{g}){{1,7}}:"),
                format!("(?:{g}){{1,6}}:{H16}"),
                format!("(?:{g}){{1,5}}(?::{H16}){{1,2}}"),
                format!("(?:{g}){{1,4}}(?::{H16}){{1,3}}"),
                format!("(?:{g}){{1,3}}(?::{H16}){{1,4}}"),
                format!("(?:{g}){{1,2}}(?::{H16}){{1,5}}"),
                format!("{g}(?::{H16}){{1,6}}"),
                format!(":(?::{H16}){{1,7}}"),
                "::".into(),
            ];
            one(format!("(?:{})", alts.join("|")))
        }
        "uuid" => one(
            "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}".into(),
        ),
        _ => None,
    }
}
