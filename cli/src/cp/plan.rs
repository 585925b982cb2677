//! What a `sluice cp` copies: which argument is the namespace path, the
//! files of a local tree, where each object lands, and the names refused.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::journal::MANIFEST_NAME;

/// One of `cp`'s two arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Side {
    Local(PathBuf),
    /// `namespace/key` (key may be empty, a prefix, or end with '/').
    Remote {
        ns: String,
        key: String,
    },
}

/// Which way a copy goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Direction {
    Upload { src: PathBuf, ns: String, key: String },
    Download { ns: String, key: String, dest: PathBuf },
}

/// Reads one argument: a namespace path if its first component is one of
/// the tenant's namespaces (and it does not start with `/`, `./`, `../`
/// or `~`), else a local path. A namespace path whose namespace is also a
/// local file or directory here is ambiguous and refused.
pub fn side(arg: &str, namespaces: &[String]) -> anyhow::Result<Side> {
    anyhow::ensure!(!arg.is_empty(), "an empty path");
    let explicit_local = arg.starts_with('/')
        || arg.starts_with("./")
        || arg.starts_with("../")
        || arg.starts_with('~')
        || arg == "."
        || arg == "..";
    let (first, rest) = arg.split_once('/').unwrap_or((arg, ""));
    if explicit_local || !namespaces.iter().any(|n| n == first) {
        return Ok(Side::Local(PathBuf::from(arg)));
    }
    if std::fs::symlink_metadata(first).is_ok() {
        anyhow::bail!(
            "refused {arg:?}: ambiguous, {first:?} is a namespace and also a local path; write ./{arg} for the local one"
        );
    }
    Ok(Side::Remote { ns: first.to_owned(), key: rest.to_owned() })
}

/// Which way `src` -> `dest` goes; exactly one must be a namespace path.
pub fn direction(src: &str, dest: &str, namespaces: &[String]) -> anyhow::Result<Direction> {
    match (side(src, namespaces)?, side(dest, namespaces)?) {
        (Side::Local(src), Side::Remote { ns, key }) => Ok(Direction::Upload { src, ns, key }),
        (Side::Remote { ns, key }, Side::Local(dest)) => {
            anyhow::ensure!(dest != Path::new("-"), "cp writes files; for stdout use `sluice get {src} -`");
            Ok(Direction::Download { ns, key, dest })
        }
        (Side::Local(_), Side::Local(_)) => anyhow::bail!(
            "neither {src:?} nor {dest:?} is a namespace path (namespace/key; this tenant's namespaces: {})",
            namespaces.join(", ")
        ),
        (Side::Remote { .. }, Side::Remote { .. }) => {
            anyhow::bail!(
                "both {src:?} and {dest:?} are namespace paths: cp copies between local files and a namespace"
            )
        }
    }
}

/// Why `key` may not be written or mapped to a local path (`None`: it
/// may). Refused: absolute keys, `..`, `.` and empty components, NUL.
pub fn key_problem(key: &str) -> Option<&'static str> {
    if key.starts_with('/') {
        return Some("an absolute key (it starts with '/')");
    }
    if key.contains('\0') {
        return Some("a NUL character");
    }
    for c in key.split('/') {
        match c {
            ".." => return Some("a '..' component"),
            "." => return Some("a '.' component"),
            "" => return Some("an empty component ('//' or a trailing '/')"),
            _ => {}
        }
    }
    None
}

/// A prefix as `cp -r` uses it: empty, or ending with one '/'.
pub fn as_prefix(key: &str) -> String {
    if key.is_empty() || key.ends_with('/') {
        key.to_owned()
    } else {
        format!("{key}/")
    }
}

/// A name `cp` refused, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub name: String,
    pub reason: String,
}

/// A regular file of a local tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalFile {
    /// Path relative to the tree's root, '/'-separated (the key's tail).
    pub rel: String,
    pub path: PathBuf,
}

/// The temp files downloads write before the rename (`.sluice-cp-<hash>.tmp`).
pub fn is_temp_name(name: &str) -> bool {
    name.starts_with(".sluice-cp-") && name.ends_with(".tmp")
}

