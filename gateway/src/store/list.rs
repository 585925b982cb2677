//! Listing: objects in key order (UTF-8 bytes, as S3 sorts) without
//! reading the whole bucket for each page.
//!
//! A directory's objects all have keys starting with `<dir key>/`, so
//! sorting the entries of each directory by `name` (files) and `name/`
//! (directories) and walking depth-first visits keys in order; a directory
//! whose keys all sort before the resume point, or under a common prefix
//! already reported, is skipped without being read.

use std::path::{Path, PathBuf};

use super::keys;
use super::StoreError;

/// One page of a listing.
#[derive(Debug, Default, PartialEq)]
pub struct Page {
    /// Objects: key and file.
    pub objects: Vec<(String, PathBuf)>,
    /// Common prefixes (with a delimiter).
    pub prefixes: Vec<String>,
    /// More entries follow the last one.
    pub truncated: bool,
    /// The last key or common prefix in the page (the resume point).
    pub last: Option<String>,
}

enum Flow {
    Go,
    Stop,
}

struct Walk<'a> {
    prefix: &'a str,
    /// Only keys strictly after this.
    after: Option<String>,
    /// Keys starting with this are passed over (a reported common prefix).
    skip: Option<String>,
}

impl Walk<'_> {
    /// Whether a directory holding keys `<dir_key>...` can hold a key we want.
    fn wants_dir(&self, dir_key: &str) -> bool {
        let p = self.prefix;
        if !(dir_key.starts_with(p) || p.starts_with(dir_key)) {
            return false;
        }
        if self.skip.as_deref().is_some_and(|s| dir_key.starts_with(s)) {
            return false;
        }
        match self.after.as_deref() {
            Some(a) if !a.starts_with(dir_key) => dir_key > a,
            _ => true,
        }
    }

    fn wants_key(&self, key: &str) -> bool {
        key.starts_with(self.prefix)
            && self.after.as_deref().is_none_or(|a| key > a)
            && self.skip.as_deref().is_none_or(|s| !key.starts_with(s))
    }

    fn visit(
        &mut self,
        dir: &Path,
        base: &str,
        f: &mut dyn FnMut(&mut Self, String, PathBuf) -> Flow,
    ) -> Result<Flow, StoreError> {
        let rd = match std::fs::read_dir(dir) {
            Ok(rd) => rd,
            // Nothing there, or an object where the prefix wants a
            // directory (`a` listed under `a/x/`): no keys, not an error.
            Err(e) if super::is_missing(&e) => return Ok(Flow::Go),
            Err(e) => return Err(StoreError::Io { what: format!("listing {}", dir.display()), source: e }),
        };
        let mut entries: Vec<(String, bool, PathBuf)> = Vec::new();
        for e in rd.flatten() {
            let Ok(ft) = e.file_type() else { continue };
            if !(ft.is_dir() || ft.is_file()) {
                continue; // symlinks and the like are not objects
            }
            let Some(seg) = e.file_name().to_str().and_then(keys::decode_segment) else { continue };
            let mut k = format!("{base}{seg}");
            if ft.is_dir() {
                k.push('/');
            }
            entries.push((k, ft.is_dir(), e.path()));
        }
        entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        for (k, is_dir, path) in entries {
            if is_dir {
                if self.wants_dir(&k) {
                    if let Flow::Stop = self.visit(&path, &k, f)? {
                        return Ok(Flow::Stop);
                    }
                }
            } else if self.wants_key(&k) {
                if let Flow::Stop = f(self, k, path) {
                    return Ok(Flow::Stop);
                }
            }
        }
        Ok(Flow::Go)
    }
}

/// The directory (and its key) under which every key with `prefix` lives.
fn start_dir(bucket_dir: &Path, prefix: &str) -> Option<(PathBuf, String)> {
    let cut = prefix.rfind('/').map_or(0, |i| i + 1);
    let mut dir = bucket_dir.to_owned();
    for seg in prefix[..cut].split('/').take_while(|_| cut > 0) {
        dir.push(keys::encode_segment(seg).ok()?);
    }
    // `split` yields one empty piece after the final '/': drop it.
    if cut > 0 {
        dir.pop();
    }
    Some((dir, prefix[..cut].to_owned()))
}

