//! Bucket names and object keys <-> paths in the directory store.
//!
//! An object is a plain file whose path below the bucket directory is its
//! key, so a directory of files can be served as it is and the files on disk
//! are the objects. Where a key cannot be a path as it is, its segments
//! (between `/`) are escaped, reversibly, so that no two keys share a path
//! and no key leaves its bucket:
//!
//! * `%` becomes `%25` and NUL `%00` (a file name cannot hold NUL);
//! * the segments `.` and `..` become `%2E` and `%2E%2E`;
//! * an empty segment (`a//b`, a trailing `/` as in a folder marker `dir/`)
//!   becomes `%` (escapes are always three characters, so `%` alone is
//!   unambiguous).
//!
//! What a file system cannot hold is refused with a clear 400, never stored
//! under another name: a segment longer than 255 bytes once escaped, and a
//! key that would need a file and a directory at the same path (`a` and
//! `a/b`; see [`KeyError::Conflict`], raised by the store).

use std::path::{Path, PathBuf};

/// The longest key S3 accepts, in bytes of UTF-8.
pub const MAX_KEY_BYTES: usize = 1024;
/// The longest file name Linux file systems take.
const MAX_NAME_BYTES: usize = 255;

/// Why a bucket name or key cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("the object key is empty")]
    Empty,
    #[error("the object key is {0} bytes; S3 keys are at most 1024")]
    TooLong(usize),
    #[error(
        "the key segment {0:?} is longer than this store's 255-byte file names allow; use shorter segments between '/'"
    )]
    SegmentTooLong(String),
    #[error("{0:?} is not a valid bucket name (3-63 characters: lower-case letters, digits, '.', '-'; starting and ending with a letter or digit)")]
    BadBucket(String),
    #[error("key {key:?} cannot be stored: {why} (this store keeps objects as files, so one key cannot be an object and also a prefix followed by '/' of other keys)")]
    Conflict { key: String, why: String },
}

/// Checks a bucket name against S3's rules for new buckets.
pub fn check_bucket(name: &str) -> Result<(), KeyError> {
    let bad = || KeyError::BadBucket(name.to_owned());
    let b = name.as_bytes();
    if !(3..=63).contains(&b.len()) {
        return Err(bad());
    }
    let ok_char = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'.' || *c == b'-';
    let ends_ok = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    if !b.iter().all(ok_char) || !ends_ok(b[0]) || !ends_ok(b[b.len() - 1]) || name.contains("..") {
        return Err(bad());
    }
    Ok(())
}

/// Escapes one key segment (the text between two `/`) into a file name.
pub fn encode_segment(seg: &str) -> Result<String, KeyError> {
    let out = match seg {
        "" => "%".to_owned(),
        "." => "%2E".to_owned(),
        ".." => "%2E%2E".to_owned(),
        s => {
            let mut out = String::with_capacity(s.len());
            for c in s.chars() {
                match c {
                    '%' => out.push_str("%25"),
                    '\0' => out.push_str("%00"),
                    c => out.push(c),
                }
            }
            out
        }
    };
    if out.len() > MAX_NAME_BYTES {
        return Err(KeyError::SegmentTooLong(seg.to_owned()));
    }
    Ok(out)
}

/// The segment a file name stands for; `None` for a name this store never
/// writes (such a file is not an object and is not listed).
pub fn decode_segment(name: &str) -> Option<String> {
    if name == "%" {
        return Some(String::new());
    }
    if !name.contains('%') {
        // Names the encoder would have escaped are not ours.
        return (name != "." && name != "..").then(|| name.to_owned());
    }
    let b = name.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let esc = b.get(i + 1..i + 3)?;
            match esc {
                b"25" => out.push(b'%'),
                b"00" => out.push(0),
                b"2E" => out.push(b'.'),
                _ => return None,
            }
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    let s = String::from_utf8(out).ok()?;
    // The canonical spelling is the only one (`%2E` only for the whole
    // segments "." and ".."): anything else is not ours.
    (encode_segment(&s).ok()? == name).then_some(s)
}

/// The path of `key` relative to its bucket directory.
pub fn key_to_path(key: &str) -> Result<PathBuf, KeyError> {
    if key.is_empty() {
        return Err(KeyError::Empty);
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(KeyError::TooLong(key.len()));
    }
    let mut p = PathBuf::new();
    for seg in key.split('/') {
        p.push(encode_segment(seg)?);
    }
    Ok(p)
}

