//! Users and their credentials: login throttling, the root password, the metrics listener
//! without auth, the CLI's user and schema commands, users that survive kill -9, readiness
//! before users load, and a grant revoked under a parked consume.

use super::*;

#[tokio::test]
async fn failed_logins_are_throttled_then_released() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = Ctx {
        s: secure(dir.path()).await,
        n: Default::default(),
    };
    ctx.user("carol", json!([])).await;
    for i in 0..5 {
        let r = ctx
            .call(
                ("carol", "wrong-password"),
                Method::GET,
                "/v1/users/carol",
                None,
            )
            .await;
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "attempt {i}");
    }
    let r = ctx
        .call(
            ("carol", "wrong-password"),
            Method::GET,
            "/v1/users/carol",
            None,
        )
        .await;
    assert_eq!(
        r.status(),
        StatusCode::UNAUTHORIZED,
        "the sixth failure blocks"
    );
    let r = ctx
        .call(("carol", PW), Method::GET, "/v1/users/carol", None)
        .await;
    assert_eq!(
        r.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "blocked even with the right password"
    );
    assert!(r.headers().get("retry-after").is_some());
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["code"], "login_throttled");
    // concurrent guesses cannot outrun the block: one attempt at a time per user and address
    ctx.user("dave", json!([])).await;
    let guesses = (0..24).map(|i| {
        let pw = format!("guess-number-{i}");
        let c = &ctx;
        async move {
            c.call(("dave", &pw), Method::GET, "/v1/users/dave", None)
                .await
                .status()
        }
    });
    let statuses = futures_util::future::join_all(guesses).await;
    let verified = statuses
        .iter()
        .filter(|s| **s == StatusCode::UNAUTHORIZED)
        .count();
    assert!(
        verified <= 6,
        "at most 5 free failures and the one that blocks were verified, got {verified}: {statuses:?}"
    );
    // other users are not affected
    let r = ctx
        .call(("admin", ROOT_PW), Method::GET, "/v1/users", None)
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    // released after the block (1 s): poll with a deadline
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let r = ctx
            .call(("carol", PW), Method::GET, "/v1/users/carol", None)
            .await;
        if r.status() == StatusCode::OK {
            break;
        }
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(std::time::Instant::now() < deadline, "never released");
        poll_pause().await;
    }
}

#[tokio::test]
async fn root_password_is_generated_once_and_dev_mode_is_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Server::start_opts(dir.path(), false, &[], None).await;
    let log = s.log();
    let pw = log
        .lines()
        .find_map(|l| {
            l.split("created the root user 'admin' with password: ")
                .nth(1)
        })
        .expect("generated password printed")
        .trim()
        .to_owned();
    assert!(pw.len() >= 16);
    let r = s
        .http
        .get(s.url("/v1/users"))
        .basic_auth("admin", Some(&pw))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let r = s.http.get(s.url("/v1/topics")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    s.stop().await;
    s.restart().await;
    assert_eq!(
        s.log().matches("with password:").count(),
        1,
        "printed only at the first start"
    );
    let r = s
        .http
        .get(s.url("/v1/users"))
        .basic_auth("admin", Some(&pw))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK, "the user survives a restart");
    drop(s);

    // --dev: security off, and said so
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path()).await;
    assert!(s.log().contains("security is OFF"));
    assert_eq!(s.get("/v1/topics").await.status(), StatusCode::OK);
    expect_error(
        s.get("/v1/users").await,
        StatusCode::CONFLICT,
        "security_disabled",
    )
    .await;
}

