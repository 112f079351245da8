//! Remotes (`/v1/remotes`): kept with their passwords sealed, checked against a real second
//! broker over TLS, refused where the address guard says, carried across a secret rotation.

use std::sync::Arc;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::cluster::{contains, files_under};
use crate::security::make_cert;
use crate::support::{BIN, Server, call_as, expect_error};

pub(crate) const ROOT_PW: &str = "root-password-1";
pub(crate) const SECRET: &str = "the source cluster's secret, 32 bytes or more";
const NEW_SECRET: &str = "the source cluster's next secret, also 32+ bytes";
pub(crate) const MIRROR_PW: &str = "the mirror user's password on the target";
pub(crate) const OPS_PW: &str = "an admin of the target, not for remotes";

/// The target: security on, HTTPS from a test CA, a topic `orders`, a user `mirror` that may
/// produce to it and an admin `ops`. Returns it and its CA.
pub(crate) async fn target(dir: &std::path::Path) -> (Server, String) {
    target_with(dir, &[]).await
}

/// [`target`] with more environment.
pub(crate) async fn target_with(dir: &std::path::Path, extra: &[(&str, &str)]) -> (Server, String) {
    let (ca, chain, key) = make_cert();
    let (cert_file, key_file) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert_file, &chain).unwrap();
    std::fs::write(&key_file, &key).unwrap();
    let mut env = vec![
        ("NARAD_ADMIN_PASSWORD", ROOT_PW),
        ("NARAD_TLS_CERT_FILE", cert_file.to_str().unwrap()),
        ("NARAD_TLS_KEY_FILE", key_file.to_str().unwrap()),
    ];
    env.extend_from_slice(extra);
    let b = Server::start_opts(&sub(dir, "b"), false, &env, Some(ca.as_bytes())).await;
    let root = ("admin", ROOT_PW);
    for (body, path) in [
        (json!({"name": "orders", "partitions": 2}), "/v1/topics"),
        (
            json!({"username": "mirror", "password": MIRROR_PW, "grants": [
                {"action": "produce", "patterns": ["orders"]},
                // (and the fan-out children a mirror of orders carries)
                {"action": "replicate", "patterns": ["orders", "audit", "work", "later"]},
            ]}),
            "/v1/users",
        ),
        (
            json!({"username": "ops", "password": OPS_PW, "grants": [{"action": "admin"}]}),
            "/v1/users",
        ),
    ] {
        let r = call_as(&b, root, Method::POST, path, Some(body)).await;
        assert_eq!(r.status(), StatusCode::CREATED, "{:?}", r.text().await);
    }
    (b, ca)
}

/// The source: security on, a cluster secret, remotes allowed on loopback at `port`.
pub(crate) async fn source(dir: &std::path::Path, port: u16) -> Server {
    let port = port.to_string();
    Server::start_opts(
        &sub(dir, "a"),
        false,
        &[
            ("NARAD_ADMIN_PASSWORD", ROOT_PW),
            ("NARAD_CLUSTER_SECRET", SECRET),
            ("NARAD_REMOTES_ALLOWED_PORTS", &format!("443,{port}")),
            ("NARAD_REMOTES_ALLOW_ADDRESSES", "127.0.0.0/8"),
        ],
        None,
    )
    .await
}

/// A new directory `name` in `dir`.
pub(crate) fn sub(dir: &std::path::Path, name: &str) -> std::path::PathBuf {
    let d = dir.join(name);
    std::fs::create_dir_all(&d).unwrap();
    d
}

