//! Security on (production mode): the auth matrix over every route, privilege escalation,
//! throttling, the seeded root user, schemas, and the separate metrics listener.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::support::*;

const ROOT_PW: &str = "root-password-1";
const PW: &str = "user-password-1";

async fn secure(dir: &std::path::Path) -> Server {
    Server::start_opts(
        dir,
        false,
        &[
            ("NARAD_ADMIN_PASSWORD", ROOT_PW),
            // (remotes need one; the matrix's remotes name only localhost, which the address
            // guard refuses to dial: no traffic leaves)
            (
                "NARAD_CLUSTER_SECRET",
                "the auth matrix's cluster secret, 32+ bytes",
            ),
        ],
        None,
    )
    .await
}

#[derive(Clone, Copy, Debug)]
enum Who {
    /// No Authorization header.
    Nobody,
    /// A real user, a wrong password.
    WrongPassword,
    /// A valid user without the needed grant or ownership.
    NoGrant,
    /// A valid user with the grant (and the owner of its topics).
    Granted,
    /// The root admin.
    Admin,
}

const ALL: [Who; 5] = [
    Who::Nobody,
    Who::WrongPassword,
    Who::NoGrant,
    Who::Granted,
    Who::Admin,
];

struct Ctx {
    s: Server,
    n: std::sync::atomic::AtomicUsize,
}

