//! Background tasks under one owner: every long-lived task is spawned through a
//! [`Supervisor`], so none can panic unseen or outlive shutdown.
//!
//! ```text
//!  spawn(name, |stop| task) ─► group `name`: one CancellationToken, one JoinSet
//!     task panics ─► caught at its edge: logged with the name,
//!                    narad_task_panics_total{task=name} + 1, name in TaskHealth::failed()
//!                    (the server's /readyz answers 503 naming it)
//!  stop(name, grace)  ─► cancel the group ─► join its tasks ≤ grace ─► abort the rest (logged)
//!  shutdown(grace)    ─► the same for every group left
//! ```
//!
//! Groups are stopped one by one, so the owner decides the order (the server stops its
//! listeners before the tierer, the broker its fan-out cursors before it persists queue
//! state). Task names are `&'static str`: the metric's labels are a fixed set.
//!
//! **A panicked task is not restarted.** A panic is a bug whose cause is unknown: the task
//! may have died half way through changing shared state (parking_lot locks do not poison),
//! and a restart that panics again would loop. Everything a task works on is durable or
//! rebuilt at start, so the safe recovery is a process restart: the node reports not ready,
//! the panic is counted and logged, and the orchestrator (or the operator) restarts it.
//! The rest of the node keeps serving meanwhile.
//!
//! Modelled on slatedb's `dispatcher.rs` (a cancellation token, a join set, panics turned
//! into a closed state) and quickwit's ordered shutdown.

use std::any::Any;
use std::collections::BTreeMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt as _;
use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::task::JoinSet;
use tokio::time::Instant;
pub use tokio_util::sync::CancellationToken;

/// How long tasks aborted at a lapsed deadline get to reach their next await point.
const ABORT_WAIT: Duration = Duration::from_secs(1);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TaskLabel {
    pub task: &'static str,
}

/// Which supervised tasks panicked. One per node, shared by every supervisor on it (the
/// server's and the broker's), so one look answers readiness.
#[derive(Debug, Default)]
pub struct TaskHealth {
    panics: Family<TaskLabel, Counter>,
    failed: Mutex<BTreeMap<&'static str, u64>>,
}

impl TaskHealth {
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "narad_task_panics",
            "background tasks that panicked, by task; the node reports not ready after one",
            self.panics.clone(),
        );
    }

    /// Makes the panic series of tasks named `task` exist (at 0 until one panics).
    pub fn watch(&self, task: &'static str) {
        let _ = self.panics.get_or_create(&TaskLabel { task });
    }

    /// The names of the tasks that panicked, in name order (empty: all is well).
    pub fn failed(&self) -> Vec<&'static str> {
        self.failed.lock().keys().copied().collect()
    }

    /// How often tasks named `task` panicked.
    pub fn panics(&self, task: &'static str) -> u64 {
        self.failed.lock().get(task).copied().unwrap_or(0)
    }

    /// Records that a task named `task` panicked with `payload` (logged, counted, and the node
    /// reports not ready). For tasks that are not spawned through a [`Supervisor`], such as
    /// the partition log writers, which catch their own panics.
    pub fn record(&self, task: &'static str, payload: &(dyn Any + Send)) {
        let message = payload
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("(no message)");
        tracing::error!(
            task,
            panic = message,
            "background task panicked; the node reports not ready until it is restarted"
        );
        self.panics.get_or_create(&TaskLabel { task }).inc();
        *self.failed.lock().entry(task).or_default() += 1;
    }
}

/// Owns a set of named task groups; see the module documentation.
#[derive(Debug)]
pub struct Supervisor {
    health: Arc<TaskHealth>,
    /// Cancelled by [`Supervisor::shutdown`]; every group's token is a child of it.
    root: CancellationToken,
    groups: Mutex<BTreeMap<&'static str, Group>>,
}

#[derive(Debug)]
struct Group {
    stop: CancellationToken,
    tasks: JoinSet<()>,
    /// Stopped: later spawns into the group are refused.
    stopped: bool,
}

impl Group {
    fn new(root: &CancellationToken) -> Self {
        Self {
            stop: root.child_token(),
            tasks: JoinSet::new(),
            stopped: false,
        }
    }
}

impl Supervisor {
    pub fn new(health: Arc<TaskHealth>) -> Self {
        Self {
            health,
            root: CancellationToken::new(),
            groups: Mutex::default(),
        }
    }

    pub fn health(&self) -> &Arc<TaskHealth> {
        &self.health
    }

    /// Starts `task` in group `name`, handing it the group's stop token: a task should
    /// return soon after the token is cancelled (at a point where stopping loses nothing);
    /// one that does not is aborted when its stop deadline lapses. Returns false (and runs
    /// nothing) once the group or the supervisor was stopped.
    pub fn spawn<F, Fut>(&self, name: &'static str, task: F) -> bool
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let Some(stop) = self.group(name, |g| g.stop.clone()) else {
            return false;
        };
        // built outside the lock: `task` may itself look at the supervisor
        let fut = task(stop);
        let health = self.health.clone();
        // (its panic series exists from the start, at 0: an alert watches its first increase)
        health.watch(name);
        self.group(name, move |group| {
            // tasks that ended (a deleted topic's timer, a detached cursor) leave the set here
            while group.tasks.try_join_next().is_some() {}
            group.tasks.spawn(async move {
                if let Err(payload) = AssertUnwindSafe(fut).catch_unwind().await {
                    health.record(name, payload.as_ref());
                }
            });
        })
        .is_some()
    }

