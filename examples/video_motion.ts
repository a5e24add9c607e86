// deno-lint-ignore-file no-import-prefix no-unversioned-import
/**
 * Motion in a clip: decode it, score the motion between consecutive frames, write one JSON line per frame
 * (its score and whether it moved) and an annotated copy of the clip with a bar as wide as the motion.
 *
 * Run it with `deno task vf run-local examples/video_motion.ts`; the outputs land in `examples/out/`.
 */
import {
  Flow,
  Frame,
  FrameWriter,
  JsonlSink,
  OneTaskProcessorNode,
  ProcessorNode,
  type RuntimeContext,
  Tensor,
  VideoFileReader,
} from "jsr:@videoflow/cli";

/** One frame's motion: the mean absolute difference from the previous frame, 0..255. */
export interface Motion {
  readonly index: number;
  readonly score: number;
  readonly moving: boolean;
}

/** Scores each frame against the one before it; stateful, so one replica sees every frame in order. */
export class MotionScore extends OneTaskProcessorNode<{ threshold: number }> {
  #previous: Uint8Array | null = null;
  #index = 0;

  process(frame: Frame): Motion {
    const pixels = frame.pixels.data;
    let total = 0;
    if (this.#previous !== null && this.#previous.length === pixels.length) {
      for (let i = 0; i < pixels.length; i++) total += Math.abs(pixels[i] - this.#previous[i]);
    }
    this.#previous = pixels.slice();
    const score = pixels.length === 0 ? 0 : total / pixels.length;
    return {
      index: this.#index++,
      score: Math.round(score * 1000) / 1000,
      moving: score > this.params.threshold,
    };
  }
}

/** Draws a red bar across the top of the frame, as wide as the motion score (8 pixels high). */
export class Annotate extends ProcessorNode {
  process([frame, motion]: [Frame, Motion], _ctx: RuntimeContext): Frame {
    const [height, width, channels] = frame.pixels.shape;
    const pixels = frame.pixels.data.slice();
    const bar = Math.min(width, Math.round((motion.score / 32) * width));
    for (let y = 0; y < Math.min(8, height); y++) {
      for (let x = 0; x < bar; x++) {
        const at = (y * width + x) * channels;
        pixels.set([0, 0, 255], at);
      }
    }
    return new Frame(
      new Tensor([height, width, channels], "uint8", pixels),
      frame.pixelFormat,
      frame.captureTs,
    );
  }
}

const clip = new VideoFileReader({ name: "clip", path: "examples/clips/cam_a.mp4", startTs: 1_700_000_000 });
const motion = new MotionScore({ name: "motion", threshold: 1 }).from(clip);
const annotated = new Annotate({ name: "annotate" }).from(clip, motion);
const events = new JsonlSink({ name: "events", path: "examples/out/motion_events.jsonl" }).from(motion);
const writer = new FrameWriter({ name: "writer", path: "examples/out/motion_annotated.mp4", fps: 15 }).from(
  annotated,
);

export default new Flow([events, writer], { flowType: "batch", flowId: "video-motion" });
