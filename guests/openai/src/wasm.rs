//! The component glue: the SDK's `wasi:http` export and `qwasi:inference`
//! engine, plus `wasi:random` for response ids.

use qwasi_guest_sdk::api::{HostEngine, HttpGuest, WasiOutput, wasip2};
use qwasi_guest_sdk::{ApiError, Request};

use crate::api;
use crate::host::Host;

struct OpenAi;

impl HttpGuest for OpenAi {
    fn handle(req: Request, out: &mut WasiOutput) -> Result<(), ApiError> {
        api::handle(&HostEngine, req, out);
        Ok(())
    }
}

qwasi_guest_sdk::export_http!(OpenAi);

impl Host for HostEngine {
    fn random_hex(&self, bytes: usize) -> String {
        wasip2::random::random::get_random_bytes(bytes as u64)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}
