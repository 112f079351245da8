//! A topic's role between clusters, and its epoch.
//!
//! A topic is the **primary** of its records (it takes produces and leases), a **mirror** of
//! a topic on another cluster (it takes records only from that topic's link, at that link's
//! epoch, and serves replay but no queue), or **demoted**: a primary that learned a mirror of
//! it was promoted past it, or was demoted on purpose; it takes neither produces nor leases,
//! and its links ship what they had not shipped yet (its tail) to the new primary.
//!
//! The epoch only grows: a mirror takes its source's epoch, and a promotion makes it one
//! more, so a link from the old primary (carrying the old epoch) is refused (`fenced`) by the
//! new one. [`decide_mirror`] and [`decide_link`] are the rules, pure, for the API and tests.

use serde::{Deserialize, Serialize};

/// The largest epoch a topic takes (a request naming a larger one is refused): far more
/// promotions than will ever happen, and room for one more.
pub const MAX_EPOCH: u64 = 1 << 53;

/// A topic on another cluster, by the ids its records' origins name.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(deny_unknown_fields)]
pub struct Source {
    /// The other cluster's id.
    pub cluster: u64,
    /// The topic's incarnation id there.
    pub topic: u64,
}

/// What a topic is between clusters (see the module).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "role", rename_all = "snake_case", deny_unknown_fields)]
pub enum TopicRole {
    Primary {
        epoch: u64,
        /// The source this topic was a mirror of before it was promoted: that source's tail
        /// (records it acknowledged but had not shipped when it learned of the promotion) is
        /// still taken, as late records.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        promoted_from: Option<Source>,
    },
    Mirror {
        epoch: u64,
        of: Source,
    },
    Demoted {
        epoch: u64,
    },
}

impl Default for TopicRole {
    fn default() -> Self {
        Self::Primary {
            epoch: 0,
            promoted_from: None,
        }
    }
}

impl TopicRole {
    pub fn epoch(&self) -> u64 {
        match *self {
            Self::Primary { epoch, .. } | Self::Mirror { epoch, .. } | Self::Demoted { epoch } => {
                epoch
            }
        }
    }

    /// `primary`, `mirror` or `demoted`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Primary { .. } => "primary",
            Self::Mirror { .. } => "mirror",
            Self::Demoted { .. } => "demoted",
        }
    }

    /// The role in words, for error messages and logs.
    pub fn describe(&self) -> String {
        match self {
            Self::Primary { epoch, .. } => format!("the primary (epoch {epoch})"),
            Self::Mirror { epoch, of } => format!(
                "a mirror of topic {:016x} of cluster {:016x} (epoch {epoch})",
                of.topic, of.cluster
            ),
            Self::Demoted { epoch } => format!(
                "demoted (epoch {epoch}): a mirror of it was promoted, or an admin demoted it"
            ),
        }
    }

    pub fn is_primary(&self) -> bool {
        matches!(self, Self::Primary { .. })
    }

    /// For `skip_serializing_if`: a topic that never took part in a failover.
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// Why a link's request or a role change is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoleRefusal {
    /// The topic is at a newer epoch than the sender's: the sender was superseded (its link
    /// is fenced). `role` is the topic's role now.
    Fenced { role: TopicRole },
    /// The topic mirrors another source.
    MirrorOfOther { of: Source },
    /// The topic takes no records from this link (it is a primary that never became its
    /// mirror, or a demoted topic).
    NotAMirror { role: TopicRole },
}

