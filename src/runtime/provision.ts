/**
 * Provisioning (spec runtime.provision): creates every stream and durable a flow's run needs on a NATS
 * JetStream server before any of its workers starts, so that a batch channel's interest retention has its
 * consumers registered before the first publication. The composition is admitted first, against what the
 * broker, the payload store and the run ledger read back live (`planComposition`): a definite
 * incompatibility is an IncompatibleProfile (exit 2) and nothing is created; a guarantee resting on a
 * capability that could not be observed is a warning without explicit profile requests (there are none in
 * this build). Afterwards every channel and subscription is read back, and a field the broker did not
 * honour is an IncompatibleProfile. Idempotent: a retried provisioning, or a worker that re-binds, changes
 * nothing.
 *
 * @example
 * ```ts
 * const provisioned = await provisionRun({
 *   natsUrl: "nats://127.0.0.1:4222",
 *   flowId: "f",
 *   runId: "r1",
 *   flowType: "batch",
 *   specs,
 * });
 * console.log(provisioned.topology.channels.length);
 * ```
 *
 * @module
 */

import {
  defaultRequirements,
  type PayloadCapabilities,
  planComposition,
  UnobservableComposition,
} from "../backends/capabilities.ts";
import type { RuntimeCapabilities } from "../backends/runtime_store.ts";
import { storeSharedAndDurable } from "../backends/runtime.ts";
import type { NodeSpec } from "../core/compiler.ts";
import { IncompatibleProfile } from "../core/errors.ts";
import type { FlowType } from "../core/flow_type.ts";
import { JetStreamMessagingBackend } from "../messaging/jetstream_backend.ts";
import {
  defaultPrefetch,
  type FlowTopology,
  flowTopology,
  type ProvisionedTopology,
  provisionFlow,
} from "../messaging/topology.ts";
import { RedisPayloadStore } from "./redis_payload.ts";
import { openRuntimeStore } from "./runtime_stores.ts";

/** What {@link provisionRun} provisions, and where. */
export interface ProvisionOptions {
  /** `VF_NATS_URL`: the JetStream server. */
  readonly natsUrl: string;
  readonly flowId: string;
  readonly runId: string;
  readonly flowType: FlowType;
  /** The compiled node specs of the whole flow. */
  readonly specs: readonly NodeSpec[];
  /** `VF_BLOB_REDIS_URL`: the payload store the workers offload to, read back, never written; none by default. */
  readonly blobStoreUrl?: string | null;
  /**
   * `VF_RUNTIME_STORE_URL`: the run ledger the workers share, read back for durability (which decides the
   * delivery caps the durables get); `memory://` by default.
   */
  readonly runtimeStoreUrl?: string | null;
  /** `VF_MAX_RETRIES` (3). */
  readonly maxRetries?: number;
  /** `VF_ACK_WAIT_SECONDS` (60). */
  readonly ackWaitSeconds?: number;
  /** `VF_STREAM_REPLICAS`: stream copies to request (1). */
  readonly replicas?: number;
}

/** What a provisioning found and made. */
export interface ProvisionResult {
  /** Every channel and subscription, as the broker holds them. */
  readonly topology: ProvisionedTopology;
  /** Whether the ledger reads back durable and shared: the durables' delivery caps are then the ledger's. */
  readonly ledgerBudget: boolean;
  /** Each guarantee that rests on a capability nobody could observe, rendered. */
  readonly warnings: readonly string[];
}

/** The payload store's capabilities, read back live; null when the run composes none. */
async function payloadCapabilitiesAt(url: string | null): Promise<PayloadCapabilities | null> {
  if (url === null) return null;
  const store = RedisPayloadStore.open(url);
  try {
    return await store.capabilities();
  } finally {
    await store.close();
  }
}

/** The ledger's capabilities, and whether it keeps retry budgets (durable and shared). */
async function ledgerAt(url: string | null): Promise<{ capabilities: RuntimeCapabilities; budget: boolean }> {
  const store = await openRuntimeStore(url);
  try {
    return { capabilities: await store.capabilities(), budget: await storeSharedAndDurable(store) };
  } finally {
    await store.close();
  }
}

/**
 * Admits the composition of a flow of `flowType` made of `specs` against what `backend` and the stores
 * read back: throws IncompatibleProfile for a definite incompatibility; returns, rendered, each guarantee
 * that rests on a capability nobody could observe (a warning without explicit profile requests).
 */
export async function admitComposition(
  backend: JetStreamMessagingBackend,
  payload: PayloadCapabilities | null,
  runtime: RuntimeCapabilities,
  flowType: FlowType,
  specs: readonly NodeSpec[],
): Promise<string[]> {
  try {
    planComposition(defaultRequirements(flowType, specs), {
      messaging: await backend.capabilities(),
      payload,
      runtime,
      payloadRefsInUse: payload !== null,
    });
    return [];
  } catch (error) {
    if (!(error instanceof UnobservableComposition)) throw error;
    return [error.render()];
  }
}

/**
 * Creates `topology` on `backend` and reads it back; throws IncompatibleProfile naming every field the
 * server at `where` did not honour.
 */
export async function provisionTopology(
  backend: JetStreamMessagingBackend,
  topology: FlowTopology,
  operationId: string,
  where: string,
): Promise<ProvisionedTopology> {
  const provisioned = await provisionFlow(backend, topology, operationId);
  if (provisioned.mismatches.length > 0) {
    const { flowId, runId } = topology.channels[0]?.id ?? { flowId: "?", runId: "?" };
    throw new IncompatibleProfile(
      `the NATS server at ${where} does not hold run ${runId} of flow ${flowId} as requested: ` +
        provisioned.mismatches.join("; "),
      "delete the streams named (they belong to an earlier configuration of this run) or use another run id",
    );
  }
  return provisioned;
}

/**
 * Admits the run's composition against the live services and creates its streams and durables (see the
 * module comment). Throws IncompatibleProfile for a refused composition or a broker that did not honour
 * a requested field, BrokerUnavailable for an unreachable server.
 */
export async function provisionRun(options: ProvisionOptions): Promise<ProvisionResult> {
  const { flowId, runId, flowType, specs } = options;
  const payload = await payloadCapabilitiesAt(options.blobStoreUrl ?? null);
  const ledger = await ledgerAt(options.runtimeStoreUrl ?? null);
  const backend = await JetStreamMessagingBackend.connect({ url: options.natsUrl });
  try {
    const warnings = await admitComposition(backend, payload, ledger.capabilities, flowType, specs);
    const topology = flowTopology(specs, {
      flowId,
      runId,
      flowType,
      maxRetries: options.maxRetries,
      ackWaitSeconds: options.ackWaitSeconds,
      ledgerBudget: ledger.budget,
      replicas: options.replicas,
      prefetch: defaultPrefetch(flowType, true),
    });
    const provisioned = await provisionTopology(backend, topology, `provision/${runId}`, options.natsUrl);
    return { topology: provisioned, ledgerBudget: ledger.budget, warnings };
  } finally {
    await backend.shutdown();
  }
}
