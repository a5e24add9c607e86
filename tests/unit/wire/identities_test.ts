import assert from "node:assert/strict";
import { ConfigError, PartitionKeyError } from "../../../src/core/errors.ts";
import {
  abortTraceId,
  compareCodePoints,
  dlqMessageId,
  eosTraceId,
  groupIdentity,
  isValidPartitionKey,
  type MemberId,
  membersSignature,
  messageId,
  type MsgType,
  partitionKeyOf,
  partitionKeyString,
  partitionOwner,
  producerTrace,
  recordKeyError,
  replayableTraceId,
  roundHalfToEven,
  sinkIdempotencyKey,
  sourceEpochTraceId,
  timeGroupIdentity,
  timeWindowSeq,
  traceGroupIdentity,
} from "../../../src/wire/identities.ts";
import { SeededRandom, testSeed } from "../../support/random.ts";

// Expected digests below were computed independently with the Python reference's rules (hashlib, round()).

const SEED = testSeed();

interface MessageIdVector {
  flow_id: string;
  run_id: string;
  producer_name: string;
  trace_id: string;
  seq: number;
  msg_type: MsgType;
  expected_id: string;
}

Deno.test("message ids match the reference's golden vectors", async () => {
  const path = new URL("../../fixtures/vectors/message_id/vectors.json", import.meta.url);
  const vectors: MessageIdVector[] = JSON.parse(await Deno.readTextFile(path));
  assert.ok(vectors.length >= 4);
  for (const v of vectors) {
    assert.equal(
      messageId(v.flow_id, v.run_id, v.producer_name, v.trace_id, v.seq, v.msg_type),
      v.expected_id,
    );
    assert.equal(
      messageId(v.flow_id, v.run_id, v.producer_name, v.trace_id, BigInt(v.seq), v.msg_type),
      v.expected_id,
      "a bigint seq derives the same id",
    );
  }
  assert.equal(messageId("flow-A", "run-1", "cam", "cam:1", 1, "data"), "745708c2eeaf98a60fdbebafe1d04eff");
  assert.throws(() => messageId("f", "r", "p", "t", 1.5, "data"), ConfigError);
});

Deno.test("end markers of one replica get distinct ids for EOS and ABORT", () => {
  assert.equal(eosTraceId(0), "eos-r0");
  assert.equal(abortTraceId(2), "abort-r2");
  const eos = messageId("f", "r", "cam", eosTraceId(1), 9, "eos");
  const abort = messageId("f", "r", "cam", abortTraceId(1), 9, "abort");
  assert.notEqual(eos, abort);
  assert.notEqual(eos, messageId("f", "r", "cam", eosTraceId(2), 9, "eos"));
});

Deno.test("dead-letter ids and sink idempotency keys follow WIRE.md", () => {
  assert.equal(dlqMessageId("flow-A", "run-1", "det", 42), "dlq:flow-A:run-1:det:42");
  assert.equal(dlqMessageId("f", "r", "n", 9007199254740993n), "dlq:f:r:n:9007199254740993");
  assert.equal(dlqMessageId("flow-A", "run-1", "pair", 42, "left"), "dlq:flow-A:run-1:pair:left:42");
  assert.notEqual(dlqMessageId("f", "r", "pair", 1, "left"), dlqMessageId("f", "r", "pair", 1, "right"));
  assert.equal(
    sinkIdempotencyKey("flow-A", "sink", "745708c2eeaf98a60fdbebafe1d04eff"),
    "vf-idem-77bc88ddd3eec10855b8ee9fffc4d876a6f04eaa727457b5c076a31fb211a49e",
  );
});

Deno.test("a producer mints {node}:{n} with seq n, counting from 1", () => {
  assert.deepEqual(producerTrace("cam", 1), { traceId: "cam:1", seq: 1 });
  assert.deepEqual(producerTrace("caméra-Ω", 9000000000n), {
    traceId: "caméra-Ω:9000000000",
    seq: 9000000000n,
  });
  assert.throws(() => producerTrace("cam", 0), ConfigError);
  assert.throws(() => producerTrace("cam", 2.5), ConfigError);
});

Deno.test("source trace ids: live epochs and replayable offsets with analysis versions", () => {
  assert.equal(sourceEpochTraceId("cam", "3f2a9c", 7), "cam:3f2a9c:7");
  assert.equal(replayableTraceId("cam", 120), "cam:120");
  assert.equal(replayableTraceId("cam", 120, "v2"), "cam:v2:120");
  assert.equal(replayableTraceId("cam", 120, ""), "cam:120");
  assert.equal(replayableTraceId("cam", 120, null), "cam:120");
  assert.notEqual(replayableTraceId("cam", 5, "v2"), replayableTraceId("cam", 5, "v3"));
});

