import assert from "node:assert/strict";
import { ENVELOPE_HEADROOM, ENVELOPE_TAILROOM, isGivenWhole } from "../../../src/core/bytes.ts";
import { ConfigError, NodeContractError, ResourceUnavailable } from "../../../src/core/errors.ts";
import { END } from "../../../src/core/node.ts";
import {
  isLiveSource,
  VideoFileReader,
  type VideoFileReaderParams,
} from "../../../src/nodes/video_file_reader.ts";
import { Frame } from "../../../src/wire/value.ts";
import { SeededRandom, testSeed } from "../../support/random.ts";
import {
  assertSameBytes,
  decodeAll,
  decodeFrame,
  ffmpeg,
  inSandbox,
  makeClip,
  processExists,
  type TestContext,
  testContext,
  withPath,
} from "../../fixtures/video/clips.ts";

const dir = await Deno.makeTempDir({ prefix: "vf_reader_" });
const clip = await makeClip(`${dir}/clip.mp4`);
const FRAME = 320 * 240 * 3;

globalThis.addEventListener("unload", () => Deno.removeSync(dir, { recursive: true }));

async function opened(params: VideoFileReaderParams, t: TestContext = testContext("reader")) {
  const reader = new VideoFileReader({ name: "reader", ...params });
  await reader.open(t.ctx);
  return reader;
}

async function nextFrame(reader: VideoFileReader, t: TestContext): Promise<Frame> {
  const item = await reader.next(t.ctx);
  assert.ok(item instanceof Frame, `expected a frame, got ${String(item)}`);
  return item;
}

async function drain(reader: VideoFileReader, t: TestContext): Promise<Frame[]> {
  const frames: Frame[] = [];
  for (let item = await reader.next(t.ctx); item !== END; item = await reader.next(t.ctx)) {
    assert.ok(item instanceof Frame);
    frames.push(item);
  }
  return frames;
}

Deno.test("a 50-frame clip yields exactly 50 bgr8 frames of shape [240, 320, 3], then END", async () => {
  const t = testContext();
  const reader = await opened({ path: clip, startTs: 1000 }, t);
  const frames = await drain(reader, t);
  assert.equal(frames.length, 50);
  for (const [i, frame] of frames.entries()) {
    assert.equal(frame.pixelFormat, "bgr8");
    assert.equal(frame.pixels.dtype, "uint8");
    assert.deepEqual(frame.pixels.shape, [240, 320, 3]);
    assert.equal(frame.pixels.data.byteOffset, ENVELOPE_HEADROOM);
    assert.equal(frame.pixels.data.byteLength, FRAME);
    assert.equal(
      frame.pixels.data.buffer.byteLength,
      ENVELOPE_HEADROOM + FRAME + ENVELOPE_TAILROOM,
      "each frame owns an ArrayBuffer of its own, with room for its envelope around the pixels",
    );
    assert.ok(isGivenWhole(frame.pixels.data.buffer), "the reader gives each frame's buffer up whole");
    assert.ok(Math.abs(frame.captureTs! - (1000 + i / 25)) < 1e-9, `frame ${i} at ${frame.captureTs}`);
  }
  assert.deepEqual(t.eventTimestamps, frames.map((f) => f.captureTs));
  assert.equal(await reader.next(t.ctx), END, "END stays END");
  await reader.close(t.ctx);
});

Deno.test("pixels equal an independent ffmpeg decode of the same frames", async () => {
  const t = testContext();
  const reader = await opened({ path: clip }, t);
  const frames = await drain(reader, t);
  const expected = await decodeAll(clip, FRAME);
  assert.equal(expected.length, 50);
  for (const i of [0, 1, 24, 25, 49]) assertSameBytes(frames[i].pixels.data, expected[i], `frame ${i}`);
  assertSameBytes(frames[17].pixels.data, await decodeFrame(clip, 17), "frame 17");
  await reader.close(t.ctx);
});

