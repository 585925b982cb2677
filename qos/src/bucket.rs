//! Token bucket in integer "nano-tokens" (tokens x 1e9) so refills over
//! nanosecond intervals are exact: no float drift over long windows, which
//! matters for holding a bytes/s limit within a few percent.

use std::time::Duration;

use tokio::time::Instant;

const NANOS_PER_SEC: i128 = 1_000_000_000;

#[derive(Debug)]
pub(crate) struct TokenBucket {
    /// Tokens per second; never zero (validated at configuration).
    rate: u64,
    /// Maximum level in tokens.
    burst: u64,
    /// Current level in nano-tokens. May go negative: `reserve` lets callers
    /// take tokens on credit and sleep off the debt, which keeps concurrent
    /// consumers of one tenant in FIFO order and the long-run rate exact.
    level: i128,
    last: Instant,
}

impl TokenBucket {
    /// A new bucket starts full: a tenant that has been idle is entitled to its burst.
    pub(crate) fn new(rate: u64, burst: u64, now: Instant) -> Self {
        let burst = burst.max(1);
        TokenBucket { rate, burst, level: i128::from(burst) * NANOS_PER_SEC, last: now }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_nanos();
        // Never back: a time read before another caller's refill (a
        // reconfigure reads it before taking the lock) would credit that
        // interval twice.
        self.last = self.last.max(now);
        let added = i128::from(self.rate).saturating_mul(i128::try_from(elapsed).unwrap_or(i128::MAX));
        self.level = self.level.saturating_add(added).min(i128::from(self.burst) * NANOS_PER_SEC);
    }

    /// Time until `deficit` nano-tokens have been refilled, rounded up.
    fn time_for(&self, deficit: i128) -> Duration {
        if deficit <= 0 {
            return Duration::ZERO;
        }
        let rate = i128::from(self.rate.max(1));
        let nanos = (deficit + rate - 1) / rate;
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// Take `n` tokens if available now; otherwise return how long until they will be.
    pub(crate) fn try_take(&mut self, n: u64, now: Instant) -> Result<(), Duration> {
        self.refill(now);
        let want = i128::from(n) * NANOS_PER_SEC;
        if self.level >= want {
            self.level -= want;
            Ok(())
        } else {
            Err(self.time_for(want - self.level))
        }
    }

    /// Take `n` tokens unconditionally (possibly into debt) and return how long
    /// the caller must wait for the debt to be repaid.
    pub(crate) fn reserve(&mut self, n: u64, now: Instant) -> Duration {
        self.refill(now);
        self.level = self.level.saturating_sub(i128::from(n) * NANOS_PER_SEC);
        self.time_for(-self.level)
    }

    /// Hot reload: settle what was earned at the old rate, then switch. The level
    /// (including any debt) is kept, only clamped to the new burst, so a reload
    /// neither grants a fresh burst nor forgives debt.
    pub(crate) fn reconfigure(&mut self, rate: u64, burst: u64, now: Instant) {
        self.refill(now);
        self.rate = rate;
        self.burst = burst.max(1);
        self.level = self.level.min(i128::from(self.burst) * NANOS_PER_SEC);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refill_is_exact_and_capped() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10, 10, t0);
        for _ in 0..10 {
            b.try_take(1, t0).unwrap();
        }
        assert_eq!(b.try_take(1, t0), Err(Duration::from_millis(100)));
        b.try_take(1, t0 + Duration::from_millis(100)).unwrap();
        // A long idle period refills only up to the burst.
        let later = t0 + Duration::from_secs(3600);
        for _ in 0..10 {
            b.try_take(1, later).unwrap();
        }
        assert!(b.try_take(1, later).is_err());
    }

    #[test]
    fn reserve_accumulates_debt() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(1000, 100, t0);
        assert_eq!(b.reserve(100, t0), Duration::ZERO);
        assert_eq!(b.reserve(500, t0), Duration::from_millis(500));
        assert_eq!(b.reserve(500, t0), Duration::from_millis(1000));
        assert_eq!(b.reserve(0, t0 + Duration::from_millis(1000)), Duration::ZERO);
    }

    #[test]
    fn reconfigure_keeps_level_clamped() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(100, 100, t0);
        b.reconfigure(10, 10, t0);
        for _ in 0..10 {
            b.try_take(1, t0).unwrap();
        }
        assert_eq!(b.try_take(1, t0), Err(Duration::from_millis(100)));
    }
}
