"""Fuzzes Narad's SQS endpoint from botocore's own model of SQS: for every operation, bodies
built from its input shape (members present or missing, values of the right type and of
wrong ones, extremes, odd text), plus bodies that are not requests at all. Every answer must
be a 2xx, or a 4xx in AWS's form (`__type`, `message`, `x-amzn-query-error`): a 5xx on a
client's input is a bug, and so is an answer that is not JSON.

`fuzz.py URL [CASES] [SEED]`: the seed is printed, and a failing case names it and its
number, so a run replays exactly.
"""

import json
import random
import sys
import urllib.error
import urllib.request

import botocore.session

URL = sys.argv[1]
CASES = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
SEED = int(sys.argv[3]) if len(sys.argv) > 3 else random.SystemRandom().randrange(1 << 32)
rng = random.Random(SEED)
model = botocore.session.get_session().get_service_model("sqs")
QUEUE = f"{URL}/000000000000/fuzzq"

TEXT = [
    "",
    "x",
    "fuzzq",
    QUEUE,
    "http://h/000000000000/fuzzq",
    "http://h/111111111111/fuzzq",
    "All",
    ".*",
    "String",
    "Number",
    "Binary",
    "Number.x",
    "AWS.x",
    "narad-sqs-types",
    "a.b.c",
    "é😀",
    "\u0000",
    "\ud7ff\ue000",
    "1e400",
    "-0",
    "99999999999999999999999999999999999999999",
    "AQID",
    "!!notbase64",
    "x" * 300,
    "y" * 70_000,
    "AWS4-HMAC-SHA256",
    "arn:aws:sqs:us-east-1:000000000000:fuzzq",
    '{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:000000000000:x","maxReceiveCount":"5"}',
]
NUMBERS = [0, 1, -1, 10, 11, 20, 21, 900, 901, 43200, 43201, 2**31, -(2**63), 2**63 - 1, 2**64, 1.5]


def wrong():
    return rng.choice([None, True, [], {}, [1, "a"], {"a": {"b": [None]}}, 3.25, "s", 7])


def value(shape, depth=0, name=""):
    if rng.random() < 0.03:
        return wrong()
    t = shape.type_name
    if name == "QueueUrl" and rng.random() < 0.85:
        return QUEUE
    if name == "QueueName" and rng.random() < 0.5:
        return rng.choice(["fuzzq", f"fz{rng.randrange(50)}"])
    if name == "MessageBody" and rng.random() < 0.7:
        return rng.choice(["hello", "{}", "é"])
    if name in ("MaxNumberOfMessages", "WaitTimeSeconds") and rng.random() < 0.7:
        return rng.choice([1, 2, 10] if name[0] == "M" else [0, 0, 1])
    if t == "string":
        if shape.enum and rng.random() < 0.7:
            return rng.choice(shape.enum)
        return rng.choice(TEXT)
    if t in ("integer", "long"):
        return rng.choice(NUMBERS)
    if t == "boolean":
        return rng.choice([True, False])
    if t == "blob":
        return rng.choice(["", "AAEC", "!!", "QUJD" * 1000])
    if depth > 4:
        return None
    if t == "list":
        return [value(shape.member, depth + 1) for _ in range(rng.choice([0, 1, 2, 11]))]
    if t == "map":
        n = rng.choice([0, 1, 3, 11])
        return {str(value(shape.key, depth + 1)): value(shape.value, depth + 1) for _ in range(n)}
    if t == "structure":
        out = {}
        for name, member in shape.members.items():
            if name in shape.required_members and rng.random() < 0.9 or rng.random() < 0.5:
                out[name] = value(member, depth + 1, name)
        return out
    return None


def body_for(op):
    r = rng.random()
    if r < 0.05:
        return rng.choice([b"", b"{", b"[]", b"null", b"1", b'"x"', b"{}" * 3, bytes(rng.randrange(256) for _ in range(64))])
    shape = model.operation_model(op).input_shape
    v = value(shape) if shape is not None else {}
    if not isinstance(v, dict):
        v = {"Junk": v}
    return json.dumps(v).encode()


def call(target, body):
    req = urllib.request.Request(URL + "/", data=body, method="POST")
    req.add_header("Content-Type", "application/x-amz-json-1.0")
    if target is not None:
        req.add_header("X-Amz-Target", target)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def main():
    print(f"SQS fuzzing: {CASES} cases, seed {SEED}", file=sys.stderr)
    # a queue to aim at, so operations get past the lookup
    call("AmazonSQS.CreateQueue", json.dumps({"QueueName": "fuzzq"}).encode())
    ops = list(model.operation_names)
    statuses = {}
    for i in range(CASES):
        if i % 20 == 0:
            # (DeleteQueue is fuzzed too: the queue comes back)
            call("AmazonSQS.CreateQueue", json.dumps({"QueueName": "fuzzq"}).encode())
        op = rng.choice(ops)
        target = f"AmazonSQS.{op}" if rng.random() > 0.03 else rng.choice(["AmazonSQS.", "AmazonSQS.Nope", "AmazonSQS.sendmessage"])
        body = body_for(op)
        status, headers, raw = call(target, body)
        statuses[status] = statuses.get(status, 0) + 1
        where = f"case {i} (seed {SEED}): {target} {body[:300]!r} -> {status} {raw[:300]!r}"
        assert status < 500, where
        parsed = json.loads(raw or b"{}")
        assert isinstance(parsed, dict), where
        if status >= 400:
            lower = {k.lower(): v for k, v in headers.items()}
            assert "__type" in parsed and "message" in parsed, where
            assert lower.get("x-amzn-query-error", "").endswith(";Sender"), where
    print(f"answers by status: {dict(sorted(statuses.items()))}", file=sys.stderr)
    print("OK", file=sys.stderr)


if __name__ == "__main__":
    main()
