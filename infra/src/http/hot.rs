//! The hot routes: single-message produce, consume and ack, served without the router.
//!
//! One message per request is what most clients send, and at that size the router's own
//! work (matching, a boxed service and future per layer, extension maps, the extractors'
//! copies of the URI and headers) is a measurable share of the request. The connection
//! task sends a request here when its method and path are plainly one of [`Hot`]'s; the
//! request then goes through the same [`serve`] (authentication, body budget, JSON errors,
//! metrics under the same route label) and the same handler as through the router.
//! Anything else, including a topic segment with percent-escapes (the router decodes them)
//! and a wrong method on these paths (the router answers 405), goes through the router.

use axum::extract::Request;
use axum::http::{HeaderValue, Method, header};
use axum::response::{IntoResponse as _, Response};
use http_body::Body as _;
use narad_wire::ErrorCode;

use super::access::Caller;
use super::budget::Held;
use super::{ApiError, ApiResult, SharedState, ack, consume, produce, serve};

/// A route served without the router.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hot {
    /// `POST /v1/topics/{topic}/produce`
    Produce,
    /// `GET /v1/topics/{topic}/consume`
    Consume,
    /// `POST /v1/topics/{topic}/ack`
    Ack,
}

impl Hot {
    /// The route's pattern, as [`super::ROUTES`] lists it (its metric label and budget class).
    pub fn pattern(self) -> &'static str {
        match self {
            Self::Produce => "/v1/topics/{topic}/produce",
            Self::Consume => "/v1/topics/{topic}/consume",
            Self::Ack => "/v1/topics/{topic}/ack",
        }
    }
}

/// The hot route a request is for and the topic it names, or `None` when it is for another
/// route (or names its topic in a form only the router decodes).
pub fn route<'a>(method: &Method, path: &'a str) -> Option<(Hot, &'a str)> {
    let rest = path.strip_prefix("/v1/topics/")?;
    let (topic, action) = rest.split_once('/')?;
    let hot = match (method, action) {
        (&Method::POST, "produce") => Hot::Produce,
        (&Method::GET, "consume") => Hot::Consume,
        (&Method::POST, "ack") => Hot::Ack,
        _ => return None,
    };
    let plain = !topic.is_empty() && !topic.contains('%');
    plain.then_some((hot, topic))
}

/// Serves a request [`route`] accepted as `hot` for `topic`.
pub async fn serve_hot(state: &SharedState, hot: Hot, topic: String, req: Request) -> Response {
    let mut resp = serve(state, Some(hot.pattern()), req, |req| async move {
        handle(state, hot, topic, req)
            .await
            .unwrap_or_else(|e| e.into_response())
    })
    .await;
    // What the router does for every response it routes: a body of known size is framed by
    // `Content-Length`, not chunked (an HTTP/1.0 keep-alive client can only use that).
    if !resp.headers().contains_key(header::CONTENT_LENGTH)
        && let Some(n) = resp.body().size_hint().exact()
    {
        resp.headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from(n));
    }
    resp
}

async fn handle(state: &SharedState, hot: Hot, topic: String, req: Request) -> ApiResult {
    let (parts, body) = req.into_parts();
    // authentication always records the caller (and the budget its holding) before the
    // handler runs
    let missing = || ApiError::new(ErrorCode::InternalError, "request state missing");
    let caller = parts
        .extensions
        .get::<Caller>()
        .cloned()
        .ok_or_else(missing)?;
    match hot {
        Hot::Produce => {
            let query = parts.uri.query();
            produce::single_message(state, &caller, &topic, query, &parts.headers, body).await
        }
        Hot::Consume => {
            let held = parts
                .extensions
                .get::<Held>()
                .cloned()
                .ok_or_else(missing)?;
            consume::consume_parts(state.clone(), caller, held, topic, parts.uri).await
        }
        Hot::Ack => ack::ack_parts(state.clone(), caller, topic, parts.uri, body).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_single_message_paths_are_hot() {
        for (method, path, want) in [
            (Method::POST, "/v1/topics/orders/produce", Hot::Produce),
            (Method::GET, "/v1/topics/orders/consume", Hot::Consume),
            (Method::POST, "/v1/topics/orders/ack", Hot::Ack),
        ] {
            assert_eq!(
                route(&method, path),
                Some((want, "orders")),
                "{method} {path}"
            );
            assert!(super::super::ROUTES.contains(&(method.as_str(), want.pattern())));
        }
        for (method, path) in [
            (Method::GET, "/v1/topics/orders/produce"),
            (Method::PUT, "/v1/topics/orders/produce"),
            (Method::POST, "/v1/topics/orders/consume"),
            (Method::GET, "/v1/topics/orders/ack"),
            (Method::POST, "/v1/topics/orders/produce/batch"),
            (Method::POST, "/v1/topics/orders/produce/"),
            (Method::POST, "/v1/topics/orders/ack/"),
            (Method::POST, "/v1/topics//produce"),
            (Method::POST, "/v1/topics/a/b/produce"),
            (Method::POST, "/v1/topics/ord%65rs/produce"),
            (Method::GET, "/v1/topics/ord%65rs/consume"),
            (Method::POST, "/v1/topics/produce"),
            (Method::POST, "/v1/topicsx/orders/produce"),
            (Method::POST, "/v2/topics/orders/produce"),
            (Method::GET, "/v1/topics/orders"),
        ] {
            assert_eq!(route(&method, path), None, "{method} {path}");
        }
    }
}
