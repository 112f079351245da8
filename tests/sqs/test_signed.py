"""Narad's SQS endpoint with security on: boto3 signs with Narad access keys, and the
users' grants decide what each operation may do.

Run by tests/it/sqs.rs: `test_signed.py URL KEYS_JSON`, where KEYS_JSON holds
`{"alice": [id, secret], "bob": [id, secret]}`: alice may create, produce and consume queues
`sq*`; bob may only consume them.
"""

import json
import sys
import unittest
import urllib.error
import urllib.request

import boto3
import botocore.config
from botocore.exceptions import ClientError

URL = sys.argv.pop(1)
KEYS = json.load(open(sys.argv.pop(1)))


def client(who, secret=None, region="us-east-1"):
    key_id, key_secret = KEYS[who]
    return boto3.client(
        "sqs",
        endpoint_url=URL,
        region_name=region,
        aws_access_key_id=key_id,
        aws_secret_access_key=secret or key_secret,
        config=botocore.config.Config(retries={"max_attempts": 1}),
    )


def code(e):
    return e.response["Error"]["Code"], e.response["ResponseMetadata"]["HTTPStatusCode"]


class Signed(unittest.TestCase):
    def test_a_signed_user_works_in_any_region(self):
        for region in ["us-east-1", "eu-central-1"]:
            sqs = client("alice", region=region)
            url = sqs.create_queue(QueueName=f"sq-{region}")["QueueUrl"]
            sqs.send_message(QueueUrl=url, MessageBody="signed é")
            m = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"][0]
            self.assertEqual(m["Body"], "signed é")
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])

    def test_wrong_or_unknown_keys_are_refused(self):
        with self.assertRaises(ClientError) as cm:
            client("alice", secret="x" * 40).list_queues()
        self.assertEqual(code(cm.exception), ("SignatureDoesNotMatch", 403))
        unknown = boto3.client(
            "sqs",
            endpoint_url=URL,
            region_name="us-east-1",
            aws_access_key_id="NRDAAAAAAAAAAAAAAAAA",
            aws_secret_access_key="x" * 40,
        )
        with self.assertRaises(ClientError) as cm:
            unknown.list_queues()
        self.assertEqual(code(cm.exception), ("InvalidClientTokenId", 403))

    def test_an_unsigned_request_is_refused(self):
        req = urllib.request.Request(URL + "/", data=b"{}", method="POST")
        req.add_header("X-Amz-Target", "AmazonSQS.ListQueues")
        req.add_header("Content-Type", "application/x-amz-json-1.0")
        with self.assertRaises(urllib.error.HTTPError) as cm:
            urllib.request.urlopen(req, timeout=30)
        self.assertEqual(cm.exception.code, 403)
        self.assertEqual(cm.exception.headers["x-amzn-query-error"], "MissingAuthenticationToken;Sender")

    def test_grants_decide_each_operation(self):
        alice, bob = client("alice"), client("bob")
        url = alice.create_queue(QueueName="sq-grants")["QueueUrl"]
        alice.send_message(QueueUrl=url, MessageBody="for bob")
        for call in [
            lambda: bob.send_message(QueueUrl=url, MessageBody="no"),
            lambda: bob.create_queue(QueueName="sq-bob"),
            lambda: bob.delete_queue(QueueUrl=url),
            lambda: bob.set_queue_attributes(QueueUrl=url, Attributes={"DelaySeconds": "1"}),
            lambda: alice.create_queue(QueueName="other"),
        ]:
            with self.assertRaises(ClientError) as cm:
                call()
            self.assertEqual(code(cm.exception), ("AccessDenied", 403))
        m = bob.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"][0]
        self.assertEqual(m["Body"], "for bob")
        bob.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
        # bob lists only what he may see
        self.assertIn(url, bob.list_queues(QueueNamePrefix="sq-grants").get("QueueUrls", []))


if __name__ == "__main__":
    unittest.main(verbosity=2)