Deno.test("a trace group carries its trace id, the minimum seq and the minimum event time", () => {
  const members = [
    { traceId: "cam:4", seq: 9, eventTs: null },
    { traceId: "cam:4", seq: 4, eventTs: 12.5 },
    { traceId: "cam:4", seq: 6, eventTs: 11.25 },
  ];
  assert.deepEqual(traceGroupIdentity(members), { traceId: "cam:4", seq: 4, eventTs: 11.25 });
  const random = new SeededRandom(SEED);
  for (let i = 0; i < 50; i++) {
    assert.deepEqual(
      traceGroupIdentity(random.shuffle(members)),
      traceGroupIdentity(members),
      `VF_TEST_SEED=${SEED}`,
    );
  }
  assert.deepEqual(traceGroupIdentity([{ traceId: "t", seq: 3n, eventTs: null }]), {
    traceId: "t",
    seq: 3n,
    eventTs: null,
  });
  assert.throws(() => traceGroupIdentity([]), RangeError);
  assert.throws(
    () => traceGroupIdentity([members[0], { traceId: "cam:5", seq: 1, eventTs: null }]),
    RangeError,
  );
});

Deno.test("round half to even decides ties on the exact double", () => {
  const cases: Array<[number, bigint]> = [
    [0.5, 0n],
    [1.5, 2n],
    [2.5, 2n],
    [3.5, 4n],
    [-0.5, 0n],
    [-1.5, -2n],
    [-2.5, -2n],
    [0.49999999999999994, 0n],
    [2.5000000000000004, 3n],
    [-7.25, -7n],
    [2 ** 53 + 2, 9007199254740994n],
    [4503599627370495.5, 4503599627370496n],
  ];
  for (const [x, expected] of cases) assert.equal(roundHalfToEven(x), expected, `round(${x})`);
  for (const bad of [NaN, Infinity, -Infinity]) assert.throws(() => roundHalfToEven(bad), RangeError);
});

Deno.test("round half to even lands within one half, and on an even integer at a tie", () => {
  const random = new SeededRandom(SEED ^ 0x1234567);
  let ties = 0;
  for (let i = 0; i < 5000; i++) {
    const scale = 10 ** random.int(0, 11);
    const spread = (random.next() - 0.5) * scale;
    const x = i % 3 === 0 ? Math.floor(spread) + 0.5 : spread;
    const r = roundHalfToEven(x);
    const distance = Math.abs(x - Number(r));
    assert.ok(distance <= 0.5, `VF_TEST_SEED=${SEED}: round(${x}) = ${r}`);
    if (distance === 0.5) {
      ties++;
      assert.equal(r % 2n, 0n, `VF_TEST_SEED=${SEED}: tie ${x} goes to even, got ${r}`);
    }
  }
  assert.ok(ties > 1000, `VF_TEST_SEED=${SEED}: only ${ties} ties were exercised`);
});

Deno.test("a time window's seq is Python's round(ts * 1e6)", () => {
  const cases: Array<[number, bigint]> = [
    [1700000000.0000005, 1700000000000000n],
    [1.0000005, 1000001n],
    [5.4330125, 5433012n],
    [2.5308295, 2530830n],
    [8.9906085, 8990608n],
    [2.5e-6, 2n],
    [-2.5e-6, -2n],
    [-5e-7, 0n],
    [1700000000.123456789, 1700000000123457n],
    [0.1, 100000n],
    [1e-7, 0n],
    [123.4567895, 123456790n],
    [9.1e9, 9100000000000000n],
    [
      1e300,
      BigInt(
        "1000000000000000017216064596736454828831087825013238982328892017892380671244575047987920451875459594" +
          "5686061388616982910603110492255329485206969388057114406501226285146694284603569926249680283295506892" +
          "24175284346730060716088829214255439694630119794546505512415617982143262670862918816362862119154749127262208",
      ),
    ],
  ];
  for (const [ts, expected] of cases) assert.equal(timeWindowSeq(ts), expected, `ts ${ts}`);
});

const CAMS: Record<string, MemberId> = {
  cam_b: { producer: "cam_b", traceId: "cam_b:7", seq: 7 },
  cam_a: { producer: "cam_a", traceId: "cam_a:3", seq: 3 },
};

Deno.test("group identity matches the reference digest for trace, time and windowed groups", () => {
  assert.equal(groupIdentity(CAMS, null), "g-722d246277e5");
  assert.equal(groupIdentity(CAMS, null, 1700000000500000n), "tw-1700000000500000-722d246277e5");
  assert.equal(groupIdentity(CAMS, null, 1700000000500000), "tw-1700000000500000-722d246277e5");
  assert.equal(groupIdentity(CAMS, "w1"), "g-1a4285774ef0");
  assert.equal(groupIdentity(CAMS, ""), groupIdentity(CAMS, null), "an empty window is no window");
  const astral = new Map<string, MemberId>([
    ["\u{1D4B3}", { producer: "p", traceId: "x:1", seq: 1 }],
    ["\uE000", { producer: "q", traceId: "y:2", seq: 2n }],
  ]);
  assert.equal(groupIdentity(astral, null), "g-92c4aa77983e", "parents sort by code point, as Python sorts");
});