#[tokio::test]
async fn metrics_listener_serves_without_auth() {
    let dir = tempfile::tempdir().unwrap();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let addr = format!("127.0.0.1:{port}");
    let s = Server::start_opts(
        dir.path(),
        false,
        &[
            ("NARAD_ADMIN_PASSWORD", ROOT_PW),
            ("NARAD_METRICS_ADDR", &addr),
        ],
        None,
    )
    .await;
    let r = s
        .http
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.text().await.unwrap().contains("narad_http_requests"));
    // the metrics listener serves nothing else, and says so as the API does
    let r = s
        .http
        .get(format!("http://{addr}/v1/topics"))
        .send()
        .await
        .unwrap();
    expect_error(r, StatusCode::NOT_FOUND, "route_not_found").await;
    let r = s
        .http
        .post(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap();
    expect_error(r, StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed").await;
    assert_eq!(s.get("/metrics").await.status(), StatusCode::UNAUTHORIZED);
}

/// Runs the CLI as `user`; returns (success, stdout, stderr).
async fn cli_as(s: &Server, user: Option<(&str, &str)>, args: &[&str]) -> (bool, String, String) {
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.args(args).env("NARAD_ADDR", &s.base);
    if let Some((u, p)) = user {
        cmd.env("NARAD_USER", u).env("NARAD_PASSWORD", p);
    }
    let out = cmd.output().await.unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn cli_manages_users_and_schemas() {
    let dir = tempfile::tempdir().unwrap();
    let s = secure(dir.path()).await;
    let root = Some(("admin", ROOT_PW));
    // without credentials the CLI says what to set
    let (ok, _, err) = cli_as(&s, None, &["topic", "ls"]).await;
    assert!(!ok && err.contains("NARAD_USER"), "{err}");
    // the original's ways of giving the password work too: -p, and NARAD_PASS
    let (ok, _, err) = cli_as(&s, None, &["-u", "admin", "-p", ROOT_PW, "topic", "ls"]).await;
    assert!(ok, "{err}");
    let out = tokio::process::Command::new(BIN)
        .args(["topic", "ls"])
        .env("NARAD_ADDR", &s.base)
        .env("NARAD_USER", "admin")
        .env("NARAD_PASS", ROOT_PW)
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let (ok, out, err) = cli_as(
        &s,
        root,
        &[
            "user",
            "add",
            "billing",
            "--grant",
            "produce:orders-*",
            "--grant",
            "create:orders-*",
            "--new-password",
            PW,
            "-o",
            "json",
        ],
    )
    .await;
    assert!(ok, "{err}");
    assert!(
        out.contains("\"billing\"") && !out.contains("argon2"),
        "{out}"
    );
    let (ok, out, _) = cli_as(&s, root, &["user", "ls"]).await;
    assert!(
        ok && out.contains("billing") && out.contains("produce:orders-*"),
        "{out}"
    );
    // the new user works under its grants, and a schema file is enforced
    let schema = dir.path().join("order.json");
    std::fs::write(&schema, r#"{"type": "object", "required": ["id"]}"#).unwrap();
    let billing = Some(("billing", PW));
    let (ok, _, err) = cli_as(
        &s,
        billing,
        &[
            "topic",
            "add",
            "orders-eu",
            "--partitions",
            "1",
            "--schema",
            schema.to_str().unwrap(),
        ],
    )
    .await;
    assert!(ok, "{err}");
    let (ok, _, err) = cli_as(&s, billing, &["pub", "orders-eu", "{\"id\": 1}"]).await;
    assert!(ok, "{err}");
    let (ok, _, err) = cli_as(&s, billing, &["pub", "orders-eu", "{\"no\": 1}"]).await;
    assert!(!ok && err.contains("schema_violation"), "{err}");
    let (ok, out, _) = cli_as(&s, billing, &["topic", "schema", "orders-eu", "-o", "json"]).await;
    assert!(ok && out.contains("\"latest\": 1"), "{out}");
    let (ok, out, _) = cli_as(&s, billing, &["topic", "schema", "orders-eu"]).await;
    assert!(ok && out.contains("latest") && !out.contains('{'), "{out}");
    let (ok, _, err) = cli_as(&s, billing, &["topic", "add", "payments"]).await;
    assert!(!ok && err.contains("forbidden"), "{err}");
    // grants replaced; password changed by its owner; then removed
    let (ok, out, err) = cli_as(
        &s,
        root,
        &["user", "grant", "billing", "--grant", "consume:orders-*"],
    )
    .await;
    assert!(ok && out.contains("consume"), "{out}{err}");
    let (ok, _, err) = cli_as(
        &s,
        billing,
        &[
            "user",
            "passwd",
            "billing",
            "--new-password",
            "billing-pw-2",
            "--current",
            PW,
        ],
    )
    .await;
    assert!(ok, "{err}");
    let (ok, _, _) = cli_as(&s, billing, &["topic", "ls"]).await;
    assert!(!ok, "the old password no longer works");
    let (ok, _, err) = cli_as(&s, Some(("billing", "billing-pw-2")), &["topic", "ls"]).await;
    assert!(ok, "{err}");
    let (ok, _, err) = cli_as(&s, root, &["user", "rm", "billing"]).await;
    assert!(ok, "{err}");
    let (ok, _, err) = cli_as(&s, root, &["user", "add", "x", "--grant", "fly:y"]).await;
    assert!(!ok && err.contains("action"), "{err}");
}

/// Users acknowledged (201) before a kill -9 are all there after the restart, and log in.
#[tokio::test]
async fn acknowledged_users_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = secure(dir.path()).await;
    let acked = std::sync::Arc::new(parking_lot::Mutex::new(Vec::<String>::new()));
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (http, url, acked) = (s.http.clone(), s.url("/v1/users"), acked.clone());
            tokio::spawn(async move {
                for i in 0.. {
                    let name = format!("u{w}-{i}");
                    let r = http
                        .post(&url)
                        .basic_auth("admin", Some(ROOT_PW))
                        .json(&json!({"username": name, "password": PW,
                                      "grants": [{"action": "produce", "patterns": ["p-*"]}]}))
                        .send()
                        .await;
                    match r {
                        Ok(r) if r.status() == StatusCode::CREATED => acked.lock().push(name),
                        Ok(r) => panic!("create answered {}", r.status()),
                        Err(_) => return, // the broker is gone
                    }
                }
            })
        })
        .collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while acked.lock().len() < 40 {
        assert!(
            std::time::Instant::now() < deadline,
            "users are not being created"
        );
        poll_pause().await;
    }
    s.kill9();
    for w in workers {
        w.await.unwrap();
    }
    s.restart().await;
    let acked = acked.lock().clone();
    let list = s
        .http
        .get(s.url("/v1/users"))
        .basic_auth("admin", Some(ROOT_PW))
        .send()
        .await
        .unwrap();
    let v: Value = list.json().await.unwrap();
    let have: std::collections::HashSet<&str> = v["users"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["username"].as_str().unwrap())
        .collect();
    for name in &acked {
        assert!(
            have.contains(name.as_str()),
            "acknowledged user {name} lost"
        );
    }
    // and they log in with their passwords
    for name in acked.iter().take(5) {
        let r = s
            .http
            .get(s.url(&format!("/v1/users/{name}")))
            .basic_auth(name, Some(PW))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{name}");
    }
}

