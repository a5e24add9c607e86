/**
 * What the local engine's topology for video costs at its leanest, beside one bare Deno program, in the
 * same run: the bound a flow decode → per-frame mean → sink can reach on this machine under each design.
 *
 * - The bare program (baseline): ffmpeg decoding a 720p clip to bgr24 on a pipe, read frame by frame into
 *   one reused array, the mean of channel 0 of each frame, all in this thread.
 * - Lean topology, as the local engine moves frames: a decoder Worker reads each frame into a fresh
 *   ArrayBuffer and moves it to the main thread (the broker), which keeps it for redelivery, copies it
 *   into another fresh ArrayBuffer and moves that to the mean Worker; the mean's answer comes back, the
 *   kept frame is dropped, and the answer goes on to a sink Worker. Nothing else: no envelopes, ids,
 *   ledger or settlements.
 * - The same, with the broker copying each frame into one it kept and no longer needs (its reader
 *   answered) instead of a fresh ArrayBuffer: what reusing released bodies would save. A fresh 2.7 MB
 *   buffer costs far more than the copy into it (its pages are faulted in and zeroed on first touch).
 *
 * Each iteration decodes the whole clip ({@link FRAMES} frames), so frames/s = FRAMES / time per
 * iteration. The clip is generated (`makeClip`, ffmpeg `testsrc`) into a temporary directory when the bench loads.
 *
 * Run: `deno bench -A bench/video_topology_bench.ts`.
 *
 * @module
 */

import type { TopologyRole } from "./_video_topology_worker.ts";
import { channelMeanOf } from "../tasks/_bench_flows/channel_mean.ts";
import { eachFrame, FRAME_BYTES, makeClip } from "../tasks/_bench_flows/raw_video.ts";

const FRAMES = 150;
const dir = await Deno.makeTempDir({ prefix: "vf_bench_" });
const clip = `${dir}/clip_720p.mp4`;
await makeClip(clip, FRAMES);
globalThis.addEventListener("unload", () => Deno.removeSync(dir, { recursive: true }));

function worker(role: TopologyRole): Worker {
  const started = new Worker(new URL("./_video_topology_worker.ts", import.meta.url), { type: "module" });
  started.postMessage(role);
  return started;
}

const decoder = worker({ role: "decode", clip, frameBytes: FRAME_BYTES });
const meaner = worker({ role: "mean" });
const sink = worker({ role: "sink" });
globalThis.addEventListener("unload", () => [decoder, meaner, sink].forEach((w) => w.terminate()));

/** One pass of the clip through the lean topology; `reuse`: the broker copies into released frames. */
function lean(reuse: boolean): Promise<void> {
  const kept = new Map<number, ArrayBuffer>();
  const released: ArrayBuffer[] = [];
  let arrived = 0;
  return new Promise((resolve) => {
    decoder.onmessage = (event: MessageEvent<{ seq: number; buffer: ArrayBuffer }>) => {
      const { seq, buffer } = event.data;
      kept.set(seq, buffer);
      const copy = released.pop() ?? new ArrayBuffer(buffer.byteLength);
      new Uint8Array(copy).set(new Uint8Array(buffer));
      meaner.postMessage({ seq, buffer: copy }, [copy]);
    };
    meaner.onmessage = (event: MessageEvent<{ seq: number; mean: number }>) => {
      const body = kept.get(event.data.seq)!;
      kept.delete(event.data.seq);
      if (reuse) released.push(body);
      sink.postMessage(event.data);
    };
    sink.onmessage = () => {
      if (++arrived === FRAMES) resolve();
    };
    decoder.postMessage("start");
  });
}

Deno.bench({
  name: `bare program: ${FRAMES} frames 1280x720 from ffmpeg's pipe into one array, a mean of each`,
  group: "720p decode → mean → sink",
  baseline: true,
  n: 6,
  warmup: 1,
  async fn() {
    const frames = await eachFrame(clip, (frame) => {
      if (Number.isNaN(channelMeanOf(frame, 3, 0))) throw new Error("no mean");
    });
    if (frames !== FRAMES) throw new Error(`the bare program read ${frames} frames`);
  },
});

Deno.bench({
  name: "lean topology: decoder → broker (keeps it, copies it fresh) → mean → sink, every frame moved",
  group: "720p decode → mean → sink",
  n: 6,
  warmup: 1,
  async fn() {
    await lean(false);
  },
});

Deno.bench({
  name: "lean topology, the broker copying into frames it no longer needs instead of fresh buffers",
  group: "720p decode → mean → sink",
  n: 6,
  warmup: 1,
  async fn() {
    await lean(true);
  },
});
