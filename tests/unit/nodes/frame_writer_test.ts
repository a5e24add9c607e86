import assert from "node:assert/strict";
import {
  ConfigError,
  NodeContractError,
  POISON,
  ResourceUnavailable,
  SchemaError,
  WorkerFatal,
} from "../../../src/core/errors.ts";
import { FrameWriter, type FrameWriterParams } from "../../../src/nodes/frame_writer.ts";
import { Frame, Tensor } from "../../../src/wire/value.ts";
import { SeededRandom, testSeed } from "../../support/random.ts";
import {
  assertSameBytes,
  decodeAll,
  makeClip,
  processExists,
  type TestContext,
  testContext,
} from "../../fixtures/video/clips.ts";

const dir = await Deno.makeTempDir({ prefix: "vf_writer_" });
const clip = await makeClip(`${dir}/clip.mp4`, { size: "160x120", frames: 20 });
const W = 160;
const H = 120;

globalThis.addEventListener("unload", () => Deno.removeSync(dir, { recursive: true }));

async function sourceFrames(pixFmt: string, pixelFormat: string, channels: number): Promise<Frame[]> {
  const raw = await decodeAll(clip, W * H * channels, pixFmt);
  return raw.map((bytes) => new Frame(Tensor.from(bytes.slice(), [H, W, channels]), pixelFormat));
}

async function opened(params: FrameWriterParams, t: TestContext) {
  const writer = new FrameWriter({ name: "writer", ...params });
  await writer.open(t.ctx);
  return writer;
}

async function probe(path: string, entries: string): Promise<string> {
  const out = await new Deno.Command("ffprobe", {
    args: [
      "-v",
      "error",
      "-count_frames",
      "-select_streams",
      "v:0",
      "-show_entries",
      entries,
      "-of",
      "csv=p=0",
      path,
    ],
  }).output();
  return new TextDecoder().decode(out.stdout).trim();
}

Deno.test("frames written with a lossless codec decode back to the same frames, at the declared rate", async () => {
  for (
    const [pixFmt, pixelFormat, channels] of [["bgr24", "bgr8", 3], ["rgb24", "rgb8", 3], [
      "gray",
      "gray8",
      1,
    ]]
  ) {
    const t = testContext();
    const frames = await sourceFrames(pixFmt as string, pixelFormat as string, channels as number);
    const path = `${dir}/round_${pixelFormat}.mkv`;
    const writer = await opened({ path, fps: 10, codec: "ffv1" }, t);
    for (const frame of frames) await writer.consume(frame, t.ctx);
    await writer.close(t.ctx);
    const back = await decodeAll(path, W * H * (channels as number), pixFmt as string);
    assert.equal(back.length, frames.length, `${pixelFormat}: frame count`);
    back.forEach((bytes, i) => assertSameBytes(bytes, frames[i].pixels.data, `${pixelFormat} frame ${i}`));
    assert.equal(await probe(path, "stream=r_frame_rate,codec_name"), "ffv1,10/1");
  }
});

Deno.test("a lossy codec round trip keeps the frame count and stays close to the pixels", async () => {
  const t = testContext();
  const frames = await sourceFrames("bgr24", "bgr8", 3);
  const path = `${dir}/lossy.mp4`;
  const writer = await opened({ path, fps: 25, codec: "libx264" }, t);
  for (const frame of frames) await writer.consume(frame, t.ctx);
  await writer.close(t.ctx);
  const back = await decodeAll(path, W * H * 3);
  assert.equal(back.length, frames.length);
  for (const i of [0, 10, 19]) {
    const original = frames[i].pixels.data;
    const meanError = back[i].reduce((sum, byte, at) => sum + Math.abs(byte - original[at]), 0) /
      original.length;
    assert.ok(meanError < 8, `frame ${i}: mean absolute error ${meanError}`);
  }
});

Deno.test("the default MP4 encoding is 4:2:0, what players decode, when both sides are even", async () => {
  const t = testContext();
  const frames = await sourceFrames("bgr24", "bgr8", 3);
  const path = `${dir}/playable.mp4`;
  const writer = await opened({ path, fps: 25 }, t);
  for (const frame of frames) await writer.consume(frame, t.ctx);
  await writer.close(t.ctx);
  assert.equal(await probe(path, "stream=pix_fmt,nb_read_frames"), "yuv420p,20");
});

