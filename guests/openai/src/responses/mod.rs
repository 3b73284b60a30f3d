//! `POST /v1/responses`: the Responses API, stateless.
//!
//! A request is translated into the chat request it means (`instructions`
//! and `input` items into `messages`, function tools into chat tools,
//! `max_output_tokens`, `reasoning` onto Qwen3.6's thinking switch) and
//! parsed by the chat parser, so both APIs validate and render alike. The
//! output comes from the SDK's segments: a `reasoning` item for thinking, a
//! `message` item for text and a `function_call` item per tool call, in the
//! order the model writes them, streamed as the typed event sequence.
//!
//! Nothing is stored (a guest instance lives for one request): the response
//! says `"store": false`, and `previous_response_id`, `conversation` and
//! `item_reference` inputs are refused with a 400 saying so; clients send
//! the whole conversation as `input` items instead.

mod input;
mod output;

pub use input::{parse, to_chat_body};
pub use output::{Response, run};
