/**
 * Message ids (the `Nats-Msg-Id` dedup key, WIRE.md "Identities") for envelopes: the first 32 hex
 * characters of SHA-256 over `{flow_id}:{run_id}:{producer_name}:{trace_id}:{seq}:{msg_type}`. The
 * derivation itself is `identities.ts`'s {@link messageId}, exported here as `deriveMessageId`, the name
 * the public API gives it; {@link envelopeMessageId} derives it from a whole {@link Envelope}.
 *
 * @module
 */

import type { Envelope } from "./codec.ts";
import { messageId } from "./identities.ts";

export { messageId as deriveMessageId } from "./identities.ts";

/**
 * The id of an envelope: the message id over its own flow, run, producer, trace id, seq and type, byte for
 * byte the reference's, so a republished message is deduplicated whichever runtime published it first.
 */
export function envelopeMessageId(env: Envelope): string {
  return messageId(env.flowId, env.runId, env.producerName, env.traceId, env.seq, env.type);
}
