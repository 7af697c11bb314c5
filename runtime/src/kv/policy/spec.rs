//! Spec strings: the one written form of a [`KvPolicy`], read by `FromStr`,
//! printed by `Display`, and used by serde, so CLI flags, request fields, config
//! files and training logs all name a policy the same way.
//!
//! Grammar: `name` or `name:key=value,key=value,...`, e.g. `full`,
//! `streaming:budget=256,sink=4`, `h2o:budget=256,recent=32`,
//! `snapkv:budget=256,window=8,kernel=7,pool=max`, `pyramidkv:budget=256,window=8`,
//! `rkv:budget=256,window=8,kernel=7,alpha=0.1,every=128`, `keydiff:budget=256,window=8`,
//! `expected:budget=256,n_future=512,cov=pair`,
//! `adakv:inner=snapkv,floor=0.2,budget=256,window=32,kernel=5,pool=avg` (Ada-KV takes
//! `inner` and `floor`, and every key of its inner policy). Any budgeted policy
//! takes a relative budget, a share of the sequence's current length with a
//! floor in tokens: `rkv:budget=50%,min_budget=64` (the share in `(0%, 100%]`;
//! `min_budget` is required with a share and refused without one; see
//! `relative.rs`). Keys may come in any
//! order, missing keys take their defaults, spaces around names, keys and values
//! and empty items are ignored. `Display` prints every key in a fixed order, so
//! printing then parsing gives the same policy back.
//!
//! Owns the grammar around the items; the names come from the registry
//! ([`KvPolicy::SPECS`]), each policy's keys, defaults, checks and printing
//! from its own file, the items from `items.rs`.

use std::fmt;
use std::str::FromStr;

use super::{relative, KvPolicy, PolicyError};

impl FromStr for KvPolicy {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, PolicyError> {
        let (name, body) = match s.split_once(':') {
            Some((name, body)) => (name.trim(), body),
            None => (s.trim(), ""),
        };
        let Some(spec) = KvPolicy::SPECS.iter().find(|spec| spec.name == name) else {
            return Err(PolicyError::UnknownPolicy(name.to_string()));
        };
        let policy = match relative::parse(spec.name, body)? {
            Some(relative) => relative,
            None => KvPolicy::parse_named(spec.name, body)?,
        };
        policy.validate()?;
        Ok(policy)
    }
}

impl fmt::Display for KvPolicy {
    /// The canonical spec: every key, in the order of the policy's keys.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.fmt_spec(f)
    }
}

impl serde::Serialize for KvPolicy {
    /// As the canonical spec string.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for KvPolicy {
    /// From a spec string, with [`PolicyError`]'s message on failure.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let spec = String::deserialize(deserializer)?;
        spec.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{RkvParams, SnapKvParams, StreamingParams};
    use super::*;

    fn parse(s: &str) -> Result<KvPolicy, PolicyError> {
        s.parse()
    }