Deno.test("group identity ignores member order and tells distinct members apart", () => {
  const random = new SeededRandom(SEED ^ 0xabcdef);
  const seen = new Map<string, string>();
  for (let round = 0; round < 300; round++) {
    const parents = Array.from({ length: random.int(1, 5) }, (_, i) => `p${i}`);
    const members: Array<[string, MemberId & { seq: number }]> = parents.map((p) => {
      const seq = random.int(0, 49);
      return [p, { producer: `src${random.int(0, 2)}`, traceId: `t:${seq}`, seq }];
    });
    const id = groupIdentity(new Map(members), null);
    assert.equal(groupIdentity(new Map(random.shuffle(members)), null), id, `VF_TEST_SEED=${SEED}`);
    assert.equal(
      groupIdentity(Object.fromEntries(random.shuffle(members)), null),
      id,
      `VF_TEST_SEED=${SEED}`,
    );
    const canonical = JSON.stringify(members);
    assert.equal(seen.get(id) ?? canonical, canonical, `VF_TEST_SEED=${SEED}: ${id} named two member sets`);
    seen.set(id, canonical);
    const [parent, member] = members[0];
    for (
      const changed of [
        { ...member, seq: member.seq + 1 },
        { ...member, traceId: `${member.traceId}x` },
        { ...member, producer: `${member.producer}x` },
      ]
    ) {
      assert.notEqual(
        groupIdentity(new Map([...members, [parent, changed]]), null),
        id,
        `VF_TEST_SEED=${SEED}`,
      );
    }
    assert.notEqual(
      groupIdentity(new Map(members), "w"),
      id,
      `VF_TEST_SEED=${SEED}: the window is part of the id`,
    );
  }
});

Deno.test("members signature is order-insensitive and matches the reference", () => {
  assert.equal(membersSignature(["b", "a", "c"]), "a52dd81bfd5e");
  assert.equal(membersSignature(["c", "a", "b"]), "a52dd81bfd5e");
  assert.equal(membersSignature(["\u{1D4B3}", "\uE000", "z"]), "633f6c3fdc1c");
  assert.equal(membersSignature([]), "e3b0c44298fc");
  assert.notEqual(membersSignature(["a", "b"]), membersSignature(["a", "c"]));
  assert.equal(membersSignature(["a", "b"]), membersSignature(["a|b"]), "the reference's join is unescaped");
});

Deno.test("strings compare by code point, astral characters after the private use area", () => {
  assert.ok(compareCodePoints("\uE000", "\u{1D4B3}") < 0);
  assert.ok("\uE000" > "\u{1D4B3}", "UTF-16 order differs, which is why the comparator exists");
  assert.equal(compareCodePoints("abc", "abc"), 0);
  assert.ok(compareCodePoints("ab", "abc") < 0);
  assert.ok(compareCodePoints("b", "abc") > 0);
});

Deno.test("a time group takes the earliest member time, arrival standing in for a missing one", () => {
  const members = {
    left: { producer: "camL", traceId: "camL:1", seq: 1, eventTs: 1700000000.25, arrivalTs: 1700000003 },
    right: { producer: "camR", traceId: "camR:1", seq: 1, eventTs: null, arrivalTs: 1700000000.2 },
  };
  const identity = timeGroupIdentity(members);
  assert.equal(identity.eventTs, 1700000000.2);
  assert.equal(identity.seq, 1700000000200000n);
  assert.equal(identity.traceId, groupIdentity(members, null, 1700000000200000n));
  assert.match(identity.traceId, /^tw-1700000000200000-[0-9a-f]{12}$/);
  const twin = { ...members, left: { ...members.left, traceId: "camL:2", seq: 2 } };
  const other = timeGroupIdentity(twin);
  assert.equal(other.seq, identity.seq, "the same microsecond");
  assert.notEqual(other.traceId, identity.traceId, "distinct groups at one microsecond keep distinct ids");
  assert.throws(() => timeGroupIdentity({}), RangeError);
});

Deno.test("usable partition keys are non-empty strings, booleans and integers", () => {
  for (const key of ["cam:1", "0", true, false, 0, -3, 2n ** 70n]) {
    assert.equal(isValidPartitionKey(key), true);
  }
  for (const key of [null, undefined, "", 1.5, NaN, Infinity, [], ["a"], {}, "\uD800x"]) {
    assert.equal(isValidPartitionKey(key), false, String(key));
  }
});

