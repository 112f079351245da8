"""Narad's SQS endpoint through clients no one here wrote: boto3 and the AWS CLI.

Run by tests/it/sqs.rs against a broker it started (`--dev`): the broker's address is the
first argument (or NARAD_SQS_URL). Every check is a unittest case; the process fails if any
fails. The MD5s the SDKs of other languages check are computed here independently (boto3
does not check them).
"""

import base64
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import threading
import time
import unittest
import urllib.error
import urllib.request
import uuid

import boto3
import botocore.config
from botocore.exceptions import ClientError

URL = os.environ.get("NARAD_SQS_URL") or (sys.argv.pop(1) if len(sys.argv) > 1 else None)
if URL is None:
    raise SystemExit("usage: test_clients.py http://127.0.0.1:PORT")

REGION = "us-east-1"


def client():
    return boto3.client(
        "sqs",
        endpoint_url=URL,
        region_name=REGION,
        aws_access_key_id="AKIDDEV",
        aws_secret_access_key="dev-secret",
        config=botocore.config.Config(retries={"max_attempts": 1}),
    )


def md5_attributes(attrs):
    """AWS's digest of message attributes, written from its documentation."""
    h = hashlib.md5()

    def field(b):
        h.update(struct.pack("!I", len(b)))
        h.update(b)

    for name in sorted(attrs, key=lambda n: n.encode()):
        a = attrs[name]
        field(name.encode())
        field(a["DataType"].encode())
        if "BinaryValue" in a:
            h.update(b"\x02")
            field(a["BinaryValue"])
        else:
            h.update(b"\x01")
            field(a["StringValue"].encode())
    return h.hexdigest()


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def error_code(e):
    return e.response["Error"]["Code"]