/// Where the download of `dest` is written until it is complete and
/// checked: a hidden file in the same directory (so the rename is atomic),
/// named after `dest` (so a later run finds and replaces what a killed run
/// left).
/// The first directory of `rel` under `root` (not `root` itself, which the
/// user named) that is a symbolic link, if any: a download writes nothing
/// through one (a link planted in the destination tree would send the
/// files anywhere it points).
pub fn through_symlink(root: &Path, rel: &Path) -> Option<PathBuf> {
    let mut at = root.to_path_buf();
    let parents: Vec<_> = rel.components().collect();
    for c in &parents[..parents.len().saturating_sub(1)] {
        at.push(c);
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.file_type().is_symlink() => return Some(at),
            Ok(_) => {}
            Err(_) => return None, // not there yet: made as a directory
        }
    }
    None
}

pub fn temp_path(dest: &Path) -> PathBuf {
    let name = dest.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let digest = ring::digest::digest(&ring::digest::SHA256, name.as_bytes());
    dest.with_file_name(format!(".sluice-cp-{}.tmp", &hex::encode(digest)[..16]))
}

/// A file's mtime in ns since the epoch.
pub fn mtime_ns(md: &std::fs::Metadata) -> i64 {
    md.mtime().saturating_mul(1_000_000_000).saturating_add(md.mtime_nsec())
}

/// The regular files under `root`, sorted, and what was refused: names
/// that are not UTF-8, symlinks and other non-regular files, the reserved
/// manifest name, unreadable directories. Download temp files are left out.
pub fn walk(root: &Path) -> (Vec<LocalFile>, Vec<Refusal>) {
    let mut files = Vec::new();
    let mut refused = Vec::new();
    let mut dirs = vec![(root.to_owned(), String::new())];
    while let Some((dir, rel_dir)) = dirs.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) => {
                refused
                    .push(Refusal { name: dir.display().to_string(), reason: format!("reading the directory: {e}") });
                continue;
            }
        };
        for entry in entries {
            let entry = match entry {
                Ok(e) => e,
                Err(e) => {
                    refused.push(Refusal {
                        name: dir.display().to_string(),
                        reason: format!("reading the directory: {e}"),
                    });
                    continue;
                }
            };
            let path = entry.path();
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                refused.push(Refusal { name: path.display().to_string(), reason: "its name is not UTF-8".into() });
                continue;
            };
            let rel = format!("{rel_dir}{name}");
            let kind = match entry.file_type() {
                Ok(t) => t,
                Err(e) => {
                    refused.push(Refusal { name: path.display().to_string(), reason: e.to_string() });
                    continue;
                }
            };
            if kind.is_dir() {
                dirs.push((path, format!("{rel}/")));
            } else if !kind.is_file() {
                let what = if kind.is_symlink() { "a symbolic link" } else { "not a regular file" };
                refused.push(Refusal { name: path.display().to_string(), reason: format!("{what} (not copied)") });
            } else if name == MANIFEST_NAME {
                refused.push(Refusal {
                    name: path.display().to_string(),
                    reason: format!("{MANIFEST_NAME} is the name of the manifest cp -r writes"),
                });
            } else if !is_temp_name(&name) {
                files.push(LocalFile { rel, path });
            }
        }
    }
    files.sort_by(|a, b| a.rel.cmp(&b.rel));
    refused.sort_by(|a, b| a.name.cmp(&b.name));
    (files, refused)
}

/// What a listed key becomes under a download's destination directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Landing {
    /// A file at this path relative to the destination.
    File(PathBuf),
    /// A directory marker (a key ending in '/', empty): this directory.
    Dir(PathBuf),
    /// A manifest `cp -r` wrote (read for checksums, not copied).
    Manifest,
    /// The prefix's own marker: nothing to do.
    Nothing,
}

