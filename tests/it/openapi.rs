//! docs/openapi.yaml lists exactly the routes the server has.

use std::collections::BTreeSet;

/// (METHOD, path) pairs found under `paths:` in the spec: path keys at two spaces, methods at four.
fn spec_routes(yaml: &str) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    let mut in_paths = false;
    let mut path: Option<String> = None;
    for line in yaml.lines() {
        if !line.starts_with(' ') && !line.trim().is_empty() {
            in_paths = line.trim_end() == "paths:";
            continue;
        }
        if !in_paths {
            continue;
        }
        if let Some(p) = line.strip_prefix("  ").filter(|l| l.starts_with('/')) {
            path = Some(
                p.trim_end()
                    .trim_end_matches(':')
                    .trim_matches(['"', '\''])
                    .to_owned(),
            );
        } else if let Some(m) = line.strip_prefix("    ").filter(|l| !l.starts_with(' ')) {
            let m = m.trim_end().trim_end_matches(':');
            if ["get", "post", "put", "patch", "delete", "head", "options"].contains(&m)
                && let Some(p) = &path
            {
                out.insert((m.to_uppercase(), p.clone()));
            }
        }
    }
    out
}

#[test]
fn spec_and_router_agree() {
    let yaml =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openapi.yaml"))
            .expect("docs/openapi.yaml exists");
    assert!(yaml.contains("openapi: 3.1"), "OpenAPI 3.1 document");
    // (a plain scalar with ": " in it is not YAML: schemathesis could not read the file once
    // while this test, which reads it as text, passed)
    let unreadable: Vec<(usize, &str)> = yaml
        .lines()
        .enumerate()
        .filter(|(_, l)| {
            l.trim_start()
                .strip_prefix("description: ")
                .or_else(|| l.trim_start().strip_prefix("summary: "))
                .is_some_and(|v| !v.starts_with(['"', '\'', '>', '|']) && v.contains(": "))
        })
        .map(|(i, l)| (i + 1, l))
        .collect();
    assert!(
        unreadable.is_empty(),
        "descriptions with an unquoted ': ' (not valid YAML): {unreadable:?}"
    );
    let spec = spec_routes(&yaml);
    let code: BTreeSet<(String, String)> = narad_infra::http::ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    let missing: Vec<_> = code.difference(&spec).collect();
    let extra: Vec<_> = spec.difference(&code).collect();
    assert!(
        missing.is_empty(),
        "routes in code but not in docs/openapi.yaml: {missing:?}"
    );
    assert!(
        extra.is_empty(),
        "routes in docs/openapi.yaml but not in code: {extra:?}"
    );
}

#[test]
fn router_serves_every_listed_route() {
    // ROUTES is only useful if it matches the router: every listed route must not 404/405.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        use tower::ServiceExt;
        let state = std::sync::Arc::new(narad_infra::http::AppState {
            cfg: narad_infra::config::ServerConfig::default(),
            broker: std::sync::OnceLock::new(),
            ready: Default::default(),
            shutting_down: Default::default(),
            metrics: std::sync::Arc::new(narad_infra::metrics::Metrics::new()),
            archive: None,
            auth: None,
            users_loaded: Default::default(),
            body_budget: narad_infra::http::budget::BodyBudget::new(1 << 30, 1 << 28),
            schemas: Default::default(),
            restore_notice: Default::default(),
            cluster: None,
            ingress: std::sync::OnceLock::new(),
            remotes: Default::default(),
            mover: std::sync::OnceLock::new(),
            move_metrics: Default::default(),
            sqs_keys: Default::default(),
        });
        let app = narad_infra::http::router(state);
        for (m, p) in narad_infra::http::ROUTES {
            let uri = p.replace("{topic}", "t");
            let req = axum::http::Request::builder()
                .method(*m)
                .uri(&uri)
                .body(axum::body::Body::empty())
                .unwrap();
            let resp = app.clone().oneshot(req).await.unwrap();
            let st = resp.status().as_u16();
            assert!(st != 404 && st != 405, "{m} {p} is not routed (got {st})");
        }
    });
}