/// The role a topic at `now` takes when `source` (at `epoch`) asks it to become its mirror
/// (a remote child attached or resumed), or why it does not. Unchanged when it is already
/// that mirror at that epoch.
pub fn decide_mirror(now: TopicRole, source: Source, epoch: u64) -> Result<TopicRole, RoleRefusal> {
    let becomes = TopicRole::Mirror { epoch, of: source };
    match now {
        // a newer epoch here: the asker is an old primary (its records come back as a tail)
        _ if now.epoch() > epoch => Err(RoleRefusal::Fenced { role: now }),
        TopicRole::Mirror { of, .. } if of != source => Err(RoleRefusal::MirrorOfOther { of }),
        // a primary that took part in a failover (promoted, or at an epoch past 0) follows
        // another only once demoted: epochs of unrelated sources say nothing of each other,
        // and its old source's tail would be refused
        TopicRole::Primary {
            epoch,
            promoted_from,
        } if epoch > 0 || promoted_from.is_some() => Err(RoleRefusal::NotAMirror { role: now }),
        // a fresh primary, a demoted topic, or this mirror (same or older epoch): it follows
        // the asker
        _ => Ok(becomes),
    }
}

/// How a topic at `now` takes records a link sends from `source` at `epoch` (`tail`: the
/// sender is no longer a primary and ships what it had not shipped yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkIntake {
    /// This topic mirrors the sender at its epoch.
    Mirrored,
    /// The sender is the primary this topic was promoted from, shipping its tail.
    Late,
}

/// Whether a topic at `now` takes a link's records (see [`LinkIntake`]), or why not.
pub fn decide_link(
    now: TopicRole,
    source: Source,
    epoch: u64,
    tail: bool,
) -> Result<LinkIntake, RoleRefusal> {
    match now {
        TopicRole::Mirror { epoch: e, of } if of == source => match epoch.cmp(&e) {
            std::cmp::Ordering::Equal => Ok(LinkIntake::Mirrored),
            std::cmp::Ordering::Less => Err(RoleRefusal::Fenced { role: now }),
            // the source moved on (promoted again after a failback) without asking this
            // mirror to follow: its checks at resume do that
            std::cmp::Ordering::Greater => Err(RoleRefusal::NotAMirror { role: now }),
        },
        TopicRole::Mirror { of, .. } => Err(RoleRefusal::MirrorOfOther { of }),
        TopicRole::Primary {
            epoch: e,
            promoted_from,
        } => {
            // (a tail comes from a topic that takes no produces any more: whatever epoch it
            // carries, its records were written while it was the primary this one replaced)
            if tail && epoch <= e && promoted_from == Some(source) {
                Ok(LinkIntake::Late)
            } else if epoch < e {
                Err(RoleRefusal::Fenced { role: now })
            } else {
                Err(RoleRefusal::NotAMirror { role: now })
            }
        }
        TopicRole::Demoted { epoch: e } if epoch < e => Err(RoleRefusal::Fenced { role: now }),
        TopicRole::Demoted { .. } => Err(RoleRefusal::NotAMirror { role: now }),
    }
}

