/**
 * The threads of `video_topology_bench.ts`: a Worker told its role (`decode`, `mean` or `sink`) by its
 * first message. `decode` runs ffmpeg on the clip each time it is told to start, reading each frame
 * straight from the pipe into a fresh ArrayBuffer and moving it to the main thread; `mean` takes the
 * mean of channel 0 of each frame moved to it and answers with it; `sink` answers each item.
 *
 * @module
 */

/// <reference lib="deno.worker" />

import { channelMeanOf } from "../tasks/_bench_flows/channel_mean.ts";
import { rawDecoder } from "../tasks/_bench_flows/raw_video.ts";

/** What the main thread tells a Worker first. */
export interface TopologyRole {
  readonly role: "decode" | "mean" | "sink";
  /** The clip and its frame size in bytes, for `decode`. */
  readonly clip?: string;
  readonly frameBytes?: number;
}

async function decode(clip: string, frameBytes: number): Promise<void> {
  const child = rawDecoder(clip, "null");
  const reader = child.stdout.getReader({ mode: "byob" });
  for (let seq = 0;; seq++) {
    let buffer = new ArrayBuffer(frameBytes);
    for (let filled = 0; filled < frameBytes;) {
      const { value, done } = await reader.read(new Uint8Array(buffer, filled, frameBytes - filled));
      if (done || value === undefined) {
        await child.status;
        return;
      }
      filled += value.byteLength;
      buffer = value.buffer as ArrayBuffer;
    }
    self.postMessage({ seq, buffer }, [buffer]);
  }
}

self.onmessage = (first: MessageEvent<TopologyRole>) => {
  const { role, clip, frameBytes } = first.data;
  self.onmessage = role === "decode"
    ? () => void decode(clip!, frameBytes!)
    : role === "mean"
    ? (event: MessageEvent<{ seq: number; buffer: ArrayBuffer }>) => {
      const { seq, buffer } = event.data;
      self.postMessage({ seq, mean: channelMeanOf(new Uint8Array(buffer), 3, 0) });
    }
    : (event: MessageEvent<{ seq: number }>) => self.postMessage(event.data.seq);
};
