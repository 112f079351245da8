//! `narad user`: users, passwords and grants.

use super::*;

/// `ACTION:PATTERN[,PATTERN...]` or `admin` as a grant.
fn parse_grant(spec: &str) -> Result<wire::Grant, BoxError> {
    let (action, patterns) = spec.split_once(':').unwrap_or((spec, ""));
    let action = match action {
        "produce" => wire::GrantAction::Produce,
        "consume" => wire::GrantAction::Consume,
        "create" => wire::GrantAction::Create,
        "replicate" => wire::GrantAction::Replicate,
        "admin" => wire::GrantAction::Admin,
        _ => {
            return Err(format!(
                "grant '{spec}': the action must be produce, consume, create, replicate or admin"
            )
            .into());
        }
    };
    let patterns = patterns
        .split(',')
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .collect();
    Ok(wire::Grant { action, patterns })
}

fn grant_text(g: &wire::Grant) -> String {
    let action = match g.action {
        wire::GrantAction::Produce => "produce",
        wire::GrantAction::Consume => "consume",
        wire::GrantAction::Create => "create",
        wire::GrantAction::Replicate => "replicate",
        wire::GrantAction::Admin => "admin",
    };
    if g.patterns.is_empty() {
        action.to_owned()
    } else {
        format!("{action}:{}", g.patterns.join(","))
    }
}

/// A new password: given, or asked for on a terminal (not shown, typed twice), or the
/// first line of stdin.
fn new_password(given: Option<String>) -> Result<String, BoxError> {
    if let Some(p) = given {
        return Ok(p);
    }
    let p = if std::io::stdin().is_terminal() {
        let p = read_hidden("new password: ")?;
        if read_hidden("again: ")? != p {
            return Err("the two passwords differ: nothing was changed".into());
        }
        p
    } else {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line)?;
        line.trim_end_matches(['\r', '\n']).to_owned()
    };
    if p.is_empty() {
        return Err("no password given (--new-password, NARAD_NEW_PASSWORD or stdin)".into());
    }
    Ok(p)
}

pub(super) async fn run(c: &Client, cmd: UserCmd, output: Output) -> Result<(), BoxError> {
    let path = |name: &str| format!("/v1/users/{}", enc(name));
    match cmd {
        UserCmd::Add {
            name,
            grants,
            new_password: pw,
        } => {
            // the grants are checked before a password is asked for
            let grants = grants
                .iter()
                .map(|g| parse_grant(g))
                .collect::<Result<_, _>>()?;
            let body = wire::CreateUser {
                username: name,
                password: new_password(pw)?,
                grants,
            };
            print_reply(c.post_json("/v1/users", &body).await?, output)?;
        }
        UserCmd::Ls => {
            if let Reply::Json(j) = c.get("/v1/users").await? {
                if output == Output::Json {
                    return j.print_pretty();
                }
                let list: wire::UserList = j.parse()?;
                let rows: Vec<Vec<String>> = list
                    .users
                    .iter()
                    .map(|u| {
                        let grants: Vec<String> = u.grants.iter().map(grant_text).collect();
                        vec![
                            u.username.clone(),
                            if u.root { "yes" } else { "" }.to_owned(),
                            grants.join(" "),
                        ]
                    })
                    .collect();
                outln!("{}", table(&["USERNAME", "ROOT", "GRANTS"], &rows));
            }
        }
        UserCmd::Show { name } => print_reply(c.get(&path(&name)).await?, output)?,
        UserCmd::Rm { name } => {
            c.delete(&path(&name)).await?;
            done(
                output,
                format!("deleted user {name}"),
                serde_json::json!({"deleted": name}),
            )?;
        }
        UserCmd::Grant { name, grants } => {
            let body = wire::SetGrants {
                grants: grants
                    .iter()
                    .map(|g| parse_grant(g))
                    .collect::<Result<_, _>>()?,
            };
            print_reply(
                c.put_json(&format!("{}/grants", path(&name)), &body)
                    .await?,
                output,
            )?;
        }
        UserCmd::Passwd {
            name,
            new_password: pw,
            current,
        } => {
            let body = wire::SetPassword {
                new_password: new_password(pw)?,
                current_password: current,
            };
            c.put_json(&format!("{}/password", path(&name)), &body)
                .await?;
            done(
                output,
                format!("password of {name} changed"),
                serde_json::json!({"password_changed": name}),
            )?;
        }
        UserCmd::Key { cmd } => keys(c, cmd, output, &path).await?,
    }
    Ok(())
}

async fn keys(
    c: &Client,
    cmd: KeyCmd,
    output: Output,
    path: &dyn Fn(&str) -> String,
) -> Result<(), BoxError> {
    match cmd {
        KeyCmd::Add { name } => {
            let reply = c
                .post_body(
                    &format!("{}/access-keys", path(&name)),
                    Vec::new(),
                    "application/json",
                )
                .await?;
            if let Reply::Json(j) = &reply
                && output != Output::Json
            {
                let v: serde_json::Value = j.parse()?;
                outln!(
                    "access key id:     {}\nsecret access key: {}\n(the secret is shown only now: keep it where your SDK reads it, e.g. AWS_SECRET_ACCESS_KEY)",
                    v["access_key_id"].as_str().unwrap_or(""),
                    v["secret_access_key"].as_str().unwrap_or("")
                );
                return Ok(());
            }
            print_reply(reply, output)?;
        }
        KeyCmd::Ls { name } => {
            let reply = c.get(&format!("{}/access-keys", path(&name))).await?;
            if let Reply::Json(j) = &reply
                && output != Output::Json
            {
                let v: serde_json::Value = j.parse()?;
                let rows: Vec<Vec<String>> = v["access_keys"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|k| {
                        vec![
                            k["access_key_id"].as_str().unwrap_or("").to_owned(),
                            k["created_at_ms"].to_string(),
                        ]
                    })
                    .collect();
                outln!("{}", table(&["ACCESS KEY ID", "CREATED (ms)"], &rows));
                return Ok(());
            }
            print_reply(reply, output)?;
        }
        KeyCmd::Rm { name, key_id } => {
            c.delete(&format!("{}/access-keys/{}", path(&name), enc(&key_id)))
                .await?;
            done(
                output,
                format!("removed access key {key_id} of {name}"),
                serde_json::json!({"removed": key_id}),
            )?;
        }
    }
    Ok(())
}
