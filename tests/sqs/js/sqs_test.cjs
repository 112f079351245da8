// Narad's SQS endpoint through the AWS SDK for JavaScript v3 (@aws-sdk/client-sqs), which
// checks the MD5s of bodies and attributes on every send and receive (boto3 does not): send,
// receive with a long poll, delete, the batch forms and visibility.
//
// `node sqs_test.cjs URL` with NODE_PATH naming the node_modules that holds the SDK
// (.ci/run installs it; tests/it/sqs.rs runs this).
"use strict";

const assert = require("node:assert/strict");
const {
  SQSClient,
  CreateQueueCommand,
  SendMessageCommand,
  SendMessageBatchCommand,
  ReceiveMessageCommand,
  DeleteMessageCommand,
  DeleteMessageBatchCommand,
  ChangeMessageVisibilityCommand,
  GetQueueAttributesCommand,
} = require("@aws-sdk/client-sqs");

const url = process.argv[2];
const sqs = new SQSClient({
  endpoint: url,
  region: "us-east-1",
  credentials: { accessKeyId: "AKIDDEV", secretAccessKey: "dev-secret" },
  maxAttempts: 1,
});

async function main() {
  const name = `js-${process.pid}-${Date.now()}`;
  const { QueueUrl } = await sqs.send(new CreateQueueCommand({ QueueName: name }));
  assert.ok(QueueUrl.endsWith(`/${name}`), QueueUrl);

  // the SDK checks MD5OfMessageBody and MD5OfMessageAttributes of this answer
  const attrs = {
    s: { DataType: "String", StringValue: "text é" },
    n: { DataType: "Number", StringValue: "42" },
    b: { DataType: "Binary", BinaryValue: new Uint8Array([0, 1, 255]) },
  };
  const sent = await sqs.send(
    new SendMessageCommand({ QueueUrl, MessageBody: "hello 😀", MessageAttributes: attrs }),
  );
  assert.ok(sent.MessageId);

  const batch = await sqs.send(
    new SendMessageBatchCommand({
      QueueUrl,
      Entries: [1, 2, 3].map((i) => ({
        Id: `e${i}`,
        MessageBody: `batch ${i}`,
        MessageAttributes: { i: { DataType: "Number", StringValue: String(i) } },
      })),
    }),
  );
  assert.equal(batch.Successful.length, 3);
  assert.equal((batch.Failed || []).length, 0);

  // a long poll; the SDK checks MD5OfBody and MD5OfMessageAttributes of each message
  const got = [];
  const deadline = Date.now() + 20000;
  while (got.length < 4 && Date.now() < deadline) {
    const r = await sqs.send(
      new ReceiveMessageCommand({
        QueueUrl,
        MaxNumberOfMessages: 10,
        WaitTimeSeconds: 2,
        MessageAttributeNames: ["All"],
        MessageSystemAttributeNames: ["All"],
      }),
    );
    got.push(...(r.Messages || []));
  }
  assert.equal(got.length, 4);
  const first = got.find((m) => m.MessageId === sent.MessageId);
  assert.ok(first, "the single send is received");
  assert.equal(first.Body, "hello 😀");
  assert.equal(first.MessageAttributes.s.StringValue, "text é");
  assert.deepEqual([...first.MessageAttributes.b.BinaryValue], [0, 1, 255]);
  assert.equal(first.Attributes.ApproximateReceiveCount, "1");

  // visibility: released at once, then received again with its count
  await sqs.send(
    new ChangeMessageVisibilityCommand({ QueueUrl, ReceiptHandle: first.ReceiptHandle, VisibilityTimeout: 0 }),
  );
  const again = await sqs.send(
    new ReceiveMessageCommand({ QueueUrl, WaitTimeSeconds: 5, MessageSystemAttributeNames: ["ApproximateReceiveCount"] }),
  );
  assert.equal(again.Messages[0].MessageId, sent.MessageId);
  assert.equal(again.Messages[0].Attributes.ApproximateReceiveCount, "2");
  await sqs.send(new DeleteMessageCommand({ QueueUrl, ReceiptHandle: again.Messages[0].ReceiptHandle }));

  const rest = got.filter((m) => m.MessageId !== sent.MessageId);
  const del = await sqs.send(
    new DeleteMessageBatchCommand({
      QueueUrl,
      Entries: rest.map((m, i) => ({ Id: `d${i}`, ReceiptHandle: m.ReceiptHandle })),
    }),
  );
  assert.equal(del.Successful.length, 3);
  const left = await sqs.send(
    new GetQueueAttributesCommand({ QueueUrl, AttributeNames: ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"] }),
  );
  assert.deepEqual(left.Attributes, { ApproximateNumberOfMessages: "0", ApproximateNumberOfMessagesNotVisible: "0" });

  // a wrong MD5 would have thrown above; an AWS error is a typed exception
  await assert.rejects(
    sqs.send(new ReceiveMessageCommand({ QueueUrl: url + "/000000000000/none" })),
    (e) => e.name === "QueueDoesNotExist",
  );
  console.log("OK");
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