    /// Runs `f` on group `name` (made if new) unless it was stopped.
    fn group<R>(&self, name: &'static str, f: impl FnOnce(&mut Group) -> R) -> Option<R> {
        let mut groups = self.groups.lock();
        let group = groups.entry(name).or_insert_with(|| Group::new(&self.root));
        if group.stopped || self.root.is_cancelled() {
            tracing::debug!(task = name, "not started: stopping");
            return None;
        }
        Some(f(group))
    }

    /// Stops group `name`: cancels its token and waits up to `grace` for its tasks, then
    /// aborts what is left (with a log line). Later spawns into it are refused.
    pub async fn stop(&self, name: &'static str, grace: Duration) {
        let tasks = {
            let mut groups = self.groups.lock();
            let group = groups.entry(name).or_insert_with(|| Group::new(&self.root));
            group.stopped = true;
            group.stop.cancel();
            std::mem::take(&mut group.tasks)
        };
        drain(name, tasks, Instant::now() + grace).await;
    }

    /// Stops every group left, all at once, waiting up to `grace` in all.
    pub async fn shutdown(&self, grace: Duration) {
        self.root.cancel();
        let left: Vec<(&'static str, JoinSet<()>)> = self
            .groups
            .lock()
            .iter_mut()
            .map(|(name, g)| {
                g.stopped = true;
                (*name, std::mem::take(&mut g.tasks))
            })
            .collect();
        let deadline = Instant::now() + grace;
        for (name, tasks) in left {
            drain(name, tasks, deadline).await;
        }
    }

    /// Tasks still running, per group (empty once everything stopped).
    pub fn running(&self) -> Vec<(&'static str, usize)> {
        let mut groups = self.groups.lock();
        groups
            .iter_mut()
            .filter_map(|(name, g)| {
                while g.tasks.try_join_next().is_some() {}
                (!g.tasks.is_empty()).then_some((*name, g.tasks.len()))
            })
            .collect()
    }
}

/// Joins `tasks` until `deadline`, then aborts the rest: a lapse is logged, never a hang.
async fn drain(name: &'static str, mut tasks: JoinSet<()>, deadline: Instant) {
    let all = tokio::time::timeout_at(deadline, join_all(&mut tasks)).await;
    if all.is_ok() {
        return;
    }
    tracing::warn!(
        task = name,
        left = tasks.len(),
        "tasks did not stop before their deadline; aborting them"
    );
    tasks.abort_all();
    if tokio::time::timeout(ABORT_WAIT, join_all(&mut tasks))
        .await
        .is_err()
    {
        tracing::error!(
            task = name,
            left = tasks.len(),
            "aborted tasks did not end (blocked outside an await point); leaving them behind"
        );
        tasks.detach_all();
    }
}

async fn join_all(tasks: &mut JoinSet<()>) {
    // panics were caught inside the task; an error here is an abort, which is expected
    while tasks.join_next().await.is_some() {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant as StdInstant;

    /// Polls `f` (yielding in between) until it holds, for at most 10 s.
    async fn eventually(what: &str, f: impl Fn() -> bool) {
        let deadline = StdInstant::now() + Duration::from_secs(10);
        while !f() {
            assert!(StdInstant::now() < deadline, "{what}");
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panic_is_named_counted_and_leaves_the_others_running() {
        let health = Arc::new(TaskHealth::default());
        let sup = Supervisor::new(health.clone());
        sup.spawn("steady", |stop| async move { stop.cancelled().await });
        assert!(health.failed().is_empty());
        sup.spawn("boom", |_| async { panic!("injected") });
        eventually("the panic was not recorded", || !health.failed().is_empty()).await;
        assert_eq!(health.failed(), vec!["boom"]);
        assert_eq!(health.panics("boom"), 1);
        assert_eq!(
            health
                .panics
                .get_or_create(&TaskLabel { task: "boom" })
                .get(),
            1
        );
        // (the panic is recorded before the task's slot is let go: wait for both)
        eventually("the panicked task still counted as running", || {
            sup.running() == vec![("steady", 1)]
        })
        .await;
        sup.shutdown(Duration::from_secs(5)).await;
        assert!(sup.running().is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn groups_stop_in_the_order_asked_and_none_outlives_shutdown() {
        let sup = Supervisor::new(Arc::default());
        let stopped = Arc::new(Mutex::new(Vec::new()));
        for name in ["first", "second", "third"] {
            let stopped = stopped.clone();
            sup.spawn(name, move |stop| async move {
                stop.cancelled().await;
                stopped.lock().push(name);
            });
        }
        sup.stop("second", Duration::from_secs(5)).await;
        assert_eq!(*stopped.lock(), vec!["second"]);
        assert_eq!(sup.running(), vec![("first", 1), ("third", 1)]);
        assert!(
            !sup.spawn("second", |_| async {}),
            "a stopped group takes no new task"
        );
        sup.stop("first", Duration::from_secs(5)).await;
        sup.shutdown(Duration::from_secs(5)).await;
        assert_eq!(*stopped.lock(), vec!["second", "first", "third"]);
        assert!(sup.running().is_empty());
        assert!(!sup.spawn("fourth", |_| async {}));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_task_that_ignores_its_token_is_aborted_at_the_deadline() {
        let sup = Supervisor::new(Arc::default());
        sup.spawn("stubborn", |_stop| std::future::pending::<()>());
        let started = StdInstant::now();
        sup.stop("stubborn", Duration::from_millis(50)).await;
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(sup.running().is_empty());
    }
}
