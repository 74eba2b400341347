//! One TOML file for `kvpool master`, `kvpool store` and `kvpool up`
//! (docs/configuration.md), generic over the clap definitions.
//!
//! Nothing here names a flag. The keys a command takes from a file are the
//! long flags of its clap `Command` (plus their aliases, Mooncake's names
//! among them, and their env var names), and each value goes through the
//! flag's own value parser. Loaded values become the flags' defaults before
//! the real parse, so clap's own order gives flag > env > file > built-in
//! default. A flag added to `MasterArgs`, `StoreArgs` or `UpArgs` is thereby
//! a config key and (see [`command`]) an env var with no code here.

use std::any::TypeId;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail};
use clap::error::ContextKind;
use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, Command, CommandFactory, FromArgMatches};

use crate::cli::Cli;

/// Id of the `--config` flag: the subcommands that have it read config
/// files, and their names are the sections a file may have.
const CONFIG_ID: &str = "config";
/// What every kvpool env var starts with.
const ENV_PREFIX: &str = "KVPOOL_";
/// Name words of flags whose values are secrets themselves.
const SECRET_WORDS: &[&str] = &[
    "secret",
    "password",
    "passwd",
    "token",
    "credential",
    "credentials",
    "apikey",
];
/// Shown instead of a secret.
const REDACTED: &str = "<redacted>";

/// Mooncake's env vars and the kvpool ones they stand for: a deployment
/// that sets Mooncake's for its master and store processes gets the same
/// meaning (kvpool's own wins when both are set).
const MOONCAKE_ENV: &[(&str, &str)] = &[("MC_STORE_CLUSTER_ID", "KVPOOL_CLUSTER_ID")];

/// Copies each set Mooncake env var of [`MOONCAKE_ENV`] to its kvpool name
/// when that is unset, so flags, config files and the etcd address see it.
/// Call while the process is one thread.
pub fn adopt_mooncake_env() {
    for (mooncake, ours) in MOONCAKE_ENV {
        if std::env::var_os(ours).is_none() {
            if let Some(v) = std::env::var_os(mooncake) {
                std::env::set_var(ours, v);
            }
        }
    }
}

/// The `kvpool` command line definition: [`Cli`] with an env var
/// `KVPOOL_<FLAG>` given to every flag of a configurable subcommand that
/// does not name one, so every key of a file is also an env var.
pub fn command() -> Command {
    with_env_vars(Cli::command())
}

/// `root` with an env var `KVPOOL_<KEY>` on every flag of a configurable
/// subcommand that does not name one.
fn with_env_vars(root: Command) -> Command {
    let names: Vec<String> = sections(&root).map(|c| c.get_name().to_string()).collect();
    names.iter().fold(root, |root, name| {
        root.mut_subcommand(name, |sub| {
            let missing: Vec<(clap::Id, String)> = keys(&sub)
                .filter(|a| a.get_env().is_none())
                .map(|a| (a.get_id().clone(), env_name(a)))
                .collect();
            missing
                .into_iter()
                .fold(sub, |sub, (id, env)| sub.mut_arg(id, |a| a.env(env)))
        })
    })
}

/// The command line `args` (program name first) parsed, with the values of
/// the config file it names (`--config` or `KVPOOL_CONFIG`) under flags
/// and env vars. A `clap::Error` in the result is a usage error for
/// `clap::Error::exit`.
pub fn parse(args: &[OsString]) -> anyhow::Result<Cli> {
    let root = command();
    let first = root.clone().try_get_matches_from(args)?;
    let cli = Cli::from_arg_matches(&first)?;
    let (Some(path), Some((name, _))) = (cli.config_file(), first.subcommand()) else {
        return Ok(cli);
    };
    let file = ConfigFile::load(path, &root)?;
    let matches = file.apply(root, name).try_get_matches_from(args)?;
    Ok(Cli::from_arg_matches(&matches)?)
}

