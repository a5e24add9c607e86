/**
 * {@link VideoFileReader}: a producer that decodes a video file or a live stream (`rtsp://` ...) with an
 * `ffmpeg` subprocess and yields one {@link Frame} per `next()`.
 *
 * ```ts
 * const frames = new VideoFileReader({ name: "cam", path: "clips/street.mp4", width: 640, height: 360 });
 * ```
 *
 * @module
 */

import { systemClock } from "../backends/clock.ts";
import { ENVELOPE_HEADROOM, ENVELOPE_TAILROOM, giveWhole } from "../core/bytes.ts";
import type { RuntimeContext } from "../core/context.ts";
import { ConfigError, NodeContractError, ResourceUnavailable } from "../core/errors.ts";
import type { End, NodePermissions } from "../core/node.ts";
import { END, ProducerNode, refuseParamProblems } from "../core/node.ts";
import { Frame, Tensor } from "../wire/value.ts";
import {
  FFMPEG,
  FFPROBE,
  type FrameRate,
  isPositiveInteger,
  isRawFormat,
  parseFrameRate,
  probeVideoStream,
  QUIET,
  RAW_FORMATS,
  type RawFormat,
  runTool,
  ToolProcess,
} from "./_ffmpeg.ts";

/** Params of a {@link VideoFileReader}. */
export interface VideoFileReaderParams {
  /**
   * A file path, or the URL of a live stream: anything with a scheme (`rtsp://`, `rtmp://`, `http://`,
   * `tcp://` ...) is read as a live source.
   */
  readonly path: string;
  /** Frame width in pixels; default the source's (or, with only `height` given, the source's aspect). */
  readonly width?: number;
  /** Frame height in pixels; default the source's (or, with only `width` given, the source's aspect). */
  readonly height?: number;
  /** ffmpeg's raw layout: `bgr24` (frames say `bgr8`, the default), `rgb24` (`rgb8`) or `gray` (`gray8`). */
  readonly pixelFormat?: RawFormat;
  /**
   * Frames per second to deliver, duplicating or dropping frames as ffmpeg's `fps` filter does. A file
   * defaults to its nominal rate (`r_frame_rate`); a live source to every frame it sends.
   */
  readonly fps?: number;
  /** Start over at the first frame after the last one, forever (a file only). */
  readonly loop?: boolean;
  /**
   * Play a file at its frame rate (`fps`, else the file's), as a camera delivers it (ffmpeg's `-re`): each
   * frame is handed out no sooner than one frame interval after the one before, so a stall never ends in
   * a burst (a file only; for testing a realtime flow on a recorded clip). By default a file is read as
   * fast as the flow takes it.
   */
  readonly realtime?: boolean;
  /** A file's event time of frame 0, epoch seconds; default the wall time `open()` ran at. */
  readonly startTs?: number;
  /** Live sources: consecutive failed (re)connections tolerated before the reader fails (default 10). */
  readonly maxReconnects?: number;
  /** Live sources: the wait before the first reconnection, doubled for each next one (default 0.5 s). */
  readonly reconnectDelaySeconds?: number;
  /** Live sources: the longest wait between reconnections (default 8 s). */
  readonly reconnectMaxDelaySeconds?: number;
  /** Live sources: a connection that delivers no frame for this long is dropped and redialled (default 10 s). */
  readonly readTimeoutSeconds?: number;
  /**
   * Live sources: how long a new connection may take to deliver its first frame, and ffprobe to size the
   * stream (default `readTimeoutSeconds` plus {@link FIRST_FRAME_GRACE_SECONDS}, for ffmpeg's analysis of
   * the stream).
   */
  readonly firstFrameTimeoutSeconds?: number;
}

/** A file is sought this far before the wanted frame, so the decoder lands on a key frame before it. */
const SEEK_MARGIN_SECONDS = 3;

