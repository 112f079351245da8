//! Remotes (`/v1/remotes`): kept with their passwords sealed, checked against a real second
//! broker over TLS, refused where the address guard says, carried across a secret rotation.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::cluster::{contains, files_under};
use crate::security::make_cert;
use crate::support::{BIN, Server, call_as, expect_error};

const ROOT_PW: &str = "root-password-1";
const SECRET: &str = "the source cluster's secret, 32 bytes or more";
const NEW_SECRET: &str = "the source cluster's next secret, also 32+ bytes";
const MIRROR_PW: &str = "the mirror user's password on the target";
const OPS_PW: &str = "an admin of the target, not for remotes";

/// The target: security on, HTTPS from a test CA, a topic `orders`, a user `mirror` that may
/// produce to it and an admin `ops`. Returns it and its CA.
async fn target(dir: &std::path::Path) -> (Server, String) {
    let (ca, chain, key) = make_cert();
    let (cert_file, key_file) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert_file, &chain).unwrap();
    std::fs::write(&key_file, &key).unwrap();
    let b = Server::start_opts(
        &sub(dir, "b"),
        false,
        &[
            ("NARAD_ADMIN_PASSWORD", ROOT_PW),
            ("NARAD_TLS_CERT_FILE", cert_file.to_str().unwrap()),
            ("NARAD_TLS_KEY_FILE", key_file.to_str().unwrap()),
        ],
        Some(ca.as_bytes()),
    )
    .await;
    let root = ("admin", ROOT_PW);
    for (body, path) in [
        (json!({"name": "orders", "partitions": 2}), "/v1/topics"),
        (
            json!({"username": "mirror", "password": MIRROR_PW, "grants": [{"action": "produce", "patterns": ["orders"]}]}),
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
async fn source(dir: &std::path::Path, port: u16) -> Server {
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
fn sub(dir: &std::path::Path, name: &str) -> std::path::PathBuf {
    let d = dir.join(name);
    std::fs::create_dir_all(&d).unwrap();
    d
}

async fn call(s: &Server, method: Method, path: &str, body: Option<Value>) -> reqwest::Response {
    call_as(s, ("admin", ROOT_PW), method, path, body).await
}

async fn json_of(r: reqwest::Response, want: StatusCode) -> Value {
    let st = r.status();
    let text = r.text().await.unwrap();
    assert_eq!(st, want, "{text}");
    serde_json::from_str(&text).unwrap()
}

fn port_of(s: &Server) -> u16 {
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

    // the password is in no file under the source's data directory nor in its log
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
