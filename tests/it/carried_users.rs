//! Users carried over a remote with `carry_users`: created, changed and deleted on the other
//! cluster as they are here, never touching its own users, its root, or (unless the link's
//! user is root there) its admins.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::remotes::{MIRROR_PW, OPS_PW, ROOT_PW, call, json_of, port_of, source, target, until};
use crate::support::{Server, call_as, expect_error};

/// Whether `who` can sign in on `s` (reads its own user).
async fn signs_in(s: &Server, who: (&str, &str)) -> bool {
    let r = call_as(s, who, Method::GET, &format!("/v1/users/{}", who.0), None).await;
    r.status() == StatusCode::OK
}

async fn user(s: &Server, name: &str) -> Option<Value> {
    let r = call(s, Method::GET, &format!("/v1/users/{name}"), None).await;
    match r.status() {
        StatusCode::NOT_FOUND => None,
        _ => Some(json_of(r, StatusCode::OK).await),
    }
}

async fn create_user(s: &Server, name: &str, pw: &str, grants: Value) {
    let r = call(
        s,
        Method::POST,
        "/v1/users",
        Some(json!({"username": name, "password": pw, "grants": grants})),
    )
    .await;
    json_of(r, StatusCode::CREATED).await;
}

async fn carry_state(a: &Server, remote: &str) -> Value {
    let r = call(a, Method::GET, &format!("/v1/remotes/{remote}"), None).await;
    json_of(r, StatusCode::OK).await["users_carry"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_follow_their_cluster_over_a_remote_that_carries_them() {
    let dir = tempfile::tempdir().unwrap();
    let (b, ca) = target(dir.path()).await;
    let a = source(dir.path(), port_of(&b)).await;
    let url = format!("https://127.0.0.1:{}", port_of(&b));
    let consume = json!([{"action": "consume", "patterns": ["orders"]}]);
    create_user(&a, "alice", "alice's first password", consume.clone()).await;
    create_user(&a, "bob", "bob's own password", consume.clone()).await;
    create_user(
        &a,
        "boss",
        "the boss's password",
        json!([{"action": "admin"}]),
    )
    .await;
    // a user of B's own, and one of A's of the same name
    create_user(&b, "carol", "carol on b, not a", consume.clone()).await;
    create_user(&a, "carol", "carol on a, not b", consume.clone()).await;

    // a remote whose user is no admin there cannot carry users: its test says so, and so
    // does its state
    let r = call(&a, Method::POST, "/v1/remotes", Some(json!({"name": "b-weak", "url": url, "username": "mirror", "password": MIRROR_PW, "ca_pem": ca, "carry_users": true}))).await;
    assert_eq!(json_of(r, StatusCode::CREATED).await["carry_users"], true);
    let r = call(&a, Method::POST, "/v1/remotes/b-weak/test", None).await;
    let report = json_of(r, StatusCode::OK).await;
    assert_eq!(report["ok"], false, "{report}");
    assert_eq!(
        report["checks"].as_array().unwrap().last().unwrap()["name"],
        "admin"
    );
    until("the weak remote's carry is refused", async || {
        carry_state(&a, "b-weak").await["state"] == "refused"
    })
    .await;
    let s = carry_state(&a, "b-weak").await;
    assert!(s["message"].as_str().unwrap().contains("403"), "{s}");
    let metrics = call(&a, Method::GET, "/metrics", None)
        .await
        .text()
        .await
        .unwrap();
    assert!(
        crate::support::sample(&metrics, "narad_remote_users_carry_failing") >= 1.0,
        "{metrics}"
    );
    let r = call(&a, Method::DELETE, "/v1/remotes/b-weak", None).await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);

    // an admin of B (not its root) carries A's users, but not A's admins
    let r = call(&a, Method::POST, "/v1/remotes", Some(json!({"name": "b-users", "url": url, "username": "ops", "password": OPS_PW, "ca_pem": ca, "carry_users": true}))).await;
    json_of(r, StatusCode::CREATED).await;
    let r = call(&a, Method::POST, "/v1/remotes/b-users/test", None).await;
    let report = json_of(r, StatusCode::OK).await;
    assert_eq!(report["ok"], true, "{report}");
    until("alice and bob on b", async || {
        user(&b, "alice").await.is_some() && user(&b, "bob").await.is_some()
    })
    .await;
    let alice = user(&b, "alice").await.unwrap();
    assert_eq!(alice["grants"], consume, "{alice}");
    assert!(
        alice["carried_from"]
            .as_str()
            .is_some_and(|c| c.len() == 16),
        "{alice}"
    );
    assert!(signs_in(&b, ("alice", "alice's first password")).await);
    assert!(
        user(&b, "boss").await.is_none(),
        "an admin carried by a non-root"
    );
    // B's own carol is untouched
    assert!(signs_in(&b, ("carol", "carol on b, not a")).await);
    assert!(!signs_in(&b, ("carol", "carol on a, not b")).await);
    until("the carry reported", async || {
        carry_state(&a, "b-users").await["state"] == "carried"
    })
    .await;
    let s = carry_state(&a, "b-users").await;
    let conflicts: Vec<&str> = s["result"]["conflicts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["username"].as_str().unwrap())
        .collect();
    assert_eq!(conflicts, ["boss", "carol"], "{s}");

    // a new password, new grants, a delete: each follows at once (a change wakes the carry)
    let r = call(
        &a,
        Method::PUT,
        "/v1/users/alice/password",
        Some(json!({"new_password": "alice's second password"})),
    )
    .await;
    assert!(r.status().is_success(), "{:?}", r.text().await);
    let r = call(&a, Method::DELETE, "/v1/users/bob", None).await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    until("alice's new password and bob's delete on b", async || {
        signs_in(&b, ("alice", "alice's second password")).await && user(&b, "bob").await.is_none()
    })
    .await;
    assert!(!signs_in(&b, ("alice", "alice's first password")).await);
    assert!(user(&b, "carol").await.unwrap()["carried_from"].is_null());

    // the carrying remote carries nothing else: no remote child through it, and a remote
    // with children cannot start carrying
    let r = call(
        &a,
        Method::POST,
        "/v1/topics",
        Some(json!({"name": "src", "partitions": 1})),
    )
    .await;
    json_of(r, StatusCode::CREATED).await;
    let r = call(
        &a,
        Method::POST,
        "/v1/topics/src/children",
        Some(json!({"child": "to-b", "remote": "b-users", "remote_topic": "orders"})),
    )
    .await;
    let v = json_of(r, StatusCode::CONFLICT).await;
    assert!(
        v["error"].as_str().unwrap().contains("carries users"),
        "{v}"
    );
    let r = call(&a, Method::POST, "/v1/remotes", Some(json!({"name": "b", "url": url, "username": "mirror", "password": MIRROR_PW, "ca_pem": ca}))).await;
    json_of(r, StatusCode::CREATED).await;
    let r = call(
        &a,
        Method::POST,
        "/v1/topics/src/children",
        Some(json!({"child": "to-b", "remote": "b", "remote_topic": "orders"})),
    )
    .await;
    json_of(r, StatusCode::OK).await;
    let r = call(
        &a,
        Method::PATCH,
        "/v1/remotes/b",
        Some(json!({"carry_users": true})),
    )
    .await;
    expect_error(r, StatusCode::CONFLICT, "remote_in_use").await;

    // turned off, the users it carried stay (they are B's now)
    let r = call(
        &a,
        Method::PATCH,
        "/v1/remotes/b-users",
        Some(json!({"carry_users": false})),
    )
    .await;
    let v = json_of(r, StatusCode::OK).await;
    assert_eq!(v["carry_users"], false, "{v}");
    assert!(v.get("users_carry").is_none(), "{v}");
    assert!(signs_in(&b, ("alice", "alice's second password")).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_carried_list_is_checked_before_anything_changes() {
    let dir = tempfile::tempdir().unwrap();
    let (b, _ca) = target(dir.path()).await;
    let hash = "$argon2id$v=19$m=19456,t=2,p=1$c2FsdHNhbHRzYWx0$bnmkTuB9RskNq4uVZ3ykJgPZfbhK9l2d6URfYAUY/nE";
    let one = |name: &str, hash: &str| {
        json!({"source_cluster": "00000000000000aa", "users": [{
            "username": name, "id": 5, "password_hash": hash,
            "grants": [], "created_at_ms": 1, "updated_at_ms": 1
        }]})
    };
    let ops = ("ops", OPS_PW);
    let put = async |who: (&str, &str), body: Value| {
        call_as(&b, who, Method::PUT, "/v1/carried-users", Some(body)).await
    };
    // only an admin
    let r = put(("mirror", MIRROR_PW), one("eve", hash)).await;
    expect_error(r, StatusCode::FORBIDDEN, "forbidden").await;
    // a dearer hash, a foreign algorithm, the root's name, a bad source, unknown fields
    for body in [
        one("eve", &hash.replace("m=19456", "m=2000000")),
        one("eve", &hash.replace("argon2id", "argon2i")),
        one("eve", "not a hash"),
        one("admin", hash),
        json!({"source_cluster": "aa", "users": []}),
        json!({"source_cluster": "00000000000000AA", "users": []}),
        json!({"source_cluster": "00000000000000aa", "users": [], "extra": 1}),
    ] {
        let r = put(ops, body.clone()).await;
        let st = r.status();
        let text = r.text().await.unwrap();
        assert!(st == StatusCode::BAD_REQUEST, "{body}: {st} {text}");
    }
    assert!(user(&b, "eve").await.is_none());
    // a good one is taken, and a second time changes nothing
    let r = put(ops, one("eve", hash)).await;
    let v = json_of(r, StatusCode::OK).await;
    assert_eq!(
        (v["created"].clone(), v["conflict_count"].clone()),
        (json!(1), json!(0)),
        "{v}"
    );
    let r = put(ops, one("eve", hash)).await;
    let v = json_of(r, StatusCode::OK).await;
    assert_eq!(
        (v["created"].clone(), v["unchanged"].clone()),
        (json!(0), json!(1)),
        "{v}"
    );
    assert_eq!(
        user(&b, "eve").await.unwrap()["carried_from"],
        "00000000000000aa"
    );
    // the root of b may carry an admin
    let mut boss = one("boss", hash);
    boss["users"][0]["id"] = json!(6);
    boss["users"][0]["grants"] = json!([{"action": "admin"}]);
    // (a list is every user of its source: eve, not in it, is deleted)
    let r = put(ops, boss.clone()).await;
    let v = json_of(r, StatusCode::OK).await;
    assert_eq!(
        (v["conflict_count"].clone(), v["deleted"].clone()),
        (json!(1), json!(1)),
        "{v}"
    );
    assert!(user(&b, "boss").await.is_none());
    assert!(user(&b, "eve").await.is_none());
    let r = put(("admin", ROOT_PW), boss).await;
    assert_eq!(json_of(r, StatusCode::OK).await["created"], 1);
    // and an empty list from that source deletes what it carried
    let r = put(
        ("admin", ROOT_PW),
        json!({"source_cluster": "00000000000000aa", "users": []}),
    )
    .await;
    assert_eq!(json_of(r, StatusCode::OK).await["deleted"], 1);
    assert!(user(&b, "boss").await.is_none());
    assert!(user(&b, "ops").await.is_some());
}