Deno.test("a partition key's string form is Python's str()", () => {
  assert.equal(partitionKeyString(true), "True");
  assert.equal(partitionKeyString(false), "False");
  assert.equal(partitionKeyString(5), "5");
  assert.equal(partitionKeyString(-0), "0");
  assert.equal(partitionKeyString(2n ** 70n), "1180591620717411303424");
  assert.equal(partitionKeyString("ejecución"), "ejecución");
});

Deno.test("an unusable partition key is a rejection, never the string None", () => {
  const described = ["(absent)", "null", '""', "2.5", "(an object)", "(a list)"];
  for (const [index, key] of [undefined, null, "", 2.5, { a: 1 }, ["x"]].entries()) {
    assert.throws(() => partitionOwner(key, 4), (error: unknown) => {
      assert.ok(error instanceof PartitionKeyError);
      assert.ok(error.message.startsWith(`unusable partition key ${described[index]}:`), error.message);
      assert.equal(error.code, "VF_POISON_PARTITION_KEY");
      assert.equal(error.disposition, "poison");
      assert.ok(error.remedy);
      return true;
    });
  }
  assert.equal(partitionOwner("None", 1000), partitionOwner("None", 1000), "the string None itself is a key");
});

Deno.test("a record's unusable key names the field looked for and the fields the record has", () => {
  const metadata = { proctime: 1, _partition_key: "cam1" };
  assert.equal(recordKeyError("_partition_key", "t", metadata), null);
  assert.equal(recordKeyError("trace_id", "t", null), null);
  const absent = recordKeyError("camera_id", "t", metadata);
  assert.ok(absent instanceof PartitionKeyError);
  assert.match(
    absent.message,
    /^unusable partition key \(absent\): the item has no field "camera_id" \(partitionBy\), and has metadata fields _partition_key, proctime;/,
  );
  assert.match(absent.remedy ?? "", /ctx\.setPartitionKey\(\) and partition by "_partition_key"/);
  const empty = recordKeyError("camera_id", "t", { camera_id: "" });
  assert.match(
    empty?.message ?? "",
    /^unusable partition key "": the item's field is not a usable key in "camera_id"/,
  );
  assert.match(recordKeyError("camera_id", "t", {})?.message ?? "", /and has no metadata fields;/);
});

Deno.test("partition owners match the reference: first 8 hex of SHA-256, mod nb_tasks", () => {
  const expected: Array<[unknown, number[]]> = [
    ["cam:1", [0, 0, 2, 0, 4, 732]],
    [true, [0, 1, 0, 3, 6, 487]],
    [false, [0, 0, 0, 0, 1, 84]],
    [5, [0, 1, 1, 1, 1, 477]],
    [-3, [0, 1, 0, 3, 3, 327]],
    [0, [0, 0, 2, 2, 6, 278]],
    ["True", [0, 1, 0, 3, 6, 487]],
    [2n ** 70n, [0, 1, 2, 1, 2, 557]],
    ["ejecución", [0, 1, 1, 1, 3, 793]],
  ];
  for (const [key, owners] of expected) {
    assert.deepEqual([1, 2, 3, 4, 7, 1000].map((n) => partitionOwner(key, n)), owners, String(key));
  }
  for (const bad of [0, -1, 1.5, NaN]) assert.throws(() => partitionOwner("k", bad), ConfigError);
});

Deno.test("partition owners agree with an independent SHA-256 and stay in range", async () => {
  const random = new SeededRandom(SEED ^ 0x7777);
  for (let i = 0; i < 300; i++) {
    const key = `k${random.int(0, 1e9 - 1)}`;
    const nbTasks = random.int(1, 16);
    const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(key)));
    const word = new DataView(digest.buffer).getUint32(0, false);
    const owner = partitionOwner(key, nbTasks);
    assert.equal(owner, word % nbTasks, `VF_TEST_SEED=${SEED}: ${key} over ${nbTasks}`);
    assert.ok(owner >= 0 && owner < nbTasks);
  }
});

Deno.test("the partition key is the trace id or a metadata field, absent when missing", () => {
  assert.equal(partitionKeyOf("trace_id", "cam:3", { trace_id: "other" }), "cam:3");
  assert.equal(partitionKeyOf("camera", "cam:3", { camera: 2 }), 2);
  assert.equal(partitionKeyOf("camera", "cam:3", {}), undefined);
  assert.equal(partitionKeyOf("camera", "cam:3", null), undefined);
  assert.equal(partitionKeyOf("constructor", "cam:3", {}), undefined, "inherited properties are not fields");
  assert.throws(() => partitionOwner(partitionKeyOf("camera", "cam:3", { other: 1 }), 3), PartitionKeyError);
});
