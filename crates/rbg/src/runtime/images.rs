//! The image map: how a container `image` becomes a local command.
//!
//! A YAML file maps image references to what runs them:
//!
//! ```yaml
//! kvpool:v1: ../target/debug          # a directory (shorthand for {dir: ...})
//! kvpool:v2: {dir: /opt/kvpool-v2}
//! engine:v1: {prefix: [python3, -u]}  # prepended to the container's command
//! vllm:v1: {entrypoint: [vllm, serve]} # used when the container has no command
//! ```
//!
//! `dir`: a `command[0]` without a `/` is looked up in that directory first,
//! and the directory is put first on `PATH`. `prefix` goes before the whole
//! command line. `entrypoint` stands in for the image's ENTRYPOINT when the
//! container sets only `args`. Relative paths are relative to the map file.
//! An image with no entry runs the container command as is. Swapping an
//! image for another entry is how an in-place upgrade swaps binaries.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// How one image runs locally.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageEntry {
    /// Directory searched first for `command[0]` and put first on PATH.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<PathBuf>,
    /// Words put before the container's command line.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prefix: Vec<String>,
    /// The command used when the container sets none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub entrypoint: Vec<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum EntryText {
    Dir(PathBuf),
    Full(ImageEntry),
}

/// Image reference → how to run it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageMap {
    /// Entries by image reference, paths absolute.
    pub images: BTreeMap<String, ImageEntry>,
}

/// Problems with an image map or with running an image.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The map file could not be read.
    #[error("image map {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The map file is not a map of image → directory or entry.
    #[error("image map {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the entry name.
        message: String,
    },
    /// Neither the container nor the image map gives a command.
    #[error("container {container:?}: no command, and image {image:?} has no entrypoint in the image map")]
    NoCommand {
        /// Container name.
        container: String,
        /// Its image.
        image: String,
    },
}

impl ImageMap {
    /// Parses map text; relative paths are taken from `base`.
    pub fn parse(text: &str, base: &Path, origin: &Path) -> Result<ImageMap, ImageError> {
        let raw: BTreeMap<String, EntryText> = if text.trim().is_empty() {
            BTreeMap::new()
        } else {
            serde_yaml::from_str(text).map_err(|e| ImageError::Parse {
                path: origin.to_path_buf(),
                message: format!(
                    "{e} (expected `image: directory` or `image: {{dir, prefix, entrypoint}}`)"
                ),
            })?
        };
        let mut images = BTreeMap::new();
        for (image, entry) in raw {
            let mut e = match entry {
                EntryText::Dir(d) => ImageEntry {
                    dir: Some(d),
                    ..ImageEntry::default()
                },
                EntryText::Full(e) => e,
            };
            if let Some(d) = &e.dir {
                let abs = if d.is_relative() {
                    base.join(d)
                } else {
                    d.clone()
                };
                // Tidy `deploy/../target` when the directory exists already.
                e.dir = Some(std::fs::canonicalize(&abs).unwrap_or(abs));
            }
            images.insert(image, e);
        }
        Ok(ImageMap { images })
    }

    /// Reads a map file.
    pub fn load(path: &Path) -> Result<ImageMap, ImageError> {
        let text = std::fs::read_to_string(path).map_err(|source| ImageError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let base = path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        let base = std::fs::canonicalize(&base).unwrap_or(base);
        ImageMap::parse(&text, &base, path)
    }

    /// The final argv for a container and the directory to put on PATH.
    /// `command` is the container's expanded command + args; `has_command`
    /// says whether it set `command` at all.
    pub fn resolve(
        &self,
        container: &str,
        image: Option<&str>,
        command: &[String],
        has_command: bool,
    ) -> Result<(Vec<String>, Option<PathBuf>), ImageError> {
        let entry = image.and_then(|i| self.images.get(i));
        let mut argv: Vec<String> = Vec::new();
        if let Some(e) = entry {
            argv.extend(e.prefix.iter().cloned());
            if !has_command {
                argv.extend(e.entrypoint.iter().cloned());
            }
        }
        argv.extend(command.iter().cloned());
        let dir = entry.and_then(|e| e.dir.clone());
        let prefix_len = entry.map_or(0, |e| e.prefix.len());
        if argv.is_empty()
            || (!has_command && entry.is_none_or(|e| e.entrypoint.is_empty()) && prefix_len == 0)
        {
            return Err(ImageError::NoCommand {
                container: container.to_string(),
                image: image.unwrap_or("").to_string(),
            });
        }
        if let Some(d) = &dir {
            // The program is the first word after the prefix, or the prefix's
            // own first word: whichever is argv[0] gets looked up in `dir`.
            if let Some(first) = argv.first_mut() {
                if !first.contains('/') {
                    let candidate = d.join(&*first);
                    if candidate.is_file() {
                        *first = candidate.to_string_lossy().into_owned();
                    }
                }
            }
        }
        Ok((argv, dir))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shorthand_and_full_entries() {
        let m = ImageMap::parse(
            "a:v1: bin\nb:v1: {prefix: [python3, -u]}\nc:v1: {entrypoint: [serve]}\n",
            Path::new("/base"),
            Path::new("m.yaml"),
        )
        .expect("parses");
        assert_eq!(
            m.images["a:v1"].dir.as_deref(),
            Some(Path::new("/base/bin"))
        );
        let (argv, _) = m
            .resolve("x", Some("b:v1"), &["app.py".into()], true)
            .expect("resolves");
        assert_eq!(argv, vec!["python3", "-u", "app.py"]);
        let (argv, _) = m
            .resolve("x", Some("c:v1"), &["--port".into(), "1".into()], false)
            .expect("resolves");
        assert_eq!(argv, vec!["serve", "--port", "1"]);
        assert!(m
            .resolve("x", Some("a:v1"), &["--port".into()], false)
            .is_err());
        let (argv, _) = m
            .resolve("x", Some("zzz"), &["sleep".into(), "1".into()], true)
            .expect("unmapped image runs as is");
        assert_eq!(argv, vec!["sleep", "1"]);
    }

    #[test]
    fn dir_resolves_program() {
        let d = tempfile::tempdir().expect("tempdir");
        std::fs::write(d.path().join("prog"), "").expect("write");
        let text = format!("p:v1: {}\n", d.path().display());
        let m = ImageMap::parse(&text, Path::new("/"), Path::new("m")).expect("parses");
        let (argv, dir) = m
            .resolve("x", Some("p:v1"), &["prog".into(), "a".into()], true)
            .expect("resolves");
        assert_eq!(argv[0], d.path().join("prog").to_string_lossy());
        assert_eq!(dir.as_deref(), Some(d.path()));
    }

    #[test]
    fn bad_map_is_a_clear_error() {
        let e =
            ImageMap::parse("a: {nope: 1}", Path::new("/"), Path::new("m.yaml")).expect_err("bad");
        assert!(e.to_string().contains("m.yaml"), "{e}");
    }
}