Deno.test("rgb24 and gray give rgb8 [h, w, 3] and gray8 [h, w, 1] frames with ffmpeg's pixels", async () => {
  for (const [format, pixelFormat, channels] of [["rgb24", "rgb8", 3], ["gray", "gray8", 1]] as const) {
    const t = testContext();
    const reader = await opened({ path: clip, pixelFormat: format }, t);
    await reader.seek(12, t.ctx);
    const frame = await nextFrame(reader, t);
    assert.equal(frame.pixelFormat, pixelFormat);
    assert.deepEqual(frame.pixels.shape, [240, 320, channels]);
    assertSameBytes(frame.pixels.data, await decodeFrame(clip, 12, { pixFmt: format }), format);
    await reader.close(t.ctx);
  }
});

Deno.test("width and height resize; one of them alone keeps the source's aspect", async () => {
  const t = testContext();
  const both = await opened({ path: clip, width: 100, height: 50 }, t);
  const frame = await nextFrame(both, t);
  assert.deepEqual(frame.pixels.shape, [50, 100, 3]);
  assertSameBytes(frame.pixels.data, await decodeFrame(clip, 0, { scale: "100:50" }), "100x50");
  await both.close(t.ctx);
  const widthOnly = await opened({ path: clip, width: 160 }, t);
  assert.deepEqual((await nextFrame(widthOnly, t)).pixels.shape, [120, 160, 3]);
  await widthOnly.close(t.ctx);
  const heightOnly = await opened({ path: clip, height: 60 }, t);
  assert.deepEqual((await nextFrame(heightOnly, t)).pixels.shape, [60, 80, 3]);
  await heightOnly.close(t.ctx);
});

Deno.test("a clip its metadata turns a quarter (a phone clip) gives frames of the turned size, as ffmpeg decodes them", async () => {
  const turned = `${dir}/turned.mp4`;
  await ffmpeg(["-i", clip, "-c", "copy", "-metadata:s:v:0", "rotate=90", "-y", turned]);
  const t = testContext();
  const reader = await opened({ path: turned }, t);
  const frames = await drain(reader, t);
  assert.equal(frames.length, 50);
  assert.deepEqual(frames[0].pixels.shape, [320, 240, 3], "240 wide and 320 high once turned");
  const expected = await decodeAll(turned, FRAME);
  for (const i of [0, 31]) assertSameBytes(frames[i].pixels.data, expected[i], `turned frame ${i}`);
  await reader.close(t.ctx);
  const narrow = await opened({ path: turned, width: 120 }, t);
  assert.deepEqual((await nextFrame(narrow, t)).pixels.shape, [160, 120, 3], "the turned aspect kept");
  await narrow.close(t.ctx);
});

Deno.test("fps resamples to the requested rate and times frames on it", async () => {
  const t = testContext();
  const reader = await opened({ path: clip, fps: 5, startTs: 0 }, t);
  const frames = await drain(reader, t);
  assert.equal(frames.length, 10, "2 s at 5 fps");
  assert.deepEqual(frames.map((f) => f.captureTs), [0, 0.2, 0.4, 0.6, 0.8, 1, 1.2, 1.4, 1.6, 1.8]);
  for (const k of [0, 3, 9]) {
    assertSameBytes(frames[k].pixels.data, await decodeFrame(clip, k, { fps: 5 }), `frame ${k} at 5 fps`);
  }
  await reader.close(t.ctx);
});

Deno.test("seek(k) makes the next frame frame k, at its event time; past the end is END", async () => {
  const t = testContext();
  const reader = await opened({ path: clip, startTs: 0 }, t);
  const expected = await decodeAll(clip, FRAME);
  for (const k of [30, 0, 49, 7]) {
    await reader.seek(k, t.ctx);
    const frame = await nextFrame(reader, t);
    assertSameBytes(frame.pixels.data, expected[k], `frame ${k}`);
    assert.ok(Math.abs(frame.captureTs! - k / 25) < 1e-9);
    if (k < 49) assertSameBytes((await nextFrame(reader, t)).pixels.data, expected[k + 1], `frame ${k + 1}`);
    else assert.equal(await reader.next(t.ctx), END);
  }
  await reader.seek(50, t.ctx);
  assert.equal(await reader.next(t.ctx), END);
  await reader.seek(3, t.ctx);
  assertSameBytes((await nextFrame(reader, t)).pixels.data, expected[3], "a seek after END starts again");
  await reader.close(t.ctx);
});