impl Ctx {
    fn next(&self) -> usize {
        self.n.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    async fn call(
        &self,
        who: (&str, &str),
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> reqwest::Response {
        let mut r = self.s.http.request(method, self.s.url(path));
        if !who.0.is_empty() {
            r = r.basic_auth(who.0, Some(who.1));
        }
        if let Some(b) = body {
            r = r.json(&b);
        }
        r.send().await.unwrap()
    }

    async fn as_admin(&self, method: Method, path: &str, body: Option<Value>) -> Value {
        let r = self.call(("admin", ROOT_PW), method, path, body).await;
        let st = r.status();
        let text = r.text().await.unwrap();
        assert!(st.is_success(), "{path}: {st} {text}");
        serde_json::from_str(&text).unwrap_or(Value::Null)
    }

    async fn as_alice(&self, method: Method, path: &str, body: Option<Value>) -> Value {
        let r = self.call(("alice", PW), method, path, body).await;
        let st = r.status();
        let text = r.text().await.unwrap();
        assert!(st.is_success(), "{path}: {st} {text}");
        serde_json::from_str(&text).unwrap_or(Value::Null)
    }

    async fn user(&self, name: &str, grants: Value) {
        self.as_admin(
            Method::POST,
            "/v1/users",
            Some(json!({"username": name, "password": PW, "grants": grants})),
        )
        .await;
    }

    /// A remote made by the admin (naming localhost: never dialled).
    async fn remote(&self) -> String {
        let name = format!("rm{}", self.next());
        self.as_admin(
            Method::POST,
            "/v1/remotes",
            Some(
                json!({"name": name, "url": "https://localhost", "username": "u", "password": "p"}),
            ),
        )
        .await;
        name
    }

    /// A topic owned by alice, with one message in it.
    async fn topic(&self) -> String {
        let name = format!("m-{}", self.next());
        self.as_alice(
            Method::POST,
            "/v1/topics",
            Some(json!({"name": name, "partitions": 1})),
        )
        .await;
        let r = self
            .s
            .http
            .post(self.s.url(&format!("/v1/topics/{name}/produce")))
            .basic_auth("alice", Some(PW))
            .body("{\"id\": 1}")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::ACCEPTED);
        name
    }

    /// Credentials for `who`; a wrong password goes to a fresh user, so no row is throttled.
    async fn creds(&self, who: Who) -> (String, String) {
        match who {
            Who::Nobody => (String::new(), String::new()),
            Who::WrongPassword => {
                let name = format!("w{}", self.next());
                self.user(&name, json!([{"action": "produce", "patterns": ["*"]}]))
                    .await;
                (name, "not-the-password".into())
            }
            Who::NoGrant => ("nobody".into(), PW.into()),
            Who::Granted => ("alice".into(), PW.into()),
            Who::Admin => ("admin".into(), ROOT_PW.into()),
        }
    }
}

/// One row of the matrix: a route, how to build its request (given fresh fixtures), and the
/// status expected for each caller in [`ALL`] order.
struct Row {
    route: &'static str,
    expect: [u16; 5],
}

async fn request_for(ctx: &Ctx, route: &str) -> (Method, String, Option<Value>) {
    let i = ctx.next();
    match route {
        "GET /healthz" => (Method::GET, "/healthz".into(), None),
        "GET /readyz" => (Method::GET, "/readyz".into(), None),
        "GET /metrics" => (Method::GET, "/metrics".into(), None),
        "GET /v1/cluster" => (Method::GET, "/v1/cluster".into(), None),
        "DELETE /v1/cluster/members/{node_id}" => {
            (Method::DELETE, "/v1/cluster/members/7".into(), None)
        }
        "POST /v1/cluster/members/{node_id}/decommission" => (
            Method::POST,
            "/v1/cluster/members/7/decommission".into(),
            None,
        ),
        "DELETE /v1/cluster/members/{node_id}/decommission" => (
            Method::DELETE,
            "/v1/cluster/members/7/decommission".into(),
            None,
        ),
        "POST /v1/cluster/members/{node_id}/forget" => {
            (Method::POST, "/v1/cluster/members/7/forget".into(), None)
        }
        "POST /v1/cluster/rebalance" => (Method::POST, "/v1/cluster/rebalance".into(), None),
        "POST /v1/cluster/moves" => (
            Method::POST,
            "/v1/cluster/moves".into(),
            Some(json!({"topic": "m-t", "partition": 0, "to": 2})),
        ),
        "GET /v1/cluster/moves" => (Method::GET, "/v1/cluster/moves".into(), None),
        "DELETE /v1/cluster/moves/{topic}/{partition}" => {
            (Method::DELETE, "/v1/cluster/moves/m-t/0".into(), None)
        }
        "DELETE /v1/cluster/moves/{topic}/{partition}/pin" => {
            (Method::DELETE, "/v1/cluster/moves/m-t/0/pin".into(), None)
        }
        "POST /v1/topics" => (
            Method::POST,
            "/v1/topics".into(),
            Some(json!({"name": format!("m-new-{i}")})),
        ),
        "GET /v1/topics" => (Method::GET, "/v1/topics".into(), None),
        "GET /v1/topics/{topic}" => (
            Method::GET,
            format!("/v1/topics/{}", ctx.topic().await),
            None,
        ),
        "PATCH /v1/topics/{topic}" => (
            Method::PATCH,
            format!("/v1/topics/{}", ctx.topic().await),
            Some(json!({"retention_ms": 3_600_000})),
        ),
        "DELETE /v1/topics/{topic}" => (
            Method::DELETE,
            format!("/v1/topics/{}", ctx.topic().await),
            None,
        ),
        "POST /v1/topics/{topic}/produce" => (
            Method::POST,
            format!("/v1/topics/{}/produce?key=k", ctx.topic().await),
            Some(json!({"id": 2})),
        ),
        "POST /v1/topics/{topic}/produce/batch" => (
            Method::POST,
            format!("/v1/topics/{}/produce/batch", ctx.topic().await),
            Some(json!({"messages": [{"payload": {"id": 3}}]})),
        ),
        "GET /v1/topics/{topic}/consume" => (
            Method::GET,
            format!("/v1/topics/{}/consume?wait=0", ctx.topic().await),
            None,
        ),
        "POST /v1/topics/{topic}/ack" => {
            let t = ctx.topic().await;
            let m = ctx
                .as_admin(Method::GET, &format!("/v1/topics/{t}/consume?wait=0"), None)
                .await;
            let h = m["receipt_handle"].as_str().unwrap().to_owned();
            (
                Method::POST,
                format!("/v1/topics/{t}/ack?receipt_handle={h}"),
                None,
            )
        }
        "POST /v1/topics/{topic}/children" => {
            let (p, c) = (ctx.topic().await, ctx.topic().await);
            (
                Method::POST,
                format!("/v1/topics/{p}/children"),
                Some(json!({"child": c})),
            )
        }
        "GET /v1/topics/{topic}/children" => (
            Method::GET,
            format!("/v1/topics/{}/children", ctx.topic().await),
            None,
        ),
        "DELETE /v1/topics/{topic}/children/{child}" => {
            let (p, c) = (ctx.topic().await, ctx.topic().await);
            ctx.as_alice(
                Method::POST,
                &format!("/v1/topics/{p}/children"),
                Some(json!({"child": c})),
            )
            .await;
            (Method::DELETE, format!("/v1/topics/{p}/children/{c}"), None)
        }
        "GET /v1/topics/{topic}/schema" => (
            Method::GET,
            format!("/v1/topics/{}/schema", ctx.topic().await),
            None,
        ),
        "POST /v1/users" => (
            Method::POST,
            "/v1/users".into(),
            Some(json!({"username": format!("new{i}"), "password": PW})),
        ),
        "GET /v1/users" => (Method::GET, "/v1/users".into(), None),
        "POST /v1/remotes" => (
            Method::POST,
            "/v1/remotes".into(),
            Some(
                json!({"name": format!("r{i}"), "url": "https://localhost", "username": "u", "password": "p"}),
            ),
        ),
        "GET /v1/remotes" => (Method::GET, "/v1/remotes".into(), None),
        "GET /v1/remotes/{name}" => (
            Method::GET,
            format!("/v1/remotes/{}", ctx.remote().await),
            None,
        ),
        "PATCH /v1/remotes/{name}" => (
            Method::PATCH,
            format!("/v1/remotes/{}", ctx.remote().await),
            Some(json!({"password": "another"})),
        ),
        "DELETE /v1/remotes/{name}" => (
            Method::DELETE,
            format!("/v1/remotes/{}", ctx.remote().await),
            None,
        ),
        "POST /v1/remotes/{name}/test" => (
            Method::POST,
            format!("/v1/remotes/{}/test", ctx.remote().await),
            None,
        ),
        "POST /v1/cluster/reencrypt-remotes" => {
            (Method::POST, "/v1/cluster/reencrypt-remotes".into(), None)
        }
        "POST /v1/topics/{topic}/children/{child}/pause" => (
            Method::POST,
            format!("/v1/topics/{}/children/nothere/pause", ctx.topic().await),
            None,
        ),
        "POST /v1/topics/{topic}/children/{child}/resume" => (
            Method::POST,
            format!("/v1/topics/{}/children/nothere/resume", ctx.topic().await),
            None,
        ),
        "POST /v1/topics/{topic}/children/{child}/skip" => (
            Method::POST,
            format!("/v1/topics/{}/children/nothere/skip", ctx.topic().await),
            None,
        ),
        "POST /v1/topics/{topic}/mirror" => (
            Method::POST,
            format!("/v1/topics/{}/mirror", ctx.topic().await),
            Some(
                json!({"source_cluster": "00000000000000c1", "source_topic": "00000000000000a1", "epoch": 0}),
            ),
        ),
        "POST /v1/topics/{topic}/progress" => (
            Method::POST,
            format!("/v1/topics/{}/progress", ctx.topic().await),
            Some(json!({"partition": 0, "frontier": 0})),
        ),
        "POST /v1/topics/{topic}/promote" => (
            Method::POST,
            format!("/v1/topics/{}/promote", ctx.topic().await),
            None,
        ),
        "POST /v1/topics/{topic}/demote" => (
            Method::POST,
            format!("/v1/topics/{}/demote", ctx.topic().await),
            None,
        ),
        "GET /v1/users/{username}" => (Method::GET, "/v1/users/bob".into(), None),
        "DELETE /v1/users/{username}" => {
            let u = format!("del{i}");
            ctx.user(&u, json!([])).await;
            (Method::DELETE, format!("/v1/users/{u}"), None)
        }
        "PUT /v1/users/{username}/grants" => {
            let u = format!("gr{i}");
            ctx.user(&u, json!([])).await;
            (
                Method::PUT,
                format!("/v1/users/{u}/grants"),
                Some(json!({"grants": [{"action": "consume", "patterns": ["m-*"]}]})),
            )
        }
        "PUT /v1/users/{username}/password" => {
            let u = format!("pw{i}");
            ctx.user(&u, json!([])).await;
            (
                Method::PUT,
                format!("/v1/users/{u}/password"),
                Some(json!({"new_password": "another-password"})),
            )
        }
        other => panic!("no request for {other}: add it to the matrix"),
    }
}

const U: u16 = 401;
const F: u16 = 403;

fn rows() -> Vec<Row> {
    let r = |route, expect| Row { route, expect };
    vec![
        r("GET /healthz", [200, 200, 200, 200, 200]),
        r("GET /readyz", [200, 200, 200, 200, 200]),
        // metrics need admin (or the separate metrics listener)
        r("GET /metrics", [U, U, F, F, 200]),
        r("GET /v1/cluster", [U, U, F, F, 200]),
        // (a single node: nothing to remove)
        r("DELETE /v1/cluster/members/{node_id}", [U, U, F, F, 409]),
        // (a single node: nothing to move, drain, forget or rebalance)
        r(
            "POST /v1/cluster/members/{node_id}/decommission",
            [U, U, F, F, 409],
        ),
        r(
            "DELETE /v1/cluster/members/{node_id}/decommission",
            [U, U, F, F, 409],
        ),
        r(
            "POST /v1/cluster/members/{node_id}/forget",
            [U, U, F, F, 409],
        ),
        r("POST /v1/cluster/rebalance", [U, U, F, F, 409]),
        r("POST /v1/cluster/moves", [U, U, F, F, 409]),
        r("GET /v1/cluster/moves", [U, U, F, F, 409]),
        r(
            "DELETE /v1/cluster/moves/{topic}/{partition}",
            [U, U, F, F, 409],
        ),
        r(
            "DELETE /v1/cluster/moves/{topic}/{partition}/pin",
            [U, U, F, F, 409],
        ),
        r("POST /v1/topics", [U, U, F, 201, 201]),
        r("GET /v1/topics", [U, U, 200, 200, 200]),
        r("GET /v1/topics/{topic}", [U, U, F, 200, 200]),
        r("PATCH /v1/topics/{topic}", [U, U, F, 200, 200]),
        r("DELETE /v1/topics/{topic}", [U, U, F, 204, 204]),
        r("POST /v1/topics/{topic}/produce", [U, U, F, 202, 202]),
        r("POST /v1/topics/{topic}/produce/batch", [U, U, F, 202, 202]),
        r("GET /v1/topics/{topic}/consume", [U, U, F, 200, 200]),
        r("POST /v1/topics/{topic}/ack", [U, U, F, 204, 204]),
        r("POST /v1/topics/{topic}/children", [U, U, F, 200, 200]),
        r("GET /v1/topics/{topic}/children", [U, U, F, 200, 200]),
        r(
            "DELETE /v1/topics/{topic}/children/{child}",
            [U, U, F, 204, 204],
        ),
        r("GET /v1/topics/{topic}/schema", [U, U, F, 200, 200]),
        // a topic's role between clusters: a link's user (replicate) makes it a mirror; an
        // admin promotes and demotes
        r("POST /v1/topics/{topic}/mirror", [U, U, F, F, 200]),
        // (progress comes only with a link's header)
        r("POST /v1/topics/{topic}/progress", [U, U, F, F, 400]),
        r("POST /v1/topics/{topic}/promote", [U, U, F, F, 200]),
        r("POST /v1/topics/{topic}/demote", [U, U, F, F, 200]),
        // user management is for admins
        r("POST /v1/users", [U, U, F, F, 201]),
        r("GET /v1/users", [U, U, F, F, 200]),
        r("GET /v1/users/{username}", [U, U, F, F, 200]),
        r("DELETE /v1/users/{username}", [U, U, F, F, 204]),
        r("PUT /v1/users/{username}/grants", [U, U, F, F, 200]),
        r("PUT /v1/users/{username}/password", [U, U, F, F, 204]),
        // remotes and remote children are for admins (an admin pausing a child that is not
        // there is told so)
        r("POST /v1/remotes", [U, U, F, F, 201]),
        r("GET /v1/remotes", [U, U, F, F, 200]),
        r("GET /v1/remotes/{name}", [U, U, F, F, 200]),
        r("PATCH /v1/remotes/{name}", [U, U, F, F, 200]),
        r("DELETE /v1/remotes/{name}", [U, U, F, F, 204]),
        r("POST /v1/remotes/{name}/test", [U, U, F, F, 200]),
        r("POST /v1/cluster/reencrypt-remotes", [U, U, F, F, 200]),
        r(
            "POST /v1/topics/{topic}/children/{child}/pause",
            [U, U, F, F, 404],
        ),
        r(
            "POST /v1/topics/{topic}/children/{child}/resume",
            [U, U, F, F, 404],
        ),
        r(
            "POST /v1/topics/{topic}/children/{child}/skip",
            [U, U, F, F, 404],
        ),
    ]
}

#[tokio::test]
async fn auth_matrix_covers_every_route() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = Ctx {
        s: secure(dir.path()).await,
        n: Default::default(),
    };
    // alice: produce, consume and create on m-*; nobody: only on x-*; bob: a plain user
    ctx.user(
        "alice",
        json!([
            {"action": "produce", "patterns": ["m-*"]},
            {"action": "consume", "patterns": ["m-*"]},
            {"action": "create", "patterns": ["m-*"]}
        ]),
    )
    .await;
    ctx.user(
        "nobody",
        json!([{"action": "produce", "patterns": ["x-*"]}]),
    )
    .await;
    ctx.user("bob", json!([])).await;

