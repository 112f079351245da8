//! A bound on log lines that requests can cause. A damaged record (or a failing disk) fails
//! every read that reaches it, and a client may ask again as fast as it likes: one ERROR per
//! request would grow the log without limit. A [`LogGate`] lets a few lines through per
//! window and counts the rest, and the next line let through says how many were left out.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// At most `limit` lines per `window`; the rest are counted, not written.
pub struct LogGate {
    window: Duration,
    limit: u32,
    state: Mutex<Window>,
}

struct Window {
    started: Option<Instant>,
    let_through: u32,
    /// Left out since the last line let through.
    suppressed: u64,
}

impl LogGate {
    pub const fn new(limit: u32, window: Duration) -> Self {
        Self {
            window,
            limit,
            state: Mutex::new(Window {
                started: None,
                let_through: 0,
                suppressed: 0,
            }),
        }
    }

    /// Whether a line may be written now: `Some(n)` with the number left out before it, or
    /// `None` (counted) when this window's lines are spent.
    pub fn admit(&self) -> Option<u64> {
        self.admit_at(Instant::now())
    }

    /// [`admit`](Self::admit) at `now` (tests give their own time).
    pub fn admit_at(&self, now: Instant) -> Option<u64> {
        let mut w = self.state.lock();
        let fresh = w
            .started
            .is_none_or(|s| now.saturating_duration_since(s) >= self.window);
        if fresh {
            w.started = Some(now);
            w.let_through = 0;
        }
        if w.let_through < self.limit {
            w.let_through += 1;
            Some(std::mem::take(&mut w.suppressed))
        } else {
            w.suppressed += 1;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_few_lines_per_window_and_the_rest_counted_into_the_next() {
        let gate = LogGate::new(3, Duration::from_secs(10));
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(gate.admit_at(at(0)), Some(0));
        assert_eq!(gate.admit_at(at(1)), Some(0));
        assert_eq!(gate.admit_at(at(2)), Some(0));
        for s in 0..1000 {
            assert_eq!(gate.admit_at(at(3 + s % 7)), None, "burst {s}");
        }
        // a new window: the first line says how many were left out, the next ones nothing
        assert_eq!(gate.admit_at(at(10)), Some(1000));
        assert_eq!(gate.admit_at(at(11)), Some(0));
        assert_eq!(gate.admit_at(at(12)), Some(0));
        assert_eq!(gate.admit_at(at(13)), None);
        assert_eq!(gate.admit_at(at(25)), Some(1));
        // a clock that goes back never panics nor opens the gate
        assert_eq!(gate.admit_at(t0), Some(0));
        assert_eq!(gate.admit_at(t0), Some(0));
        assert_eq!(gate.admit_at(t0), None);
    }
}
