//! `narad cluster`: members, status, moves, rebalance, forget.

use super::*;

pub(super) async fn run(c: &Client, cmd: ClusterCmd, output: Output) -> Result<(), BoxError> {
    if let ClusterCmd::Remove { node_id } = cmd {
        return print_reply(
            c.delete(&format!("/v1/cluster/members/{node_id}")).await?,
            output,
        );
    }
    match &cmd {
        ClusterCmd::Move {
            topic,
            partition,
            to,
        } => {
            let body = serde_json::json!({"topic": topic, "partition": partition, "to": to});
            print_reply(c.post_json("/v1/cluster/moves", &body).await?, output)?;
            if output == Output::Table {
                outln!(
                    "partition {partition} of {topic} moves to node {to} and stays there: the planner leaves it (`narad cluster unpin {topic} {partition}` gives it back)"
                );
            }
            return Ok(());
        }
        ClusterCmd::Unpin { topic, partition } => {
            c.delete(&format!("/v1/cluster/moves/{}/{partition}/pin", enc(topic)))
                .await?;
            return done(
                output,
                format!("partition {partition} of {topic} is the planner's to place again"),
                serde_json::json!({"topic": topic, "partition": partition, "pinned": false}),
            );
        }
        ClusterCmd::MoveCancel { topic, partition } => {
            return print_reply(
                c.delete(&format!("/v1/cluster/moves/{}/{partition}", enc(topic)))
                    .await?,
                output,
            );
        }
        ClusterCmd::Forget { node_id } => {
            return print_reply(
                c.post_json(
                    &format!("/v1/cluster/members/{node_id}/forget"),
                    &serde_json::json!({}),
                )
                .await?,
                output,
            );
        }
        ClusterCmd::Rebalance => {
            return print_reply(
                c.post_json("/v1/cluster/rebalance", &serde_json::json!({}))
                    .await?,
                output,
            );
        }
        ClusterCmd::Decommission { node_id, cancel } => {
            let path = format!("/v1/cluster/members/{node_id}/decommission");
            return print_reply(
                if *cancel {
                    c.delete(&path).await?
                } else {
                    c.post_json(&path, &serde_json::json!({})).await?
                },
                output,
            );
        }
        ClusterCmd::Moves => {
            let Reply::Json(j) = c.get("/v1/cluster/moves").await? else {
                return Err("the broker answered /v1/cluster/moves with no body".into());
            };
            if output == Output::Json {
                return j.print_pretty();
            }
            let v: serde_json::Value = j.parse()?;
            let rows: Vec<Vec<String>> = v["moves"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|m| {
                    vec![
                        m["topic"].as_str().unwrap_or("-").to_owned(),
                        scalar_text(&m["partition"]),
                        scalar_text(&m["from"]),
                        scalar_text(&m["to"]),
                        m["phase"].as_str().unwrap_or("waiting").to_owned(),
                        m["bytes_copied"].as_u64().unwrap_or(0).to_string(),
                        m["reason"].as_str().unwrap_or("-").to_owned(),
                    ]
                })
                .collect();
            let head = ["TOPIC", "PART", "FROM", "TO", "PHASE", "BYTES", "REASON"];
            outln!("{}", table(&head, &rows));
            let pinned: Vec<Vec<String>> = v["pinned"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| {
                    vec![
                        p["topic"].as_str().unwrap_or("-").to_owned(),
                        scalar_text(&p["partition"]),
                        scalar_text(&p["owner"]),
                    ]
                })
                .collect();
            if !pinned.is_empty() {
                outln!();
                outln!("placed by hand (the planner leaves them where they are):");
                outln!("{}", table(&["PINNED", "PART", "OWNER"], &pinned));
            }
            return Ok(());
        }
        _ => {}
    }
    if let ClusterCmd::ReencryptRemotes = cmd {
        return print_reply(
            c.post_json("/v1/cluster/reencrypt-remotes", &serde_json::json!({}))
                .await?,
            output,
        );
    }
    let Reply::Json(j) = c.get("/v1/cluster").await? else {
        return Err("the broker answered /v1/cluster with no body".into());
    };
    if output == Output::Json {
        return j.print_pretty();
    }
    let s: serde_json::Value = j.parse()?;
    let num = |v: &serde_json::Value| v.as_u64().map_or("-".to_owned(), |n| n.to_string());
    match cmd {
        ClusterCmd::Status => {
            if s["single_node"].as_bool() == Some(true) {
                outln!("single node (no cluster_members configured)");
                return Ok(());
            }
            outln!("node        {}", num(&s["node_id"]));
            outln!("state       {}", s["state"].as_str().unwrap_or("-"));
            outln!("leader      {}", num(&s["leader"]));
            outln!("term        {}", num(&s["term"]));
            outln!("ready       {}", s["ready"].as_bool().unwrap_or(false));
            outln!("applied     {}", num(&s["last_applied"]));
            outln!("log         {}", num(&s["last_log"]));
        }
        ClusterCmd::Remove { .. }
        | ClusterCmd::ReencryptRemotes
        | ClusterCmd::Move { .. }
        | ClusterCmd::Moves
        | ClusterCmd::Rebalance
        | ClusterCmd::Forget { .. }
        | ClusterCmd::Decommission { .. }
        | ClusterCmd::MoveCancel { .. }
        | ClusterCmd::Unpin { .. } => unreachable!("handled above"),
        ClusterCmd::Members => {
            let rows: Vec<Vec<String>> = s["members"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|m| {
                    vec![
                        num(&m["node_id"]),
                        m["rpc_addr"].as_str().unwrap_or("-").to_owned(),
                        m["voter"].as_bool().unwrap_or(false).to_string(),
                        num(&m["partitions"]),
                        m["draining"].as_bool().unwrap_or(false).to_string(),
                        num(&m["matched_index"]),
                    ]
                })
                .collect();
            outln!(
                "{}",
                table(
                    &[
                        "NODE",
                        "RPC ADDRESS",
                        "VOTER",
                        "PARTITIONS",
                        "DRAINING",
                        "MATCHED"
                    ],
                    &rows
                )
            );
        }
    }
    Ok(())
}
