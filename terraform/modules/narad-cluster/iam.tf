# The nodes' role: the archive prefix, the secrets, and nothing else (plus Session Manager's
# channel when enable_session_manager). Narad's S3 client (object_store, AmazonS3Builder
# from the environment) takes the instance profile's credentials from IMDS.

data "aws_iam_policy_document" "assume" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "node" {
  name               = "${var.name}-narad-node"
  description        = "Narad cluster ${var.name}: broker nodes"
  assume_role_policy = data.aws_iam_policy_document.assume.json
  tags               = local.common_tags
}

resource "aws_iam_instance_profile" "node" {
  name = "${var.name}-narad-node"
  role = aws_iam_role.node.name
  tags = local.common_tags
}

locals {
  # s3://<bucket>/<prefix>/... only. Narad writes Parquet objects, manifests, _topic.json
  # and the catalog snapshot under the prefix, reads them back, deletes what archive
  # retention and new incarnations retire, and lists under the prefix (restore, rebuild).
  archive_objects_arn = "${module.archive.bucket_arn}/${module.archive.prefix}/*"

  artifact_s3 = startswith(var.artifact_url, "s3://") ? {
    bucket = split("/", trimprefix(var.artifact_url, "s3://"))[0]
    key    = join("/", slice(split("/", trimprefix(var.artifact_url, "s3://")), 1, length(split("/", trimprefix(var.artifact_url, "s3://")))))
  } : null
}

data "aws_iam_policy_document" "node" {
  statement {
    sid = "ArchiveObjectsUnderThePrefix"
    actions = [
      "s3:GetObject",
      "s3:PutObject",
      "s3:DeleteObject",
      # an interrupted multipart upload (objects over 8 MiB) is aborted by the client
      "s3:AbortMultipartUpload",
    ]
    resources = [local.archive_objects_arn]
  }

  statement {
    sid       = "ListTheArchivePrefixOnly"
    actions   = ["s3:ListBucket"]
    resources = [module.archive.bucket_arn]

    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = ["${module.archive.prefix}/*", module.archive.prefix]
    }
  }

  statement {
    sid       = "ArchiveKeyThroughS3"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
    resources = [module.archive.kms_key_arn]

    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["s3.${local.region}.amazonaws.com"]
    }
  }

  statement {
    sid       = "ReadTheClusterSecrets"
    actions   = var.secret_store == "ssm" ? ["ssm:GetParameter"] : ["secretsmanager:GetSecretValue"]
    resources = local.secret_arns
  }

  statement {
    sid       = "DecryptTheSecretsThroughTheirStore"
    actions   = ["kms:Decrypt"]
    resources = [aws_kms_key.cluster.arn]

    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = [var.secret_store == "ssm" ? "ssm.${local.region}.amazonaws.com" : "secretsmanager.${local.region}.amazonaws.com"]
    }
  }

  dynamic "statement" {
    for_each = local.artifact_s3 == null ? [] : [local.artifact_s3]

    content {
      sid       = "DownloadTheArtifact"
      actions   = ["s3:GetObject"]
      resources = ["arn:${local.partition}:s3:::${statement.value.bucket}/${statement.value.key}"]
    }
  }
}

resource "aws_iam_role_policy" "node" {
  name   = "narad-node"
  role   = aws_iam_role.node.id
  policy = data.aws_iam_policy_document.node.json
}

# Session Manager's channel only: no ssm:GetParameter (AmazonSSMManagedInstanceCore would
# add it on every parameter of the account).
data "aws_iam_policy_document" "session_manager" {
  statement {
    #checkov:skip=CKV_AWS_111:These Session Manager actions take no resource ARN (AWS documents Resource "*" for them).
    #checkov:skip=CKV_AWS_356:These Session Manager actions take no resource ARN (AWS documents Resource "*" for them).
    sid = "SessionManagerChannel"
    actions = [
      "ssm:UpdateInstanceInformation",
      "ssmmessages:CreateControlChannel",
      "ssmmessages:CreateDataChannel",
      "ssmmessages:OpenControlChannel",
      "ssmmessages:OpenDataChannel",
    ]
    resources = ["*"]
  }
}

resource "aws_iam_role_policy" "session_manager" {
  count = var.enable_session_manager ? 1 : 0

  name   = "session-manager"
  role   = aws_iam_role.node.id
  policy = data.aws_iam_policy_document.session_manager.json
}