    let rows = rows();
    // every route the server has is in the matrix, and nothing else
    let mut listed: Vec<String> = rows.iter().map(|r| r.route.to_owned()).collect();
    let mut routed: Vec<String> = narad_infra::http::ROUTES
        .iter()
        .map(|(m, p)| format!("{m} {p}"))
        .collect();
    listed.sort();
    routed.sort();
    assert_eq!(
        listed, routed,
        "the auth matrix must cover exactly the routes"
    );

    let mut failures = Vec::new();
    for row in &rows {
        for (who, want) in ALL.iter().zip(row.expect) {
            let (method, path, body) = request_for(&ctx, row.route).await;
            let creds = ctx.creds(*who).await;
            let r = ctx.call((&creds.0, &creds.1), method, &path, body).await;
            let got = r.status().as_u16();
            let www = r.headers().get("www-authenticate").is_some();
            let text = r.text().await.unwrap();
            if got != want {
                failures.push(format!(
                    "{} as {who:?}: want {want}, got {got}: {text}",
                    row.route
                ));
            }
            if got == 401 {
                assert!(www, "401 without WWW-Authenticate: {}", row.route);
            }
            if got >= 400 {
                let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                assert!(
                    v["error"].is_string() && v["code"].is_string(),
                    "JSON error body: {text}"
                );
            }
            assert!(!text.contains("argon2"), "a password hash leaked: {text}");
        }
    }
    assert!(
        failures.is_empty(),
        "auth matrix mismatches:\n{}",
        failures.join("\n")
    );
}

