//! Qwasi's OpenAI-compatible HTTP API as a `wasi:http` component.
//!
//! Everything but `wasm` is plain Rust over the [`host::Host`] trait (the
//! SDK's `Engine` plus random ids) and the SDK's `Output`, so it builds and
//! unit-tests on the native target (`cargo test -p qwasi-openai-guest`); the
//! wasm glue is the SDK's (`qwasi_guest_sdk::api`).

pub mod api;
pub mod chat;
pub mod choices;
pub mod host;
pub mod params;
pub mod pyfmt;
pub mod structured;
pub mod template;
pub mod tokens;
pub mod toolcall;

#[cfg(test)]
mod api_tests;
#[cfg(test)]
mod template_corpus;

#[cfg(target_arch = "wasm32")]
mod wasm;
