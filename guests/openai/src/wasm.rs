//! The component glue: the SDK's `wasi:http` export and its host (the
//! `qwasi:inference` engine plus `wasi:random` for ids).

use qwasi_guest_sdk::api::{HostEngine, HttpGuest, WasiOutput};
use qwasi_guest_sdk::{ApiError, Request};

use crate::api;

struct OpenAi;

impl HttpGuest for OpenAi {
    fn handle(req: Request, out: &mut WasiOutput) -> Result<(), ApiError> {
        api::handle(&HostEngine, req, out);
        Ok(())
    }
}

qwasi_guest_sdk::export_http!(OpenAi);