#[tokio::test]
async fn no_privilege_escalation() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = Ctx {
        s: secure(dir.path()).await,
        n: Default::default(),
    };
    let admin_grant = json!([{"action": "admin"}]);
    ctx.user("ops", admin_grant.clone()).await; // root may grant admin
    ctx.user("ops2", admin_grant.clone()).await;
    ctx.user(
        "alice",
        json!([{"action": "create", "patterns": ["a-*"]}, {"action": "produce", "patterns": ["a-*"]}]),
    )
    .await;
    ctx.user("bob", json!([{"action": "create", "patterns": ["b-*"]}]))
        .await;
    let ops = ("ops", PW);
    let expect = |r: reqwest::Response, st: u16, what: &str| {
        assert_eq!(r.status().as_u16(), st, "{what}");
    };
    // a non-root admin cannot hand out admin, to a new user or an existing one
    let r = ctx
        .call(
            ops,
            Method::POST,
            "/v1/users",
            Some(json!({"username": "x1", "password": PW, "grants": admin_grant})),
        )
        .await;
    expect(r, 403, "non-root admin creates an admin");
    let r = ctx
        .call(
            ops,
            Method::PUT,
            "/v1/users/alice/grants",
            Some(json!({"grants": admin_grant})),
        )
        .await;
    expect(r, 403, "non-root admin grants admin");
    // nobody edits their own grants
    let r = ctx
        .call(
            ops,
            Method::PUT,
            "/v1/users/ops/grants",
            Some(json!({"grants": []})),
        )
        .await;
    expect(r, 403, "own grants");
    let r = ctx
        .call(
            ("admin", ROOT_PW),
            Method::PUT,
            "/v1/users/admin/grants",
            Some(json!({"grants": []})),
        )
        .await;
    expect(r, 403, "root's grants are fixed");
    // root cannot be deleted, admins are root's to manage
    let r = ctx.call(ops, Method::DELETE, "/v1/users/admin", None).await;
    expect(r, 403, "delete root");
    let r = ctx
        .call(("admin", ROOT_PW), Method::DELETE, "/v1/users/admin", None)
        .await;
    expect(r, 403, "root deletes itself");
    let r = ctx.call(ops, Method::DELETE, "/v1/users/ops2", None).await;
    expect(r, 403, "non-root admin deletes an admin");
    let r = ctx
        .call(
            ops,
            Method::PUT,
            "/v1/users/admin/password",
            Some(json!({"new_password": "taken-over-1"})),
        )
        .await;
    expect(r, 403, "non-root admin changes root's password");
    let r = ctx
        .call(
            ops,
            Method::PUT,
            "/v1/users/ops2/password",
            Some(json!({"new_password": "taken-over-1"})),
        )
        .await;
    expect(r, 403, "non-root admin changes another admin's password");
    // a non-root admin does manage plain users
    let r = ctx
        .call(
            ops,
            Method::PUT,
            "/v1/users/bob/grants",
            Some(json!({"grants": [{"action": "create", "patterns": ["b-*"]}]})),
        )
        .await;
    expect(r, 200, "admin sets a plain user's grants");
    // a user changes their own password only with the current one
    let r = ctx
        .call(
            ("alice", PW),
            Method::PUT,
            "/v1/users/alice/password",
            Some(json!({"new_password": "alice-new-pw"})),
        )
        .await;
    expect(r, 403, "own password without current_password");
    let r = ctx
        .call(
            ("alice", PW),
            Method::PUT,
            "/v1/users/alice/password",
            Some(json!({"new_password": "alice-new-pw", "current_password": PW})),
        )
        .await;
    expect(r, 204, "own password with current_password");
    let r = ctx
        .call(("alice", PW), Method::GET, "/v1/users/alice", None)
        .await;
    expect(r, 401, "the old password stops working at once");
    let alice = ("alice", "alice-new-pw");
    let r = ctx.call(alice, Method::GET, "/v1/users/alice", None).await;
    assert_eq!(r.status(), StatusCode::OK);
    let me: Value = r.json().await.unwrap();
    assert_eq!(me["username"], "alice");
    assert!(me.get("password").is_none() && me.get("password_hash").is_none());
    let r = ctx.call(alice, Method::GET, "/v1/users/bob", None).await;
    expect(r, 403, "a user reads another user");
    // ownership: bob's topic cannot be altered, deleted or attached by alice
    ctx.call(
        ("bob", PW),
        Method::POST,
        "/v1/topics",
        Some(json!({"name": "b-1"})),
    )
    .await;
    let r = ctx
        .call(
            alice,
            Method::POST,
            "/v1/topics",
            Some(json!({"name": "a-1"})),
        )
        .await;
    assert_eq!(
        r.status(),
        StatusCode::CREATED,
        "alice creates under her grant"
    );
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["owner"], "alice");
    let r = ctx
        .call(
            alice,
            Method::POST,
            "/v1/topics",
            Some(json!({"name": "b-2"})),
        )
        .await;
    expect(r, 403, "create outside the grant");
    let r = ctx
        .call(alice, Method::DELETE, "/v1/topics/b-1", None)
        .await;
    expect(r, 403, "delete someone else's topic");
    let r = ctx
        .call(
            alice,
            Method::PATCH,
            "/v1/topics/b-1",
            Some(json!({"retention_ms": 1000})),
        )
        .await;
    expect(r, 403, "alter someone else's topic");
    let r = ctx
        .call(
            alice,
            Method::POST,
            "/v1/topics/a-1/children",
            Some(json!({"child": "b-1", "delay_ms": 1000})),
        )
        .await;
    expect(r, 403, "attach someone else's topic as a child");
    let r = ctx
        .call(
            alice,
            Method::POST,
            "/v1/topics",
            Some(json!({"name": "a-2", "parent": "b-1"})),
        )
        .await;
    expect(r, 403, "create as a child of someone else's topic");
    // no leak of existence: a missing topic outside the grant is 403, inside it 404
    let r = ctx
        .call(alice, Method::GET, "/v1/topics/b-missing", None)
        .await;
    expect(r, 403, "missing topic outside the grant");
    let r = ctx
        .call(alice, Method::GET, "/v1/topics/a-missing", None)
        .await;
    expect(r, 404, "missing topic inside the grant");
    // listings show only usable topics
    let r = ctx
        .call(alice, Method::GET, "/v1/topics?limit=1", None)
        .await;
    let v: Value = r.json().await.unwrap();
    let names: Vec<&str> = v["topics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a-1"], "{v}");
    assert_eq!(v["next_page_token"], "", "nothing else visible: {v}");
    let all = ctx.as_admin(Method::GET, "/v1/topics", None).await;
    assert_eq!(all["topics"].as_array().unwrap().len(), 2);
    // an existing topic the caller cannot see answers exactly like a missing one
    let hidden = ctx
        .call(
            alice,
            Method::PATCH,
            "/v1/topics/b-1",
            Some(json!({"retention_ms": 5000})),
        )
        .await;
    let missing = ctx
        .call(
            alice,
            Method::PATCH,
            "/v1/topics/b-9",
            Some(json!({"retention_ms": 5000})),
        )
        .await;
    let (h, m): (Value, Value) = (hidden.json().await.unwrap(), missing.json().await.unwrap());
    assert_eq!(
        h["error"].as_str().unwrap().replace("b-1", "b-9"),
        m["error"].as_str().unwrap()
    );
    // children alice may not use are not named to her
    ctx.as_admin(
        Method::POST,
        "/v1/topics",
        Some(json!({"name": "a-kid", "partitions": 1})),
    )
    .await;
    ctx.as_admin(
        Method::POST,
        "/v1/topics/a-1/children",
        Some(json!({"child": "b-1"})),
    )
    .await;
    ctx.as_admin(
        Method::POST,
        "/v1/topics/a-1/children",
        Some(json!({"child": "a-kid"})),
    )
    .await;
    let r = ctx
        .call(alice, Method::GET, "/v1/topics/a-1/children", None)
        .await;
    let v: Value = r.json().await.unwrap();
    let kids: Vec<&str> = v["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(kids, ["a-kid"], "{v}");
    let r = ctx
        .call(alice, Method::DELETE, "/v1/topics/a-1/children/b-1", None)
        .await;
    expect(r, 403, "detach a child she cannot see");
    // a malformed path still gets a JSON error
    let r = ctx
        .call(("admin", ROOT_PW), Method::GET, "/v1/users/%FF", None)
        .await;
    assert!(r.status().is_client_error());
    let v: Value = r.json().await.expect("JSON error body");
    assert!(v["code"].is_string(), "{v}");
    // a deleted user's topics are not inherited by a new user of the same name
    ctx.user("eve", json!([{"action": "create", "patterns": ["e-*"]}]))
        .await;
    ctx.call(
        ("eve", PW),
        Method::POST,
        "/v1/topics",
        Some(json!({"name": "e-1"})),
    )
    .await;
    ctx.as_admin(Method::DELETE, "/v1/users/eve", None).await;
    ctx.user("eve", json!([{"action": "create", "patterns": ["e-*"]}]))
        .await;
    let r = ctx
        .call(("eve", PW), Method::DELETE, "/v1/topics/e-1", None)
        .await;
    expect(r, 403, "the new eve does not own the old eve's topic");
    let t = ctx.as_admin(Method::GET, "/v1/topics/e-1", None).await;
    assert!(t.get("owner").is_none(), "{t}");
    // grants take effect at once
    ctx.as_admin(
        Method::PUT,
        "/v1/users/alice/grants",
        Some(json!({"grants": []})),
    )
    .await;
    let r = ctx
        .call(
            alice,
            Method::POST,
            "/v1/topics/a-1/produce",
            Some(json!(1)),
        )
        .await;
    expect(r, 403, "revoked grant");
    let r = ctx
        .call(alice, Method::DELETE, "/v1/topics/a-1", None)
        .await;
    expect(r, 204, "the owner still manages its topic");
}

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
async fn schemas_validate_produce_and_evolve_additively() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = Ctx {
        s: secure(dir.path()).await,
        n: Default::default(),
    };
    let schema = json!({
        "type": "object",
        "properties": {"id": {"type": "integer"}},
        "required": ["id"]
    });
    let t = ctx
        .as_admin(
            Method::POST,
            "/v1/topics",
            Some(json!({"name": "s", "partitions": 1, "schema": schema})),
        )
        .await;
    assert_eq!(t["schema_version"], 1);
    let produce = |body: &'static str| {
        ctx.s
            .http
            .post(ctx.s.url("/v1/topics/s/produce"))
            .basic_auth("admin", Some(ROOT_PW))
            .body(body)
            .send()
    };
    assert_eq!(
        produce("{\"id\": 1}").await.unwrap().status(),
        StatusCode::ACCEPTED
    );
    let r = produce("{\"id\": \"x\"}").await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["code"], "schema_violation");
    assert!(v["error"].as_str().unwrap().contains("/id"), "{v}");
    let r = produce("not json").await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    // batch: one bad message refuses the whole request, naming it
    let r = ctx
        .call(
            ("admin", ROOT_PW),
            Method::POST,
            "/v1/topics/s/produce/batch",
            Some(json!({"messages": [{"payload": {"id": 1}}, {"payload": {"name": "no id"}}]})),
        )
        .await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let v: Value = r.json().await.unwrap();
    assert!(
        v["error"].as_str().unwrap().starts_with("message 1: "),
        "{v}"
    );
    let info = ctx.as_admin(Method::GET, "/v1/topics/s", None).await;
    assert_eq!(
        info["partition_stats"][0]["next_offset"], 1,
        "nothing of the refused batch was written"
    );
    // evolution: additive only
    let refused = [
        json!({"type": "object", "properties": {}, "required": ["id"]}),
        json!({"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}),
        json!({"type": "object", "properties": {"id": {"type": "integer"}, "n": {"type": "string"}}, "required": ["id", "n"]}),
    ];
    for s in refused {
        let r = ctx
            .call(
                ("admin", ROOT_PW),
                Method::PATCH,
                "/v1/topics/s",
                Some(json!({"schema": s})),
            )
            .await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["code"], "schema_incompatible", "{v}");
    }
    let r = ctx
        .call(
            ("admin", ROOT_PW),
            Method::PATCH,
            "/v1/topics/s",
            Some(json!({"schema": {"type": 7}})),
        )
        .await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST, "an invalid schema");
    let v2 = json!({"type": "object", "properties": {"id": {"type": "integer"}, "n": {"type": "string"}}, "required": ["id"]});
    let t = ctx
        .as_admin(Method::PATCH, "/v1/topics/s", Some(json!({"schema": v2})))
        .await;
    assert_eq!(t["schema_version"], 2);
    assert_eq!(
        produce("{\"id\": 2, \"n\": \"x\"}").await.unwrap().status(),
        StatusCode::ACCEPTED
    );
    assert_eq!(
        produce("{\"id\": 3, \"n\": 5}").await.unwrap().status(),
        StatusCode::BAD_REQUEST
    );
    let versions = ctx.as_admin(Method::GET, "/v1/topics/s/schema", None).await;
    assert_eq!(versions["latest"], 2);
    assert_eq!(versions["versions"].as_array().unwrap().len(), 2);
    assert_eq!(versions["versions"][0]["schema"], schema);
    let one = ctx
        .as_admin(Method::GET, "/v1/topics/s/schema?version=1", None)
        .await;
    assert_eq!(one["version"], 1);
    // a child's schema is its parent's: one with a history of its own cannot become a
    // child (here under a schema-less parent), and an attached child cannot change its own
    ctx.as_admin(
        Method::POST,
        "/v1/topics",
        Some(json!({"name": "plain", "partitions": 1})),
    )
    .await;
    let r = ctx
        .call(
            ("admin", ROOT_PW),
            Method::POST,
            "/v1/topics/plain/children",
            Some(json!({"child": "s"})),
        )
        .await;
    assert_eq!(
        r.status(),
        StatusCode::CONFLICT,
        "a topic with a schema cannot become a child"
    );
    ctx.as_admin(
        Method::POST,
        "/v1/topics",
        Some(json!({"name": "kid", "partitions": 1, "parent": "plain"})),
    )
    .await;
    let r = ctx
        .call(
            ("admin", ROOT_PW),
            Method::PATCH,
            "/v1/topics/kid",
            Some(json!({"schema": {"type": "object"}})),
        )
        .await;
    assert_eq!(
        r.status(),
        StatusCode::CONFLICT,
        "a child cannot get a schema"
    );
    // versions survive a restart
    let mut s = ctx.s;
    s.stop().await;
    s.restart().await;
    let r = s
        .http
        .get(s.url("/v1/topics/s/schema"))
        .basic_auth("admin", Some(ROOT_PW))
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["latest"], 2);
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