/**
 * Seconds a live source's first frame on a connection may take beyond `readTimeoutSeconds` by default:
 * ffmpeg reads up to about five seconds of a stream (its analysis) before it decodes the first frame.
 */
export const FIRST_FRAME_GRACE_SECONDS = 5;

const DEFAULTS = {
  pixelFormat: "bgr24",
  maxReconnects: 10,
  reconnectDelaySeconds: 0.5,
  reconnectMaxDelaySeconds: 8,
  readTimeoutSeconds: 10,
} as const;

/** Whether a reader path names a live stream (a URL with a scheme) rather than a file. */
export function isLiveSource(path: string): boolean {
  return /^[a-z][a-z0-9+.-]*:\/\//i.test(path);
}

/** Where a decoder starts: at the file's start, or after an input seek with absolute timestamps. */
interface DecodePlan {
  /** Input seek in seconds from the start of the file (with `-copyts`), or `null` for none. */
  readonly seekSeconds: number | null;
  /** The `select` expression that drops the frames before the wanted one, or `null` to keep all. */
  readonly select: string | null;
}

interface Geometry {
  readonly width: number;
  readonly height: number;
}

function outputGeometry(source: Geometry, width?: number, height?: number): Geometry {
  if (width !== undefined && height !== undefined) return { width, height };
  if (width !== undefined) {
    return { width, height: Math.max(1, Math.round(source.height * width / source.width)) };
  }
  if (height !== undefined) {
    return { width: Math.max(1, Math.round(source.width * height / source.height)), height };
  }
  return source;
}

/**
 * The slot of the first frame a decode with these input options emits, as ffmpeg's `framemd5` numbers it
 * after the `fps` filter (frame-duration units, absolute under `-copyts`); `null` when no frame comes out
 * or the numbering is not in frame units.
 */
function firstSlot(framemd5: string): number | null {
  const line = framemd5.split("\n").find((text) => text.trim() !== "" && !text.startsWith("#"));
  const [, , pts, duration] = (line ?? "").split(",").map((field) => field.trim());
  return duration === "1" && /^-?\d+$/.test(pts ?? "") ? Number(pts) : null;
}

/**
 * Decodes a video file or a live stream with an `ffmpeg` subprocess (`-f rawvideo`), one {@link Frame}
 * per `next()`: pixels a `uint8` {@link Tensor} of shape `[height, width, channels]` (3, or 1 for `gray`)
 * read from ffmpeg's pipe straight into a fresh `ArrayBuffer` of its own, with room before and after the
 * pixels. The reader gives that buffer up whole: the envelope that publishes the frame is written around
 * the pixels in place (no allocation, no copy) and moved to the broker, so once a frame is published its
 * pixels are gone from this thread (its data detached); a node that keeps a frame after `next()` keeps a
 * copy (`frame.pixels.data.slice()`).
 *
 * Event time (`Frame.captureTs`, also set with `ctx.setEventTimestamp`): for a file, `startTs + index /
 * fps`, the frame's position on the file's timeline from an origin that defaults to when `open()` ran (set
 * `startTs` for the same event times across restarts); for a live source, the wall time its bytes arrived.
 *
 * A file is replayable: item `i` (1-based, what `seek` counts) is frame `i - 1` of the constant-rate
 * sequence ffmpeg's `fps` filter makes, so `seek(k)` then `next()` yields frame `k` exactly. The decoder
 * restarts with an input seek {@link SEEK_MARGIN_SECONDS} before the frame, checked by a one-frame probe
 * that it lands before it, and falls back to decoding from the start (exact, slower) where it does not.
 *
 * With `realtime`, a file is played at its frame rate, one frame interval between frames, as a camera
 * would deliver it: a realtime flow can then be tried on a recorded clip without most of it evicted.
 *
 * A live source without both `width` and `height` is sized by ffprobe first, on a connection of its own: a
 * server that serves a single client (ffmpeg's `tcp://...?listen=1`) needs both given.
 *
 * A live source's capture times are when its frames' bytes arrived: ffmpeg analyses the first seconds of
 * each connection before it decodes, so the first frames after a (re)connection arrive together, their
 * capture times a few milliseconds apart. A time join over live cameras should allow for that (a quorum, a
 * timeout) rather than pair those frames by a tight tolerance.
 *
 * A live source has no position: `seek` does nothing, so after a restart its frames are new frames under
 * the offsets that follow the last accepted one, and it is not finite by default. When it ends, stalls
 * for `readTimeoutSeconds` or cannot be reached, the reader redials with exponential backoff
 * (`reconnectDelaySeconds`, doubled, capped at `reconnectMaxDelaySeconds`); a frame resets the count, and
 * failing more than `maxReconnects` times in a row throws {@link ResourceUnavailable}. `close()` during a
 * wait ends it at once: the pending `next()` returns {@link END}.
 *
 * The subprocess is killed and reaped at `close()`, at `seek()`, and reaped when a file ends. A missing
 * file or one ffprobe cannot read is {@link ResourceUnavailable}; so is a missing ffmpeg (remedy: install
 * it); invalid params are {@link ConfigError}.
 */
