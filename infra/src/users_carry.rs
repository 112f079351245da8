//! Carrying this cluster's users to the remotes that have `carry_users` on.
//!
//! One node sends (a cluster's metadata leader; a single node itself): every user but the
//! root, whole, as `PUT /v1/carried-users` on the remote, when the list or the remote
//! changed, and every [`RESEND`] anyway (so a remote restored from an old copy, or a user
//! changed there by hand, is brought back). What the remote does with the list is
//! `narad_auth::carry`'s; its answer (created, updated, deleted, conflicts) is kept per
//! remote for `GET /v1/remotes/{name}` as `users_carry`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use narad_auth::carry::{CarriedUser, MAX_CARRY_BYTES};
use narad_auth::store::UserStore;
use narad_core::broker::Broker;
use narad_core::catalog::RemoteMeta;
use narad_core::supervisor::CancellationToken;
use narad_xregion::sender::{OutcomeLabel, Sender, SenderMetrics};
use serde::Serialize;

/// The remote's path that takes a carried list.
pub const CARRY_PATH: &str = "v1/carried-users";
/// How often the remotes and the users are looked at (a change of the users wakes it at once).
const TICK: Duration = Duration::from_secs(5);
/// A list the remote took is sent again after this long even if nothing changed.
const RESEND: Duration = Duration::from_secs(300);
/// A list the remote did not take is tried again after this long.
const RETRY: Duration = Duration::from_secs(30);
/// ... and after this long when the remote refused the credential: a wrong password tried
/// every 30 s would have the remote throttle that user's logins (its root's, perhaps). A
/// change of the remote (a new password) is tried at once.
const RETRY_AUTH: Duration = Duration::from_secs(300);

/// The last carry to one remote, as `GET /v1/remotes/{name}` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct CarryStatus {
    /// `carried`, `auth_failed` (the remote refused the credential or throttles it: tried
    /// again every 5 minutes, or at once when the remote is changed), `refused` (the remote
    /// answered with another error: see `message`),
    /// `unreachable`, `too_large` (more than 4 MiB of users), or `standby` (another member,
    /// the metadata leader, carries them).
    pub state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Users in the list.
    pub users: usize,
    /// When it was tried (unix ms).
    pub at_ms: i64,
    /// The remote's answer to the last list it took.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<CarryAnswer>,
}

/// What a remote said it did with a list: counts, and the users it left alone with the
/// reason, each checked (a username as this cluster spells them, a reason of
/// `narad_auth::carry::REASONS`): nothing else a remote answers is repeated here.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct CarryAnswer {
    pub created: u64,
    pub updated: u64,
    pub deleted: u64,
    pub unchanged: u64,
    pub conflicts: Vec<CarryConflict>,
    pub conflict_count: u64,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct CarryConflict {
    pub username: String,
    pub reason: String,
}

impl CarryAnswer {
    /// The answer in `body`, or `None` if it is not one.
    fn read(body: &[u8]) -> Option<Self> {
        let mut a: Self = serde_json::from_slice(body).ok()?;
        a.conflicts.truncate(narad_auth::carry::MAX_CONFLICTS_NAMED);
        a.conflicts.retain(|c| {
            narad_auth::store::validate_username(&c.username).is_ok()
                && narad_auth::carry::REASONS.contains(&c.reason.as_str())
        });
        Some(a)
    }
}

/// Where the task keeps what `GET /v1/remotes/{name}` shows.
pub type CarryBoard = Arc<parking_lot::Mutex<HashMap<u64, CarryStatus>>>;

/// The list as last made: of which users (the store's map), for which source.
struct List {
    of: Arc<narad_auth::store::Users>,
    source: String,
    body: Bytes,
    digest: [u8; 32],
    count: usize,
}

/// What was last sent to one remote.
struct Sent {
    version: u64,
    digest: [u8; 32],
    /// When it is due again, whatever changed (a failure's wait holds for a new list too:
    /// only a change of the remote ends it).
    due: Instant,
    /// The remote took it.
    carried: bool,
}

pub struct UsersCarrier {
    pub broker: Arc<Broker>,
    pub store: Arc<UserStore>,
    pub sender: Arc<Sender>,
    /// Whether this node sends (a cluster's metadata leader); `None`: always.
    pub sends: Option<Arc<dyn Fn() -> bool + Send + Sync>>,
    pub board: CarryBoard,
    pub metrics: Arc<SenderMetrics>,
    pub clock: narad_core::clock::SharedClock,
}

impl UsersCarrier {
    pub async fn run(self, stop: CancellationToken) {
        let mut changed = self.store.subscribe();
        let mut sent: HashMap<u64, Sent> = HashMap::new();
        let mut list: Option<List> = None;
        loop {
            self.round(&mut sent, &mut list).await;
            tokio::select! {
                () = stop.cancelled() => return,
                // (a change of the users makes the list's digest another: due)
                _ = changed.changed() => {}
                () = self.clock.sleep(TICK) => {}
            }
        }
    }

