//! wit-bindgen glue (wasm32 only). The wasi interfaces map to the `wasip2`
//! crate so `wasip2::http::types` is what `handle` receives.

wit_bindgen::generate!({
    path: "../../wit",
    world: "qwasi:inference/api",
    with: {
        "wasi:io/poll@0.2.12": wasip2::io::poll,
        "wasi:io/error@0.2.12": wasip2::io::error,
        "wasi:io/streams@0.2.12": wasip2::io::streams,
        "wasi:clocks/monotonic-clock@0.2.12": wasip2::clocks::monotonic_clock,
        "wasi:http/types@0.2.12": wasip2::http::types,
    },
});
