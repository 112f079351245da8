//! Every operation one node calls on another, numbered and named once.
//!
//! A number is never reused for another meaning (a node of another build may send it).
//! The name is the `op` label of the endpoint's metrics. Ranges:
//!
//! ```text
//!     1        the transport itself (ping)
//!    10..99    the metastore: Raft, read index, proposals, membership
//!   100..119   the data plane: produce, consume, settle, replay, fan-out, mirrors
//!   120..139   partition moves and the acknowledged-end witnesses
//! ```
//!
//! Ops from [`DATA_OPS`] up are served by the node's data service (set with
//! `Metastore::serve_data`), the rest by the metastore.

use super::Op;

/// Answered by the transport itself: is the peer there and admitting us?
pub const PING: Op = Op(1);

pub const RAFT_APPEND: Op = Op(10);
pub const RAFT_VOTE: Op = Op(11);
pub const RAFT_SNAPSHOT: Op = Op(12);
/// "Would you vote for me?", asked without raising any term.
pub const PRE_VOTE: Op = Op(13);
pub const READ_INDEX: Op = Op(20);
pub const PROPOSE: Op = Op(21);
pub const JOIN: Op = Op(23);
pub const REMOVE: Op = Op(24);

/// Ops from this number up are the data plane's.
pub const DATA_OPS: u16 = 100;

pub const PRODUCE: Op = Op(100);
pub const CONSUME: Op = Op(101);
pub const SETTLE: Op = Op(102);
pub const GIVE_BACK: Op = Op(103);
pub const REPLAY: Op = Op(104);
pub const CANCEL_WAIT: Op = Op(105);
pub const STATS: Op = Op(106);
pub const FANOUT_APPEND: Op = Op(107);
pub const CHILDREN: Op = Op(108);
pub const WAIT_TOKEN: Op = Op(109);
pub const DELIVER: Op = Op(110);
/// A mirror's source progress, for the partitions the called member owns.
pub const MIRROR_PROGRESS: Op = Op(111);
/// A mirror's report of its source, for the partitions the called member owns (settled
/// and dropped, for a promote, with `last`).
pub const MIRROR_REPORT: Op = Op(112);

pub const MOVE_LIST: Op = Op(120);
pub const MOVE_READ: Op = Op(121);
pub const MOVE_FREEZE: Op = Op(122);
pub const MOVE_PROGRESS: Op = Op(123);
pub const MOVE_REBALANCE: Op = Op(124);
pub const SEEN_ENDS: Op = Op(125);
/// "Does member N answer you?": the asked member probes N afresh and answers `true` or
/// `false` (forget asks every live member before declaring N lost).
pub const MEMBER_PROBE: Op = Op(126);
/// Purge the queue of a topic's partitions this member owns (SQS's PurgeQueue).
pub const PURGE: Op = Op(113);
/// An owner's report of its partitions' durable log ends, `[(topic id, partition, end)]`,
/// kept by the member it is sent to.
pub const WITNESS: Op = Op(127);

/// Every op with its name.
pub const ALL: &[(Op, &str)] = &[
    (PING, "ping"),
    (RAFT_APPEND, "raft_append"),
    (RAFT_VOTE, "raft_vote"),
    (RAFT_SNAPSHOT, "raft_snapshot"),
    (PRE_VOTE, "pre_vote"),
    (READ_INDEX, "read_index"),
    (PROPOSE, "propose"),
    (JOIN, "join"),
    (REMOVE, "remove"),
    (PRODUCE, "produce"),
    (CONSUME, "consume"),
    (SETTLE, "settle"),
    (GIVE_BACK, "give_back"),
    (REPLAY, "replay"),
    (CANCEL_WAIT, "cancel_wait"),
    (STATS, "stats"),
    (FANOUT_APPEND, "fanout_append"),
    (CHILDREN, "children"),
    (WAIT_TOKEN, "wait_token"),
    (DELIVER, "deliver"),
    (MIRROR_PROGRESS, "mirror_progress"),
    (MIRROR_REPORT, "mirror_report"),
    (PURGE, "purge"),
    (MOVE_LIST, "move_list"),
    (MOVE_READ, "move_read"),
    (MOVE_FREEZE, "move_freeze"),
    (MOVE_PROGRESS, "move_progress"),
    (MOVE_REBALANCE, "move_rebalance"),
    (SEEN_ENDS, "seen_ends"),
    (MEMBER_PROBE, "member_probe"),
    (WITNESS, "witness"),
];

/// The name of `op`, `None` for a number no op has.
pub fn name(op: Op) -> Option<&'static str> {
    ALL.iter().find(|(o, _)| *o == op).map(|(_, n)| *n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_op_has_one_number_and_one_name() {
        let mut numbers: Vec<u16> = ALL.iter().map(|(o, _)| o.0).collect();
        let mut names: Vec<&str> = ALL.iter().map(|(_, n)| *n).collect();
        numbers.sort_unstable();
        names.sort_unstable();
        numbers.dedup();
        names.dedup();
        assert_eq!(numbers.len(), ALL.len(), "a number given twice");
        assert_eq!(names.len(), ALL.len(), "a name given twice");
        assert_eq!(name(WITNESS), Some("witness"));
        assert_eq!(name(Op(9999)), None);
        // the metastore's ops and the data plane's do not mix
        assert!(ALL.iter().all(|(o, n)| (o.0 >= DATA_OPS)
            == !matches!(
                *n,
                "ping"
                    | "raft_append"
                    | "raft_vote"
                    | "raft_snapshot"
                    | "pre_vote"
                    | "read_index"
                    | "propose"
                    | "join"
                    | "remove"
            )));
    }
}
