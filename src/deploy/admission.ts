/**
 * The deploy's admission (spec runtime.provision ENV-13, `deploy.admission`): before any manifest is
 * rendered, the flow's composition is planned against what a Kubernetes target with NATS JetStream and
 * Redis is known to guarantee without being contacted. What only a live read-back can tell (stream
 * replication and storage, the server's payload limit, Redis's persistence and eviction policy) is
 * Unknown here, never assumed: a guarantee resting on it is a warning the deploy prints, and the provision
 * Job admits the same composition again against the live services, where it binds. A definite
 * incompatibility (a fused execution group, a batching contract, an autoscaled Job) is refused here, every
 * unmet requirement named, and nothing is rendered.
 *
 * @module
 */

import {
  type Composition,
  defaultRequirements,
  FlowRequirements,
  kubernetesExecutionCapabilities,
  payloadCapabilities,
} from "../backends/capabilities.ts";
import { unknown } from "../backends/outcomes.ts";
import type { NodeSpec } from "../core/compiler.ts";
import type { BatchingPolicy } from "../core/node.ts";
import type { FlowType } from "../core/flow_type.ts";
import { jetstreamCapabilities } from "../messaging/jetstream_config.ts";
import { admitRequirements } from "../runtime/provision.ts";
import { REDIS_PAYLOAD_STORE } from "../runtime/redis_payload.ts";
import { redisRuntimeCapabilities } from "../runtime/redis_store.ts";

const NOT_CONTACTED = "the manifests are rendered without contacting the cluster's services; " +
  "the provision Job reads this back live";

/**
 * What a Kubernetes target composed with NATS JetStream (messaging), Redis (payload store and run ledger)
 * and, when `autoscaling`, KEDA is known to guarantee before anything is read back: the adapters' own
 * facts, and Unknown (`unread`) for every fact of the deployed servers.
 */
export function kubernetesTargetComposition(autoscaling: boolean): Composition {
  const unread = unknown("unread", undefined, NOT_CONTACTED);
  return {
    messaging: jetstreamCapabilities({
      version: "unknown",
      replicationFactor: unread,
      persistentStorage: unread,
      maxPayloadBytes: unread,
    }),
    payload: payloadCapabilities({
      adapter: REDIS_PAYLOAD_STORE,
      durable: unread,
      evictable: unread,
      atomicMultikey: unread,
      maxObjectBytes: null,
      readerIdentities: true,
      persistentStorage: unread,
    }),
    runtime: redisRuntimeCapabilities(unread),
    execution: kubernetesExecutionCapabilities(autoscaling),
    payloadRefsInUse: true,
  };
}

/** What the flow declares beyond its graph that the target must honour. */
export interface DeclaredRequirements {
  /** `executionGroups(flow)`: fused groups (RUN-035). */
  readonly executionGroups: Readonly<Record<string, readonly string[]>>;
  /** `batchingPolicies(flow)`: dynamic-batching contracts (RUN-036). */
  readonly batching: Readonly<Record<string, BatchingPolicy>>;
}

/**
 * Admits a flow of `flowType` made of `specs`, with what it `declares`, onto a Kubernetes target
 * ({@link kubernetesTargetComposition}). Throws `IncompatibleProfile` naming every unmet requirement;
 * returns, rendered, each guarantee that rests on a capability only the live services can show.
 */
export function admitKubernetesDeployment(
  flowType: FlowType,
  specs: readonly NodeSpec[],
  declares: DeclaredRequirements,
  autoscaling: boolean,
): string[] {
  const requirements = new FlowRequirements({
    profiles: defaultRequirements(flowType, specs).profiles,
    executionGroups: declares.executionGroups,
    batching: Object.fromEntries(
      Object.entries(declares.batching).map(([node, policy]) => [node, { ...policy }]),
    ),
  });
  return admitRequirements(requirements, kubernetesTargetComposition(autoscaling));
}
