/**
 * Frames per second of {@link VideoFileReader} decoding a 720p H.264 clip into bgr8 Frames, beside its
 * floor in the same run: `ffmpeg` decoding the same clip to bgr24 raw video on a pipe that Deno drains.
 * Each iteration decodes the whole clip ({@link FRAMES} frames), so frames/s = FRAMES / time per iteration.
 * The clip is generated (ffmpeg `testsrc2`) into a temporary directory when the bench loads.
 *
 * Run: `deno bench -A bench/video_decode_bench.ts`.
 *
 * @module
 */

import { RuntimeContext } from "../src/core/context.ts";
import { END } from "../src/core/node.ts";
import { VideoFileReader } from "../src/nodes/video_file_reader.ts";

const FRAMES = 150;
const dir = await Deno.makeTempDir({ prefix: "vf_bench_" });
const clip = `${dir}/clip_720p.mp4`;
const made = await new Deno.Command("ffmpeg", {
  args: [
    ...[
      "-hide_banner",
      "-nostdin",
      "-loglevel",
      "error",
      "-f",
      "lavfi",
      "-i",
      "testsrc2=size=1280x720:rate=25",
    ],
    ...["-frames:v", String(FRAMES), "-c:v", "libx264", "-pix_fmt", "yuv420p", "-y", clip],
  ],
}).output();
if (!made.success) throw new Error(`cannot make the bench clip: ${new TextDecoder().decode(made.stderr)}`);
globalThis.addEventListener("unload", () => Deno.removeSync(dir, { recursive: true }));

const silent = { debug() {}, info() {}, warn() {}, error() {} };
const ctx = new RuntimeContext({ flowId: "bench", runId: "bench", nodeName: "reader", replicaId: 0 }, silent);

Deno.bench({
  name: `ffmpeg alone: ${FRAMES} frames 1280x720 to bgr24 on a pipe (floor)`,
  group: "decode 720p",
  baseline: true,
  n: 10,
  warmup: 2,
  async fn() {
    const child = new Deno.Command("ffmpeg", {
      args: [
        "-hide_banner",
        "-nostdin",
        "-loglevel",
        "error",
        "-i",
        clip,
        "-f",
        "rawvideo",
        "-pix_fmt",
        "bgr24",
        "-",
      ],
      stdout: "piped",
      stdin: "null",
    }).spawn();
    let bytes = 0;
    for await (const chunk of child.stdout) bytes += chunk.length;
    await child.status;
    if (bytes !== FRAMES * 1280 * 720 * 3) throw new Error(`ffmpeg gave ${bytes} bytes`);
  },
});

Deno.bench({
  name: `VideoFileReader: ${FRAMES} bgr8 Frames 1280x720 (open, next until END, close)`,
  group: "decode 720p",
  n: 10,
  warmup: 2,
  async fn() {
    const reader = new VideoFileReader({ name: "reader", path: clip });
    await reader.open(ctx);
    let frames = 0;
    while ((await reader.next(ctx)) !== END) frames += 1;
    await reader.close(ctx);
    if (frames !== FRAMES) throw new Error(`the reader gave ${frames} frames`);
  },
});
