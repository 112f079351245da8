//! The `narad-wire` types against the real server: every kind of response the CLI and the bench
//! read is parsed into its wire type, and writing the typed value back must give the JSON the
//! server sent (a field the type lacks, misnames or mistypes fails; the types themselves stay
//! tolerant of unknown fields, so this is where strictness lives). Error answers must carry a
//! code of the table with the table's status.

use narad_wire as wire;
use reqwest::Method;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::support::*;

/// `text` as a `T`, and `T` written back is `text` again.
fn round_trip<T: DeserializeOwned + Serialize>(what: &str, text: &str) -> T {
    let typed: T = serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("{what}: does not parse as the wire type: {e}\n{text}"));
    let sent: Value = serde_json::from_str(text).unwrap();
    let back = serde_json::to_value(&typed).unwrap();
    assert_eq!(
        back, sent,
        "{what}: the wire type does not hold what the server sent"
    );
    typed
}

/// A success answer of `status`, as `T`.
async fn answer<T: DeserializeOwned + Serialize>(
    what: &str,
    r: reqwest::Response,
    status: StatusCode,
) -> T {
    let got = r.status();
    let text = r.text().await.unwrap();
    assert_eq!(got, status, "{what}: {text}");
    round_trip(what, &text)
}

/// An error answer: its code, which must be the table's for its status.
async fn error(what: &str, r: reqwest::Response) -> wire::ErrorCode {
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    let body: wire::ErrorBody = round_trip(what, &text);
    let code = body
        .known_code()
        .unwrap_or_else(|| panic!("{what}: `{}` is not in the table", body.code));
    assert_eq!(code.http_status(), status, "{what}: {text}");
    code
}

