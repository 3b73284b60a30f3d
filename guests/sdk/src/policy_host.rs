//! The `policy` world's component glue (wasm32, feature `policy`): the
//! bindings, [`crate::export_policy!`], and the `policy-config` /
//! `policy-state` imports as [`settings`] and [`HostCounter`].

/// wit-bindgen's bindings of world `qwasi:inference/policy`.
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "qwasi:inference/policy",
        pub_export_macro: true,
        export_macro_name: "export_policy_world",
        default_bindings_module: "qwasi_guest_sdk::policy_host::bindings",
    });
}

use bindings::exports::qwasi::inference::admission;
use bindings::qwasi::inference::{policy_config, policy_state};

use crate::policy::{Counter, Decision, PolicyRequest, Settings, WindowCount};

/// A policy guest: one call per request, with a fresh instance each time.
pub trait PolicyGuest {
    fn check(request: PolicyRequest) -> Decision;
}

/// Exports `$guest` (a [`PolicyGuest`]) as the component's `admission`
/// interface. Use once, at the crate root.
#[macro_export]
macro_rules! export_policy {
    ($guest:ty) => {
        struct __QwasiPolicyComponent;
        impl $crate::policy_host::bindings::exports::qwasi::inference::admission::Guest
            for __QwasiPolicyComponent
        {
            fn check(
                request: $crate::policy_host::bindings::exports::qwasi::inference::admission::RequestMeta,
            ) -> $crate::policy_host::bindings::exports::qwasi::inference::admission::Decision {
                $crate::policy_host::check::<$guest>(request)
            }
        }
        $crate::policy_host::bindings::export_policy_world!(
            __QwasiPolicyComponent with_types_in $crate::policy_host::bindings
        );
    };
}

/// What [`crate::export_policy!`] calls.
pub fn check<G: PolicyGuest>(r: admission::RequestMeta) -> admission::Decision {
    let req = PolicyRequest {
        method: r.method,
        path: r.path,
        headers: r.headers,
        remote_addr: r.remote_addr,
    };
    match G::check(req) {
        Decision::Allow(caller) => admission::Decision::Allow(caller),
        Decision::Deny(d) => admission::Decision::Deny(admission::Denial {
            status: d.status,
            code: d.code,
            message: d.message,
            retry_after: d.retry_after,
        }),
    }
}

/// The operator's settings (`policy-config.settings`).
pub fn settings() -> Settings {
    Settings::new(policy_config::settings())
}

/// [`Counter`] over `policy-state.incr`.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostCounter;

impl Counter for HostCounter {
    fn incr(&self, key: &str, window_secs: u32) -> WindowCount {
        let c = policy_state::incr(key, window_secs);
        WindowCount {
            count: c.count,
            reset_after: c.reset_after,
        }
    }
}
