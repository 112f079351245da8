# A network load balancer in front of the HTTP API. Any member takes any request (Narad
# forwards to the partitions' owners over the cluster port), so every ready node is a
# target; /readyz decides which are (503 while a node is forming, joining, without a
# quorum, or shutting down). A network (not application) load balancer keeps the clients'
# addresses, which Narad's failed-login throttling counts by, and never cuts long polls
# (up to 20 s) short.

resource "aws_lb" "api" {
  #checkov:skip=CKV_AWS_91:A network load balancer writes access logs only for TLS listeners; with lb_certificate_arn use the access_logs of your account's log bucket (not set here to keep the module free of a logging bucket of its own).
  name                             = "${var.name}-narad"
  load_balancer_type               = "network"
  internal                         = var.lb_internal
  subnets                          = coalesce(var.lb_subnet_ids, var.subnet_ids)
  security_groups                  = [aws_security_group.lb.id]
  enable_cross_zone_load_balancing = true
  enable_deletion_protection       = var.lb_deletion_protection
  tags                             = local.common_tags
}

resource "aws_lb_target_group" "api" {
  name_prefix          = "narad-"
  port                 = var.http_port
  protocol             = local.lb_tls && local.broker_tls ? "TLS" : "TCP"
  target_type          = "instance"
  vpc_id               = var.vpc_id
  preserve_client_ip   = "true"
  deregistration_delay = 30
  tags                 = local.common_tags

  health_check {
    enabled             = true
    protocol            = local.broker_tls ? "HTTPS" : "HTTP"
    port                = "traffic-port"
    path                = "/readyz"
    matcher             = "200"
    interval            = 10
    timeout             = 5
    healthy_threshold   = 2
    unhealthy_threshold = 2
  }

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_lb_target_group_attachment" "api" {
  for_each = local.nodes

  target_group_arn = aws_lb_target_group.api.arn
  target_id        = aws_instance.node[each.key].id
  port             = var.http_port
}

resource "aws_lb_listener" "api" {
  load_balancer_arn = aws_lb.api.arn
  port              = local.lb_port
  protocol          = local.lb_tls ? "TLS" : "TCP"
  certificate_arn   = var.lb_certificate_arn
  ssl_policy        = local.lb_tls ? var.lb_ssl_policy : null
  tags              = local.common_tags

  default_action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.api.arn
  }
}

resource "aws_route53_record" "api" {
  count = var.lb_dns == null ? 0 : 1

  zone_id = var.lb_dns.zone_id
  name    = var.lb_dns.name
  type    = "A"

  alias {
    name                   = aws_lb.api.dns_name
    zone_id                = aws_lb.api.zone_id
    evaluate_target_health = true
  }
}
