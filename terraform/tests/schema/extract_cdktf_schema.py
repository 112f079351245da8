#!/usr/bin/env python3
"""Extract the argument schema of the resource types our Terraform uses from the npm
packages @cdktf/provider-aws and @cdktf/provider-random, which are generated from the
providers' own `terraform providers schema -json` output (their package.json names the
provider version: hashicorp/aws 6.25.0 for @cdktf/provider-aws 21.22.1, hashicorp/random
3.7.2 for @cdktf/provider-random 12.0.1).

What a binding gives, per resource or data source and per nested block:
  - every argument that can be set (the generated `synthesizeHclAttributes`, and each
    block's `...ToHclTerraform(struct)` function), computed-only attributes excluded;
  - whether it is a block (`isBlock: true`) or an attribute;
  - whether it is required (the generated config interface: a field without `?`).
What it does not give: value types beyond that, conflicts between arguments, enum
values, ephemeral resources (cdktf has none) and write-only flags.

Usage (offline once the packages are fetched with the ordinary npm client):
  npm pack @cdktf/provider-aws@21.22.1 @cdktf/provider-random@12.0.1
  extract_cdktf_schema.py --aws cdktf-provider-aws-21.22.1.tgz \
      --random cdktf-provider-random-12.0.1.tgz --out providers.json TYPE...
or with TYPE... omitted, every aws_/random_ type found in terraform/**/*.tf.
"""

import argparse
import json
import os
import re
import sys
import tarfile

ATTR_RE = re.compile(
    r"(\w+): \{\s*value: (.*?),\s*isBlock: (true|false),\s*type: \"(\w+)\",\s*storageClassType: \"(\w+)\",\s*\}",
    re.S,
)
FUNC_RE = re.compile(r"function (\w+)ToHclTerraform\(struct\) \{(.*?)\n\}\n", re.S)
SYNTH_RE = re.compile(r"synthesizeHclAttributes\(\) \{(.*?)\n    \}\n", re.S)
IFACE_RE = re.compile(r"export interface (\w+)(?: extends [\w.]+)? \{(.*?)\n\}", re.S)
FIELD_RE = re.compile(r"readonly (\w+)(\??):")
CLASS_RE = re.compile(r"^(\w+)\.tfResourceType = \"(\w+)\";", re.M)


def camel_of(value_expr):
    """The config field a value expression reads: struct.fooBar or this._fooBar[.internalValue]."""
    m = re.search(r"struct\.(\w+)\)", value_expr) or re.search(r"struct\.(\w+)\b", value_expr)
    if m:
        return m.group(1)
    m = re.search(r"this\._(\w+)", value_expr)
    return m.group(1) if m else None


def nested_fn(value_expr):
    m = re.search(r"(\w+)ToHclTerraform", value_expr)
    if not m or m.group(1).startswith(("string", "number", "boolean", "list", "hash")):
        return None
    return m.group(1)


def parse_attrs(body):
    out = []
    for name, value, is_block, kind, _storage in ATTR_RE.findall(body):
        out.append((name, value, is_block == "true", kind))
    return out


