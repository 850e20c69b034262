//! Enums with command-line names: `NAMES`, `name()`, `FromStr` and
//! `Display` from one list of `Variant => "name"` pairs, so a name is
//! written once for parsing, printing and reports.

/// A name that is none of an enum's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Unknown {what} {got:?} (accepted: {accepted:?})")]
pub struct UnknownName {
    /// Which enum.
    pub what: &'static str,
    /// The name given.
    pub got: String,
    /// The names accepted.
    pub accepted: &'static [&'static str],
}

/// Gives `$t` its command-line names (`$what` names the enum in errors).
macro_rules! names {
    ($t:ty, $what:literal, $($v:ident => $n:literal),+) => {
        impl $t {
            /// Every name, in declaration order.
            pub const NAMES: &'static [&'static str] = &[$($n),+];

            /// The name used on command lines and in reports.
            pub fn name(self) -> &'static str {
                match self { $(<$t>::$v => $n),+ }
            }
        }

        impl ::std::str::FromStr for $t {
            type Err = $crate::names::UnknownName;

            fn from_str(s: &str) -> Result<Self, $crate::names::UnknownName> {
                match s {
                    $($n => Ok(<$t>::$v),)+
                    _ => Err($crate::names::UnknownName {
                        what: $what,
                        got: s.to_string(),
                        accepted: Self::NAMES,
                    }),
                }
            }
        }

        impl ::std::fmt::Display for $t {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

pub(crate) use names;