    fn err(s: &str) -> String {
        match parse(s) {
            Ok(p) => panic!("`{s}` parsed as {p:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn defaults_print_canonically() {
        let cases = [
            ("full", "full"),
            ("streaming", "streaming:budget=256,sink=4"),
            ("h2o", "h2o:budget=256,recent=128,every=1,prefill=true"),
            ("h2o:budget=100", "h2o:budget=100,recent=50,every=1,prefill=true"),
            ("h2o:budget=1", "h2o:budget=1,recent=0,every=1,prefill=true"),
            (
                "snapkv",
                "snapkv:budget=256,window=8,kernel=7,pool=max,every=128,prefill=true",
            ),
            (
                "pyramidkv",
                "pyramidkv:budget=256,window=8,kernel=7,pool=max,min_ratio=0.5,every=128,prefill=true",
            ),
            (
                "rkv",
                "rkv:budget=256,window=8,kernel=7,alpha=0.1,every=128,prefill=false",
            ),
            ("keydiff", "keydiff:budget=256,window=8,every=128,prefill=true"),
            (
                "adakv",
                "adakv:inner=snapkv,floor=0.2,budget=256,window=8,kernel=7,pool=max,every=128,prefill=true",
            ),
            (
                "expected",
                "expected:budget=256,window=8,n_future=512,sink=4,cov=pair,epsilon=0,every=128,prefill=true",
            ),
            (
                "adakv:inner=h2o",
                "adakv:inner=h2o,floor=0.2,budget=256,recent=128,every=1,prefill=true",
            ),
        ];
        for (short, canonical) in cases {
            let p = parse(short).unwrap();
            assert_eq!(p.to_string(), canonical);
            assert_eq!(parse(canonical).unwrap(), p);
        }
        assert_eq!(parse("full").unwrap(), KvPolicy::default());
        assert_eq!(
            parse("snapkv").unwrap(),
            KvPolicy::SnapKv(SnapKvParams::default())
        );
    }

    #[test]
    fn design_examples_round_trip() {
        for spec in [
            "full",
            "streaming:budget=256,sink=4",
            "h2o:budget=256,recent=32",
            "snapkv:budget=256,window=8,kernel=7,pool=max",
            "pyramidkv:budget=256,window=8",
            "rkv:budget=256,window=8,kernel=7,alpha=0.1,every=128",
            "rkv:budget=512,window=8,every=128",
        ] {
            let p = parse(spec).unwrap();
            assert_eq!(parse(&p.to_string()).unwrap(), p, "{spec}");
            assert!(p.to_string().starts_with(spec.split(',').next().unwrap()));
        }
        // A spec that already names every key prints back unchanged.
        let rkv = "rkv:budget=256,window=8,kernel=7,alpha=0.1,every=128,prefill=false";
        assert_eq!(parse(rkv).unwrap().to_string(), rkv);
    }

    #[test]
    fn non_default_values_round_trip() {
        for spec in [
            "streaming:budget=10,sink=0",
            "h2o:budget=64,recent=0,every=16,prefill=false",
            "snapkv:budget=100,window=4,kernel=1,pool=avg,every=3,prefill=false",
            "pyramidkv:budget=100,window=4,kernel=5,pool=avg,min_ratio=0.3,every=16,prefill=false",
            "rkv:budget=512,window=16,kernel=3,alpha=0.25,every=64,prefill=true",
            "rkv:budget=512,window=16,kernel=3,alpha=0,every=64,prefill=false",
            "rkv:budget=512,window=16,kernel=3,alpha=1,every=64,prefill=false",
            "rkv:budget=512,window=16,kernel=3,alpha=0.3333333,every=64,prefill=false",
            "keydiff:budget=64,window=1,every=1,prefill=false",
            "adakv:inner=snapkv,floor=0.2,budget=256,window=32,kernel=5,pool=avg,every=128,prefill=true",
            "adakv:inner=pyramidkv,floor=0,budget=100,window=4,kernel=5,pool=avg,min_ratio=0.3,every=16,prefill=false",
            "adakv:inner=h2o,floor=1,budget=64,recent=32,every=4,prefill=false",
            "adakv:inner=keydiff,floor=0.35,budget=64,window=8,every=32,prefill=true",
            "expected:budget=128,window=0,n_future=64,sink=0,cov=none,epsilon=0.01,every=32,prefill=false",
            "expected:budget=512,window=16,n_future=1,sink=8,cov=full,epsilon=0,every=1,prefill=true",
        ] {
            let p = parse(spec).unwrap();
            assert_eq!(p.to_string(), spec);
            assert_eq!(parse(&p.to_string()).unwrap(), p);
        }
    }

    #[test]
    fn keys_in_any_order_with_spaces() {
        let a = parse(" h2o : recent = 8 , budget = 64 , ").unwrap();
        assert_eq!(a, parse("h2o:budget=64,recent=8").unwrap());
        // Ada-KV's own keys may come anywhere among its inner policy's.
        let a = parse("adakv: window=32 , inner = snapkv,budget=64, floor=0.5").unwrap();
        assert_eq!(
            a,
            parse("adakv:inner=snapkv,floor=0.5,budget=64,window=32").unwrap()
        );
        assert_eq!(parse("snapkv:").unwrap(), parse("snapkv").unwrap());
    }

    #[test]
    fn errors_name_the_key_or_value() {
        let cases = [
            (
                "xyz",
                "unknown policy `xyz` (known: full, streaming, h2o, snapkv, pyramidkv, rkv, keydiff, adakv, expected)",
            ),
            (
                "h2o:foo=1",
                "unknown key `foo` for h2o (known: budget, recent, every, prefill)",
            ),
            (
                "full:budget=3",
                "unknown key `budget` for full (known: none)",
            ),
            (
                "snapkv:budget=abc",
                "bad value `abc` for `budget`: expected a positive integer",
            ),
            (
                "streaming:budget=0",
                "bad value `0` for `budget`: expected a positive integer",
            ),
            (
                "h2o:budget=-5",
                "bad value `-5` for `budget`: expected a positive integer",
            ),
            (
                "h2o:recent=x",
                "bad value `x` for `recent`: expected a non-negative integer",
            ),
            (
                "h2o:every=0",
                "bad value `0` for `every`: expected a positive integer",
            ),
            (
                "snapkv:kernel=4",
                "bad value `4` for `kernel`: expected an odd integer from 1 to 63",
            ),
            (
                "snapkv:kernel=0",
                "bad value `0` for `kernel`: expected an odd integer from 1 to 63",
            ),
            (
                "snapkv:window=0",
                "bad value `0` for `window`: expected a positive integer",
            ),
            (
                "snapkv:pool=min",
                "bad value `min` for `pool`: expected `max` or `avg`",
            ),
            (
                "snapkv:prefill=yes",
                "bad value `yes` for `prefill`: expected `true` or `false`",
            ),
            (
                "rkv:alpha=1.5",
                "bad value `1.5` for `alpha`: expected a number in [0, 1]",
            ),
            (
                "rkv:alpha=-0.1",
                "bad value `-0.1` for `alpha`: expected a number in [0, 1]",
            ),
            (
                "rkv:alpha=nan",
                "bad value `NaN` for `alpha`: expected a number in [0, 1]",
            ),
            (
                "rkv:alpha=lots",
                "bad value `lots` for `alpha`: expected a number in [0, 1]",
            ),
            (
                "pyramidkv:min_ratio=0",
                "bad value `0` for `min_ratio`: expected a number in (0, 1]",
            ),
            (
                "pyramidkv:min_ratio=2",
                "bad value `2` for `min_ratio`: expected a number in (0, 1]",
            ),
            (
                "streaming:budget=4,sink=4",
                "`sink` = 4 must be less than `budget` = 4",
            ),
            (
                "h2o:budget=16,recent=32",
                "`recent` = 32 must be less than `budget` = 16",
            ),
            (
                "rkv:budget=8,window=8",
                "`window` = 8 must be less than `budget` = 8",
            ),
            (
                "pyramidkv:budget=16,window=8",
                "`min_ratio` = 0.5 leaves the last layer 8 tokens (budget * min_ratio), \
                 which must exceed `window` = 8",
            ),
            (
                "h2o:budget",
                "malformed parameter `budget` for h2o: expected key=value",
            ),
            ("h2o:budget=8,budget=9", "key `budget` given twice for h2o"),
            (
                "expected:cov=diag",
                "bad value `diag` for `cov`: expected `none`, `pair` or `full`",
            ),
            (
                "expected:n_future=0",
                "bad value `0` for `n_future`: expected an integer from 1 to 65536",
            ),
            (
                "expected:epsilon=-1",
                "bad value `-1` for `epsilon`: expected a finite number >= 0",
            ),
            (
                "expected:sink=x",
                "bad value `x` for `sink`: expected a non-negative integer",
            ),
            (
                "expected:every=0",
                "bad value `0` for `every`: expected a positive integer",
            ),
            (
                "expected:prefill=1",
                "bad value `1` for `prefill`: expected `true` or `false`",
            ),
            (
                "expected:budget=16,sink=4,window=12",
                "`sink + window` = 16 must be less than `budget` = 16",
            ),
            (
                "expected:kernel=3",
                "unknown key `kernel` for expected \
                 (known: budget, window, n_future, sink, cov, epsilon, every, prefill)",
            ),
            (
                "",
                "unknown policy `` (known: full, streaming, h2o, snapkv, pyramidkv, rkv, keydiff, adakv, expected)",
            ),
            (
                "adakv:inner=rkv",
                "bad value `rkv` for `inner`: expected `snapkv`, `pyramidkv`, `h2o` or `keydiff`",
            ),
            (
                "adakv:inner=adakv",
                "bad value `adakv` for `inner`: expected `snapkv`, `pyramidkv`, `h2o` or `keydiff`",
            ),
            (
                "adakv:floor=1.5",
                "bad value `1.5` for `floor`: expected a number in [0, 1]",
            ),
            (
                "adakv:floor=some",
                "bad value `some` for `floor`: expected a number in [0, 1]",
            ),
            (
                "adakv:inner=h2o,window=8",
                "unknown key `window` for adakv (known: inner, floor, budget, recent, every, prefill)",
            ),
            (
                "adakv:budget=16,window=16",
                "`window` = 16 must be less than `budget` = 16",
            ),
            (
                "adakv:kernel=4",
                "bad value `4` for `kernel`: expected an odd integer from 1 to 63",
            ),
            ("adakv:floor=0.1,floor=0.2", "key `floor` given twice for adakv"),
            ("adakv:budget=8,budget=9", "key `budget` given twice for adakv"),
            (
                "adakv:window",
                "malformed parameter `window` for adakv: expected key=value",
            ),
            (
                "keydiff:window=0",
                "bad value `0` for `window`: expected a positive integer",
            ),
            (
                "keydiff:budget=4,window=4",
                "`window` = 4 must be less than `budget` = 4",
            ),
            (
                "h2o:prefill=maybe",
                "bad value `maybe` for `prefill`: expected `true` or `false`",
            ),
        ];
        for (spec, message) in cases {
            assert_eq!(err(spec), message, "{spec}");
        }
    }

    #[test]
    fn validate_catches_hand_built_policies() {
        let p = KvPolicy::Streaming(StreamingParams { budget: 4, sink: 9 });
        assert_eq!(
            p.validate().unwrap_err().to_string(),
            "`sink` = 9 must be less than `budget` = 4"
        );
        let p = KvPolicy::Rkv(RkvParams {
            alpha: f32::INFINITY,
            ..RkvParams::default()
        });
        assert!(p.validate().unwrap_err().to_string().contains("`alpha`"));
        assert!(KvPolicy::Rkv(RkvParams::default()).validate().is_ok());
    }

    #[test]
    fn sizes_are_bounded_by_constants_and_by_the_context() {
        // Context-free bounds: pooling width and the future horizon.
        assert_eq!(
            err("snapkv:kernel=65"),
            "bad value `65` for `kernel`: expected an odd integer from 1 to 63"
        );
        assert!(parse("snapkv:kernel=63").is_ok());
        assert_eq!(
            err("expected:n_future=65537"),
            "bad value `65537` for `n_future`: expected an integer from 1 to 65536"
        );
        // The probe parses (window < budget) but not within a 3,000-token context.
        let probe = parse("snapkv:budget=1000000,window=999999").unwrap();
        assert_eq!(
            probe.check_context(3000).unwrap_err(),
            PolicyError::OverContext {
                key: "budget",
                value: 1_000_000,
                context_length: 3000
            }
        );
        let cases = [
            ("snapkv:budget=256,window=8", 256, None),
            ("snapkv:budget=257,window=8", 256, Some("budget")),
            ("h2o:budget=100,recent=10,every=300", 256, Some("every")),
            ("rkv:budget=200,window=8,every=128", 128, Some("budget")),
            (
                "adakv:inner=h2o,budget=64,recent=8,every=100",
                80,
                Some("every"),
            ),
            ("streaming:budget=64,sink=4", 64, None),
            ("full", 1, None),
            ("expected:budget=64,n_future=512,every=32", 64, None),
        ];
        for (spec, ctx, key) in cases {
            let got = parse(spec).unwrap().check_context(ctx).err();
            let got = got.map(|e| match e {
                PolicyError::OverContext { key, .. } => key,
                other => panic!("{spec}: {other}"),
            });
            assert_eq!(got, key, "{spec} within {ctx}");
        }
        // The window alone over the context (budget within it) names `window`.
        let p = KvPolicy::SnapKv(SnapKvParams {
            budget: 10,
            window: 20,
            ..SnapKvParams::default()
        });
        assert!(p
            .check_context(15)
            .unwrap_err()
            .to_string()
            .contains("`window` = 20"));
    }

    #[test]
    fn serde_uses_the_spec_string() {
        let p = parse("h2o:budget=64,recent=8").unwrap();
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(json, "\"h2o:budget=64,recent=8,every=1,prefill=true\"");
        assert_eq!(serde_json::from_str::<KvPolicy>(&json).unwrap(), p);
        assert_eq!(
            serde_json::from_str::<KvPolicy>("\"rkv\"").unwrap(),
            KvPolicy::Rkv(RkvParams::default())
        );
        let e = serde_json::from_str::<KvPolicy>("\"h2o:foo=1\"").unwrap_err();
        assert!(e.to_string().contains("unknown key `foo` for h2o"), "{e}");
        assert!(serde_json::from_str::<KvPolicy>("42").is_err());
    }

    #[test]
    fn relative_budgets_round_trip() {
        for (spec, canonical) in [
            (
                "rkv:budget=50%,min_budget=64",
                "rkv:budget=50%,min_budget=64,window=8,kernel=7,alpha=0.1,every=128,prefill=false",
            ),
            (
                "streaming:min_budget=32, budget = 12.5% ,sink=2",
                "streaming:budget=12.5%,min_budget=32,sink=2",
            ),
            (
                "adakv:inner=h2o,budget=100%,min_budget=16,recent=4",
                "adakv:inner=h2o,floor=0.2,budget=100%,min_budget=16,recent=4,every=1,prefill=true",
            ),
        ] {
            let p = parse(spec).unwrap();
            assert!(p.is_relative(), "{spec}");
            assert_eq!(p.to_string(), canonical);
            assert_eq!(parse(canonical).unwrap(), p);
            // Serde writes and reads the same string.
            let json = serde_json::to_string(&p).unwrap();
            assert_eq!(serde_json::from_str::<KvPolicy>(&json).unwrap(), p);
        }
        let p = parse("rkv:budget=50%,min_budget=64").unwrap();
        assert_eq!((p.name(), p.budget(), p.window()), ("rkv", Some(64), 8));
        // A budget in tokens is still a plain policy.
        assert!(!parse("rkv:budget=64").unwrap().is_relative());
    }

    #[test]
    fn bad_relative_budgets_are_clear_errors() {
        for (spec, says) in [
            ("rkv:budget=0%,min_budget=64", "bad value `0%` for `budget`"),
            (
                "rkv:budget=150%,min_budget=64",
                "bad value `150%` for `budget`",
            ),
            (
                "rkv:budget=-5%,min_budget=64",
                "bad value `-5%` for `budget`",
            ),
            ("rkv:budget=x%,min_budget=64", "bad value `x%` for `budget`"),
            ("rkv:budget=50%", "give `min_budget=N`"),
            ("rkv:budget=64,min_budget=32", "it needs `budget=P%`"),
            ("rkv:min_budget=32", "it needs `budget=P%`"),
            (
                "rkv:budget=50%,min_budget=0",
                "bad value `0` for `min_budget`",
            ),
            (
                "rkv:budget=50%,min_budget=x",
                "bad value `x` for `min_budget`",
            ),
            (
                "rkv:budget=50%,min_budget=8,window=8",
                "`window` = 8 must be less than `budget` = 8",
            ),
            (
                "rkv:budget=50%,min_budget=64,min_budget=65",
                "key `min_budget` given twice for rkv",
            ),
            (
                "full:budget=50%,min_budget=64",
                "unknown key `budget` for full",
            ),
            ("nope:budget=50%", "unknown policy `nope`"),
        ] {
            let e = err(spec);
            assert!(e.contains(says), "{spec}: {e}");
        }
        // The floor and window must fit the model's context.
        let p = parse("rkv:budget=50%,min_budget=64").unwrap();
        assert!(p.check_context(128).is_ok());
        let e = p.check_context(32).unwrap_err().to_string();
        assert!(e.contains("`budget` = 64 exceeds"), "{e}");
    }
}
