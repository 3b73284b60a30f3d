//! Host bindings for the `qwasi:inference` worlds (generated from `wit/`).

/// The `api` world: the guest exports `wasi:http/incoming-handler` (called
/// through wasmtime-wasi-http's `ProxyPre`) and imports the tokenizer and
/// inference interfaces implemented in [`super::host`].
pub mod api {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "qwasi:inference/api",
        imports: { default: async | trappable },
        exports: { default: async },
        require_store_data_send: true,
        with: {
            "wasi:io": wasmtime_wasi::p2::bindings::io,
            "wasi:clocks": wasmtime_wasi::p2::bindings::clocks,
            "wasi:http": wasmtime_wasi_http::p2::bindings::http,
            "qwasi:inference/inference.generation": crate::runtime::host::GenerationResource,
        },
    });
}

/// The `policy` world: the guest exports `admission.check` and imports
/// `policy-config` and `policy-state`.
pub mod policy {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "qwasi:inference/policy",
        imports: { default: async | trappable },
        exports: { default: async },
        require_store_data_send: true,
    });
}
