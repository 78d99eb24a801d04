//! Adaptive token bucket: each host refills at its share of the limit and keeps unused
//! tokens in a ring of per-second slots that expire as they age.
//!
//! GRL's earlier mode, kept as an alternative and as the baseline the simulator compares
//! drop-ratio against. A decision may have to take tokens from several slots and rotate the ring
//! at once, so the state sits behind a mutex (uncontended in practice: one bucket per host).

use std::sync::{Mutex, PoisonError};

use super::{ParamError, Rate, Ratio, deny_after, deny_never};
use crate::clock::{NANOS_PER_SEC, Nanos};
use crate::decision::Verdict;

/// Seconds of unused tokens kept by default.
pub const DEFAULT_HISTORY_SECS: u64 = 10;
/// The longest history allowed.
pub const MAX_HISTORY_SECS: u64 = 20;

/// This host's share of the bucket's traffic, `local offered / global offered`, set by the
/// control plane.
pub type Share = Ratio;

const SLOT: Nanos = NANOS_PER_SEC;

/// A token bucket refilled at `share x rate`, whose tokens live in per-second slots.
///
/// With a limit of 1,000/s and a share of 0.25 this host earns 250 tokens a second. Tokens earned
/// during second `s` sit in slot `s` and expire when second `s + history` begins, so with the
/// default 10 s history an idle host holds at most about 2,500 tokens: that is the burst it can
/// absorb, and a burst beyond it is dropped even when the fleet as a whole is under its limit.
/// Tokens are spent oldest first, so fresh ones are kept. A new bucket starts with one second of
/// tokens.
///
/// The share is 1 until [`set_share`](Self::set_share) says otherwise, so a host alone (or one
/// that never heard from the control plane) refills at the full limit.
#[derive(Debug)]
pub struct AdaptiveTokenBucket {
    state: Mutex<State>,
    rate: Rate,
    history: u64,
}

#[derive(Debug)]
struct State {
    /// Tokens earned in second `s` are in `slots[s % history]`.
    slots: [u64; MAX_HISTORY_SECS as usize],
    /// The latest second the ring has been rotated to; `None` before the first use.
    head: Option<u64>,
    /// Earnings are accounted up to this instant...
    earned_to: Nanos,
    /// ...plus this fraction of a token, in units of `1 / (period x 2^32)`.
    frac: u128,
    share: Share,
}

impl AdaptiveTokenBucket {
    /// A bucket for the global `rate`, keeping `history_secs` (1 to 20) seconds of tokens.
    pub fn new(rate: Rate, history_secs: u64) -> Result<Self, ParamError> {
        if !(1..=MAX_HISTORY_SECS).contains(&history_secs) {
            return Err(ParamError::HistoryOutOfRange { secs: history_secs });
        }
        Ok(Self {
            state: Mutex::new(State {
                slots: [0; MAX_HISTORY_SECS as usize],
                head: None,
                earned_to: 0,
                frac: 0,
                share: Ratio::ONE,
            }),
            rate,
            history: history_secs,
        })
    }

    /// Sets this host's share of the limit from `now` on (tokens earned before `now` are kept at
    /// the old share).
    pub fn set_share(&self, now: Nanos, share: Share) {
        let mut s = self.lock();
        self.advance(&mut s, now);
        s.share = share;
    }

    /// The current share.
    pub fn share(&self) -> Share {
        self.lock().share
    }

    /// Whole tokens held at `now`.
    pub fn tokens(&self, now: Nanos) -> u64 {
        let mut s = self.lock();
        self.advance(&mut s, now);
        s.slots[..self.history as usize].iter().sum()
    }

