# One instance, one data volume and one attachment per node id. The volume is a resource of
# its own: replacing an instance (a new AMI, a new instance type, `terraform apply
# -replace`) detaches the volume, and the new instance gets the same volume, the same
# private IP, the same node id, and so the same Raft state and partitions.
#
# Terraform cannot make prevent_destroy depend on a variable, so nothing here refuses a
# destroy of a volume: removing an id from node_ids (or `terraform destroy`) deletes that
# node's data after a final snapshot (data_volume_final_snapshot). See README.

resource "aws_ebs_volume" "data" {
  for_each = local.nodes

  availability_zone = each.value.az
  type              = "gp3"
  size              = var.data_volume_size_gb
  iops              = var.data_volume_iops
  throughput        = var.data_volume_throughput
  encrypted         = true
  kms_key_id        = aws_kms_key.cluster.arn
  final_snapshot    = var.data_volume_final_snapshot

  tags = merge(local.common_tags, {
    Name           = "${var.name}-narad-${each.key}-data"
    "narad:node"   = each.key
    "narad:volume" = "data"
  })
}

resource "aws_instance" "node" {
  for_each = local.nodes

  ami                    = local.ami_id
  instance_type          = var.instance_type
  subnet_id              = each.value.subnet_id
  private_ip             = each.value.private_ip
  vpc_security_group_ids = [aws_security_group.nodes.id]
  iam_instance_profile   = aws_iam_instance_profile.node.name
  key_name               = var.key_name
  ebs_optimized          = true
  monitoring             = true

  # gzip: cloud-init unpacks it; the plain text is ~15 KiB, close to EC2's 16 KiB limit
  user_data_base64            = base64gzip(module.node_config[each.key].user_data)
  user_data_replace_on_change = false

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
    instance_metadata_tags      = "disabled"
  }

  root_block_device {
    volume_type           = "gp3"
    volume_size           = var.root_volume_size_gb
    encrypted             = true
    kms_key_id            = aws_kms_key.cluster.arn
    delete_on_termination = true
  }

  tags = merge(local.common_tags, {
    Name         = "${var.name}-narad-${each.key}"
    "narad:node" = each.key
  })

  volume_tags = merge(local.common_tags, {
    Name         = "${var.name}-narad-${each.key}-root"
    "narad:node" = each.key
  })

  lifecycle {
    # A newer default AMI, or a new artifact in the user data, must not replace every node
    # at once: upgrades go one node at a time (`terraform apply -replace=...`, see
    # docs/deploy-aws.md). A replaced node is created from the current user data.
    ignore_changes = [ami, user_data_base64]

    precondition {
      condition     = length(base64gzip(module.node_config[each.key].user_data)) < 16384
      error_message = "The rendered user data, gzipped and base64-encoded, is over EC2's 16 KiB limit."
    }

    precondition {
      condition     = var.host_number_offset + each.value.id < pow(2, 32 - tonumber(split("/", data.aws_subnet.node[each.value.subnet_id].cidr_block)[1])) - 1
      error_message = "host_number_offset + node id does not fit in the node's subnet (the last address is reserved by AWS)."
    }
  }
}

resource "aws_volume_attachment" "data" {
  for_each = local.nodes

  device_name = var.data_volume_device_name
  volume_id   = aws_ebs_volume.data[each.key].id
  instance_id = aws_instance.node[each.key].id

  # stop the instance (narad gets SIGTERM and shuts down cleanly) before the volume is
  # detached for a replacement
  stop_instance_before_detaching = true
}

resource "aws_route53_record" "node" {
  for_each = var.route53_zone_id == null ? {} : local.nodes

  zone_id = var.route53_zone_id
  name    = each.value.dns_name
  type    = "A"
  ttl     = 60
  records = [aws_instance.node[each.key].private_ip]
}
