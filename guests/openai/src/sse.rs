//! Server-sent events, OpenAI framing: `data: {json}\n\n` per event and a
//! final `data: [DONE]\n\n`. Events are appended to one buffer per batch so
//! the guest writes each batch with a single host call.

use serde_json::Value;

pub const DONE: &[u8] = b"data: [DONE]\n\n";

/// Appends one `data:` event to `buf`.
pub fn push_event(buf: &mut Vec<u8>, v: &Value) {
    buf.extend_from_slice(b"data: ");
    serde_json::to_writer(&mut *buf, v).expect("JSON serialises");
    buf.extend_from_slice(b"\n\n");
}

pub fn push_done(buf: &mut Vec<u8>) {
    buf.extend_from_slice(DONE);
}

/// Splits an SSE body into its `data:` payloads (for tests and clients).
pub fn parse_events(body: &str) -> Vec<&str> {
    body.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| e.strip_prefix("data: ").unwrap_or(e))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn framing() {
        let mut buf = Vec::new();
        push_event(&mut buf, &json!({"a": "x\ny"}));
        push_event(&mut buf, &json!({"b": 1}));
        push_done(&mut buf);
        let s = String::from_utf8(buf).unwrap();
        assert_eq!(
            s,
            "data: {\"a\":\"x\\ny\"}\n\ndata: {\"b\":1}\n\ndata: [DONE]\n\n"
        );
        assert_eq!(
            parse_events(&s),
            vec!["{\"a\":\"x\\ny\"}", "{\"b\":1}", "[DONE]"]
        );
    }
}
