//! What the guest needs from its host: the SDK's [`Engine`] (the
//! `qwasi:inference` imports, with the WIT types mirrored in
//! [`qwasi_guest_sdk::inference`]) plus random ids. `wasm.rs` implements
//! [`Host`] for the SDK's `HostEngine`; the tests, for a fake engine.

use qwasi_guest_sdk::inference::Engine;

/// The imports of world `api` ([`Engine`]) and `wasi:random`.
pub trait Host: Engine {
    /// Random lowercase hex for response ids (wasi:random).
    fn random_hex(&self, bytes: usize) -> String;

    /// Unix seconds (wasi:clocks/wall-clock).
    fn now_unix(&self) -> u64 {
        self.now_unix_ns() / 1_000_000_000
    }
}