/// `kvpool config check`: validates `path` for every command that reads
/// config files and returns the effective config of `target` (all of them
/// when `None`: those the file has a section for, or every one for a flat
/// file), with `flags` given on the command line as well.
pub fn check(path: &Path, target: Option<&str>, flags: &[OsString]) -> anyhow::Result<String> {
    let root = command();
    let file = ConfigFile::load(path, &root)?;
    let all: Vec<String> = sections(&root).map(|c| c.get_name().to_string()).collect();
    let targets: Vec<String> = match target {
        Some(t) if all.iter().any(|a| a == t) => vec![t.to_string()],
        Some(t) => bail!(
            "--for {t}: not a command that reads a config file ({})",
            all.join(", ")
        ),
        None if file.sections.is_empty() => all,
        None => file.sections.clone(),
    };
    let mut out = String::new();
    for name in &targets {
        let cmd = file.apply(root.clone(), name);
        let argv = [OsString::from("kvpool"), OsString::from(name)]
            .into_iter()
            .chain(flags.iter().cloned());
        let matches = cmd.clone().try_get_matches_from(argv)?;
        // The checks a command makes when it starts (flags that need each
        // other, secret and TLS files readable) belong to a check too.
        Cli::from_arg_matches(&matches)?
            .check()
            .map_err(|e| anyhow!("{name}: {e:#}"))?;
        let sub = cmd
            .find_subcommand(name)
            .expect("a configurable subcommand");
        let (_, m) = matches.subcommand().expect("the subcommand just parsed");
        out.push_str(&effective(sub, m, &file));
        out.push('\n');
    }
    out.push_str(&format!("# {}: ok\n", path.display()));
    Ok(out)
}

/// The subcommands that read config files.
fn sections(root: &Command) -> impl Iterator<Item = &Command> {
    root.get_subcommands()
        .filter(|c| c.get_arguments().any(|a| a.get_id() == CONFIG_ID))
}

/// The flags of `cmd` a file may set: long flags that take a value, but
/// not `--config` itself (a file naming another file is a loop to debug).
fn keys(cmd: &Command) -> impl Iterator<Item = &Arg> {
    cmd.get_arguments().filter(|a| {
        a.get_long().is_some()
            && a.get_id() != CONFIG_ID
            && !matches!(
                a.get_action(),
                ArgAction::Help | ArgAction::HelpShort | ArgAction::HelpLong | ArgAction::Version
            )
    })
}

/// A key spelt the canonical way: `-` as `_`.
fn normal(key: &str) -> String {
    key.replace('-', "_")
}

/// The canonical key of a flag: its long name in snake case.
fn key_name(arg: &Arg) -> String {
    normal(arg.get_long().unwrap_or_default())
}

/// The env var of a flag: the one it names, else `KVPOOL_<KEY>`.
fn env_name(arg: &Arg) -> String {
    match arg.get_env() {
        Some(e) => e.to_string_lossy().into_owned(),
        None => format!("{ENV_PREFIX}{}", key_name(arg).to_uppercase()),
    }
}

/// The flag of `cmd` that `key` names: a long name or alias (Mooncake's
/// names are aliases), else the name of its env var without `KVPOOL_`
/// (`segment_name` for `--name`); `-` and `_` are the same.
fn find<'c>(cmd: &'c Command, key: &str) -> Option<&'c Arg> {
    let key = normal(key);
    let by_flag = |a: &&Arg| {
        let aliases = a.get_all_aliases().unwrap_or_default();
        key_name(a) == key || aliases.into_iter().any(|al| normal(al) == key)
    };
    let by_env = |a: &&Arg| {
        let env = env_name(a);
        env.strip_prefix(ENV_PREFIX)
            .is_some_and(|e| e.to_lowercase() == key)
    };
    keys(cmd).find(by_flag).or_else(|| keys(cmd).find(by_env))
}

/// " (did you mean X?)" when a candidate is close to `key`.
fn suggest<'a>(key: &str, candidates: impl Iterator<Item = &'a str>) -> String {
    let key = normal(key);
    let best = candidates
        .map(|c| (strsim::jaro(&key, c), c))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0));
    best.map(|(_, c)| format!(" (did you mean {c}?)"))
        .unwrap_or_default()
}

/// What a file value for a flag must look like, from the flag's type.
#[derive(PartialEq, Clone, Copy)]
enum Kind {
    Bool,
    Text,
    Path,
    /// Numbers, durations, sizes and anything else: a string, integer or
    /// float, whose text the flag's parser judges.
    Other,
}

/// The [`Kind`] of `arg`, from the type its value parser returns.
fn kind(arg: &Arg) -> Kind {
    let t = arg.get_value_parser().type_id();
    if t == TypeId::of::<bool>() {
        Kind::Bool
    } else if t == TypeId::of::<String>() {
        Kind::Text
    } else if t == TypeId::of::<PathBuf>() || t == TypeId::of::<OsString>() {
        Kind::Path
    } else {
        Kind::Other
    }
}