/** The plans the reader logged, in order: the input seek it used (`null`: decoding from the start). */
function plannedSeeks(t: TestContext): (number | null)[] {
  return t.logger.records.filter((r) => r.message === "starting ffmpeg").map((r) =>
    r.fields.seek_seconds as number | null
  );
}

Deno.test("seeking far into a file uses an input seek where it lands early enough, and is exact either way", async () => {
  const seed = testSeed();
  const random = new SeededRandom(seed);
  const size = 160 * 120 * 3;
  const options = { size: "160x120", frames: 250 };
  // MP4 is indexed: an input seek lands on the key frame before the target. MPEG-TS with one key frame
  // is not: the seek lands after the target, and the reader must notice and decode from the start.
  const cases = [
    { path: await makeClip(`${dir}/long.mp4`, options), inputSeek: true },
    {
      path: await makeClip(`${dir}/long.ts`, { ...options, codec: ["-c:v", "libx264", "-g", "1000"] }),
      inputSeek: false,
    },
  ];
  for (const { path, inputSeek } of cases) {
    const expected = await decodeAll(path, size);
    assert.equal(expected.length, 250);
    const t = testContext();
    const reader = await opened({ path }, t);
    const targets = [200, 249, random.int(100, 248)];
    for (const k of targets) {
      await reader.seek(k, t.ctx);
      const frame = await nextFrame(reader, t);
      assertSameBytes(frame.pixels.data, expected[k], `${path} frame ${k} (seed ${seed})`);
    }
    const seeks = plannedSeeks(t);
    assert.equal(seeks.length, targets.length);
    assert.ok(seeks.every((s) => (s !== null) === inputSeek), `${path}: plans ${seeks} (seed ${seed})`);
    await reader.close(t.ctx);
  }
  const t = testContext();
  const resampled = await opened({ path: cases[0].path, fps: 10 }, t);
  const k = random.int(60, 99);
  await resampled.seek(k, t.ctx);
  const frame = await nextFrame(resampled, t);
  assertSameBytes(
    frame.pixels.data,
    await decodeFrame(cases[0].path, k, { fps: 10 }),
    `10 fps frame ${k} (seed ${seed})`,
  );
  assert.notEqual(plannedSeeks(t)[0], null, "an input seek counted in 10 fps frames");
  await resampled.close(t.ctx);
});

Deno.test("loop starts over after the last frame and is not finite", async () => {
  const t = testContext();
  const reader = await opened({ path: clip, loop: true, startTs: 0 }, t);
  assert.equal(reader.isFinite, false);
  const expected = await decodeAll(clip, FRAME);
  await reader.seek(48, t.ctx);
  for (const k of [48, 49, 50, 51]) {
    const frame = await nextFrame(reader, t);
    assertSameBytes(frame.pixels.data, expected[k % 50], `frame ${k}`);
    assert.ok(Math.abs(frame.captureTs! - k / 25) < 1e-9);
  }
  await reader.close(t.ctx);
});

Deno.test("realtime plays a file at its frame rate: one frame interval between frames, the same frames", async () => {
  const t = testContext();
  const reader = await opened({ path: clip, realtime: true, fps: 50, startTs: 0 }, t);
  const expected = await decodeAll(clip, FRAME);
  const startedAt = performance.now();
  await reader.seek(40, t.ctx);
  for (const k of [40, 41, 42, 43, 44, 45]) {
    assertSameBytes((await nextFrame(reader, t)).pixels.data, expected[Math.floor(k / 2)], `frame ${k}`);
  }
  // Five intervals of 20 ms at least; no upper bound (a loaded host only makes it slower).
  assert.ok(performance.now() - startedAt >= 100, `${performance.now() - startedAt} ms for 6 frames`);
  await reader.close(t.ctx);
  await assert.rejects(
    new VideoFileReader({ name: "r", path: "rtsp://cam/1", realtime: true }).open(t.ctx),
    (error: unknown) => error instanceof ConfigError && /realtime applies to a file/.test(error.message),
  );
});