/// The key a relative path (below the bucket directory) stands for.
pub fn path_to_key(rel: &Path) -> Option<String> {
    let mut key = String::new();
    for (i, c) in rel.components().enumerate() {
        let std::path::Component::Normal(name) = c else { return None };
        if i > 0 {
            key.push('/');
        }
        key.push_str(&decode_segment(name.to_str()?)?);
    }
    (!key.is_empty()).then_some(key)
}

/// S3's `encoding-type=url`: every byte but unreserved characters and `/`
/// percent-encoded (a space as `%20`, `+` as `%2B`), as clients decode with
/// `unquote_plus`.
pub fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_keys_are_their_own_paths() {
        for k in ["a", "train/shard-0001.tar", "ü/日本/x y+z", "a.b/c-d_e~f"] {
            assert_eq!(key_to_path(k).unwrap(), PathBuf::from(k));
            assert_eq!(path_to_key(&key_to_path(k).unwrap()).unwrap(), k);
        }
    }

    #[test]
    fn hostile_keys_stay_inside_and_round_trip() {
        let cases = [
            ("..", "%2E%2E"),
            ("../x", "%2E%2E/x"),
            ("../data/k", "%2E%2E/data/k"),
            (".", "%2E"),
            ("/abs", "%/abs"),
            ("a//b", "a/%/b"),
            ("dir/", "dir/%"),
            ("/", "%/%"),
            ("100%", "100%25"),
            ("%2E", "%252E"),
            ("a/./b/../c", "a/%2E/b/%2E%2E/c"),
            ("nul\0byte", "nul%00byte"),
            ("...", "..."),
        ];
        for (key, path) in cases {
            let p = key_to_path(key).unwrap();
            assert_eq!(p, PathBuf::from(path), "{key:?}");
            assert!(p.components().all(|c| matches!(c, std::path::Component::Normal(_))), "{key:?} -> {p:?}");
            assert_eq!(path_to_key(&p).as_deref(), Some(key), "{path:?}");
        }
    }

    #[test]
    fn names_the_store_never_writes_are_not_objects() {
        for name in ["%41", "%2e", "%2Ex", "%", "50%", "%2", ".", ".."] {
            let key = decode_segment(name);
            if let Some(k) = key {
                assert_eq!(encode_segment(&k).unwrap(), name, "{name:?} decoded to {k:?}");
            }
        }
        assert_eq!(decode_segment("%"), Some(String::new()));
        assert_eq!(decode_segment("50%"), None);
        assert_eq!(decode_segment("%41"), None);
    }

    #[test]
    fn limits_are_clear_errors() {
        assert_eq!(key_to_path(""), Err(KeyError::Empty));
        assert_eq!(key_to_path(&"a".repeat(1025)), Err(KeyError::TooLong(1025)));
        assert!(matches!(key_to_path(&"a".repeat(256)), Err(KeyError::SegmentTooLong(_))));
        assert!(key_to_path(&format!("{}/{}", "a".repeat(255), "b".repeat(255))).is_ok());
    }

    #[test]
    fn distinct_keys_never_share_a_path() {
        // A small exhaustive space over the characters that matter.
        let alphabet = ["a", "/", ".", "%", "2", "E", "\0"];
        let mut keys = vec![String::new()];
        for _ in 0..4 {
            let mut next = Vec::new();
            for k in &keys {
                for c in alphabet {
                    next.push(format!("{k}{c}"));
                }
            }
            keys.extend(next);
            keys.sort();
            keys.dedup();
        }
        let mut seen = std::collections::HashMap::new();
        for k in keys.iter().filter(|k| !k.is_empty()) {
            let p = key_to_path(k).unwrap();
            assert!(p.components().all(|c| matches!(c, std::path::Component::Normal(_))), "{k:?} -> {p:?}");
            assert_eq!(path_to_key(&p).as_deref(), Some(k.as_str()), "{k:?} -> {p:?}");
            if let Some(other) = seen.insert(p.clone(), k.clone()) {
                panic!("{k:?} and {other:?} share {p:?}");
            }
        }
    }

    #[test]
    fn bucket_names() {
        for ok in ["data", "my-bucket.v2", "abc", &"a".repeat(63)] {
            check_bucket(ok).unwrap();
        }
        for bad in ["ab", "Data", "-ab", "ab-", "a..b", ".sluice", "a_b", &"a".repeat(64), "a/b"] {
            assert!(check_bucket(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn url_encoding_matches_s3() {
        assert_eq!(url_encode("a b+c%d/é"), "a%20b%2Bc%25d/%C3%A9");
        assert_eq!(url_encode("plain/key-1_2.~"), "plain/key-1_2.~");
    }
}
