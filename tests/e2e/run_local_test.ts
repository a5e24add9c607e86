/**
 * `vf run-local` as a user runs it: the CLI in a subprocess, on the examples and on small flows written
 * here into a temporary directory from the story nodes of tests/fixtures/e2e/story_nodes.ts. Each story
 * checks what a user can see: the sink's file, `vf dlq`, the printed lines and the exit status.
 */

import assert from "node:assert/strict";
import { join } from "node:path";
import { decodeStoreName, FileRuntimeStore } from "../../src/runtime/file_store.ts";
import { EFFECT_KEY_PREFIX, EFFECT_MARKER_SHARDS } from "../../src/runtime/idempotency.ts";
import { decodeEnvelope, decodePayload } from "../../src/wire/codec.ts";
import { Barrier, crash, FaultSchedule, nth, pause } from "../../src/backends/faults.ts";
import { V8_HEAP_FLAGS } from "../../src/engines/deno_config.ts";
import { LOCAL_BATCH_MAX_MSGS, STOP_OPENING_GRACE_SECONDS } from "../../src/engines/local.ts";
import { decodeAll, makeClip } from "../fixtures/video/clips.ts";
import { MAY_MOUNT, mountCommand } from "../support/mounts.ts";

import {
  checkHelloRun,
  checkMultiCameraRun,
  checkVideoMotionRun,
  configPath,
  copyExample,
  type DeadLetter,
  deadLetters,
  finished,
  framesIn,
  inTempDir,
  killVictimMidRun,
  modPath,
  modUrl,
  pipeline,
  range,
  root,
  type Run,
  sinkLines,
  sinkNumbers,
  startVf,
  storyNodesUrl,
  summaryRow,
  vf,
  waitForFile,
  waitForLines,
  writeFlow,
} from "../support/vf_cli.ts";

/** {@link pipeline} with `VideoFileReader` imported, for a `producer` that decodes a clip. */
function videoPipeline(flowId: string, producer: string, middle: string, dir: string): string {
  return [
    `import { VideoFileReader } from ${JSON.stringify(modUrl)};`,
    pipeline(flowId, producer, middle, dir),
  ]
    .join("\n");
}

/** The value a dead letter's original envelope carried. */
function deadLetterValue(record: DeadLetter): unknown {
  const envelope = decodeEnvelope(Uint8Array.fromBase64(record.envelope_b64));
  return decodePayload(envelope.payloadType, envelope.payload);
}

/** How many of `node`'s inputs the broker evicted, from the `evicted N` of its summary row's drops. */
function evictedAt(run: Run, node: string): number {
  return Number(/evicted (\d+)/.exec(summaryRow(run, node).drops)?.[1] ?? 0);
}

/** The names in directory `dir`; none when it does not exist. */
async function namesIn(dir: string): Promise<string[]> {
  try {
    return (await Array.fromAsync(Deno.readDir(dir))).map((entry) => entry.name);
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return [];
    throw error;
  }
}

/**
 * Reads back every key and every log record of a run's ledger through FileRuntimeStore (each journal
 * line's and document's SHA-256 is checked), and returns how many keys there are and what holds a write
 * left half done: a journal segment that does not end with a whole line, a temporary file.
 */
async function readLedgerBack(ledger: string): Promise<{ keys: number; inFlight: string[] }> {
  const journal = join(ledger, "journal");
  const inFlight: string[] = [];
  for (const name of await namesIn(journal)) {
    const bytes = await Deno.readFile(join(journal, name));
    if (name.endsWith(".tmp") || (bytes.length > 0 && bytes.at(-1) !== 0x0a)) {
      inFlight.push(`journal/${name}`);
    }
  }
  const store = await FileRuntimeStore.open(ledger);
  try {
    const keys = await store.scan("");
    const logsDir = join(ledger, "logs");
    for (const log of await namesIn(logsDir)) {
      const name = decodeStoreName(log);
      assert.ok(name !== null, `log directory ${log} decodes`);
      await store.logEntries(name);
      const temporary = (await namesIn(join(logsDir, log))).filter((file) => file.endsWith(".tmp"));
      inFlight.push(...temporary.map((file) => `${log}/${file}`));
    }
    return { keys: keys.length, inFlight };
  } finally {
    await store.close();
  }
}

// ---- 1. the examples --------------------------------------------------------------------------------------

for (const isolation of ["worker", "process"]) {
  Deno.test(`the hello example prints the 10 sums 2, 6, ..., 110 and exits 0 (${isolation} isolation)`, async () => {
    await inTempDir(async (dir) => {
      const run = await vf(
        ["run-local", "examples/hello.ts", "--state", dir, "--isolation", isolation],
        { cwd: root.pathname },
      );
      checkHelloRun(run);
    });
  });
}

for (
  const [frames, env] of [
    ["inline, the local default", {}],
    ["through the payload store", { VIDEOFLOW_MAX_INLINE_PAYLOAD_BYTES: "4096" }],
  ] as const
) {
  Deno.test(`the video_motion example writes 60 motion lines and a decodable 60-frame mp4 (frames ${frames})`, async () => {
    await videoMotionStory(env);
  });
}

async function videoMotionStory(env: Readonly<Record<string, string>>): Promise<void> {
  await inTempDir(async (dir) => {
    await copyExample(dir, "video_motion.ts");
    const run = await vf(["run-local", "examples/video_motion.ts", "--state", join(dir, "state")], {
      cwd: dir,
      env,
    });
    await checkVideoMotionRun(run, dir);
  });
}

Deno.test("the multi_camera example writes every frame of both cameras once, paired only within 20 ms", async () => {
  await inTempDir(async (dir) => {
    await copyExample(dir, "multi_camera.ts");
    const run = await vf(["run-local", "examples/multi_camera.ts", "--state", join(dir, "state")], {
      cwd: dir,
    });
    await checkMultiCameraRun(run, dir);
  });
});

Deno.test("a decoder far ahead of a slow node is held back at the broker's channel limit: every frame reaches the sink once, in decode order", async () => {
  await inTempDir(async (dir) => {
    // 60 frames of 2.7 MB against a 64 MiB channel: the decoder fills it many times over before the slow
    // node has taken a third of them, so its publications are refused and retried all along.
    const clip = await makeClip(join(dir, "clip.mp4"), { size: "1280x720", frames: 60 });
    const flow = await writeFlow(
      dir,
      ["SlowTrace"],
      videoPipeline(
        "held-back",
        `new VideoFileReader({ name: "decode", path: ${JSON.stringify(clip)} })`,
        `new SlowTrace({ name: "slow", delayMs: 20 })`,
        dir,
      ),
    );
    const run = await vf(["run-local", flow, "--state", join(dir, "state"), "--channel-max-mib", "64"], {
      cwd: dir,
    });
    assert.equal(run.code, 0, run.text);
    const offsets = (await sinkLines(join(dir, "out.jsonl"))).map((line) =>
      Number(String(line.value).split(":").at(-1))
    );
    assert.equal(new Set(offsets).size, 60, `60 distinct frames: ${offsets}\n${run.text}`);
    assert.deepEqual(
      offsets,
      offsets.toSorted((a, b) => a - b),
      `the frames in the order they were decoded\n${run.text}`,
    );
    const refused = await vf(["run-local", flow, "--state", join(dir, "state"), "--channel-max-mib", "8"], {
      cwd: dir,
    });
    assert.equal(refused.code, 2, refused.text);
    assert.match(refused.text, /--channel-max-mib 8 is below 64 MiB, the largest envelope/);
  });
});

Deno.test("a clip played at its frame rate (realtime: true) feeds a realtime flow as a camera would: almost nothing evicted", async () => {
  await inTempDir(async (dir) => {
    // 30 frames at 10 frames/s, 3 s of video, against a node that takes 10 ms a frame: unpaced, the decoder
    // makes them hundreds a second and the one-message realtime channel evicts most of them; paced, the node
    // has 90 ms to spare for each.
    const clip = await makeClip(join(dir, "clip.mp4"), { size: "160x120", frames: 30, rate: 10 });
    const flow = await writeFlow(
      dir,
      ["SlowTrace"],
      videoPipeline(
        "paced-clip",
        `new VideoFileReader({ name: "camera", path: ${JSON.stringify(clip)}, realtime: true })`,
        `new SlowTrace({ name: "slow", delayMs: 10 })`,
        dir,
      ),
    );
    const run = await vf(["run-local", flow, "--state", join(dir, "state"), "--flow-type", "realtime"], {
      cwd: dir,
    });
    assert.equal(run.code, 0, run.text);
    const evicted = evictedAt(run, "slow");
    // Unpaced, most of the 30 are evicted; paced, none or a few (a loaded host can stall the node).
    assert.ok(evicted <= 10, `${evicted} of 30 frames evicted\n${run.stdout}`);
    assert.ok((await sinkLines(join(dir, "out.jsonl"))).length >= 20, run.stdout);
  });
});

Deno.test("a producer far ahead of a stalled node is held back after about a channel's 512 small items, then all arrive once", async () => {
  await inTempDir(async (dir) => {
    const log = join(dir, "made.log");
    const flow = await writeFlow(
      dir,
      ["LoggedReplayableCount", "SlowStart"],
      pipeline(
        "held-back-small",
        `new LoggedReplayableCount({ name: "count", n: 5000, log: ${JSON.stringify(log)}, killAt: 0, ` +
          `pidFile: ${JSON.stringify(join(dir, "never.pid"))} })`,
        `new SlowStart({ name: "slow", delayMs: 3000, producerLog: ${JSON.stringify(log)} })`,
        dir,
      ),
    );
    const run = await vf(["run-local", flow, "--state", join(dir, "state")], { cwd: dir });
    assert.equal(run.code, 0, run.text);
    const values = (await sinkLines(join(dir, "out.jsonl"))).map((line) => line.value);
    const ahead = values.filter((v) => typeof v === "string");
    assert.equal(ahead.length, 1, `one item stalled: ${ahead}`);
    const made = Number(String(ahead[0]).slice("ahead:".length));
    // The channel keeps LOCAL_BATCH_MAX_MSGS unsettled items; the producer also has up to 256 outputs awaiting
    // credit.
    assert.ok(
      made >= LOCAL_BATCH_MAX_MSGS && made <= LOCAL_BATCH_MAX_MSGS + 300,
      `the producer made ${made} items while the first one stalled`,
    );
    const numbers = values.filter((v) => typeof v === "number") as number[];
    assert.deepEqual(numbers.toSorted((a, b) => a - b), range(2, 5000));
  });
});

for (const ordered of [true, false]) {
  Deno.test(
    `a FrameWriter after a stage of 3 replicas writes its frames ${
      ordered
        ? 'in their producer\'s order with ordering: { mode: "sequence" }'
        : "as they finish without it, warned"
    }`,
    async () => {
      await inTempDir(async (dir) => {
        const clip = await makeClip(join(dir, "clip.mp4"), { size: "64x48", frames: 40 });
        const out = join(dir, "stamped.mkv");
        // Each of the 3 replicas takes up to 256 frames at once, so they run apart by up to the whole clip: the
        // horizon covers it.
        const ordering = ordered ? `, ordering: new OrderingPolicy({ mode: "sequence", horizon: 64 })` : "";
        const flow = await writeFlow(
          dir,
          ["StampSeq"],
          [
            `import { FrameWriter, OrderingPolicy, VideoFileReader } from ${JSON.stringify(modUrl)};`,
            `const decode = new VideoFileReader({ name: "decode", path: ${JSON.stringify(clip)} });`,
            `const stamp = new StampSeq({ name: "stamp", nbTasks: 3 }).from(decode);`,
            `const writer = new FrameWriter({ name: "writer", path: ${
              JSON.stringify(out)
            }, fps: 25, codec: "ffv1"${ordering} }).from(stamp);`,
            `export default new Flow([writer], { flowType: "batch", flowId: "ordered-clip" });`,
          ].join("\n"),
        );
        const run = await vf(["run-local", flow, "--state", join(dir, "state")], { cwd: dir });
        assert.equal(run.code, 0, run.text);
        const written = (await decodeAll(out, 16 * 16, "gray")).map((frame) => frame[0]);
        assert.deepEqual(written.toSorted((a, b) => a - b), range(1, 40), `every frame once\n${run.stdout}`);
        if (ordered) {
          assert.deepEqual(written, range(1, 40), `the clip's frames in decode order\n${run.text}`);
          assert.doesNotMatch(run.text, /finish items out of order/);
        } else {
          // As they finished: seldom the decode order, though not never (one replica may take them all).
          assert.match(run.text, /give writer ordering: \{ mode: "sequence" \}/);
        }
      });
    },
  );
}

// ---- 2, 3. the delivery policy ----------------------------------------------------------------------------

Deno.test("a decoder held back by its only consumer ends when that consumer is given up: exit 4, not a hang", async () => {
  await inTempDir(async (dir) => {
    const clip = await makeClip(join(dir, "clip.mp4"), { size: "1280x720", frames: 60 });
    const flow = await writeFlow(
      dir,
      [],
      [
        `import { FrameWriter, VideoFileReader } from ${JSON.stringify(modUrl)};`,
        `const decode = new VideoFileReader({ name: "decode", path: ${JSON.stringify(clip)} });`,
        `const writer = new FrameWriter({ name: "writer", path: ${
          JSON.stringify(join(dir, "out.mp4"))
        }, fps: 25, codec: "nosuchcodec" })`,
        `  .from(decode);`,
        `export default new Flow([writer], { flowType: "batch", flowId: "gone-consumer" });`,
      ].join("\n"),
    );
    const child = startVf(
      ["run-local", flow, "--state", join(dir, "state"), "--channel-max-mib", "64", "--no-restart"],
      { cwd: dir },
    );
    const hung = setTimeout(() => child.kill("SIGKILL"), 60_000);
    const run = await finished(child).finally(() => clearTimeout(hung));
    assert.equal(run.code, 4, run.text);
    assert.match(run.text, /writer\[0\] exited with code 4/);
    assert.equal(summaryRow(run, "decode").state, "done", run.stdout);
    assert.match(summaryRow(run, "writer").drops, /consumer_gone \d+/, run.stdout);
  });
});

Deno.test("a batch flow dead-letters exactly the poison items (VF_POISON, 1 delivery) and sinks all others", async () => {
  await inTempDir(async (dir) => {
    const flow = await writeFlow(
      dir,
      ["Count", "Poison"],
      pipeline(
        "poison-story",
        `new Count({ name: "count", n: 24 })`,
        `new Poison({ name: "poison", poison: [3, 7, 11, 20], nbTasks: 2 })`,
        dir,
      ),
    );
    const state = join(dir, "state");
    const run = await vf(["run-local", flow, "--state", state, "--run-id", "r1"], { cwd: dir });
    assert.equal(run.code, 0, run.text);
    const poison = [3, 7, 11, 20];
    assert.deepEqual(
      await sinkNumbers(join(dir, "out.jsonl")),
      range(1, 24).filter((n) => !poison.includes(n)),
    );
    const letters = await deadLetters(flow, "r1", state, dir);
    assert.deepEqual(
      letters.map((l) => [l.node, l.code, l.deliveries]),
      poison.map(() => ["poison", "VF_POISON", 1]),
    );
    for (const letter of letters) {
      const { traceId } = decodeEnvelope(Uint8Array.fromBase64(letter.envelope_b64));
      assert.equal(
        (letter as DeadLetter & { trace_id?: string }).trace_id,
        traceId,
        "--json names the trace",
      );
    }
    assert.deepEqual(letters.map(deadLetterValue).sort((a, b) => Number(a) - Number(b)), poison);
    for (const letter of letters) {
      const { metadata } = decodeEnvelope(Uint8Array.fromBase64(letter.envelope_b64));
      assert.deepEqual(
        Object.keys(metadata).sort(),
        ["actual_proctime", "proctime"],
        "the producer's timing",
      );
    }
    assert.equal(summaryRow(run, "poison").dlq, 4);
    assert.equal(
      summaryRow(run, "poison").drops,
      "0",
      `a dead letter is counted once, as one:\n${run.stdout}`,
    );
    assert.ok(
      run.stderr.includes(`4 dead letters: \`vf dlq ${flow} --run-id r1 --state ${state}\` lists them`),
      run.stderr,
    );
    const text = await vf(["dlq", flow, "--run-id", "r1", "--state", state], { cwd: dir });
    assert.equal(text.code, 0, text.text);
    assert.match(text.stderr, /^4 dead letters in run r1 of /);
    const rows = text.stdout.split("\n").filter((line) => line !== "");
    assert.equal(rows.length, 4);
    for (const row of rows) {
      assert.match(
        row,
        /^poison {2}VF_POISON {2}trace=count:\d+:(3|7|11|20) {2}deliveries=1 {2}size=\d+B {2}id=dlq:poison-story:r1:poison:\d+ {2}item \1 is poison$/,
      );
    }
  });
});

