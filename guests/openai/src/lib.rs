//! Qwasi's OpenAI-compatible HTTP API as a `wasi:http` component.
//!
//! Everything but `bindings`/`wasm` is plain Rust over the [`host::Host`]
//! and [`host::Sink`] traits, so it builds and unit-tests on the native
//! target (`cargo test -p qwasi-openai-guest`); the wasm glue implements the
//! traits over `qwasi:inference` and `wasi:http`.

pub mod api;
pub mod chat;
pub mod error;
pub mod host;
pub mod params;
pub mod sse;
pub mod stop;
pub mod template;
pub mod think;
pub mod tokens;
pub mod toolcall;

#[cfg(test)]
mod api_tests;

#[cfg(target_arch = "wasm32")]
mod bindings;
#[cfg(target_arch = "wasm32")]
mod wasm;
