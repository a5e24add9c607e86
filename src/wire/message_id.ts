/**
 * Message ids (the `Nats-Msg-Id` dedup key, WIRE.md "Identities") for envelopes: the first 32 hex
 * characters of SHA-256 over `{flow_id}:{run_id}:{producer_name}:{trace_id}:{seq}:{msg_type}`. The
 * derivation itself is `identities.ts`'s {@link messageId}; this module names it for the codec's callers
 * and derives it from a whole {@link Envelope}.
 *
 * @module
 */

import type { Envelope } from "./codec.ts";
import { messageId } from "./identities.ts";

/**
 * The id of the message `(flowId, runId, producerName, traceId, seq, msgType)`: byte for byte the
 * reference's, so a republished message is deduplicated whichever runtime published it first. `abort`
 * gives an ABORT marker an id distinct from its clean EOS's.
 *
 * @example deriveMessageId("flow-A", "run-1", "cam", "cam:1", 1, "data") === "745708c2eeaf98a60fdbebafe1d04eff"
 */
export const deriveMessageId: typeof messageId = messageId;

/** The id of an envelope: {@link deriveMessageId} over its own flow, run, producer, trace id, seq and type. */
export function envelopeMessageId(env: Envelope): string {
  return messageId(env.flowId, env.runId, env.producerName, env.traceId, env.seq, env.type);
}