Deno.test("a batch join whose one parent runs far ahead of the other loses no group (held back, not evicted)", async () => {
  await inTempDir(async (dir) => {
    // The fast parent gets hundreds of halves ahead of the slow one: past the join's max_pending (256).
    const flow = await writeFlow(
      dir,
      ["Count", "Poison", "SlowTrace", "Pair"],
      [
        `const count = new Count({ name: "count", n: 600 });`,
        `const fast = new Poison({ name: "fast", poison: [] }).from(count);`,
        `const slow = new SlowTrace({ name: "slow", delayMs: 2 }).from(count);`,
        `const pair = new Pair({ name: "pair" }).from(fast, slow);`,
        `const sink = new JsonlSink({ name: "sink", path: ${
          JSON.stringify(join(dir, "out.jsonl"))
        } }).from(pair);`,
        `export default new Flow([sink], { flowType: "batch", flowId: "far-ahead" });`,
      ].join("\n"),
    );
    const run = await vf(["run-local", flow, "--state", join(dir, "state")], { cwd: dir });
    assert.equal(run.code, 0, run.text);
    const pairs = (await sinkLines(join(dir, "out.jsonl"))).map((line) => line.value as [number, string]);
    assert.equal(pairs.length, 600, run.stdout);
    assert.ok(
      pairs.every(([n, trace]) => trace.startsWith("count:") && trace.endsWith(`:${n}`)),
      `each pair joins one trace: ${JSON.stringify(pairs.slice(0, 3))}`,
    );
    assert.deepEqual(pairs.map(([n]) => n).sort((a, b) => a - b), range(1, 600));
    assert.equal(summaryRow(run, "pair").drops, "0", run.stdout);
  });
});

Deno.test("a join that fails a group dead-letters every member of it, one letter per parent", async () => {
  await inTempDir(async (dir) => {
    const flow = await writeFlow(
      dir,
      ["Count", "Poison", "PoisonEvenPair"],
      [
        `const count = new Count({ name: "count", n: 20 });`,
        `const left = new Poison({ name: "left", poison: [] }).from(count);`,
        `const right = new Poison({ name: "right", poison: [] }).from(count);`,
        `const pair = new PoisonEvenPair({ name: "pair" }).from(left, right);`,
        `const sink = new JsonlSink({ name: "sink", path: ${
          JSON.stringify(join(dir, "out.jsonl"))
        } }).from(pair);`,
        `export default new Flow([sink], { flowType: "batch", flowId: "join-letters" });`,
      ].join("\n"),
    );
    const state = join(dir, "state");
    const run = await vf(["run-local", flow, "--state", state, "--run-id", "r1"], { cwd: dir });
    assert.equal(run.code, 0, run.text);
    assert.deepEqual(
      await sinkNumbers(join(dir, "out.jsonl")),
      range(1, 20).filter((n) => n % 2 === 1).map((n) => 2 * n),
    );
    // Both parents' streams number their messages from 1: their letters must not share an id.
    const letters = await deadLetters(flow, "r1", state, dir);
    const members = letters.map((letter) => {
      const envelope = decodeEnvelope(Uint8Array.fromBase64(letter.envelope_b64));
      return `${envelope.producerName}:${deadLetterValue(letter)}`;
    }).sort();
    const even = range(1, 20).filter((n) => n % 2 === 0);
    assert.deepEqual(members, [...even.map((n) => `left:${n}`), ...even.map((n) => `right:${n}`)].sort());
    assert.equal(summaryRow(run, "pair").dlq, 20);
  });
});

Deno.test('a join with missing: "error" dead-letters the halves whose partner was dead-lettered upstream: none is left behind', async () => {
  await inTempDir(async (dir) => {
    const flow = await writeFlow(
      dir,
      ["Count", "Poison", "Pair"],
      [
        `import { JoinPolicy } from ${JSON.stringify(modUrl)};`,
        `const count = new Count({ name: "count", n: 20 });`,
        `const left = new Poison({ name: "left", poison: [3, 7] }).from(count);`,
        `const right = new Poison({ name: "right", poison: [] }).from(count);`,
        `const policy = new JoinPolicy({ timeoutSeconds: 0.5, missing: "error" });`,
        `const pair = new Pair({ name: "pair", joinPolicy: policy }).from(left, right);`,
        `const sink = new JsonlSink({ name: "sink", path: ${
          JSON.stringify(join(dir, "out.jsonl"))
        } }).from(pair);`,
        `export default new Flow([sink], { flowType: "batch", flowId: "join-error" });`,
      ].join("\n"),
    );
    const state = join(dir, "state");
    const run = await vf(["run-local", flow, "--state", state, "--run-id", "r1"], {
      cwd: dir,
      env: { VF_MAX_RETRIES: "1" },
    });
    assert.equal(run.code, 0, run.text);
    assert.equal((await sinkLines(join(dir, "out.jsonl"))).length, 18, run.stdout);
    for (const node of ["count", "left", "right", "pair"]) {
      assert.equal(summaryRow(run, node).inFlight, 0, `nothing of ${node}'s left unsettled: ${run.stdout}`);
    }
    assert.equal(summaryRow(run, "pair").dlq, 2, run.stdout);
    const values = (await deadLetters(flow, "r1", state, dir))
      .filter((letter) => letter.node === "pair")
      .map((letter) => deadLetterValue(letter)).sort();
    assert.deepEqual(values, [3, 7], "the right halves of the two items the left dead-lettered");
  });
});

