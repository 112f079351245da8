//! The checks a remote passes before anything is sent to it (`POST /v1/remotes/{name}/test`,
//! and later at attach and resume): that it is a Narad with security on, that the credential
//! works and is not an admin's, and, for a target topic, that the topic exists, is not the
//! parent itself and takes produces from this credential.
//!
//! Each check is one request; the first failure ends the run (the later ones depend on it)
//! and names the link state it would put a remote child in. Nothing the remote answers is
//! echoed beyond its status and error code: a remote is not trusted to write into our
//! responses or logs.

use std::time::Duration;

use hyper::{Method, StatusCode};
use serde::Serialize;

use crate::client::{RemoteClient, Reply};

/// Longest a whole check run takes.
pub const CHECK_DEADLINE: Duration = Duration::from_secs(20);

/// One check's outcome.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Check {
    pub name: &'static str,
    pub ok: bool,
    pub detail: String,
}

/// What a check run found.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct CheckReport {
    /// Every check passed.
    pub ok: bool,
    /// `running` when every check passed, else the link state the failure means
    /// (`unavailable`, `tls_failed`, `auth_failed`, `forbidden`, `target_missing`, ...).
    pub state: &'static str,
    pub checks: Vec<Check>,
    /// The target topic's incarnation id (hex), when one was checked and found.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topic_id: Option<String>,
}

/// What to check beyond the remote itself.
#[derive(Debug, Clone, Default)]
pub struct Target<'a> {
    /// The topic records would be sent to.
    pub topic: Option<&'a str>,
    /// The incarnation id of the topic that would be mirrored: the target must not be it.
    pub parent_id: Option<u64>,
    /// The mirrored topic's JSON Schema (its latest version; `Some(None)`: it has none): the
    /// target's must be the same, or it would refuse records the parent took. `None`: not
    /// checked.
    pub schema: Option<Option<&'a serde_json::Value>>,
    /// Make the target topic the mirror of the parent (the link's last check; see
    /// `narad_core::catalog::role`); `dry`: only ask whether it would.
    pub mirror: Option<MirrorOf>,
    /// The remote carries this cluster's users: its user must be an admin there (the
    /// opposite of a link's), and it takes no topic.
    pub carries_users: bool,
}

/// What the target topic becomes the mirror of.
#[derive(Debug, Clone, Copy)]
pub struct MirrorOf {
    /// This cluster's id.
    pub cluster: u64,
    /// The parent's incarnation id.
    pub topic: u64,
    /// The parent's epoch.
    pub epoch: u64,
    /// Only ask (`remote test`): nothing changes on the remote.
    pub dry: bool,
}

struct Run {
    checks: Vec<Check>,
    topic_id: Option<String>,
}

impl Run {
    fn pass(&mut self, name: &'static str, detail: impl Into<String>) {
        self.checks.push(Check {
            name,
            ok: true,
            detail: detail.into(),
        });
    }

    fn fail(mut self, name: &'static str, state: &'static str, detail: String) -> CheckReport {
        self.checks.push(Check {
            name,
            ok: false,
            detail,
        });
        CheckReport {
            ok: false,
            state,
            checks: self.checks,
            topic_id: self.topic_id,
        }
    }
}

/// The error code of a Narad error body, if the body is one.
fn code(reply: &Reply) -> Option<String> {
    serde_json::from_slice::<serde_json::Value>(&reply.body)
        .ok()?
        .get("code")?
        .as_str()
        .filter(|c| c.len() <= 64 && c.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'))
        .map(str::to_owned)
}

/// The link state an unexpected answer means.
fn state_of(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "auth_failed",
        403 => "forbidden",
        404 => "target_missing",
        429 => "throttled",
        _ => "unavailable",
    }
}

fn answered(reply: &Reply) -> String {
    match code(reply) {
        Some(c) => format!("answered {} {c}", reply.status.as_u16()),
        None => format!("answered {}", reply.status.as_u16()),
    }
}

/// Runs the checks against `client`'s remote for `target`, within [`CHECK_DEADLINE`].
pub async fn check(client: &RemoteClient, target: Target<'_>) -> CheckReport {
    let run = Run {
        checks: Vec::new(),
        topic_id: None,
    };
    match tokio::time::timeout(CHECK_DEADLINE, checks(client, target, run)).await {
        Ok(report) => report,
        Err(_) => CheckReport {
            ok: false,
            state: "unavailable",
            checks: vec![Check {
                name: "deadline",
                ok: false,
                detail: format!("the checks did not finish within {CHECK_DEADLINE:?}"),
            }],
            topic_id: None,
        },
    }
}