/// Whether `arg` takes a list (an array in a file).
fn takes_many(arg: &Arg) -> bool {
    matches!(arg.get_action(), ArgAction::Append)
}

/// The format `arg` accepts, for error messages.
fn format_of(arg: &Arg) -> String {
    let t = arg.get_value_parser().type_id();
    let ranged = |lo: i128, hi: i128| format!("an integer in {lo}..={hi}");
    match kind(arg) {
        Kind::Bool => return "true or false".into(),
        Kind::Text => return "a string".into(),
        Kind::Path => return "a path (a string)".into(),
        Kind::Other => {}
    }
    if t == TypeId::of::<Duration>() {
        "a duration (e.g. 10s, 500ms, 2m)".into()
    } else if (t == TypeId::of::<u64>() || t == TypeId::of::<usize>())
        && parse_with(arg, &["4GiB".into()]).is_ok()
    {
        // A size parser is a u64 parser that takes units.
        "a size (e.g. 4GiB, 512MiB)".into()
    } else if t == TypeId::of::<u8>() {
        ranged(0, u8::MAX.into())
    } else if t == TypeId::of::<u16>() {
        ranged(0, u16::MAX.into())
    } else if t == TypeId::of::<u32>() {
        ranged(0, u32::MAX.into())
    } else if t == TypeId::of::<u64>() || t == TypeId::of::<usize>() {
        "a whole number (0 or more)".into()
    } else if t == TypeId::of::<i64>() || t == TypeId::of::<i32>() {
        "an integer".into()
    } else if t == TypeId::of::<f64>() || t == TypeId::of::<f32>() {
        "a number".into()
    } else {
        "a valid value".into()
    }
}

/// Runs `values` through `arg`'s own value parser (alone, so no other
/// flag or env var is read); `Err` is the parser's message.
fn parse_with(arg: &Arg, values: &[String]) -> Result<(), String> {
    let probe = Arg::new("v")
        .long("v")
        .value_parser(arg.get_value_parser().clone())
        .action(ArgAction::Append);
    let cmd = Command::new("config").no_binary_name(true).arg(probe);
    // `--v=VALUE` so a value starting with '-' is not read as a flag.
    let argv = values.iter().map(|v| format!("--v={v}"));
    match cmd.try_get_matches_from(argv) {
        Ok(_) => Ok(()),
        Err(e) => Err(
            match (
                std::error::Error::source(&e),
                e.get(ContextKind::ValidValue),
            ) {
                (Some(src), _) => src.to_string(),
                (None, Some(valid)) => format!("expected one of {valid}"),
                (None, None) => e.kind().to_string(),
            },
        ),
    }
}

/// Whether `arg` holds a secret itself (not the path of a file holding
/// one), judged by the words of its name.
fn is_secret(arg: &Arg) -> bool {
    kind(arg) != Kind::Path && key_name(arg).split('_').any(|w| SECRET_WORDS.contains(&w))
}

/// `s` with the password of every `scheme://user:password@host` replaced
/// (etcd endpoints may carry one).
fn redact_urls(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        let authority_end = tail.find(['/', ',', ';', ' ']).unwrap_or(tail.len());
        let authority = &tail[..authority_end];
        match (authority.rfind('@'), authority.find(':')) {
            (Some(at), Some(colon)) if colon < at => {
                out.push_str(&authority[..=colon]);
                out.push_str(REDACTED);
                out.push_str(&authority[at..]);
            }
            _ => out.push_str(authority),
        }
        rest = &tail[authority_end..];
    }
    out.push_str(rest);
    out
}

/// A value of `arg` as it may be shown: secrets redacted.
fn shown(arg: &Arg, value: &str) -> String {
    if is_secret(arg) {
        REDACTED.into()
    } else {
        redact_urls(value)
    }
}

/// A file value as a TOML literal for messages, secrets redacted.
fn shown_toml(arg: &Arg, v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => toml::Value::String(shown(arg, s)).to_string(),
        _ if is_secret(arg) => REDACTED.into(),
        v => v.to_string(),
    }
}