def parse_binding(js, dts):
    # the inline source map is one base64 "word" of hundreds of KiB: drop it before any regex
    js = re.sub(r"^//# sourceMappingURL=.*$", "", js, flags=re.M)
    classes = CLASS_RE.findall(js)
    if not classes:
        raise ValueError("no tfResourceType")
    cls, tf_type = classes[-1]
    funcs = {name: body for name, body in FUNC_RE.findall(js)}
    ifaces = {}
    for name, body in IFACE_RE.findall(dts):
        ifaces[name] = {f: q != "?" for f, q in FIELD_RE.findall(body)}

    def build(attrs, iface, seen):
        schema = {}
        for name, value, is_block, kind in attrs:
            camel = camel_of(value)
            entry = {"block": is_block}
            required = iface.get(camel) if camel else None
            if required:
                entry["required"] = True
            fn = nested_fn(value)
            if fn and fn in funcs and fn not in seen:
                inner_iface = ifaces.get(fn[0].upper() + fn[1:], {})
                entry["nested"] = build(parse_attrs(funcs[fn]), inner_iface, seen | {fn})
                if kind == "list" or kind == "set":
                    entry["many"] = True
            schema[name] = entry
        return schema

    synth = SYNTH_RE.search(js)
    if not synth:
        raise ValueError("no synthesizeHclAttributes")
    args = build(parse_attrs(synth.group(1)), ifaces.get(cls + "Config", {}), set())
    # what an expression may read: every attribute getter of the main class (arguments and
    # computed attributes alike)
    main = re.search(r"^class " + cls + r" extends cdktf\.Terraform(?:Resource|DataSource) \{(.*?)^\}", js, re.S | re.M)
    readable = sorted(set(re.findall(r"this\.(?:get\w*Attribute|interpolationForAttribute)\('(\w+)'\)", main.group(1) if main else "")))
    return tf_type, {"arguments": args, "attributes": readable}


def dir_for(tf_type, kind):
    """aws_s3_bucket -> s3-bucket; data aws_iam_policy_document -> data-aws-iam-policy-document."""
    provider, _, rest = tf_type.partition("_")
    if kind == "data":
        return "data-" + tf_type.replace("_", "-")
    if provider == "random" and rest == "string":
        return "string-resource"
    return rest.replace("_", "-")


class Package:
    def __init__(self, path):
        self.path = path
        self.tar = tarfile.open(path) if os.path.isfile(path) else None
        self.meta = json.loads(self.read("package.json"))

    def read(self, rel):
        if self.tar:
            return self.tar.extractfile("package/" + rel).read().decode()
        with open(os.path.join(self.path, rel), encoding="utf-8") as f:
            return f.read()

    def provider(self):
        p = self.meta["cdktf"]["provider"]
        return p["name"], p["version"], self.meta["name"] + "@" + self.meta["version"]


def used_types(root):
    found = set()
    rx = re.compile(r'^\s*(resource|data|ephemeral)\s+"((aws|random)_\w+)"', re.M)
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            if f.endswith(".tf"):
                with open(os.path.join(dirpath, f), encoding="utf-8") as fh:
                    for kind, t, _p in rx.findall(fh.read()):
                        # ephemeral random_* share the managed resource's arguments
                        found.add(("data" if kind == "data" else "resource", t))
    return sorted(found)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--aws", required=True, help="@cdktf/provider-aws tarball or unpacked package dir")
    ap.add_argument("--random", required=True, help="@cdktf/provider-random tarball or unpacked package dir")
    ap.add_argument("--out", required=True)
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    ap.add_argument("types", nargs="*", help="resource:TYPE or data:TYPE (default: scan --root)")
    a = ap.parse_args()
    pkgs = {"aws": Package(a.aws), "random": Package(a.random)}
    types = [tuple(t.split(":", 1)) for t in a.types] if a.types else used_types(a.root)
    out = {"generated_by": "terraform/tests/schema/extract_cdktf_schema.py", "providers": {}, "resource": {}, "data": {}}
    for name, pkg in pkgs.items():
        src, version, npm = pkg.provider()
        out["providers"][name] = {"source": src, "version": version, "from": npm}
    for kind, tf_type in types:
        pkg = pkgs[tf_type.split("_", 1)[0]]
        d = dir_for(tf_type, kind)
        try:
            t, schema = parse_binding(pkg.read(f"lib/{d}/index.js"), pkg.read(f"lib/{d}/index.d.ts"))
        except (KeyError, FileNotFoundError) as e:
            print(f"{kind} {tf_type}: not in {pkg.path} ({e})", file=sys.stderr)
            return 1
        if t != tf_type:
            print(f"{kind} {tf_type}: {d} is {t}", file=sys.stderr)
            return 1
        out[kind][tf_type] = schema
        print(f"{kind:8} {tf_type}: {len(schema['arguments'])} arguments, {len(schema['attributes'])} attributes", file=sys.stderr)
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
