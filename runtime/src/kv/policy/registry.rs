//! The `policies!` macro, which turns the registry in `mod.rs` (one line per
//! budgeted policy: its variant and its parameters, which answer every
//! question in the policy's own file) into everything that used to repeat
//! the list of policies:
//! - [`super::KvPolicy`], `Full` first and the `Relative` wrapper last;
//! - `with_kind!`, the one static `match` through which `KvPolicy` forwards
//!   each question to the parameters it holds (no dynamic call on the cache's
//!   per-token path);
//! - [`super::KvPolicy::SPECS`], the names, keys and help the spec grammar
//!   and error messages take, and the parsing of a spec by its name.
//!
//! Knows no policy itself: what a policy is lives in `kind.rs`, each policy in
//! its file.

/// Expands the registry (see the file header). Each entry is
/// `/// doc` + `Variant(Params),` where `Params` implements `NamedPolicy`.
macro_rules! policies {
    (@expand [$( $(#[$doc:meta])* $variant:ident($params:ty), )+] $d:tt) => {
        /// A KV compression policy: what to keep and when, one value for serving and training.
        ///
        /// Written as a spec string (`full`, `h2o:budget=256,recent=32`, ...); `Display`
        /// prints the canonical spec with every key, so `p.to_string().parse() == Ok(p)`.
        /// Serde reads and writes the same string.
        #[derive(Clone, Debug, Default, PartialEq)]
        pub enum KvPolicy {
            /// Keep everything; the reference every other policy is measured against.
            #[default]
            Full,
            $( $(#[$doc])* $variant($params), )+
            /// Any of the budgeted policies above with its budget a share of the
            /// sequence's current length, never below a floor (`budget=50%,min_budget=64`):
            /// a "50%" arm keeps half however long its answers grow or shrink.
            /// Accessors answer for the floor; [`KvPolicy::at_length`] gives the policy
            /// at a length, which the cache compresses by.
            Relative(RelativeParams),
        }

        /// Evaluates `body` with `k` bound to the parameters `policy` holds
        /// (full: the unit [`Full`]), through one static `match`; `mut policy`
        /// binds them mutably.
        macro_rules! with_kind {
            (mut $d policy:expr, $d k:ident => $d body:expr) => {
                match $d policy {
                    KvPolicy::Full => {
                        let $d k = &mut Full;
                        $d body
                    }
                    $( KvPolicy::$variant($d k) => $d body, )+
                    KvPolicy::Relative($d k) => $d body,
                }
            };
            ($d policy:expr, $d k:ident => $d body:expr) => {
                match $d policy {
                    KvPolicy::Full => {
                        let $d k = &Full;
                        $d body
                    }
                    $( KvPolicy::$variant($d k) => $d body, )+
                    KvPolicy::Relative($d k) => $d body,
                }
            };
        }

        impl KvPolicy {
            /// Every named policy, in the order error messages list them: its
            /// name, the keys it takes and one line of help.
            pub const SPECS: &'static [PolicySpec] = &[
                <Full as NamedPolicy>::SPEC,
                $( <$params as NamedPolicy>::SPEC, )+
            ];

            /// The name used in spec strings, e.g. `snapkv`.
            pub fn name(&self) -> &'static str {
                match self {
                    KvPolicy::Full => <Full as NamedPolicy>::SPEC.name,
                    $( KvPolicy::$variant(_) => <$params as NamedPolicy>::SPEC.name, )+
                    KvPolicy::Relative(p) => p.inner.name(),
                }
            }

            /// The policy `name` with the items of `body` (the spec after
            /// `name:`), defaults filled in, not validated.
            fn parse_named(name: &str, body: &str) -> Result<KvPolicy, PolicyError> {
                if name == <Full as NamedPolicy>::SPEC.name {
                    return <Full as NamedPolicy>::parse(body).map(|Full| KvPolicy::Full);
                }
                $(
                    if name == <$params as NamedPolicy>::SPEC.name {
                        return <$params as NamedPolicy>::parse(body).map(KvPolicy::$variant);
                    }
                )+
                Err(PolicyError::UnknownPolicy(name.to_string()))
            }
        }
    };
    ($($list:tt)*) => {
        // `$` handed down so the expansion can define `with_kind!`.
        policies!(@expand [$($list)*] $);
    };
}