/// A CA and a certificate for 127.0.0.1 signed by it, as PEM: (ca, chain, key).
pub(crate) fn make_cert() -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    (ca.pem(), leaf.pem(), key.serialize_pem())
}

fn client_trusting(ca: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca.as_bytes()).unwrap())
        .timeout(std::time::Duration::from_secs(10))
        .build()
        .unwrap()
}

/// Replaces a file in one step, as certificate tooling does.
fn replace(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test]
async fn tls_serves_https_and_reloads_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let (ca1, chain1, key1) = make_cert();
    let (cert_file, key_file) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert_file, &chain1).unwrap();
    std::fs::write(&key_file, &key1).unwrap();
    let (cf, kf) = (cert_file.to_str().unwrap(), key_file.to_str().unwrap());
    let mut s = Server::start_opts(
        dir.path(),
        false,
        &[
            ("NARAD_ADMIN_PASSWORD", ROOT_PW),
            ("NARAD_TLS_CERT_FILE", cf),
            ("NARAD_TLS_KEY_FILE", kf),
        ],
        Some(ca1.as_bytes()),
    )
    .await;
    assert!(s.base.starts_with("https://"));
    let r = s
        .http
        .post(s.url("/v1/topics"))
        .basic_auth("admin", Some(ROOT_PW))
        .json(&json!({"name": "secure", "partitions": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    // plain HTTP on the TLS port gets no answer
    let plain = s.base.replacen("https://", "http://", 1);
    let r = reqwest::Client::new()
        .get(format!("{plain}/v1/topics"))
        .basic_auth("admin", Some(ROOT_PW))
        .timeout(std::time::Duration::from_secs(5))
        .send()
        .await;
    assert!(r.is_err() || !r.unwrap().status().is_success());
    // the CLI speaks HTTPS with --ca-cert
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &ca1).unwrap();
    let out = std::process::Command::new(BIN)
        .args([
            "-s",
            &s.base,
            "--ca-cert",
            ca_file.to_str().unwrap(),
            "topic",
            "ls",
            "--json",
        ])
        .env("NARAD_USER", "admin")
        .env("NARAD_PASSWORD", ROOT_PW)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("secure"));

    // a new certificate from another CA: picked up when the files change
    let (ca2, chain2, key2) = make_cert();
    replace(&key_file, &key2);
    replace(&cert_file, &chain2);
    let new_ca = client_trusting(&ca2);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let r = new_ca.get(s.url("/healthz")).send().await;
        if r.is_ok_and(|r| r.status() == StatusCode::OK) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "new certificate never served; log:\n{}",
            s.log()
        );
        poll_pause().await;
    }
    assert!(
        client_trusting(&ca1)
            .get(s.url("/healthz"))
            .send()
            .await
            .is_err(),
        "new connections no longer get the old certificate"
    );
    // a broken file is refused; the last good certificate stays in service
    replace(&cert_file, "not a certificate");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while !s.log().contains("TLS certificate reload failed") {
        assert!(
            std::time::Instant::now() < deadline,
            "bad file not noticed; log:\n{}",
            s.log()
        );
        poll_pause().await;
    }
    let r = new_ca.get(s.url("/healthz")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    // SIGHUP reloads too
    let (ca3, chain3, key3) = make_cert();
    std::fs::write(&key_file, &key3).unwrap();
    std::fs::write(&cert_file, &chain3).unwrap();
    let pid = s.child.as_ref().unwrap().id().to_string();
    std::process::Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .unwrap();
    let third = client_trusting(&ca3);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        if third.get(s.url("/healthz")).send().await.is_ok() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "SIGHUP did not reload; log:\n{}",
            s.log()
        );
        poll_pause().await;
    }
    // restart with the current files: still HTTPS
    s.http = third;
    s.stop().await;
    s.restart().await;
    assert_eq!(s.get("/healthz").await.status(), StatusCode::OK);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_clients_silent_after_the_handshake_are_closed_in_bounded_time() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, chain, key) = make_cert();
    let (cert_file, key_file) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert_file, &chain).unwrap();
    std::fs::write(&key_file, &key).unwrap();
    let s = Server::start_opts(
        dir.path(),
        false,
        &[
            ("NARAD_ADMIN_PASSWORD", ROOT_PW),
            ("NARAD_TLS_CERT_FILE", cert_file.to_str().unwrap()),
            ("NARAD_TLS_KEY_FILE", key_file.to_str().unwrap()),
            ("NARAD_HEADER_READ_TIMEOUT_MS", "500"),
            ("NARAD_KEEPALIVE_IDLE_TIMEOUT_MS", "500"),
        ],
        Some(ca.as_bytes()),
    )
    .await;
    crate::connections::check_tls_timeouts(s.base.trim_start_matches("https://"), &ca).await;
}

