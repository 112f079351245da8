//! `narad remote`: remote clusters and the links to them.

use super::*;

/// A remote's password: given, or asked for on a terminal (not shown), or the first line of
/// stdin.
fn remote_password(given: Option<String>) -> Result<String, BoxError> {
    if let Some(p) = given {
        return Ok(p);
    }
    let p = if std::io::stdin().is_terminal() {
        read_hidden("the remote user's password: ")?
    } else {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line)?;
        line.trim_end_matches(['\r', '\n']).to_owned()
    };
    if p.is_empty() {
        return Err("no password given (--remote-password, NARAD_REMOTE_PASSWORD or stdin)".into());
    }
    Ok(p)
}

fn read_ca(path: &std::path::Path) -> Result<String, BoxError> {
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()).into())
}

pub(super) async fn run(c: &Client, cmd: RemoteCmd, output: Output) -> Result<(), BoxError> {
    let path = |name: &str| format!("/v1/remotes/{}", enc(name));
    match cmd {
        RemoteCmd::Add {
            name,
            url,
            remote_user,
            remote_password: pw,
            remote_ca,
            carry_users,
        } => {
            let ca = remote_ca.as_deref().map(read_ca).transpose()?;
            let body = serde_json::json!({
                "name": name,
                "url": url,
                "username": remote_user,
                "password": remote_password(pw)?,
                "ca_pem": ca,
                "carry_users": carry_users,
            });
            print_reply(c.post_json("/v1/remotes", &body).await?, output)?;
        }
        RemoteCmd::Ls => {
            let Reply::Json(j) = c.get("/v1/remotes").await? else {
                return Ok(());
            };
            if output == Output::Json {
                return j.print_pretty();
            }
            let v: Value = j.parse()?;
            let mut rows = Vec::new();
            for r in v["remotes"].as_array().into_iter().flatten() {
                let s = |k: &str| r[k].as_str().unwrap_or("").to_owned();
                rows.push(vec![
                    s("name"),
                    s("url"),
                    s("username"),
                    if r["ca_sha256"].is_string() {
                        "own".into()
                    } else {
                        "system".into()
                    },
                    r["credential"]["sealed_with"]
                        .as_str()
                        .unwrap_or("")
                        .to_owned(),
                    match (&r["carry_users"], r["users_carry"]["state"].as_str()) {
                        (Value::Bool(true), Some(state)) => state.to_owned(),
                        (Value::Bool(true), None) => "yes".into(),
                        _ => "-".into(),
                    },
                ]);
            }
            outln!(
                "{}",
                table(
                    &["NAME", "URL", "USER", "CA", "SEALED WITH", "CARRIES USERS"],
                    &rows
                )
            );
        }
        RemoteCmd::Show { name } => print_reply(c.get(&path(&name)).await?, output)?,
        RemoteCmd::Edit {
            name,
            url,
            remote_user,
            remote_password: pw,
            password_stdin,
            remote_ca,
            system_roots,
            carry_users,
        } => {
            let mut body = serde_json::Map::new();
            if let Some(c) = carry_users {
                body.insert("carry_users".into(), c.into());
            }
            let rebinds =
                url.is_some() || remote_user.is_some() || remote_ca.is_some() || system_roots;
            if let Some(u) = url {
                body.insert("url".into(), u.into());
            }
            if let Some(u) = remote_user {
                body.insert("username".into(), u.into());
            }
            if let Some(p) = &remote_ca {
                body.insert("ca_pem".into(), read_ca(p)?.into());
            } else if system_roots {
                body.insert("ca_pem".into(), Value::Null);
            }
            if pw.is_some() || password_stdin || rebinds {
                body.insert("password".into(), remote_password(pw)?.into());
            }
            if body.is_empty() {
                return Err("nothing to change: give --url, --remote-user, --remote-ca, --system-roots, --carry-users or a password".into());
            }
            print_reply(c.patch_json(&path(&name), &body).await?, output)?;
        }
        RemoteCmd::Test {
            name,
            topic,
            parent,
        } => {
            let mut p = format!("{}/test", path(&name));
            if let Some(t) = &topic {
                p.push_str(&format!("?topic={}", enc(t)));
            }
            if let Some(parent) = &parent {
                p.push_str(&format!("&parent={}", enc(parent)));
            }
            let Reply::Json(j) = c.post_json(&p, &serde_json::json!({})).await? else {
                return Err("the broker answered the test with no body".into());
            };
            let v: Value = j.parse()?;
            if output == Output::Json {
                j.print_pretty()?;
            } else {
                let mut rows = Vec::new();
                for ch in v["checks"].as_array().into_iter().flatten() {
                    rows.push(vec![
                        ch["name"].as_str().unwrap_or("").to_owned(),
                        if ch["ok"] == Value::Bool(true) {
                            "yes".into()
                        } else {
                            "NO".into()
                        },
                        ch["detail"].as_str().unwrap_or("").to_owned(),
                    ]);
                }
                outln!("{}", table(&["CHECK", "OK", "DETAIL"], &rows));
            }
            if v["ok"] != Value::Bool(true) {
                return Err(format!(
                    "remote '{name}' failed its checks (state {})",
                    v["state"].as_str().unwrap_or("?")
                )
                .into());
            }
        }
        RemoteCmd::Rm { name } => {
            c.delete(&path(&name)).await?;
            done(
                output,
                format!("deleted remote {name}"),
                serde_json::json!({"deleted": name}),
            )?;
        }
    }
    Ok(())
}
