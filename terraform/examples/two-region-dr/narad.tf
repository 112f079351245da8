# ======================================================================================
# NEEDS THE NARAD TERRAFORM PROVIDER (example.com/narad/narad, built from
# terraform/provider/; no registry: install it as its README says). Everything else in this
# example uses only hashicorp/aws and hashicorp/random. Without the provider, do what this
# file declares with the CLI (README.md, "Without the provider").
#
# Its resources follow Narad's HTTP API (docs/api.md, docs/xregion.md):
#   narad_topic   POST /v1/topics                   name, partitions, retention_ms, ...
#   narad_user    POST /v1/users                    username, password, grant { action, patterns }
#   narad_remote  POST /v1/remotes                  name, url, username, password, ca_pem
#   narad_child   POST /v1/topics/{parent}/children parent, child, remote, remote_topic, from, lanes
#                 (destroy: DELETE .../children/{child}, refused with 409 unshipped while
#                 records are not shipped, unless force_destroy)
# The provider's `password` arguments are sensitive, not write-only: the mirror users'
# passwords are kept (sensitive) in this configuration's state. Keep the state encrypted
# and access-controlled (an S3 backend with SSE-KMS, for instance).
# ======================================================================================

provider "narad" {
  alias    = "primary"
  endpoint = module.primary.http_endpoint
  username = "admin"
  password = var.primary_admin_password
}

provider "narad" {
  alias    = "standby"
  endpoint = module.standby.http_endpoint
  username = "admin"
  password = var.standby_admin_password
}

# --- the topic on both clusters ----------------------------------------------------------

resource "narad_topic" "primary" {
  provider = narad.primary

  name         = var.topic
  partitions   = var.topic_partitions
  retention_ms = var.topic_retention_ms
}

# The target of a remote child must have the parent's JSON Schema (none here; if the
# primary's topic gets one, set schema = narad_topic.primary.schema).
resource "narad_topic" "standby" {
  provider = narad.standby

  name         = var.topic
  partitions   = var.topic_partitions
  retention_ms = var.topic_retention_ms
}

# --- users and remotes, both ways (idle until a child uses them) ----------------------------
# Each cluster has a user for the other, with produce AND replicate on the topic only: never
# an admin (a remote's checks refuse an admin credential: not_admin). Both ways exist from
# the first apply, so a failover or a failback only promotes or demotes the topic (CLI) and
# changes which remote child exists (mirror_direction). Raising mirror_password_version
# draws new passwords; the provider changes them in place on the user and on the remote.

resource "random_password" "to_standby" {
  length  = 40
  special = false

  keepers = {
    version = var.mirror_password_version
  }
}

resource "random_password" "to_primary" {
  length  = 40
  special = false

  keepers = {
    version = var.mirror_password_version
  }
}

resource "narad_user" "mirror_from_primary" {
  provider = narad.standby

  username = "mirror-from-${var.primary.name}"
  password = random_password.to_standby.result

  grant {
    action   = "produce"
    patterns = [narad_topic.standby.name]
  }

  grant {
    action   = "replicate"
    patterns = [narad_topic.standby.name]
  }
}

resource "narad_user" "mirror_from_standby" {
  provider = narad.primary

  username = "mirror-from-${var.standby.name}"
  password = random_password.to_primary.result

  grant {
    action   = "produce"
    patterns = [narad_topic.primary.name]
  }

  grant {
    action   = "replicate"
    patterns = [narad_topic.primary.name]
  }
}

resource "narad_remote" "standby" {
  provider = narad.primary

  name     = "standby"
  url      = module.standby.http_endpoint
  username = narad_user.mirror_from_primary.username
  password = random_password.to_standby.result
  # ca_pem = file("standby-ca.pem")   # only when B's certificate is not from a public CA
}

resource "narad_remote" "primary" {
  provider = narad.standby

  name     = "primary"
  url      = module.primary.http_endpoint
  username = narad_user.mirror_from_standby.username
  password = random_password.to_primary.result
  # ca_pem = file("primary-ca.pem")   # only when A's certificate is not from a public CA
}

# --- the remote child: which way records flow -----------------------------------------------
# At most one of the two exists. The loop rule refuses a link whose target topic ships to a
# remote itself (loop_detected): B->A while A's dr exists, A->B while B's back does. So the
# direction changes through "none": one apply detaches, the next attaches the other way.
# A link from B's topic to a third cluster is allowed (re-protection,
# docs/playbooks/disaster-recovery.md; not part of this example): it stands by while B is a
# mirror and ships once B is promoted. Attach it after dr, or demote B's topic first: the
# loop rule refuses to make a primary that ships onward a mirror (dr attaches beside it
# once B's topic is demoted, as at the end of a failback). Attaching makes the target
# topic the parent's read-only mirror; promoting and demoting it are CLI steps
# (README.md), not resources.

resource "narad_child" "dr" {
  count    = var.mirror_direction == "primary_to_standby" ? 1 : 0
  provider = narad.primary

  parent       = narad_topic.primary.name
  child        = "dr"
  remote       = narad_remote.standby.name
  remote_topic = narad_topic.standby.name
  from         = var.mirror_from
  lanes        = var.mirror_lanes
}

resource "narad_child" "back" {
  count    = var.mirror_direction == "standby_to_primary" ? 1 : 0
  provider = narad.standby

  parent       = narad_topic.standby.name
  child        = "back"
  remote       = narad_remote.primary.name
  remote_topic = narad_topic.primary.name
  # B's own records its consumers have not acked, and every new one (failback.md, step 1);
  # A's records never go back to A. Makes A's (demoted) topic B's mirror.
  from  = "unconsumed"
  lanes = var.mirror_lanes
}
