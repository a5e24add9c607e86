// deno-lint-ignore-file no-import-prefix no-unversioned-import
/**
 * Two cameras joined by event time: camera A films at 15 frames/s, camera B at 10; their frames pair up
 * when their capture times are within 20 ms, and a frame with no partner is still emitted after two
 * seconds (a quorum of one). One JSON line per moment: each camera's mean brightness, or null where that
 * camera had no frame.
 *
 * Run it with `deno task vf run-local examples/multi_camera.ts`; the output lands in `examples/out/`.
 */
import {
  Flow,
  type Frame,
  JoinPolicy,
  JsonlSink,
  ProcessorNode,
  type RuntimeContext,
  VideoFileReader,
} from "jsr:@videoflow/cli";

/** One moment seen by both cameras (or by one of them). */
export interface Moment {
  readonly ts: number | null;
  readonly a: number | null;
  readonly b: number | null;
}

function brightness(frame: Frame | null): number | null {
  if (frame === null) return null;
  const pixels = frame.pixels.data;
  let total = 0;
  for (let i = 0; i < pixels.length; i++) total += pixels[i];
  return Math.round((total / pixels.length) * 100) / 100;
}

/** Compares what the two cameras saw at one moment. */
export class CompareCameras extends ProcessorNode {
  process([a, b]: [Frame | null, Frame | null], ctx: RuntimeContext): Moment {
    const times = Object.values(ctx.inputInfo ?? {}).flatMap((info) =>
      info === null || Array.isArray(info) || info.eventTs === null ? [] : [info.eventTs]
    );
    return { ts: times.length === 0 ? null : Math.min(...times), a: brightness(a), b: brightness(b) };
  }
}

const start = 1_700_000_000;
const camA = new VideoFileReader({ name: "cam-a", path: "examples/clips/cam_a.mp4", startTs: start });
const camB = new VideoFileReader({ name: "cam-b", path: "examples/clips/cam_b.mp4", startTs: start });
const compare = new CompareCameras({
  name: "compare",
  joinPolicy: new JoinPolicy({
    mode: "time",
    toleranceMs: 20,
    quorum: 1,
    timeoutSeconds: 2,
    missing: "drop",
  }),
}).from(camA, camB);
const sink = new JsonlSink({ name: "moments", path: "examples/out/multi_camera.jsonl" }).from(compare);

export default new Flow([sink], { flowType: "batch", flowId: "multi-camera" });