async fn checks(client: &RemoteClient, target: Target<'_>, mut run: Run) -> CheckReport {
    // 1. reachable, and a Narad asking for credentials
    let reply = match client.request_anonymous(Method::GET, "v1/topics").await {
        Ok(r) => r,
        Err(e) => return run.fail("reachable", e.state(), e.to_string()),
    };
    run.pass("reachable", format!("{} answered", client.url().canonical));
    match (reply.status.as_u16(), code(&reply).as_deref()) {
        (401, Some("unauthorized")) => run.pass("security_on", "the remote asks for credentials"),
        (200, _) => {
            return run.fail(
                "security_on",
                "destination_refused",
                "the remote answers without credentials: its security is off, and a remote must be a Narad with security on".into(),
            );
        }
        _ => {
            return run.fail(
                "security_on",
                "destination_refused",
                format!("not a Narad API: {}", answered(&reply)),
            );
        }
    }
    // 2. the credential works
    let reply = match client.request(Method::GET, "v1/topics?limit=1", None).await {
        Ok(r) => r,
        Err(e) => return run.fail("credential", e.state(), e.to_string()),
    };
    if reply.status != StatusCode::OK {
        return run.fail(
            "credential",
            state_of(reply.status),
            format!("the remote refused the credential: {}", answered(&reply)),
        );
    }
    run.pass("credential", "the remote took the credential");
    // 3. ... and is not an admin's (or is, for a remote that carries users)
    let reply = match client.request(Method::GET, "v1/users", None).await {
        Ok(r) => r,
        Err(e) => return run.fail("not_admin", e.state(), e.to_string()),
    };
    if target.carries_users {
        return match reply.status.as_u16() {
            200 if target.topic.is_some() => run.fail(
                "users_only",
                "destination_refused",
                "the remote carries users (as an admin there): remote children ship through a remote whose user has only produce and replicate".into(),
            ),
            200 => CheckReport {
                ok: true,
                state: "running",
                checks: {
                    run.pass(
                        "admin",
                        "the user is an admin of the remote: it may take this cluster's users (admins among them only if it is the remote's root user)",
                    );
                    run.checks
                },
                topic_id: None,
            },
            403 => run.fail(
                "admin",
                "forbidden",
                "carry_users needs an admin of the remote (its root user to carry admins too): this user is not one".into(),
            ),
            _ => run.fail(
                "admin",
                state_of(reply.status),
                format!("asking whether the user is an admin: {}", answered(&reply)),
            ),
        };
    }
    match reply.status.as_u16() {
        403 => run.pass("not_admin", "the user is not an admin of the remote"),
        200 => {
            return run.fail(
                "not_admin",
                "forbidden",
                "the user is an admin of the remote: give the remote a user with only produce on the target topics".into(),
            );
        }
        _ => {
            return run.fail(
                "not_admin",
                state_of(reply.status),
                format!("asking whether the user is an admin: {}", answered(&reply)),
            );
        }
    }
    let Some(topic) = target.topic else {
        return CheckReport {
            ok: true,
            state: "running",
            checks: run.checks,
            topic_id: None,
        };
    };
    // 4. the target topic exists and is not the parent itself
    let reply = match client
        .request(Method::GET, &format!("v1/topics/{topic}"), None)
        .await
    {
        Ok(r) => r,
        Err(e) => return run.fail("topic", e.state(), e.to_string()),
    };
    if reply.status != StatusCode::OK {
        return run.fail(
            "topic",
            state_of(reply.status),
            format!("topic '{topic}' on the remote: {}", answered(&reply)),
        );
    }
    let described = serde_json::from_slice::<serde_json::Value>(&reply.body).ok();
    let id = described
        .as_ref()
        .and_then(|v| v.get("id")?.as_str().map(str::to_owned))
        .filter(|id| id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit()));
    // its failover role (absent from an older version: taken as a primary)
    let role = described
        .as_ref()
        .and_then(|v| v.get("failover")?.get("role")?.as_str())
        .unwrap_or("primary")
        .to_owned();
    let Some(id) = id else {
        return run.fail(
            "topic",
            "destination_refused",
            format!("topic '{topic}' on the remote: the answer names no incarnation id"),
        );
    };
    run.topic_id = Some(id.clone());
    if target
        .parent_id
        .is_some_and(|p| u64::from_str_radix(&id, 16) == Ok(p))
    {
        return run.fail(
            "topic",
            "loop_detected",
            format!(
                "topic '{topic}' on the remote is the mirrored topic itself (incarnation {id}): the remote is this cluster"
            ),
        );
    }
    run.pass(
        "topic",
        format!("topic '{topic}' exists (incarnation {id})"),
    );
    // 5. the loop rule: a primary that mirrors to remotes of its own is the head of links
    //    of its own (this link would make it a mirror, and with a link back here, a cycle);
    //    a mirror or a demoted topic with links of its own is a copy protected onward (its
    //    links stand by until it is promoted, and forward what it holds then)
    let reply = match client
        .request(Method::GET, &format!("v1/topics/{topic}/children"), None)
        .await
    {
        Ok(r) => r,
        Err(e) => return run.fail("no_remote_children", e.state(), e.to_string()),
    };
    let children = (reply.status == StatusCode::OK)
        .then(|| serde_json::from_slice::<serde_json::Value>(&reply.body).ok())
        .flatten();
    let Some(children) = children else {
        return run.fail(
            "no_remote_children",
            state_of(reply.status),
            format!(
                "listing the children of '{topic}' on the remote: {}",
                answered(&reply)
            ),
        );
    };
    let links: Vec<&serde_json::Value> = children["children"]
        .as_array()
        .map(|l| l.iter().filter_map(|c| c.get("remote")).collect())
        .unwrap_or_default();
    let mirrors = !links.is_empty();
    // one of them ships to the topic this link would mirror (a cycle of two); an older
    // version that names no ids is taken as one that may
    let back = target.parent_id.is_none_or(|parent| {
        links.iter().any(|l| {
            l.get("target_topic_id")
                .and_then(|v| v.as_str())
                .is_none_or(|id| u64::from_str_radix(id, 16) == Ok(parent))
        })
    });
    if mirrors && back && role != "primary" {
        return run.fail(
            "no_remote_children",
            "loop_detected",
            match target.parent_id {
                Some(_) => format!(
                    "topic '{topic}' on the remote ships to the topic this link would mirror: links do not loop (detach that link there first)"
                ),
                None => format!(
                    "topic '{topic}' on the remote mirrors to remotes of its own: name the topic that would be mirrored (parent) to check whether it ships to it"
                ),
            },
        );
    }
    // a demoted topic may still be shipping its tail (records it acknowledged) to the
    // primary that replaced it: made a mirror here, it would ship them at this link's epoch,
    // which that primary refuses, and they would never reach it
    let unshipped = children["children"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c.get("remote").is_some())
        .any(|c| c["lag_messages"].as_u64() != Some(0))
        || children["partitions_unavailable"]
            .as_array()
            .is_some_and(|p| !p.is_empty());
    if mirrors && role == "demoted" && unshipped {
        return run.fail(
            "no_remote_children",
            "destination_refused",
            format!(
                "topic '{topic}' on the remote is demoted and its own links have not shipped everything yet (its tail, for the primary that replaced it): wait until their lag is 0 there (narad topic children), then attach"
            ),
        );
    }
    if mirrors && role == "primary" {
        return run.fail(
            "no_remote_children",
            "loop_detected",
            format!(
                "topic '{topic}' on the remote is a primary that mirrors to remotes of its own: this link would make it a mirror (the loop rule); demote it there first (narad topic demote), or attach this link before its own"
            ),
        );
    }
    if mirrors {
        run.pass(
            "no_remote_children",
            format!(
                "'{topic}' is {} with links of its own: they stand by while it is a mirror and forward what it holds once it is promoted",
                if role == "demoted" { "demoted" } else { "a mirror" }
            ),
        );
    } else {
        run.pass("no_remote_children", format!("'{topic}' mirrors nowhere"));
    }
    // 6. the same schema, or the target refuses records the parent took
    if let Some(want) = target.schema {
        let reply = match client
            .request(Method::GET, &format!("v1/topics/{topic}/schema"), None)
            .await
        {
            Ok(r) => r,
            Err(e) => return run.fail("schema", e.state(), e.to_string()),
        };
        if reply.status != StatusCode::OK {
            return run.fail(
                "schema",
                state_of(reply.status),
                format!(
                    "reading the schema of '{topic}' on the remote: {}",
                    answered(&reply)
                ),
            );
        }
        let theirs = serde_json::from_slice::<serde_json::Value>(&reply.body)
            .ok()
            .and_then(|v| {
                v["versions"]
                    .as_array()?
                    .last()
                    .map(|l| l["schema"].clone())
            });
        if theirs.as_ref() != want {
            return run.fail(
                "schema",
                "rejected_record",
                format!(
                    "topic '{topic}' on the remote has {} JSON Schema than the mirrored topic: give it the same one",
                    if theirs.is_some() { "another" } else { "no" }
                ),
            );
        }
        run.pass("schema", format!("'{topic}' has the same JSON Schema"));
    }
    // 7. the credential may produce to it (an empty batch is refused for its emptiness only
    //    when the caller may produce: nothing is written)
    let reply = match client
        .request(
            Method::POST,
            &format!("v1/topics/{topic}/produce/batch"),
            Some(bytes::Bytes::from_static(b"{\"messages\":[]}")),
        )
        .await
    {
        Ok(r) => r,
        Err(e) => return run.fail("produce", e.state(), e.to_string()),
    };
    match (reply.status.as_u16(), code(&reply).as_deref()) {
        (400, Some("invalid_batch")) => {
            run.pass("produce", format!("the user may produce to '{topic}'"));
        }
        _ => {
            return run.fail(
                "produce",
                state_of(reply.status),
                format!("producing to '{topic}' on the remote: {}", answered(&reply)),
            );
        }
    }
    // 8. the target becomes (or already is) this link's mirror: it refuses every other
    //    producer, and a link of an older epoch
    if let Some(m) = target.mirror {
        let body = serde_json::json!({
            "source_cluster": format!("{:016x}", m.cluster),
            "source_topic": format!("{:016x}", m.topic),
            "epoch": m.epoch,
            "dry_run": m.dry,
        });
        let reply = match client
            .request(
                Method::POST,
                &format!("v1/topics/{topic}/mirror"),
                Some(bytes::Bytes::from(body.to_string())),
            )
            .await
        {
            Ok(r) => r,
            Err(e) => return run.fail("mirror", e.state(), e.to_string()),
        };
        match (reply.status.as_u16(), code(&reply).as_deref()) {
            (200, _) => run.pass(
                "mirror",
                format!(
                    "'{topic}' {} the mirror of this topic at epoch {}",
                    if m.dry { "may become" } else { "is" },
                    m.epoch
                ),
            ),
            (409, Some("fenced")) => {
                return run.fail(
                    "mirror",
                    "fenced",
                    format!(
                        "'{topic}' on the remote was promoted past this topic's epoch {}: this topic is the old primary (make it the remote's mirror instead)",
                        m.epoch
                    ),
                );
            }
            (409, Some("not_your_mirror")) => {
                return run.fail(
                    "mirror",
                    "not_a_mirror",
                    format!("'{topic}' on the remote mirrors another topic: promote it there first, or mirror to another topic"),
                );
            }
            (409, Some("role_conflict")) => {
                let children = serde_json::from_slice::<serde_json::Value>(&reply.body)
                    .ok()
                    .and_then(|v| {
                        v["error"]
                            .as_str()
                            .map(|e| e.contains("has fan-out children"))
                    })
                    .unwrap_or(false);
                return run.fail(
                    "mirror",
                    "not_a_mirror",
                    if children {
                        format!("'{topic}' on the remote has fan-out children: detach or delete them there first (a mirror has none; its promote attaches this topic's children)")
                    } else {
                        format!("'{topic}' on the remote is a primary that took part in a failover, or a fan-out child: demote it there first, or mirror to another topic")
                    },
                );
            }
            (409, Some("loop_detected")) => {
                return run.fail(
                    "mirror",
                    "loop_detected",
                    format!("'{topic}' on the remote is on this cluster"),
                );
            }
            _ => {
                return run.fail(
                    "mirror",
                    state_of(reply.status),
                    format!(
                        "making '{topic}' on the remote a mirror (it needs replicate on it): {}",
                        answered(&reply)
                    ),
                );
            }
        }
    }
    CheckReport {
        ok: true,
        state: "running",
        checks: run.checks,
        topic_id: run.topic_id,
    }
}
