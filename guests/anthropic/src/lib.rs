//! Qwasi's Anthropic Messages API (`POST /v1/messages`,
//! `POST /v1/messages/count_tokens`) as a `wasi:http` component, mounted by
//! default at `/v1/messages`.
//!
//! Everything but `wasm` is plain Rust over the SDK's `Host` and `Output`
//! traits, unit-tested natively (`cargo test -p qwasi-anthropic-guest`).
//! Chat rendering, tool-call parsing, stop strings, thinking and the SSE
//! writer are the SDK's; this crate maps the API's shapes onto them.

pub mod api;
pub mod blocks;
pub mod request;

#[cfg(test)]
mod api_tests;

#[cfg(target_arch = "wasm32")]
mod wasm;
