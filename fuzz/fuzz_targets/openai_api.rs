//! The OpenAI guest end to end over a scripted engine: a request (method,
//! path, body from the input) through routing, the request parsers of chat
//! completions, completions, Responses, tokenize and detokenize, prompt
//! rendering and the (streamed) answer. Checks: no panic (a trap in wasm),
//! never a 5xx, a body in the shape its content type says.
#![no_main]

use libfuzzer_sys::fuzz_target;
use qwasi_fuzz::{Input, check_response, engine};
use qwasi_guest_sdk::Request;
use qwasi_guest_sdk::testing::Recorder;

const ROUTES: [(&str, &str); 8] = [
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/responses"),
    ("POST", "/tokenize"),
    ("POST", "/detokenize"),
    ("GET", "/v1/models"),
    ("GET", "/v1/models/qwen"),
    ("GET", "/v1/responses/resp_1"),
];

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let (method, path) = ROUTES[input.byte() as usize % ROUTES.len()];
    let flags = input.byte();
    let host = engine(flags & 1 != 0, flags >> 1);
    let req = Request::from_bytes(method, path, input.rest().to_vec());
    let mut rec = Recorder::default();
    qwasi_openai_guest::api::handle(&host, req, &mut rec);
    check_response(&rec, path);
});
