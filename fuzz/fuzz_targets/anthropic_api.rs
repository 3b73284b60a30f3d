//! The Anthropic Messages guest end to end over a scripted engine: the
//! request parser of /v1/messages and /v1/messages/count_tokens, prompt
//! rendering and the (streamed) answer. Checks: no panic, never a 5xx, a body
//! in the shape its content type says.
#![no_main]

use libfuzzer_sys::fuzz_target;
use qwasi_fuzz::{Input, check_response, engine};
use qwasi_guest_sdk::Request;
use qwasi_guest_sdk::testing::Recorder;

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let flags = input.byte();
    let path = if flags & 1 != 0 {
        "/v1/messages/count_tokens"
    } else {
        "/v1/messages"
    };
    let host = engine(flags & 2 != 0, flags >> 2);
    let req = Request::from_bytes("POST", path, input.rest().to_vec())
        .with_header("anthropic-version", "2023-06-01");
    let mut rec = Recorder::default();
    qwasi_anthropic_guest::api::handle(&host, req, &mut rec);
    check_response(&rec, path);
});
