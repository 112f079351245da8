//! JSON Schema per topic: validation on produce, additive evolution, and schemas refused
//! quickly when they would cost too much to check.

use super::*;

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