/// A fresh node whose archive cannot be read stays not ready (it restores from the archive
/// before it seeds its root user). Until its users are loaded, the root's right password and a
/// wrong one get the same answer, `503 not_ready` (retry), never a `401` that tells a client
/// its credentials are wrong, and however many come, none is throttled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn before_its_users_are_loaded_a_node_says_not_ready_not_unauthorized() {
    let dir = tempfile::tempdir().unwrap();
    let addr_file = dir.path().join("addr");
    let log = dir.path().join("log");
    let out = std::fs::File::create(&log).unwrap();
    let child = std::process::Command::new(BIN)
        .args(["server", "start", "--port", "0", "--data-dir"])
        .arg(dir.path().join("data"))
        .arg("--addr-file")
        .arg(&addr_file)
        .env("NARAD_ADMIN_PASSWORD", ROOT_PW)
        // an S3 archive on a loopback port nothing listens on: the restore retries, never done
        .env("NARAD_ARCHIVE_URL", "s3://restore-pending")
        .env("NARAD_ARCHIVE_ENDPOINT", "http://127.0.0.1:1")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .stdin(std::process::Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap();
    // killed however the test ends
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = Killed(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    let addr = loop {
        if let Ok(a) = std::fs::read_to_string(&addr_file) {
            break a;
        }
        if let Some(status) = child.0.try_wait().unwrap() {
            panic!(
                "narad exited ({status}): {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        assert!(Instant::now() < deadline, "narad did not bind in time");
        poll_pause().await;
    };
    let http = reqwest::Client::new();
    let url = |p: &str| format!("http://{addr}{p}");
    // the restore has failed at least once: the node is in the state a client can meet for
    // as long as the archive stays out of reach
    loop {
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        if said.contains("cannot restore from the archive") {
            break;
        }
        assert!(Instant::now() < deadline, "no restore attempt: {said}");
        poll_pause().await;
    }
    for round in 0..12 {
        for pw in [ROOT_PW, "not-the-password-1"] {
            let r = http
                .get(url("/v1/topics"))
                .basic_auth("admin", Some(pw))
                .send()
                .await
                .unwrap();
            assert_ne!(r.status(), StatusCode::UNAUTHORIZED, "round {round}");
            expect_error(r, StatusCode::SERVICE_UNAVAILABLE, "not_ready").await;
        }
    }
    let r = http.get(url("/readyz")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
}

/// A parked long-poll ends when its caller's grant is revoked or its user deleted (403, 401),
/// and a message produced after that is not leased to it: grants hold at delivery, not only
/// at the request's start (before, the revoked reader got the next message, leased).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_consume_ends_when_its_grant_is_revoked_and_takes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = Ctx {
        s: secure(dir.path()).await,
        n: Default::default(),
    };
    ctx.as_admin(Method::POST, "/v1/topics", Some(json!({"name": "g-1"})))
        .await;
    let consume = json!([{"action": "consume", "patterns": ["g-*"]}]);
    ctx.user("carol", consume.clone()).await;
    ctx.user("dave", consume).await;
    let park = |user: &'static str| {
        let (http, url) = (
            ctx.s.http.clone(),
            ctx.s.url("/v1/topics/g-1/consume?wait=20s"),
        );
        tokio::spawn(async move {
            let r = http
                .get(url)
                .basic_auth(user, Some(PW))
                .send()
                .await
                .unwrap();
            let st = r.status().as_u16();
            (st, r.text().await.unwrap(), Instant::now())
        })
    };
    let waiters = async || {
        ctx.as_admin(Method::GET, "/v1/topics/g-1", None).await["waiters"]
            .as_u64()
            .unwrap_or(0)
    };
    let carol = park("carol");
    let dave = park("dave");
    let deadline = Instant::now() + Duration::from_secs(10);
    while waiters().await < 2 {
        assert!(Instant::now() < deadline, "the readers park");
        poll_pause().await;
    }
    ctx.as_admin(
        Method::PUT,
        "/v1/users/carol/grants",
        Some(json!({"grants": []})),
    )
    .await;
    let revoked = Instant::now();
    let (st, body, at) = carol.await.unwrap();
    assert_eq!(st, 403, "{body}");
    assert!(body.contains("forbidden"), "{body}");
    assert!(
        at.duration_since(revoked) < Duration::from_secs(5),
        "ended at the revoke, not at the wait's end"
    );
    ctx.as_admin(Method::DELETE, "/v1/users/dave", None).await;
    let (st, body, _) = dave.await.unwrap();
    assert_eq!(st, 401, "{body}");
    // nobody else waits; a message produced now is there for the next reader, unleased
    assert_eq!(waiters().await, 0);
    ctx.as_admin(
        Method::POST,
        "/v1/topics/g-1/produce",
        Some(json!({"m": 1})),
    )
    .await;
    let got = ctx
        .as_admin(Method::GET, "/v1/topics/g-1/consume?wait=5s", None)
        .await;
    assert_eq!(got["payload"], json!({"m": 1}), "{got}");
    assert_eq!(got["delivery_count"], json!(1), "{got}");
}