pub(crate) async fn call(
    s: &Server,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> reqwest::Response {
    call_as(s, ("admin", ROOT_PW), method, path, body).await
}

pub(crate) async fn json_of(r: reqwest::Response, want: StatusCode) -> Value {
    let st = r.status();
    let text = r.text().await.unwrap();
    assert_eq!(st, want, "{text}");
    serde_json::from_str(&text).unwrap()
}

pub(crate) fn port_of(s: &Server) -> u16 {
    s.base.rsplit(':').next().unwrap().parse().unwrap()
}

/// The names of a test report's checks, and whether it passed.
fn checks(report: &Value) -> (Vec<(&str, bool)>, bool, &str) {
    let list = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["name"].as_str().unwrap(), c["ok"] == true))
        .collect();
    (
        list,
        report["ok"] == true,
        report["state"].as_str().unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_is_kept_sealed_checked_and_carried_across_a_secret_rotation() {
    let dir = tempfile::tempdir().unwrap();
    let (b, ca) = target(dir.path()).await;
    let port = port_of(&b);
    let mut a = source(dir.path(), port).await;
    let url = format!("https://127.0.0.1:{port}");
    let add = |name: &str, user: &str, pw: &str, ca: Option<&str>| json!({"name": name, "url": url, "username": user, "password": pw, "ca_pem": ca});

    // added: the answer holds no password and no ciphertext
    let r = call(
        &a,
        Method::POST,
        "/v1/remotes",
        Some(add("b", "mirror", MIRROR_PW, Some(&ca))),
    )
    .await;
    let created = json_of(r, StatusCode::CREATED).await;
    assert_eq!(created["url"], format!("https://127.0.0.1:{port}/"));
    assert_eq!(created["credential"]["sealed_with"], "current");
    assert_eq!(created["version"], 1);
    assert!(created["ca_sha256"].as_str().is_some_and(|h| h.len() == 64));
    let text = created.to_string();
    assert!(
        !text.contains(MIRROR_PW) && !text.contains("ciphertext"),
        "{text}"
    );
    // the same name in another case is taken
    let r = call(
        &a,
        Method::POST,
        "/v1/remotes",
        Some(add("B", "mirror", MIRROR_PW, Some(&ca))),
    )
    .await;
    expect_error(r, StatusCode::CONFLICT, "remote_exists").await;

    // the checks pass against the target and its topic, whose incarnation they report
    let orders = json_of(
        call(&b, Method::GET, "/v1/topics/orders", None).await,
        StatusCode::OK,
    )
    .await;
    let report = json_of(
        call(&a, Method::POST, "/v1/remotes/b/test?topic=orders", None).await,
        StatusCode::OK,
    )
    .await;
    let (list, ok, state) = checks(&report);
    assert!(ok, "{report}");
    assert_eq!(state, "running");
    assert_eq!(
        list,
        [
            ("reachable", true),
            ("security_on", true),
            ("credential", true),
            ("not_admin", true),
            ("topic", true),
            ("no_remote_children", true),
            ("produce", true)
        ],
        "{report}"
    );
    assert_eq!(report["topic_id"], orders["id"], "{report}");
    // a topic that is not there; one the user may not produce to
    let report = json_of(
        call(&a, Method::POST, "/v1/remotes/b/test?topic=nothere", None).await,
        StatusCode::OK,
    )
    .await;
    assert!(!checks(&report).1, "{report}");
    assert!(
        ["target_missing", "forbidden"].contains(&checks(&report).2),
        "{report}"
    );
    let r = call_as(
        &b,
        ("admin", ROOT_PW),
        Method::POST,
        "/v1/topics",
        Some(json!({"name": "other"})),
    )
    .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let report = json_of(
        call(&a, Method::POST, "/v1/remotes/b/test?topic=other", None).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(
        (checks(&report).1, checks(&report).2),
        (false, "forbidden"),
        "{report}"
    );

    // an admin's credential, a wrong password, a CA that did not sign the target
    let r = call(
        &a,
        Method::POST,
        "/v1/remotes",
        Some(add("as-ops", "ops", OPS_PW, Some(&ca))),
    )
    .await;
    json_of(r, StatusCode::CREATED).await;
    let report = json_of(
        call(&a, Method::POST, "/v1/remotes/as-ops/test", None).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(
        (checks(&report).1, checks(&report).2),
        (false, "forbidden"),
        "{report}"
    );
    assert_eq!(
        checks(&report).0.last(),
        Some(&("not_admin", false)),
        "{report}"
    );
    let r = call(
        &a,
        Method::POST,
        "/v1/remotes",
        Some(add("wrong-pw", "mirror", "not the password", Some(&ca))),
    )
    .await;
    json_of(r, StatusCode::CREATED).await;
    let report = json_of(
        call(&a, Method::POST, "/v1/remotes/wrong-pw/test", None).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(
        (checks(&report).1, checks(&report).2),
        (false, "auth_failed"),
        "{report}"
    );
    let (other_ca, _, _) = make_cert();
    let r = call(
        &a,
        Method::POST,
        "/v1/remotes",
        Some(add("bad-ca", "mirror", MIRROR_PW, Some(&other_ca))),
    )
    .await;
    json_of(r, StatusCode::CREATED).await;
    let report = json_of(
        call(&a, Method::POST, "/v1/remotes/bad-ca/test", None).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(
        (checks(&report).1, checks(&report).2),
        (false, "tls_failed"),
        "{report}"
    );
    // a remote that is not a Narad with security on: the source itself, without TLS, is
    // not even HTTPS; the plain-HTTP port of a dev broker is refused at the TLS step
    let dev = Server::start(&sub(dir.path(), "dev")).await;
    let dev_port = port_of(&dev);
    a.set_env(
        "NARAD_REMOTES_ALLOWED_PORTS",
        Some(&format!("443,{port},{dev_port}")),
    );
    a.stop().await;
    a.restart().await;
    let r = call(
        &a,
        Method::POST,
        "/v1/remotes",
        Some(json!({"name": "dev", "url": format!("https://127.0.0.1:{dev_port}"), "username": "x", "password": "y"})),
    )
    .await;
    json_of(r, StatusCode::CREATED).await;
    let report = json_of(
        call(&a, Method::POST, "/v1/remotes/dev/test", None).await,
        StatusCode::OK,
    )
    .await;
    assert!(!checks(&report).1, "{report}");
    assert!(
        ["tls_failed", "unavailable"].contains(&checks(&report).2),
        "{report}"
    );

    // changing the URL, user or CA takes the password again; a stale version is refused
    let r = call(
        &a,
        Method::PATCH,
        "/v1/remotes/wrong-pw",
        Some(json!({"username": "mirror2"})),
    )
    .await;
    expect_error(r, StatusCode::BAD_REQUEST, "invalid_field").await;
    let r = call(
        &a,
        Method::PATCH,
        "/v1/remotes/wrong-pw",
        Some(json!({"password": MIRROR_PW, "version": 7})),
    )
    .await;
    expect_error(r, StatusCode::CONFLICT, "remote_changed").await;
    let r = call(
        &a,
        Method::PATCH,
        "/v1/remotes/wrong-pw",
        Some(json!({"password": MIRROR_PW, "version": 1})),
    )
    .await;
    assert_eq!(json_of(r, StatusCode::OK).await["version"], 2);
    let report = json_of(
        call(&a, Method::POST, "/v1/remotes/wrong-pw/test", None).await,
        StatusCode::OK,
    )
    .await;
    assert!(checks(&report).1, "{report}");
    let r = call(
        &a,
        Method::PATCH,
        "/v1/remotes/bad-ca",
        Some(json!({"ca_pem": ca, "password": MIRROR_PW})),
    )
    .await;
    json_of(r, StatusCode::OK).await;
    let report = json_of(
        call(&a, Method::POST, "/v1/remotes/bad-ca/test", None).await,
        StatusCode::OK,
    )
    .await;
    assert!(checks(&report).1, "{report}");

    // the password is in no file under either data directory nor in either log (the
    // target keeps only its hash)
    assert!(!b.log().contains(MIRROR_PW));
    for f in files_under(&b.data_dir) {
        let bytes = std::fs::read(&f).unwrap_or_default();
        assert!(
            !contains(&bytes, MIRROR_PW.as_bytes()),
            "password in clear in {}",
            f.display()
        );
    }
    for f in files_under(&a.data_dir) {
        let bytes = std::fs::read(&f).unwrap_or_default();
        assert!(
            !contains(&bytes, MIRROR_PW.as_bytes()),
            "password in clear in {}",
            f.display()
        );
        assert!(
            !contains(&bytes, OPS_PW.as_bytes()),
            "password in clear in {}",
            f.display()
        );
    }
    assert!(!a.log().contains(MIRROR_PW) && !a.log().contains(OPS_PW));
    let listed = json_of(
        call(&a, Method::GET, "/v1/remotes", None).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(listed["remotes"].as_array().unwrap().len(), 5, "{listed}");
    assert!(!listed.to_string().contains(MIRROR_PW));

    // rotation: the new secret with the old one as previous still opens every credential;
    // a reseal moves them to the new key, after which the old secret can go
    a.set_env("NARAD_CLUSTER_SECRET", Some(NEW_SECRET));
    a.set_env("NARAD_CLUSTER_SECRET_PREVIOUS", Some(SECRET));
    a.stop().await;
    a.restart().await;
    let got = json_of(
        call(&a, Method::GET, "/v1/remotes/b", None).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(got["credential"]["sealed_with"], "previous", "{got}");
    let report = json_of(
        call(&a, Method::POST, "/v1/remotes/b/test?topic=orders", None).await,
        StatusCode::OK,
    )
    .await;
    assert!(checks(&report).1, "{report}");
    let done = json_of(
        call(&a, Method::POST, "/v1/cluster/reencrypt-remotes", None).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(done["resealed"].as_array().unwrap().len(), 5, "{done}");
    assert_eq!(done["failed"], json!([]), "{done}");
    a.set_env("NARAD_CLUSTER_SECRET_PREVIOUS", None);
    a.stop().await;
    a.restart().await;
    let got = json_of(
        call(&a, Method::GET, "/v1/remotes/b", None).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(got["credential"]["sealed_with"], "current", "{got}");
    let report = json_of(
        call(&a, Method::POST, "/v1/remotes/b/test?topic=orders", None).await,
        StatusCode::OK,
    )
    .await;
    assert!(checks(&report).1, "{report}");
    // a secret that sealed none of them: the remotes are listed, their tests refused
    a.set_env("NARAD_CLUSTER_SECRET", Some(SECRET));
    a.stop().await;
    a.restart().await;
    let got = json_of(
        call(&a, Method::GET, "/v1/remotes/b", None).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(got["credential"]["sealed_with"], "unknown", "{got}");
    let r = call(&a, Method::POST, "/v1/remotes/b/test", None).await;
    expect_error(r, StatusCode::CONFLICT, "credential_unavailable").await;

    // deleted
    let r = call(&a, Method::DELETE, "/v1/remotes/b", None).await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let r = call(&a, Method::GET, "/v1/remotes/b", None).await;
    expect_error(r, StatusCode::NOT_FOUND, "remote_not_found").await;
    let r = call(&a, Method::DELETE, "/v1/remotes/b", None).await;
    expect_error(r, StatusCode::NOT_FOUND, "remote_not_found").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_address_guard_refuses_what_a_remote_may_not_name() {
    let dir = tempfile::tempdir().unwrap();
    let a = source(dir.path(), 8443).await;
    let add = |url: &str| json!({"name": "r", "url": url, "username": "u", "password": "p"});
    for (url, code) in [
        ("http://127.0.0.1:8443", "invalid_field"),
        ("https://user:pw@127.0.0.1:8443", "invalid_field"),
        ("https://127.0.0.1:8443/?x=1", "invalid_field"),
        ("not a url", "invalid_field"),
        ("https://127.0.0.1:22", "destination_refused"),
        ("https://169.254.169.254:443", "destination_refused"),
        ("https://[::ffff:127.0.0.1]:443", "destination_refused"),
        ("https://[::1]:443", "destination_refused"),
        ("https://[fe80::1]:443", "destination_refused"),
        ("https://[fd00:ec2::254]:443", "destination_refused"),
        ("https://[64:ff9b::7f00:1]:443", "destination_refused"),
        ("https://0x7f000001:22", "destination_refused"),
        ("https://100.100.100.200:443", "destination_refused"),
        ("https://224.0.0.1:443", "destination_refused"),
        ("https://0.0.0.0:443", "destination_refused"),
    ] {
        let r = call(&a, Method::POST, "/v1/remotes", Some(add(url))).await;
        expect_error(r, StatusCode::BAD_REQUEST, code).await;
    }
    // a name is vetted when it is dialled: `localhost` resolves to loopback, allowed here;
    // on a node that does not allow loopback the test is refused before any connection
    let r = call(
        &a,
        Method::POST,
        "/v1/remotes",
        Some(add("https://localhost:8443")),
    )
    .await;
    json_of(r, StatusCode::CREATED).await;
    drop(a);
    let strict = Server::start_opts(
        &sub(dir.path(), "strict"),
        false,
        &[
            ("NARAD_ADMIN_PASSWORD", ROOT_PW),
            ("NARAD_CLUSTER_SECRET", SECRET),
            ("NARAD_REMOTES_ALLOWED_PORTS", "8443"),
            ("NARAD_REMOTES_ALLOWED_HOSTS", "*.example.com,localhost"),
        ],
        None,
    )
    .await;
    let r = call(
        &strict,
        Method::POST,
        "/v1/remotes",
        Some(add("https://127.0.0.1:8443")),
    )
    .await;
    expect_error(r, StatusCode::BAD_REQUEST, "destination_refused").await;
    let r = call(
        &strict,
        Method::POST,
        "/v1/remotes",
        Some(add("https://evil.com:8443")),
    )
    .await;
    expect_error(r, StatusCode::BAD_REQUEST, "destination_refused").await;
    let r = call(
        &strict,
        Method::POST,
        "/v1/remotes",
        Some(add("https://localhost:8443")),
    )
    .await;
    json_of(r, StatusCode::CREATED).await;
    let report = json_of(
        call(&strict, Method::POST, "/v1/remotes/r/test", None).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(
        (checks(&report).1, checks(&report).2),
        (false, "destination_refused"),
        "{report}"
    );
    let r = call(&strict, Method::POST, "/v1/remotes", Some(json!({"name": "m", "url": "https://m.example.com:8443", "username": "u", "password": "p"}))).await;
    json_of(r, StatusCode::CREATED).await;
}

#[tokio::test]
async fn remotes_need_an_admin_security_and_a_secret_and_take_only_valid_fields() {
    let dir = tempfile::tempdir().unwrap();
    let a = source(dir.path(), 8443).await;
    let ok =
        json!({"name": "r", "url": "https://m.example.com:8443", "username": "u", "password": "p"});
    // not an admin
    let r = call_as(&a, ("admin", ROOT_PW), Method::POST, "/v1/users", Some(json!({"username": "joe", "password": "joe's password", "grants": [{"action": "create", "patterns": ["*"]}]}))).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    for (m, p) in [
        (Method::GET, "/v1/remotes"),
        (Method::POST, "/v1/remotes"),
        (Method::GET, "/v1/remotes/r"),
        (Method::DELETE, "/v1/remotes/r"),
        (Method::POST, "/v1/remotes/r/test"),
        (Method::POST, "/v1/cluster/reencrypt-remotes"),
    ] {
        let r = call_as(&a, ("joe", "joe's password"), m, p, Some(ok.clone())).await;
        expect_error(r, StatusCode::FORBIDDEN, "forbidden").await;
    }
    // bad fields
    for (body, code) in [
        (
            json!({"name": "", "url": "https://m.example.com:8443", "username": "u", "password": "p"}),
            "invalid_field",
        ),
        (
            json!({"name": "a/b", "url": "https://m.example.com:8443", "username": "u", "password": "p"}),
            "invalid_field",
        ),
        (
            json!({"name": "r", "url": "https://m.example.com:8443", "username": "a:b", "password": "p"}),
            "invalid_field",
        ),
        (
            json!({"name": "r", "url": "https://m.example.com:8443", "username": "u", "password": ""}),
            "invalid_field",
        ),
        (
            json!({"name": "r", "url": "https://m.example.com:8443", "username": "u", "password": "x".repeat(1025)}),
            "invalid_field",
        ),
        (
            json!({"name": "r", "url": "https://m.example.com:8443", "username": "u", "password": "p", "ca_pem": "not a pem"}),
            "invalid_field",
        ),
        (
            json!({"name": "r", "url": "https://m.example.com:8443", "username": "u"}),
            "invalid_json",
        ),
        (
            json!({"name": "r", "url": "https://m.example.com:8443", "username": "u", "password": "p", "extra": 1}),
            "invalid_json",
        ),
    ] {
        let r = call(&a, Method::POST, "/v1/remotes", Some(body)).await;
        expect_error(r, StatusCode::BAD_REQUEST, code).await;
    }
    let r = call(&a, Method::POST, "/v1/remotes", Some(ok.clone())).await;
    json_of(r, StatusCode::CREATED).await;
    let r = call(&a, Method::POST, "/v1/remotes/r/test?topic=a%2Fb", None).await;
    expect_error(r, StatusCode::BAD_REQUEST, "invalid_parameter").await;
    let r = call(
        &a,
        Method::PATCH,
        "/v1/remotes/r",
        Some(json!({"url": "http://x"})),
    )
    .await;
    expect_error(r, StatusCode::BAD_REQUEST, "invalid_field").await;
    let r = call(
        &a,
        Method::PATCH,
        "/v1/remotes/nope",
        Some(json!({"password": "p"})),
    )
    .await;
    expect_error(r, StatusCode::NOT_FOUND, "remote_not_found").await;
    // 64 at most
    for i in 1..64 {
        let body = json!({"name": format!("r{i}"), "url": "https://m.example.com:8443", "username": "u", "password": "p"});
        let r = call(&a, Method::POST, "/v1/remotes", Some(body)).await;
        assert_eq!(r.status(), StatusCode::CREATED, "{i}");
    }
    let body = json!({"name": "r64", "url": "https://m.example.com:8443", "username": "u", "password": "p"});
    let r = call(&a, Method::POST, "/v1/remotes", Some(body)).await;
    expect_error(r, StatusCode::CONFLICT, "too_many_remotes").await;

    // without a cluster secret, and with security off: refused, saying why
    let no_secret = Server::start_opts(
        &sub(dir.path(), "ns"),
        false,
        &[("NARAD_ADMIN_PASSWORD", ROOT_PW)],
        None,
    )
    .await;
    let r = call(&no_secret, Method::POST, "/v1/remotes", Some(ok.clone())).await;
    expect_error(r, StatusCode::CONFLICT, "remotes_unavailable").await;
    let dev = Server::start(&sub(dir.path(), "dev")).await;
    let r = dev.post_json("/v1/remotes", &ok).await;
    expect_error(r, StatusCode::CONFLICT, "remotes_unavailable").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_adds_lists_tests_and_removes_remotes() {
    let dir = tempfile::tempdir().unwrap();
    let (b, ca) = target(dir.path()).await;
    let a = source(dir.path(), port_of(&b)).await;
    let ca_file = dir.path().join("b-ca.pem");
    std::fs::write(&ca_file, &ca).unwrap();
    let cli = |args: &[&str], stdin: &str| {
        use std::io::Write;
        let mut c = std::process::Command::new(BIN)
            .args(["-s", &a.base, "-u", "admin", "-p", ROOT_PW])
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        c.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
        let out = c.wait_with_output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let url = format!("https://127.0.0.1:{}", port_of(&b));
    let (ok, out, err) = cli(
        &[
            "remote",
            "add",
            "b",
            "--url",
            &url,
            "--remote-user",
            "mirror",
            "--remote-ca",
            ca_file.to_str().unwrap(),
        ],
        &format!("{MIRROR_PW}\n"),
    );
    assert!(ok, "{out}{err}");
    let (ok, out, err) = cli(&["remote", "ls"], "");
    assert!(
        ok && out.contains("b ") && out.contains("own") && out.contains("current"),
        "{out}{err}"
    );
    let (ok, out, err) = cli(&["remote", "test", "b", "--topic", "orders"], "");
    assert!(ok && out.contains("produce"), "{out}{err}");
    let (ok, out, err) = cli(&["remote", "test", "b", "--topic", "nothere"], "");
    assert!(!ok && err.contains("failed its checks"), "{out}{err}");
    let (ok, _, err) = cli(&["remote", "edit", "b", "--remote-user", "other"], "");
    assert!(!ok, "{err}");
    let (ok, out, err) = cli(&["remote", "rm", "b"], "");
    assert!(ok && out.contains("deleted remote b"), "{out}{err}");
}

/// A TCP relay from a port of the test's to `target`, which the test can cut: cut, it accepts
/// and drops every connection (counting them), as a target that is down but whose address
/// still answers would.
pub(crate) struct Relay {
    pub(crate) port: u16,
    target: Arc<std::sync::atomic::AtomicU16>,
    /// `true` while cut: new connections are dropped, and so are the ones relayed before.
    cut: tokio::sync::watch::Sender<bool>,
    accepted: Arc<std::sync::atomic::AtomicU64>,
}

impl Relay {
    pub(crate) async fn start(target: u16) -> Self {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let (cut, cut_rx) = tokio::sync::watch::channel(false);
        let accepted = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let to = Arc::new(std::sync::atomic::AtomicU16::new(target));
        let (n, t) = (accepted.clone(), to.clone());
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = l.accept().await {
                n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if *cut_rx.borrow() {
                    drop(inbound);
                    continue;
                }
                let target = t.load(std::sync::atomic::Ordering::SeqCst);
                let mut rx = cut_rx.clone();
                tokio::spawn(async move {
                    if let Ok(mut out) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await
                    {
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut inbound, &mut out) => {}
                            _ = rx.wait_for(|cut| *cut) => {}
                        }
                    }
                });
            }
        });
        Self {
            port,
            target: to,
            cut,
            accepted,
        }
    }

    /// Relays to `port` from now on.
    pub(crate) fn set_target(&self, port: u16) {
        self.target.store(port, std::sync::atomic::Ordering::SeqCst);
    }

    pub(crate) fn set_cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }

    pub(crate) fn accepted(&self) -> u64 {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Every record of `topic` on `s` (replayed from each of its `partitions`): (partition,
/// key, seq, origin) in offset order per partition.
pub(crate) async fn replay_all(
    s: &Server,
    topic: &str,
    partitions: u32,
) -> Vec<(u32, String, u64, String)> {
    let mut out = Vec::new();
    for p in 0..partitions {
        let mut offset = 0u64;
        loop {
            let r = call(
                s,
                Method::GET,
                &format!("/v1/topics/{topic}/consume?partition={p}&offset={offset}&max=100"),
                None,
            )
            .await;
            if r.status() == StatusCode::NO_CONTENT {
                break;
            }
            let v = json_of(r, StatusCode::OK).await;
            let msgs = v["messages"].as_array().unwrap();
            for m in msgs {
                out.push((
                    p,
                    m["key"].as_str().unwrap_or("").to_owned(),
                    m["payload"]["seq"].as_u64().unwrap(),
                    m["headers"]["narad-origin"]
                        .as_str()
                        .unwrap_or("")
                        .to_owned(),
                ));
                offset = m["offset"].as_u64().unwrap() + 1;
            }
        }
    }
    out
}

/// Produces `seqs` to `topic` on `s` in batches of 100, keyed `k<seq % 20>`; returns the
/// seqs of the batches answered 202 (the ones that must arrive).
pub(crate) async fn produce_seqs(s: &Server, topic: &str, seqs: std::ops::Range<u64>) -> Vec<u64> {
    let mut acked = Vec::new();
    let all: Vec<u64> = seqs.collect();
    for chunk in all.chunks(100) {
        let msgs: Vec<Value> = chunk
            .iter()
            .map(|n| json!({"key": format!("k{}", n % 20), "payload": {"seq": n}}))
            .collect();
        let path = format!("/v1/topics/{topic}/produce/batch");
        let r = call_as(
            s,
            ("admin", ROOT_PW),
            Method::POST,
            &path,
            Some(json!({ "messages": msgs })),
        );
        match tokio::time::timeout(std::time::Duration::from_secs(10), r).await {
            Ok(r) if r.status() == StatusCode::ACCEPTED => acked.extend_from_slice(chunk),
            _ => break,
        }
    }
    acked
}

pub(crate) async fn children_of(s: &Server, parent: &str) -> Value {
    json_of(
        call(
            s,
            Method::GET,
            &format!("/v1/topics/{parent}/children"),
            None,
        )
        .await,
        StatusCode::OK,
    )
    .await
}

/// Polls (60 s at most) until `f` holds.
pub(crate) async fn until<F: AsyncFnMut() -> bool>(what: &str, mut f: F) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !f().await {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        crate::support::poll_pause().await;
    }
}

/// The per-key order on the target: for each key, the first copies of its records come in
/// the order they were produced (later duplicates of a resent chunk are allowed).
pub(crate) fn check_key_order(got: &[(u32, String, u64, String)]) {
    let mut seen = std::collections::HashSet::new();
    let mut last: std::collections::HashMap<&str, u64> = Default::default();
    for (_, k, seq, _) in got {
        if !seen.insert(*seq) {
            continue;
        }
        if let Some(prev) = last.insert(k.as_str(), *seq) {
            assert!(prev < *seq, "key {k}: {seq} arrived after {prev}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_child_mirrors_in_key_order_survives_a_kill_and_waits_out_its_target() {
    let dir = tempfile::tempdir().unwrap();
    let (b, ca) = target(dir.path()).await;
    let relay = Relay::start(port_of(&b)).await;
    let mut a = source(dir.path(), relay.port).await;
    let url = format!("https://127.0.0.1:{}", relay.port);
    let r = call(&a, Method::POST, "/v1/remotes", Some(json!({"name": "b", "url": url, "username": "mirror", "password": MIRROR_PW, "ca_pem": ca}))).await;
    json_of(r, StatusCode::CREATED).await;
    let r = call(
        &a,
        Method::POST,
        "/v1/topics",
        Some(json!({"name": "src", "partitions": 2})),
    )
    .await;
    json_of(r, StatusCode::CREATED).await;
    // only an admin attaches a remote child, and only to a target that passes the checks
    let attach = json!({"child": "to-b", "remote": "b", "remote_topic": "orders", "lanes": 4});
    let bad = json!({"child": "to-b", "remote": "b", "remote_topic": "other-topic"});
    let r = call(&a, Method::POST, "/v1/topics/src/children", Some(bad)).await;
    expect_error(r, StatusCode::CONFLICT, "remote_check_failed").await;
    // a parent with a JSON Schema the target topic does not have
    let r = call(
        &a,
        Method::POST,
        "/v1/topics",
        Some(json!({"name": "typed", "schema": {"type": "object"}})),
    )
    .await;
    json_of(r, StatusCode::CREATED).await;
    let r = call(
        &a,
        Method::POST,
        "/v1/topics/typed/children",
        Some(json!({"child": "t", "remote": "b", "remote_topic": "orders"})),
    )
    .await;
    let v = json_of(r, StatusCode::CONFLICT).await;
    assert!(v["error"].as_str().unwrap().contains("schema"), "{v}");
    for body in [
        json!({"child": "to-b", "remote": "nope", "remote_topic": "orders"}),
        json!({"child": "to-b", "remote": "", "remote_topic": "orders"}),
        json!({"child": "to-b", "remote": "b", "remote_topic": "orders", "lanes": 9}),
        json!({"child": "to-b", "remote": "b", "remote_topic": "orders", "from": "soon"}),
    ] {
        let r = call(&a, Method::POST, "/v1/topics/src/children", Some(body)).await;
        expect_error(r, StatusCode::BAD_REQUEST, "invalid_field").await;
    }
    let r = call(&a, Method::POST, "/v1/topics/src/children", Some(attach)).await;
    let list = json_of(r, StatusCode::OK).await;
    assert_eq!(
        list["children"][0]["remote"]["remote_topic"], "orders",
        "{list}"
    );
    // the remote is in use
    let r = call(&a, Method::DELETE, "/v1/remotes/b", None).await;
    expect_error(r, StatusCode::CONFLICT, "remote_in_use").await;

    // 1000 keyed records arrive, each key's in order, each with its origin
    assert_eq!(produce_seqs(&a, "src", 0..1000).await.len(), 1000);
    until("1000 records on the target", async || {
        replay_all(&b, "orders", 2).await.len() >= 1000
    })
    .await;
    let got = replay_all(&b, "orders", 2).await;
    assert_eq!(got.len(), 1000, "no duplicates without a failure");
    check_key_order(&got);
    let origin = &got[0].3;
    let parts: Vec<&str> = origin.split('/').collect();
    assert_eq!(parts.len(), 4, "{origin}");
    let a_cluster = parts[0].to_owned();
    until("lag 0 and running", async || {
        let c = children_of(&a, "src").await;
        c["children"][0]["lag_messages"] == 0 && c["children"][0]["remote"]["state"] == "running"
    })
    .await;

    // kill -9 of the source while it ships: after the restart every record it acked is on
    // the target (duplicates allowed, no gap)
    let producer = {
        let (base, http) = (a.base.clone(), a.http.clone());
        tokio::spawn(async move {
            let mut acked = Vec::new();
            for start in (1000..4000).step_by(100) {
                let msgs: Vec<Value> = (start..start + 100)
                    .map(|n: u64| json!({"key": format!("k{}", n % 20), "payload": {"seq": n}}))
                    .collect();
                let r = http
                    .post(format!("{base}/v1/topics/src/produce/batch"))
                    .basic_auth("admin", Some(ROOT_PW))
                    .json(&json!({ "messages": msgs }))
                    .timeout(std::time::Duration::from_secs(5))
                    .send()
                    .await;
                match r {
                    Ok(r) if r.status() == StatusCode::ACCEPTED => acked.extend(start..start + 100),
                    _ => break,
                }
            }
            acked
        })
    };
    until("some of the second wave shipped", async || {
        replay_all(&b, "orders", 2).await.len() >= 1500
    })
    .await;
    a.kill9();
    let acked = producer.await.unwrap();
    assert!(acked.len() >= 500, "{}", acked.len());
    a.restart().await;
    until("every acked record on the target", async || {
        let have: std::collections::HashSet<u64> = replay_all(&b, "orders", 2)
            .await
            .iter()
            .map(|r| r.2)
            .collect();
        acked.iter().all(|s| have.contains(s))
    })
    .await;
    check_key_order(&replay_all(&b, "orders", 2).await);
    // (and the records written but never acknowledged before the kill: the lag counted
    // below is the cut's alone)
    until("the child caught up", async || {
        children_of(&a, "src").await["children"][0]["lag_messages"] == 0
    })
    .await;

    // the target goes away: the gate opens and then lets one probe through per step
    relay.set_cut(true);
    assert_eq!(produce_seqs(&a, "src", 4000..4010).await.len(), 10);
    until("the child unavailable", async || {
        let st = children_of(&a, "src").await["children"][0]["remote"]["state"].clone();
        st != "running"
    })
    .await;
    let from = relay.accepted();
    let t0 = std::time::Instant::now();
    until("4 s pass", async || {
        t0.elapsed() >= std::time::Duration::from_secs(4)
    })
    .await;
    let during = relay.accepted() - from;
    // without the gate 2 cursors × 4 lanes would retry every ≤ 2 s (≥ 16 connections in
    // 4 s); with it, one probe per step (0.25 s doubling, jittered): a handful
    assert!(
        during <= 8,
        "{during} connections in 4 s with the gate open"
    );
    let c = children_of(&a, "src").await;
    assert_eq!(c["children"][0]["lag_messages"], 10, "{c}");
    // it comes back: the records drain
    relay.set_cut(false);
    until("drained after the target came back", async || {
        let have: std::collections::HashSet<u64> = replay_all(&b, "orders", 2)
            .await
            .iter()
            .map(|r| r.2)
            .collect();
        (4000..4010).all(|s| have.contains(&s))
    })
    .await;

    // pause: nothing ships, the lag shows; a parent delete is refused while records wait
    let r = call(&a, Method::POST, "/v1/topics/src/children/to-b/pause", None).await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert_eq!(produce_seqs(&a, "src", 5000..5005).await.len(), 5);
    until("paused with lag 5", async || {
        let c = children_of(&a, "src").await;
        c["children"][0]["lag_messages"] == 5 && c["children"][0]["remote"]["state"] == "paused"
    })
    .await;
    // and its lag in time is the age of the oldest record waiting (it grows while paused)
    until("a paused child's lag in seconds grows", async || {
        let c = children_of(&a, "src").await;
        c["children"][0]["remote"]["lag_seconds"]
            .as_f64()
            .is_some_and(|s| s > 0.2)
    })
    .await;
    let r = call(&a, Method::DELETE, "/v1/topics/src", None).await;
    expect_error(r, StatusCode::CONFLICT, "unshipped").await;
    let r = call(&a, Method::DELETE, "/v1/topics/src/children/to-b", None).await;
    expect_error(r, StatusCode::CONFLICT, "unshipped").await;
    let r = call(
        &a,
        Method::POST,
        "/v1/topics/src/children/to-b/resume",
        None,
    )
    .await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    until("resumed and shipped", async || {
        let have: std::collections::HashSet<u64> = replay_all(&b, "orders", 2)
            .await
            .iter()
            .map(|r| r.2)
            .collect();
        (5000..5005).all(|s| have.contains(&s))
    })
    .await;

    // origins: only a replicate grant may write one, and never naming the cluster it is
    // written to
    let forged = json!({"messages": [{"payload": {"seq": 1}, "headers": {"narad-origin": format!("{a_cluster}/0000000000000001/0/0")}}]});
    let r = call_as(
        &b,
        ("mirror", MIRROR_PW),
        Method::POST,
        "/v1/topics/orders/produce/batch",
        Some(forged.clone()),
    )
    .await;
    // a replicator may send an origin (the topic, A's mirror, then wants the link's header)
    expect_error(r, StatusCode::CONFLICT, "mirror_read_only").await;
    let r = call(&b, Method::POST, "/v1/users", Some(json!({"username": "plain", "password": "plain's password", "grants": [{"action": "produce", "patterns": ["orders"]}]}))).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = call_as(
        &b,
        ("plain", "plain's password"),
        Method::POST,
        "/v1/topics/orders/produce/batch",
        Some(forged.clone()),
    )
    .await;
    expect_error(r, StatusCode::FORBIDDEN, "forbidden").await;
    // the header's name in any case is the same header
    let shouted = forged.to_string().replace("narad-origin", "Narad-Origin");
    let shouted: Value = serde_json::from_str(&shouted).unwrap();
    let r = call_as(
        &b,
        ("plain", "plain's password"),
        Method::POST,
        "/v1/topics/orders/produce/batch",
        Some(shouted.clone()),
    )
    .await;
    expect_error(r, StatusCode::FORBIDDEN, "forbidden").await;
    for body in [forged, shouted] {
        let r = call(&a, Method::POST, "/v1/topics/src/produce/batch", Some(body)).await;
        expect_error(r, StatusCode::CONFLICT, "loop_detected").await;
    }
    // a single produce naming the header twice (the last value is the one stored): every
    // value is checked
    for (first, second, status, code) in [
        (
            "aaaaaaaaaaaaaaaa/bbbbbbbbbbbbbbbb/0/1".to_owned(),
            format!("{a_cluster}/bbbbbbbbbbbbbbbb/0/2"),
            StatusCode::CONFLICT,
            "loop_detected",
        ),
        (
            "aaaaaaaaaaaaaaaa/bbbbbbbbbbbbbbbb/0/1".to_owned(),
            "garbage".to_owned(),
            StatusCode::BAD_REQUEST,
            "invalid_headers",
        ),
    ] {
        let r = a
            .http
            .post(a.url("/v1/topics/src/produce"))
            .basic_auth("admin", Some(ROOT_PW))
            .header("X-Narad-Header-narad-origin", first)
            .header("X-Narad-Header-Narad-Origin", second)
            .body("{}")
            .send()
            .await
            .unwrap();
        expect_error(r, status, code).await;
    }
    // only the one form the sender writes: lowercase ids, plain decimal numbers
    for v in [
        "nonsense".to_owned(),
        format!("{}/0000000000000001/0/0", a_cluster.to_uppercase()),
        format!("{a_cluster}/0000000000000001/+0/0"),
        format!("{a_cluster}/0000000000000001/0/00"),
        format!("{a_cluster}/0000000000000001/0/0/"),
        format!("{a_cluster}/000000000000001/0/0"),
    ] {
        let bad = json!({"messages": [{"payload": 1, "headers": {"narad-origin": v}}]});
        let r = call(
            &b,
            Method::POST,
            "/v1/topics/orders/produce/batch",
            Some(bad),
        )
        .await;
        expect_error(r, StatusCode::BAD_REQUEST, "invalid_headers").await;
    }

    // the target topic deleted and created again: the link stops at the next request
    let r = call(&b, Method::DELETE, "/v1/topics/orders", None).await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let r = call(
        &b,
        Method::POST,
        "/v1/topics",
        Some(json!({"name": "orders", "partitions": 2})),
    )
    .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(produce_seqs(&a, "src", 6000..6001).await.len(), 1);
    until("target_replaced", async || {
        children_of(&a, "src").await["children"][0]["remote"]["state"] == "target_replaced"
    })
    .await;
    let r = call(&b, Method::GET, "/v1/topics/orders", None).await;
    let v = json_of(r, StatusCode::OK).await;
    assert_eq!(
        v["partition_stats"][0]["next_offset"].as_u64().unwrap()
            + v["partition_stats"][1]["next_offset"].as_u64().unwrap(),
        0,
        "nothing went to the new incarnation"
    );
    // detached with force: the record it could not ship is abandoned
    let r = call(
        &a,
        Method::DELETE,
        "/v1/topics/src/children/to-b?force=true",
        None,
    )
    .await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    // its cursor files go with it
    let left: Vec<_> = crate::cluster::files_under(&a.data_dir)
        .into_iter()
        .filter(|f| f.to_string_lossy().contains("fanout-@to-b"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let r = call(&a, Method::DELETE, "/v1/remotes/b", None).await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
}

/// A record the target refuses stops its link (`record_too_large`, the record named as
/// blocked); an admin's skip lets the rest through, durably (not sent again after a restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_record_blocks_its_link_until_an_admin_skips_it() {
    let dir = tempfile::tempdir().unwrap();
    let (b, ca) = target(dir.path()).await;
    let mut a = source(dir.path(), port_of(&b)).await;
    let url = format!("https://127.0.0.1:{}", port_of(&b));
    let r = call(&a, Method::POST, "/v1/remotes", Some(json!({"name": "b", "url": url, "username": "mirror", "password": MIRROR_PW, "ca_pem": ca}))).await;
    json_of(r, StatusCode::CREATED).await;
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
        Some(json!({"child": "to-b", "remote": "b", "remote_topic": "orders"})),
    )
    .await;
    json_of(r, StatusCode::OK).await;
    // nothing blocks yet: nothing to skip
    let r = call(&a, Method::POST, "/v1/topics/src/children/to-b/skip", None).await;
    assert_eq!(json_of(r, StatusCode::OK).await, json!({"skipped": []}));
    // the link brings B to A's settings with its first records; B's own tighter limit,
    // set after that, refuses what A takes
    let r = call(
        &a,
        Method::POST,
        "/v1/topics/src/produce/batch",
        Some(json!({"messages": [{"key": "k", "payload": {"seq": 100, "pad": ""}}]})),
    )
    .await;
    json_of(r, StatusCode::ACCEPTED).await;
    until("seq 100 shipped", async || {
        replay_all(&b, "orders", 2).await.iter().any(|r| r.2 == 100)
    })
    .await;
    let r = call(
        &b,
        Method::PATCH,
        "/v1/topics/orders",
        Some(json!({"max_message_bytes": 1024})),
    )
    .await;
    json_of(r, StatusCode::OK).await;
    let msgs: Vec<Value> = (0..11u64)
        .map(|s| {
            let pad = if s == 5 {
                "x".repeat(2048)
            } else {
                String::new()
            };
            json!({"key": "k", "payload": {"seq": s, "pad": pad}})
        })
        .collect();
    let r = call(
        &a,
        Method::POST,
        "/v1/topics/src/produce/batch",
        Some(json!({ "messages": msgs })),
    )
    .await;
    json_of(r, StatusCode::ACCEPTED).await;
    // (seq 5 is at offset 6: seq 100 came first)
    until("blocked by seq 5", async || {
        let c = children_of(&a, "src").await;
        let r = &c["children"][0]["remote"];
        r["state"] == "record_too_large" && r["blocked"] == json!([{"partition": 0, "offset": 6}])
    })
    .await;
    assert_eq!(
        replay_all(&b, "orders", 2).await.len(),
        1,
        "a batch is all or nothing"
    );
    // only a record that blocks now may be named
    let r = call(
        &a,
        Method::POST,
        "/v1/topics/src/children/to-b/skip?partition=0&offset=4",
        None,
    )
    .await;
    expect_error(r, StatusCode::BAD_REQUEST, "invalid_parameter").await;
    let r = call(
        &a,
        Method::POST,
        "/v1/topics/src/children/to-b/skip?partition=0",
        None,
    )
    .await;
    expect_error(r, StatusCode::BAD_REQUEST, "invalid_parameter").await;
    let r = call(&a, Method::POST, "/v1/topics/src/children/to-b/skip", None).await;
    assert_eq!(
        json_of(r, StatusCode::OK).await,
        json!({"skipped": [{"partition": 0, "offset": 6}]})
    );
    assert!(a.log().contains("remote_child_skip"), "the skip is audited");
    until("the rest shipped", async || {
        let got: Vec<u64> = replay_all(&b, "orders", 2)
            .await
            .iter()
            .map(|r| r.2)
            .collect();
        let mut got = got;
        got.sort_unstable();
        got == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 100]
    })
    .await;
    until("running again", async || {
        children_of(&a, "src").await["children"][0]["remote"]["state"] == "running"
    })
    .await;
    // the skip is kept: after a restart record 5 is still not sent (the cursor is past it,
    // and a re-read would leave it out)
    a.stop().await;
    a.restart().await;
    let r = call(
        &a,
        Method::POST,
        "/v1/topics/src/produce/batch",
        Some(json!({"messages": [{"key": "k", "payload": {"seq": 11, "pad": ""}}]})),
    )
    .await;
    json_of(r, StatusCode::ACCEPTED).await;
    until("seq 11 shipped", async || {
        replay_all(&b, "orders", 2).await.iter().any(|r| r.2 == 11)
    })
    .await;
    assert!(!replay_all(&b, "orders", 2).await.iter().any(|r| r.2 == 5));
    // a parent grown after the attach: its new partition ships too
    let r = call(
        &a,
        Method::PATCH,
        "/v1/topics/src",
        Some(json!({"partitions": 2})),
    )
    .await;
    json_of(r, StatusCode::OK).await;
    let r = call(
        &a,
        Method::POST,
        "/v1/topics/src/produce/batch",
        Some(json!({"messages": [{"partition": 1, "payload": {"seq": 12, "pad": ""}}]})),
    )
    .await;
    assert_eq!(
        json_of(r, StatusCode::ACCEPTED).await["results"][0]["partition"],
        1
    );
    until("seq 12 from the new partition shipped", async || {
        replay_all(&b, "orders", 2).await.iter().any(|r| r.2 == 12)
    })
    .await;
}
