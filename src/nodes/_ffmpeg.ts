/**
 * Private helpers the video nodes share: starting `ffmpeg`/`ffprobe` with typed errors, reading a raw
 * video pipe one whole frame at a time into a fresh buffer, feeding one, and reaping the process.
 *
 * The tools run in a session of their own (`detached`): a terminal's Ctrl-C reaches vf's process group,
 * and vf answers it by stopping the flow the clean way, which a tool that got the signal too (an encoder
 * ending its clip early) would undo. A tool still ends with its pipes when its node's process dies.
 *
 * @module
 */

import { ResourceUnavailable } from "../core/errors.ts";

/** The decoder/encoder program the video nodes run. */
export const FFMPEG = "ffmpeg";
/** The stream inspector the reader runs to learn a source's size and frame rate. */
export const FFPROBE = "ffprobe";

/** Options every ffmpeg run starts with: no banner, no key handling on stdin, errors only on stderr. */
export const QUIET = ["-hide_banner", "-nostdin", "-loglevel", "error"] as const;

/** ffmpeg's name of a raw pixel layout a frame can carry. */
export type RawFormat = "bgr24" | "rgb24" | "gray";

/** How a frame's `pixelFormat` is laid out, keyed by ffmpeg's name for the same raw layout. */
export const RAW_FORMATS = {
  bgr24: { pixelFormat: "bgr8", channels: 3 },
  rgb24: { pixelFormat: "rgb8", channels: 3 },
  gray: { pixelFormat: "gray8", channels: 1 },
} as const satisfies Record<RawFormat, { readonly pixelFormat: string; readonly channels: number }>;

/** Whether `name` is one of {@link RAW_FORMATS}. */
export function isRawFormat(name: unknown): name is RawFormat {
  return typeof name === "string" && Object.hasOwn(RAW_FORMATS, name);
}

/** The ffmpeg layout of a frame `pixelFormat` (`bgr8` → `bgr24`), or `null` for one it has none for. */
export function rawFormatOf(pixelFormat: string): RawFormat | null {
  const found = Object.entries(RAW_FORMATS).find(([, layout]) => layout.pixelFormat === pixelFormat);
  return found ? found[0] as RawFormat : null;
}

const STDERR_TAIL_BYTES = 4096;
const INSTALL_REMEDY = "install ffmpeg (e.g. `apt-get install ffmpeg`), which provides ffmpeg and ffprobe, " +
  "and put it on the worker's PATH";

function spawnError(program: string, error: unknown): unknown {
  if (error instanceof Deno.errors.NotFound) {
    return new ResourceUnavailable(`${program} is not installed or not on PATH`, INSTALL_REMEDY, { program });
  }
  if (error instanceof Deno.errors.NotCapable || error instanceof Deno.errors.PermissionDenied) {
    return new ResourceUnavailable(
      `this worker may not run ${program}`,
      `grant --allow-run=${program} (the node's permissions() declares it)`,
      { program },
    );
  }
  return error;
}

/**
 * Runs a program to completion and returns its exit code and decoded output; an abort of `signal` kills
 * it (SIGTERM). Throws {@link ResourceUnavailable} when the program is missing or may not be run.
 */
export async function runTool(
  program: string,
  args: readonly string[],
  signal?: AbortSignal,
): Promise<{ code: number; stdout: string; stderr: string }> {
  let output: Deno.CommandOutput;
  try {
    output = await new Deno.Command(program, { args: [...args], stdin: "null", signal, detached: true })
      .output();
  } catch (error) {
    throw spawnError(program, error);
  }
  const text = new TextDecoder();
  return { code: output.code, stdout: text.decode(output.stdout), stderr: text.decode(output.stderr) };
}

/** Which standard stream of a {@link ToolProcess} is a pipe: stdout to read from, or stdin to write to. */
export type PipeDirection = "read" | "write";

