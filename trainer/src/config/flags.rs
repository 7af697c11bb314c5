//! The `tern train` flags, generated from the settings table
//! ([`super::settings`]): one optional flag per setting, its help the
//! setting's doc with the default stated from the same definition, and the
//! code that writes the given flags over a config (flags win over the file).
//!
//! The generator is a macro the binary expands ([`train_flags!`]), so clap
//! stays in the binary and the trainer never depends on it.

use serde::Serialize;

/// Defines `TrainFlags` where it is invoked: a `clap::Args` struct with every
/// training setting as an optional flag (`group_size` = `--group-size`), and
/// `TrainFlags::apply_to`, which writes the flags given over a config.
///
/// The invoking crate must depend on clap (with `derive`); the trainer does
/// not.
#[macro_export]
macro_rules! train_flags {
    () => {
        $crate::__with_train_settings!(__train_flags);
    };
}

/// The flag generator behind [`train_flags!`]: a muncher over the settings
/// table that collects one clap field and what it writes per flag, one
/// entry per step (so a table of a few hundred flags stays within rustc's
/// macro recursion limit).
///
/// An entry `name: Type = default` is one flag named for it: a switch for
/// `bool`, an optional value for `Option<T>` (given, it sets `Some`), an
/// optional value of `Type` otherwise. An entry with `flags { ... }` has
/// those flags instead, each `flag: Type => path.to.field` (`= value` for a
/// switch: what it sets). Each flag's help is its doc with the default
/// stated from `TrainConfig::default()`.
#[doc(hidden)]
#[macro_export]
macro_rules! __train_flags {
    // Every entry read: the struct and its `apply_to`.
    (@acc [$($fields:tt)*] [$($how:ident $flag:ident ($($path:ident).+) ($($set:tt)*);)*]) => {
        /// Every training setting as an optional flag: given ones override
        /// the TOML file (or a resumed run's saved config), which overrides
        /// the defaults.
        #[derive(Debug, clap::Args)]
        pub struct TrainFlags {
            $($fields)*
        }

        impl TrainFlags {
            /// Writes every flag given over `c`.
            pub fn apply_to(&self, c: &mut $crate::config::settings::TrainConfig) {
                $($crate::__train_flags!(@apply $how self c $flag ($($path).+) ($($set)*));)*
            }
        }
    };
    // A setting with its own list of flags: read them in its place.
    (@acc [$($f:tt)*] [$($a:tt)*]
        $(#[doc = $doc:literal])* $name:ident : $ty:ty = $default:expr,
        flags { $($inner:tt)* };
        $($rest:tt)*
    ) => {
        $crate::__train_flags!(@acc [$($f)*] [$($a)*] $($inner)* $($rest)*);
    };
    // A `bool` setting: a switch that turns it on.
    (@acc [$($f:tt)*] [$($a:tt)*]
        $(#[doc = $doc:literal])* $name:ident : bool = $default:expr $(, [$($attr:tt)*])?;
        $($rest:tt)*
    ) => {
        $crate::__train_flags!(@acc
            [$($f)*
                #[arg(long, $($($attr)*,)?
                    help = $crate::__train_flags!(@help [$($doc),*] $name),
                    long_help = $crate::__train_flags!(@long_help [$($doc),*] $name))]
                pub $name: bool,
            ]
            [$($a)* switch $name ($name) (true);]
            $($rest)*
        );
    };
    // An optional setting: given, the flag sets `Some(value)`.
    (@acc [$($f:tt)*] [$($a:tt)*]
        $(#[doc = $doc:literal])* $name:ident : Option<$inner:ty> = $default:expr
            $(, [$($attr:tt)*])?;
        $($rest:tt)*
    ) => {
        $crate::__train_flags!(@acc
            [$($f)*
                #[arg(long, $($($attr)*,)?
                    help = $crate::__train_flags!(@help [$($doc),*] $name),
                    long_help = $crate::__train_flags!(@long_help [$($doc),*] $name))]
                pub $name: Option<$inner>,
            ]
            [$($a)* some $name ($name) ();]
            $($rest)*
        );
    };
    // Any other setting: given, the flag sets the value.
    (@acc [$($f:tt)*] [$($a:tt)*]
        $(#[doc = $doc:literal])* $name:ident : $ty:ty = $default:expr $(, [$($attr:tt)*])?;
        $($rest:tt)*
    ) => {
        $crate::__train_flags!(@acc
            [$($f)*
                #[arg(long, $($($attr)*,)?
                    help = $crate::__train_flags!(@help [$($doc),*] $name),
                    long_help = $crate::__train_flags!(@long_help [$($doc),*] $name))]
                pub $name: Option<$ty>,
            ]
            [$($a)* value $name ($name) ();]
            $($rest)*
        );
    };
    // A listed switch: sets the field it names to its value.
    (@acc [$($f:tt)*] [$($a:tt)*]
        $(#[doc = $doc:literal])* $flag:ident : bool => $($path:ident).+ = $set:expr
            $(, [$($attr:tt)*])?;
        $($rest:tt)*
    ) => {
        $crate::__train_flags!(@acc
            [$($f)*
                #[arg(long, $($($attr)*,)?
                    help = $crate::__train_flags!(@help [$($doc),*] ($($path).+ == $set)),
                    long_help = $crate::__train_flags!(@long_help [$($doc),*] ($($path).+ == $set)))]
                pub $flag: bool,
            ]
            [$($a)* switch $flag ($($path).+) ($set);]
            $($rest)*
        );
    };
    // A listed optional value: sets `Some(value)` in the field it names.
    (@acc [$($f:tt)*] [$($a:tt)*]
        $(#[doc = $doc:literal])* $flag:ident : Option<$inner:ty> => $($path:ident).+
            $(, [$($attr:tt)*])?;
        $($rest:tt)*
    ) => {
        $crate::__train_flags!(@acc
            [$($f)*
                #[arg(long, $($($attr)*,)?
                    help = $crate::__train_flags!(@help [$($doc),*] $($path).+),
                    long_help = $crate::__train_flags!(@long_help [$($doc),*] $($path).+))]
                pub $flag: Option<$inner>,
            ]
            [$($a)* some $flag ($($path).+) ();]
            $($rest)*
        );
    };
    // A listed value: sets the field it names.
    (@acc [$($f:tt)*] [$($a:tt)*]
        $(#[doc = $doc:literal])* $flag:ident : $ty:ty => $($path:ident).+
            $(, [$($attr:tt)*])?;
        $($rest:tt)*
    ) => {
        $crate::__train_flags!(@acc
            [$($f)*
                #[arg(long, $($($attr)*,)?
                    help = $crate::__train_flags!(@help [$($doc),*] $($path).+),
                    long_help = $crate::__train_flags!(@long_help [$($doc),*] $($path).+))]
                pub $flag: Option<$ty>,
            ]
            [$($a)* value $flag ($($path).+) ();]
            $($rest)*
        );
    };
    // What a given flag writes (`self` and `c` passed in from `apply_to`).
    (@apply switch $s:ident $c:ident $flag:ident ($($path:ident).+) ($set:expr)) => {
        if $s.$flag {
            $c.$($path).+ = $set;
        }
    };
    (@apply some $s:ident $c:ident $flag:ident ($($path:ident).+) ()) => {
        if let Some(v) = &$s.$flag {
            $c.$($path).+ = Some(v.clone());
        }
    };
    (@apply value $s:ident $c:ident $flag:ident ($($path:ident).+) ()) => {
        if let Some(v) = &$s.$flag {
            $c.$($path).+ = v.clone();
        }
    };
    // A flag's help and long help, the default read off the config's.
    (@help [$($doc:literal),*] $($default:tt)+) => {
        $crate::config::flags::help(
            &[$($doc),*],
            &$crate::config::flags::shown(&$crate::__train_flags!(@default $($default)+)),
        )
    };
    (@long_help [$($doc:literal),*] $($default:tt)+) => {
        clap::builder::Resettable::from(
            $crate::config::flags::long_help(
                &[$($doc),*],
                &$crate::config::flags::shown(&$crate::__train_flags!(@default $($default)+)),
            )
            .map(clap::builder::StyledStr::from),
        )
    };
    (@default ($($path:ident).+ == $set:expr)) => {
        ($crate::config::settings::TrainConfig::default().$($path).+ == $set)
    };
    (@default $($path:ident).+) => {
        $crate::config::settings::TrainConfig::default().$($path).+
    };
    // The table, as `__with_train_settings` hands it over.
    ($($table:tt)*) => {
        $crate::__train_flags!(@acc [] [] $($table)*);
    };
}