Deno.test("gray8 frames of shape [h, w] are accepted as [h, w, 1]", async () => {
  const t = testContext();
  const [frame] = await sourceFrames("gray", "gray8", 1);
  const flat = new Frame(new Tensor([H, W], "uint8", frame.pixels.data), "gray8");
  const path = `${dir}/flat.mkv`;
  const writer = await opened({ path, fps: 5, codec: "ffv1" }, t);
  await writer.consume(flat, t.ctx);
  await writer.consume(frame, t.ctx);
  await writer.close(t.ctx);
  assert.equal((await decodeAll(path, W * H, "gray")).length, 2);
});

Deno.test("a frame of another size or layout is poison; the file goes on without it", async () => {
  const seed = testSeed();
  const random = new SeededRandom(seed);
  const t = testContext();
  const frames = await sourceFrames("bgr24", "bgr8", 3);
  const path = `${dir}/mixed.mkv`;
  const writer = await opened({ path, fps: 25, codec: "ffv1" }, t);
  const misfits = [
    new Frame(Tensor.from(new Uint8Array(8 * 8 * 3), [8, 8, 3]), "bgr8"),
    new Frame(frames[0].pixels, "rgb8"),
    new Frame(Tensor.from(new Uint8Array(W * H), [H, W, 1]), "gray8"),
  ];
  let written = 0;
  for (const frame of frames) {
    await writer.consume(frame, t.ctx);
    written += 1;
    if (random.chance(0.3)) {
      const misfit = random.pick(misfits);
      await assert.rejects(writer.consume(misfit, t.ctx), (error: unknown) => {
        assert.ok(error instanceof SchemaError, `seed ${seed}`);
        assert.equal(error.disposition, POISON);
        assert.match(error.message, /cannot join a 160x120 bgr8 video/);
        return true;
      });
    }
  }
  await writer.close(t.ctx);
  assert.equal((await decodeAll(path, W * H * 3)).length, written, `seed ${seed}`);
});

Deno.test("anything but a uint8 bgr8/rgb8/gray8 frame is a SchemaError before ffmpeg starts", async () => {
  const t = testContext();
  const writer = await opened({ path: `${dir}/never.mkv`, fps: 25 }, t);
  const bad = [
    "a string",
    Tensor.from(new Uint8Array(12), [2, 2, 3]),
    new Frame(Tensor.from(new Uint8Array(12), [2, 2, 3]), "yuv420p"),
    new Frame(Tensor.from(new Float32Array(12), [2, 2, 3]), "bgr8"),
    new Frame(Tensor.from(new Uint8Array(16), [2, 2, 4]), "bgr8"),
    new Frame(Tensor.from(new Uint8Array(0), [0, 2, 3]), "bgr8"),
  ];
  for (const input of bad) await assert.rejects(writer.consume(input, t.ctx), SchemaError);
  assert.equal(writer.encoderPid, null);
  await writer.close(t.ctx);
  await assert.rejects(Deno.stat(`${dir}/never.mkv`), Deno.errors.NotFound, "no frame, no file");
});

Deno.test("close() finishes the file and reaps ffmpeg; consume() after close() is a contract error", async () => {
  const t = testContext();
  const frames = await sourceFrames("bgr24", "bgr8", 3);
  const writer = await opened({ path: `${dir}/reaped.mkv`, fps: 25, codec: "ffv1" }, t);
  await writer.consume(frames[0], t.ctx);
  const pid = writer.encoderPid!;
  assert.ok(processExists(pid));
  await writer.close(t.ctx);
  assert.equal(processExists(pid), false, `ffmpeg ${pid} was reaped`);
  assert.equal(writer.encoderPid, null);
  await assert.rejects(writer.consume(frames[1], t.ctx), NodeContractError);
});

