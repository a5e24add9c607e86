/**
 * {@link ChannelMean}: the benchmark video flow's per-frame work, deliberately trivial so the figure is the
 * runtime's cost of moving frames: the mean of one channel of an interleaved 8-bit frame.
 *
 * @module
 */

import { type Frame, ProcessorNode } from "../../mod.ts";

/** The mean of channel `channel` (0 by default) of each frame, as `{ mean }`. */
export class ChannelMean extends ProcessorNode<{ readonly channel?: number }> {
  /** `{ mean }` over every pixel's chosen channel. */
  process(frame: Frame): { readonly mean: number } {
    const [, , channels] = frame.pixels.shape;
    const data = frame.pixels.data;
    const stride = channels ?? 1;
    let total = 0;
    for (let at = this.params.channel ?? 0; at < data.length; at += stride) total += data[at];
    return { mean: total / (data.length / stride) };
  }
}