/// The text of one file value for `arg`'s parser, or what is wrong with
/// its TOML type.
fn scalar_text(arg: &Arg, v: &toml::Value) -> Result<String, String> {
    let found = || format!("found {} {}", v.type_str(), shown_toml(arg, v));
    let expected = || format!("expected {}, {}", format_of(arg), found());
    match (kind(arg), v) {
        (Kind::Bool, toml::Value::Boolean(b)) => Ok(b.to_string()),
        (Kind::Text | Kind::Path | Kind::Other, toml::Value::String(s)) => Ok(s.clone()),
        (Kind::Other, toml::Value::Integer(i)) => Ok(i.to_string()),
        (Kind::Other, toml::Value::Float(f)) => Ok(f.to_string()),
        (_, toml::Value::Array(_)) => Err(format!("expected one value, {}", found())),
        (_, toml::Value::Table(_)) => Err("expected a value, found a table".into()),
        _ => Err(expected()),
    }
}

/// The texts of a file value for `arg`, checked by the flag's parser;
/// `Err` is the message after `KEY: `.
fn value_texts(arg: &Arg, v: &toml::Value) -> Result<Vec<String>, String> {
    let texts = match v {
        toml::Value::Array(items) if takes_many(arg) => items
            .iter()
            .map(|i| scalar_text(arg, i))
            .collect::<Result<Vec<_>, _>>()?,
        v => vec![scalar_text(arg, v)?],
    };
    parse_with(arg, &texts).map_err(|why| {
        // Parsers quote the value they refuse: redact it there too.
        let why = if is_secret(arg) {
            String::new()
        } else {
            format!(": {}", redact_urls(&why))
        };
        format!("{} is not {}{why}", shown_toml(arg, v), format_of(arg))
    })?;
    Ok(texts)
}

/// One flag's value from a file, and where in the file it was.
struct Setting {
    values: Vec<String>,
    /// `section.key` or `key` (top level), as spelt in the file.
    origin: String,
}

/// A config file, checked against every command that reads one.
pub struct ConfigFile {
    /// Per command: flag id to the value the file gives it.
    settings: BTreeMap<String, BTreeMap<String, Setting>>,
    /// The sections the file has, in file order.
    sections: Vec<String>,
}

impl ConfigFile {
    /// Reads and checks `path` against the configurable subcommands of
    /// `root`; the error lists every bad key, not just the first.
    pub fn load(path: &Path, root: &Command) -> anyhow::Result<ConfigFile> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow!("config file {}: {e}", path.display()))?;
        let table: toml::Table = text
            .parse()
            .map_err(|e| anyhow!("config file {}: {e}", path.display()))?;
        let commands: Vec<&Command> = sections(root).collect();
        let mut file = ConfigFile {
            settings: commands
                .iter()
                .map(|c| (c.get_name().to_string(), BTreeMap::new()))
                .collect(),
            sections: Vec::new(),
        };
        let mut errors = Vec::new();
        let section_names = || commands.iter().map(|c| c.get_name());
        // Top-level keys first so that a section's value replaces them.
        let mut seen: BTreeMap<(&str, clap::Id), &str> = BTreeMap::new();
        for (key, v) in table.iter().filter(|(_, v)| !v.is_table()) {
            let mut known = false;
            for cmd in &commands {
                let Some(arg) = find(cmd, key) else { continue };
                known = true;
                match seen.insert((cmd.get_name(), arg.get_id().clone()), key) {
                    Some(first) => errors.push(format!("{key}: sets the same flag as {first}")),
                    None => file.set(cmd.get_name(), arg, key.clone(), v, &mut errors),
                }
            }
            if !known {
                let all = commands
                    .iter()
                    .flat_map(|c| keys(c))
                    .map(|a| a.get_long().unwrap_or_default());
                errors.push(unknown_key(key, key, all.chain(section_names())));
            }
        }
        for (name, v) in table.iter() {
            let Some(section) = v.as_table() else {
                continue;
            };
            let Some(cmd) = commands.iter().find(|c| c.get_name() == name) else {
                let is_key = commands.iter().any(|c| find(c, name).is_some());
                errors.push(if is_key {
                    format!("{name}: expected a value, found a table")
                } else {
                    format!(
                        "[{name}]: unknown section{} (sections: {})",
                        suggest(name, section_names()),
                        section_names().collect::<Vec<_>>().join(", ")
                    )
                });
                continue;
            };
            file.sections.push(name.clone());
            let mut seen: BTreeMap<clap::Id, &str> = BTreeMap::new();
            // A flag set twice in one section, in both spellings, is an error.
            for (key, v) in section {
                let origin = format!("{name}.{key}");
                let Some(arg) = find(cmd, key) else {
                    let names = keys(cmd).map(|a| a.get_long().unwrap_or_default());
                    errors.push(unknown_key(&origin, key, names));
                    continue;
                };
                if let Some(first) = seen.insert(arg.get_id().clone(), key) {
                    errors.push(format!("{origin}: sets the same flag as {name}.{first}"));
                    continue;
                }
                file.set(name, arg, origin, v, &mut errors);
            }
        }
        // A top-level value wrong for several commands is one error.
        let mut unique = Vec::new();
        for e in errors {
            if !unique.contains(&e) {
                unique.push(e);
            }
        }
        match unique.len() {
            0 => Ok(file),
            n => bail!(
                "config file {}: {n} error{}:\n  {}",
                path.display(),
                if n == 1 { "" } else { "s" },
                unique.join("\n  ")
            ),
        }
    }

    /// Checks `v` for `arg` of command `name` and records it, or the error.
    fn set(
        &mut self,
        name: &str,
        arg: &Arg,
        origin: String,
        v: &toml::Value,
        errors: &mut Vec<String>,
    ) {
        match value_texts(arg, v) {
            Ok(values) => {
                let s = Setting { values, origin };
                self.settings
                    .get_mut(name)
                    .expect("a map per configurable command")
                    .insert(arg.get_id().to_string(), s);
            }
            Err(why) => errors.push(format!("{origin}: {why}")),
        }
    }

    /// `root` with this file's values as the defaults of subcommand `name`.
    fn apply(&self, root: Command, name: &str) -> Command {
        let Some(settings) = self.settings.get(name).filter(|s| !s.is_empty()) else {
            return root;
        };
        root.mut_subcommand(name, |sub| {
            settings.iter().fold(sub, |sub, (id, s)| {
                sub.mut_arg(id, |a| a.default_values(s.values.clone()))
            })
        })
    }

    /// Where in the file the value of `id` for command `name` came from.
    fn origin(&self, name: &str, id: &str) -> Option<&str> {
        Some(self.settings.get(name)?.get(id)?.origin.as_str())
    }
}

