//! `namespace/key` paths as clients write them.

use crate::error::ShimError;

/// Splits `ns/key`; the key must be non-empty.
pub fn object_path(path: &str) -> Result<(&str, &str), ShimError> {
    match path.split_once('/') {
        Some((ns, key)) if !ns.is_empty() && !key.is_empty() => Ok((ns, key)),
        _ => Err(ShimError::BadRequest(format!("path {path:?} must look like namespace/key"))),
    }
}

/// Splits `ns` or `ns/prefix` (prefix may be empty).
pub fn list_path(path: &str) -> Result<(&str, &str), ShimError> {
    let (ns, prefix) = path.split_once('/').unwrap_or((path, ""));
    if ns.is_empty() {
        return Err(ShimError::BadRequest(format!("path {path:?} must start with a namespace")));
    }
    Ok((ns, prefix))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        assert_eq!(object_path("data/a/b c").unwrap(), ("data", "a/b c"));
        assert!(object_path("data").is_err());
        assert!(object_path("data/").is_err());
        assert!(object_path("/key").is_err());
        assert_eq!(list_path("data").unwrap(), ("data", ""));
        assert_eq!(list_path("data/p/").unwrap(), ("data", "p/"));
        assert!(list_path("/x").is_err());
    }
}
