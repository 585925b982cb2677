//! SigV4 header signing for the agent's own S3 requests, with the signing key
//! derived once a day.
//!
//! `aws_sigv4::http_request::sign` is general: per call it derives the
//! signing key (four HMACs), parses the URI, copies every header into a
//! `HeaderMap` and rebuilds the canonical request through several string
//! allocations. It showed as ~12% of the agent's CPU per small GET
//! (docs/performance.md). The agent signs a narrow set of requests whose
//! path and query it encoded itself, so it builds the canonical request in
//! one buffer and keeps the day's key. `aws_sigv4::sign::v4` still derives
//! the key; the tests check every kind of request the agent sends against
//! the crate's full signer, byte for byte.

use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use ring::{digest, hmac};

/// SHA-256 of an empty body, hex.
pub(super) const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
/// The payload hash of a streamed body.
pub(super) const UNSIGNED_PAYLOAD: &str = "UNSIGNED-PAYLOAD";

/// The keys a request is signed with: an access key and its secret, and
/// for temporary credentials (STS) the session token that goes with them.
#[derive(Clone, PartialEq, Eq)]
pub struct Keys {
    pub access_key: String,
    pub secret_key: String,
    pub session_token: Option<String>,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys")
            .field("access_key", &self.access_key)
            .field("secret_key", &"<redacted>")
            .field("session_token", &self.session_token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// One credential's signer for one region (service `s3`).
pub(super) struct Signer {
    keys: Keys,
    region: String,
    /// The key of the day it was derived for (days since the epoch, UTC).
    day_key: Mutex<Option<(u64, hmac::Key)>>,
}

/// The headers a signature adds to a request.
pub(super) struct Signed {
    /// `x-amz-date`.
    pub amz_date: String,
    /// `authorization`.
    pub authorization: String,
    /// `x-amz-security-token`, signed, for temporary credentials.
    pub security_token: Option<String>,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer").field("keys", &self.keys).field("region", &self.region).finish()
    }
}

impl Signer {
    pub fn new(keys: Keys, region: String) -> Self {
        Self { keys, region, day_key: Mutex::new(None) }
    }

    /// Whether it signs with these keys.
    pub fn has_keys(&self, keys: &Keys) -> bool {
        self.keys == *keys
    }

    /// The access key it signs as.
    pub fn access_key(&self) -> &str {
        &self.keys.access_key
    }

    /// The region it signs for.
    pub fn region(&self) -> &str {
        &self.region
    }

    /// Signs a request. `path` is the URI path exactly as sent (already
    /// percent-encoded); `query` the query string exactly as sent, its
    /// pairs sorted and encoded (all but unreserved characters); `headers`
    /// every header to sign but the three added here (`x-amz-date`,
    /// `x-amz-content-sha256` = `payload_sha256`), names lower case,
    /// `host` among them.
    pub fn sign(
        &self,
        method: &str,
        path: &str,
        query: &str,
        headers: &[(&str, &str)],
        payload_sha256: &str,
        now: SystemTime,
    ) -> Signed {
        let secs = now.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let amz_date = amz_date(secs);
        let date = &amz_date[..8];

        // Canonical headers: sorted by name, values trimmed with inner runs
        // of spaces collapsed; repeated names joined with ','.
        let mut all: Vec<(&str, &str)> = Vec::with_capacity(headers.len() + 3);
        all.extend_from_slice(headers);
        all.push(("x-amz-content-sha256", payload_sha256));
        all.push(("x-amz-date", &amz_date));
        if let Some(token) = &self.keys.session_token {
            all.push(("x-amz-security-token", token));
        }
        all.sort_by(|a, b| a.0.cmp(b.0));

        let mut creq = String::with_capacity(256 + path.len() + query.len());
        creq.push_str(method);
        creq.push('\n');
        creq.push_str(if path.is_empty() { "/" } else { path });
        creq.push('\n');
        creq.push_str(query);
        creq.push('\n');
        let mut signed_headers = String::with_capacity(all.len() * 16);
        for (i, (name, value)) in all.iter().enumerate() {
            if i > 0 && all[i - 1].0 == *name {
                creq.pop(); // the previous value's '\n'
                creq.push(',');
            } else {
                if !signed_headers.is_empty() {
                    signed_headers.push(';');
                }
                signed_headers.push_str(name);
                creq.push_str(name);
                creq.push(':');
            }
            push_trimmed(&mut creq, value);
            creq.push('\n');
        }
        creq.push('\n');
        creq.push_str(&signed_headers);
        creq.push('\n');
        creq.push_str(payload_sha256);

        let scope = format!("{date}/{}/s3/aws4_request", self.region);
        let mut sts = String::with_capacity(128);
        sts.push_str("AWS4-HMAC-SHA256\n");
        sts.push_str(&amz_date);
        sts.push('\n');
        sts.push_str(&scope);
        sts.push('\n');
        sts.push_str(&hex::encode(digest::digest(&digest::SHA256, creq.as_bytes())));

        let signature = hex::encode(hmac::sign(&self.key_for(secs / 86_400, now), sts.as_bytes()));
        let authorization = format!(
            "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed_headers}, Signature={signature}",
            self.keys.access_key
        );
        Signed { amz_date, authorization, security_token: self.keys.session_token.clone() }
    }