/**
 * A running ffmpeg with one pipe: its stdout read in whole records, or its stdin written. Stderr is
 * drained all along (so the child never blocks on it) and its last few KiB kept for error messages.
 * {@link ToolProcess.stop} or {@link ToolProcess.wait} reaps the child; both are idempotent.
 */
export class ToolProcess {
  readonly #child: Deno.ChildProcess;
  readonly #reader: ReadableStreamBYOBReader | null;
  readonly #writer: WritableStreamDefaultWriter<Uint8Array> | null;
  readonly #stderrDone: Promise<void>;
  #stderrTail = new Uint8Array(0);
  #exited = false;
  #status: Promise<Deno.CommandStatus> | null = null;

  private constructor(child: Deno.ChildProcess, direction: PipeDirection) {
    this.#child = child;
    this.#reader = direction === "read" ? child.stdout.getReader({ mode: "byob" }) : null;
    this.#writer = direction === "write" ? child.stdin.getWriter() : null;
    this.#stderrDone = this.#drainStderr();
    child.status.then(() => this.#exited = true);
  }

  /**
   * Starts `program` with `args`. Throws {@link ResourceUnavailable} when it is missing or may not be run.
   */
  static spawn(program: string, args: readonly string[], direction: PipeDirection): ToolProcess {
    let child: Deno.ChildProcess;
    try {
      child = new Deno.Command(program, {
        args: [...args],
        stdin: direction === "write" ? "piped" : "null",
        stdout: direction === "read" ? "piped" : "null",
        stderr: "piped",
        detached: true,
      }).spawn();
    } catch (error) {
      throw spawnError(program, error);
    }
    return new ToolProcess(child, direction);
  }

  /** The child's process id. */
  get pid(): number {
    return this.#child.pid;
  }

  /** The last few KiB the child wrote to stderr, trimmed. */
  get stderrTail(): string {
    return new TextDecoder().decode(this.#stderrTail).trim();
  }

  async #drainStderr(): Promise<void> {
    for await (const chunk of this.#child.stderr) {
      const joined = new Uint8Array(this.#stderrTail.length + chunk.length);
      joined.set(this.#stderrTail);
      joined.set(chunk, this.#stderrTail.length);
      this.#stderrTail = joined.slice(Math.max(0, joined.length - STDERR_TAIL_BYTES));
    }
  }

  /**
   * The next `size` bytes of stdout, read straight from the pipe into a fresh `ArrayBuffer` (no copy),
   * with `headroom` free bytes before them and `tailroom` after (none by default: the array then spans its
   * buffer exactly, so it can be transferred without a copy), or `null` once stdout ends; bytes of an
   * incomplete last record are dropped.
   */
  async readRecord(size: number, headroom = 0, tailroom = 0): Promise<Uint8Array<ArrayBuffer> | null> {
    const reader = this.#reader!;
    let buffer = new ArrayBuffer(headroom + size + tailroom);
    let filled = 0;
    while (filled < size) {
      const { value, done } = await reader.read(new Uint8Array(buffer, headroom + filled, size - filled));
      if (done || value === undefined) return null;
      filled += value.byteLength;
      buffer = value.buffer;
    }
    return new Uint8Array(buffer, headroom, size);
  }

  /** Writes `bytes` to stdin, waiting while the pipe is full; rejects once the child stopped reading. */
  async write(bytes: Uint8Array): Promise<void> {
    await this.#writer!.write(bytes);
  }

  /** Closes stdin (the end of the input for ffmpeg), then waits for the child as {@link ToolProcess.wait}. */
  async finish(): Promise<Deno.CommandStatus> {
    await this.#writer?.close().catch(() => {});
    return await this.wait();
  }

  /** Waits for the child to exit and for its stderr to be drained; the child is reaped. */
  wait(): Promise<Deno.CommandStatus> {
    this.#status ??= (async () => {
      const status = await this.#child.status;
      await this.#stderrDone;
      await this.#reader?.cancel().catch(() => {});
      await this.#writer?.abort().catch(() => {});
      return status;
    })();
    return this.#status;
  }

  /** Kills the child unless it has exited, then reaps it as {@link ToolProcess.wait}. */
  async stop(): Promise<Deno.CommandStatus> {
    if (!this.#exited) {
      try {
        this.#child.kill("SIGKILL");
      } catch (error) {
        if (!(error instanceof TypeError)) throw error;
      }
    }
    await this.#reader?.cancel().catch(() => {});
    return await this.wait();
  }
}

/** A frame rate as ffmpeg states it (`30000/1001`, `25`) and as a number of frames per second. */
export interface FrameRate {
  readonly text: string;
  readonly perSecond: number;
}

/** Parses `num/den` or a plain number; `null` for an unknown (`0/0`), zero, negative or malformed rate. */
export function parseFrameRate(text: string): FrameRate | null {
  const [num, den = "1", ...rest] = text.trim().split("/");
  const perSecond = Number(num) / Number(den);
  if (rest.length > 0 || !Number.isFinite(perSecond) || perSecond <= 0) return null;
  return { text: text.trim(), perSecond };
}

/** Whether `value` is a safe integer above zero (a size, a count). */
export function isPositiveInteger(value: unknown): value is number {
  return Number.isSafeInteger(value) && (value as number) > 0;
}

/** What ffprobe found about a source's first video stream. */
export type StreamProbe =
  | {
    readonly kind: "found";
    readonly width: number;
    readonly height: number;
    readonly rate: FrameRate | null;
  }
  | { readonly kind: "failed"; readonly detail: string };

/**
 * Asks ffprobe for the size and nominal frame rate (`r_frame_rate`) of the first video stream of `source`
 * (a path or a URL), the size as ffmpeg decodes it: a stream its metadata says to show rotated by a
 * quarter turn (a phone clip) comes out of ffmpeg turned, so its width and height are swapped. A source
 * ffprobe cannot read, or one without a video stream, is `failed` with ffprobe's own words, as is a probe
 * `signal` aborted; throws {@link ResourceUnavailable} only when ffprobe cannot be run at all.
 */
export async function probeVideoStream(source: string, signal?: AbortSignal): Promise<StreamProbe> {
  const entries = "stream=width,height,r_frame_rate:stream_tags=rotate:stream_side_data=rotation";
  const { code, stdout, stderr } = await runTool(FFPROBE, [
    ...["-v", "error", "-select_streams", "v:0", "-show_entries", entries],
    ...["-of", "json", source],
  ], signal);
  if (code !== 0) return { kind: "failed", detail: stderr.trim() || `ffprobe exited with code ${code}` };
  let streams: unknown;
  try {
    streams = (JSON.parse(stdout) as { streams?: unknown }).streams;
  } catch {
    return { kind: "failed", detail: "ffprobe printed something that is not JSON" };
  }
  const stream = Array.isArray(streams) ? streams[0] as Record<string, unknown> | undefined : undefined;
  const { width, height, r_frame_rate: rate } = stream ?? {};
  if (!isPositiveInteger(width) || !isPositiveInteger(height)) {
    return { kind: "failed", detail: "no video stream with a known size" };
  }
  const turned = quarterTurned(stream!);
  return {
    kind: "found",
    width: turned ? height : width,
    height: turned ? width : height,
    rate: typeof rate === "string" ? parseFrameRate(rate) : null,
  };
}

/** Whether a probed stream's display rotation (side data, or the older `rotate` tag) is ±90° or ±270°. */
function quarterTurned(stream: Record<string, unknown>): boolean {
  const sideData = Array.isArray(stream.side_data_list) ? stream.side_data_list : [];
  const fromSideData = sideData.map((entry) => (entry as { rotation?: unknown }).rotation)
    .find((rotation) => typeof rotation === "number");
  const tag = (stream.tags as { rotate?: unknown } | undefined)?.rotate;
  const degrees = typeof fromSideData === "number" ? fromSideData : Number(tag ?? 0);
  return Number.isFinite(degrees) && Math.abs(Math.round(degrees)) % 180 === 90;
}