    /// Takes `cost` tokens at `now`, oldest first, if there are enough.
    pub fn decide(&self, now: Nanos, cost: u64) -> Verdict {
        if cost == 0 {
            return Verdict::Allow;
        }
        let mut s = self.lock();
        let now = self.advance(&mut s, now);
        let held: u64 = s.slots[..self.history as usize].iter().sum();
        if held >= cost {
            let head = s.head.unwrap_or(0);
            let mut owed = cost;
            for age in (0..self.history).rev() {
                let Some(second) = head.checked_sub(age) else {
                    continue;
                };
                let slot = &mut s.slots[(second % self.history) as usize];
                let take = owed.min(*slot);
                *slot -= take;
                owed -= take;
                if owed == 0 {
                    break;
                }
            }
            return Verdict::Allow;
        }
        match self.wait_for(&s, now, cost) {
            Some(wait) => deny_after(wait),
            None => deny_never(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Every update below finishes before it could panic, so a poisoned state is consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Earnings per nanosecond as `num / den` tokens.
    fn earn_rate(&self, share: Share) -> (u128, u128) {
        (
            u128::from(self.rate.count()) * u128::from(share.raw()),
            u128::from(self.rate.period_ns()) << 32,
        )
    }

    /// Credits earnings up to `now` into their slots and expires slots that aged out; returns
    /// the time used (never earlier than the last one seen, so the ring only moves forward).
    fn advance(&self, s: &mut State, now: Nanos) -> Nanos {
        let (num, den) = self.earn_rate(s.share);
        let h = self.history;
        let head = match s.head {
            Some(head) => head,
            None => {
                // First use: start with one second of earnings in the current slot.
                let head = now / SLOT;
                let first = u128::from(SLOT) * num / den;
                s.slots[(head % h) as usize] = u64::try_from(first).unwrap_or(u64::MAX);
                s.earned_to = now;
                head
            }
        };
        let now = now.max(s.earned_to);
        let second = now / SLOT;
        let mut head = head;
        if second > head + h {
            // Idle for longer than the history: everything held has expired, and earnings before
            // the last `history` seconds would expire too, so skip them, keeping only the carried
            // fraction, so later earnings round exactly as if every second had been credited.
            s.slots = [0; MAX_HISTORY_SECS as usize];
            head = second - h;
            let skip_to = head * SLOT;
            if skip_to > s.earned_to {
                s.frac = (s.frac + u128::from(skip_to - s.earned_to).saturating_mul(num)) % den;
                s.earned_to = skip_to;
            }
        }
        let earn = |s: &mut State, to: Nanos, second: u64| {
            let total = s.frac + u128::from(to - s.earned_to).saturating_mul(num);
            let slot = &mut s.slots[(second % h) as usize];
            *slot = slot.saturating_add(u64::try_from(total / den).unwrap_or(u64::MAX));
            s.frac = total % den;
            s.earned_to = to;
        };
        while head < second {
            earn(s, (head + 1) * SLOT, head);
            head += 1;
            s.slots[(head % h) as usize] = 0;
        }
        earn(s, now, second);
        s.head = Some(second);
        now
    }

    /// The shortest wait after which `cost` tokens are held, if nothing is spent meanwhile and
    /// the share stays; `None` if that never happens. Exact: the same computation
    /// `advance` does, solved for time second by second.
    fn wait_for(&self, s: &State, now: Nanos, cost: u64) -> Option<Nanos> {
        let (num, den) = self.earn_rate(s.share);
        let h = self.history;
        let head = s.head.unwrap_or(0);
        // Tokens earned in [now, t), with the carried fraction.
        let earned = |t: Nanos| (s.frac + u128::from(t - now) * num) / den;
        let cost = u128::from(cost);
        // After `history` seconds the ring only holds tokens earned since `now`, so the pattern
        // repeats; two histories cover every case.
        for second in head..=head + 2 * h + 1 {
            let oldest = (second + 1).saturating_sub(h);
            let held: u128 = (oldest..=head)
                .map(|sec| u128::from(s.slots[(sec % h) as usize]))
                .sum();
            let start = (second * SLOT).max(now);
            let end = (second + 1) * SLOT;
            let base = held + earned(start) - earned((oldest * SLOT).max(now));
            let t = if base >= cost {
                start
            } else {
                if num == 0 {
                    return None;
                }
                // Smallest t with earned(t) >= cost - held + earned(lo).
                let want = cost - held + earned((oldest * SLOT).max(now));
                let need = (want * den).saturating_sub(s.frac);
                let dt = need.div_ceil(num);
                start.max(now.saturating_add(u64::try_from(dt).unwrap_or(u64::MAX)))
            };
            if t < end {
                return Some(t - now);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = NANOS_PER_SEC;

    #[test]
    fn earns_its_share_and_expires_old_tokens() {
        let b = AdaptiveTokenBucket::new(Rate::per_second(1000).unwrap(), 10).unwrap();
        b.set_share(0, Ratio::from_fraction(1, 4));
        // One second of tokens at the full share (the start), then 250/s.
        assert_eq!(b.tokens(0), 1000);
        assert_eq!(b.tokens(2 * SEC), 1500);
        // Idle long enough, the ring holds only the seconds 91 to 99 in full and the half of
        // second 100 that has passed: 9 x 250 + 125.
        let t = 100 * SEC + SEC / 2;
        assert_eq!(b.tokens(t), 2375);
        assert!(b.decide(t, 2375).is_allow());
        assert_eq!(
            b.decide(t, 1),
            Verdict::Deny {
                retry_after: std::time::Duration::from_millis(4)
            }
        );
        assert!(!b.decide(t + 3_999_999, 1).is_allow());
        assert!(b.decide(t + 4_000_000, 1).is_allow());
    }

    #[test]
    fn refuses_history_out_of_range() {
        let rate = Rate::per_second(10).unwrap();
        assert!(AdaptiveTokenBucket::new(rate, 0).is_err());
        assert!(AdaptiveTokenBucket::new(rate, 21).is_err());
        assert!(AdaptiveTokenBucket::new(rate, 20).is_ok());
    }

    #[test]
    fn zero_share_never_refills() {
        let b = AdaptiveTokenBucket::new(Rate::per_second(10).unwrap(), 10).unwrap();
        b.set_share(0, Ratio::ZERO);
        assert!(b.decide(0, 10).is_allow());
        assert_eq!(
            b.decide(0, 1),
            Verdict::Deny {
                retry_after: crate::decision::NEVER
            }
        );
    }
}
