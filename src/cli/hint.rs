//! The flag behind a runtime error. The runtime knows no flags: an error a
//! request alone cannot fix says which setting it needs (`RuntimeError::Setup`),
//! and the binary names the flag that sets it.

use tern_runtime::engine::SubmitError;
use tern_runtime::{RuntimeError, Setting};

/// How to change the setting an error in `e`'s chain needs, in this binary's
/// flags; `None` when no error in it needs one.
pub fn setup_hint(e: &anyhow::Error) -> Option<&'static str> {
    let setting = e.chain().find_map(|cause| {
        let runtime = match cause.downcast_ref::<SubmitError>() {
            Some(SubmitError::Invalid(r)) => Some(r),
            _ => cause.downcast_ref::<RuntimeError>(),
        };
        runtime.and_then(RuntimeError::setting)
    })?;
    Some(match setting {
        Setting::DraftModel => "load one with --draft-model PATH",
        Setting::KvDtype => "--kv-dtype sets it",
        Setting::SpecialTokensInContent => "--allow-special-tokens-in-content",
        Setting::ChatTemplate => "use `tern generate` without --chat",
    })
}
