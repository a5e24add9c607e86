/**
 * {@link FrameWriter}: a sink that encodes the frames it receives into a video file with an `ffmpeg`
 * subprocess fed raw video on stdin, in parts that a restarted or resumed run adds to instead of replacing.
 *
 * ```ts
 * const out = new FrameWriter({ name: "out", path: "out/annotated.mkv", fps: 25, codec: "ffv1" }).from(frames);
 * ```
 *
 * @module
 */

import { basename, extname, join } from "node:path";
import type { RuntimeContext } from "../core/context.ts";
import {
  diskFailure,
  NodeContractError,
  ResourceUnavailable,
  SchemaError,
  WorkerFatal,
} from "../core/errors.ts";
import type { NodePermissions } from "../core/node.ts";
import { ConsumerNode, refuseParamProblems } from "../core/node.ts";
import { Frame } from "../wire/value.ts";
import {
  FFMPEG,
  FFPROBE,
  probeVideoStream,
  QUIET,
  RAW_FORMATS,
  type RawFormat,
  rawFormatOf,
  runTool,
  ToolProcess,
} from "./_ffmpeg.ts";

/** What a writer's parts directory is named after: `<path>.parts`. */
export const PARTS_SUFFIX = ".parts";
/** The file in a parts directory naming the run its parts belong to. */
const RUN_FILE = "run";
/** The file in a parts directory holding the run's frame layout (JSON), fixed by the run's first frame. */
const LAYOUT_FILE = "layout";
/**
 * Containers whose parts are written in fragments of at most a second, and Matroska's in clusters of at
 * most a second, so a part cut short by a crash still decodes up to its last second.
 */
const FRAGMENTED = new Set([".mp4", ".m4v", ".mov"]);
const MATROSKA = new Set([".mkv", ".webm"]);