/// One page: up to `max` objects and common prefixes after `after`.
pub fn page(
    bucket_dir: &Path,
    prefix: &str,
    delimiter: Option<&str>,
    after: Option<&str>,
    max: usize,
) -> Result<Page, StoreError> {
    let mut out = Page::default();
    if max == 0 {
        return Ok(out);
    }
    let Some((dir, base)) = start_dir(bucket_dir, prefix) else { return Ok(out) };
    let delimiter = delimiter.filter(|d| !d.is_empty());
    let mut walk = Walk { prefix, after: after.map(str::to_owned), skip: None };
    let mut count = 0usize;
    walk.visit(&dir, &base, &mut |w, key, path| {
        let cp = delimiter.and_then(|d| {
            let rest = &key[prefix.len()..];
            rest.find(d).map(|i| format!("{prefix}{}", &rest[..i + d.len()]))
        });
        if let Some(cp) = &cp {
            w.skip = Some(cp.clone());
            if w.after.as_deref().is_some_and(|a| cp.as_str() <= a) {
                return Flow::Go; // reported on an earlier page
            }
        }
        if count == max {
            out.truncated = true;
            return Flow::Stop;
        }
        count += 1;
        match cp {
            Some(cp) => {
                out.last = Some(cp.clone());
                out.prefixes.push(cp);
            }
            None => {
                out.last = Some(key.clone());
                out.objects.push((key, path));
            }
        }
        Flow::Go
    })?;
    Ok(out)
}

/// Some object in the directory tree, if there is one.
pub fn first_object(dir: &Path) -> Result<Option<String>, StoreError> {
    Ok(page(dir, "", None, None, 1)?.objects.pop().map(|(k, _)| k))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(keys_: &[&str]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for k in keys_ {
            let p = d.path().join(keys::key_to_path(k).unwrap());
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, k.as_bytes()).unwrap();
        }
        d
    }

    fn all(d: &Path, prefix: &str, delim: Option<&str>, max: usize) -> (Vec<String>, Vec<String>) {
        let (mut objs, mut cps) = (Vec::new(), Vec::new());
        let mut after: Option<String> = None;
        loop {
            let p = page(d, prefix, delim, after.as_deref(), max).unwrap();
            objs.extend(p.objects.into_iter().map(|(k, _)| k));
            cps.extend(p.prefixes);
            if !p.truncated {
                return (objs, cps);
            }
            after = p.last;
        }
    }

    // "b/" is a folder marker with a body; "d//c" has an empty segment.
    const KEYS: &[&str] = &["a", "a-c", "a0", "b/x", "b/y/z", "d//c", "b/", "b-", "c/d/e", "c/d/f", "é", "z%", ".."];

    #[test]
    fn keys_come_in_byte_order_whatever_the_page_size() {
        let d = tree(KEYS);
        let mut want: Vec<String> = KEYS.iter().map(|s| s.to_string()).collect();
        want.sort();
        for max in [1, 2, 3, 1000] {
            assert_eq!(all(d.path(), "", None, max).0, want, "max {max}");
        }
    }

    #[test]
    fn prefixes_and_delimiters() {
        let d = tree(KEYS);
        for max in [1, 2, 1000] {
            let (o, c) = all(d.path(), "", Some("/"), max);
            assert_eq!(o, ["..", "a", "a-c", "a0", "b-", "z%", "é"], "max {max}");
            assert_eq!(c, ["b/", "c/", "d/"]);
            let (o, c) = all(d.path(), "b/", Some("/"), max);
            assert_eq!(o, ["b/", "b/x"]);
            assert_eq!(c, ["b/y/"]);
            assert_eq!(all(d.path(), "d/", Some("/"), max), (vec![], vec!["d//".to_string()]));
            assert_eq!(all(d.path(), "d//", Some("/"), max), (vec!["d//c".to_string()], vec![]));
            let (o, c) = all(d.path(), "c/d/", None, max);
            assert_eq!((o, c.len()), (vec!["c/d/e".to_string(), "c/d/f".to_string()], 0));
            let (o, _) = all(d.path(), "a", None, max);
            assert_eq!(o, ["a", "a-c", "a0"]);
            // A delimiter other than '/'.
            let (o, c) = all(d.path(), "", Some("-"), max);
            assert_eq!(c, ["a-", "b-"]);
            assert!(o.contains(&"b/x".to_string()) && !o.contains(&"a-c".to_string()));
        }
        assert_eq!(all(d.path(), "nothing/", Some("/"), 10), (vec![], vec![]));
        // Under an object's key, as if it were a directory: nothing.
        assert_eq!(all(d.path(), "a/x/", Some("/"), 10), (vec![], vec![]));
        assert_eq!(all(d.path(), "b/x/y", None, 10), (vec![], vec![]));
        assert_eq!(page(d.path(), "", None, None, 0).unwrap(), Page::default());
    }

    #[test]
    fn empty_directories_are_not_objects() {
        let d = tree(&["k"]);
        std::fs::create_dir_all(d.path().join("empty/deeper")).unwrap();
        assert_eq!(all(d.path(), "", None, 10).0, ["k"]);
        assert_eq!(first_object(&d.path().join("empty")).unwrap(), None);
    }
}