export class VideoFileReader extends ProducerNode<VideoFileReaderParams> {
  /** A file's frames have stable positions: a restart re-mints the same ids (MSGID-6). */
  static override replayable = true;

  #format: RawFormat = DEFAULTS.pixelFormat;
  #geometry: Geometry | null = null;
  #rate: FrameRate | null = null;
  /** Whether ffmpeg scales: a file only to a size other than its own; a live source always (it may change). */
  #scale = true;
  #startTs = 0;
  #opened = false;
  #ended = false;
  #nextIndex = 0;
  /** Under `realtime`: the monotonic time the last frame was handed out at; `null` before the first. */
  #lastFrameAt: number | null = null;
  #failures = 0;
  /** Frames read since the live source's current connection was made. */
  #connectionFrames = 0;
  /** The seconds of silence after which the last bounded read timed out; `null` when it did not. */
  #silentFor: number | null = null;
  #decoder: ToolProcess | null = null;
  readonly #abort = new AbortController();
  /** Ends every wait: aborted at `close()` or at the flow's stop (the context's stop signal). */
  #waits: AbortSignal = this.#abort.signal;

  /** Whether `path` is a live stream. */
  get live(): boolean {
    return isLiveSource(this.params.path);
  }

  /** The process id of the running ffmpeg decoder, or `null` when none runs (for logs and health checks). */
  get decoderPid(): number | null {
    return this.#decoder?.pid ?? null;
  }

  /** `isFinite` when given, else true for a file that does not loop. */
  override get isFinite(): boolean {
    return this.params.isFinite ?? !(this.live || (this.params.loop ?? false));
  }

  /** Runs `ffmpeg` and `ffprobe`; reads a file's path (to check it exists). */
  override permissions(): NodePermissions {
    return { ...super.permissions(), run: [FFMPEG, FFPROBE], read: this.live ? [] : [this.params.path] };
  }

  /**
   * Checks the params and, for a file, that it exists and holds a video stream ffprobe can size.
   * Throws {@link ConfigError} for bad params, {@link ResourceUnavailable} for a missing or unreadable file
   * or a missing ffmpeg.
   */
  override async open(ctx: RuntimeContext): Promise<void> {
    refuseParamProblems(this, "fix the reader's params");
    this.#waits = AbortSignal.any([this.#abort.signal, ctx.stopSignal]);
    const { path, width, height, fps } = this.params;
    this.#format = this.params.pixelFormat ?? DEFAULTS.pixelFormat;
    this.#startTs = this.params.startTs ?? systemClock.now();
    this.#rate = fps === undefined ? null : parseFrameRate(String(fps));
    if (this.live) {
      if (width !== undefined && height !== undefined) this.#geometry = { width, height };
    } else {
      await this.#checkFile();
      const probe = await probeVideoStream(path);
      if (probe.kind === "failed") {
        throw new ResourceUnavailable(
          `node ${this.name}: ${path} has no video stream ffmpeg can read: ${probe.detail}`,
          `check the file with \`ffprobe ${path}\``,
          { node: this.name, path },
        );
      }
      this.#geometry = outputGeometry(probe, width, height);
      this.#scale = this.#geometry.width !== probe.width || this.#geometry.height !== probe.height;
      this.#rate ??= probe.rate;
      if (this.#rate === null) {
        throw new ResourceUnavailable(
          `node ${this.name}: ${path} states no frame rate`,
          "pass fps, the rate to deliver frames at",
          { node: this.name, path },
        );
      }
    }
    this.#opened = true;
  }