Deno.test("a dead letter whose payload went to the payload store keeps that payload beside the run", async () => {
  await inTempDir(async (dir) => {
    const flow = await writeFlow(
      dir,
      ["Blobs", "RefuseAll"],
      pipeline(
        "blob-letters",
        `new Blobs({ name: "blobs", n: 2, bytes: 4096 })`,
        `new RefuseAll({ name: "refuse" })`,
        dir,
      ),
    );
    const state = join(dir, "state");
    // Payloads above 1,000 bytes are offloaded: the dead letter's envelope holds only a reference.
    const run = await vf(["run-local", flow, "--state", state, "--run-id", "r1"], {
      cwd: dir,
      env: { VIDEOFLOW_MAX_INLINE_PAYLOAD_BYTES: "1000" },
    });
    assert.equal(run.code, 0, run.text);
    const letters = await deadLetters(flow, "r1", state, dir) as (DeadLetter & {
      payload?: { type: string; size: number; file: string | null };
    })[];
    assert.equal(letters.length, 2);
    const runDir = join(state, "blob-letters", "r1");
    const kept = await Promise.all(letters.map(async (letter) => {
      assert.ok(letter.payload?.file, `the payload is kept: ${JSON.stringify(letter.payload)}`);
      const bytes = await Deno.readFile(join(runDir, letter.payload.file));
      assert.equal(bytes.byteLength, letter.payload.size);
      return decodePayload(letter.payload.type, bytes) as Uint8Array;
    }));
    const firsts = kept.map((payload) => payload[0]).sort();
    assert.deepEqual(firsts, [1, 2], "both payloads, whole");
    assert.ok(
      kept.every((payload) => payload.byteLength === 4096 && payload[4095] === (payload[0] + 4095) % 256),
    );
    const text = await vf(["dlq", flow, "--run-id", "r1", "--state", state], { cwd: dir });
    assert.match(text.stdout, /size=\d+B \(offloaded, kept in dead_letter_payloads\/vf-blob-/);
  });
});

for (
  const [flowType, story] of [
    ["batch", "a transient failure is retried and succeeds: every item at the sink once, none dead-lettered"],
    ["realtime", "a realtime node's transient failures are dropped, not dead-lettered: vf dlq lists none"],
  ] as const
) {
  Deno.test(story, async () => {
    await inTempDir(async (dir) => {
      const marks = join(dir, "marks");
      await Deno.mkdir(marks);
      const flow = await writeFlow(
        dir,
        ["Count", "FlakyOnce"],
        pipeline(
          "transient-story",
          `new Count({ name: "count", n: 20, delayMs: ${flowType === "realtime" ? 50 : 0} })`,
          `new FlakyOnce({ name: "flaky", failOn: [2, 9, 15], dir: ${JSON.stringify(marks)} })`,
          dir,
        ),
      );
      const state = join(dir, "state");
      const run = await vf(
        ["run-local", flow, "--state", state, "--run-id", "r1", "--flow-type", flowType],
        { cwd: dir },
      );
      assert.equal(run.code, 0, run.text);
      const failed = [...Deno.readDirSync(marks)].map((entry) => entry.name).sort();
      if (flowType === "batch") {
        assert.deepEqual(failed, ["15.failed", "2.failed", "9.failed"], "each chosen item failed once first");
      } else {
        // A realtime channel may evict a chosen item before the node takes it (on a loaded host).
        assert.ok(failed.length > 0, `a chosen item failed\n${run.stdout}`);
      }
      assert.deepEqual(await deadLetters(flow, "r1", state, dir), []);
      assert.equal(summaryRow(run, "flaky").dlq, 0, run.stdout);
      const arrived = await sinkNumbers(join(dir, "out.jsonl"));
      if (flowType === "batch") {
        assert.deepEqual(arrived, range(1, 20));
        assert.equal(run.text.match(/code=VF_TRANSIENT/g)?.length, 3, run.text);
      } else {
        for (const item of [2, 9, 15]) {
          assert.ok(!arrived.includes(item), `item ${item} was dropped: ${arrived}`);
        }
      }
    });
  });
}

Deno.test("a node in an execution group or with a batching policy is refused at admission (VF_INCOMPATIBLE_PROFILE, exit 2) by validate and run-local: nothing runs", async () => {
  await inTempDir(async (dir) => {
    const out = join(dir, "out.jsonl");
    const flow = await writeFlow(
      dir,
      ["Count", "FusedPass", "BatchedPass"],
      [
        `const count = new Count({ name: "count", n: 5 });`,
        `const fused = new FusedPass({ name: "fused_pass" }).from(count);`,
        `const batched = new BatchedPass({ name: "batched" }).from(fused);`,
        `const sink = new JsonlSink({ name: "sink", path: ${JSON.stringify(out)} }).from(batched);`,
        `export default new Flow([sink], { flowType: "batch", flowId: "refused-profile" });`,
      ].join("\n"),
    );
    const validated = await vf(["validate", flow], { cwd: dir });
    assert.equal(validated.code, 2, validated.text);
    assert.match(validated.stdout, /^error VF_INCOMPATIBLE_PROFILE .*execution group fused \(fused_pass\)/m);
    assert.match(validated.stdout, /^error VF_INCOMPATIBLE_PROFILE batched: .*batching policy/m);
    assert.match(validated.stderr, /flow refused-profile: invalid \(2 errors/);
    const run = await vf(["run-local", flow, "--state", join(dir, "state")], { cwd: dir });
    assert.equal(run.code, 2, run.text);
    assert.match(run.stderr, /VF_INCOMPATIBLE_PROFILE/);
    assert.match(run.stderr, /execution group fused \(fused_pass\) cannot be fused: engine local/);
    assert.match(run.stderr, /node batched declares a batching policy: engine local has no dynamic batching/);
    assert.doesNotMatch(run.text, /running flow/, "nothing started");
    assert.deepEqual(await sinkLines(out), []);
  });
});

Deno.test("items that each fail twice with a transient error and succeed on the third attempt all reach the sink, with the default prefetch: no restarts, no dead letters", async () => {
  await inTempDir(async (dir) => {
    const flow = await writeFlow(
      dir,
      ["Count", "FlakyTimes"],
      pipeline(
        "flaky-story",
        `new Count({ name: "count", n: 20 })`,
        `new FlakyTimes({ name: "model", failures: 2 })`,
        dir,
      ),
    );
    const run = await vf(["run-local", flow, "--state", join(dir, "state")], { cwd: dir });
    assert.equal(run.code, 0, run.text);
    assert.deepEqual(await sinkNumbers(join(dir, "out.jsonl")), range(1, 20));
    assert.doesNotMatch(run.text, /VF_WORKER_UNHEALTHY/);
    const model = summaryRow(run, "model");
    assert.equal(model.restarts, 0, run.stdout);
    assert.equal(model.dlq, 0, run.stdout);
  });
});

Deno.test("a node that fails every item is still taken out by the breaker: VF_WORKER_UNHEALTHY, restarted, given up, exit 4", async () => {
  await inTempDir(async (dir) => {
    const flow = await writeFlow(
      dir,
      ["Count", "FlakyTimes"],
      pipeline(
        "sick-story",
        `new Count({ name: "count", n: 100 })`,
        `new FlakyTimes({ name: "model" })`,
        dir,
      ),
    );
    const run = await vf(["run-local", flow, "--state", join(dir, "state")], {
      cwd: dir,
      env: { VF_MAX_RETRIES: "1" },
    });
    assert.equal(run.code, 4, run.text);
    assert.match(
      run.text,
      /model\[0\] exited with code 4 \(VF_WORKER_UNHEALTHY: model failed \d+ attempts in a row/,
    );
    assert.match(run.text, /model\[0\] gave up after 3 restart\(s\)/);
    assert.equal(summaryRow(run, "model").restarts, 3);
  });
});

// ---- 4. a killed worker -----------------------------------------------------------------------------------

Deno.test("a subprocess replica killed with SIGKILL mid-run is restarted and every item reaches the sink once", async () => {
  await inTempDir(async (dir) => {
    const run = await killVictimMidRun(dir, "kill-story", 30, [], 2);
    assert.equal(summaryRow(run, "victim").restarts, 1);
  });
});

/**
 * Per replica of `node`, what its published tallies in the ledger at `ledger` hold: how many output ids they
 * counted as proven unique, and the ids they name.
 */
async function publishedIds(ledger: string, flowId: string, runId: string, node: string) {
  const store = await FileRuntimeStore.open(ledger);
  try {
    const byReplica = new Map<number, { counted: number; named: Set<string> }>();
    for (const record of await store.scan(`vf/${flowId}/${runId}/${node}/published/`)) {
      const { replica_id, count, message_ids } = JSON.parse(new TextDecoder().decode(record.value));
      const noted = byReplica.get(replica_id) ?? { counted: 0, named: new Set<string>() };
      noted.counted += count;
      for (const id of message_ids) noted.named.add(id);
      byReplica.set(replica_id, noted);
    }
    return byReplica;
  } finally {
    await store.close();
  }
}

Deno.test("a finished run keeps one EOS-7 record per process and side, whatever its item count: what was proven unique is a count", async () => {
  await inTempDir(async (dir) => {
    const items = 2000;
    const state = join(dir, "state");
    const flow = await writeFlow(
      dir,
      ["Count", "SlowPass"],
      pipeline(
        "tally",
        `new Count({ name: "count", n: ${items} })`,
        `new SlowPass({ name: "middle", delayMs: 0 })`,
        dir,
      ),
    );
    const run = await vf(["run-local", flow, "--state", state, "--run-id", "r1"], { cwd: dir });
    assert.equal(run.code, 0, run.text);
    assert.deepEqual(await sinkNumbers(join(dir, "out.jsonl")), range(1, items));
    const store = await FileRuntimeStore.open(join(state, "tally", "r1", "ledger"));
    try {
      const records = (await store.scan("vf/tally/r1/")).filter((r) =>
        /\/(received|published)\//.test(r.key)
      );
      // count's and middle's publications, middle's and sink's receipts: one record each, rewritten.
      assert.equal(records.length, 4, records.map((r) => r.key).join("\n"));
      let named = 0;
      for (const record of records) {
        const { count, message_ids } = JSON.parse(new TextDecoder().decode(record.value));
        assert.equal(count + message_ids.length, items, `${record.key} holds every id once`);
        named += message_ids.length;
      }
      assert.ok(named < items, `${named} ids still named in 4 records of ${items}: the rest were proven`);
    } finally {
      await store.close();
    }
  });
});

Deno.test("a replica killed after its output was noted, whose input its sibling redoes, counts that output once: the run ends", async () => {
  await inTempDir(async (dir) => {
    const marks = join(dir, "marks");
    await Deno.mkdir(marks);
    const state = join(dir, "state");
    const ledger = join(state, "noted-kill", "r1", "ledger");
    const flow = await writeFlow(
      dir,
      ["Count", "DiesOnceNoted", "Poison"],
      [
        // A second between items: each output of `mid` is noted in the ledger before its input is acked.
        `const count = new Count({ name: "count", n: 6, delayMs: 1100 });`,
        `const mid = new DiesOnceNoted({ name: "mid", nbTasks: 2, at: 2, ledger: ${JSON.stringify(ledger)},`,
        `  marks: ${JSON.stringify(marks)}, restartDelayMs: 6000 }).from(count);`,
        `const after = new Poison({ name: "after", poison: [] }).from(mid);`,
        `const sink = new JsonlSink({ name: "sink", path: ${
          JSON.stringify(join(dir, "out.jsonl"))
        } }).from(after);`,
        `export default new Flow([sink], { flowType: "batch", flowId: "noted-kill" });`,
      ].join("\n"),
    );
    const child = startVf(["run-local", flow, "--state", state, "--run-id", "r1", "--isolation", "process"], {
      cwd: dir,
      env: { VF_ACK_WAIT_SECONDS: "2" },
    });
    // Unfixed, `after` waits forever for a 7th distinct output of 6: bounded here, by a forced stop.
    const hung = setTimeout(() => {
      child.kill("SIGTERM");
      setTimeout(() => child.kill("SIGTERM"), 1000);
    }, 90_000);
    const run = await finished(child);
    clearTimeout(hung);
    assert.equal(run.code, 0, run.text);
    assert.match(run.text, /flow noted-kill finished/);
    assert.deepEqual(await sinkNumbers(join(dir, "out.jsonl")), range(1, 6));
    const died = Number(await Deno.readTextFile(join(marks, "died")));
    assert.match(run.text, new RegExp(`mid\\[${died}\\] started \\(restart 1\\)`));
    // The story happened: both replicas noted the output of the input the killed one left.
    const ids = await publishedIds(ledger, "noted-kill", "r1", "mid");
    const none = { counted: 0, named: new Set<string>() };
    const [first, second] = [ids.get(0) ?? none, ids.get(1) ?? none];
    const both = [...first.named].filter((id) => second.named.has(id));
    assert.equal(both.length, 1, `one output noted by both replicas: ${JSON.stringify([...ids])}`);
    assert.equal(first.counted + second.counted + new Set([...first.named, ...second.named]).size, 6);
  });
});

Deno.test("a replica killed after its input was acked counts that input's output: the stage's EOS-7 seqs add up to every item it published", async () => {
  await inTempDir(async (dir) => {
    const marks = join(dir, "marks");
    await Deno.mkdir(marks);
    const state = join(dir, "state");
    const flow = await writeFlow(
      dir,
      ["Count", "DiesAfterAck", "Poison"],
      [
        // Items 150 ms apart: each replica's second output comes within a second of its first.
        `const count = new Count({ name: "count", n: 10, delayMs: 150 });`,
        `const mid = new DiesAfterAck({ name: "mid", nbTasks: 2, at: 3, marks: ${JSON.stringify(marks)} })`,
        `  .from(count);`,
        `const after = new Poison({ name: "after", poison: [] }).from(mid);`,
        `const sink = new JsonlSink({ name: "sink", path: ${
          JSON.stringify(join(dir, "out.jsonl"))
        } }).from(after);`,
        `export default new Flow([sink], { flowType: "batch", flowId: "acked-kill" });`,
      ].join("\n"),
    );
    const run = await vf(["run-local", flow, "--state", state, "--run-id", "r1", "--isolation", "process"], {
      cwd: dir,
    });
    assert.equal(run.code, 0, run.text);
    assert.deepEqual(await sinkNumbers(join(dir, "out.jsonl")), range(1, 10));
    const died = Number(await Deno.readTextFile(join(marks, "died")));
    assert.match(run.text, new RegExp(`mid\\[${died}\\] started \\(restart 1\\)`));
    // What each replica's terminator announces is its tally: together they must count all 10 outputs.
    const ids = await publishedIds(join(state, "acked-kill", "r1", "ledger"), "acked-kill", "r1", "mid");
    const none = { counted: 0, named: new Set<string>() };
    const [first, second] = [ids.get(0) ?? none, ids.get(1) ?? none];
    assert.equal(
      first.counted + second.counted + new Set([...first.named, ...second.named]).size,
      10,
      JSON.stringify([...ids].map(([replica, { counted, named }]) => [replica, counted, [...named]])),
    );
  });
});

for (const isolation of ["worker", "process"]) {
  Deno.test(`a fault schedule in vf's environment crashes a replica mid-run: restarted, no item lost (${isolation})`, async () => {
    await inTempDir(async (dir) => {
      const flow = await writeFlow(
        dir,
        ["Count", "Poison"],
        pipeline(
          "fault-story",
          `new Count({ name: "count", n: 30 })`,
          `new Poison({ name: "middle", poison: [] })`,
          dir,
        ),
      );
      // The 12th input any replica is about to process crashes that replica (a SIGKILL of itself).
      const schedule = new FaultSchedule({ [Barrier.nodeProcessBefore]: nth(12, crash()) }, {
        markerDir: join(dir, "markers"),
      });
      const run = await vf(
        ["run-local", flow, "--state", join(dir, "state"), "--isolation", isolation],
        { cwd: dir, env: { ...schedule.toEnv(), VF_ACK_WAIT_SECONDS: "2" } },
      );
      schedule.assertAllFired();
      assert.equal(run.code, 0, run.text);
      assert.match(run.text, /(middle|sink)\[0\] exited with code 137/);
      assert.match(run.text, /(middle|sink)\[0\] started \(restart 1\)/);
      assert.doesNotMatch(run.text, /went silent/, "the crash is reported, not guessed from silence");
      assert.deepEqual(await sinkNumbers(join(dir, "out.jsonl")), range(1, 30));
    });
  });
}

Deno.test("a partitioned node counts both what it processed and what it dropped for want of a key, every one", async () => {
  await inTempDir(async (dir) => {
    const flow = await writeFlow(
      dir,
      ["HalfKeyedCount", "Poison"],
      pipeline(
        "keyed-drops",
        `new HalfKeyedCount({ name: "count", n: 200 })`,
        `new Poison({ name: "middle", poison: [], nbTasks: 2, partitionBy: "_partition_key" })`,
        dir,
      ),
    );
    const run = await vf(["run-local", flow, "--state", join(dir, "state")], { cwd: dir });
    assert.equal(run.code, 0, run.text);
    // Drops and processed inputs interleave: every drop must reach the summary, not only those after the last input.
    const middle = summaryRow(run, "middle");
    assert.equal(middle.processed, 100, run.stdout);
    assert.equal(middle.drops, "0", run.stdout);
    assert.equal(middle.dlq, 100, `each unkeyed input is a dead letter, counted once:\n${run.stdout}`);
    assert.deepEqual(await sinkNumbers(join(dir, "out.jsonl")), range(1, 200).filter((x) => x % 2 === 1));
  });
});

Deno.test("a partitionBy field no item carries: each dead letter names the field and the item's fields, and the summary says no item passed", async () => {
  await inTempDir(async (dir) => {
    const flow = await writeFlow(
      dir,
      ["Count", "Poison"],
      pipeline(
        "absent-key",
        `new Count({ name: "count", n: 6 })`,
        `new Poison({ name: "middle", poison: [], nbTasks: 2, partitionBy: "camera_id" })`,
        dir,
      ),
    );
    const state = join(dir, "state");
    const run = await vf(["run-local", flow, "--state", state, "--run-id", "r1"], { cwd: dir });
    assert.equal(run.code, 0, run.text);
    const letters = await deadLetters(flow, "r1", state, dir);
    assert.equal(letters.length, 6, run.text);
    for (const letter of letters as (DeadLetter & { error: string })[]) {
      assert.equal(letter.code, "VF_POISON_PARTITION_KEY");
      assert.match(
        letter.error,
        /^unusable partition key \(absent\): the item has no field "camera_id" \(partitionBy\), and has metadata fields actual_proctime, proctime;/,
      );
    }
    assert.match(
      run.stdout,
      /^no item passed middle: all 6 of its dead letters are VF_POISON_PARTITION_KEY \(unusable partition key \(absent\): the item has no field "camera_id"/m,
    );
    assert.doesNotMatch(run.stdout, /^no item passed (count|sink)/m);
    assert.equal(summaryRow(run, "middle").dlq, 6);
  });
});

Deno.test("a producer whose close() fails after its stream ended is not run again: every item once, exit 4", async () => {
  await inTempDir(async (dir) => {
    const flow = await writeFlow(
      dir,
      ["CountFailingClose", "Poison"],
      pipeline(
        "close-story",
        `new CountFailingClose({ name: "count", n: 5 })`,
        `new Poison({ name: "middle", poison: [] })`,
        dir,
      ),
    );
    const run = await vf(["run-local", flow, "--state", join(dir, "state")], { cwd: dir });
    assert.equal(run.code, 4, run.text);
    assert.match(
      run.text,
      /count\[0\] gave up after 0 restart\(s\): VF_RUNTIME: the count could not be closed/,
    );
    assert.match(run.text, /count\[0\] had ended its stream: not run again, the flow goes on/);
    assert.deepEqual(await sinkNumbers(join(dir, "out.jsonl")), range(1, 5));
    assert.equal(summaryRow(run, "count").processed, 5);
    assert.equal(summaryRow(run, "sink").state, "done");
  });
});

Deno.test("a replica that dies on every launch, whatever the item, is restarted with backoff until its budget is spent, then the run exits 4 (the restart after an item's last delivery is the item's, not the replica's)", async () => {
  await inTempDir(async (dir) => {
    const flow = await writeFlow(
      dir,
      ["Count", "ExitAt"],
      pipeline(
        "doomed-story",
        `new Count({ name: "count", n: 5 })`,
        `new ExitAt({ name: "doomed", at: 2, code: 9, onward: true })`,
        dir,
      ),
    );
    const run = await vf(["run-local", flow, "--state", join(dir, "state")], {
      cwd: dir,
      env: { VF_ACK_WAIT_SECONDS: "1" },
    });
    assert.equal(run.code, 4, run.text);
    for (const restart of [1, 2, 3, 4]) {
      assert.match(run.text, new RegExp(`doomed\\[0\\] started \\(restart ${restart}\\)`));
    }
    assert.match(
      run.text,
      /doomed\[0\] exited with code 4 \(VF_WORKER_FATAL: the replica exited with status 9 before/,
    );
    assert.match(run.text, /doomed\[0\] gave up after 4 restart\(s\)/);
    assert.doesNotMatch(run.text, /started \(restart 5\)/);
    const doomed = summaryRow(run, "doomed");
    assert.equal(doomed.state, "failed");
    assert.equal(doomed.restarts, 4, "3 of its own, and the one after item 2's fourth and last delivery");
    assert.equal(doomed.dlq, 1, "item 2, dead-lettered once its deliveries were spent");
  });
});

Deno.test("a replica whose node code calls Deno.exit(0) or Deno.exit(143) mid-stream has failed (not finished, not a signal): restarted, then given up, exit 4 (both isolations)", async () => {
  for (const isolation of ["worker", "process"]) {
    await inTempDir(async (dir) => {
      const flow = await writeFlow(
        dir,
        ["Count", "ExitAt"],
        pipeline(
          "exit-zero-story",
          `new Count({ name: "count", n: 5 })`,
          `new ExitAt({ name: "quitter", at: 2, code: ${isolation === "worker" ? 0 : 143}, onward: true })`,
          dir,
        ),
      );
      const run = await vf(["run-local", flow, "--state", join(dir, "state"), "--isolation", isolation], {
        cwd: dir,
        env: { VF_ACK_WAIT_SECONDS: "1" },
      });
      assert.equal(run.code, 4, run.text);
      assert.match(
        run.text,
        /quitter\[0\] exited with code 4 \(VF_WORKER_FATAL: the replica exited with status (0|143) before its task ended/,
      );
      assert.match(run.text, /quitter\[0\] gave up after 4 restart\(s\)/);
      assert.equal(summaryRow(run, "quitter").state, "failed", isolation);
      assert.equal(summaryRow(run, "quitter").drops, "0", "a run that ends keeps its inputs: none dropped");
    });
  }
});

Deno.test("a producer whose close() calls Deno.exit after its stream ended is not run again: every item once", async () => {
  await inTempDir(async (dir) => {
    const flow = await writeFlow(
      dir,
      ["CountExitingOnClose", "SlowTrace"],
      pipeline(
        "exit-on-close",
        `new CountExitingOnClose({ name: "count", n: 5 })`,
        `new SlowTrace({ name: "slow", delayMs: 200 })`,
        dir,
      ),
    );
    const run = await vf(["run-local", flow, "--state", join(dir, "state")], { cwd: dir });
    assert.match(run.text, /count\[0\] had ended its stream: not run again/);
    assert.equal((await sinkLines(join(dir, "out.jsonl"))).length, 5, run.text);
    assert.equal(summaryRow(run, "count").restarts, 0);
  });
});

Deno.test("a partitioned stateful node killed mid-run restores its checkpoint: every replica's totals stay exact (process)", async () => {
  await inTempDir(async (dir) => {
    const pidFile = join(dir, "victim.pid");
    const flow = await writeFlow(
      dir,
      ["Count", "RunningTotal"],
      pipeline(
        "checkpoint-story",
        `new Count({ name: "count", n: 40, delayMs: 5 })`,
        `new RunningTotal({ name: "total", nbTasks: 2, partitionBy: "trace_id", killAt: 25, ` +
          `pidFile: ${JSON.stringify(pidFile)} })`,
        dir,
      ),
    );
    const child = startVf(["run-local", flow, "--state", join(dir, "state"), "--isolation", "process"], {
      cwd: dir,
      env: { VF_ACK_WAIT_SECONDS: "2" },
    });
    const pid = Number(await waitForFile(pidFile, child));
    Deno.kill(pid, "SIGKILL");
    const run = await finished(child);
    assert.equal(run.code, 0, run.text);
    assert.match(run.text, /total\[\d\] started \(restart 1\)/);
    const outputs = (await sinkLines(join(dir, "out.jsonl"))).map((line) => line.value as number[]);
    assert.deepEqual(outputs.map(([, item]) => item).sort((a, b) => a - b), range(1, 40));
    const replicas = new Set(outputs.map(([replica]) => replica));
    assert.deepEqual([...replicas].sort(), [0, 1], "both partitions took items");
    for (const replica of replicas) {
      let sum = 0;
      for (const [, item, total] of outputs.filter(([r]) => r === replica).sort((a, b) => a[1] - b[1])) {
        sum += item;
        assert.equal(total, sum, `replica ${replica}'s total after item ${item}`);
      }
    }
  });
});

// ---- 5, 6, 7. failures that end the run -------------------------------------------------------------------

Deno.test("a producer failing with the author's mistake ends every downstream node with ABORT, and the run exits 2", async () => {
  await inTempDir(async (dir) => {
    const flow = await writeFlow(
      dir,
      ["Count", "Poison"],
      pipeline(
        "user-abort-story",
        `new Count({ name: "count", n: 20, misconfiguredAt: 8 })`,
        `new Poison({ name: "middle", poison: [] })`,
        dir,
      ),
    );
    const run = await vf(["run-local", flow, "--state", join(dir, "state")], { cwd: dir });
    assert.equal(run.code, 2, run.text);
    assert.match(run.text, /count\[0\] exited with code 2 \(VF_CONFIG: count has no setting for item 8\)/);
    assert.doesNotMatch(run.text, /ended without telling its children/);
    for (const replica of ["middle\\[0\\]", "sink\\[0\\]"]) {
      assert.match(
        run.text,
        new RegExp(`${replica} exited with code 4 \\(VF_UPSTREAM_ABORTED: .*origin count`),
      );
    }
    // An ABORT is handed on as soon as it arrives (it does not wait for the data ahead of it): the sink
    // holds some of what the producer made before it failed, each once, and nothing after.
    const numbers = await sinkNumbers(join(dir, "out.jsonl"));
    assert.ok(numbers.every((n, i) => n === i + 1 && n <= 7), `at the sink: ${numbers}`);
    assert.equal(summaryRow(run, "sink").processed, numbers.length, "what the aborted sink took is counted");
  });
});

Deno.test("a producer that throws ends every downstream node with ABORT and the run exits 4", async () => {
  await inTempDir(async (dir) => {
    const flow = await writeFlow(
      dir,
      ["Count", "Poison"],
      pipeline(
        "abort-story",
        `new Count({ name: "count", n: 20, throwAt: 8 })`,
        `new Poison({ name: "middle", poison: [], nbTasks: 2 })`,
        dir,
      ),
    );
    const run = await vf(["run-local", flow, "--state", join(dir, "state")], { cwd: dir });
    assert.equal(run.code, 4, run.text);
    assert.match(run.text, /count\[0\] exited with code 4 \(VF_RUNTIME: count broke at item 8\)/);
    assert.match(run.text, /count\[0\] gave up after 0 restart\(s\)/, "its ABORT is not undone by a restart");
    for (const replica of ["middle[0]", "middle[1]", "sink[0]"]) {
      const escaped = replica.replace(/[[\]]/g, "\\$&");
      assert.match(
        run.text,
        new RegExp(`${escaped} exited with code 4 \\(VF_UPSTREAM_ABORTED: .*origin count`),
      );
    }
    for (const node of ["count", "middle", "sink"]) assert.equal(summaryRow(run, node).state, "failed");
  });
});

/** `count` (1..10) → `hang` (never returns from item 4) → sink. */
function hangingFlow(dir: string, flowId: string): Promise<string> {
  const count = `new Count({ name: "count", n: 10 })`;
  return writeFlow(
    dir,
    ["Count", "HangAt"],
    pipeline(flowId, count, `new HangAt({ name: "hang", at: 4 })`, dir),
  );
}

Deno.test("a node that hangs on every item, restarted, still runs out of restarts and the run exits 5 (the restart after an item's last delivery is the item's)", async () => {
  await inTempDir(async (dir) => {
    const flow = await writeFlow(
      dir,
      ["Count", "HangAt"],
      pipeline(
        "wedged-story",
        `new Count({ name: "count", n: 6 })`,
        `new HangAt({ name: "hang", at: 2, onward: true })`,
        dir,
      ),
    );
    const run = await vf(["run-local", flow, "--state", join(dir, "state")], {
      cwd: dir,
      env: { VF_PROGRESS_TIMEOUT_SECONDS: "1", VF_WATCHDOG_INTERVAL_SECONDS: "0.2" },
    });
    assert.equal(run.code, 5, run.text);
    assert.match(run.text, /hang\[0\] exited with code 5 \(VF_PROGRESS_STALLED: node hang acked nothing/);
    assert.match(run.text, /hang\[0\] gave up after 4 restart\(s\)/);
    assert.deepEqual(await sinkNumbers(join(dir, "out.jsonl")), [1]);
    const hang = summaryRow(run, "hang");
    assert.equal(hang.restarts, 4, "3 of its own, and the one after item 2's fourth and last delivery");
    assert.equal(hang.dlq, 1, "item 2, dead-lettered once its deliveries were spent");
  });
});

for (const isolation of ["worker", "process"]) {
  Deno.test(`a node that hangs in process trips the watchdog and the run exits 5 (${isolation} isolation)`, async () => {
    await inTempDir(async (dir) => {
      const flow = await hangingFlow(dir, "hang-story");
      const run = await vf(
        ["run-local", flow, "--state", join(dir, "state"), "--isolation", isolation, "--no-restart"],
        { cwd: dir, env: { VF_PROGRESS_TIMEOUT_SECONDS: "1", VF_WATCHDOG_INTERVAL_SECONDS: "0.2" } },
      );
      assert.equal(run.code, 5, run.text);
      assert.match(run.text, /hang\[0\] exited with code 5 \(VF_PROGRESS_STALLED: node hang acked nothing/);
      assert.doesNotMatch(run.text, /went silent/, "the stall is reported, not guessed from silence");
      assert.deepEqual(await sinkNumbers(join(dir, "out.jsonl")), [1, 2, 3]);
    });
  });
}

const KILLER_ITEMS = {
  hang: {
    what: "hangs in process",
    node: `new HangAt({ name: "bad", at: 3 })`,
    code: "VF_POISON_REPLICA_STALLED",
  },
  exit: {
    what: "calls Deno.exit",
    node: `new ExitAt({ name: "bad", at: 3, code: 9 })`,
    code: "VF_POISON_REPLICA_CRASHED",
  },
} as const;

/**
 * The stories of an item (3 of 1..6) that kills or wedges its replica on every delivery, under `isolation`
 * with `VF_MAX_RETRIES` at `maxRetries` (null: the default, 3).
 */
const killerStories: [isolation: string, kind: keyof typeof KILLER_ITEMS, maxRetries: number | null][] = [
  ["worker", "hang", 1],
  ["worker", "exit", 1],
  ["process", "hang", 1],
  ["process", "exit", 1],
  ["worker", "hang", null],
  ["process", "exit", null],
];
for (const [isolation, kind, maxRetries] of killerStories) {
  const story = KILLER_ITEMS[kind];
  const deliveries = (maxRetries ?? 3) + 1;
  const budget = maxRetries === null ? "the default budgets" : `VF_MAX_RETRIES=${maxRetries}`;
  Deno.test(`an item that ${story.what} on every delivery is dead-lettered as ${story.code} after its ${deliveries} deliveries; every other item reaches the sink and the run finishes (${budget}, ${isolation} isolation)`, async () => {
    await inTempDir(async (dir) => {
      const flow = await writeFlow(
        dir,
        ["Count", "HangAt", "ExitAt"],
        pipeline("killer-story", `new Count({ name: "count", n: 6 })`, story.node, dir),
      );
      const state = join(dir, "state");
      const retries: Record<string, string> = maxRetries === null
        ? {}
        : { VF_MAX_RETRIES: String(maxRetries) };
      const run = await vf(
        ["run-local", flow, "--state", state, "--run-id", "r1", "--isolation", isolation],
        {
          cwd: dir,
          env: { ...retries, VF_PROGRESS_TIMEOUT_SECONDS: "1", VF_WATCHDOG_INTERVAL_SECONDS: "0.2" },
        },
      );
      assert.equal(run.code, 0, run.text);
      assert.deepEqual(await sinkNumbers(join(dir, "out.jsonl")), [1, 2, 4, 5, 6]);
      const bad = summaryRow(run, "bad");
      assert.equal(bad.restarts, deliveries, "a launch per delivery, then one that goes on without the item");
      assert.equal(bad.dlq, 1, run.stdout);
      const letters = await deadLetters(flow, "r1", state, dir);
      assert.deepEqual(letters.map((l) => [l.node, l.code, l.deliveries]), [["bad", story.code, deliveries]]);
      assert.equal(deadLetterValue(letters[0]), 3);
    });
  });
}

for (const isolation of ["worker", "process"]) {
  Deno.test(`a best-effort node's item that kills its replica is given up as the poison it is, sampled into the DLQ after its one delivery: the run finishes (${isolation} isolation)`, async () => {
    await inTempDir(async (dir) => {
      const flow = await writeFlow(
        dir,
        ["Count", "ExitAt"],
        pipeline(
          "best-effort-death-story",
          `new Count({ name: "count", n: 6 })`,
          `new ExitAt({ name: "bad", at: 3, code: 9, delivery: "best-effort" })`,
          dir,
        ),
      );
      const state = join(dir, "state");
      // Unfixed, the item is stranded at the broker after its one delivery and the run waits for it.
      const run = await vf(
        ["run-local", flow, "--state", state, "--run-id", "r1", "--isolation", isolation],
        { cwd: dir, env: { VF_PROGRESS_TIMEOUT_SECONDS: "8" } },
      );
      assert.equal(run.code, 0, run.text);
      assert.deepEqual(await sinkNumbers(join(dir, "out.jsonl")), [1, 2, 4, 5, 6]);
      const letters = await deadLetters(flow, "r1", state, dir);
      assert.deepEqual(
        letters.map((l) => [l.node, l.code, l.deliveries]),
        [["bad", "VF_POISON_REPLICA_CRASHED", 1]],
      );
      assert.equal(deadLetterValue(letters[0]), 3);
      assert.equal(summaryRow(run, "bad").restarts, 1, "the death's restart, then the next item");
    });
  });
}

for (const isolation of ["worker", "process"]) {
  Deno.test(`an item that kills whichever of three replicas takes it gets its budget of deliveries, not one more: the sibling that takes it at once sees the death counted (${isolation} isolation)`, async () => {
    await inTempDir(async (dir) => {
      const flow = await writeFlow(
        dir,
        ["Count", "ExitAt"],
        pipeline(
          "sibling-death-story",
          `new Count({ name: "count", n: 3 })`,
          `new ExitAt({ name: "bad", at: 3, code: 9, nbTasks: 3 })`,
          dir,
        ),
      );
      const state = join(dir, "state");
      const run = await vf(
        ["run-local", flow, "--state", state, "--run-id", "r1", "--isolation", isolation],
        { cwd: dir, env: { VF_MAX_RETRIES: "1" } },
      );
      assert.equal(run.code, 0, run.text);
      assert.deepEqual(await sinkNumbers(join(dir, "out.jsonl")), [1, 2]);
      const letters = await deadLetters(flow, "r1", state, dir);
      assert.deepEqual(
        letters.map((l) => [l.node, l.code, l.deliveries]),
        [["bad", "VF_POISON_REPLICA_CRASHED", 2]],
        run.text,
      );
      assert.equal(summaryRow(run, "bad").restarts, 2, "a launch per delivery that killed its replica");
    });
  });
}

for (const isolation of ["worker", "process"]) {
  Deno.test(`a node that blocks its event loop in process is stopped as stalled when it goes silent, exit 5 (${isolation} isolation)`, async () => {
    await inTempDir(async (dir) => {
      const flow = await writeFlow(
        dir,
        ["Count", "SpinAt"],
        pipeline(
          "spin-story",
          `new Count({ name: "count", n: 10 })`,
          `new SpinAt({ name: "spin", at: 4 })`,
          dir,
        ),
      );
      const run = await vf(
        ["run-local", flow, "--state", join(dir, "state"), "--isolation", isolation, "--no-restart"],
        { cwd: dir, env: { VF_PROGRESS_TIMEOUT_SECONDS: "1" } },
      );
      assert.equal(run.code, 5, run.text);
      assert.match(
        run.text,
        /spin\[0\] exited with code 5 \(VF_PROGRESS_STALLED: node spin replica 0 went silent for 10 s/,
      );
    });
  });
}

Deno.test("--flow-type realtime runs a flow freshest-wins, and the summary counts what the broker evicted", async () => {
  await inTempDir(async (dir) => {
    const flow = await writeFlow(
      dir,
      ["Count", "SlowTrace"],
      pipeline(
        "evict-story",
        `new Count({ name: "count", n: 20 })`,
        `new SlowTrace({ name: "slow", delayMs: 100 })`,
        dir,
      ),
    );
    const run = await vf(["run-local", flow, "--state", join(dir, "state"), "--flow-type", "realtime"], {
      cwd: dir,
    });
    assert.equal(run.code, 0, run.text);
    assert.match(run.text, /running flow evict-story \(realtime\)/);
    const slow = summaryRow(run, "slow");
    const evicted = evictedAt(run, "slow");
    assert.ok(evicted > 0, `a slow node behind a one-message channel loses outputs: drops "${slow.drops}"`);
    const arrived = (await sinkLines(join(dir, "out.jsonl"))).length;
    assert.ok(arrived < 20, `${arrived} of 20 reached the sink`);
    assert.equal(summaryRow(run, "count").processed, 20);
    // An item evicted while the slow node held it is processed, not dropped: each item is one or the other.
    assert.equal(slow.processed + evicted, 20, run.stdout);
  });
});

Deno.test("a realtime flow's producer waits until every other replica opened: a node loading for 5.5 s loses none of a paced stream, and the wait is named", async () => {
  await inTempDir(async (dir) => {
    const flow = await writeFlow(
      dir,
      ["Count", "SlowOpen"],
      pipeline(
        "slow-open-story",
        // Paced at 10/s: a live_latest channel keeps one item, so a faster pace would lose items to a loaded
        // host's hiccups, not to the slow open this story is about.
        `new Count({ name: "count", n: 20, delayMs: 100 })`,
        `new SlowOpen({ name: "model", openMs: 5500 })`,
        dir,
      ),
    );
    const run = await vf(["run-local", flow, "--state", join(dir, "state"), "--flow-type", "realtime"], {
      cwd: dir,
    });
    assert.equal(run.code, 0, run.text);
    assert.equal(summaryRow(run, "model").drops, "0", run.stdout);
    assert.deepEqual(await sinkNumbers(join(dir, "out.jsonl")), range(1, 20));
    assert.match(run.stdout, /count +waiting/, "the producer is shown waiting while the model loads");
    assert.match(run.text, /the producers wait for model\[0\] to open/);
    assert.match(run.stdout, /model +starting/, "a node still opening is shown starting, not running");
  });
});

Deno.test("a stop while a node's open() never returns ends the run within the grace, naming the node (exit 4), instead of waiting on it", async () => {
  await inTempDir(async (dir) => {
    const flow = await writeFlow(
      dir,
      ["Count", "SlowOpen"],
      pipeline(
        "hung-open",
        `new Count({ name: "count", n: 20, delayMs: 100 })`,
        `new SlowOpen({ name: "model", openMs: 3_600_000 })`,
        dir,
      ),
    );
    const child = startVf(["run-local", flow, "--state", join(dir, "state"), "--flow-type", "realtime"], {
      cwd: dir,
    });
    await new Promise((resolve) => setTimeout(resolve, 3000));
    const stoppedAt = performance.now();
    child.kill("SIGTERM");
    const run = await finished(child);
    const seconds = (performance.now() - stoppedAt) / 1000;
    assert.equal(run.code, 4, run.text);
    assert.match(
      run.text,
      new RegExp(`model\\[0\\] still opening ${STOP_OPENING_GRACE_SECONDS} s after the stop`),
    );
    assert.ok(seconds < STOP_OPENING_GRACE_SECONDS + 15, `ended ${seconds.toFixed(0)} s after the stop`);
  });
});

Deno.test("a realtime node partitioned over 3 replicas counts each item once: processed or evicted", async () => {
  await inTempDir(async (dir) => {
    const flow = await writeFlow(
      dir,
      ["Count", "SlowTrace"],
      pipeline(
        "evict-partitioned",
        `new Count({ name: "count", n: 30 })`,
        `new SlowTrace({ name: "slow", delayMs: 100, nbTasks: 3, partitionBy: "trace_id" })`,
        dir,
      ),
    );
    const run = await vf(["run-local", flow, "--state", join(dir, "state"), "--flow-type", "realtime"], {
      cwd: dir,
    });
    assert.equal(run.code, 0, run.text);
    const slow = summaryRow(run, "slow");
    const evicted = evictedAt(run, "slow");
    assert.ok(evicted > 0, `drops "${slow.drops}"`);
    // Each replica's subscription sees every item; an evicted item is a drop for its owner only.
    assert.equal(slow.processed + evicted, 30, run.stdout);
  });
});

for (const isolation of ["worker", "process"]) {
  Deno.test(`a node reads the environment variable it declared from vf's environment (${isolation} isolation)`, async () => {
    await inTempDir(async (dir) => {
      const flow = await writeFlow(
        dir,
        ["Count", "ReadsEnv"],
        pipeline(
          "env-story",
          `new Count({ name: "count", n: 2 })`,
          `new ReadsEnv({ name: "token", variable: "STORY_TOKEN", peek: "VF_EMBEDDED_BROKER_SECRET" })`,
          dir,
        ),
      );
      const run = await vf(["run-local", flow, "--state", join(dir, "state"), "--isolation", isolation], {
        cwd: dir,
        env: { STORY_TOKEN: "s3cret" },
      });
      assert.equal(run.code, 0, run.text);
      const values = (await sinkLines(join(dir, "out.jsonl"))).map((line) => line.value).sort();
      assert.deepEqual(values, [
        "1=s3cret;VF_EMBEDDED_BROKER_SECRET:refused",
        "2=s3cret;VF_EMBEDDED_BROKER_SECRET:refused",
      ], "the declared variable is read; the replica's own settings are not the node's to read");
    });
  });
}

Deno.test("a process replica runs under the project's V8 heap flags, then vf's DENO_V8_FLAGS, the user's winning", async () => {
  const semiSpaceMib = Number(/^--max-semi-space-size=(\d+)$/m.exec(V8_HEAP_FLAGS.join("\n"))?.[1]);
  assert.ok(semiSpaceMib > 0, `V8_HEAP_FLAGS bounds the semi-space: ${V8_HEAP_FLAGS}`);
  // heap_size_limit is the old generation's limit plus three semi-spaces (two, and the large-object one).
  for (
    const [flags, limitMib] of [
      ["--max-old-space-size=1000", 1000 + 3 * semiSpaceMib],
      ["--max-old-space-size=1000,--max-semi-space-size=2", 1006],
    ] as const
  ) {
    await inTempDir(async (dir) => {
      const flow = await writeFlow(
        dir,
        ["Count", "HeapLimit"],
        pipeline(
          "v8-flags-story",
          `new Count({ name: "count", n: 2 })`,
          `new HeapLimit({ name: "limit" })`,
          dir,
        ),
      );
      const run = await vf(["run-local", flow, "--state", join(dir, "state"), "--isolation", "process"], {
        cwd: dir,
        env: { DENO_V8_FLAGS: flags },
      });
      assert.equal(run.code, 0, run.text);
      const values = (await sinkLines(join(dir, "out.jsonl"))).map((line) => line.value).sort();
      assert.deepEqual(values, [`1:${limitMib}`, `2:${limitMib}`], `under DENO_V8_FLAGS=${flags}`);
    });
  }
});

for (const isolation of ["worker", "process"]) {
  Deno.test(`a FunctionProcessorNode applies a function the flow file exports (${isolation} isolation)`, async () => {
    await inTempDir(async (dir) => {
      const flow = await writeFlow(
        dir,
        ["Count"],
        [
          `import { FunctionProcessorNode } from ${JSON.stringify(modUrl)};`,
          `export function triple(x: number): number { return 3 * x; }`,
          pipeline(
            "function-story",
            `new Count({ name: "count", n: 10 })`,
            'new FunctionProcessorNode({ name: "triple", fn: `${import.meta.url}#triple` })',
            dir,
          ),
        ].join("\n"),
      );
      const run = await vf(["run-local", flow, "--state", join(dir, "state"), "--isolation", isolation], {
        cwd: dir,
      });
      assert.equal(run.code, 0, run.text);
      assert.deepEqual(await sinkNumbers(join(dir, "out.jsonl")), range(1, 10).map((n) => 3 * n));
    });
  });
}

for (const isolation of ["worker", "process"]) {
  Deno.test(`a flow file whose top level reads what its nodes did not declare fails at once, exit 2 (${isolation} isolation)`, async () => {
    await inTempDir(async (dir) => {
      const flow = await writeFlow(
        dir,
        ["Count", "Poison"],
        [
          `const LIMIT = Number(Deno.env.get("VF_E2E_UNDECLARED") ?? "5");`,
          pipeline(
            "top-level-story",
            `new Count({ name: "count", n: LIMIT })`,
            `new Poison({ name: "middle", poison: [] })`,
            dir,
          ),
        ].join("\n"),
      );
      const run = await vf(["run-local", flow, "--state", join(dir, "state"), "--isolation", isolation], {
        cwd: dir,
      });
      assert.equal(run.code, 2, run.text);
      assert.match(
        run.text,
        /VF_NODE_CONTRACT: node \w+ needs env permission for "VF_E2E_UNDECLARED" at the top level of its module/,
      );
      assert.match(run.text, /static permissions = \{ env: \["VF_E2E_UNDECLARED"\] \}/);
      assert.match(run.text, /gave up after 0 restart\(s\)/, "a contract error is not restarted");
    });
  });
}

Deno.test("a flow of another project, run with that project's deno.json, resolves its import map in every isolation; worker isolation without --unstable-worker-options is refused, exit 2", async () => {
  await inTempDir(async (dir) => {
    const config = join(dir, "deno.json");
    await Deno.writeTextFile(config, JSON.stringify({ imports: { videoflow: modUrl } }));
    await Deno.writeTextFile(
      join(dir, "flow.ts"),
      [
        `import { Flow, JsonlSink } from "videoflow";`,
        `import { Count } from ${JSON.stringify(storyNodesUrl)};`,
        `export { Count };`,
        `const count = new Count({ name: "count", n: 20 });`,
        `const sink = new JsonlSink({ name: "sink", path: ${
          JSON.stringify(join(dir, "out.jsonl"))
        } }).from(count);`,
        `export default new Flow([sink], { flowType: "batch", flowId: "own-config" });`,
      ].join("\n"),
    );
    const run = (denoFlags: readonly string[], vfArgs: readonly string[]) =>
      finished(
        new Deno.Command(Deno.execPath(), {
          args: ["run", "-A", ...denoFlags, modPath, "run-local", "flow.ts", "--state", "state", ...vfArgs],
          cwd: dir,
          env: { NO_COLOR: "1" },
          stdin: "null",
          stdout: "piped",
          stderr: "piped",
        }).spawn(),
      );
    const refused = await run(["--config", "deno.json"], ["--run-id", "w"]);
    assert.equal(refused.code, 2, refused.text);
    assert.match(refused.stderr, /VF_CONFIG: worker isolation .* --unstable-worker-options/);
    assert.match(refused.stderr, /remedy: .*--isolation process/);
    assert.equal(await Deno.stat(join(dir, "state")).then(() => true, () => false), false, "nothing started");
    const inProcesses = await run(["--config", "deno.json"], ["--run-id", "p", "--isolation", "process"]);
    assert.equal(inProcesses.code, 0, inProcesses.text);
    const inWorkers = await run(["--config=deno.json", "--unstable-worker-options"], ["--run-id", "w"]);
    assert.equal(inWorkers.code, 0, inWorkers.text);
    const numbers = (await sinkLines(join(dir, "out.jsonl"))).map((line) => line.value as number);
    assert.deepEqual(numbers.sort((a, b) => a - b), [...Array(20)].flatMap((_, i) => [i + 1, i + 1]));
  });
});

Deno.test("a subprocess replica's settings (the broker's secret among them) are hidden from its node's module as it loads, and it writes only its own termination log", async () => {
  await inTempDir(async (dir) => {
    const out = join(dir, "seen.txt");
    await Deno.writeTextFile(
      join(dir, "flow.ts"),
      [
        `import { ConsumerNode, Flow } from ${JSON.stringify(modUrl)};`,
        `import { Count } from ${JSON.stringify(storyNodesUrl)};`,
        `export { Count };`,
        `let seen = "unset";`,
        `try {`,
        `  seen = Deno.env.get("VF_EMBEDDED_BROKER_SECRET") === undefined ? "unset" : "the secret";`,
        `} catch (error) {`,
        `  seen = (error as Error).name;`,
        `}`,
        `export class Spy extends ConsumerNode {`,
        `  static override permissions = { write: [${JSON.stringify(out)}] };`,
        `  async consume() {`,
        `    let other = "written";`,
        `    try {`,
        `      Deno.writeTextFileSync(${
          JSON.stringify(join(dir, "state/spy/r1/termination/count-0.json"))
        }, "{}");`,
        `    } catch (error) {`,
        `      other = (error as Error).name;`,
        `    }`,
        `    await Deno.writeTextFile(${JSON.stringify(out)}, seen + " " + other);`,
        `  }`,
        `}`,
        `const count = new Count({ name: "count", n: 1 });`,
        `export default new Flow([new Spy({ name: "spy" }).from(count)], { flowType: "batch", flowId: "spy" });`,
      ].join("\n"),
    );
    const run = await vf(
      ["run-local", "flow.ts", "--state", "state", "--run-id", "r1", "--isolation", "process"],
      { cwd: dir },
    );
    assert.equal(run.code, 0, run.text);
    const [secret, otherLog] = (await Deno.readTextFile(out)).split(" ");
    assert.equal(secret, "NotCapable", "the node's top-level code could not read the secret");
    assert.equal(otherLog, "NotCapable", "nor write another replica's termination log");
  });
});

Deno.test("a node reading a file it did not declare fails with a permission error naming both, exit 2", async () => {
  await inTempDir(async (dir) => {
    const secret = join(dir, "secret.txt");
    await Deno.writeTextFile(secret, "secret");
    const flow = await writeFlow(
      dir,
      ["Count", "ReadsUndeclared"],
      pipeline(
        "permission-story",
        `new Count({ name: "count", n: 5 })`,
        `new ReadsUndeclared({ name: "snoop", path: ${JSON.stringify(secret)} })`,
        dir,
      ),
    );
    const state = join(dir, "state");
    const run = await vf(["run-local", flow, "--state", state, "--run-id", "r1"], { cwd: dir });
    assert.equal(run.code, 2, run.text);
    assert.ok(
      run.text.includes(
        `VF_NODE_CONTRACT: node snoop needs read permission for ${
          JSON.stringify(secret)
        }, which it does not declare`,
      ),
      run.text,
    );
    assert.ok(run.text.includes(`static permissions = { read: [${JSON.stringify(secret)}] }`), run.text);
    assert.match(
      run.text,
      /snoop\[0\] exited with code 2 \(VF_NODE_CONTRACT: node snoop needs read permission/,
    );
    assert.doesNotMatch(
      run.text,
      /snoop\[0\] started \(restart 1\)/,
      "the author's mistake is not restarted",
    );
    assert.match(
      run.text,
      /sink\[0\] exited with code 4 \(VF_UPSTREAM_ABORTED: sink stopped: its parent snoop aborted \(origin snoop: VF_NODE_CONTRACT/,
      "its child ends with the ABORT it published, saying why",
    );
    assert.deepEqual(
      await deadLetters(flow, "r1", state, dir),
      [],
      "a missing permission is not the items' fault",
    );
    assert.deepEqual(await sinkLines(join(dir, "out.jsonl")), []);
  });
});

// ---- 8. stopping a run ------------------------------------------------------------------------------------

/** A slow, long count through two competing replicas into the sink: a run that is stopped, not finished. */
async function slowFlow(dir: string, flowId: string): Promise<string> {
  return await writeFlow(
    dir,
    ["Count", "Poison"],
    pipeline(
      flowId,
      `new Count({ name: "count", n: 100000, delayMs: 20 })`,
      `new Poison({ name: "middle", poison: [], nbTasks: 2 })`,
      dir,
    ),
  );
}

Deno.test("a program runs a flow through mod.ts's runLocal, stops it with an AbortSignal, then goes on with the same run id: every item once at the sink", async () => {
  await inTempDir(async (dir) => {
    const flow = await writeFlow(
      dir,
      ["ReplayableCount", "Poison"],
      pipeline(
        "library-story",
        `new ReplayableCount({ name: "count", n: 150, delayMs: 10 })`,
        `new Poison({ name: "middle", poison: [] })`,
        dir,
      ),
    );
    const program = join(dir, "program.ts");
    await Deno.writeTextFile(
      program,
      [
        `import { runLocal } from ${JSON.stringify(modUrl)};`,
        `const options = { stateDir: ${
          JSON.stringify(join(dir, "state"))
        }, runId: "r1", output: { isTerminal: false, write() {} } };`,
        `const controller = new AbortController();`,
        // Stopped once the sink holds a few items (a fixed delay can come before the flow has even loaded).
        `const sinkPath = ${JSON.stringify(join(dir, "out.jsonl"))};`,
        `const poll = setInterval(async () => {`,
        `  const lines = await Deno.readTextFile(sinkPath).then((t) => t.split("\\n").filter(Boolean).length, () => 0);`,
        `  if (lines >= 5) { clearInterval(poll); controller.abort(); }`,
        `}, 20);`,
        `const first = await runLocal(${JSON.stringify(flow)}, { ...options, signal: controller.signal });`,
        `const second = await runLocal(${JSON.stringify(flow)}, options);`,
        `const processed = (result) => result.snapshots.find((s) => s.node === "count")?.processed;`,
        `console.log(JSON.stringify([first, second].map((r) => ({ code: r.exitCode, outcome: r.outcome, made: processed(r) }))));`,
      ].join("\n"),
    );
    const output = await new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", `--config=${configPath}`, program],
      cwd: dir,
      env: { NO_COLOR: "1" },
      stdin: "null",
    }).output();
    const stderr = new TextDecoder().decode(output.stderr);
    assert.equal(output.code, 0, stderr);
    const [first, second] = JSON.parse(new TextDecoder().decode(output.stdout));
    assert.equal(first.code, 0, stderr);
    assert.match(first.outcome, /^flow library-story stopped on request \(run r1\)/);
    assert.ok(first.made > 0 && first.made < 150, `stopped mid-run after ${first.made} items`);
    assert.equal(second.code, 0, stderr);
    assert.equal(second.outcome, "flow library-story finished (run r1)");
    assert.equal(first.made + second.made, 150, "the second run made only what the first had not");
    assert.deepEqual(await sinkNumbers(join(dir, "out.jsonl")), range(1, 150));
  });
});

/** The run stopped cleanly: the sink holds 1..m once each for the m items the producer produced. */
async function assertStoppedWithoutLoss(
  run: Run,
  dir: string,
  flowId: string,
  runId: string,
  signal: Deno.Signal,
): Promise<void> {
  assert.equal(run.code, 0, run.text);
  assert.match(run.text, new RegExp(`stopping flow ${flowId} on ${signal}: producers end their streams`));
  assert.match(
    run.text,
    new RegExp(
      `flow ${flowId} stopped on ${signal} \\(run ${runId}\\): every item taken was finished; ` +
        `run it again with --run-id ${runId} to go on`,
    ),
  );
  const numbers = await sinkNumbers(join(dir, "out.jsonl"));
  const produced = summaryRow(run, "count").processed;
  assert.ok(produced >= 10 && produced < 100000, `stopped mid-run after ${produced} items`);
  assert.deepEqual(numbers, range(1, produced), "every item produced reached the sink once");
  for (const node of ["count", "middle", "sink"]) assert.equal(summaryRow(run, node).state, "done");
  const ledger = await readLedgerBack(join(dir, "state", flowId, runId, "ledger"));
  assert.ok(ledger.keys > 0);
  assert.deepEqual(ledger.inFlight, [], "no ledger write left half done");
}

for (const isolation of ["worker", "process"]) {
  Deno.test(`SIGTERM to vf run-local stops the flow without losing an item (${isolation} isolation)`, async () => {
    await inTempDir(async (dir) => {
      const flow = await slowFlow(dir, "term-story");
      const child = startVf(
        ["run-local", flow, "--state", join(dir, "state"), "--run-id", "r1", "--isolation", isolation],
        { cwd: dir },
      );
      await waitForLines(join(dir, "out.jsonl"), 10, child);
      child.kill("SIGTERM");
      await assertStoppedWithoutLoss(await finished(child), dir, "term-story", "r1", "SIGTERM");
    });
  });
}

const GROUP_SIGNALS = [
  { signal: "SIGINT", who: "Ctrl-C", flowId: "interrupt-story" },
  { signal: "SIGTERM", who: "a service manager's stop", flowId: "group-term-story" },
] as const;

for (const { signal, who, flowId } of GROUP_SIGNALS) {
  Deno.test(`${signal} to the whole process group (${who}) stops a subprocess run without losing an item`, async () => {
    await inTempDir(async (dir) => {
      const flow = await slowFlow(dir, flowId);
      const child = startVf(
        ["run-local", flow, "--state", join(dir, "state"), "--run-id", "r1", "--isolation", "process"],
        { cwd: dir, ownSession: true },
      );
      await waitForLines(join(dir, "out.jsonl"), 10, child);
      Deno.kill(-child.pid, signal);
      await assertStoppedWithoutLoss(await finished(child), dir, flowId, "r1", signal);
    });
  });
}

Deno.test("SIGTERM to the process group while subprocess replicas are still starting stops the flow cleanly", async () => {
  await inTempDir(async (dir) => {
    const flow = join(dir, "flow.ts");
    await Deno.writeTextFile(
      flow,
      [
        `import { Flow, JsonlSink } from ${JSON.stringify(modUrl)};`,
        `import { Count, Poison } from ${
          JSON.stringify(new URL("tests/fixtures/e2e/slow_loading_nodes.ts", root).href)
        };`,
        "export { Count, Poison };",
        pipeline(
          "early-term-story",
          `new Count({ name: "count", n: 100000, delayMs: 20 })`,
          `new Poison({ name: "middle", poison: [] })`,
          dir,
        ),
      ].join("\n"),
    );
    const child = startVf(
      ["run-local", flow, "--state", join(dir, "state"), "--run-id", "r1", "--isolation", "process"],
      { cwd: dir, ownSession: true },
    );
    // The lock exists once vf took the run; its replicas are launched about as soon as it is taken.
    const lock = join(dir, "state", "early-term-story", "r1", "run.lock");
    while (!(await Deno.stat(lock).then(() => true, () => false))) {
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    // The replicas' node module takes a second to load: they are starting, with no handler of their own.
    await new Promise((resolve) => setTimeout(resolve, 400));
    Deno.kill(-child.pid, "SIGTERM");
    const run = await finished(child);
    assert.equal(run.code, 0, run.text);
    assert.match(run.text, /flow early-term-story stopped on SIGTERM/);
    assert.doesNotMatch(
      run.text,
      /exited with code 143|gave up/,
      "no replica was killed by the group's signal",
    );
  });
});

/** Reads `stream` to its end; `seen(text)` resolves once `text` has appeared in it, `all` with all of it. */
function watchText(stream: ReadableStream<Uint8Array>) {
  let text = "";
  const waiters: { text: string; resolve: () => void }[] = [];
  const all = (async () => {
    for await (const chunk of stream.pipeThrough(new TextDecoderStream())) {
      text += chunk;
      for (const waiter of waiters.filter((w) => text.includes(w.text))) waiter.resolve();
    }
    return text;
  })();
  const seen = (wanted: string) =>
    text.includes(wanted)
      ? Promise.resolve()
      : new Promise<void>((resolve) => waiters.push({ text: wanted, resolve }));
  return { seen, all };
}

interface EarlyStop {
  readonly isolation: string;
  readonly signal: Deno.Signal;
  /** Awaited once vf says it runs the flow; the signal goes to vf's process group when it resolves. */
  readonly when: () => Promise<void>;
  readonly env?: Readonly<Record<string, string>>;
}

/**
 * `count (40 items, replayable, 60 ms apart) → middle → sink` run as `flowId` in a session of its own and signalled as
 * `stop` says. Resolves with what was not clean, or null for a clean stop: exit 0, the outcome in the
 * summary, no replica ended by the signal, and a re-run with the same run id that ends every item once.
 */
async function stopEarly(dir: string, flowId: string, stop: EarlyStop): Promise<string | null> {
  const flow = await writeFlow(
    dir,
    ["ReplayableCount", "Poison"],
    pipeline(
      flowId,
      // 2.4 s of items: still running when the latest stop comes (1.5 s after the notice, at most).
      `new ReplayableCount({ name: "count", n: 40, delayMs: 60 })`,
      `new Poison({ name: "middle", poison: [] })`,
      dir,
    ),
  );
  const args = [
    "run-local",
    flow,
    "--state",
    join(dir, "state"),
    "--run-id",
    "r1",
    "--isolation",
    stop.isolation,
  ];
  const child = startVf(args, { cwd: dir, ownSession: true, env: stop.env });
  const hung = setTimeout(() => child.kill("SIGKILL"), 60_000);
  const stdout = new Response(child.stdout).text();
  const stderr = watchText(child.stderr);
  let code: number;
  try {
    // From here on the run is being set up: its lock, its ledger, its broker, its replicas starting.
    await stderr.seen(`running flow ${flowId}`);
    await stop.when();
    Deno.kill(-child.pid, stop.signal);
    code = (await child.status).code;
  } finally {
    clearTimeout(hung);
  }
  const text = `${await stdout}\n${await stderr.all}`;
  if (code !== 0) return `exit ${code}\n${text}`;
  if (!new RegExp(`flow ${flowId} (stopped on ${stop.signal}|finished) \\(run r1\\)`).test(text)) {
    return `no summary\n${text}`;
  }
  if (/exited with code (130|143)|gave up/.test(text)) return `a replica was ended by the signal\n${text}`;
  const rerun = await vf(args, { cwd: dir });
  if (rerun.code !== 0) return `the re-run exited ${rerun.code}\n${rerun.text}`;
  const numbers = await sinkNumbers(join(dir, "out.jsonl"));
  return numbers.join() === range(1, 40).join() ? null : `the sink holds ${numbers.join()}`;
}

Deno.test("SIGINT or SIGTERM to vf's process group at any moment after it says it runs the flow is a clean stop: exit 0, a summary, and the re-run ends every item once", async () => {
  const moments = [
    ...[0, 30, 80, 150, 300, 600, 1000].map((ms) => ({ isolation: "process", ms })),
    ...[0, 50, 200].map((ms) => ({ isolation: "worker", ms })),
  ];
  const unclean: string[] = [];
  for (const [trial, { isolation, ms }] of moments.entries()) {
    const signal = trial % 2 === 0 ? "SIGINT" : "SIGTERM";
    const when = () => new Promise<void>((resolve) => setTimeout(resolve, ms));
    const wrong = await inTempDir((dir) => stopEarly(dir, "early-stop", { isolation, signal, when }));
    if (wrong !== null) {
      unclean.push(`${signal} ${ms} ms after the notice (${isolation} isolation): ${wrong}`);
    }
  }
  assert.deepEqual(unclean, [], "every stop was clean");
});

Deno.test("a Ctrl-C to vf's process group while a host is slow to start a subprocess replica is a clean stop: no replica is caught before its own session", async () => {
  await inTempDir(async (dir) => {
    // A slow host: any `setsid` run from this PATH takes 300 ms before it makes its session, in vf's group.
    const slow = join(dir, "slow-bin");
    await Deno.mkdir(slow);
    const starting = join(dir, "starting");
    await Deno.mkdir(starting);
    await Deno.writeTextFile(
      join(slow, "setsid"),
      `#!/bin/sh\ntouch "${starting}/$$"\nsleep 0.3\nexec /usr/bin/setsid "$@"\n`,
      { mode: 0o755 },
    );
    const started = async () => (await Array.fromAsync(Deno.readDir(starting))).length;
    // The moment a replica is being started through the slow `setsid`, if one is; else once it should be
    // (vf itself may have been started through it, before its notice).
    const when = async () => {
      const before = await started();
      for (const start = performance.now(); performance.now() - start < 1500 && await started() === before;) {
        await new Promise((resolve) => setTimeout(resolve, 5));
      }
    };
    const env = { PATH: `${slow}:${Deno.env.get("PATH")}` };
    assert.equal(
      await stopEarly(dir, "slow-spawn", { isolation: "process", signal: "SIGINT", when, env }),
      null,
    );
  });
});

Deno.test("Ctrl-C to the terminal's process group while a FrameWriter encodes stops cleanly with its clip; the resumed run completes it", async () => {
  await inTempDir(async (dir) => {
    // 720p frames against a 64 MiB channel: the decoder is held back, so the stop finds it mid-clip.
    const clip = await makeClip(join(dir, "clip.mp4"), { size: "1280x720", frames: 150 });
    const out = join(dir, "out.mkv");
    const flow = await writeFlow(
      dir,
      ["SlowPass"],
      [
        `import { FrameWriter, VideoFileReader } from ${JSON.stringify(modUrl)};`,
        `const decode = new VideoFileReader({ name: "decode", path: ${JSON.stringify(clip)} });`,
        `const slow = new SlowPass({ name: "slow", delayMs: 20 }).from(decode);`,
        `const writer = new FrameWriter({ name: "writer", path: ${
          JSON.stringify(out)
        }, fps: 25, codec: "ffv1" })`,
        `  .from(slow);`,
        `export default new Flow([writer], { flowType: "batch", flowId: "group-int-story" });`,
      ].join("\n"),
    );
    const args = [
      "run-local",
      flow,
      "--state",
      join(dir, "state"),
      "--run-id",
      "r1",
      "--channel-max-mib",
      "64",
    ];
    const child = startVf(args, { cwd: dir, ownSession: true });
    // Stopped once the encoder has written something, while the slow stage still holds most frames back.
    const encoded = async () => {
      const parts = await Array.fromAsync(Deno.readDir(`${out}.parts`)).catch(() => []);
      const sizes = await Promise.all(
        parts.map((p) => Deno.stat(`${out}.parts/${p.name}`).then((i) => i.size)),
      );
      return sizes.some((size) => size > 0);
    };
    while (!(await encoded())) await new Promise((resolve) => setTimeout(resolve, 50));
    await new Promise((resolve) => setTimeout(resolve, 300));
    Deno.kill(-child.pid, "SIGINT");
    const run = await finished(child);
    assert.equal(run.code, 0, run.text);
    assert.match(run.text, /flow group-int-story stopped on SIGINT/);
    const written = await framesIn(out);
    assert.ok(written > 0 && written < 150, `the stopped run's clip holds ${written} frames\n${run.text}`);
    const resumed = await vf(args, { cwd: dir });
    assert.equal(resumed.code, 0, resumed.text);
    assert.equal(await framesIn(out), 150, resumed.text);
  });
});

Deno.test("Ctrl-C while a live source waits to reconnect stops the run at once and cleanly, exit 0", async () => {
  await inTempDir(async (dir) => {
    const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    const port = listener.addr.port;
    listener.close();
    const flow = await writeFlow(
      dir,
      [],
      [
        `import { VideoFileReader } from ${JSON.stringify(modUrl)};`,
        `const camera = new VideoFileReader({ name: "camera", path: "tcp://127.0.0.1:${port}", width: 64, height: 48,`,
        `  reconnectDelaySeconds: 30 });`,
        `const sink = new JsonlSink({ name: "sink", path: ${
          JSON.stringify(join(dir, "out.jsonl"))
        } }).from(camera);`,
        `export default new Flow([sink], { flowType: "realtime", flowId: "dead-camera" });`,
      ].join("\n"),
    );
    const child = startVf(["run-local", flow, "--state", join(dir, "state")], { cwd: dir });
    const hung = setTimeout(() => child.kill("SIGKILL"), 60_000);
    const stdout = new Response(child.stdout).text();
    // The replica's log goes to stderr: read until it says it waits to reconnect, then Ctrl-C.
    let stderr = "";
    let stoppedAt = 0;
    for await (const chunk of child.stderr.pipeThrough(new TextDecoderStream())) {
      stderr += chunk;
      if (stoppedAt === 0 && stderr.includes("live source lost; reconnecting")) {
        stoppedAt = performance.now();
        child.kill("SIGINT");
      }
    }
    const code = (await child.status).code;
    clearTimeout(hung);
    const text = `${await stdout}\n${stderr}`;
    assert.ok(stoppedAt > 0, `it waited to reconnect: ${text}`);
    assert.equal(code, 0, text);
    assert.match(text, /flow dead-camera stopped on SIGINT/);
    assert.ok(performance.now() - stoppedAt < 10_000, "the stop did not wait out the 30 s backoff");
  });
});

Deno.test("a stop that leaves a join's groups incomplete says they were given up, not that every item was finished", async () => {
  await inTempDir(async (dir) => {
    const flow = await writeFlow(
      dir,
      ["Count", "Pair"],
      [
        `const fast = new Count({ name: "fast", n: 100000, delayMs: 5 });`,
        `const slow = new Count({ name: "slow", n: 100000, delayMs: 50 });`,
        `const pair = new Pair({ name: "pair" }).from(fast, slow);`,
        `const sink = new JsonlSink({ name: "sink", path: ${
          JSON.stringify(join(dir, "out.jsonl"))
        } }).from(pair);`,
        `export default new Flow([sink], { flowType: "batch", flowId: "stop-join" });`,
      ].join("\n"),
    );
    const child = startVf(["run-local", flow, "--state", join(dir, "state"), "--run-id", "r1"], { cwd: dir });
    await new Promise((resolve) => setTimeout(resolve, 2500));
    child.kill("SIGINT");
    const run = await finished(child);
    assert.equal(run.code, 0, run.text);
    assert.match(
      run.text,
      /flow stop-join stopped on SIGINT \(run r1\): every item taken was finished or given up \(\d+ join members, join_evicted in the drops column\)/,
    );
    assert.match(summaryRow(run, "pair").drops, /join_evicted \d+/, run.stdout);
  });
});

Deno.test("a stop that comes after every producer ended its stream finishes the run: nothing is left to go on with", async () => {
  await inTempDir(async (dir) => {
    const flow = await writeFlow(
      dir,
      ["Count", "SlowPass"],
      pipeline(
        "late-stop",
        `new Count({ name: "count", n: 8 })`,
        `new SlowPass({ name: "middle", delayMs: 500 })`,
        dir,
      ),
    );
    const args = ["run-local", flow, "--state", join(dir, "state"), "--run-id", "r1"];
    const child = startVf(args, { cwd: dir });
    // The plain live view says when the producer is done; the slow middle still holds most items then.
    const decoder = new TextDecoder();
    let stdout = "";
    const reading = (async () => {
      for await (const chunk of child.stdout) stdout += decoder.decode(chunk, { stream: true });
    })();
    const stderr = new Response(child.stderr).text();
    let exited = false;
    child.status.then(() => (exited = true));
    while (!/\] count done /.test(stdout)) {
      assert.ok(
        !exited && !/\] middle done /.test(stdout),
        `the stop comes while the middle works:\n${stdout}`,
      );
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    child.kill("SIGINT");
    const status = await child.status;
    await reading;
    const text = `${stdout}\n${await stderr}`;
    assert.equal(status.code, 0, text);
    assert.match(
      text,
      /flow late-stop finished \(run r1\): every producer had ended its stream before the stop on SIGINT, so nothing was left/,
    );
    assert.doesNotMatch(text, /run it again/);
    assert.deepEqual(await sinkNumbers(join(dir, "out.jsonl")), range(1, 8), "every item at the sink once");
    const again = await vf(args, { cwd: dir });
    assert.match(again.text, /flow late-stop run r1 already finished at \S+: nothing to do/);
    assert.deepEqual(await sinkNumbers(join(dir, "out.jsonl")), range(1, 8), "the re-run made nothing again");
  });
});

Deno.test("a second vf on a run that is running is refused (exit 3) and the first goes on", async () => {
  await inTempDir(async (dir) => {
    const flow = await slowFlow(dir, "twice-story");
    const args = ["run-local", flow, "--state", join(dir, "state"), "--run-id", "r1"];
    const first = startVf(args, { cwd: dir });
    await waitForLines(join(dir, "out.jsonl"), 10, first);
    const second = await vf(args, { cwd: dir });
    assert.equal(second.code, 3, second.text);
    assert.match(second.text, /VF_RESOURCE_UNAVAILABLE: run r1 of flow twice-story is already running/);
    assert.doesNotMatch(second.text, /running flow/, "it never said it was running the flow it refused");
    first.kill("SIGTERM");
    await assertStoppedWithoutLoss(await finished(first), dir, "twice-story", "r1", "SIGTERM");
  });
});

Deno.test("one Ctrl-C that reaches vf twice at once (also forwarded by deno task) stops the run cleanly, exit 0", async () => {
  await inTempDir(async (dir) => {
    const flow = await writeFlow(
      dir,
      ["Count", "Poison"],
      pipeline(
        "echo-story",
        `new Count({ name: "count", n: 100000, delayMs: 20 })`,
        `new Poison({ name: "middle", poison: [] })`,
        dir,
      ),
    );
    const child = startVf(["run-local", flow, "--state", join(dir, "state")], { cwd: dir });
    await waitForLines(join(dir, "out.jsonl"), 3, child);
    // The terminal's SIGINT, then the one the launcher forwards a moment later (two sent at once merge).
    child.kill("SIGINT");
    await new Promise((resolve) => setTimeout(resolve, 60));
    child.kill("SIGINT");
    const run = await finished(child);
    assert.equal(run.code, 0, run.text);
    assert.match(run.text, /stopped on SIGINT \(run [^)]+\): every item taken was finished/);
    assert.doesNotMatch(run.text, /forced/);
  });
});

Deno.test("a second SIGTERM forces a stop that cannot drain (a node hangs): exit 130, every replica shown ended (both isolations)", async () => {
  for (const isolation of ["worker", "process"]) {
    await inTempDir(async (dir) => {
      const flow = await hangingFlow(dir, "forced-story");
      const child = startVf(["run-local", flow, "--state", join(dir, "state"), "--isolation", isolation], {
        cwd: dir,
      });
      await waitForLines(join(dir, "out.jsonl"), 3, child);
      child.kill("SIGTERM");
      let exited = false;
      child.status.then(() => (exited = true));
      await new Promise((resolve) => setTimeout(resolve, 500));
      assert.ok(!exited, "the first SIGTERM waits for the flow to drain");
      child.kill("SIGTERM");
      const run = await finished(child);
      assert.equal(run.code, 130, run.text);
      assert.match(run.text, /flow forced-story was forced to stop with exit code 130/);
      assert.match(run.text, /exited with code \d+ \(VF_FLOW_FAILED: killed by a forced stop\)/);
      for (const node of ["count", "hang", "sink"]) {
        assert.notEqual(summaryRow(run, node).state, "running", `${node} (${isolation}): ${run.stdout}`);
      }
    });
  }
});

// ---- 9. a re-run after a crash ----------------------------------------------------------------------------

for (const isolation of ["worker", "process"]) {
  Deno.test(`a re-run with the same --run-id after vf was killed ends with every item once and both runs' dead letters (${isolation})`, async () => {
    await inTempDir(async (dir) => {
      const markers = join(dir, "poisoned");
      await Deno.mkdir(markers);
      const appended = join(dir, "appended.txt");
      const flow = await writeFlow(
        dir,
        ["ReplayableCount", "PoisonOnce", "AppendingSink"],
        [
          `const count = new ReplayableCount({ name: "count", n: 300, delayMs: 5 });`,
          `const middle = new PoisonOnce({ name: "middle", poison: [5, 290], dir: ${
            JSON.stringify(markers)
          } }).from(count);`,
          `const sink = new JsonlSink({ name: "sink", path: ${
            JSON.stringify(join(dir, "out.jsonl"))
          } }).from(middle);`,
          `const appended = new AppendingSink({ name: "appended", path: ${
            JSON.stringify(appended)
          }, idempotent: true }).from(middle);`,
          `export default new Flow([sink, appended], { flowType: "batch", flowId: "resume-story" });`,
        ].join("\n"),
      );
      const args = [
        "run-local",
        flow,
        "--state",
        join(dir, "state"),
        "--run-id",
        "r1",
        "--isolation",
        isolation,
      ];
      const crashed = startVf(args, { cwd: dir });
      await waitForLines(join(dir, "out.jsonl"), 30, crashed);
      await waitForLines(appended, 30, crashed);
      await waitForFile(join(dir, "state", "resume-story", "r1", "dead_letters.jsonl"), crashed);
      crashed.kill("SIGKILL");
      const killed = await finished(crashed);
      assert.equal(killed.code, 137);
      const before = await sinkNumbers(join(dir, "out.jsonl"));
      assert.ok(before.length >= 30 && before.length < 298, `killed mid-run after ${before.length} items`);
      const rerun = await vf(args, { cwd: dir });
      assert.equal(rerun.code, 0, rerun.text);
      const expected = range(1, 300).filter((n) => n !== 290);
      assert.deepEqual(
        await sinkNumbers(join(dir, "out.jsonl")),
        expected,
        "item 5, poison only once, passed on the re-run's replay",
      );
      const effects = (await Deno.readTextFile(appended)).split("\n").filter((line) => line !== "").map(
        Number,
      );
      assert.deepEqual([...new Set(effects)].sort((a, b) => a - b), expected);
      // The replay redelivers every item the first run consumed; only the one, if any, whose effect was
      // applied but not yet marked when vf was killed may be applied twice.
      assert.ok(
        effects.length - expected.length <= 1,
        `${effects.length - expected.length} effects repeated`,
      );
      const letters = await deadLetters(flow, "r1", join(dir, "state"), dir);
      assert.deepEqual(
        letters.map(deadLetterValue),
        [5, 290],
        "the first run's dead letter kept beside the re-run's",
      );
    });
  });
}

for (const isolation of ["worker", "process"]) {
  Deno.test(`a JsonlSink and an idempotent sink killed past their first key checkpoint write each item once on the re-run's replay (${isolation})`, async () => {
    await inTempDir(async (dir) => {
      const out = join(dir, "out.jsonl");
      const appended = join(dir, "appended.txt");
      const flow = await writeFlow(
        dir,
        ["ReplayableCount", "AppendingSink"],
        [
          `const count = new ReplayableCount({ name: "count", n: 700, delayMs: 4 });`,
          `const sink = new JsonlSink({ name: "sink", path: ${JSON.stringify(out)} }).from(count);`,
          `const appended = new AppendingSink({ name: "appended", path: ${
            JSON.stringify(appended)
          }, idempotent: true }).from(count);`,
          `export default new Flow([sink, appended], { flowType: "batch", flowId: "killed-index-story" });`,
        ].join("\n"),
      );
      const args = [
        "run-local",
        flow,
        "--state",
        join(dir, "state"),
        "--run-id",
        "r1",
        "--isolation",
        isolation,
      ];
      const crashed = startVf(args, { cwd: dir });
      await waitForLines(out, 300, crashed);
      crashed.kill("SIGKILL");
      assert.equal((await finished(crashed)).code, 137);
      const before = await sinkNumbers(out);
      assert.ok(before.length >= 300 && before.length < 700, `killed after ${before.length} lines`);
      const rerun = await vf(args, { cwd: dir });
      assert.equal(rerun.code, 0, rerun.text);
      assert.deepEqual(
        await sinkNumbers(out),
        range(1, 700),
        "the replay's items already written are skipped",
      );
      const effects = (await Deno.readTextFile(appended)).split("\n").filter((line) => line !== "").map(
        Number,
      );
      assert.deepEqual([...new Set(effects)].sort((a, b) => a - b), range(1, 700));
      // Only the effect, if any, applied but not yet marked when vf was killed may be applied twice.
      assert.ok(effects.length - 700 <= 1, `${effects.length - 700} effects repeated`);
    });
  });
}

// The markers of a run's items share EFFECT_MARKER_SHARDS keys by key hash (the unit tests show the bound
// past that count); here, the real path's 1200 deterministic message ids share fewer keys than items.
Deno.test("an idempotent run keeps its effect markers in shared ledger keys (at most EFFECT_MARKER_SHARDS), not one per item", async () => {
  await inTempDir(async (dir) => {
    const items = 1200;
    const appended = join(dir, "appended.txt");
    const out = join(dir, "out.jsonl");
    const flow = await writeFlow(
      dir,
      ["Count", "AppendingSink"],
      [
        `const count = new Count({ name: "count", n: ${items} });`,
        `const appended = new AppendingSink({ name: "appended", path: ${
          JSON.stringify(appended)
        }, idempotent: true }).from(count);`,
        `const sink = new JsonlSink({ name: "sink", path: ${
          JSON.stringify(out)
        }, durable: false }).from(count);`,
        `export default new Flow([appended, sink], { flowType: "batch", flowId: "markers-story" });`,
      ].join("\n"),
    );
    const run = await vf(["run-local", flow, "--state", join(dir, "state"), "--run-id", "r1"], { cwd: dir });
    assert.equal(run.code, 0, run.text);
    const effects = (await Deno.readTextFile(appended)).split("\n").filter((line) => line !== "").map(Number);
    assert.deepEqual(effects, range(1, items), "every effect once");
    assert.deepEqual(await sinkNumbers(out), range(1, items));
    const store = await FileRuntimeStore.open(join(dir, "state", "markers-story", "r1", "ledger"));
    let markerKeys: number;
    try {
      markerKeys = (await store.scan("")).filter((record) => record.key.startsWith(EFFECT_KEY_PREFIX)).length;
    } finally {
      await store.close();
    }
    assert.ok(
      markerKeys > 0 && markerKeys <= EFFECT_MARKER_SHARDS,
      `${markerKeys} marker keys for ${items} items`,
    );
    assert.ok((await Deno.stat(`${out}.keys`)).isFile, "the JsonlSink's keys are indexed on disk");
  });
});

Deno.test("a run that finished is not run again by the same --run-id: nothing to do, exit 0", async () => {
  await inTempDir(async (dir) => {
    const flow = await writeFlow(
      dir,
      ["Count", "Poison"],
      pipeline(
        "finished-story",
        `new Count({ name: "count", n: 5 })`,
        `new Poison({ name: "middle", poison: [] })`,
        dir,
      ),
    );
    const args = ["run-local", flow, "--state", join(dir, "state"), "--run-id", "r1"];
    const first = await vf(args, { cwd: dir });
    assert.equal(first.code, 0, first.text);
    const again = await vf(args, { cwd: dir });
    assert.equal(again.code, 0, again.text);
    assert.match(again.text, /flow finished-story run r1 already finished at \S+: nothing to do/);
    assert.doesNotMatch(again.text, /running flow/, "nothing ran");
    assert.deepEqual(await sinkNumbers(join(dir, "out.jsonl")), range(1, 5), "no item made twice");
  });
});

Deno.test("a re-run after vf was killed with a live source finishes: the old broker's counts do not hold its barrier", async () => {
  await inTempDir(async (dir) => {
    const flow = await writeFlow(
      dir,
      ["Count", "SlowTrace"],
      pipeline(
        "live-rerun-story",
        `new Count({ name: "count", n: 400 })`,
        `new SlowTrace({ name: "slow", delayMs: 10 })`,
        dir,
      ),
    );
    const args = ["run-local", flow, "--state", join(dir, "state"), "--run-id", "r1"];
    const crashed = startVf(args, { cwd: dir });
    // The source has published all 400 by now; the ledger noted them, and the dying broker held most.
    await waitForLines(join(dir, "out.jsonl"), 40, crashed);
    crashed.kill("SIGKILL");
    assert.equal((await finished(crashed)).code, 137);
    const before = (await sinkLines(join(dir, "out.jsonl"))).length;
    const rerun = startVf(args, { cwd: dir });
    const stuck = setTimeout(() => rerun.kill("SIGKILL"), 60_000);
    const run = await finished(rerun).finally(() => clearTimeout(stuck));
    assert.equal(run.code, 0, run.text);
    // A live source mints new ids in each run (MSGID-5): the re-run's 400 items are all new ones.
    assert.equal((await sinkLines(join(dir, "out.jsonl"))).length - before, 400);
  });
});

Deno.test("a run stopped by SIGTERM goes on where it stopped: its replayable source resumes, no item is made twice", async () => {
  await inTempDir(async (dir) => {
    const log = join(dir, "made.log");
    const flow = await writeFlow(
      dir,
      ["LoggedReplayableCount", "Poison"],
      pipeline(
        "stop-resume-story",
        `new LoggedReplayableCount({ name: "count", n: 300, delayMs: 10, log: ${JSON.stringify(log)}, ` +
          `killAt: 100000, pidFile: ${JSON.stringify(join(dir, "never.pid"))} })`,
        `new Poison({ name: "middle", poison: [] })`,
        dir,
      ),
    );
    const args = ["run-local", flow, "--state", join(dir, "state"), "--run-id", "r1"];
    const stopped = startVf(args, { cwd: dir });
    await waitForLines(join(dir, "out.jsonl"), 20, stopped);
    stopped.kill("SIGTERM");
    const first = await finished(stopped);
    assert.equal(first.code, 0, first.text);
    assert.match(first.text, /stopped on SIGTERM/);
    const rerun = await vf(args, { cwd: dir });
    assert.equal(rerun.code, 0, rerun.text);
    assert.match(rerun.text, /flow stop-resume-story finished \(run r1\)/);
    const made = (await Deno.readTextFile(log)).split("\n").filter((line) => line !== "").map((line) =>
      Number(line.split(" ")[1])
    );
    assert.deepEqual(made, range(1, 300), "each item made once, the re-run starting where the stop left off");
    assert.deepEqual(await sinkNumbers(join(dir, "out.jsonl")), range(1, 300));
  });
});

Deno.test("a restarted replayable producer resumes after its last accepted item instead of making every item again (process)", async () => {
  await inTempDir(async (dir) => {
    const log = join(dir, "made.log");
    const pidFile = join(dir, "producer.pid");
    const flow = await writeFlow(
      dir,
      ["LoggedReplayableCount", "Poison"],
      pipeline(
        "producer-restart-story",
        `new LoggedReplayableCount({ name: "count", n: 250, delayMs: 10, log: ${JSON.stringify(log)}, ` +
          `killAt: 200, pidFile: ${JSON.stringify(pidFile)} })`,
        `new Poison({ name: "middle", poison: [] })`,
        dir,
      ),
    );
    const child = startVf(["run-local", flow, "--state", join(dir, "state"), "--isolation", "process"], {
      cwd: dir,
    });
    const pid = Number(await waitForFile(pidFile, child));
    Deno.kill(pid, "SIGKILL");
    const run = await finished(child);
    assert.equal(run.code, 0, run.text);
    assert.match(run.text, /count\[0\] started \(restart 1\)/);
    assert.deepEqual(await sinkNumbers(join(dir, "out.jsonl")), range(1, 250));
    const made = (await Deno.readTextFile(log)).split("\n").filter((line) => line !== "").map((line) =>
      line.split(" ").map(Number)
    );
    const restarted = made.filter(([maker]) => maker !== pid).map(([, item]) => item);
    assert.equal(made.filter(([maker]) => maker === pid).length, 199, "the first launch made 1..199");
    assert.ok(
      restarted[0] > 1 && restarted[0] < 200,
      `the replacement resumed after an item the ledger noted, not from 1: it began at ${restarted[0]}`,
    );
    assert.deepEqual(restarted, range(restarted[0], 250));
  });
});

// ---- 10. a disk that cannot take a write -------------------------------------------------------------------

/**
 * How a story breaks the disk under `dir` mid-run, and mends it: a read-only bind mount over it (EROFS), or
 * a small tmpfs mounted on it that a filler file then fills (ENOSPC).
 */
const DISK_FAULTS = {
  "read-only": {
    prepare: (_dir: string) => Promise.resolve(),
    breakIt: (dir: string) => mountCommand("mount", ["--bind", "-o", "ro", dir, dir]),
    mend: (dir: string) => mountCommand("umount", [dir]),
    release: (_dir: string) => Promise.resolve(),
    code: "EROFS",
    says: "is read-only",
  },
  full: {
    prepare: (dir: string) => mountCommand("mount", ["-t", "tmpfs", "-o", "size=4M", "tmpfs", dir]),
    breakIt: async (dir: string) => {
      await new Deno.Command("dd", {
        args: ["if=/dev/zero", `of=${join(dir, "filler")}`, "bs=4k"],
        stderr: "null",
      })
        .output();
    },
    mend: (dir: string) => Deno.remove(join(dir, "filler")),
    release: (dir: string) => mountCommand("umount", [dir]),
    code: "ENOSPC",
    says: "is full",
  },
} as const;

/** A batch flow `count (300, replayable, paced) → middle (item 200 poison once) → sink` writing `sinkPath`. */
async function diskStoryFlow(dir: string, flowId: string, sinkPath: string): Promise<string> {
  const markers = join(dir, "poisoned");
  await Deno.mkdir(markers);
  return await writeFlow(
    dir,
    ["ReplayableCount", "PoisonOnce"],
    [
      `const count = new ReplayableCount({ name: "count", n: 300, delayMs: 10 });`,
      `const middle = new PoisonOnce({ name: "middle", poison: [200], dir: ${JSON.stringify(markers)} })` +
      ".from(count);",
      `const sink = new JsonlSink({ name: "sink", path: ${JSON.stringify(sinkPath)} }).from(middle);`,
      `export default new Flow([sink], { flowType: "batch", flowId: ${JSON.stringify(flowId)} });`,
    ].join("\n"),
  );
}

for (
  const [fault, isolation] of [["read-only", "worker"], ["full", "process"]] as const
) {
  const disk = DISK_FAULTS[fault];
  Deno.test({
    name:
      `a state directory whose disk turns ${fault} mid-run ends the run at once: VF_RESOURCE_UNAVAILABLE ` +
      `naming it, exit 3, the summary; mended, the re-run ends with every item once (${isolation}; needs root ` +
      "to mount, ignored otherwise)",
    ignore: !MAY_MOUNT,
    fn: async () => {
      await inTempDir(async (dir) => {
        const state = join(dir, "state");
        await Deno.mkdir(state);
        const flow = await diskStoryFlow(dir, "disk-story", join(dir, "out.jsonl"));
        const args = ["run-local", flow, "--state", state, "--run-id", "r1", "--isolation", isolation];
        await disk.prepare(state);
        let broken = false;
        try {
          const run = startVf(args, { cwd: dir });
          await waitForLines(join(dir, "out.jsonl"), 30, run);
          await disk.breakIt(state);
          broken = true;
          const failed = await finished(run);
          assert.equal(failed.code, 3, failed.text);
          assert.match(
            failed.stdout,
            new RegExp(
              `flow disk-story failed with exit code 3 \\(run r1\\): VF_RESOURCE_UNAVAILABLE: cannot write the ` +
                `file runtime store at ${state}/disk-story/r1/ledger \\(\\w+\\): its filesystem ${disk.says} ` +
                `\\(${disk.code}\\) \\(remedy: .+\\); once that is mended, run it again with --run-id r1`,
            ),
          );
          assert.equal(summaryRow(failed, "sink").restarts, 0, "nothing restarted against a broken disk");
          assert.doesNotMatch(failed.text, /VF_UNKNOWN/);
          await disk.mend(state);
          broken = false;
          // Every key and record reads back whole (its checksum holds): a failed write left at most a temporary file.
          const { keys } = await readLedgerBack(join(state, "disk-story", "r1", "ledger"));
          assert.ok(keys > 0);
          const rerun = await vf(args, { cwd: dir });
          assert.equal(rerun.code, 0, rerun.text);
          assert.deepEqual(await sinkNumbers(join(dir, "out.jsonl")), range(1, 300).filter((n) => n !== 200));
          const letters = await deadLetters(flow, "r1", state, dir);
          assert.deepEqual(letters.map(deadLetterValue), [200]);
        } finally {
          if (broken) await disk.mend(state);
          await disk.release(state);
        }
      });
    },
  });
}

Deno.test({
  name: "a sink whose disk fills mid-run fails once with VF_RESOURCE_UNAVAILABLE naming its file, is not " +
    "restarted, and the run exits 3; with space freed, the re-run ends with every item once (needs root to " +
    "mount, ignored otherwise)",
  ignore: !MAY_MOUNT,
  fn: async () => {
    await inTempDir(async (dir) => {
      const outputs = join(dir, "outputs");
      await Deno.mkdir(outputs);
      const sinkPath = join(outputs, "out.jsonl");
      const flow = await diskStoryFlow(dir, "sink-disk-story", sinkPath);
      const args = ["run-local", flow, "--state", join(dir, "state"), "--run-id", "r1"];
      const disk = DISK_FAULTS.full;
      await disk.prepare(outputs);
      try {
        const run = startVf(args, { cwd: dir });
        await waitForLines(sinkPath, 30, run);
        await disk.breakIt(outputs);
        const failed = await finished(run);
        assert.equal(failed.code, 3, failed.text);
        assert.match(
          failed.text,
          new RegExp(
            `sink\\[0\\] gave up after 0 restart\\(s\\): VF_RESOURCE_UNAVAILABLE: cannot write node sink's ` +
              `output(?:'s key index)? ${sinkPath}(?:\\.keys)?: its filesystem is full \\(ENOSPC\\) \\(remedy: free space on the filesystem`,
          ),
        );
        assert.equal(summaryRow(failed, "sink").restarts, 0);
        const letters = await deadLetters(flow, "r1", join(dir, "state"), dir);
        assert.ok(
          letters.every((letter) => letter.code === "VF_POISON"),
          "none dead-lettered for the disk's sake",
        );
        await disk.mend(outputs);
        const rerun = await vf(args, { cwd: dir });
        assert.equal(rerun.code, 0, rerun.text);
        assert.deepEqual(await sinkNumbers(sinkPath), range(1, 300).filter((n) => n !== 200));
      } finally {
        await disk.release(outputs);
      }
    });
  },
});

// ---- 11. params larger than an environment entry ---------------------------------------------------------

/** A flow `count (20) → middle (item 3 poison; its params padded with `padding` numbers no item is) → sink`. */
function bigParamsFlow(dir: string, flowId: string, padding: number): Promise<string> {
  return writeFlow(
    dir,
    ["Count", "Poison"],
    pipeline(
      flowId,
      `new Count({ name: "count", n: 20 })`,
      `new Poison({ name: "middle", poison: [3, ...Array.from({ length: ${padding} }, (_, i) => 1_000_000 + i)] })`,
      dir,
    ),
  );
}

for (const isolation of ["worker", "process"]) {
  Deno.test(`a node whose params are about 300 KiB (more than one environment entry holds) runs and gives every item (${isolation} isolation)`, async () => {
    await inTempDir(async (dir) => {
      // 38,000 numbers of 7 digits and a comma: 304,000 bytes of JSON, over the 128 KiB of MAX_ARG_STRLEN.
      const flow = await bigParamsFlow(dir, "big-params", 38_000);
      const run = await vf(["run-local", flow, "--state", join(dir, "state"), "--isolation", isolation], {
        cwd: dir,
      });
      assert.equal(run.code, 0, run.text);
      assert.deepEqual(await sinkNumbers(join(dir, "out.jsonl")), range(1, 20).filter((n) => n !== 3));
      assert.deepEqual(
        [summaryRow(run, "middle").processed, summaryRow(run, "middle").dlq],
        [19, 1],
        run.stdout,
      );
    });
  });
}

Deno.test("a flow whose params exceed what a specs ConfigMap holds (1 MiB) is refused before it runs: exit 2, naming the node and the size", async () => {
  await inTempDir(async (dir) => {
    // 140,000 numbers of 7 digits and a comma: about 1.1 MB of JSON.
    const flow = await bigParamsFlow(dir, "huge-params", 140_000);
    const run = await vf(["run-local", flow, "--state", join(dir, "state"), "--isolation", "process"], {
      cwd: dir,
    });
    assert.equal(run.code, 2, run.text);
    assert.match(
      run.text,
      /error VF_NODE_CONTRACT middle: node middle's params are 11200\d\d bytes of JSON, more than 1048576 bytes/,
    );
    assert.deepEqual(await sinkLines(join(dir, "out.jsonl")), [], "nothing ran");
  });
});

// ---- 12. stops and resumes over a long run ----------------------------------------------------------------

/** The numbers a counting sink appended to `path`, one a line, in the order it consumed them. */
async function countedItems(path: string): Promise<number[]> {
  const text = await Deno.readTextFile(path).catch(() => "");
  return text.split("\n").filter((line) => line !== "").map(Number);
}

/** The context the first hit of `name` recorded in `markerDir`, once its marker file is written out. */
async function firstHitContext(markerDir: string, name: Barrier): Promise<Record<string, unknown>> {
  for (;;) {
    const text = await Deno.readTextFile(join(markerDir, `${name}#1.hit`)).catch(() => "");
    if (text !== "") return JSON.parse(text).context;
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

for (const isolation of ["worker", "process"]) {
  Deno.test(`a replayable source stopped and resumed three times, each stop while a position save is held open, makes no item twice: a sink without dedup sees each once (${isolation})`, async () => {
    await inTempDir(async (dir) => {
      const counted = join(dir, "counted.txt");
      const stopMarker = join(dir, "stop-seen");
      const flow = await writeFlow(
        dir,
        ["StopNotingCount", "AppendingSink"],
        [
          `const count = new StopNotingCount({ name: "count", n: 3000, delayMs: 2, stopMarker: ${
            JSON.stringify(stopMarker)
          } });`,
          `const sink = new AppendingSink({ name: "sink", path: ${JSON.stringify(counted)} }).from(count);`,
          `export default new Flow([sink], { flowType: "batch", flowId: "save-race-story" });`,
        ].join("\n"),
      );
      const state = join(dir, "state");
      const args = ["run-local", flow, "--state", state, "--run-id", "r1", "--isolation", isolation];
      for (let cycle = 1; cycle <= 3; cycle++) {
        await Deno.remove(stopMarker).catch(() => {});
        // The source's first position save of this run is held open after it was written, until outputs
        // after the offset it saved were accepted (and consumed) and the stop came and was seen.
        const markerDir = join(dir, `faults-${cycle}`);
        const schedule = new FaultSchedule({ [Barrier.checkpointCommitAfter]: pause("offset-save") }, {
          markerDir,
        });
        const child = startVf(args, { cwd: dir, env: schedule.toEnv() });
        await schedule.untilFired(Barrier.checkpointCommitAfter, 1, 60);
        const { offset } = await firstHitContext(markerDir, Barrier.checkpointCommitAfter);
        await waitForLines(counted, Number(offset) + 20, child);
        child.kill("SIGINT");
        await waitForFile(stopMarker, child);
        schedule.release("offset-save");
        const run = await finished(child);
        assert.equal(run.code, 0, run.text);
        assert.match(run.text, /flow save-race-story stopped on SIGINT/, run.text);
      }
      const last = await vf(args, { cwd: dir });
      assert.equal(last.code, 0, last.text);
      assert.match(last.text, /flow save-race-story finished \(run r1\)/);
      const items = await countedItems(counted);
      assert.deepEqual(
        [...items].sort((a, b) => a - b),
        range(1, 3000),
        "every item consumed once over four runs",
      );
    });
  });
}

Deno.test("a source held back at --channel-max-mib 64 keeps its own buffer within the limit, and a stop publishes none of that buffer: the resumed run makes it, every item consumed once", async () => {
  await inTempDir(async (dir) => {
    const made = join(dir, "made.log");
    const consumed = join(dir, "consumed.txt");
    const gate = join(dir, "gate");
    const stopMarker = join(dir, "stop-seen");
    const flow = await writeFlow(
      dir,
      ["LoggedPayloads", "GatedSink"],
      [
        `const source = new LoggedPayloads({ name: "source", n: 200, bytes: ${1024 * 1024}, log: ${
          JSON.stringify(made)
        }, stopMarker: ${JSON.stringify(stopMarker)} });`,
        `const sink = new GatedSink({ name: "sink", path: ${JSON.stringify(consumed)}, gate: ${
          JSON.stringify(gate)
        } }).from(source);`,
        `export default new Flow([sink], { flowType: "batch", flowId: "buffer-story" });`,
      ].join("\n"),
    );
    const state = join(dir, "state");
    const args = ["run-local", flow, "--state", state, "--run-id", "r1", "--channel-max-mib", "64"];
    const child = startVf(args, { cwd: dir });
    // The sink takes nothing yet: the source runs ahead until the broker and its own buffer are full.
    let count = 0;
    for (let stableSince = Date.now(); count <= 64 && (count < 40 || Date.now() - stableSince < 3000);) {
      await new Promise((resolve) => setTimeout(resolve, 100));
      const now = (await countedItems(made)).length;
      if (now !== count) [count, stableSince] = [now, Date.now()];
    }
    // 1 MiB payloads: the node's unsettled data, at the broker and in its buffer, is at most 64 MiB; one
    // more payload is in the source's hands, waiting for room.
    assert.ok(count <= 64, `the source made ${count} payloads of 1 MiB while nothing was consumed`);
    child.kill("SIGINT");
    await waitForFile(stopMarker, child);
    const madeAtStop = (await countedItems(made)).length;
    await Deno.writeTextFile(gate, "open");
    const stopped = await finished(child);
    assert.equal(stopped.code, 0, stopped.text);
    assert.match(stopped.text, /flow buffer-story stopped on SIGINT/);
    const taken = await countedItems(consumed);
    assert.deepEqual(taken, range(1, taken.length), "what the broker took, consumed once, in order");
    assert.equal(summaryRow(stopped, "source").processed, taken.length, stopped.text);
    assert.ok(
      madeAtStop - taken.length >= 16,
      `the ${madeAtStop - taken.length} payloads the broker had not taken at the stop were not published`,
    );
    const resumed = await vf(args, { cwd: dir });
    assert.equal(resumed.code, 0, resumed.text);
    assert.match(resumed.text, /flow buffer-story finished \(run r1\)/);
    assert.deepEqual(
      await countedItems(consumed),
      range(1, 200),
      "every payload consumed once over both runs",
    );
  });
});
