//! HTTP Basic authentication against argon2id hashes.
//!
//! An argon2 verification costs tens of milliseconds of CPU by design, far more than a
//! produce. Credentials that verified once are remembered as an HMAC-SHA256 of
//! `username \0 password` under a random per-process key, next to the hash they verified
//! against: a later request with the same credentials costs one HMAC, and a password change
//! (new hash) or a restart (new key) invalidates the entry. The cache never holds a password.
//! Only the right password is answered from the cache: any other takes a full argon2 check
//! against the stored hash (the dummy hash for unknown users), even when the cache already
//! proves it wrong, so that a refusal costs the same whether or not the user logged in
//! recently.
//!
//! Failed logins are throttled per username and client address: after
//! [`DEFAULT_FREE_FAILURES`] consecutive failures each further failure blocks that pair for
//! twice as long (1 s, 2 s, 4 s, ... up to [`MAX_BLOCK`]), during which even the right password
//! is answered "throttled". Keying by address too means a guesser elsewhere cannot lock a user
//! out of its own clients.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use base64::Engine as _;
use hmac::{Hmac, Mac};
use parking_lot::Mutex;
use sha2::Sha256;

use crate::store::{MAX_PASSWORD_BYTES, UserRecord, UserStore, validate_username};

/// Consecutive failures allowed before a username (from one address) is blocked.
pub const DEFAULT_FREE_FAILURES: u32 = 5;
/// Longest block after repeated failures.
pub const MAX_BLOCK: Duration = Duration::from_secs(60);
/// Remembered credentials; beyond this the cache starts over.
const CACHE_CAPACITY: usize = 10_000;
/// Tracked usernames with failures; beyond this, entries idle for [`FORGET_AFTER`] go.
const THROTTLE_CAPACITY: usize = 100_000;
const FORGET_AFTER: Duration = Duration::from_secs(15 * 60);
const STRIPES: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("authentication required: send HTTP Basic credentials")]
    Missing,
    #[error("malformed Authorization header: {0}")]
    Malformed(&'static str),
    #[error("invalid username or password")]
    BadCredentials,
    #[error("too many failed logins for this user; retry in {retry_after_secs} s")]
    Throttled { retry_after_secs: u64 },
}

struct Cached {
    mac: [u8; 32],
    /// The hash the credentials verified against; a changed password no longer matches.
    password_hash: String,
}

type ThrottleKey = (String, Option<IpAddr>);

struct Failures {
    count: u32,
    blocked_until: Option<Instant>,
    last: Instant,
}

pub struct Authenticator {
    store: Arc<UserStore>,
    /// HMAC-SHA256 keyed with a random key of this process (cloned per check: the key's
    /// blocks are hashed once, not per request).
    keyed: Hmac<Sha256>,
    cache: Mutex<HashMap<String, Cached>>,
    failures: Mutex<HashMap<ThrottleKey, Failures>>,
    /// Failures allowed before blocking; 0: never block.
    free_failures: u32,
    /// Verified against for unknown usernames, so they cost the same as known ones.
    dummy_hash: String,
    /// Bounds concurrent argon2 computations to the cores there are; a permit lives as long
    /// as its computation.
    hashing: Arc<tokio::sync::Semaphore>,
    /// argon2 verifications started, for tests that must prove one ran (a timing test alone
    /// would be flaky on a busy machine).
    argon2_checks: AtomicU64,
    /// Serialise slow-path attempts of one (user, address); striped to bound memory.
    stripes: Vec<tokio::sync::Mutex<()>>,
    stripe_hasher: std::collections::hash_map::RandomState,
}

/// Hashes a password with argon2id (default parameters: 19 MiB, 2 passes). Blocking: call it
/// from a blocking thread.
pub fn hash_password(password: &str) -> String {
    let mut salt = [0u8; 16];
    #[allow(clippy::disallowed_methods)] // a salt: from the OS, never a seeded source
    getrandom::fill(&mut salt).expect("the OS random source works");
    let salt = SaltString::encode_b64(&salt).expect("16 bytes is a valid salt");
    argon2::Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .expect("argon2 with default parameters hashes any password")
        .to_string()
}