Deno.test("an output directory that does not exist is ResourceUnavailable at open(), naming it", async () => {
  const t = testContext();
  const writer = new FrameWriter({
    name: "writer",
    path: `${dir}/missing/dir/out.mkv`,
    fps: 25,
    codec: "ffv1",
  });
  await assert.rejects(writer.open(t.ctx), (error: unknown) => {
    assert.ok(error instanceof ResourceUnavailable, String(error));
    assert.match(error.message, /the parts directory .*missing\/dir\/out\.mkv\.parts cannot be made/);
    assert.equal(error.exitCode, 3);
    return true;
  });
  await assert.rejects(Deno.stat(`${dir}/missing`), Deno.errors.NotFound, "no directory was made");
});

Deno.test("an encoder ffmpeg cannot run is WorkerFatal carrying ffmpeg's own words", async () => {
  const frames = await sourceFrames("bgr24", "bgr8", 3);
  for (
    const [params, words] of [
      [{ path: `${dir}/codec.mkv`, fps: 25, codec: "no_such_encoder" }, /no_such_encoder/],
    ] as const
  ) {
    const t = testContext();
    const writer = await opened(params, t);
    const failure = async () => {
      for (const frame of frames) await writer.consume(frame, t.ctx);
      await writer.close(t.ctx);
    };
    await assert.rejects(failure(), (error: unknown) => {
      assert.ok(error instanceof WorkerFatal, String(error));
      assert.match(error.message, words);
      assert.ok(error.remedy);
      return true;
    });
    const pid = writer.encoderPid;
    await writer.close(t.ctx).catch(() => {});
    if (pid !== null) assert.equal(processExists(pid), false);
  }
});

Deno.test("invalid params are a ConfigError at open()", async () => {
  const t = testContext();
  for (
    const params of [
      { path: "", fps: 25 },
      { path: "a.mkv", fps: 0 },
      { path: "a.mkv", fps: 25, codec: "x264 -evil" },
    ]
  ) {
    await assert.rejects(new FrameWriter({ name: "w", ...params }).open(t.ctx), ConfigError);
  }
});

Deno.test("permissions(): run ffmpeg and ffprobe, read and write the output file and its parts, nothing else", () => {
  const granted = new FrameWriter({ name: "w", path: "out/a.mkv", fps: 25 }).permissions();
  assert.deepEqual(granted.run, ["ffmpeg", "ffprobe"]);
  assert.deepEqual(granted.write, ["out/a.mkv", "out/a.mkv.parts"]);
  assert.deepEqual(granted.read, ["out/a.mkv", "out/a.mkv.parts"]);
  assert.deepEqual([granted.net, granted.env, granted.ffi, granted.sys], [[], [], [], []]);
});

Deno.test("a writer restarted after a crash adds to the frames its first launch wrote; a new run starts over", async () => {
  const frames = await sourceFrames("bgr24", "bgr8", 3);
  for (const [ext, codec] of [[".mkv", "ffv1"], [".mp4", "mpeg4"]]) {
    const path = `${dir}/restarted${ext}`;
    // The first launch dies mid-stream: its encoder is killed, and close() never runs.
    const first = await opened({ path, fps: 10, codec }, testContext());
    for (const frame of frames.slice(0, 12)) await first.consume(frame, testContext().ctx);
    await new Promise((resolve) => setTimeout(resolve, 500));
    Deno.kill(first.encoderPid!, "SIGKILL");
    const t = testContext();
    const second = await opened({ path, fps: 10, codec }, t);
    for (const frame of frames.slice(12)) await second.consume(frame, t.ctx);
    await second.close(t.ctx);
    const back = await decodeAll(path, W * H * 3);
    // Parts are cut at most a second (10 frames) apart, so the first ten frames outlive the kill.
    assert.ok(back.length >= 18, `${ext}: the first launch's frames stayed (${back.length} in all)`);
    if (ext === ".mkv") {
      assertSameBytes(back[0], frames[0].pixels.data, "the first frame first");
      back.slice(-8).forEach((bytes, i) =>
        assertSameBytes(bytes, frames[12 + i].pixels.data, `frame ${12 + i}`)
      );
    }
    // A new run of the flow replaces the file.
    const fresh = testContext("node", "r2");
    const third = await opened({ path, fps: 10, codec }, fresh);
    for (const frame of frames.slice(0, 3)) await third.consume(frame, fresh.ctx);
    await third.close(fresh.ctx);
    assert.equal((await decodeAll(path, W * H * 3)).length, 3, `${ext}: a new run starts over`);
  }
});

