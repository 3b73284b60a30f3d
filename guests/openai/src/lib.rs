#[cfg(target_arch = "wasm32")]
mod bindings;

#[cfg(target_arch = "wasm32")]
struct Guest;

#[cfg(target_arch = "wasm32")]
impl bindings::exports::wasi::http::incoming_handler::Guest for Guest {
    fn handle(_req: wasip2::http::types::IncomingRequest, out: wasip2::http::types::ResponseOutparam) {
        let info = bindings::qwasi::inference::inference::model_info();
        let resp = wasip2::http::types::OutgoingResponse::new(wasip2::http::types::Fields::new());
        let body = resp.body().unwrap();
        wasip2::http::types::ResponseOutparam::set(out, Ok(resp));
        let s = body.write().unwrap();
        s.blocking_write_and_flush(info.id.as_bytes()).unwrap();
        drop(s);
        wasip2::http::types::OutgoingBody::finish(body, None).unwrap();
    }
}

#[cfg(target_arch = "wasm32")]
bindings::export!(Guest with_types_in bindings);
