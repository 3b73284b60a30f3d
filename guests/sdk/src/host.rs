//! What an API guest needs from its host: the [`Engine`] (the
//! `qwasi:inference` imports, with the WIT types mirrored in
//! [`crate::inference`]) plus random ids. `api.rs` implements [`Host`] for
//! `HostEngine` (wasi:random); [`crate::testing`], for the fake engine.

use crate::inference::Engine;

/// The imports of world `api` ([`Engine`]) and `wasi:random`.
pub trait Host: Engine {
    /// Random lowercase hex for response ids (wasi:random).
    fn random_hex(&self, bytes: usize) -> String;

    /// Unix seconds (wasi:clocks/wall-clock).
    fn now_unix(&self) -> u64 {
        self.now_unix_ns() / 1_000_000_000
    }
}
