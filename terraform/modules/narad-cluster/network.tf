# Two security groups, rules as separate resources:
#   nodes: HTTP API from the load balancer's group and from the nodes themselves; the QUIC
#          cluster port (UDP) from the nodes' own group only; metrics from metrics_cidrs.
#   lb:    the listener from client_cidrs (the only rule that can reach the world, and only
#          when 0.0.0.0/0 is listed there explicitly).
# With a security group on the network load balancer, the nodes can allow "from the load
# balancer's group" although it preserves the clients' addresses (Narad's login throttling
# counts failures per client address, so they are worth keeping).

resource "aws_security_group" "nodes" {
  name_prefix = "${var.name}-narad-nodes-"
  description = "Narad ${var.name} broker nodes"
  vpc_id      = var.vpc_id
  tags        = merge(local.common_tags, { Name = "${var.name}-narad-nodes" })

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_security_group" "lb" {
  name_prefix = "${var.name}-narad-lb-"
  description = "Narad ${var.name} HTTP API load balancer"
  vpc_id      = var.vpc_id
  tags        = merge(local.common_tags, { Name = "${var.name}-narad-lb" })

  lifecycle {
    create_before_destroy = true
  }
}

# --- nodes: ingress -----------------------------------------------------------------------

resource "aws_vpc_security_group_ingress_rule" "cluster_from_nodes" {
  security_group_id            = aws_security_group.nodes.id
  description                  = "QUIC cluster endpoint (Raft, node-to-node calls) from the nodes only"
  ip_protocol                  = "udp"
  from_port                    = var.cluster_port
  to_port                      = var.cluster_port
  referenced_security_group_id = aws_security_group.nodes.id
}

resource "aws_vpc_security_group_ingress_rule" "http_from_lb" {
  security_group_id            = aws_security_group.nodes.id
  description                  = "HTTP API (and /readyz health checks) from the load balancer"
  ip_protocol                  = "tcp"
  from_port                    = var.http_port
  to_port                      = var.http_port
  referenced_security_group_id = aws_security_group.lb.id
}

resource "aws_vpc_security_group_ingress_rule" "http_from_nodes" {
  security_group_id            = aws_security_group.nodes.id
  description                  = "HTTP API between the nodes (operators on a node asking another)"
  ip_protocol                  = "tcp"
  from_port                    = var.http_port
  to_port                      = var.http_port
  referenced_security_group_id = aws_security_group.nodes.id
}

resource "aws_vpc_security_group_ingress_rule" "metrics" {
  for_each = var.metrics_port == null ? toset([]) : toset(var.metrics_cidrs)

  security_group_id = aws_security_group.nodes.id
  description       = "Unauthenticated /metrics listener from the scrapers"
  ip_protocol       = "tcp"
  from_port         = var.metrics_port
  to_port           = var.metrics_port
  cidr_ipv4         = strcontains(each.value, ":") ? null : each.value
  cidr_ipv6         = strcontains(each.value, ":") ? each.value : null
}

# --- nodes: egress ------------------------------------------------------------------------

resource "aws_vpc_security_group_egress_rule" "cluster_to_nodes" {
  security_group_id            = aws_security_group.nodes.id
  description                  = "QUIC cluster endpoint of the other nodes"
  ip_protocol                  = "udp"
  from_port                    = var.cluster_port
  to_port                      = var.cluster_port
  referenced_security_group_id = aws_security_group.nodes.id
}

resource "aws_vpc_security_group_egress_rule" "http_to_nodes" {
  security_group_id            = aws_security_group.nodes.id
  description                  = "HTTP API of the other nodes"
  ip_protocol                  = "tcp"
  from_port                    = var.http_port
  to_port                      = var.http_port
  referenced_security_group_id = aws_security_group.nodes.id
}

resource "aws_vpc_security_group_egress_rule" "https" {
  for_each = toset(var.egress_https_cidrs)

  security_group_id = aws_security_group.nodes.id
  description       = "HTTPS: artifact, AWS APIs (SSM/Secrets Manager, KMS, S3), remote clusters"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  cidr_ipv4         = strcontains(each.value, ":") ? null : each.value
  cidr_ipv6         = strcontains(each.value, ":") ? each.value : null
}

resource "aws_vpc_security_group_egress_rule" "https_to_s3_endpoint" {
  count = var.create_s3_gateway_endpoint ? 1 : 0

  security_group_id = aws_security_group.nodes.id
  description       = "HTTPS to S3 through the gateway endpoint"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  prefix_list_id    = aws_vpc_endpoint.s3[0].prefix_list_id
}

# --- load balancer ------------------------------------------------------------------------

resource "aws_vpc_security_group_ingress_rule" "lb_from_clients" {
  for_each = toset(var.client_cidrs)

  security_group_id = aws_security_group.lb.id
  description       = "Narad HTTP API listener from the listed client networks"
  ip_protocol       = "tcp"
  from_port         = local.lb_port
  to_port           = local.lb_port
  cidr_ipv4         = strcontains(each.value, ":") ? null : each.value
  cidr_ipv6         = strcontains(each.value, ":") ? each.value : null
}

resource "aws_vpc_security_group_egress_rule" "lb_to_nodes" {
  security_group_id            = aws_security_group.lb.id
  description                  = "To the nodes' HTTP API (traffic and health checks)"
  ip_protocol                  = "tcp"
  from_port                    = var.http_port
  to_port                      = var.http_port
  referenced_security_group_id = aws_security_group.nodes.id
}

# --- S3 gateway endpoint (optional) -------------------------------------------------------

resource "aws_vpc_endpoint" "s3" {
  count = var.create_s3_gateway_endpoint ? 1 : 0

  vpc_id            = var.vpc_id
  service_name      = "com.amazonaws.${local.region}.s3"
  vpc_endpoint_type = "Gateway"
  route_table_ids   = var.route_table_ids
  tags              = merge(local.common_tags, { Name = "${var.name}-narad-s3" })
}