/// The error for a key no flag has.
fn unknown_key<'a>(origin: &str, key: &str, candidates: impl Iterator<Item = &'a str>) -> String {
    if normal(key) == CONFIG_ID {
        return format!("{origin}: a config file cannot name another (pass --config once)");
    }
    let candidates: Vec<String> = candidates.map(normal).collect();
    format!(
        "{origin}: unknown key{}",
        suggest(key, candidates.iter().map(String::as_str))
    )
}

/// A value as a TOML literal: bare when the flag's type makes it a bool or
/// number, else a quoted string.
fn toml_literal(arg: &Arg, value: &str) -> String {
    let bare = match kind(arg) {
        Kind::Bool => true,
        Kind::Text | Kind::Path => false,
        Kind::Other => {
            value.parse::<i64>().is_ok()
                || (value.contains('.') && value.parse::<f64>().is_ok_and(f64::is_finite))
        }
    };
    if bare && !is_secret(arg) {
        value.to_string()
    } else {
        toml::Value::String(shown(arg, value)).to_string()
    }
}

/// The effective config of subcommand `cmd` parsed into `m`, as TOML: every
/// key with its value (secrets redacted) and, in a comment, its source.
fn effective(cmd: &Command, m: &ArgMatches, file: &ConfigFile) -> String {
    let name = cmd.get_name();
    let mut out =
        format!("# kvpool {name}: effective config (flag > env > file > default)\n[{name}]\n");
    // `mut_arg` moves the args it changes to the end; print in `--help` order.
    let mut args: Vec<&Arg> = keys(cmd).collect();
    args.sort_by_key(|a| a.get_display_order());
    for arg in args {
        let id = arg.get_id().as_str();
        let key = key_name(arg);
        let raw: Vec<String> = m
            .get_raw(id)
            .map(|r| r.map(|v| v.to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        let source = match m.value_source(id) {
            Some(ValueSource::CommandLine) => {
                format!("flag --{}", arg.get_long().unwrap_or_default())
            }
            Some(ValueSource::EnvVariable) => format!("env {}", env_name(arg)),
            Some(ValueSource::DefaultValue) => match file.origin(name, id) {
                Some(origin) => format!("file {origin}"),
                None => "default".into(),
            },
            _ => "default".into(),
        };
        let line = match raw.as_slice() {
            [] => format!("# {key} is not set"),
            [one] if !takes_many(arg) => format!("{key} = {}", toml_literal(arg, one)),
            many => {
                let items: Vec<String> = many.iter().map(|v| toml_literal(arg, v)).collect();
                format!("{key} = [{}]", items.join(", "))
            }
        };
        out.push_str(&format!("{line:<52} # {source}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd() -> Command {
        Command::new("t")
            .arg(Arg::new("etcd_password").long("etcd-password"))
            .arg(
                Arg::new("secret_file")
                    .long("secret-file")
                    .value_parser(clap::value_parser!(PathBuf)),
            )
            .arg(
                Arg::new("port")
                    .long("port")
                    .value_parser(clap::value_parser!(u16)),
            )
    }

    #[test]
    fn secrets_are_judged_by_name_and_paths_are_not_secrets() {
        let c = cmd();
        let arg = |id: &str| c.get_arguments().find(|a| a.get_id() == id).unwrap();
        assert!(is_secret(arg("etcd_password")));
        assert!(
            !is_secret(arg("secret_file")),
            "a path to a secret is shown"
        );
        assert!(!is_secret(arg("port")));
        assert_eq!(
            toml_literal(arg("etcd_password"), "hunter2"),
            "\"<redacted>\""
        );
        assert_eq!(toml_literal(arg("port"), "80"), "80");
    }

    #[test]
    fn url_passwords_are_redacted() {
        assert_eq!(
            redact_urls("http://u:pw@h:2379,https://h2:1/x;http://v:p@h3"),
            "http://u:<redacted>@h:2379,https://h2:1/x;http://v:<redacted>@h3"
        );
        assert_eq!(redact_urls("h1:2379;h2:2379"), "h1:2379;h2:2379");
    }

    #[test]
    fn keys_match_long_names_aliases_and_env_names_in_either_spelling() {
        let c = Command::new("t").arg(
            Arg::new("name")
                .long("name")
                .alias("seg_name")
                .env("KVPOOL_SEGMENT_NAME"),
        );
        for key in [
            "name",
            "seg_name",
            "seg-name",
            "segment_name",
            "segment-name",
        ] {
            assert!(find(&c, key).is_some(), "{key}");
        }
        assert!(find(&c, "nam").is_none());
        assert_eq!(
            suggest("nmae", ["name", "port"].into_iter()),
            " (did you mean name?)"
        );
    }

    #[test]
    fn a_new_flag_is_a_key_and_an_env_var_with_no_code() {
        let config = Arg::new(CONFIG_ID).long("config");
        let flag = Arg::new("metrics_port")
            .long("metrics-port")
            .value_parser(clap::value_parser!(u16));
        let root = with_env_vars(
            Command::new("kvpool").subcommand(Command::new("store").arg(config).arg(flag)),
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.toml");
        std::fs::write(&path, "[store]\nmetrics-port = 9100\n").unwrap();
        let file = ConfigFile::load(&path, &root).unwrap();
        let m = file
            .apply(root.clone(), "store")
            .get_matches_from(["kvpool", "store"]);
        let (_, m) = m.subcommand().unwrap();
        assert_eq!(m.get_one::<u16>("metrics_port"), Some(&9100));
        let store = root.find_subcommand("store").unwrap();
        assert!(effective(store, m, &file).contains("metrics_port = 9100"));
        let arg = keys(store).next().unwrap();
        assert_eq!(arg.get_env().unwrap(), "KVPOOL_METRICS_PORT");

        std::fs::write(&path, "[store]\nmetrics_port = 70000\n").unwrap();
        let Err(err) = ConfigFile::load(&path, &root) else {
            panic!("port 70000 was taken");
        };
        let err = err.to_string();
        assert!(
            err.contains("store.metrics_port: 70000 is not an integer in 0..=65535"),
            "{err}"
        );
    }

    #[test]
    fn every_configurable_flag_has_an_env_var() {
        let root = command();
        for sub in sections(&root) {
            for arg in keys(sub) {
                assert!(
                    arg.get_env().is_some(),
                    "{} --{}",
                    sub.get_name(),
                    key_name(arg)
                );
            }
        }
        assert!(
            sections(&root).count() >= 3,
            "master, store and up read files"
        );
    }
}