/// A flag's short help: its doc's first paragraph (lines joined, the final
/// period dropped, as clap's derive does) and ` [default: X]`.
pub fn help(doc: &[&str], default: &str) -> String {
    let mut first = paragraphs(doc).into_iter().next().unwrap_or_default();
    if first.ends_with('.') && !first.ends_with("..") {
        first.pop();
    }
    format!("{first} [default: {default}]")
}

/// A flag's long help (`--help`), where its doc has more than one paragraph:
/// the short help, then the other paragraphs.
pub fn long_help(doc: &[&str], default: &str) -> Option<String> {
    let paragraphs = paragraphs(doc);
    (paragraphs.len() > 1).then(|| {
        std::iter::once(help(doc, default))
            .chain(paragraphs.into_iter().skip(1))
            .collect::<Vec<_>>()
            .join("\n\n")
    })
}

/// A default as the help states it: the value as the TOML file spells it
/// (strings bare), `unset` for an absent or empty one.
pub fn shown<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) if !s.is_empty() => s,
        Ok(serde_json::Value::Array(a)) if !a.is_empty() => serde_json::Value::Array(a).to_string(),
        Ok(v @ (serde_json::Value::Bool(_) | serde_json::Value::Number(_))) => v.to_string(),
        _ => "unset".into(),
    }
}

/// Doc-comment lines (`#[doc]` strings, each with its leading space) as
/// paragraphs, each paragraph's lines trimmed and joined by spaces.
fn paragraphs(doc: &[&str]) -> Vec<String> {
    doc.split(|line| line.trim().is_empty())
        .filter(|p| !p.is_empty())
        .map(|p| p.iter().map(|l| l.trim()).collect::<Vec<_>>().join(" "))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_states_the_default_after_the_first_paragraph() {
        let doc = [
            " Hard cap on peak memory,",
            " e.g. 2GiB.",
            "",
            " More here.",
        ];
        assert_eq!(
            help(&doc, "unset"),
            "Hard cap on peak memory, e.g. 2GiB [default: unset]"
        );
        assert_eq!(
            long_help(&doc, "unset").as_deref(),
            Some("Hard cap on peak memory, e.g. 2GiB [default: unset]\n\nMore here.")
        );
        assert_eq!(long_help(&[" LoRA rank."], "8"), None);
    }

    #[test]
    fn defaults_are_shown_as_the_toml_spells_them() {
        assert_eq!(shown(&8usize), "8");
        assert_eq!(shown(&2e-4f64), "0.0002");
        assert_eq!(shown(&"all"), "all");
        assert_eq!(shown(&None::<usize>), "unset");
        assert_eq!(shown(&std::path::PathBuf::new()), "unset");
        assert_eq!(shown(&Vec::<String>::new()), "unset");
        assert_eq!(shown(&true), "true");
        assert_eq!(shown(&crate::config::choices::Algorithm::Grpo), "grpo");
    }
}