/// The role a mirror takes when promoted, or why not. A primary promoted from that same
/// source is left as it is (a promote is idempotent).
pub fn decide_promote(now: TopicRole) -> Result<TopicRole, TopicRole> {
    match now {
        TopicRole::Mirror { epoch, .. } if epoch >= MAX_EPOCH => Err(now),
        TopicRole::Mirror { epoch, of } => Ok(TopicRole::Primary {
            epoch: epoch + 1,
            promoted_from: Some(of),
        }),
        TopicRole::Primary { .. } => Ok(now),
        // a demoted topic becomes a primary only as the mirror of the new one first (so it
        // holds what that one holds); promoting it alone would make two primaries
        TopicRole::Demoted { .. } => Err(now),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Source = Source {
        cluster: 1,
        topic: 10,
    };
    const B: Source = Source {
        cluster: 2,
        topic: 20,
    };

    #[test]
    fn a_failover_and_a_failback_move_the_epoch_and_fence_the_old_primary() {
        // B's topic becomes A's mirror, takes A's link, and refuses plain produces (elsewhere)
        let b = decide_mirror(TopicRole::default(), A, 0).unwrap();
        assert_eq!(decide_link(b, A, 0, false), Ok(LinkIntake::Mirrored));
        // promoted: A's link is fenced, A's tail is taken late
        let b = decide_promote(b).unwrap();
        assert_eq!(b.epoch(), 1);
        assert_eq!(decide_promote(b), Ok(b), "a promote is idempotent");
        assert!(matches!(
            decide_link(b, A, 0, false),
            Err(RoleRefusal::Fenced { .. })
        ));
        assert_eq!(decide_link(b, A, 0, true), Ok(LinkIntake::Late));
        assert!(
            decide_link(b, B, 0, true).is_err(),
            "a tail from a source it was not promoted from"
        );
        // A cannot make the new primary its mirror again at its old epoch
        assert!(matches!(
            decide_mirror(b, A, 0),
            Err(RoleRefusal::Fenced { .. })
        ));
        // A demoted; B attaches to it: A follows B at B's epoch, and promoted goes to 2
        let a = TopicRole::Demoted { epoch: 0 };
        assert!(
            decide_promote(a).is_err(),
            "a demoted topic is not promoted alone"
        );
        let a = decide_mirror(a, B, 1).unwrap();
        assert_eq!(decide_link(a, B, 1, false), Ok(LinkIntake::Mirrored));
        let a = decide_promote(a).unwrap();
        assert_eq!(a.epoch(), 2);
        // B's link (epoch 1) is now fenced by A
        assert!(matches!(
            decide_link(a, B, 1, false),
            Err(RoleRefusal::Fenced { .. })
        ));
    }

    #[test]
    fn a_mirror_takes_one_source_and_a_primary_takes_no_link_it_did_not_agree_to() {
        let m = decide_mirror(TopicRole::default(), A, 3).unwrap();
        assert_eq!(decide_mirror(m, A, 3), Ok(m), "asked again: unchanged");
        assert_eq!(
            decide_mirror(m, B, 5),
            Err(RoleRefusal::MirrorOfOther { of: A })
        );
        assert_eq!(
            decide_link(m, B, 3, false),
            Err(RoleRefusal::MirrorOfOther { of: A })
        );
        assert!(matches!(
            decide_link(m, A, 4, false),
            Err(RoleRefusal::NotAMirror { .. })
        ));
        assert!(matches!(
            decide_link(TopicRole::default(), A, 0, false),
            Err(RoleRefusal::NotAMirror { .. })
        ));
        assert!(matches!(
            decide_link(TopicRole::Demoted { epoch: 0 }, A, 0, false),
            Err(RoleRefusal::NotAMirror { .. })
        ));
        // a promoted primary does not follow an unrelated source at any epoch
        let promoted = decide_promote(decide_mirror(TopicRole::default(), A, 0).unwrap()).unwrap();
        assert!(matches!(
            decide_mirror(promoted, B, 9),
            Err(RoleRefusal::NotAMirror { .. })
        ));
        // nor is a mirror at the last epoch promoted past it
        assert!(
            decide_promote(TopicRole::Mirror {
                epoch: MAX_EPOCH,
                of: A
            })
            .is_err()
        );
    }

    #[test]
    fn the_default_role_is_not_written() {
        #[derive(Serialize, Deserialize)]
        struct T {
            #[serde(default, skip_serializing_if = "TopicRole::is_default")]
            role: TopicRole,
        }
        let s = serde_json::to_string(&T {
            role: TopicRole::default(),
        })
        .unwrap();
        assert_eq!(s, "{}");
        for m in [
            TopicRole::Mirror { epoch: 2, of: A },
            TopicRole::Primary {
                epoch: 5,
                promoted_from: None,
            },
            TopicRole::Primary {
                epoch: 5,
                promoted_from: Some(B),
            },
            TopicRole::Demoted { epoch: 4 },
        ] {
            let s = serde_json::to_string(&T { role: m }).unwrap();
            let back: T = serde_json::from_str(&s).unwrap_or_else(|e| panic!("{s}: {e}"));
            assert_eq!(back.role, m);
        }
        assert!(
            serde_json::from_str::<T>(r#"{"role":{"role":"primary","epoch":0,"x":1}}"#).is_err()
        );
    }
}
