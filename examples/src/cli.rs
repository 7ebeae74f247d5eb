//! Command-line flags of the binaries: `--name value`, `--name=value` and switches.
//!
//! Every flag must be declared; an unknown flag, a missing value or a value that does not
//! parse is an error (with the flag named), never a panic.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::str::FromStr;

/// A command line that could not be understood.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FlagError {
    /// A flag nobody declared (or a stray argument).
    Unknown(String),
    /// A flag that takes a value came last, without one.
    MissingValue(String),
    /// A value that does not parse as the flag's type.
    BadValue {
        /// The flag.
        flag: String,
        /// What was given.
        value: String,
        /// Why it was refused.
        why: String,
    },
    /// `--help` was given.
    HelpRequested,
}

impl fmt::Display for FlagError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FlagError::Unknown(arg) => write!(f, "unknown argument {arg:?}"),
            FlagError::MissingValue(flag) => write!(f, "{flag} needs a value"),
            FlagError::BadValue { flag, value, why } => {
                write!(f, "bad value {value:?} for {flag}: {why}")
            }
            FlagError::HelpRequested => write!(f, "help requested"),
        }
    }
}

impl std::error::Error for FlagError {}

/// Parsed flags.
#[derive(Debug, Default)]
pub struct Flags {
    values: HashMap<String, String>,
    switches: HashSet<String>,
}

impl Flags {
    /// Parses `args` (without the program name). `with_value` are flags taking a value,
    /// `switches` flags without one.
    pub fn parse<I>(args: I, with_value: &[&str], switches: &[&str]) -> Result<Flags, FlagError>
    where
        I: IntoIterator<Item = String>,
    {
        let mut flags = Flags::default();
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            if arg == "--help" || arg == "-h" {
                return Err(FlagError::HelpRequested);
            }
            let (name, inline) = match arg.split_once('=') {
                Some((name, value)) => (name.to_string(), Some(value.to_string())),
                None => (arg.clone(), None),
            };
            if with_value.contains(&name.as_str()) {
                let value = match inline {
                    Some(value) => value,
                    None => args.next().ok_or(FlagError::MissingValue(name.clone()))?,
                };
                flags.values.insert(name, value);
            } else if switches.contains(&name.as_str()) && inline.is_none() {
                flags.switches.insert(name);
            } else {
                return Err(FlagError::Unknown(arg));
            }
        }
        Ok(flags)
    }

    /// The value of `flag` parsed as `T`, or `default` when absent.
    pub fn get<T>(&self, flag: &str, default: T) -> Result<T, FlagError>
    where
        T: FromStr,
        T::Err: fmt::Display,
    {
        Ok(self.get_opt(flag)?.unwrap_or(default))
    }

    /// The value of `flag` parsed as `T`, or `None` when absent.
    pub fn get_opt<T>(&self, flag: &str) -> Result<Option<T>, FlagError>
    where
        T: FromStr,
        T::Err: fmt::Display,
    {
        match self.values.get(flag) {
            None => Ok(None),
            Some(value) => value
                .parse()
                .map(Some)
                .map_err(|e: T::Err| FlagError::BadValue {
                    flag: flag.to_string(),
                    value: value.clone(),
                    why: e.to_string(),
                }),
        }
    }

    /// Whether switch `flag` was given.
    pub fn switch(&self, flag: &str) -> bool {
        self.switches.contains(flag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Flags, FlagError> {
        Flags::parse(
            args.iter().map(|s| s.to_string()),
            &["--port", "--name"],
            &["--fast"],
        )
    }

    #[test]
    fn reads_values_in_both_spellings_and_switches() {
        let flags = parse(&["--port", "7", "--name=x", "--fast"]).unwrap();
        assert_eq!(flags.get("--port", 0u16).unwrap(), 7);
        assert_eq!(flags.get("--name", String::new()).unwrap(), "x");
        assert!(flags.switch("--fast"));
        assert_eq!(parse(&[]).unwrap().get("--port", 9u16).unwrap(), 9);
    }

    #[test]
    fn refuses_what_it_does_not_know() {
        assert_eq!(
            parse(&["--nope"]).unwrap_err(),
            FlagError::Unknown("--nope".into())
        );
        assert_eq!(
            parse(&["--port"]).unwrap_err(),
            FlagError::MissingValue("--port".into())
        );
        assert!(matches!(
            parse(&["--port", "x"]).unwrap().get("--port", 0u16),
            Err(FlagError::BadValue { .. })
        ));
        assert_eq!(parse(&["--help"]).unwrap_err(), FlagError::HelpRequested);
    }
}