/// POSTs `body` and returns the response with how long it took.
async fn timed_post(
    s: &Server,
    path: &str,
    method: Method,
    body: reqwest::Body,
) -> (reqwest::Response, std::time::Duration) {
    let started = std::time::Instant::now();
    let r = s
        .http
        .request(method, s.url(path))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    (r, started.elapsed())
}

fn json_body(v: &Value) -> reqwest::Body {
    serde_json::to_vec(v).unwrap().into()
}

#[tokio::test]
async fn schema_ref_fan_out_is_refused_and_healthz_stays_responsive() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path()).await;
    // each nesting level of "a" doubled the work: two 150-byte payloads froze the server 7 s
    let bomb =
        json!({"type": "object", "properties": {"a": {"allOf": [{"$ref": "#"}, {"$ref": "#"}]}}});
    let (r, took) = timed_post(
        &s,
        "/v1/topics",
        Method::POST,
        json_body(&json!({"name": "bomb", "schema": bomb})),
    )
    .await;
    expect_error(r, StatusCode::BAD_REQUEST, "schema_too_complex").await;
    assert!(took < std::time::Duration::from_secs(5), "{took:?}");
    s.create_topic(json!({"name": "plain"})).await;
    let (r, _) = timed_post(
        &s,
        "/v1/topics/plain",
        Method::PATCH,
        json_body(&json!({"schema": bomb})),
    )
    .await;
    expect_error(r, StatusCode::BAD_REQUEST, "schema_too_complex").await;

    // a recursive schema without fan-out is fine; a payload too costly for it is refused, and
    // while large validations run /healthz keeps answering
    let tree = json!({"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}, "v": {"type": "string"}}});
    s.create_topic(json!({"name": "tree", "schema": tree, "max_message_bytes": 8_388_608}))
        .await;
    let leaf = json!({"v": "x"});
    let wide = json!({"kids": vec![leaf; 200_000]});
    let (r, took) = timed_post(
        &s,
        "/v1/topics/tree/produce",
        Method::POST,
        json_body(&wide),
    )
    .await;
    assert_eq!(r.status(), StatusCode::ACCEPTED, "{:?}", r.text().await);
    let big_ok = took;
    let heavy: Vec<_> = (0..3)
        .map(|_| {
            let http = s.http.clone();
            let url = s.url("/v1/topics/tree/produce");
            let body = serde_json::to_vec(&wide).unwrap();
            tokio::spawn(async move { http.post(url).body(body).send().await.unwrap().status() })
        })
        .collect();
    let mut polls = 0;
    while heavy.iter().any(|h| !h.is_finished()) || polls == 0 {
        let started = std::time::Instant::now();
        let r = s.get("/healthz").await;
        assert_eq!(r.status(), StatusCode::OK);
        let took = started.elapsed();
        assert!(
            took < std::time::Duration::from_millis(1000),
            "/healthz took {took:?} while validations ran"
        );
        polls += 1;
    }
    for h in heavy {
        let st = h.await.unwrap();
        assert!(
            st == StatusCode::ACCEPTED || st == StatusCode::SERVICE_UNAVAILABLE,
            "{st}"
        );
    }
    eprintln!("healthz polled {polls} times during 3 validations of {big_ok:?} each");
}

#[tokio::test]
async fn schema_pattern_properties_and_huge_payloads_are_refused_quickly() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path()).await;
    let patterns = |n: usize| -> serde_json::Map<String, Value> {
        (0..n)
            .map(|i| (format!("^k{i}_"), json!({"type": "integer"})))
            .collect()
    };
    // thousands of patternProperties: refused when the schema is set
    let (r, took) = timed_post(
        &s,
        "/v1/topics",
        Method::POST,
        json_body(&json!({"name": "pp", "schema": {"patternProperties": patterns(3000)}})),
    )
    .await;
    expect_error(r, StatusCode::BAD_REQUEST, "schema_too_complex").await;
    assert!(took < std::time::Duration::from_secs(5), "{took:?}");
    // within the limit, the size check comes before any validation work: a 90,000-key
    // payload over max_message_bytes is a 413 at once
    s.create_topic(json!({"name": "pp", "schema": {"patternProperties": patterns(60)}, "max_message_bytes": 65536}))
        .await;
    let keys = |n: usize| -> Value {
        Value::Object((0..n).map(|i| (format!("key{i}"), json!(i))).collect())
    };
    let (r, took) = timed_post(
        &s,
        "/v1/topics/pp/produce",
        Method::POST,
        json_body(&keys(90_000)),
    )
    .await;
    expect_error(r, StatusCode::PAYLOAD_TOO_LARGE, "message_too_large").await;
    assert!(took < std::time::Duration::from_secs(2), "{took:?}");
    // the same in a batch
    let batch = json!({"messages": [{"payload": {"k0_": 1}}, {"payload": keys(90_000)}]});
    let (r, _) = timed_post(
        &s,
        "/v1/topics/pp/produce/batch",
        Method::POST,
        json_body(&batch),
    )
    .await;
    expect_error(r, StatusCode::PAYLOAD_TOO_LARGE, "message_too_large").await;
    // under the size limit but over the validation budget: refused before boon runs
    s.create_topic(json!({"name": "pp-big", "schema": {"patternProperties": patterns(60)}, "max_message_bytes": 8_388_608}))
        .await;
    let (r, took) = timed_post(
        &s,
        "/v1/topics/pp-big/produce",
        Method::POST,
        json_body(&keys(300_000)),
    )
    .await;
    expect_error(r, StatusCode::BAD_REQUEST, "payload_too_complex").await;
    assert!(took < std::time::Duration::from_secs(3), "{took:?}");
    // and a fitting payload is still accepted
    let r = s
        .produce("pp-big", "", r#"{"k1_x": 1, "other": "y"}"#)
        .await;
    assert_eq!(r.status(), StatusCode::ACCEPTED);
}