  /**
   * The next frame, or {@link END} when a file ends, the reader is closed, or the flow stops while it waits
   * (a live source between reconnections, or a silent one).
   */
  async next(ctx: RuntimeContext): Promise<Frame | End> {
    this.#requireOpen("next");
    while (!this.#waits.aborted && !this.#ended) {
      const decoder = this.#decoder ?? await this.#start(ctx);
      if (decoder === null) continue;
      const bytes = await this.#read(decoder);
      if (bytes !== null) {
        this.#failures = 0;
        this.#connectionFrames++;
        // A wait for the frame's turn cut short by close or the stop ends the stream there.
        if (this.params.realtime && !await this.#pace()) break;
        return this.#frame(bytes, ctx);
      }
      if (this.#waits.aborted) break;
      await this.#sourceEnded(decoder, ctx);
    }
    return END;
  }

  /**
   * Positions a file so the next `next()` yields frame `offset` (0-based; item `offset + 1`). Does nothing
   * for a live source. Throws {@link ConfigError} for an offset that is not a non-negative integer.
   */
  override async seek(offset: number, _ctx: RuntimeContext): Promise<void> {
    this.#requireOpen("seek");
    if (!Number.isSafeInteger(offset) || offset < 0) {
      throw new ConfigError(`node ${this.name}: cannot seek to ${offset}`, "seek to a frame index ≥ 0", {
        node: this.name,
      });
    }
    if (this.live) return;
    await this.#stopDecoder();
    this.#nextIndex = offset;
    this.#lastFrameAt = null;
    this.#ended = false;
  }

  /** Ends any wait, kills and reaps the subprocess; a pending or later `next()` returns {@link END}. */
  override async close(_ctx: RuntimeContext): Promise<void> {
    this.#abort.abort();
    await this.#stopDecoder();
  }

  #requireOpen(method: string): void {
    if (!this.#opened) {
      throw new NodeContractError(`node ${this.name}: ${method}() before open()`, "open the node first", {
        node: this.name,
      });
    }
  }

  /** What is wrong with the params: path, sizes, rates, pixel format, reconnects, `loop` on a live source. */
  override paramProblems(): string[] {
    const p = this.params;
    const problems: string[] = [];
    const positive = (key: keyof VideoFileReaderParams, value: unknown, integer: boolean) => {
      if (value === undefined) return;
      const ok = integer
        ? isPositiveInteger(value)
        : typeof value === "number" && value > 0 && value < Infinity;
      if (!ok) problems.push(`${key} must be a positive ${integer ? "integer" : "number"}, got ${value}`);
    };
    if (typeof p.path !== "string" || p.path === "") problems.push("path must be a non-empty string");
    else if (p.path.startsWith("file:")) problems.push("path must be a plain file path, not a file: URL");
    positive("width", p.width, true);
    positive("height", p.height, true);
    positive("fps", p.fps, false);
    positive("reconnectDelaySeconds", p.reconnectDelaySeconds, false);
    positive("reconnectMaxDelaySeconds", p.reconnectMaxDelaySeconds, false);
    positive("readTimeoutSeconds", p.readTimeoutSeconds, false);
    positive("firstFrameTimeoutSeconds", p.firstFrameTimeoutSeconds, false);
    if (p.pixelFormat !== undefined && !isRawFormat(p.pixelFormat)) {
      problems.push(
        `pixelFormat must be one of ${Object.keys(RAW_FORMATS).join(", ")}, got ${p.pixelFormat}`,
      );
    }
    if (p.maxReconnects !== undefined && !(Number.isSafeInteger(p.maxReconnects) && p.maxReconnects >= 0)) {
      problems.push(`maxReconnects must be an integer ≥ 0, got ${p.maxReconnects}`);
    }
    if (p.startTs !== undefined && !Number.isFinite(p.startTs)) {
      problems.push("startTs must be a finite number");
    }
    if (p.loop && isLiveSource(String(p.path))) problems.push("loop applies to a file, not a live source");
    if (p.realtime !== undefined && typeof p.realtime !== "boolean") {
      problems.push(`realtime must be true or false, got ${JSON.stringify(p.realtime)}`);
    }
    if (p.realtime && isLiveSource(String(p.path))) {
      problems.push("realtime applies to a file: a live source is paced by its sender");
    }
    return problems;
  }

  async #checkFile(): Promise<void> {
    const { path } = this.params;
    let info: Deno.FileInfo;
    try {
      info = await Deno.stat(path);
    } catch (error) {
      if (!(error instanceof Deno.errors.NotFound)) throw error;
      throw new ResourceUnavailable(
        `node ${this.name}: video file ${path} does not exist`,
        "check the path; a relative path is resolved against the worker's working directory",
        { node: this.name, path },
      );
    }
    if (!info.isFile) {
      throw new ResourceUnavailable(
        `node ${this.name}: ${path} is not a file`,
        "point path at a video file",
        {
          node: this.name,
          path,
        },
      );
    }
  }