Deno.test("END reaps ffmpeg, close() mid-stream kills and reaps it: no child is left", async () => {
  const t = testContext();
  const reader = await opened({ path: clip }, t);
  assert.equal(reader.decoderPid, null, "nothing runs before the first next()");
  await nextFrame(reader, t);
  const first = reader.decoderPid!;
  assert.ok(processExists(first), "the decoder runs while frames are read");
  await drain(reader, t);
  assert.equal(reader.decoderPid, null);
  assert.equal(processExists(first), false, `ffmpeg ${first} is gone after END, not a zombie`);
  await reader.close(t.ctx);

  const midway = await opened({ path: clip }, t);
  await nextFrame(midway, t);
  const second = midway.decoderPid!;
  await midway.close(t.ctx);
  assert.equal(processExists(second), false, `ffmpeg ${second} is gone after close()`);
  assert.equal(await midway.next(t.ctx), END, "a closed reader yields END");
});

Deno.test("seek() replaces the running decoder and reaps the old one", async () => {
  const t = testContext();
  const reader = await opened({ path: clip }, t);
  await nextFrame(reader, t);
  const before = reader.decoderPid!;
  await reader.seek(10, t.ctx);
  assert.equal(processExists(before), false);
  await nextFrame(reader, t);
  assert.notEqual(reader.decoderPid, before);
  await reader.close(t.ctx);
});

Deno.test("a missing file or a file that is not a video is ResourceUnavailable naming the path", async () => {
  const t = testContext();
  const missing = new VideoFileReader({ name: "r", path: `${dir}/nope.mp4` });
  await assert.rejects(missing.open(t.ctx), (error: unknown) => {
    assert.ok(error instanceof ResourceUnavailable);
    assert.match(error.message, /does not exist/);
    assert.equal(error.context.path, `${dir}/nope.mp4`);
    assert.ok(error.remedy);
    return true;
  });
  await Deno.writeTextFile(`${dir}/notes.txt`, "not a video");
  const text = new VideoFileReader({ name: "r", path: `${dir}/notes.txt` });
  await assert.rejects(text.open(t.ctx), ResourceUnavailable);
  await assert.rejects(new VideoFileReader({ name: "r", path: dir }).open(t.ctx), /is not a file/);
});

Deno.test("invalid params are one ConfigError listing each problem", async () => {
  const t = testContext();
  const reader = new VideoFileReader({
    name: "r",
    path: clip,
    width: 0,
    fps: -1,
    pixelFormat: "yuv420p" as "gray",
    maxReconnects: 1.5,
  });
  await assert.rejects(reader.open(t.ctx), (error: unknown) => {
    assert.ok(error instanceof ConfigError);
    for (const word of ["width", "fps", "pixelFormat", "maxReconnects"]) {
      assert.match(error.message, new RegExp(word));
    }
    return true;
  });
  await assert.rejects(new VideoFileReader({ name: "r", path: "" }).open(t.ctx), ConfigError);
  await assert.rejects(
    new VideoFileReader({ name: "r", path: "rtsp://cam/1", loop: true }).open(t.ctx),
    ConfigError,
  );
  const ok = await opened({ path: clip }, t);
  await assert.rejects(ok.seek(-1, t.ctx), ConfigError);
  await ok.close(t.ctx);
  await assert.rejects(
    (async () => await new VideoFileReader({ name: "r", path: clip }).next(t.ctx))(),
    NodeContractError,
  );
});

Deno.test("without ffmpeg on PATH, open() is ResourceUnavailable with the remedy to install it", async () => {
  const empty = await Deno.makeTempDir({ dir });
  const body = `await new VideoFileReader({ name: "r", path: ${JSON.stringify(clip)} }).open(ctx);`;
  const outcome = await withPath("video_file_reader.ts", "VideoFileReader", body, empty);
  const { thrown } = outcome as { thrown: { code: string; remedy: string } };
  assert.equal(thrown?.code, "VF_RESOURCE_UNAVAILABLE", JSON.stringify(outcome));
  assert.match(thrown.remedy, /install ffmpeg/);
});

