//! Time, injected: logic takes a [`Clock`] so tests can control it.
//!
//! Everything that reads the wall clock or waits for time to pass goes through a `Clock`:
//! `clippy.toml` bans `SystemTime::now` and the raw sleeps (`std::thread::sleep`,
//! `tokio::time::sleep`, `sleep_until`, `interval`) outside this module, so a test on a
//! [`ManualClock`] moves every timer of the broker by hand instead of waiting. Monotonic time
//! (`Instant`) stays allowed: latency figures and network timeouts measure real elapsed time,
//! never the broker's notion of "now".

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

/// The future of a [`Clock`] sleep.
pub type Sleep<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// Wall-clock milliseconds since the Unix epoch, and waiting for them.
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now_ms(&self) -> i64;

    /// Resolves once [`Clock::now_ms`] has reached `at_ms` (at once if it already has). Never
    /// early: a wall clock stepped back makes it wait longer.
    fn sleep_until(&self, at_ms: i64) -> Sleep<'_>;

    /// Resolves once `d` has passed on this clock. On the system clock this is monotonic
    /// time: a step of the wall clock neither stretches nor cuts a wait, a back-off or an
    /// interval (only deadlines, [`Clock::sleep_until`], follow the wall clock).
    fn sleep(&self, d: Duration) -> Sleep<'_> {
        let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        self.sleep_until(self.now_ms().saturating_add(ms))
    }
}

#[derive(Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        #[allow(clippy::disallowed_methods)] // the one place the wall clock is read
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        d.as_millis() as i64
    }

    fn sleep_until(&self, at_ms: i64) -> Sleep<'_> {
        Box::pin(async move {
            // Sleeps on tokio's monotonic timer for what is left, then looks at the wall
            // clock again: a step back in between means more to wait, never an early wake.
            loop {
                let left = at_ms.saturating_sub(self.now_ms());
                if left <= 0 {
                    return;
                }
                #[allow(clippy::disallowed_methods)] // the raw sleeps: this is the clock
                tokio::time::sleep(Duration::from_millis(left as u64)).await;
            }
        })
    }

    fn sleep(&self, d: Duration) -> Sleep<'_> {
        #[allow(clippy::disallowed_methods)] // the raw sleeps: this is the clock
        Box::pin(tokio::time::sleep(d))
    }
}

/// A clock tests move by hand: sleepers wake when [`ManualClock::advance`] or
/// [`ManualClock::set`] reaches their deadline, and never otherwise.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicI64,
    moved: Notify,
}

impl ManualClock {
    pub fn new(start_ms: i64) -> Arc<Self> {
        Arc::new(Self {
            now: AtomicI64::new(start_ms),
            moved: Notify::new(),
        })
    }
    pub fn advance(&self, ms: i64) {
        self.now.fetch_add(ms, Ordering::SeqCst);
        self.moved.notify_waiters();
    }
    pub fn set(&self, ms: i64) {
        self.now.store(ms, Ordering::SeqCst);
        self.moved.notify_waiters();
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.now.load(Ordering::SeqCst)
    }

    fn sleep_until(&self, at_ms: i64) -> Sleep<'_> {
        Box::pin(async move {
            loop {
                // registered before the time is read, so a move in between still wakes us
                let moved = self.moved.notified();
                tokio::pin!(moved);
                moved.as_mut().enable();
                if self.now_ms() >= at_ms {
                    return;
                }
                moved.await;
            }
        })
    }
}

pub type SharedClock = Arc<dyn Clock>;

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn manual_sleepers_wake_only_when_the_clock_reaches_them() {
        let clock = ManualClock::new(1_000);
        let c = clock.clone();
        let sleeper = tokio::spawn(async move { c.sleep_until(1_500).await });
        let c = clock.clone();
        let short = tokio::spawn(async move { c.sleep(Duration::from_millis(100)).await });
        // let both register; neither may finish while the clock stands still
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert!(!sleeper.is_finished() && !short.is_finished());
        clock.advance(100);
        short.await.unwrap();
        clock.advance(399);
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert!(!sleeper.is_finished(), "woke before its deadline");
        clock.set(1_500);
        sleeper.await.unwrap();
        // a deadline already past resolves at once
        clock.sleep_until(0).await;
    }

    #[tokio::test]
    async fn system_sleep_is_never_early() {
        let clock = SystemClock;
        let at = clock.now_ms() + 20;
        clock.sleep_until(at).await;
        assert!(clock.now_ms() >= at);
    }
}
