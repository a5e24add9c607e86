/**
 * The benchmarks' raw 720p video: the `testsrc` clip they decode, and `ffmpeg` decoding it to bgr24 on a
 * pipe, read by a bare program into one reused frame array (the baseline a flow is measured against).
 *
 * @module
 */

/** The clip's frame size. */
export const WIDTH = 1280;
export const HEIGHT = 720;
/** Bytes of one bgr24 frame. */
export const FRAME_BYTES = WIDTH * HEIGHT * 3;

/** Writes a {@link WIDTH}x{@link HEIGHT} H.264 `testsrc` clip of `frames` frames (30 per second) to `path`. */
export async function makeClip(path: string, frames: number): Promise<void> {
  const made = await new Deno.Command("ffmpeg", {
    args: [
      ...["-hide_banner", "-nostdin", "-loglevel", "error"],
      ...["-f", "lavfi", "-i", `testsrc=size=${WIDTH}x${HEIGHT}:rate=30`],
      ...["-frames:v", String(frames), "-c:v", "libx264", "-pix_fmt", "yuv420p", "-y", path],
    ],
    stdin: "null",
  }).output();
  if (!made.success) throw new Error(`ffmpeg cannot make the clip: ${new TextDecoder().decode(made.stderr)}`);
}

/** `ffmpeg` decoding `clip` to bgr24 raw video on its stdout; its stderr inherited or dropped. */
export function rawDecoder(clip: string, stderr: "inherit" | "null" = "inherit"): Deno.ChildProcess {
  return new Deno.Command("ffmpeg", {
    args: [
      ...["-hide_banner", "-nostdin", "-loglevel", "error", "-i", clip],
      ...["-an", "-f", "rawvideo", "-pix_fmt", "bgr24", "pipe:1"],
    ],
    stdin: "null",
    stdout: "piped",
    stderr,
  }).spawn();
}

/**
 * The bare program's read: `clip` decoded by {@link rawDecoder}, each frame read from the pipe straight
 * into one array reused for every frame, handed to `onFrame` (which must not keep it). Resolves with the
 * number of frames once ffmpeg exits; throws when it failed.
 */
export async function eachFrame(clip: string, onFrame: (frame: Uint8Array) => void): Promise<number> {
  const child = rawDecoder(clip);
  const reader = child.stdout.getReader({ mode: "byob" });
  let frame = new Uint8Array(FRAME_BYTES);
  let frames = 0;
  for (let filled = 0;;) {
    const { value, done } = await reader.read(frame.subarray(filled));
    if (done || value === undefined) break;
    frame = new Uint8Array(value.buffer);
    filled += value.byteLength;
    if (filled < FRAME_BYTES) continue;
    filled = 0;
    onFrame(frame);
    frames++;
  }
  const status = await child.status;
  if (!status.success) {
    throw new Error(`ffmpeg decoding ${clip} exited ${status.code} after ${frames} frames`);
  }
  return frames;
}
