//! TLS: HTTPS with certificate reloads, and clients silent after the handshake closed in
//! bounded time.

use super::*;

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