/** Params of a {@link FrameWriter}. */
export interface FrameWriterParams {
  /** The video file to write (replaced by a new run); its extension picks the container. */
  readonly path: string;
  /** The frame rate the file declares. */
  readonly fps: number;
  /**
   * An ffmpeg encoder name (`ffv1`, `libx264` ...); default the container's own default encoder, which for
   * MP4 and MOV writes 4:2:0 chroma (what browsers and players decode) when both sides are even.
   */
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
 * `[h, w]` for gray) into `path`. The run's first frame fixes the size and layout (for every later launch
 * of the run too) and starts `ffmpeg`; a later
 * frame of another size or layout, or anything that is not such a frame, is a {@link SchemaError}
 * (poison: dead-lettered, the file goes on without it). An output directory that does not exist or
 * cannot be written is {@link ResourceUnavailable} at `open()`; an encoder that fails (an unknown codec)
 * is {@link WorkerFatal}, with ffmpeg's own words; invalid params are `ConfigError`.
 *
 * Each launch of the writer encodes its frames into a part of its own in `<path>.parts/` (a fragmented
 * part for MP4 and MOV, so one cut short by a crash still decodes), and `close()` joins every part of
 * the run, in order, into `path`: a replica restarted after a crash, or a run resumed after a stop, adds
 * to what came before instead of replacing it. A new run starts over. The frames a crashed encoder held
 * and had not written (an encoder's lookahead) are lost with it, and frames redelivered after a crash
 * may appear twice. After `close()` the parts directory keeps `path` as its first part, a hard link
 * (no second copy), so a later resume of the run goes on from it. No frame at all means no file.
 */
export class FrameWriter extends ConsumerNode<FrameWriterParams> {
  /**
   * Frames are encoded in the order they come: an upstream of several replicas shuffles them, unless the
   * writer is given `ordering: { mode: "sequence" }` (it then takes them in their producer's order).
   */
  static override inputInOrder = true;
  #encoder: ToolProcess | null = null;
  /** The run's frame layout: fixed by its first frame, kept in the parts directory for its later launches. */
  #layout: Layout | null = null;
  #opened = false;
  /** `<flow id>/<run id>` of the run this launch belongs to. */
  #run = "";
  /** Whether the parts directory holds another run's parts (or none): cleared at this run's first frame. */
  #newRun = false;

  /** The process id of the running ffmpeg encoder, or `null` before the first frame and after `close()`. */
  get encoderPid(): number | null {
    return this.#encoder?.pid ?? null;
  }

  /** Runs `ffmpeg` and `ffprobe`; reads and writes `path` and its parts directory, nothing else. */
  override permissions(): NodePermissions {
    const files = [this.params.path, this.#partsDir];
    return { ...super.permissions(), run: [FFMPEG, FFPROBE], read: files, write: files };
  }

  /** What is wrong with the params: an empty path, an fps that is not a positive number, a codec name. */
  override paramProblems(): string[] {
    const { path, fps, codec } = this.params;
    return [
      typeof path === "string" && path !== "" ? null : "path must be a non-empty string",
      typeof fps === "number" && fps > 0 && fps < Infinity
        ? null
        : `fps must be a positive number, got ${fps}`,
      codec === undefined || (typeof codec === "string" && /^[A-Za-z0-9_.-]+$/.test(codec))
        ? null
        : `codec must be an ffmpeg encoder name, got ${JSON.stringify(codec)}`,
    ].filter((problem) => problem !== null);
  }

  get #partsDir(): string {
    return `${this.params.path}${PARTS_SUFFIX}`;
  }

  /**
   * Checks the params (a `ConfigError` for a bad path, fps or codec), makes the parts directory if there
   * is none (ResourceUnavailable when it cannot be made), and notes whether it holds another run's parts,
   * which give way at this launch's first frame.
   */
  override async open(ctx: RuntimeContext): Promise<void> {
    refuseParamProblems(this, "fix the writer's params");
    // Made now, so an output directory that is missing or not writable fails the writer at once.
    await Deno.mkdir(this.#partsDir).catch((error) => {
      if (!(error instanceof Deno.errors.AlreadyExists)) throw this.#unwritable(error);
    });
    this.#run = `${ctx.flowId}/${ctx.runId}`;
    this.#newRun = await Deno.readTextFile(join(this.#partsDir, RUN_FILE)).catch(() => null) !== this.#run;
    this.#layout = this.#newRun ? null : await readLayout(join(this.#partsDir, LAYOUT_FILE));
    this.#opened = true;
  }

  /**
   * Readies the parts directory for this launch's first frame: an earlier run's parts (and file) give
   * way only now, so a run that fails before it writes a frame leaves the last one's output as it was.
   */
  async #claimParts(): Promise<void> {
    if (!this.#newRun) return;
    await Deno.remove(this.#partsDir, { recursive: true }).catch((error) => {
      if (!(error instanceof Deno.errors.NotFound)) throw error;
    });
    await Deno.mkdir(this.#partsDir).catch((error) => {
      throw this.#unwritable(error);
    });
    await Deno.writeTextFile(join(this.#partsDir, RUN_FILE), this.#run);
    this.#newRun = false;
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
    if (this.#layout !== null && !sameLayout(this.#layout, layout)) {
      throw new SchemaError(
        `node ${this.name}: a ${describe(layout)} frame cannot join a ${describe(this.#layout)} video`,
        "resize and convert frames to the first frame's size and format before the writer",
        { node: this.name },
      );
    }
    let encoder = this.#encoder;
    if (encoder === null) {
      await this.#claimParts();
      if (this.#layout === null) {
        await Deno.writeTextFile(join(this.#partsDir, LAYOUT_FILE), JSON.stringify(layout));
        this.#layout = layout;
      }
      const parts = await this.#parts();
      const index = parts.length === 0 ? 0 : Number(parts[parts.length - 1].slice(0, 6)) + 1;
      const part = join(this.#partsDir, `${String(index).padStart(6, "0")}${extname(this.params.path)}`);
      encoder = this.#encoder = ToolProcess.spawn(FFMPEG, this.#encodeArgs(layout, part), "write");
    }
    try {
      await encoder.write((input as Frame).pixels.data);
    } catch (error) {
      throw await this.#failed(
        encoder,
        `stopped taking frames (${error instanceof Error ? error.message : error})`,
      );
    }
  }

  /**
   * Ends the input, waits for ffmpeg, then joins the run's parts into `path` (written aside, then renamed
   * over it); throws {@link WorkerFatal} when the encoder or the join fails.
   */
  override async close(ctx: RuntimeContext): Promise<void> {
    if (!this.#opened) return;
    this.#opened = false;
    const encoder = this.#encoder;
    if (encoder !== null) {
      this.#encoder = null;
      const status = await encoder.finish();
      if (!status.success) throw await this.#failed(encoder, `exited with code ${status.code}`);
    }
    // A launch of a new run that wrote no frame leaves the earlier run's file and parts as they are (and
    // no parts directory, when there were none).
    if (this.#newRun) {
      await Deno.remove(this.#partsDir).catch(() => {});
      return;
    }
    await this.#join(await this.#parts(), ctx);
  }

  /** This run's parts, in the order they were written. */
  async #parts(): Promise<string[]> {
    const names: string[] = [];
    for await (const entry of Deno.readDir(this.#partsDir)) {
      if (entry.isFile && /^\d{6}\./.test(entry.name)) names.push(entry.name);
    }
    return names.sort();
  }

  /**
   * Joins `parts` into `path`, leaving out a part that holds no frame (one whose encoder died before it
   * wrote any); afterwards `path` is the only part, linked as the first.
   */
  async #join(parts: readonly string[], ctx: RuntimeContext): Promise<void> {
    const ext = extname(this.params.path);
    const list = join(this.#partsDir, "parts.txt");
    const joined = join(this.#partsDir, `joined${ext}`);
    const readable: string[] = [];
    for (const name of parts) {
      const probe = await probeVideoStream(join(this.#partsDir, name));
      if (probe.kind === "found") {
        readable.push(name);
      } else {
        ctx.logger.warn("a part of the output holds no frame and is left out", {
          part: name,
          why: probe.detail,
        });
      }
    }
    if (readable.length === 0) {
      await Deno.remove(this.#partsDir, { recursive: true });
      await Deno.remove(this.params.path).catch((error) => {
        if (!(error instanceof Deno.errors.NotFound)) throw error;
      });
      return;
    }
    await Deno.writeTextFile(list, readable.map((name) => `file '${name}'\n`).join(""));
    const { code, stderr } = await runTool(FFMPEG, [
      ...QUIET,
      ...["-f", "concat", "-safe", "0", "-i", list, "-c", "copy", "-y", joined],
    ]);
    if (code !== 0) {
      throw new WorkerFatal(
        `node ${this.name}: ffmpeg joining the parts of ${this.params.path} exited with code ${code}: ` +
          stderr.trim(),
        `the parts are kept in ${this.#partsDir}; check that the output directory is writable`,
        { node: this.name, path: this.params.path },
      );
    }
    await Deno.rename(joined, this.params.path);
    for (const name of [...parts, basename(list)]) await Deno.remove(join(this.#partsDir, name));
    await Deno.link(this.params.path, join(this.#partsDir, `000000${ext}`));
  }

  #unwritable(error: unknown): ResourceUnavailable {
    return diskFailure(error, `node ${this.name}'s parts directory ${this.#partsDir}`, this.#partsDir) ??
      new ResourceUnavailable(
        `node ${this.name}: the parts directory ${this.#partsDir} cannot be made: ${
          (error as Error).message
        }`,
        "check that the output directory exists and is writable",
        { node: this.name, path: this.params.path },
      );
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

  #encodeArgs(layout: Layout, part: string): string[] {
    const { fps, codec } = this.params;
    const ext = extname(part).toLowerCase();
    const bounded = FRAGMENTED.has(ext)
      ? ["-movflags", "+frag_keyframe+empty_moov+default_base_moof", "-frag_duration", "1000000"]
      : MATROSKA.has(ext)
      ? ["-cluster_time_limit", "1000"]
      : [];
    return [
      ...QUIET,
      ...["-f", "rawvideo", "-pix_fmt", layout.format, "-s", `${layout.width}x${layout.height}`],
      ...["-r", String(fps), "-i", "pipe:0"],
      ...(codec === undefined ? [] : ["-c:v", codec]),
      ...(codec === undefined && FRAGMENTED.has(ext) && layout.width % 2 === 0 && layout.height % 2 === 0
        ? ["-pix_fmt", "yuv420p"]
        : []),
      ...bounded,
      ...["-flush_packets", "1", "-y", part],
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

/** The layout an earlier launch of the run recorded at `path`; null for none (or one cut short). */
async function readLayout(path: string): Promise<Layout | null> {
  let value: unknown;
  try {
    value = JSON.parse(await Deno.readTextFile(path));
  } catch {
    return null;
  }
  const layout = value as Partial<Layout> | null;
  const whole = (n: unknown) => Number.isSafeInteger(n) && (n as number) > 0;
  return layout !== null && typeof layout === "object" && typeof layout.format === "string" &&
      layout.format in RAW_FORMATS && typeof layout.pixelFormat === "string" && whole(layout.width) &&
      whole(layout.height)
    ? layout as Layout
    : null;
}

function sameLayout(a: Layout, b: Layout): boolean {
  return a.format === b.format && a.width === b.width && a.height === b.height;
}

function describe(layout: Layout): string {
  return `${layout.width}x${layout.height} ${layout.pixelFormat}`;
}