def raw(target, body, content_type="application/x-amz-json-1.0"):
    """A request without an SDK: (status, headers, parsed body)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(URL + "/", data=data, method="POST")
    req.add_header("Content-Type", content_type)
    if target is not None:
        req.add_header("X-Amz-Target", target)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read() or b"{}")


class Queues(unittest.TestCase):
    def setUp(self):
        self.sqs = client()

    def test_create_is_idempotent_on_equal_attributes(self):
        name = unique("idem")
        url = self.sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "40"})["QueueUrl"]
        self.assertTrue(url.endswith(f"/{name}"), url)
        again = self.sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "40"})
        self.assertEqual(again["QueueUrl"], url)
        with self.assertRaises(self.sqs.exceptions.QueueNameExists) as cm:
            self.sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "41"})
        self.assertEqual(error_code(cm.exception), "QueueAlreadyExists")
        self.assertEqual(self.sqs.get_queue_url(QueueName=name)["QueueUrl"], url)

    def test_a_missing_queue_is_queue_does_not_exist(self):
        with self.assertRaises(self.sqs.exceptions.QueueDoesNotExist) as cm:
            self.sqs.get_queue_url(QueueName=unique("nope"))
        self.assertEqual(error_code(cm.exception), "AWS.SimpleQueueService.NonExistentQueue")
        # a URL from another host names the same queue; another account's names none
        name = unique("hosts")
        self.sqs.create_queue(QueueName=name)
        acct = self.sqs.get_queue_attributes(
            QueueUrl=self.sqs.get_queue_url(QueueName=name)["QueueUrl"], AttributeNames=["QueueArn"]
        )["Attributes"]["QueueArn"].split(":")[4]
        elsewhere = f"https://sqs.{REGION}.amazonaws.com/{acct}/{name}"
        self.sqs.send_message(QueueUrl=elsewhere, MessageBody="x")
        with self.assertRaises(self.sqs.exceptions.QueueDoesNotExist):
            self.sqs.send_message(QueueUrl=f"https://sqs.{REGION}.amazonaws.com/999999999999/{name}", MessageBody="x")

    def test_list_filters_by_prefix_and_pages(self):
        prefix = unique("lst")
        names = sorted(f"{prefix}-{i}" for i in range(5))
        for n in names:
            self.sqs.create_queue(QueueName=n)
        listed = self.sqs.list_queues(QueueNamePrefix=prefix)["QueueUrls"]
        self.assertEqual([u.rsplit("/", 1)[1] for u in listed], names)
        seen, token = [], None
        while True:
            kw = {"QueueNamePrefix": prefix, "MaxResults": 2}
            if token:
                kw["NextToken"] = token
            page = self.sqs.list_queues(**kw)
            self.assertLessEqual(len(page["QueueUrls"]), 2)
            seen += [u.rsplit("/", 1)[1] for u in page["QueueUrls"]]
            token = page.get("NextToken")
            if not token:
                break
        self.assertEqual(seen, names)
        self.assertNotIn("QueueUrls", self.sqs.list_queues(QueueNamePrefix=unique("none")))
        with self.assertRaises(ClientError) as cm:
            self.sqs.list_queues(MaxResults=1001)
        self.assertEqual(error_code(cm.exception), "InvalidParameterValue")

    def test_delete_queue(self):
        name = unique("del")
        url = self.sqs.create_queue(QueueName=name)["QueueUrl"]
        self.sqs.delete_queue(QueueUrl=url)
        with self.assertRaises(self.sqs.exceptions.QueueDoesNotExist):
            self.sqs.get_queue_url(QueueName=name)
        with self.assertRaises(self.sqs.exceptions.QueueDoesNotExist):
            self.sqs.delete_queue(QueueUrl=url)

    def test_attributes(self):
        url = self.sqs.create_queue(
            QueueName=unique("attrs"),
            Attributes={"DelaySeconds": "0", "MaximumMessageSize": "2048", "MessageRetentionPeriod": "3600"},
        )["QueueUrl"]
        a = self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        self.assertEqual(a["VisibilityTimeout"], "30")
        self.assertEqual(a["MaximumMessageSize"], "2048")
        self.assertEqual(a["MessageRetentionPeriod"], "3600")
        self.assertTrue(a["QueueArn"].startswith(f"arn:aws:sqs:{REGION}:"))
        self.assertEqual(a["ApproximateNumberOfMessages"], "0")
        self.sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "7"})
        a = self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["VisibilityTimeout"])["Attributes"]
        self.assertEqual(a, {"VisibilityTimeout": "7"})
        for bad in [{"VisibilityTimeout": "43201"}, {"DelaySeconds": "x"}, {"MaximumMessageSize": "1"}]:
            with self.assertRaises(ClientError) as cm:
                self.sqs.set_queue_attributes(QueueUrl=url, Attributes=bad)
            self.assertEqual(error_code(cm.exception), "InvalidAttributeValue", bad)
        with self.assertRaises(ClientError) as cm:
            self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["Nope"])
        self.assertEqual(error_code(cm.exception), "InvalidAttributeName")
        # counts: two visible, then one in flight
        self.sqs.send_message(QueueUrl=url, MessageBody="a")
        self.sqs.send_message(QueueUrl=url, MessageBody="b")
        self.sqs.receive_message(QueueUrl=url)
        a = self.sqs.get_queue_attributes(
            QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
        )["Attributes"]
        self.assertEqual(a, {"ApproximateNumberOfMessages": "1", "ApproximateNumberOfMessagesNotVisible": "1"})

    def test_purge_empties_the_queue_and_keeps_the_log(self):
        name = unique("purge")
        url = self.sqs.create_queue(QueueName=name)["QueueUrl"]
        for i in range(5):
            self.sqs.send_message(QueueUrl=url, MessageBody=f"old {i}")
        leased = self.sqs.receive_message(QueueUrl=url)["Messages"][0]
        self.sqs.purge_queue(QueueUrl=url)
        self.assertNotIn("Messages", self.sqs.receive_message(QueueUrl=url))
        # a lease taken before: its delete still answers success; nothing comes back
        self.sqs.delete_message(QueueUrl=url, ReceiptHandle=leased["ReceiptHandle"])
        self.sqs.send_message(QueueUrl=url, MessageBody="new")
        got = self.sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"]
        self.assertEqual([m["Body"] for m in got], ["new"])
        # the log keeps what was purged: a replay reads it
        seen = []
        for p in range(3):
            with urllib.request.urlopen(f"{URL}/v1/topics/{name}/consume?partition={p}&offset=0&max=100", timeout=30) as r:
                if r.status == 200:
                    seen += [m["payload"] for m in json.loads(r.read())["messages"]]
        self.assertEqual(sorted(x for x in seen if x.startswith("old")), [f"old {i}" for i in range(5)])

    def test_tags_are_refused_not_dropped(self):
        with self.assertRaises(ClientError) as cm:
            self.sqs.create_queue(QueueName=unique("tagged"), tags={"env": "prod"})
        self.assertEqual(error_code(cm.exception), "InvalidParameterValue")

    def test_fifo_queues_are_refused_clearly(self):
        for kw in [{"QueueName": unique("f") + ".fifo"}, {"QueueName": unique("f"), "Attributes": {"FifoQueue": "true"}}]:
            with self.assertRaises(ClientError) as cm:
                self.sqs.create_queue(**kw)
            self.assertEqual(error_code(cm.exception), "AWS.SimpleQueueService.UnsupportedOperation")
            self.assertIn("FIFO", cm.exception.response["Error"]["Message"])


class Messages(unittest.TestCase):
    def setUp(self):
        self.sqs = client()
        self.url = self.sqs.create_queue(QueueName=unique("msgs"))["QueueUrl"]

    def test_send_receive_delete_with_attributes_and_their_md5s(self):
        attrs = {
            "s": {"DataType": "String", "StringValue": "text é"},
            "n": {"DataType": "Number.int", "StringValue": "-12"},
            "b": {"DataType": "Binary", "BinaryValue": b"\x00\x01\xff"},
        }
        body = "hello 😀"
        r = self.sqs.send_message(QueueUrl=self.url, MessageBody=body, MessageAttributes=attrs)
        self.assertEqual(r["MD5OfMessageBody"], hashlib.md5(body.encode()).hexdigest())
        self.assertEqual(r["MD5OfMessageAttributes"], md5_attributes(attrs))
        got = self.sqs.receive_message(
            QueueUrl=self.url, MessageAttributeNames=["All"], MessageSystemAttributeNames=["All"]
        )["Messages"]
        self.assertEqual(len(got), 1)
        m = got[0]
        self.assertEqual(m["MessageId"], r["MessageId"])
        self.assertEqual(m["Body"], body)
        self.assertEqual(m["MD5OfBody"], r["MD5OfMessageBody"])
        self.assertEqual(m["MessageAttributes"], attrs)
        self.assertEqual(m["MD5OfMessageAttributes"], md5_attributes(attrs))
        self.assertEqual(m["Attributes"]["ApproximateReceiveCount"], "1")
        self.assertLess(abs(int(m["Attributes"]["SentTimestamp"]) - time.time() * 1000), 60_000)
        # only the attributes asked for, and their digest
        self.sqs.change_message_visibility(QueueUrl=self.url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0)
        m = self.sqs.receive_message(QueueUrl=self.url, MessageAttributeNames=["s"])["Messages"][0]
        self.assertEqual(m["MessageAttributes"], {"s": attrs["s"]})
        self.assertEqual(m["MD5OfMessageAttributes"], md5_attributes({"s": attrs["s"]}))
        self.assertNotIn("Attributes", m)
        self.sqs.delete_message(QueueUrl=self.url, ReceiptHandle=m["ReceiptHandle"])
        # deleting again is not an error (AWS's deletes are idempotent)
        self.sqs.delete_message(QueueUrl=self.url, ReceiptHandle=m["ReceiptHandle"])
        self.assertNotIn("Messages", self.sqs.receive_message(QueueUrl=self.url))

    def test_an_empty_receive_has_no_messages_key(self):
        r = self.sqs.receive_message(QueueUrl=self.url, WaitTimeSeconds=0)
        self.assertNotIn("Messages", r)

    def test_a_long_poll_is_answered_by_a_send(self):
        got = {}

        def wait():
            t = time.monotonic()
            got["r"] = client().receive_message(QueueUrl=self.url, WaitTimeSeconds=20)
            got["t"] = time.monotonic() - t

        th = threading.Thread(target=wait)
        th.start()
        # the waiter is parked before the send (polled: the queue counts no waiter via SQS,
        # so give it a moment by a bounded check that nothing arrived yet)
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline and "r" not in got:
            time.sleep(0.05)
        self.sqs.send_message(QueueUrl=self.url, MessageBody="wake")
        th.join(30)
        self.assertEqual(got["r"]["Messages"][0]["Body"], "wake")
        self.assertLess(got["t"], 19)

    def test_visibility(self):
        self.sqs.send_message(QueueUrl=self.url, MessageBody="v")
        m = self.sqs.receive_message(QueueUrl=self.url)["Messages"][0]
        self.assertNotIn("Messages", self.sqs.receive_message(QueueUrl=self.url))
        self.sqs.change_message_visibility(QueueUrl=self.url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0)
        m2 = self.sqs.receive_message(QueueUrl=self.url, MessageSystemAttributeNames=["ApproximateReceiveCount"])[
            "Messages"
        ][0]
        self.assertEqual(m2["MessageId"], m["MessageId"])
        self.assertEqual(m2["Attributes"]["ApproximateReceiveCount"], "2")
        # the old handle no longer holds the message
        with self.assertRaises(ClientError) as cm:
            self.sqs.change_message_visibility(QueueUrl=self.url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0)
        self.assertEqual(error_code(cm.exception), "AWS.SimpleQueueService.MessageNotInflight")
        # the queue's own timeout renews the lease
        self.sqs.change_message_visibility(QueueUrl=self.url, ReceiptHandle=m2["ReceiptHandle"], VisibilityTimeout=30)
        with self.assertRaises(ClientError) as cm:
            self.sqs.change_message_visibility(QueueUrl=self.url, ReceiptHandle=m2["ReceiptHandle"], VisibilityTimeout=43201)
        self.assertEqual(error_code(cm.exception), "InvalidParameterValue")

    def test_a_receive_and_a_change_may_name_their_own_visibility(self):
        # (the queue's own timeout is 30 s: each return below is the one asked for)
        self.sqs.send_message(QueueUrl=self.url, MessageBody="short")
        m = self.sqs.receive_message(QueueUrl=self.url, VisibilityTimeout=1)["Messages"][0]
        again = self.sqs.receive_message(QueueUrl=self.url, WaitTimeSeconds=10)["Messages"][0]
        self.assertEqual(again["MessageId"], m["MessageId"])
        self.sqs.change_message_visibility(QueueUrl=self.url, ReceiptHandle=again["ReceiptHandle"], VisibilityTimeout=1)
        third = self.sqs.receive_message(QueueUrl=self.url, WaitTimeSeconds=10)["Messages"][0]
        self.assertEqual(third["MessageId"], m["MessageId"])
        self.sqs.change_message_visibility(QueueUrl=self.url, ReceiptHandle=third["ReceiptHandle"], VisibilityTimeout=600)
        self.assertNotIn("Messages", self.sqs.receive_message(QueueUrl=self.url, WaitTimeSeconds=2))
        with self.assertRaises(ClientError) as cm:
            self.sqs.receive_message(QueueUrl=self.url, VisibilityTimeout=43201)
        self.assertEqual(error_code(cm.exception), "InvalidParameterValue")

    def test_an_expired_lease_brings_the_message_back(self):
        url = self.sqs.create_queue(QueueName=unique("exp"), Attributes={"VisibilityTimeout": "1"})["QueueUrl"]
        self.sqs.send_message(QueueUrl=url, MessageBody="again")
        first = self.sqs.receive_message(QueueUrl=url)["Messages"][0]
        again = self.sqs.receive_message(
            QueueUrl=url, WaitTimeSeconds=10, MessageSystemAttributeNames=["ApproximateReceiveCount"]
        )["Messages"][0]
        self.assertEqual(again["MessageId"], first["MessageId"])
        self.assertEqual(again["Attributes"]["ApproximateReceiveCount"], "2")

    def test_bad_receipt_handles(self):
        with self.assertRaises(self.sqs.exceptions.ReceiptHandleIsInvalid):
            self.sqs.delete_message(QueueUrl=self.url, ReceiptHandle="garbage")
        with self.assertRaises(ClientError) as cm:
            self.sqs.delete_message(QueueUrl=self.url, ReceiptHandle="")
        self.assertIn(error_code(cm.exception), ["ReceiptHandleIsInvalid", "MissingParameter"])

    def test_message_limits(self):
        with self.assertRaises(ClientError) as cm:
            self.sqs.receive_message(QueueUrl=self.url, MaxNumberOfMessages=11)
        self.assertEqual(error_code(cm.exception), "InvalidParameterValue")
        self.assertEqual(
            cm.exception.response["Error"]["Message"],
            "Value 11 for parameter MaxNumberOfMessages is invalid. Reason: Must be between 1 and 10, if provided.",
        )
        with self.assertRaises(ClientError) as cm:
            self.sqs.receive_message(QueueUrl=self.url, WaitTimeSeconds=21)
        self.assertEqual(error_code(cm.exception), "InvalidParameterValue")
        with self.assertRaises(ClientError) as cm:
            self.sqs.send_message(QueueUrl=self.url, MessageBody="x", DelaySeconds=901)
        self.assertEqual(error_code(cm.exception), "InvalidParameterValue")
        with self.assertRaises(self.sqs.exceptions.InvalidMessageContents):
            self.sqs.send_message(QueueUrl=self.url, MessageBody="bad \x00")
        small = self.sqs.create_queue(QueueName=unique("small"), Attributes={"MaximumMessageSize": "1024"})["QueueUrl"]
        self.sqs.send_message(QueueUrl=small, MessageBody="x" * 1024)
        with self.assertRaises(ClientError) as cm:
            self.sqs.send_message(QueueUrl=small, MessageBody="x" * 1025)
        self.assertEqual(error_code(cm.exception), "InvalidParameterValue")
        # attributes count towards the size
        with self.assertRaises(ClientError):
            self.sqs.send_message(
                QueueUrl=small,
                MessageBody="x" * 1000,
                MessageAttributes={"a": {"DataType": "String", "StringValue": "y" * 100}},
            )
        for bad in [
            {"AWS.x": {"DataType": "String", "StringValue": "v"}},
            {"narad-x": {"DataType": "String", "StringValue": "v"}},
            {"n": {"DataType": "Number", "StringValue": "one"}},
            {"n": {"DataType": "Float", "StringValue": "1"}},
            {f"a{i}": {"DataType": "String", "StringValue": "v"} for i in range(11)},
        ]:
            with self.assertRaises(ClientError) as cm:
                self.sqs.send_message(QueueUrl=self.url, MessageBody="x", MessageAttributes=bad)
            self.assertEqual(error_code(cm.exception), "InvalidParameterValue", bad)

    def test_a_message_id_is_the_same_on_every_delivery(self):
        sent = self.sqs.send_message(QueueUrl=self.url, MessageBody="id")["MessageId"]
        ids = set()
        for _ in range(3):
            m = self.sqs.receive_message(QueueUrl=self.url)["Messages"][0]
            ids.add(m["MessageId"])
            self.sqs.change_message_visibility(QueueUrl=self.url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0)
        self.assertEqual(ids, {sent})


class Batches(unittest.TestCase):
    def setUp(self):
        self.sqs = client()
        self.url = self.sqs.create_queue(QueueName=unique("batch"))["QueueUrl"]

    def test_send_receive_delete_in_batches(self):
        entries = [{"Id": f"m{i}", "MessageBody": f"body {i}"} for i in range(10)]
        r = self.sqs.send_message_batch(QueueUrl=self.url, Entries=entries)
        self.assertEqual(r["Failed"], [])
        self.assertEqual(sorted(s["Id"] for s in r["Successful"]), sorted(e["Id"] for e in entries))
        for s in r["Successful"]:
            i = int(s["Id"][1:])
            self.assertEqual(s["MD5OfMessageBody"], hashlib.md5(f"body {i}".encode()).hexdigest())
        got = []
        deadline = time.monotonic() + 20
        while len(got) < 10 and time.monotonic() < deadline:
            got += self.sqs.receive_message(QueueUrl=self.url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get(
                "Messages", []
            )
        self.assertEqual(sorted(m["Body"] for m in got), sorted(e["MessageBody"] for e in entries))
        d = self.sqs.delete_message_batch(
            QueueUrl=self.url,
            Entries=[{"Id": f"d{i}", "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)],
        )
        self.assertEqual(len(d["Successful"]), 10)
        self.assertEqual(d["Failed"], [])

    def test_each_entry_is_answered_on_its_own(self):
        r = self.sqs.send_message_batch(
            QueueUrl=self.url,
            Entries=[
                {"Id": "ok", "MessageBody": "fine"},
                {"Id": "late", "MessageBody": "x", "DelaySeconds": 901},
                {"Id": "bin", "MessageBody": "x", "MessageAttributes": {"n": {"DataType": "Number", "StringValue": "z"}}},
            ],
        )
        self.assertEqual([s["Id"] for s in r["Successful"]], ["ok"])
        failed = {f["Id"]: f for f in r["Failed"]}
        self.assertEqual(set(failed), {"late", "bin"})
        self.assertTrue(all(f["SenderFault"] for f in failed.values()))
        self.assertEqual(failed["late"]["Code"], "InvalidParameterValue")
        m = self.sqs.receive_message(QueueUrl=self.url, WaitTimeSeconds=5)["Messages"][0]
        c = self.sqs.change_message_visibility_batch(
            QueueUrl=self.url,
            Entries=[
                {"Id": "a", "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 0},
                {"Id": "b", "ReceiptHandle": "garbage", "VisibilityTimeout": 0},
            ],
        )
        self.assertEqual([s["Id"] for s in c["Successful"]], ["a"])
        self.assertEqual([(f["Id"], f["Code"]) for f in c["Failed"]], [("b", "ReceiptHandleIsInvalid")])

    def test_batch_envelope_errors(self):
        cases = [
            ([], "AWS.SimpleQueueService.EmptyBatchRequest"),
            ([{"Id": f"i{i}", "MessageBody": "x"} for i in range(11)], "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"),
            ([{"Id": "same", "MessageBody": "x"}, {"Id": "same", "MessageBody": "y"}], "AWS.SimpleQueueService.BatchEntryIdsNotDistinct"),
            ([{"Id": "not.valid", "MessageBody": "x"}], "AWS.SimpleQueueService.InvalidBatchEntryId"),
            ([{"Id": f"i{i}", "MessageBody": "x" * 200_000} for i in range(6)], "AWS.SimpleQueueService.BatchRequestTooLong"),
        ]
        for entries, code in cases:
            with self.assertRaises(ClientError) as cm:
                self.sqs.send_message_batch(QueueUrl=self.url, Entries=entries)
            self.assertEqual(error_code(cm.exception), code)
        with self.assertRaises(self.sqs.exceptions.BatchEntryIdsNotDistinct) as cm:
            self.sqs.delete_message_batch(
                QueueUrl=self.url,
                Entries=[{"Id": "x", "ReceiptHandle": "h"}, {"Id": "x", "ReceiptHandle": "h"}],
            )
        self.assertEqual(cm.exception.response["Error"]["Message"], "Id x repeated.")


class Native(unittest.TestCase):
    """A queue is a topic: what one API writes, the other reads."""

    def setUp(self):
        self.sqs = client()
        self.name = unique("native")
        self.url = self.sqs.create_queue(QueueName=self.name)["QueueUrl"]

    def test_native_produce_is_received_through_sqs(self):
        req = urllib.request.Request(
            f"{URL}/v1/topics/{self.name}/produce", data=b'{"order": 1}', method="POST"
        )
        req.add_header("x-narad-header-trace", "abc")
        with urllib.request.urlopen(req, timeout=30) as r:
            produced = json.loads(r.read())
        m = self.sqs.receive_message(QueueUrl=self.url, MessageAttributeNames=["All"])["Messages"][0]
        self.assertEqual(m["Body"], '{"order": 1}')
        self.assertEqual(m["MessageAttributes"], {"trace": {"DataType": "String", "StringValue": "abc"}})
        self.assertEqual(produced["partition"], int(m["MessageId"].split("-")[3][:2], 16))

    def test_sqs_send_is_consumed_natively(self):
        self.sqs.send_message(
            QueueUrl=self.url,
            MessageBody="from sqs",
            MessageAttributes={"who": {"DataType": "String", "StringValue": "boto3"}},
        )
        with urllib.request.urlopen(f"{URL}/v1/topics/{self.name}/consume?wait=5s", timeout=30) as r:
            msg = json.loads(r.read())
        self.assertEqual(msg["payload"], "from sqs")
        self.assertEqual(msg["headers"]["who"], "boto3")
        # acked natively: gone for SQS too
        req = urllib.request.Request(
            f"{URL}/v1/topics/{self.name}/ack",
            data=json.dumps({"receipt_handles": [msg["receipt_handle"]]}).encode(),
            method="POST",
        )
        req.add_header("Content-Type", "application/json")
        urllib.request.urlopen(req, timeout=30).read()
        self.assertNotIn("Messages", self.sqs.receive_message(QueueUrl=self.url))


class Wire(unittest.TestCase):
    """Bad input answers AWS-shaped 4xx, never a 5xx."""

    def check(self, status, headers, body, want_status, want_code):
        self.assertEqual(status, want_status, body)
        self.assertIn("__type", body)
        self.assertIn("message", body)
        query = {k.lower(): v for k, v in headers.items()}.get("x-amzn-query-error", "")
        self.assertEqual(query, f"{want_code};Sender", headers)

    def test_malformed_requests(self):
        self.check(*raw("AmazonSQS.ListQueues", b"{not json"), 400, "SerializationException")
        self.check(*raw("AmazonSQS.ListQueues", b"[1,2]"), 400, "SerializationException")
        self.check(*raw("AmazonSQS.ListQueues", {"MaxResults": "ten"}), 400, "SerializationException")
        self.check(*raw("AmazonSQS.Nope", {}), 400, "UnknownOperationException")
        self.check(*raw("AmazonSQS.SendMessage", {"MessageBody": "x"}), 400, "MissingParameter")
        self.check(*raw("AmazonSQS.GetQueueUrl", {}), 400, "MissingParameter")
        self.check(
            *raw("AmazonSQS.SendMessage", {"QueueUrl": "http://h/000000000000/none", "MessageBody": "x"}),
            400,
            "AWS.SimpleQueueService.NonExistentQueue",
        )
        # another service's target, and a compressed body: said in AWS's form too
        self.check(*raw("DynamoDB_20120810.ListTables", {}), 400, "UnknownOperationException")
        req = urllib.request.Request(URL + "/", data=b"{}", method="POST")
        req.add_header("X-Amz-Target", "AmazonSQS.ListQueues")
        req.add_header("Content-Encoding", "gzip")
        with self.assertRaises(urllib.error.HTTPError) as cm:
            urllib.request.urlopen(req, timeout=30)
        self.assertEqual(cm.exception.code, 400)
        self.assertEqual(cm.exception.headers["x-amzn-query-error"], "InvalidParameterValue;Sender")
        # an oversized body: refused once the limit is read. The answer may reach the client,
        # or the connection may close while the client is still writing the rest (a broken
        # pipe); either way no 5xx, and the endpoint answers the next request
        try:
            status, _, _ = raw("AmazonSQS.ListQueues", b"x" * (4 * 1024 * 1024))
            self.assertTrue(400 <= status < 500, status)
        except urllib.error.URLError as e:
            self.assertIsInstance(e.reason, (BrokenPipeError, ConnectionResetError), e)
        self.assertEqual(raw("AmazonSQS.ListQueues", {})[0], 200)
        # a POST to / without an SQS target is not this endpoint
        status, _, _ = raw(None, {})
        self.assertTrue(400 <= status < 500, status)

    def test_unsupported_operations_say_so(self):
        sqs = client()
        url = sqs.create_queue(QueueName=unique("unsup"))["QueueUrl"]
        with self.assertRaises(ClientError) as cm:
            sqs.add_permission(QueueUrl=url, Label="l", AWSAccountIds=["1"], Actions=["SendMessage"])
        self.assertEqual(error_code(cm.exception), "AWS.SimpleQueueService.UnsupportedOperation")
        self.assertEqual(sqs.list_dead_letter_source_queues(QueueUrl=url)["queueUrls"], [])


@unittest.skipIf(
    shutil.which("aws") is None and not os.environ.get("NARAD_REQUIRE_SQS_CLIENTS"),
    "the AWS CLI is not installed",
)
class Cli(unittest.TestCase):
    def aws(self, *args):
        env = dict(os.environ, AWS_ACCESS_KEY_ID="AKIDDEV", AWS_SECRET_ACCESS_KEY="dev-secret", AWS_DEFAULT_REGION=REGION)
        out = subprocess.run(
            ["aws", "--endpoint-url", URL, "--output", "json", "sqs", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        self.assertEqual(out.returncode, 0, out.stderr)
        return json.loads(out.stdout) if out.stdout.strip() else {}

    def test_the_cli_sends_and_receives(self):
        name = unique("cli")
        url = self.aws("create-queue", "--queue-name", name)["QueueUrl"]
        self.aws("send-message", "--queue-url", url, "--message-body", "from the cli")
        got = self.aws("receive-message", "--queue-url", url, "--wait-time-seconds", "5")["Messages"]
        self.assertEqual(got[0]["Body"], "from the cli")
        self.aws("delete-message", "--queue-url", url, "--receipt-handle", got[0]["ReceiptHandle"])
        self.assertIn(url, self.aws("list-queues", "--queue-name-prefix", name)["QueueUrls"])
        self.aws("delete-queue", "--queue-url", url)


if __name__ == "__main__":
    unittest.main(verbosity=2)
