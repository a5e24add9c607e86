/**
 * The MessagingBackend conformance stories against the memory reference broker, on a FakeClock, in its
 * retained (JetStream-like) and core-only (Core NATS) modes.
 *
 * @module
 */

import { FakeClock } from "../../../src/backends/memory/clock.ts";
import {
  DEFAULT_CLIENT_QUEUE_LIMIT,
  MemoryMessagingBackend,
} from "../../../src/backends/memory/messaging.ts";
import { messagingScenarios } from "./scenarios.ts";

messagingScenarios({
  name: "memory",
  coreOnly: true,
  clientQueueLimit: DEFAULT_CLIENT_QUEUE_LIMIT,
  byteBudget: true,
  simulatedTime: true,
  dedupWindowSeconds: 120,
  creditReserves: true,
  exactByteLimits: true,
  collidingChannelNames: true,
  create: (options) => {
    const clock = new FakeClock();
    const backend = new MemoryMessagingBackend({ clock, ...options });
    return Promise.resolve({
      backend,
      clock,
      now: () => clock.monotonic(),
      advance: (seconds) => clock.advanceAsync(seconds),
      dispose: () => backend.shutdown(),
    });
  },
});
