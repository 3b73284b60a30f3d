//! wit-bindgen glue (wasm32 only). The wasi interfaces map to the `wasip2`
//! crate so `wasip2::http::types` is what `handle` receives.
//!
//! `../wit/qwasi.wit` is `wit/qwasi.wit` with one fix: the contract's
//! `inference` interface declares both `use types.{model-info}` and
//! `model-info: func() -> model-info`, a name clash wit-parser rejects. The
//! copy imports the record as `model-info as model-information`; the
//! function, its name and the wire types are unchanged (component-model
//! records are structural). `../wit/deps` links to the repository's deps.
//! Once the contract is fixed, point `path` at `../../wit` and delete the copy.

wit_bindgen::generate!({
    path: "wit",
    world: "qwasi:inference/api",
    with: {
        "wasi:io/poll@0.2.12": wasip2::io::poll,
        "wasi:io/error@0.2.12": wasip2::io::error,
        "wasi:io/streams@0.2.12": wasip2::io::streams,
        "wasi:clocks/monotonic-clock@0.2.12": wasip2::clocks::monotonic_clock,
        "wasi:http/types@0.2.12": wasip2::http::types,
    },
});