fn verify_hash(password: &str, hash: &str) -> bool {
    match PasswordHash::new(hash) {
        Ok(h) => argon2::Argon2::default()
            .verify_password(password.as_bytes(), &h)
            .is_ok(),
        Err(e) => {
            tracing::error!(error = %e, "a stored password hash is unreadable");
            false
        }
    }
}

/// A new user's id: random, never 0.
pub fn new_user_id() -> u64 {
    narad_core::random_u64() | 1
}

/// A random password for the seeded root user: 24 characters of URL-safe base64.
pub fn random_password() -> String {
    let mut b = [0u8; 18];
    #[allow(clippy::disallowed_methods)] // a password: from the OS, never a seeded source
    getrandom::fill(&mut b).expect("the OS random source works");
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

/// A new access key's secret: 30 random bytes, 40 characters of base64 (as AWS's).
pub fn random_key_secret() -> String {
    let mut b = [0u8; 30];
    #[allow(clippy::disallowed_methods)] // a secret: from the OS, never a seeded source
    getrandom::fill(&mut b).expect("the OS random source works");
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// An `Authorization: Basic ...` value decoded: `username:password` in one allocation.
struct Basic {
    raw: String,
    colon: usize,
}

impl Basic {
    fn parse(header: &[u8]) -> Result<Self, AuthError> {
        let text = std::str::from_utf8(header).map_err(|_| AuthError::Malformed("not UTF-8"))?;
        let (scheme, rest) = text
            .trim()
            .split_once(' ')
            .ok_or(AuthError::Malformed("expected 'Basic <base64>'"))?;
        if !scheme.eq_ignore_ascii_case("basic") {
            return Err(AuthError::Malformed("only the Basic scheme is supported"));
        }
        let raw = base64::engine::general_purpose::STANDARD
            .decode(rest.trim())
            .map_err(|_| AuthError::Malformed("credentials are not valid base64"))?;
        let raw = String::from_utf8(raw)
            .map_err(|_| AuthError::Malformed("credentials are not UTF-8"))?;
        let colon = raw.find(':').ok_or(AuthError::Malformed(
            "credentials must be 'username:password'",
        ))?;
        Ok(Self { raw, colon })
    }

    fn user(&self) -> &str {
        &self.raw[..self.colon]
    }

    fn password(&self) -> &str {
        &self.raw[self.colon + 1..]
    }
}

fn blocked(
    f: &HashMap<ThrottleKey, Failures>,
    key: &ThrottleKey,
    now: Instant,
) -> Result<(), AuthError> {
    match f.get(key).and_then(|e| e.blocked_until) {
        Some(until) if until > now => Err(AuthError::Throttled {
            retry_after_secs: (until - now).as_secs_f64().ceil().max(1.0) as u64,
        }),
        _ => Ok(()),
    }
}

fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Authenticator {
    /// `free_failures`: consecutive failures allowed before blocking (0: never block).
    pub fn new(store: Arc<UserStore>, free_failures: u32) -> Self {
        let mut key = [0u8; 32];
        #[allow(clippy::disallowed_methods)] // a key: from the OS, never a seeded source
        getrandom::fill(&mut key).expect("the OS random source works");
        let permits = std::thread::available_parallelism().map_or(2, |n| n.get());
        Self {
            store,
            keyed: <Hmac<Sha256> as Mac>::new_from_slice(&key).expect("any key length"),
            cache: Mutex::default(),
            failures: Mutex::default(),
            free_failures,
            dummy_hash: hash_password(&random_password()),
            hashing: Arc::new(tokio::sync::Semaphore::new(permits)),
            argon2_checks: AtomicU64::new(0),
            stripes: (0..STRIPES).map(|_| tokio::sync::Mutex::new(())).collect(),
            stripe_hasher: Default::default(),
        }
    }

    pub fn store(&self) -> &Arc<UserStore> {
        &self.store
    }

    fn mac(&self, user: &str, password: &str) -> [u8; 32] {
        let mut m = self.keyed.clone();
        m.update(user.as_bytes());
        m.update(&[0]);
        m.update(password.as_bytes());
        m.finalize().into_bytes().into()
    }

    /// Checks an `Authorization` header value from `peer`; returns the user as stored now.
    pub async fn authenticate(
        self: &Arc<Self>,
        header: Option<&[u8]>,
        peer: Option<IpAddr>,
    ) -> Result<Arc<UserRecord>, AuthError> {
        let c = Basic::parse(header.ok_or(AuthError::Missing)?)?;
        self.check(c.user(), c.password(), peer).await
    }

    /// Checks a username and password sent from `peer`.
    pub async fn check(
        self: &Arc<Self>,
        user: &str,
        password: &str,
        peer: Option<IpAddr>,
    ) -> Result<Arc<UserRecord>, AuthError> {
        // a name that cannot exist: refused with no bookkeeping (nothing to remember or log)
        if validate_username(user).is_err() {
            return Err(AuthError::BadCredentials);
        }
        let mac = self.mac(user, password);
        // Fast path for the cached right password only: answering it at HMAC speed tells the
        // caller nothing it did not know. A password the cache proves wrong is not refused
        // here: an HMAC-speed refusal against an argon2-speed one for everyone else told
        // anyone which users had logged in recently (issue 11). It takes the slow path, and
        // is counted there before the next guess of its (user, address) is looked at.
        if let Some(r) = self.cache_hit(user, peer, &mac)? {
            return Ok(r);
        }
        let key = (user.to_owned(), peer);
        // Slow path, in a task of its own so that a client hanging up cannot leave an argon2
        // computation running outside the bound on them, or skip its failure being counted.
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (me, user, password) = (self.clone(), user.to_owned(), password.to_owned());
        tokio::spawn(async move {
            let mut tx = tx;
            let r = me.verify_slow(key, &user, &password, mac, &mut tx).await;
            let _ = tx.send(r);
        });
        // the task always sends unless it panicked; a panic counts as a refusal
        rx.await.unwrap_or(Err(AuthError::BadCredentials))
    }

    /// One attempt at a time per (user, address): each failure is counted before the next
    /// guess is verified, so concurrent guesses cannot outrun the block. An attempt whose
    /// client is gone before its turn is dropped unverified (nobody learns its answer).
    ///
    /// Every password that reaches the hash is verified with argon2, against the stored hash
    /// or the dummy one, whatever the cache knows about it: a refusal costs one argon2 check
    /// for every user, under the same core-count bound and the same throttle.
    async fn verify_slow(
        &self,
        key: ThrottleKey,
        user: &str,
        password: &str,
        mac: [u8; 32],
        client: &mut tokio::sync::oneshot::Sender<Result<Arc<UserRecord>, AuthError>>,
    ) -> Result<Arc<UserRecord>, AuthError> {
        // a client that hangs up while waiting leaves both queues at once, unanswered
        let _turn = tokio::select! {
            t = self.stripes[self.stripe(&key)].lock() => t,
            () = client.closed() => return Err(AuthError::BadCredentials),
        };
        // blocked, or logged in by a concurrent request, while this one waited for its turn
        if let Some(r) = self.cache_hit(user, key.1, &mac)? {
            return Ok(r);
        }
        let record = self.store.get(user);
        let ok = if password.len() > MAX_PASSWORD_BYTES {
            false
        } else {
            let hash = record
                .as_ref()
                .map_or_else(|| self.dummy_hash.clone(), |r| r.password_hash.clone());
            let permit = tokio::select! {
                p = self.hashing.clone().acquire_owned() => p.expect("never closed"),
                () = client.closed() => return Err(AuthError::BadCredentials),
            };
            let pw = password.to_owned();
            self.argon2_checks.fetch_add(1, Ordering::Relaxed);
            tokio::task::spawn_blocking(move || {
                let _permit = permit; // held for as long as the hash runs
                verify_hash(&pw, &hash)
            })
            .await
            .unwrap_or(false)
                && record.is_some()
        };
        match record {
            Some(r) if ok => {
                self.failures.lock().remove(&key);
                let mut cache = self.cache.lock();
                if cache.len() >= CACHE_CAPACITY {
                    cache.clear();
                }
                cache.insert(
                    user.to_owned(),
                    Cached {
                        mac,
                        password_hash: r.password_hash.clone(),
                    },
                );
                Ok(r)
            }
            _ => {
                self.record_failure(key, Instant::now());
                Err(AuthError::BadCredentials)
            }
        }
    }

    /// The block, then the cache, under the failures lock: the block applies first (a hit
    /// would otherwise tell a blocked guesser, at HMAC speed, that a guess was right), and a
    /// hit resets the count like any success. A miss tells nothing apart: whether the cache
    /// holds another password for `user` or nothing, the caller goes on to argon2.
    fn cache_hit(
        &self,
        user: &str,
        peer: Option<IpAddr>,
        mac: &[u8; 32],
    ) -> Result<Option<Arc<UserRecord>>, AuthError> {
        let mut failures = self.failures.lock();
        // (nothing to look up or reset while nobody has failed: the common case, unhashed)
        let key = (!failures.is_empty()).then(|| (user.to_owned(), peer));
        if let Some(key) = &key {
            blocked(&failures, key, Instant::now())?;
        }
        let hit = self.cached(user, mac);
        if let (Some(key), Some(_)) = (&key, &hit) {
            failures.remove(key);
        }
        Ok(hit)
    }

    fn cached(&self, user: &str, mac: &[u8; 32]) -> Option<Arc<UserRecord>> {
        let r = self.store.get(user)?;
        let cache = self.cache.lock();
        let c = cache.get(user)?;
        (c.password_hash == r.password_hash && ct_eq(&c.mac, mac)).then_some(r)
    }

    fn stripe(&self, key: &ThrottleKey) -> usize {
        use std::hash::BuildHasher;
        (self.stripe_hasher.hash_one(key) % self.stripes.len() as u64) as usize
    }

    /// Forgets cached credentials of `user` (after a password change or a delete; the hash
    /// comparison would catch those too, this just frees the entry).
    pub fn forget(&self, user: &str) {
        self.cache.lock().remove(user);
    }

    #[cfg(test)]
    fn throttled(&self, key: &ThrottleKey, now: Instant) -> Result<(), AuthError> {
        blocked(&self.failures.lock(), key, now)
    }

    fn record_failure(&self, key: ThrottleKey, now: Instant) {
        if self.free_failures == 0 {
            return;
        }
        let mut f = self.failures.lock();
        if f.len() >= THROTTLE_CAPACITY {
            f.retain(|_, e| now.duration_since(e.last) < FORGET_AFTER);
            if f.len() >= THROTTLE_CAPACITY {
                tracing::warn!("failed-login table full; forgetting the oldest half");
                let mut lasts: Vec<Instant> = f.values().map(|e| e.last).collect();
                lasts.sort_unstable();
                let cut = lasts[lasts.len() / 2];
                f.retain(|_, e| e.last > cut);
            }
        }
        let (user, peer) = (key.0.clone(), key.1);
        let e = f.entry(key).or_insert(Failures {
            count: 0,
            blocked_until: None,
            last: now,
        });
        if now.duration_since(e.last) >= FORGET_AFTER {
            e.count = 0;
        }
        e.count += 1;
        e.last = now;
        if e.count > self.free_failures {
            let exp = (e.count - self.free_failures - 1).min(16);
            let block = Duration::from_secs(1u64 << exp).min(MAX_BLOCK);
            e.blocked_until = Some(now + block);
            tracing::warn!(user = %user, peer = ?peer, failures = e.count, block_secs = block.as_secs(), "repeated failed logins; user throttled from this address");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{ROOT_USER, UserCommand};

    fn setup() -> (tempfile::TempDir, Arc<Authenticator>) {
        setup_with(DEFAULT_FREE_FAILURES)
    }

    fn setup_with(free_failures: u32) -> (tempfile::TempDir, Arc<Authenticator>) {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(UserStore::open(dir.path()).unwrap());
        store
            .apply(UserCommand::Create {
                user: UserRecord {
                    username: ROOT_USER.into(),
                    id: new_user_id(),
                    password_hash: hash_password("correct horse"),
                    root: true,
                    grants: vec![],
                    created_at_ms: 0,
                    updated_at_ms: 0,
                    carried_from: None,
                    origin: None,
                    access_keys: Vec::new(),
                },
            })
            .unwrap();
        (dir, Arc::new(Authenticator::new(store, free_failures)))
    }

    /// A known user who has never logged in (nothing cached).
    fn add_user(a: &Authenticator, name: &str, password: &str) {
        a.store
            .apply(UserCommand::Create {
                user: UserRecord {
                    username: name.into(),
                    id: new_user_id(),
                    password_hash: hash_password(password),
                    root: false,
                    grants: vec![],
                    created_at_ms: 0,
                    updated_at_ms: 0,
                    carried_from: None,
                    origin: None,
                    access_keys: Vec::new(),
                },
            })
            .unwrap();
    }

    fn argon2_checks(a: &Authenticator) -> u64 {
        a.argon2_checks.load(Ordering::Relaxed)
    }

    fn basic(user: &str, pass: &str) -> Vec<u8> {
        let enc = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
        format!("Basic {enc}").into_bytes()
    }

    #[tokio::test]
    async fn verifies_caches_and_follows_password_changes() {
        let (_d, a) = setup();
        assert_eq!(
            a.authenticate(None, None).await.unwrap_err(),
            AuthError::Missing
        );
        assert!(matches!(
            a.authenticate(Some(b"Bearer x"), None).await,
            Err(AuthError::Malformed(_))
        ));
        let ok = basic(ROOT_USER, "correct horse");
        assert!(a.authenticate(Some(&ok), None).await.unwrap().root);
        assert!(a.cache.lock().contains_key(ROOT_USER));
        assert_eq!(
            a.authenticate(Some(&basic(ROOT_USER, "wrong pass")), None)
                .await,
            Err(AuthError::BadCredentials)
        );
        assert_eq!(
            a.authenticate(Some(&basic("nobody", "whatever1")), None)
                .await,
            Err(AuthError::BadCredentials)
        );
        // a new password: the cached old one stops working at once
        a.store
            .apply(UserCommand::SetPassword {
                username: ROOT_USER.into(),
                password_hash: hash_password("battery staple"),
                at_ms: 1,
            })
            .unwrap();
        assert_eq!(
            a.authenticate(Some(&ok), None).await,
            Err(AuthError::BadCredentials)
        );
        assert!(
            a.authenticate(Some(&basic(ROOT_USER, "battery staple")), None)
                .await
                .is_ok()
        );
    }

    #[tokio::test]
    async fn wrong_guesses_for_a_cached_user_are_counted_and_block() {
        let (_d, a) = setup();
        let peer = Some(IpAddr::from([10, 0, 0, 1]));
        a.check(ROOT_USER, "correct horse", peer).await.unwrap();
        for i in 0..=DEFAULT_FREE_FAILURES {
            assert_eq!(
                a.check(ROOT_USER, &format!("guess {i}"), peer).await,
                Err(AuthError::BadCredentials)
            );
        }
        // blocked now, even for the right password; other addresses are not
        assert!(matches!(
            a.check(ROOT_USER, "correct horse", peer).await,
            Err(AuthError::Throttled { .. })
        ));
        assert!(a.check(ROOT_USER, "correct horse", None).await.is_ok());
    }

    /// Issue 11: refusing a wrong password from the cache alone took 0.2 ms against 12-15 ms
    /// otherwise, telling anyone which users had logged in recently.
    #[tokio::test]
    async fn a_wrong_password_costs_one_argon2_check_whether_or_not_cached() {
        let (_d, a) = setup();
        add_user(&a, "bob", "bob's password");
        a.check(ROOT_USER, "correct horse", None).await.unwrap();
        assert!(a.cache.lock().contains_key(ROOT_USER));
        let before = argon2_checks(&a);
        a.check(ROOT_USER, "correct horse", None).await.unwrap();
        assert_eq!(
            argon2_checks(&a),
            before,
            "the cached right password is answered from the cache"
        );
        for (user, what) in [
            (ROOT_USER, "a user with cached credentials"),
            ("bob", "a user without"),
            ("nobody", "an unknown user"),
        ] {
            let before = argon2_checks(&a);
            assert_eq!(
                a.check(user, "wrong password", None).await,
                Err(AuthError::BadCredentials)
            );
            assert_eq!(
                argon2_checks(&a),
                before + 1,
                "a wrong password for {what} is refused by argon2"
            );
        }
        // the wrong password did not evict the right one
        let before = argon2_checks(&a);
        a.check(ROOT_USER, "correct horse", None).await.unwrap();
        assert_eq!(argon2_checks(&a), before);
    }

    /// Now that a guess the cache proves wrong waits for argon2 too, it must still be counted
    /// before the next guess of the same (user, address) is looked at.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_guesses_for_a_cached_user_cannot_outrun_the_block() {
        let (_d, a) = setup();
        let peer = Some(IpAddr::from([10, 0, 0, 2]));
        a.check(ROOT_USER, "correct horse", peer).await.unwrap();
        let before = argon2_checks(&a);
        let mut guesses = tokio::task::JoinSet::new();
        for i in 0..24 {
            let a = a.clone();
            guesses.spawn(async move { a.check(ROOT_USER, &format!("guess {i}"), peer).await });
        }
        let (mut refused, mut throttled) = (0, 0);
        while let Some(r) = guesses.join_next().await {
            match r.unwrap() {
                Err(AuthError::BadCredentials) => refused += 1,
                Err(AuthError::Throttled { .. }) => throttled += 1,
                other => panic!("a guess got {other:?}"),
            }
        }
        let verified = DEFAULT_FREE_FAILURES as u64 + 1;
        assert_eq!(
            (refused, throttled),
            (verified, 24 - verified),
            "the free failures and the one that blocks were verified, the rest throttled"
        );
        assert_eq!(argon2_checks(&a) - before, verified);
    }

    /// The figures behind issue 11, by the clock: medians of interleaved wrong-password checks.
    /// The structural test above is what guards the fix; this one is for the report.
    #[tokio::test]
    #[ignore = "wall-clock timing, noisy on a shared machine; run by hand with --ignored --nocapture"]
    async fn wrong_passwords_take_as_long_for_cached_uncached_and_unknown_users() {
        const ROUNDS: usize = 15;
        let (_d, a) = setup_with(0);
        add_user(&a, "bob", "bob's password");
        a.check(ROOT_USER, "correct horse", None).await.unwrap();
        let cases = [ROOT_USER, "bob", "nobody"];
        let mut times: [Vec<Duration>; 3] = Default::default();
        for _ in 0..ROUNDS {
            for (user, t) in cases.iter().zip(&mut times) {
                let start = Instant::now();
                assert!(a.check(user, "wrong password", None).await.is_err());
                t.push(start.elapsed());
            }
        }
        let [cached, uncached, unknown] = times.map(|mut t| {
            t.sort_unstable();
            t[ROUNDS / 2].as_secs_f64() * 1e3
        });
        println!(
            "wrong password, median of {ROUNDS}: cached user {cached:.2} ms, \
             uncached user {uncached:.2} ms, unknown user {unknown:.2} ms"
        );
        for (what, ms) in [("cached", cached), ("unknown", unknown)] {
            let ratio = ms / uncached;
            assert!((0.5..=2.0).contains(&ratio), "{what}/uncached = {ratio:.2}");
        }
    }

    #[test]
    fn failures_block_with_growing_backoff_and_success_resets() {
        let (_d, a) = setup();
        let t0 = Instant::now();
        let k = |u: &str| (u.to_owned(), Some(IpAddr::from([127, 0, 0, 1])));
        for _ in 0..DEFAULT_FREE_FAILURES {
            a.record_failure(k("u"), t0);
        }
        assert!(a.throttled(&k("u"), t0).is_ok());
        a.record_failure(k("u"), t0);
        assert_eq!(
            a.throttled(&k("u"), t0),
            Err(AuthError::Throttled {
                retry_after_secs: 1
            })
        );
        assert!(a.throttled(&k("u"), t0 + Duration::from_secs(1)).is_ok());
        a.record_failure(k("u"), t0 + Duration::from_secs(1));
        assert_eq!(
            a.throttled(&k("u"), t0 + Duration::from_secs(1)),
            Err(AuthError::Throttled {
                retry_after_secs: 2
            })
        );
        for i in 0..40 {
            a.record_failure(k("u"), t0 + Duration::from_secs(2 + i));
        }
        let Err(AuthError::Throttled { retry_after_secs }) =
            a.throttled(&k("u"), t0 + Duration::from_secs(41))
        else {
            panic!("still blocked");
        };
        assert!(retry_after_secs <= MAX_BLOCK.as_secs());
        // other names, and the same name from elsewhere, are not affected
        assert!(a.throttled(&k("v"), t0).is_ok());
        assert!(a.throttled(&("u".to_owned(), None), t0).is_ok());
    }
}
