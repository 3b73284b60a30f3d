//! `qwasi-guest-sdk`: the pieces every Qwasi guest needs, so that a new API
//! or policy guest is about a page of code.
//!
//! * [`http`]: the request (method, path, query, headers, body with a size
//!   limit, JSON parsing) and the response side ([`http::Output`]: JSON and
//!   error responses).
//! * [`fields`]: a JSON body's fields, typed, errors naming the parameter.
//! * [`stream`]: a batching writer for server-sent events and NDJSON.
//! * [`inference`]: the `qwasi:inference` types as plain Rust, the
//!   [`inference::Engine`] trait over the imports, and [`inference::Run`],
//!   which turns engine events into text deltas (stop strings, usage,
//!   finish reason).
//! * [`chat`]: the Qwen3.6 (ChatML) prompt format.
//! * [`messages`]: chat messages with tool calls (the OpenAI shape every
//!   API maps onto) and the built-in Qwen3.6 renderer with tools;
//!   [`template`]: the model's own jinja chat template (minijinja), with
//!   [`pyfmt`]: Python's `str()` and `json.dumps` for what it prints.
//! * [`toolcall`]: the incremental parser of Qwen3.6 XML tool calls;
//!   [`tools`]: a request's tools and `tool_choice`.
//! * [`driver`]: engine events -> reasoning, content, tool-call events and
//!   the finish (stop strings, thinking, tool rules): what an API formats.
//! * [`segments`]: the pieces as typed output segments (reasoning, text,
//!   tool calls) opened and closed in order: content blocks, output items.
//! * [`host`]: [`host::Host`], the [`inference::Engine`] plus random ids.
//! * [`tokens`]: byte-level BPE spellings and logprob numbers.
//! * [`error`]: OpenAI-style JSON errors.
//! * [`policy`]: settings, bearer tokens and denials for admission policies.
//! * [`testing`]: a scripted [`inference::Engine`] and a recording
//!   [`http::Output`] for native unit tests of a guest.
//!
//! Everything above is plain Rust and unit-tested natively. The component
//! glue exists only on wasm32 and behind a feature naming the world:
//! `api` ([`export_http!`], `api::HostEngine`, `api::WasiOutput`) or
//! `policy` ([`export_policy!`], `policy_host::settings`,
//! `policy_host::HostCounter`). A component enables the one of its world.

pub mod chat;
pub mod driver;
pub mod error;
pub mod fields;
pub mod host;
pub mod http;
pub mod inference;
pub mod messages;
pub mod policy;
pub mod pyfmt;
pub mod segments;
pub mod stream;
pub mod template;
pub mod testing;
pub mod time;
pub mod tokens;
pub mod toolcall;
pub mod tools;

#[cfg(all(target_arch = "wasm32", feature = "api"))]
pub mod api;
#[cfg(all(target_arch = "wasm32", feature = "policy"))]
pub mod policy_host;

pub use error::ApiError;
pub use http::{Disconnected, Output, Request};
pub use stream::{Framing, StreamWriter};