  /** Starts a decoder at the next frame; for a live source, `null` after a failed connection and its wait. */
  async #start(ctx: RuntimeContext): Promise<ToolProcess | null> {
    if (this.live && this.#geometry === null) {
      // ffprobe reads as much of the stream as the decoder's first frame takes: it gets that budget.
      const seconds = this.#firstFrameSeconds();
      const probe = await this.#bounded((signal) => probeVideoStream(this.params.path, signal), seconds);
      if (probe.kind === "failed") {
        const silent = this.#silentFor;
        await this.#backoff(
          silent === null ? probe.detail : `ffprobe found no video stream in ${silent} s`,
          ctx,
        );
        return null;
      }
      this.#geometry = outputGeometry(probe, this.params.width, this.params.height);
    }
    const plan = this.live ? { seekSeconds: null, select: null } : await this.#planFrom(this.#nextIndex);
    if (this.#waits.aborted) return null;
    ctx.logger.debug("starting ffmpeg", {
      path: this.params.path,
      frame: this.#nextIndex,
      seek_seconds: plan.seekSeconds,
      select: plan.select,
    });
    this.#decoder = ToolProcess.spawn(FFMPEG, this.#decodeArgs(plan), "read");
    return this.#decoder;
  }

  /** How to start decoding a file at frame `index` (see the class doc). */
  async #planFrom(index: number): Promise<DecodePlan> {
    const fromStart = { seekSeconds: null, select: index > 0 ? `select=gte(n\\,${index})` : null };
    const seekSeconds = index / this.#rate!.perSecond - SEEK_MARGIN_SECONDS;
    if (seekSeconds <= 0) return fromStart;
    const origin = await this.#probeFirstSlot(0);
    const landing = await this.#probeFirstSlot(seekSeconds);
    if (origin === null || landing === null || landing > origin + index) return fromStart;
    return { seekSeconds, select: `select=gte(pts\\,${origin + index})` };
  }

  async #probeFirstSlot(seekSeconds: number): Promise<number | null> {
    const args = [
      ...this.#inputArgs(seekSeconds),
      ...["-an", "-sn", "-dn", "-vf", `fps=${this.#rate!.text}`, "-fps_mode", "passthrough"],
      ...["-frames:v", "1", "-f", "framemd5", "pipe:1"],
    ];
    const { code, stdout } = await runTool(FFMPEG, args);
    return code === 0 ? firstSlot(stdout) : null;
  }

  /** Input options: loop, then (with a seek) absolute timestamps and the seek, then the source. */
  #inputArgs(seekSeconds: number | null): string[] {
    return [
      ...QUIET,
      ...(this.params.loop ? ["-stream_loop", "-1"] : []),
      ...(seekSeconds === null ? [] : ["-copyts", "-ss", seekSeconds.toFixed(6)]),
      "-i",
      this.params.path,
    ];
  }

  #decodeArgs(plan: DecodePlan): string[] {
    const { width, height } = this.#geometry!;
    const filters = [
      ...(this.#rate === null ? [] : [`fps=${this.#rate.text}`]),
      ...(plan.select === null ? [] : [plan.select]),
      ...(this.#scale ? [`scale=${width}:${height}`] : []),
    ];
    return [
      ...this.#inputArgs(plan.seekSeconds),
      ...["-an", "-sn", "-dn", "-vf", filters.join(","), "-fps_mode", "passthrough"],
      ...["-f", "rawvideo", "-pix_fmt", this.#format, "pipe:1"],
    ];
  }

  get #frameBytes(): number {
    const { width, height } = this.#geometry!;
    return width * height * RAW_FORMATS[this.#format].channels;
  }

  /**
   * One frame's bytes; for a live source, a connection silent for `readTimeoutSeconds` is dropped (its
   * first frame may take `firstFrameTimeoutSeconds`).
   */
  #read(decoder: ToolProcess): Promise<Uint8Array<ArrayBuffer> | null> {
    if (!this.live) return this.#readFrame(decoder);
    const seconds = this.#connectionFrames > 0
      ? this.params.readTimeoutSeconds ?? DEFAULTS.readTimeoutSeconds
      : this.#firstFrameSeconds();
    return this.#bounded((signal) => {
      // A stop() failure is not lost: wait() (memoized) rethrows it where the reader reaps the decoder.
      signal.addEventListener("abort", () => decoder.stop().catch(() => {}), { once: true });
      return this.#readFrame(decoder);
    }, seconds);
  }

  /**
   * One frame's bytes in a buffer of their own with room for the envelope around them, given up whole
   * (`giveWhole`): the envelope that publishes the frame is written around its pixels in place, and moved.
   */
  async #readFrame(decoder: ToolProcess): Promise<Uint8Array<ArrayBuffer> | null> {
    const bytes = await decoder.readRecord(this.#frameBytes, ENVELOPE_HEADROOM, ENVELOPE_TAILROOM);
    if (bytes !== null) giveWhole(bytes.buffer);
    return bytes;
  }

  /** How long a new connection may take to its first frame (or ffprobe to its answer). */
  #firstFrameSeconds(): number {
    const readTimeout = this.params.readTimeoutSeconds ?? DEFAULTS.readTimeoutSeconds;
    return this.params.firstFrameTimeoutSeconds ?? readTimeout + FIRST_FRAME_GRACE_SECONDS;
  }

  /**
   * Runs `work` with a signal that aborts after `seconds`, at `close()` or at the flow's stop; a timeout is
   * remembered in {@link #silentFor} for the reason the source is redialled.
   */
  async #bounded<T>(
    work: (signal: AbortSignal) => Promise<T>,
    seconds: number,
  ): Promise<T> {
    const timeout = new AbortController();
    this.#silentFor = null;
    const timer = systemClock.setTimer(seconds, () => {
      this.#silentFor = seconds;
      timeout.abort();
    });
    try {
      return await work(AbortSignal.any([this.#waits, timeout.signal]));
    } finally {
      timer.cancel();
    }
  }

  /**
   * Waits until one frame interval has passed since the last frame was handed out (none before the first
   * since open or seek); false when close or the flow's stop cut the wait short.
   */
  async #pace(): Promise<boolean> {
    const last = this.#lastFrameAt;
    const wait = last === null ? 0 : last + 1 / this.#rate!.perSecond - systemClock.monotonic();
    if (wait > 0) {
      await systemClock.sleep(wait, this.#waits).catch((error) => {
        if (!this.#waits.aborted) throw error;
      });
    }
    this.#lastFrameAt = systemClock.monotonic();
    return !this.#waits.aborted;
  }

  #frame(bytes: Uint8Array<ArrayBuffer>, ctx: RuntimeContext): Frame {
    const index = this.#nextIndex++;
    const { width, height } = this.#geometry!;
    const layout = RAW_FORMATS[this.#format];
    const captureTs = this.live ? systemClock.now() : this.#startTs + index / this.#rate!.perSecond;
    ctx.setEventTimestamp(captureTs);
    return new Frame(Tensor.from(bytes, [height, width, layout.channels]), layout.pixelFormat, captureTs);
  }

  /** A decoder's output ended: a file is done (or failed); a live source is redialled after a wait. */
  async #sourceEnded(decoder: ToolProcess, ctx: RuntimeContext): Promise<void> {
    const status = await decoder.wait();
    this.#decoder = null;
    this.#connectionFrames = 0;
    const said = decoder.stderrTail;
    if (this.live) {
      const silent = this.#silentFor;
      await this.#backoff(
        silent !== null
          ? `the source sent no frame for ${silent} s, so the connection was dropped`
          : status.success
          ? "the source ended its stream"
          : `ffmpeg exited with code ${status.code}${said ? `: ${said}` : ""}`,
        ctx,
      );
      return;
    }
    if (!status.success) {
      throw new ResourceUnavailable(
        `node ${this.name}: ffmpeg failed decoding ${this.params.path} (exit code ${status.code}): ${said}`,
        `check the file with \`ffmpeg -i ${this.params.path} -f null -\``,
        { node: this.name, path: this.params.path },
      );
    }
    this.#ended = true;
  }

  /**
   * Counts a failed connection, throws past the budget, else waits the backoff (cut short by close or the
   * flow's stop, after which nothing is counted).
   */
  async #backoff(reason: string, ctx: RuntimeContext): Promise<void> {
    if (this.#waits.aborted) return;
    const budget = this.params.maxReconnects ?? DEFAULTS.maxReconnects;
    this.#failures += 1;
    if (this.#failures > budget) {
      throw new ResourceUnavailable(
        `node ${this.name}: live source ${this.params.path} failed ${this.#failures} times in a row: ${reason}`,
        "check that the stream is up and reachable from the worker, or raise maxReconnects" +
          (this.params.width === undefined || this.params.height === undefined
            ? "; a source without width and height is sized by ffprobe on a connection of its own, which a " +
              "server that serves one client (ffmpeg's ?listen=1) gives to ffprobe alone: give both"
            : ""),
        { node: this.name, path: this.params.path },
      );
    }
    const first = this.params.reconnectDelaySeconds ?? DEFAULTS.reconnectDelaySeconds;
    const cap = this.params.reconnectMaxDelaySeconds ?? DEFAULTS.reconnectMaxDelaySeconds;
    const delay = Math.min(first * 2 ** (this.#failures - 1), cap);
    ctx.logger.warn("live source lost; reconnecting", {
      path: this.params.path,
      attempt: this.#failures,
      delay_seconds: delay,
      reason,
    });
    await systemClock.sleep(delay, this.#waits).catch((error) => {
      if (!this.#waits.aborted) throw error;
    });
  }

  async #stopDecoder(): Promise<void> {
    const decoder = this.#decoder;
    this.#decoder = null;
    await decoder?.stop();
  }
}