Deno.test("permissions(): run ffmpeg and ffprobe, read the file itself; a live URL reads nothing", () => {
  const file = new VideoFileReader({ name: "r", path: "clips/a.mp4" }).permissions();
  assert.deepEqual(file.run, ["ffmpeg", "ffprobe"]);
  assert.deepEqual(file.read, ["clips/a.mp4"]);
  assert.deepEqual([file.write, file.net, file.env, file.ffi, file.sys], [[], [], [], [], []]);
  const live = new VideoFileReader({ name: "r", path: "rtsp://cam.local:554/stream" });
  assert.deepEqual(live.permissions().read, []);
  assert.equal(live.isFinite, false);
  assert.equal(new VideoFileReader({ name: "r", path: "a.mp4" }).isFinite, true);
  assert.equal(new VideoFileReader({ name: "r", path: "a.mp4", isFinite: false }).isFinite, false);
  assert.equal(VideoFileReader.replayable, true);
  assert.deepEqual(
    ["rtsp://h/s", "tcp://127.0.0.1:9", "RTMP://h/a", "clips/a.mp4", "/abs/a b.mkv", "c:/x.mp4"].map(
      isLiveSource,
    ),
    [true, true, true, false, false, false],
  );
});

/** A TCP server that sends each connection `bytes` (then closes it), or nothing while `silent`. */
function serve(bytes: Uint8Array | null) {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const connections: Deno.Conn[] = [];
  let served = 0;
  const done = (async () => {
    for await (const conn of listener) {
      connections.push(conn);
      served += 1;
      if (bytes === null) continue;
      await conn.write(bytes).then(() => {}, () => {});
      conn.close();
      connections.splice(connections.indexOf(conn), 1);
    }
  })();
  return {
    url: `tcp://127.0.0.1:${(listener.addr as Deno.NetAddr).port}`,
    served: () => served,
    async stop() {
      listener.close();
      for (const conn of connections) conn.close();
      await done;
    },
  };
}

/** The URL of a port nothing listens on any more. */
async function deadUrl(): Promise<string> {
  const server = serve(null);
  await server.stop();
  return server.url;
}

const streamBytes = await Deno.readFile(await makeClip(`${dir}/stream.ts`));

Deno.test("a live source that ends is redialled and frames keep coming", async () => {
  const server = serve(streamBytes);
  const t = testContext();
  const reader = await opened({ path: server.url, reconnectDelaySeconds: 0.05, maxReconnects: 3 }, t);
  const expected = await decodeAll(clip, FRAME);
  for (let i = 0; i < 120; i++) {
    const frame = await nextFrame(reader, t);
    assert.deepEqual(frame.pixels.shape, [240, 320, 3]);
    assertSameBytes(frame.pixels.data, expected[i % 50], `frame ${i}`);
  }
  const reconnects = t.logger.records.filter((r) => r.level === "warn");
  assert.equal(reconnects.length, 2, "two ends, two redials");
  assert.ok(reconnects.every((r) => r.fields.attempt === 1), "a frame resets the failure count");
  assert.ok(
    reconnects.every((r) => r.fields.reason === "the source ended its stream"),
    "a clean end says so",
  );
  await reader.close(t.ctx);
  await server.stop();
});

Deno.test("a dead live source fails with ResourceUnavailable after its reconnect budget, backing off", async () => {
  const t = testContext();
  const reader = await opened({
    path: await deadUrl(),
    reconnectDelaySeconds: 0.02,
    reconnectMaxDelaySeconds: 0.05,
    maxReconnects: 3,
  }, t);
  await assert.rejects(reader.next(t.ctx), (error: unknown) => {
    assert.ok(error instanceof ResourceUnavailable);
    assert.match(error.message, /failed 4 times in a row/);
    return true;
  });
  const delays = t.logger.records.filter((r) => r.level === "warn").map((r) => r.fields.delay_seconds);
  assert.deepEqual(delays, [0.02, 0.04, 0.05]);
  await reader.close(t.ctx);
});

