//! Unguessable identifiers for sessions, regions and memory tickets.

use ring::rand::{SecureRandom, SystemRandom};

/// 128 random bits as 32 lowercase hex characters.
pub fn random_id() -> String {
    let mut b = [0u8; 16];
    // The system RNG failing is not recoverable; ring documents it as
    // practically impossible on Linux (getrandom).
    SystemRandom::new().fill(&mut b).expect("system random number generator failed");
    hex::encode(b)
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids_are_distinct_and_long() {
        let a = super::random_id();
        assert_eq!(a.len(), 32);
        assert_ne!(a, super::random_id());
    }
}
