/**
 * {@link FrameWriter}: a sink that encodes the frames it receives into a video file with an `ffmpeg`
 * subprocess fed raw video on stdin.
 *
 * ```ts
 * const out = new FrameWriter({ name: "out", path: "out/annotated.mkv", fps: 25, codec: "ffv1" }).from(frames);
 * ```
 *
 * @module
 */

import type { RuntimeContext } from "../core/context.ts";
import { ConfigError, NodeContractError, SchemaError, WorkerFatal } from "../core/errors.ts";
import type { NodePermissions } from "../core/node.ts";
import { ConsumerNode } from "../core/node.ts";
import { Frame } from "../wire/value.ts";
import { FFMPEG, QUIET, RAW_FORMATS, type RawFormat, rawFormatOf, ToolProcess } from "./_ffmpeg.ts";

/** Params of a {@link FrameWriter}. */
export interface FrameWriterParams {
  /** The video file to write (replaced if it exists); its extension picks the container. */
  readonly path: string;
  /** The frame rate the file declares. */
  readonly fps: number;
  /** An ffmpeg encoder name (`ffv1`, `libx264` ...); default the container's own default encoder. */
  readonly codec?: string;
}

/** The layout every frame of one file must share: the first frame's. */
interface Layout {
  readonly format: RawFormat;
  readonly pixelFormat: string;
  readonly width: number;
  readonly height: number;
}

/**
 * Encodes received {@link Frame}s (`bgr8`, `rgb8` or `gray8`, `uint8` pixels of shape `[h, w, c]`, or
 * `[h, w]` for gray) into `path`. The first frame fixes the size and layout and starts `ffmpeg`; a later
 * frame of another size or layout, or anything that is not such a frame, is a {@link SchemaError}
 * (poison: dead-lettered, the file goes on without it). `close()` ends ffmpeg's input, waits for it and
 * checks its exit status, so a file is complete once `close()` resolves; no frame means no file.
 * An encoder that fails (an unknown codec, an unwritable path) is {@link WorkerFatal}, with ffmpeg's own
 * words; invalid params are {@link ConfigError}.
 */
export class FrameWriter extends ConsumerNode<FrameWriterParams> {
  #encoder: ToolProcess | null = null;
  #layout: Layout | null = null;
  #opened = false;

  /** The process id of the running ffmpeg encoder, or `null` before the first frame and after `close()`. */
  get encoderPid(): number | null {
    return this.#encoder?.pid ?? null;
  }

  /** Runs `ffmpeg`, which writes `path` (declared so the grant names the file the node produces). */
  override permissions(): NodePermissions {
    return { ...super.permissions(), run: [FFMPEG], write: [this.params.path] };
  }

  /** Checks the params; throws {@link ConfigError} for a bad path, fps or codec. */
  override open(_ctx: RuntimeContext): void {
    const { path, fps, codec } = this.params;
    const problems = [
      typeof path === "string" && path !== "" ? null : "path must be a non-empty string",
      typeof fps === "number" && fps > 0 && fps < Infinity
        ? null
        : `fps must be a positive number, got ${fps}`,
      codec === undefined || (typeof codec === "string" && /^[A-Za-z0-9_.-]+$/.test(codec))
        ? null
        : `codec must be an ffmpeg encoder name, got ${JSON.stringify(codec)}`,
    ].filter((problem) => problem !== null);
    if (problems.length > 0) {
      throw new ConfigError(`node ${this.name}: ${problems.join("; ")}`, "fix the writer's params", {
        node: this.name,
      });
    }
    this.#opened = true;
  }

  /** Appends one frame to the file. Throws {@link SchemaError} for a frame that does not fit it. */
  async consume(input: unknown, _ctx: RuntimeContext): Promise<void> {
    if (!this.#opened) {
      throw new NodeContractError(
        `node ${this.name}: consume() outside open() ... close()`,
        "open the node first; a closed writer's file is finished",
        { node: this.name },
      );
    }
    const layout = this.#layoutOf(input);
    if (this.#layout === null) {
      this.#encoder = ToolProcess.spawn(FFMPEG, this.#encodeArgs(layout), "write");
      this.#layout = layout;
    } else if (!sameLayout(this.#layout, layout)) {
      throw new SchemaError(
        `node ${this.name}: a ${describe(layout)} frame cannot join a ${describe(this.#layout)} video`,
        "resize and convert frames to the first frame's size and format before the writer",
        { node: this.name },
      );
    }
    const encoder = this.#encoder!;
    try {
      await encoder.write((input as Frame).pixels.data);
    } catch (error) {
      throw await this.#failed(
        encoder,
        `stopped taking frames (${error instanceof Error ? error.message : error})`,
      );
    }
  }

  /** Ends the input, waits for ffmpeg and checks it finished the file; throws {@link WorkerFatal} if not. */
  override async close(_ctx: RuntimeContext): Promise<void> {
    this.#opened = false;
    const encoder = this.#encoder;
    if (encoder === null) return;
    this.#encoder = null;
    const status = await encoder.finish();
    if (!status.success) throw await this.#failed(encoder, `exited with code ${status.code}`);
  }

  #layoutOf(input: unknown): Layout {
    const problem = (what: string) =>
      new SchemaError(`node ${this.name}: ${what}`, "send Frames of uint8 bgr8, rgb8 or gray8 pixels", {
        node: this.name,
      });
    if (!(input instanceof Frame)) throw problem("expected a Frame");
    const format = rawFormatOf(input.pixelFormat);
    if (format === null) throw problem(`cannot encode pixel format ${JSON.stringify(input.pixelFormat)}`);
    const { dtype, shape } = input.pixels;
    const channels = RAW_FORMATS[format].channels;
    const shapeFits = (shape.length === 3 && shape[2] === channels) || (shape.length === 2 && channels === 1);
    if (dtype !== "uint8" || !shapeFits || shape[0] === 0 || shape[1] === 0) {
      throw problem(
        `a ${input.pixelFormat} frame needs uint8 pixels [h, w, ${channels}], got ${dtype} [${shape}]`,
      );
    }
    return { format, pixelFormat: input.pixelFormat, height: shape[0], width: shape[1] };
  }

  #encodeArgs(layout: Layout): string[] {
    const { path, fps, codec } = this.params;
    return [
      ...QUIET,
      ...["-f", "rawvideo", "-pix_fmt", layout.format, "-s", `${layout.width}x${layout.height}`],
      ...["-r", String(fps), "-i", "pipe:0"],
      ...(codec === undefined ? [] : ["-c:v", codec]),
      ...["-y", path],
    ];
  }

  async #failed(encoder: ToolProcess, what: string): Promise<WorkerFatal> {
    await encoder.stop();
    return new WorkerFatal(
      `node ${this.name}: ffmpeg writing ${this.params.path} ${what}: ${encoder.stderrTail}`,
      "check the codec name and that the output directory exists and is writable",
      { node: this.name, path: this.params.path },
    );
  }
}

function sameLayout(a: Layout, b: Layout): boolean {
  return a.format === b.format && a.width === b.width && a.height === b.height;
}

function describe(layout: Layout): string {
  return `${layout.width}x${layout.height} ${layout.pixelFormat}`;
}