    /// The signing key for `day`, derived at most once a day.
    fn key_for(&self, day: u64, now: SystemTime) -> hmac::Key {
        let mut slot = self.day_key.lock().unwrap_or_else(|p| p.into_inner());
        match &*slot {
            Some((d, key)) if *d == day => key.clone(),
            _ => {
                let raw = aws_sigv4::sign::v4::generate_signing_key(&self.keys.secret_key, now, &self.region, "s3");
                let key = hmac::Key::new(hmac::HMAC_SHA256, raw.as_ref());
                *slot = Some((day, key.clone()));
                key
            }
        }
    }
}

/// Hex SHA-256 of a body held in memory.
pub(super) fn payload_sha256(body: &[u8]) -> String {
    if body.is_empty() {
        return EMPTY_SHA256.to_owned();
    }
    hex::encode(digest::digest(&digest::SHA256, body))
}

/// Appends `value` with leading and trailing spaces removed and each inner
/// run of spaces made one (SigV4's header value rule; only ' ' counts).
fn push_trimmed(out: &mut String, value: &str) {
    let mut last_space = false;
    for c in value.trim_matches(' ').chars() {
        if c == ' ' {
            if last_space {
                continue;
            }
            last_space = true;
        } else {
            last_space = false;
        }
        out.push(c);
    }
}

/// `YYYYMMDDTHHMMSSZ` for seconds since the epoch (UTC).
fn amz_date(secs: u64) -> String {
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    let mut s = String::with_capacity(16);
    let _ = write!(s, "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60);
    s
}

/// Proleptic Gregorian date of a day number (days since 1970-01-01), after
/// Howard Hinnant's `civil_from_days`.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(amz_date(0), "19700101T000000Z");
        assert_eq!(amz_date(951_782_400), "20000229T000000Z");
        assert_eq!(amz_date(1_795_607_999), "20261125T115959Z");
        assert_eq!(amz_date(4_107_542_400), "21000301T000000Z");
        // Every day boundary over 30 years agrees with the day-number
        // inverse (days_from_civil).
        for day in 0..11_000i64 {
            let (y, m, d) = civil_from_days(day);
            let (yy, mm) = if m <= 2 { (y - 1, m + 9) } else { (y, m - 3) };
            let era = yy.div_euclid(400);
            let yoe = yy - era * 400;
            let doy = (153 * i64::from(mm) + 2) / 5 + i64::from(d) - 1;
            let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
            assert_eq!(era * 146_097 + doe - 719_468, day);
        }
    }

    #[test]
    fn header_values_are_trimmed_like_sigv4() {
        let mut s = String::new();
        push_trimmed(&mut s, "  a  b   c ");
        assert_eq!(s, "a b c");
        s.clear();
        push_trimmed(&mut s, "\ta\t\tb");
        assert_eq!(s, "\ta\t\tb", "only spaces are trimmed");
    }

    #[test]
    fn the_key_is_derived_once_a_day() {
        let keys = Keys { access_key: "AK".into(), secret_key: "SK".into(), session_token: None };
        let s = Signer::new(keys, "us-east-1".into());
        let t = UNIX_EPOCH + std::time::Duration::from_secs(1_795_600_000);
        let a = s.sign("GET", "/b/k", "", &[("host", "h")], EMPTY_SHA256, t);
        let day = s.day_key.lock().unwrap().as_ref().map(|(d, _)| *d);
        assert_eq!(day, Some(1_795_600_000 / 86_400));
        // The next day gets a new key (and so a different signature for the
        // same request at the same time of day).
        let b = s.sign("GET", "/b/k", "", &[("host", "h")], EMPTY_SHA256, t + std::time::Duration::from_secs(86_400));
        assert_ne!(a.authorization, b.authorization);
        assert_eq!(s.day_key.lock().unwrap().as_ref().map(|(d, _)| *d), Some(1_795_600_000 / 86_400 + 1));
    }
}
