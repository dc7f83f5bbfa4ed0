//! A per-minute token bucket: holds up to `per_minute` units and refills continuously at
//! `per_minute` units per minute, so a client may burst its whole minute's budget and then
//! goes at the steady rate. Time is passed in (milliseconds from any fixed origin), so the
//! arithmetic is tested without a clock.
//!
//! Fixed point: one unit is stored as `SCALE` so that one millisecond of refill,
//! `per_minute / 60_000` units, is a whole number (`per_minute`). The level may go below
//! zero when usage reconciled after a response exceeds what was reserved (a debt, repaid
//! by refill before the next admission), but never below minus one minute's budget.

/// Stored units per unit: refill per millisecond is then exactly `per_minute`.
const SCALE: i64 = 60_000;

/// What a request of some size gets from the bucket now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// It fits now.
    None,
    /// It fits after this many milliseconds of refill.
    Ms(u64),
    /// It is larger than the bucket: it never fits.
    Never,
}

/// One per-minute budget.
#[derive(Debug, Clone)]
pub struct Bucket {
    per_minute: u64,
    /// Units available, times [`SCALE`]; in `[-capacity, capacity]`.
    level: i64,
    /// When `level` was last refilled.
    at_ms: u64,
}

impl Bucket {
    /// A full bucket of `per_minute` units (at most [`crate::config::MAX_PER_MINUTE`],
    /// which config validation guarantees; larger values are clamped to it).
    pub fn full(per_minute: u64, now_ms: u64) -> Bucket {
        let per_minute = per_minute.clamp(1, crate::config::MAX_PER_MINUTE);
        Bucket { per_minute, level: per_minute as i64 * SCALE, at_ms: now_ms }
    }

    pub fn limit(&self) -> u64 {
        self.per_minute
    }

    fn capacity(&self) -> i64 {
        self.per_minute as i64 * SCALE
    }

    /// Adds the refill since the last call. A clock that went backwards adds nothing.
    pub fn refill(&mut self, now_ms: u64) {
        if now_ms <= self.at_ms {
            return;
        }
        let added = i128::from(now_ms - self.at_ms) * i128::from(self.per_minute);
        self.level = (i128::from(self.level) + added).min(i128::from(self.capacity())) as i64;
        self.at_ms = now_ms;
    }

    /// Whether `amount` units fit now (after refilling to `now_ms`).
    pub fn wait(&mut self, amount: u64, now_ms: u64) -> Wait {
        self.refill(now_ms);
        if amount > self.per_minute {
            return Wait::Never;
        }
        let needed = amount as i64 * SCALE;
        if self.level >= needed {
            return Wait::None;
        }
        let missing = (needed - self.level) as u64;
        Wait::Ms(missing.div_ceil(self.per_minute))
    }

    /// Takes `amount` units; call after [`Bucket::wait`] said they fit.
    pub fn take(&mut self, amount: u64) {
        self.adjust(-(amount.min(self.per_minute) as i64));
    }

    /// Gives back (`delta > 0`) or charges (`delta < 0`) units: reconciliation of a
    /// reservation with what was used. Stays within `[-capacity, capacity]`.
    pub fn adjust(&mut self, delta: i64) {
        let scaled = i128::from(delta) * i128::from(SCALE);
        let cap = i128::from(self.capacity());
        self.level = (i128::from(self.level) + scaled).clamp(-cap, cap) as i64;
    }

    /// Whole units available at the last refill.
    pub fn remaining(&self) -> u64 {
        (self.level.max(0) / SCALE) as u64
    }

    /// Milliseconds from the last refill until the bucket is full again.
    pub fn reset_ms(&self) -> u64 {
        ((self.capacity() - self.level) as u64).div_ceil(self.per_minute)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_bucket_admits_its_minute_then_waits_for_refill() {
        let mut b = Bucket::full(60, 0);
        for _ in 0..60 {
            assert_eq!(b.wait(1, 0), Wait::None);
            b.take(1);
        }
        assert_eq!(b.remaining(), 0);
        // 60 per minute: one unit per second.
        assert_eq!(b.wait(1, 0), Wait::Ms(1000));
        assert_eq!(b.wait(1, 999), Wait::Ms(1));
        assert_eq!(b.wait(1, 1000), Wait::None);
        assert_eq!(b.reset_ms(), 59_000);
    }

    #[test]
    fn refill_never_passes_capacity() {
        let mut b = Bucket::full(10, 0);
        b.take(10);
        b.refill(10 * 60_000);
        assert_eq!((b.remaining(), b.reset_ms()), (10, 0));
    }

    #[test]
    fn fractional_refill_is_exact() {
        // 7 per minute: one unit every 8571.43 ms.
        let mut b = Bucket::full(7, 0);
        b.take(7);
        assert_eq!(b.wait(1, 0), Wait::Ms(8572));
        assert_eq!(b.wait(1, 8571), Wait::Ms(1));
        assert_eq!(b.wait(1, 8572), Wait::None);
        assert_eq!(b.wait(7, 8572), Wait::Ms(60_000 - 8572));
    }

    #[test]
    fn a_request_larger_than_the_budget_never_fits() {
        let mut b = Bucket::full(100, 0);
        assert_eq!(b.wait(101, 0), Wait::Never);
        assert_eq!(b.wait(100, 0), Wait::None);
    }

    #[test]
    fn reconciliation_refunds_and_charges_within_bounds() {
        let mut b = Bucket::full(1000, 0);
        b.take(800);
        b.adjust(500); // used 300 of the 800 reserved
        assert_eq!(b.remaining(), 700);
        b.adjust(5000); // a refund cannot overfill
        assert_eq!(b.remaining(), 1000);
        b.adjust(-2500); // used far more than reserved: a debt of at most one minute
        assert_eq!((b.remaining(), b.reset_ms()), (0, 120_000));
        assert_eq!(b.wait(1, 0), Wait::Ms(60_060));
    }

    #[test]
    fn a_clock_going_backwards_adds_nothing() {
        let mut b = Bucket::full(60, 5_000);
        b.take(60);
        assert_eq!(b.wait(1, 1_000), Wait::Ms(1000));
        assert_eq!(b.wait(1, 6_000), Wait::None);
    }
}