#[tokio::test]
async fn schema_with_heavy_regexes_is_refused_quickly() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path()).await;
    // each regex compiles to megabytes: 24 KB of them took 12 s and 1.6 GB to compile
    let props: serde_json::Map<String, Value> = (0..200)
        .map(|i| (format!("p{i}"), json!({"type": "string", "pattern": format!("^[\\p{{L}}\\p{{N}}]{{{}}}$", 90 + i % 10)})))
        .collect();
    let schema = json!({"type": "object", "properties": props});
    assert!(serde_json::to_vec(&schema).unwrap().len() > 8_000);
    let (r, took) = timed_post(
        &s,
        "/v1/topics",
        Method::POST,
        json_body(&json!({"name": "rx", "schema": schema})),
    )
    .await;
    expect_error(r, StatusCode::BAD_REQUEST, "schema_too_complex").await;
    assert!(took < std::time::Duration::from_secs(5), "{took:?}");
    // one heavy regex alone is refused for its compiled size, a small one is fine
    let (r, _) = timed_post(
        &s,
        "/v1/topics",
        Method::POST,
        json_body(&json!({"name": "rx", "schema": {"pattern": "^\\p{L}{200}$"}})),
    )
    .await;
    let text = r.text().await.unwrap();
    assert!(
        text.contains("schema_too_complex") && text.contains("compiles to more than"),
        "{text}"
    );
    s.create_topic(json!({"name": "rx", "schema": {"type": "string", "pattern": "^[a-z]{1,20}$"}}))
        .await;
    assert_eq!(
        s.produce("rx", "", r#""abc""#).await.status(),
        StatusCode::ACCEPTED
    );
    let r = s.produce("rx", "", r#""ABC""#).await;
    expect_error(r, StatusCode::BAD_REQUEST, "schema_violation").await;
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
