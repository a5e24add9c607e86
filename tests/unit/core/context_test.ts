import assert from "node:assert/strict";
import { type Logger, RuntimeContext } from "../../../src/core/context.ts";
import type { InputGroup, Messenger } from "../../../src/core/messenger.ts";

const silent: Logger = { debug() {}, info() {}, warn() {}, error() {} };
const identity = { flowId: "f", runId: "r", nodeName: "n", replicaId: 2 };

/** Records the calls a context makes; every method a context does not use throws. */
function recordingMessenger(calls: unknown[][]): Messenger {
  const unused = (name: string) => () => {
    throw new Error(`context called ${name}`);
  };
  return {
    receiveMessage: unused("receiveMessage") as () => Promise<InputGroup>,
    publishMessage: unused("publishMessage"),
    publishStopSignal: unused("publishStopSignal"),
    publishAbort: unused("publishAbort"),
    ackInputs: unused("ackInputs"),
    awaitInFlight: unused("awaitInFlight"),
    failInputs: unused("failInputs"),
    checkForTermination: unused("checkForTermination"),
    stopReason: unused("stopReason"),
    quiesce: unused("quiesce"),
    resumeOffset: unused("resumeOffset"),
    takeDrops: unused("takeDrops"),
    close: unused("close"),
    checkpoint(state) {
      calls.push(["checkpoint", state]);
      return Promise.resolve();
    },
    restoreCheckpoint() {
      calls.push(["restoreCheckpoint"]);
      return Promise.resolve(new Uint8Array([7]));
    },
    setOutputEventTimestamp(value) {
      calls.push(["setOutputEventTimestamp", value]);
    },
    setOutputPartitionKey(value) {
      calls.push(["setOutputPartitionKey", value]);
    },
    lastInputInfo() {
      return { cam: { eventTs: 1.5, metadata: null, traceId: "cam:1", seq: 1 } };
    },
    lastInputKey() {
      return "key-1";
    },
  };
}

Deno.test("a context without a messenger is inert: no-ops and nulls", async () => {
  const ctx = new RuntimeContext(identity, silent);
  await ctx.checkpoint(new Uint8Array([1]));
  assert.equal(await ctx.restoreCheckpoint(), null);
  assert.equal(ctx.takePendingCheckpoint(), null);
  assert.equal(ctx.inputInfo, null);
  assert.equal(ctx.inputKey, null);
  ctx.setPartitionKey("k");
  ctx.setEventTimestamp(1);
  assert.deepEqual([ctx.flowId, ctx.runId, ctx.nodeName, ctx.replicaId], ["f", "r", "n", 2]);
});

Deno.test("a sink's checkpoint is written at once", async () => {
  const calls: unknown[][] = [];
  const ctx = new RuntimeContext(identity, silent, recordingMessenger(calls));
  await ctx.checkpoint(new Uint8Array([1, 2]));
  assert.deepEqual(calls, [["checkpoint", new Uint8Array([1, 2])]]);
  assert.equal(ctx.takePendingCheckpoint(), null);
});

Deno.test("a processor's checkpoint is deferred to its output and taken exactly once", async () => {
  const calls: unknown[][] = [];
  const ctx = new RuntimeContext(identity, silent, recordingMessenger(calls));
  ctx.emitsOutput = true;
  await ctx.checkpoint(new Uint8Array([1]));
  await ctx.checkpoint(new Uint8Array([2]));
  assert.deepEqual(calls, []);
  assert.deepEqual(ctx.takePendingCheckpoint(), new Uint8Array([2]));
  assert.equal(ctx.takePendingCheckpoint(), null);
});

Deno.test("the context forwards restore, event time, partition key and input facts", async () => {
  const calls: unknown[][] = [];
  const ctx = new RuntimeContext(identity, silent, recordingMessenger(calls));
  assert.deepEqual(await ctx.restoreCheckpoint(), new Uint8Array([7]));
  ctx.setEventTimestamp(12.5);
  ctx.setPartitionKey("plate-7");
  assert.deepEqual(calls, [["restoreCheckpoint"], ["setOutputEventTimestamp", 12.5], [
    "setOutputPartitionKey",
    "plate-7",
  ]]);
  assert.equal(ctx.inputKey, "key-1");
  assert.deepEqual(ctx.inputInfo, { cam: { eventTs: 1.5, metadata: null, traceId: "cam:1", seq: 1 } });
});
