# One key for what is the cluster's own: its data and root volumes and its secrets. The
# archive bucket has its own key (narad-archive-bucket).
data "aws_iam_policy_document" "cluster_key" {
  #checkov:skip=CKV_AWS_111:A key policy's "*" resource is the key itself; this is AWS's default key policy (the account administers the key through IAM), written out.
  #checkov:skip=CKV_AWS_356:A key policy's "*" resource is the key itself; this is AWS's default key policy (the account administers the key through IAM), written out.
  #checkov:skip=CKV_AWS_109:A key policy's "*" resource is the key itself; this is AWS's default key policy (the account administers the key through IAM), written out.
  # The account administers and uses the key through IAM (the default key policy, written
  # out). The nodes' role may decrypt with it only through SSM or Secrets Manager (iam.tf);
  # EC2 uses it for the volumes through grants made for the caller that creates them.
  statement {
    sid       = "AccountAdministersTheKeyThroughIAM"
    actions   = ["kms:*"]
    resources = ["*"]

    principals {
      type        = "AWS"
      identifiers = ["arn:${local.partition}:iam::${local.account_id}:root"]
    }
  }
}

resource "aws_kms_key" "cluster" {
  description             = "Narad cluster ${var.name}: EBS volumes and secrets"
  enable_key_rotation     = true
  deletion_window_in_days = var.kms_key_deletion_window_days
  policy                  = data.aws_iam_policy_document.cluster_key.json
  tags                    = local.common_tags
}

resource "aws_kms_alias" "cluster" {
  name          = "alias/narad-${var.name}"
  target_key_id = aws_kms_key.cluster.key_id
}