Deno.test("a live source that stalls is dropped after its first-frame timeout, says so, and counts as a failure", async () => {
  const server = serve(null);
  const t = testContext();
  const reader = await opened({
    path: server.url,
    width: 320,
    height: 240,
    readTimeoutSeconds: 0.2,
    firstFrameTimeoutSeconds: 0.3,
    reconnectDelaySeconds: 0.02,
    maxReconnects: 1,
  }, t);
  const started = performance.now();
  await assert.rejects(reader.next(t.ctx), ResourceUnavailable);
  const seconds = (performance.now() - started) / 1000;
  assert.ok(seconds >= 0.6 && seconds < 5, `two stalls of 0.3 s took ${seconds} s`);
  assert.equal(server.served(), 2);
  const reasons = t.logger.records.filter((r) => r.level === "warn").map((r) => String(r.fields.reason));
  assert.ok(
    reasons.length > 0 &&
      reasons.every((r) => r === "the source sent no frame for 0.3 s, so the connection was dropped"),
    reasons.join("\n"),
  );
  await reader.close(t.ctx);
  await server.stop();
});

Deno.test("an unsized live source's probe gets the first-frame budget, and a stalled one says it timed out", async () => {
  const server = serve(null);
  const t = testContext();
  const reader = await opened({
    path: server.url,
    readTimeoutSeconds: 0.1,
    firstFrameTimeoutSeconds: 0.6,
    reconnectDelaySeconds: 0.02,
    maxReconnects: 0,
  }, t);
  const started = performance.now();
  await assert.rejects(reader.next(t.ctx), (error: unknown) => {
    assert.ok(error instanceof ResourceUnavailable);
    assert.match(error.message, /ffprobe found no video stream in 0.6 s/);
    return true;
  });
  const seconds = (performance.now() - started) / 1000;
  assert.ok(seconds >= 0.6 && seconds < 5, `the probe had 0.6 s, not the 0.1 s read timeout: ${seconds} s`);
  await reader.close(t.ctx);
  await server.stop();
});

Deno.test("close() during a reconnect wait ends the pending next() with END at once", async () => {
  const t = testContext();
  const reader = await opened(
    { path: await deadUrl(), width: 320, height: 240, reconnectDelaySeconds: 60 },
    t,
  );
  const pending = reader.next(t.ctx);
  while (!t.logger.records.some((r) => r.level === "warn")) await new Promise((r) => setTimeout(r, 10));
  const started = performance.now();
  await reader.close(t.ctx);
  assert.equal(await pending, END);
  assert.ok(performance.now() - started < 2000, "close() did not wait out the 60 s backoff");
});

Deno.test("the flow's stop during a reconnect wait or a probe ends the pending next() with END, counting no failure", async () => {
  for (const params of [{ width: 320, height: 240 }, {}]) {
    const t = testContext();
    const reader = await opened({
      path: await deadUrl(),
      reconnectDelaySeconds: 60,
      maxReconnects: 1,
      ...params,
    }, t);
    const pending = reader.next(t.ctx);
    while (!t.logger.records.some((r) => r.level === "warn")) await new Promise((r) => setTimeout(r, 10));
    const started = performance.now();
    t.stop.abort();
    assert.equal(await pending, END);
    assert.ok(performance.now() - started < 2000, "the stop did not wait out the 60 s backoff");
    assert.equal(
      t.logger.records.filter((r) => r.level === "warn").length,
      1,
      "no failure counted past the stop",
    );
    assert.equal(await reader.next(t.ctx), END, "END stays END");
    await reader.close(t.ctx);
  }
});

Deno.test("with exactly the declared permissions, a worker's reader decodes frames", async () => {
  const body = `
    const reader = new VideoFileReader({ name: "r", path: ${JSON.stringify(clip)} });
    await reader.open(ctx);
    await reader.seek(5, ctx);
    const frame = await reader.next(ctx);
    await reader.close(ctx);
    return frame.pixels.shape;`;
  const granted = new VideoFileReader({ name: "r", path: clip }).permissions();
  assert.deepEqual(await inSandbox("video_file_reader.ts", "VideoFileReader", body, granted), [240, 320, 3]);
});