    async fn round(&self, sent: &mut HashMap<u64, Sent>, list: &mut Option<List>) {
        let remotes: Vec<Arc<RemoteMeta>> = self
            .broker
            .remotes()
            .into_iter()
            .filter(|r| r.carry_users)
            .collect();
        let mut board = HashMap::new();
        sent.retain(|id, _| remotes.iter().any(|r| r.id == *id));
        if remotes.is_empty() {
            self.publish(board);
            return;
        }
        if self.sends.as_ref().is_some_and(|f| !f()) {
            // another member carries them; this one starts afresh if it becomes the leader
            sent.clear();
            for r in &remotes {
                board.insert(
                    r.id,
                    CarryStatus {
                        state: "standby",
                        message: Some("the cluster's metadata leader carries the users".into()),
                        users: 0,
                        at_ms: self.clock.now_ms(),
                        result: None,
                    },
                );
            }
            self.publish(board);
            return;
        }
        let source = match self.broker.ensure_cluster_id().await {
            Ok(id) => format!("{id:016x}"),
            Err(e) => {
                tracing::warn!(error = %e, "cannot carry users: this cluster has no id");
                return;
            }
        };
        // the list is made again only when the users changed (the store shares one map
        // until a change replaces it)
        let users = self.store.snapshot();
        let fresh = list
            .as_ref()
            .is_some_and(|l| Arc::ptr_eq(&l.of, &users) && l.source == source);
        if !fresh {
            let carried: Vec<CarriedUser> = users
                .values()
                .filter(|u| !u.root)
                .map(|u| CarriedUser::of(u))
                .collect();
            let body = Bytes::from(
                serde_json::json!({ "source_cluster": source, "users": carried }).to_string(),
            );
            let digest: [u8; 32] = {
                use sha2::Digest as _;
                sha2::Sha256::digest(&body).into()
            };
            *list = Some(List {
                of: users,
                source,
                body,
                digest,
                count: carried.len(),
            });
        }
        let List {
            body,
            digest,
            count,
            ..
        } = list.as_ref().expect("made above");
        let (body, digest, count) = (body, *digest, *count);
        let old = self.board.lock().clone();
        for r in remotes {
            let now = Instant::now();
            let due = sent.get(&r.id).is_none_or(|s| {
                s.version != r.version || now >= s.due || (s.carried && s.digest != digest)
            });
            if !due {
                if let Some(s) = old.get(&r.id) {
                    board.insert(r.id, s.clone());
                }
                continue;
            }
            let status = self.carry(&r, body, count).await;
            self.metrics
                .users_carries
                .get_or_create(&OutcomeLabel {
                    outcome: status.state,
                })
                .inc();
            let was = old.get(&r.id).map(|s| s.state);
            if status.state == "carried" {
                if was.is_some_and(|w| w != "carried") {
                    tracing::info!(remote = %r.name, users = count, "users carried to the remote again");
                }
            } else if was != Some(status.state) {
                tracing::warn!(
                    remote = %r.name,
                    state = status.state,
                    error = status.message.as_deref().unwrap_or(""),
                    "users not carried to the remote; tried again every {}s, or at once when the remote is changed",
                    retry_after(status.state).as_secs()
                );
            }
            sent.insert(
                r.id,
                Sent {
                    version: r.version,
                    digest,
                    due: now + retry_after(status.state),
                    carried: status.state == "carried",
                },
            );
            board.insert(r.id, status);
        }
        self.publish(board);
    }

    fn publish(&self, board: HashMap<u64, CarryStatus>) {
        let failing = board
            .values()
            .filter(|s| !matches!(s.state, "carried" | "standby"))
            .count();
        self.metrics.users_carry_failing.set(failing as i64);
        *self.board.lock() = board;
    }

    async fn carry(&self, remote: &RemoteMeta, body: &Bytes, users: usize) -> CarryStatus {
        let status = |state, message: Option<String>, result| CarryStatus {
            state,
            message,
            users,
            at_ms: self.clock.now_ms(),
            result,
        };
        if body.len() > MAX_CARRY_BYTES {
            return status(
                "too_large",
                Some(format!(
                    "the users and their grants take {} bytes, more than a remote takes ({MAX_CARRY_BYTES})",
                    body.len()
                )),
                None,
            );
        }
        let client = match self.sender.remote_client(remote) {
            Ok(c) => c,
            Err(e) => return status("refused", Some(e), None),
        };
        if self.sender.gate(remote.id).is_open() {
            return status(
                "unreachable",
                Some("the remote's gate is open (its links are failing)".into()),
                None,
            );
        }
        let reply = client
            .request(hyper::Method::PUT, CARRY_PATH, Some(body.clone()))
            .await;
        let reply = match reply {
            Ok(r) => r,
            Err(e) => return status("unreachable", Some(e.to_string()), None),
        };
        if reply.status.as_u16() == 200 {
            return status("carried", None, CarryAnswer::read(&reply.body));
        }
        // (the remote's status and error code, nothing of its text)
        let code = serde_json::from_slice::<serde_json::Value>(&reply.body)
            .ok()
            .and_then(|v| {
                v.get("code")?
                    .as_str()
                    .filter(|c| {
                        c.len() <= 64 && c.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
                    })
                    .map(str::to_owned)
            });
        let auth = matches!(reply.status.as_u16(), 401 | 429);
        status(
            if auth { "auth_failed" } else { "refused" },
            Some(format!(
                "the remote answered {}{}",
                reply.status.as_u16(),
                code.map(|c| format!(" {c}")).unwrap_or_default()
            )),
            None,
        )
    }
}

/// When a carry that ended in `state` is tried again.
fn retry_after(state: &str) -> Duration {
    match state {
        "carried" => RESEND,
        "auth_failed" => RETRY_AUTH,
        _ => RETRY,
    }
}