Deno.test("a restarted writer keeps the size its run's first frame fixed: a frame of another size is still poison", async () => {
  const frames = await sourceFrames("bgr24", "bgr8", 3);
  const small = new Frame(Tensor.from(new Uint8Array(80 * 60 * 3), [60, 80, 3]), "bgr8");
  const path = `${dir}/resized.mkv`;
  const first = await opened({ path, fps: 10, codec: "ffv1" }, testContext());
  for (const frame of frames.slice(0, 5)) await first.consume(frame, testContext().ctx);
  await first.close(testContext().ctx);
  const t = testContext();
  const second = await opened({ path, fps: 10, codec: "ffv1" }, t);
  await assert.rejects(
    second.consume(small, t.ctx),
    SchemaError,
    "the restart's first frame does not reset the size",
  );
  for (const frame of frames.slice(5, 10)) await second.consume(frame, t.ctx);
  await second.close(t.ctx);
  assert.equal(await probe(path, "stream=width,height,nb_read_frames"), "160,120,10");
});

Deno.test("a part whose encoder died before writing a frame is left out of the file, with a warning", async () => {
  const frames = await sourceFrames("bgr24", "bgr8", 3);
  const path = `${dir}/empty_part.mkv`;
  const first = await opened({ path, fps: 10, codec: "ffv1" }, testContext());
  await first.consume(frames[0], testContext().ctx);
  Deno.kill(first.encoderPid!, "SIGKILL");
  const t = testContext();
  const second = await opened({ path, fps: 10, codec: "ffv1" }, t);
  for (const frame of frames.slice(1, 4)) await second.consume(frame, t.ctx);
  await second.close(t.ctx);
  const back = await decodeAll(path, W * H * 3);
  assert.ok(back.length === 3 || back.length === 4, `${back.length} frames`);
  assertSameBytes(back[back.length - 1], frames[3].pixels.data, "the second launch's last frame last");
});

Deno.test("a run resumed after a clean stop appends to the file its first part closed", async () => {
  const frames = await sourceFrames("bgr24", "bgr8", 3);
  const path = `${dir}/resumed.mkv`;
  for (const part of [frames.slice(0, 8), frames.slice(8)]) {
    const t = testContext();
    const writer = await opened({ path, fps: 10, codec: "ffv1" }, t);
    for (const frame of part) await writer.consume(frame, t.ctx);
    await writer.close(t.ctx);
  }
  const back = await decodeAll(path, W * H * 3);
  assert.equal(back.length, frames.length);
  back.forEach((bytes, i) => assertSameBytes(bytes, frames[i].pixels.data, `frame ${i}`));
  const kept = [...Deno.readDirSync(`${path}.parts`)].map((entry) => entry.name).sort();
  assert.deepEqual(kept, ["000000.mkv", "layout", "run"], "the file itself, linked as the first part");
  assert.equal(Deno.statSync(`${path}.parts/000000.mkv`).ino, Deno.statSync(path).ino, "a link, not a copy");
});

Deno.test("a new run that ends before its first frame leaves the last run's file and parts as they were", async () => {
  const frames = await sourceFrames("bgr24", "bgr8", 3);
  const path = `${dir}/kept.mkv`;
  const t = testContext("node", "r1");
  const first = await opened({ path, fps: 10, codec: "ffv1" }, t);
  for (const frame of frames.slice(0, 4)) await first.consume(frame, t.ctx);
  await first.close(t.ctx);
  const fresh = testContext("node", "r2");
  const idle = await opened({ path, fps: 10, codec: "ffv1" }, fresh);
  await idle.close(fresh.ctx);
  assert.equal((await decodeAll(path, W * H * 3)).length, 4, "the earlier run's file is intact");
  assert.equal(Deno.readTextFileSync(`${path}.parts/run`), "f/r1", "and its parts still belong to it");
});