#[tokio::test]
async fn topic_produce_consume_and_ack_responses_are_the_wire_types() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path()).await;

    let st: wire::Status = answer("healthz", s.get("/healthz").await, StatusCode::OK).await;
    assert_eq!(st.status, "ok");
    let st: wire::Status = answer("readyz", s.get("/readyz").await, StatusCode::OK).await;
    assert_eq!(st.status, "ready");

    // create: what the CLI and the bench send, typed
    let mut create = wire::CreateTopic::new("w");
    create.settings.partitions = Some(2);
    create.settings.visibility_timeout_ms = Some(60_000);
    let t: wire::Topic = answer(
        "create",
        s.post_json("/v1/topics", &serde_json::to_value(&create).unwrap())
            .await,
        StatusCode::CREATED,
    )
    .await;
    assert_eq!((t.name.as_str(), t.config.partitions), ("w", 2));
    assert_eq!(t.config.visibility_timeout_ms, 60_000);
    let mut schema = wire::CreateTopic::new("ws");
    schema.schema = Some(json!({"type": "object"}));
    let t: wire::Topic = answer(
        "create with a schema",
        s.post_json("/v1/topics", &serde_json::to_value(&schema).unwrap())
            .await,
        StatusCode::CREATED,
    )
    .await;
    assert_eq!(t.schema_version, Some(1));
    let mut child = wire::CreateTopic::new("wc");
    child.parent = Some("w".into());
    child.fanout_delay_ms = Some(1000);
    child.from = Some(wire::StartFrom::Earliest);
    let t: wire::Topic = answer(
        "create a child",
        s.post_json("/v1/topics", &serde_json::to_value(&child).unwrap())
            .await,
        StatusCode::CREATED,
    )
    .await;
    assert_eq!(
        (t.parent.as_deref(), t.fanout_delay_ms),
        (Some("w"), Some(1000))
    );

    let page: wire::TopicList =
        answer("list", s.get("/v1/topics?limit=2").await, StatusCode::OK).await;
    assert_eq!(page.topics.len(), 2);
    assert_eq!(page.next_page_token, "wc");
    let alter = wire::AlterTopic {
        settings: wire::TopicSettings {
            max_in_flight_per_partition: Some(10),
            ..Default::default()
        },
        schema: None,
    };
    let r = s
        .http
        .patch(s.url("/v1/topics/w"))
        .json(&alter)
        .send()
        .await
        .unwrap();
    let t: wire::Topic = answer("alter", r, StatusCode::OK).await;
    assert_eq!(t.config.max_in_flight_per_partition, 10);

    let versions: wire::SchemaVersions = answer(
        "schemas",
        s.get("/v1/topics/ws/schema").await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(versions.latest, Some(1));
    let none: wire::SchemaVersions = answer(
        "no schema",
        s.get("/v1/topics/w/schema").await,
        StatusCode::OK,
    )
    .await;
    assert_eq!((none.latest, none.versions.len()), (None, 0));
    let v1: wire::SchemaVersion = answer(
        "one schema version",
        s.get("/v1/topics/ws/schema?version=1").await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(v1.schema, json!({"type": "object"}));
    let kids: wire::Children = answer(
        "children",
        s.get("/v1/topics/w/children").await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(kids.children[0].name, "wc");

    // produce: single and batch, every payload encoding
    let r = s
        .http
        .post(s.url("/v1/topics/w/produce?key=k1&partition=0"))
        .header("x-narad-header-trace", "abc")
        .body(r#"{"id": 1, "n": 2.50}"#)
        .send()
        .await
        .unwrap();
    let one: wire::Produced = answer("produce", r, StatusCode::ACCEPTED).await;
    assert_eq!(
        one,
        wire::Produced {
            partition: 0,
            offset: 0
        }
    );
    let binary = [0u8, 1, 2, 0xff, 0xfe];
    let mut text = wire::ProduceMessage::text("line\n\"two\"");
    text.partition = Some(0);
    text.delay_ms = Some(1);
    text.headers = Some([("h".to_owned(), "v".to_owned())].into());
    let mut b64 = wire::ProduceMessage::text("AAEC//4=");
    b64.payload_encoding = Some(wire::Encoding::Base64);
    b64.partition = Some(0);
    let json_payload: wire::ProduceMessage =
        serde_json::from_str(r#"{"payload": [1, {"a": null}], "partition": 0}"#).unwrap();
    let batch = wire::ProduceBatch {
        messages: vec![text, b64, json_payload],
    };
    let r = s
        .post_json(
            "/v1/topics/w/produce/batch",
            &serde_json::to_value(&batch).unwrap(),
        )
        .await;
    let many: wire::BatchProduced = answer("batch produce", r, StatusCode::ACCEPTED).await;
    assert_eq!(many.accepted, 3);
    assert_eq!(
        many.results.iter().map(|p| p.offset).collect::<Vec<_>>(),
        [1, 2, 3]
    );

    // replay: every message, decoded to the bytes produced
    let page: wire::Messages = answer(
        "replay",
        s.get("/v1/topics/w/consume?partition=0&offset=0&max=10")
            .await,
        StatusCode::OK,
    )
    .await;
    let bytes: Vec<Vec<u8>> = page
        .messages
        .iter()
        .map(|m| m.payload_bytes().unwrap().into_owned())
        .collect();
    assert_eq!(
        bytes,
        [
            br#"{"id": 1, "n": 2.50}"#.to_vec(),
            b"line\n\"two\"".to_vec(),
            binary.to_vec(),
            br#"[1,{"a":null}]"#.to_vec(),
        ]
    );
    assert_eq!(page.messages[0].key.as_deref(), Some("k1"));
    assert_eq!(page.messages[1].delay_ms, Some(1));
    let one: wire::Message = answer(
        "replay of one message",
        s.get("/v1/topics/w/consume?partition=0&offset=2").await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(one.payload_encoding, wire::Encoding::Base64);

    // queue reads and acks
    let m: wire::Message = answer(
        "consume one",
        s.get("/v1/topics/w/consume?partition=0").await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(m.delivery_count, Some(1));
    let first = m.receipt_handle.clone().unwrap();
    let page: wire::Messages = answer(
        "consume a batch",
        s.get("/v1/topics/w/consume?partition=0&max=10").await,
        StatusCode::OK,
    )
    .await;
    let mut handles: Vec<String> = page
        .messages
        .iter()
        .map(|m| m.receipt_handle.clone().unwrap())
        .collect();
    handles.push(first.clone()); // settled twice below: the second is gone
    let r = s
        .post_json(
            "/v1/topics/w/ack",
            &serde_json::to_value(wire::AckBatch {
                receipt_handles: vec![first],
                extend: Some(wire::Settle::Extend),
            })
            .unwrap(),
        )
        .await;
    let ext: wire::AckResults = answer("extend", r, StatusCode::OK).await;
    assert_eq!(ext.results, [wire::AckResult::applied()]);
    handles.push("not-a-handle".into());
    let r = s
        .post_json(
            "/v1/topics/w/ack",
            &serde_json::to_value(wire::AckBatch {
                receipt_handles: handles.clone(),
                extend: None,
            })
            .unwrap(),
        )
        .await;
    let acked: wire::AckResults = answer("batch ack", r, StatusCode::OK).await;
    let n = handles.len();
    assert!(
        acked.results[..n - 1]
            .iter()
            .all(|r| *r == wire::AckResult::applied()),
        "{acked:?}"
    );
    let bad = &acked.results[n - 1];
    assert_eq!(
        bad.known_code(),
        Some(wire::ErrorCode::InvalidReceiptHandle)
    );
    assert_eq!(bad.status, bad.known_code().unwrap().http_status());
    let r = s
        .post_json(
            "/v1/topics/w/ack",
            &serde_json::to_value(wire::AckBatch {
                receipt_handles: handles[..1].to_vec(),
                extend: Some(wire::Settle::Nack),
            })
            .unwrap(),
        )
        .await;
    let again: wire::AckResults = answer("ack of a settled lease", r, StatusCode::OK).await;
    assert_eq!(
        again.results[0].known_code(),
        Some(wire::ErrorCode::LeaseGone)
    );
    assert_eq!(again.results[0].status, 410);

    let d: wire::TopicDetails =
        answer("details", s.get("/v1/topics/w").await, StatusCode::OK).await;
    assert_eq!(d.partition_stats.len(), 2);
    assert_eq!(d.partition_stats[0].next_offset, 4);
    assert_eq!(d.partition_stats[0].frontier, 4, "{d:?}");

    // errors of every layer: router, middleware, query, body, broker, schema, fan-out
    let attach = wire::AttachChild {
        child: "w".into(),
        delay_ms: 0,
        from: None,
    };
    for (what, r, code) in [
        (
            "unknown route",
            s.get("/v2/x").await,
            wire::ErrorCode::RouteNotFound,
        ),
        (
            "wrong method",
            s.http.put(s.url("/v1/topics")).send().await.unwrap(),
            wire::ErrorCode::MethodNotAllowed,
        ),
        (
            "undecodable path",
            s.get("/v1/topics/%FF%FE").await,
            wire::ErrorCode::InvalidRequest,
        ),
        (
            "unknown parameter",
            s.get("/v1/topics?nope=1").await,
            wire::ErrorCode::UnknownParameter,
        ),
        (
            "missing topic",
            s.get("/v1/topics/nope").await,
            wire::ErrorCode::TopicNotFound,
        ),
        (
            "existing topic",
            s.post_json("/v1/topics", &json!({"name": "w"})).await,
            wire::ErrorCode::TopicExists,
        ),
        (
            "empty message",
            s.produce("w", "", "").await,
            wire::ErrorCode::EmptyMessage,
        ),
        (
            "schema violation",
            s.produce("ws", "", "[]").await,
            wire::ErrorCode::SchemaViolation,
        ),
        (
            "produce to a delay child",
            s.produce("wc", "", "x").await,
            wire::ErrorCode::FanoutConflict,
        ),
        (
            "attach to itself",
            s.post_json(
                "/v1/topics/w/children",
                &serde_json::to_value(&attach).unwrap(),
            )
            .await,
            wire::ErrorCode::InvalidChild,
        ),
        (
            "bad from_time",
            s.get("/v1/topics/w/consume?partition=0&from_time=x").await,
            wire::ErrorCode::InvalidParameter,
        ),
        (
            "users without security",
            s.get("/v1/users").await,
            wire::ErrorCode::SecurityDisabled,
        ),
        (
            "unknown encoding",
            s.http
                .post(s.url("/v1/topics/w/produce/batch"))
                .header("content-encoding", "br")
                .body("{}")
                .send()
                .await
                .unwrap(),
            wire::ErrorCode::UnsupportedEncoding,
        ),
    ] {
        assert_eq!(error(what, r).await, code, "{what}");
    }
}

#[tokio::test]
async fn user_responses_are_the_wire_types() {
    const ROOT: (&str, &str) = ("admin", "root-password-1");
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_opts(dir.path(), false, &[("NARAD_ADMIN_PASSWORD", ROOT.1)], None).await;
    let create = wire::CreateUser {
        username: "ann".into(),
        password: "ann-password-1".into(),
        grants: vec![
            wire::Grant {
                action: wire::GrantAction::Produce,
                patterns: vec!["orders-*".into()],
            },
            wire::Grant {
                action: wire::GrantAction::Consume,
                patterns: vec!["orders".into()],
            },
        ],
    };
    let body = || Some(serde_json::to_value(&create).unwrap());
    let u: wire::User = answer(
        "create user",
        call_as(&s, ROOT, Method::POST, "/v1/users", body()).await,
        StatusCode::CREATED,
    )
    .await;
    assert_eq!(u.grants, create.grants);
    assert!(!u.root);
    let list: wire::UserList = answer(
        "list users",
        call_as(&s, ROOT, Method::GET, "/v1/users", None).await,
        StatusCode::OK,
    )
    .await;
    assert!(list.users.iter().any(|u| u.root && u.username == "admin"));
    let me: wire::User = answer(
        "own user",
        call_as(
            &s,
            ("ann", "ann-password-1"),
            Method::GET,
            "/v1/users/ann",
            None,
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(me.username, "ann");
    let grants = wire::SetGrants {
        grants: vec![wire::Grant {
            action: wire::GrantAction::Create,
            patterns: vec!["*".into()],
        }],
    };
    let u: wire::User = answer(
        "set grants",
        call_as(
            &s,
            ROOT,
            Method::PUT,
            "/v1/users/ann/grants",
            Some(serde_json::to_value(&grants).unwrap()),
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(u.grants, grants.grants);
    let pw = wire::SetPassword {
        new_password: "ann-password-2".into(),
        current_password: Some("ann-password-1".into()),
    };
    let r = call_as(
        &s,
        ("ann", "ann-password-1"),
        Method::PUT,
        "/v1/users/ann/password",
        Some(serde_json::to_value(&pw).unwrap()),
    )
    .await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);

    for (what, r, code) in [
        (
            "existing user",
            call_as(&s, ROOT, Method::POST, "/v1/users", body()).await,
            wire::ErrorCode::UserExists,
        ),
        (
            "missing user",
            call_as(&s, ROOT, Method::GET, "/v1/users/nobody", None).await,
            wire::ErrorCode::UserNotFound,
        ),
        (
            "wrong password",
            call_as(
                &s,
                ("ann", "wrong-password"),
                Method::GET,
                "/v1/topics",
                None,
            )
            .await,
            wire::ErrorCode::Unauthorized,
        ),
        (
            "no right",
            call_as(
                &s,
                ("ann", "ann-password-2"),
                Method::GET,
                "/v1/users",
                None,
            )
            .await,
            wire::ErrorCode::Forbidden,
        ),
    ] {
        assert_eq!(error(what, r).await, code, "{what}");
    }
}
