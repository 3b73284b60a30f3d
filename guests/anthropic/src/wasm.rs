//! The component glue: the SDK's `wasi:http` export over its host.

use qwasi_guest_sdk::api::{HostEngine, HttpGuest, WasiOutput};
use qwasi_guest_sdk::{ApiError, Request};

struct Anthropic;

impl HttpGuest for Anthropic {
    fn handle(req: Request, out: &mut WasiOutput) -> Result<(), ApiError> {
        crate::api::handle(&HostEngine, req, out);
        Ok(())
    }
}

qwasi_guest_sdk::export_http!(Anthropic);
