//! Qwasi's OpenAI-compatible HTTP API as a `wasi:http` component.
//!
//! Everything but `wasm` is plain Rust over the [`host::Host`] trait (the
//! SDK's `Engine` plus random ids) and the SDK's `Output`, so it builds and
//! unit-tests on the native target (`cargo test -p qwasi-openai-guest`); the
//! wasm glue is the SDK's (`qwasi_guest_sdk::api`).

pub mod api;
pub mod choices;
pub mod params;
pub mod responses;
pub mod structured;

// Chat messages, rendering, tool-call parsing and token spellings are the
// SDK's (shared with the other API guests).
pub use qwasi_guest_sdk::messages as chat;
pub use qwasi_guest_sdk::{host, template, tokens, toolcall};

#[cfg(test)]
mod api_tests;
#[cfg(test)]
mod responses_tests;
// The renderer's fixture tests take their requests through the OpenAI
// request parser, so they live here rather than in the SDK.
#[cfg(test)]
mod template_corpus;
#[cfg(test)]
mod template_tests;

#[cfg(target_arch = "wasm32")]
mod wasm;
