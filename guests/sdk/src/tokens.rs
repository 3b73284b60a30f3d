//! Token spellings for logprobs. The host's `id-to-token` gives the byte-level
//! BPE spelling (`"Ġthe"`); this maps it back to the raw bytes (GPT-2's
//! bytes-to-unicode table), which chat logprobs report as `bytes`.

use serde_json::Value;

/// The char that byte-level BPE uses for `b`.
pub fn byte_to_char(b: u8) -> char {
    let printable = |b: u8| {
        (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
    };
    if printable(b) {
        return b as char;
    }
    // Non-printable bytes map to U+0100.. in byte order.
    let n = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + n).expect("valid char")
}

/// The byte `c` stands for, if `c` is in the byte-level alphabet.
pub fn char_to_byte(c: char) -> Option<u8> {
    let u = c as u32;
    match u {
        0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF => Some(u as u8),
        256..=323 => {
            // The 68 non-printable bytes, in order.
            let mut n = u - 256;
            for b in 0..=255u8 {
                if byte_to_char(b) as u32 >= 256 {
                    if n == 0 {
                        return Some(b);
                    }
                    n -= 1;
                }
            }
            None
        }
        _ => None,
    }
}

/// Raw bytes of a vocabulary spelling: byte-level decoded when every char is
/// in the alphabet, else the spelling's own UTF-8 (added tokens).
pub fn spelling_to_bytes(spelling: &str) -> Vec<u8> {
    spelling
        .chars()
        .map(char_to_byte)
        .collect::<Option<Vec<u8>>>()
        .unwrap_or_else(|| spelling.as_bytes().to_vec())
}

/// A logprob as JSON: f32's shortest decimal form; -inf as -9999.0 (JSON has no infinities).
pub fn logprob_json(x: f32) -> Value {
    if x.is_nan() {
        return Value::Null;
    }
    let x = if x.is_infinite() { -9999.0 } else { x };
    let f: f64 = format!("{x}").parse().unwrap_or(x as f64);
    serde_json::Number::from_f64(f)
        .map(Value::Number)
        .unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_roundtrip() {
        let mut seen = std::collections::HashSet::new();
        for b in 0..=255u8 {
            let c = byte_to_char(b);
            assert!(seen.insert(c));
            assert_eq!(char_to_byte(c), Some(b), "byte {b}");
        }
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(spelling_to_bytes("Ġhello"), b" hello");
        assert_eq!(spelling_to_bytes("<|im_end|>"), b"<|im_end|>");
        assert_eq!(spelling_to_bytes("héllo wörld"), "héllo wörld".as_bytes());
    }

    #[test]
    fn multibyte_token() {
        // "生" is E7 94 9F.
        let spelling: String = [0xE7u8, 0x94, 0x9F]
            .iter()
            .map(|&b| byte_to_char(b))
            .collect();
        assert_eq!(spelling_to_bytes(&spelling), "生".as_bytes());
        let partial: String = [0xE7u8, 0x94].iter().map(|&b| byte_to_char(b)).collect();
        assert_eq!(
            String::from_utf8_lossy(&spelling_to_bytes(&partial)),
            "\u{FFFD}"
        );
    }

    #[test]
    fn logprob_numbers() {
        assert_eq!(logprob_json(-0.1).to_string(), "-0.1");
        assert_eq!(logprob_json(f32::NEG_INFINITY).to_string(), "-9999.0");
        assert_eq!(logprob_json(f32::NAN), Value::Null);
        assert_eq!(logprob_json(0.0).to_string(), "0.0");
    }
}