/// Where the object `rel` (its key without the prefix) of `size` bytes
/// lands; `Err` says why it is refused.
pub fn landing(rel: &str, size: u64) -> Result<Landing, String> {
    if rel.is_empty() {
        return Ok(Landing::Nothing);
    }
    let (body, marker) = match rel.strip_suffix('/') {
        Some(b) => (b, true),
        None => (rel, false),
    };
    if let Some(problem) = key_problem(body) {
        return Err(format!("{problem}: it would not land inside the destination"));
    }
    if marker {
        if size != 0 {
            return Err("a key ending in '/' with bytes (not a directory marker)".into());
        }
        return Ok(Landing::Dir(PathBuf::from(body)));
    }
    let last = body.rsplit('/').next().unwrap_or(body);
    if last == MANIFEST_NAME {
        return Ok(Landing::Manifest);
    }
    if is_temp_name(last) {
        return Err("the name of cp's temp files".into());
    }
    Ok(Landing::File(PathBuf::from(body)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns() -> Vec<String> {
        vec!["data".into(), "other".into()]
    }

    #[test]
    fn sides() {
        let n = ns();
        assert_eq!(side("data/a/b", &n).unwrap(), Side::Remote { ns: "data".into(), key: "a/b".into() });
        assert_eq!(side("data", &n).unwrap(), Side::Remote { ns: "data".into(), key: String::new() });
        assert_eq!(side("./data/a", &n).unwrap(), Side::Local("./data/a".into()));
        assert_eq!(side("/tmp/x", &n).unwrap(), Side::Local("/tmp/x".into()));
        assert_eq!(side("nope/x", &n).unwrap(), Side::Local("nope/x".into()));
        assert!(direction("a", "b", &n).unwrap_err().to_string().contains("neither"));
        assert!(direction("data/a", "other/b", &n).unwrap_err().to_string().contains("both"));
        assert_eq!(
            direction("./f", "data/k", &n).unwrap(),
            Direction::Upload { src: "./f".into(), ns: "data".into(), key: "k".into() }
        );
        assert!(direction("data/k", "-", &n).is_err());
    }

    #[test]
    fn a_namespace_path_that_exists_locally_is_ambiguous() {
        // Unit tests run in the package's directory, which has src/main.rs.
        let n = vec!["src".to_owned()];
        for arg in ["src/main.rs", "src/new-file", "src"] {
            assert!(side(arg, &n).unwrap_err().to_string().contains("also a local path"), "{arg}");
        }
        assert_eq!(side("./src/main.rs", &n).unwrap(), Side::Local("./src/main.rs".into()));
    }

    #[test]
    fn keys() {
        assert_eq!(key_problem("a/b.txt"), None);
        assert_eq!(key_problem("ünï/☃"), None);
        assert!(key_problem("a/../b").unwrap().contains(".."));
        assert!(key_problem("..").unwrap().contains(".."));
        assert!(key_problem("/etc/passwd").unwrap().contains("absolute"));
        assert!(key_problem("a//b").unwrap().contains("empty"));
        assert!(key_problem("a/./b").is_some());
        assert_eq!(as_prefix("p"), "p/");
        assert_eq!(as_prefix("p/"), "p/");
        assert_eq!(as_prefix(""), "");
    }

    #[test]
    fn landings() {
        assert_eq!(landing("a/b", 1), Ok(Landing::File("a/b".into())));
        assert_eq!(landing("a/", 0), Ok(Landing::Dir("a".into())));
        assert!(landing("a/", 1).is_err());
        assert_eq!(landing("", 0), Ok(Landing::Nothing));
        assert_eq!(landing("x/.sluice-cp.json", 9), Ok(Landing::Manifest));
        assert!(landing("../evil", 1).unwrap_err().contains(".."));
        assert!(landing("a/../../evil", 1).is_err());
        assert!(landing("/abs", 1).unwrap_err().contains("absolute"));
        assert!(landing(".sluice-cp-0123456789abcdef.tmp", 1).is_err());
    }

    #[test]
    fn temp_paths_stay_in_the_directory() {
        let t = temp_path(Path::new("/d/sub/file.bin"));
        assert_eq!(t.parent(), Some(Path::new("/d/sub")));
        assert!(is_temp_name(t.file_name().unwrap().to_str().unwrap()));
        assert_eq!(t, temp_path(Path::new("/d/sub/file.bin")));
        assert_ne!(t, temp_path(Path::new("/d/sub/other")));
    }

    #[test]
    fn walks_a_tree() {
        let root = std::env::temp_dir().join(format!("sluice-cp-walk-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::create_dir_all(root.join("empty")).unwrap();
        std::fs::write(root.join("top"), b"1").unwrap();
        std::fs::write(root.join("a/b/ünï"), b"2").unwrap();
        std::fs::write(root.join("a/.sluice-cp.json"), b"{}").unwrap();
        std::fs::write(root.join("a/.sluice-cp-0123456789abcdef.tmp"), b"").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", root.join("link")).unwrap();
        let (files, refused) = walk(&root);
        let rels: Vec<&str> = files.iter().map(|f| f.rel.as_str()).collect();
        assert_eq!(rels, ["a/b/ünï", "top"]);
        assert_eq!(refused.len(), 2, "{refused:?}");
        assert!(refused.iter().any(|r| r.name.ends_with("link") && r.reason.contains("symbolic link")));
        assert!(refused.iter().any(|r| r.name.ends_with(".sluice-cp.json")));
        let _ = std::fs::remove_dir_all(root);
    }
}
