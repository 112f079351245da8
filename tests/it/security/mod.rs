//! Security on (production mode): the auth matrix over every route and privilege escalation
//! here; users and credentials (`users`), JSON Schemas (`schemas`) and TLS (`tls`) beside.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::support::*;

mod schemas;
mod tls;
mod users;

pub(crate) use tls::make_cert;

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
        // (another user's keys: only an admin manages them)
        "POST /v1/users/{username}/access-keys" => {
            let u = format!("ak{i}");
            ctx.user(&u, json!([])).await;
            (Method::POST, format!("/v1/users/{u}/access-keys"), None)
        }
        "GET /v1/users/{username}/access-keys" => {
            let u = format!("akl{i}");
            ctx.user(&u, json!([])).await;
            (Method::GET, format!("/v1/users/{u}/access-keys"), None)
        }
        "DELETE /v1/users/{username}/access-keys/{key_id}" => {
            let u = format!("akd{i}");
            ctx.user(&u, json!([])).await;
            let path = format!("/v1/users/{u}/access-keys");
            let made = ctx.as_admin(Method::POST, &path, None).await;
            let id = made["access_key_id"].as_str().unwrap();
            (Method::DELETE, format!("{path}/{id}"), None)
        }
        "PUT /v1/carried-users" => (
            Method::PUT,
            "/v1/carried-users".into(),
            Some(json!({"source_cluster": format!("{:016x}", 0xc0 + i), "users": []})),
        ),
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
        r("POST /v1/users/{username}/access-keys", [U, U, F, F, 201]),
        r("GET /v1/users/{username}/access-keys", [U, U, F, F, 200]),
        r(
            "DELETE /v1/users/{username}/access-keys/{key_id}",
            [U, U, F, F, 204],
        ),
        // another cluster's users, carried by its remote: an admin's to take
        r("PUT /v1/carried-users", [U, U, F, F, 200]),
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
