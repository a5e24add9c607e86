/**
 * {@link ChannelMean}: the benchmark video flow's per-frame work, deliberately trivial so the figure is the
 * runtime's cost of moving frames: the mean of one channel of an interleaved 8-bit frame.
 *
 * @module
 */

import { type Frame, ProcessorNode } from "../../mod.ts";

/** Params of {@link ChannelMean}. */
export interface ChannelMeanParams {
  /** The channel averaged (0 by default). */
  readonly channel?: number;
  /** Waits this long per frame first (a consumer slower than its decoder); none by default. */
  readonly delayMs?: number;
}

/** The mean of channel `channel` (0 by default) of each frame, as `{ mean }`, after `delayMs` if given. */
export class ChannelMean extends ProcessorNode<ChannelMeanParams> {
  /** `{ mean }` over every pixel's chosen channel. */
  process(frame: Frame): { readonly mean: number } | Promise<{ readonly mean: number }> {
    const delayMs = this.params.delayMs ?? 0;
    if (delayMs <= 0) return this.#mean(frame);
    return new Promise((resolve) => setTimeout(() => resolve(this.#mean(frame)), delayMs));
  }

  #mean(frame: Frame): { readonly mean: number } {
    const [, , channels] = frame.pixels.shape;
    return { mean: channelMeanOf(frame.pixels.data, channels ?? 1, this.params.channel ?? 0) };
  }
}

/**
 * The mean of channel `channel` of interleaved 8-bit pixels with `stride` channels: the flow's work, and
 * the bare program's (`tasks/bench.ts`), so both do the same per frame.
 */
export function channelMeanOf(data: Uint8Array, stride: number, channel: number): number {
  let total = 0;
  for (let at = channel; at < data.length; at += stride) total += data[at];
  return total / (data.length / stride);
}
