/**
 * Where a local run's messages, payloads and ledger live, as the local engine's supervisor uses them: the
 * embedded broker it hosts itself ({@link EmbeddedRunBroker}, the default), or real servers a flow's
 * replicas reach on their own (NATS JetStream and Redis: `server_broker.ts`). The supervisor provisions
 * through it, tells replicas where to connect, stops the flow, reads which end marker a replica published
 * and which dead letters a node made, and counts what the broker dropped or still holds, without knowing
 * which one it is.
 *
 * @module
 */

import type { NodeSpec } from "../core/compiler.ts";
import { channelId, type Envelope, MessageKind, type SubscriptionId } from "../backends/messaging.ts";
import type { RuntimeStore } from "../backends/runtime_store.ts";
import { type FlowTopology, provisionFlow } from "../messaging/topology.ts";
import { EMBEDDED_RUNTIME_STORE_URL, EndMarker } from "../runtime/worker.ts";
import type { BrokerAddress } from "../runtime/worker_config.ts";
import { parseBrokerAddress } from "../embedded/rpc.ts";
import { decodeEnvelope } from "../wire/codec.ts";
import { MsgType } from "../wire/identities.ts";
import type { EmbeddedBroker } from "./embedded_broker.ts";

/** How replicas are isolated from each other and from the supervisor. */
export const Isolation = { worker: "worker", process: "process" } as const;
/** How replicas are isolated. */
export type Isolation = typeof Isolation[keyof typeof Isolation];

/** Where a replica connects: what its worker settings say about the broker and the stores. */
export interface ReplicaConnection {
  readonly broker: BrokerAddress;
  /** `VF_RUNTIME_STORE_URL`. */
  readonly runtimeStoreUrl: string;
  /** `VF_BLOB_REDIS_URL`; null: the broker's own payload store (embedded) or none. */
  readonly blobStoreUrl: string | null;
  /** The `host:port` addresses the replica must reach over the network, beyond what its node declares. */
  readonly net: readonly string[];
}

/** The end marker of the EOS envelope `body`, and the replica that published it. */
export function endMarkerIn(body: Uint8Array): { replica: number; marker: EndMarker } {
  const decoded = decodeEnvelope(body);
  return {
    replica: decoded.replicaId,
    marker: decoded.type === MsgType.abort ? EndMarker.abort : EndMarker.eos,
  };
}

/** What the local engine's supervisor needs of the broker its run's replicas share (see the module comment). */
export interface RunBroker {
  /** The run ledger the supervisor counts replica deaths in. */
  readonly ledger: RuntimeStore;
  /**
   * Whether what the broker holds outlives this supervisor (a server's streams do): a re-run with the
   * same run id then finds what the earlier one left, and the ledger's broker counts stay true.
   */
  readonly outlivesSupervisor: boolean;
  /** Creates every channel and subscription of `topology`, reading each back. */
  provision(topology: FlowTopology, operationId: string): Promise<void>;
  /** Readies the broker for replicas isolated as `isolation` (the embedded one listens for subprocesses). */
  serve(isolation: Isolation): Promise<void>;
  /** Where a replica isolated as `isolation` connects. */
  replicaConnection(isolation: Isolation): ReplicaConnection;
  /**
   * Connects the MessagePort a Worker replica `label` (`<node>/<index>`) was handed; returns what ends
   * that connection.
   */
  connectWorker(port: MessagePort, label: string): (reason: string) => void;
  /**
   * Asks every replica of the run to stop the spec's way (the flow-wide stop: producers end their streams
   * and the rest drains) and returns true; or returns false, doing nothing, for a broker that keeps its
   * streams as they are across a stop, so that a re-run goes on from them: the supervisor then quiesces
   * each replica itself.
   */
  stopFlow(): boolean;
  /** The end marker replica `replica` of `node` published to its children, if the broker holds one. */
  endMarkerOf(node: string, replica: number): EndMarker | null;
  /** The dead letters the broker holds of `node`, as envelopes. */
  deadLettersOf(node: string): Envelope[];
  /**
   * What the broker dropped of `spec`'s inputs before any replica was handed them, by reason; null when
   * the broker drops on its own in a way it cannot count (a server's realtime stream evicting its oldest).
   */
  unseenDrops(spec: NodeSpec): Record<string, number> | null;
  /** The most outputs of `node` some child has not settled yet; null while that is not known. */
  unsettledOutputs(node: string): number | null;
  /**
   * Reads again what {@link unsettledOutputs} reports and resolves once the answers are in, so a summary
   * taken next shows the broker as it is now, not as it was at the last refresh (unknown where unreadable).
   */
  readAgain(): Promise<void>;
  /** Stops keeping messages for `subscription`, whose reader is given up on for good. */
  abandon(subscription: SubscriptionId): void;
  /** Says which messages are `subscription`'s own, for {@link unseenDrops}. */
  setDropOwnership(subscription: SubscriptionId, owns: (envelope: Envelope) => boolean): void;
  /** The bytes of the offloaded payload `key`, or null when the store no longer holds them. */
  payloadBytes(key: string): Promise<Uint8Array | null>;
  /** Ends every connection and releases what the broker holds of this supervisor (never the ledger). */
  close(): Promise<void>;
}

/** The embedded broker, hosted by the supervisor: a run's messages live and die with it. */
export class EmbeddedRunBroker implements RunBroker {
  readonly outlivesSupervisor = false;
  readonly #broker: EmbeddedBroker;
  readonly #flowId: string;
  readonly #runId: string;
  readonly #nodes: readonly string[];

  /** Serves the run `flowId`/`runId` of the nodes `nodes` over `broker`, whose ledger is `ledger`. */
  constructor(broker: EmbeddedBroker, readonly ledger: RuntimeStore, run: {
    flowId: string;
    runId: string;
    nodes: readonly string[];
  }) {
    this.#broker = broker;
    this.#flowId = run.flowId;
    this.#runId = run.runId;
    this.#nodes = run.nodes;
  }

  async provision(topology: FlowTopology, operationId: string): Promise<void> {
    await provisionFlow(this.#broker.messaging, topology, operationId);
  }

  async serve(isolation: Isolation): Promise<void> {
    if (isolation === Isolation.process) await this.#broker.listen();
  }

  replicaConnection(isolation: Isolation): ReplicaConnection {
    if (isolation === Isolation.worker) {
      return {
        broker: { kind: "embedded-port" },
        runtimeStoreUrl: EMBEDDED_RUNTIME_STORE_URL,
        blobStoreUrl: null,
        net: [],
      };
    }
    const address = this.#broker.address ?? "";
    return {
      broker: { kind: "embedded-tcp", ...parseBrokerAddress(address), secret: this.#broker.secret },
      runtimeStoreUrl: EMBEDDED_RUNTIME_STORE_URL,
      blobStoreUrl: null,
      net: [address.replace("tcp://", "")],
    };
  }

  connectWorker(port: MessagePort, label: string): (reason: string) => void {
    const connection = this.#broker.servePort(port, label);
    return (reason) => void connection.disconnect(reason);
  }

  stopFlow(): boolean {
    for (const node of this.#nodes) {
      const channel = channelId(this.#flowId, this.#runId, node);
      this.#broker.messaging.commitControl(channel, "stop", null, new TextEncoder().encode("stop"));
    }
    return true;
  }

  endMarkerOf(node: string, replica: number): EndMarker | null {
    for (const envelope of this.#broker.messaging.stored(channelId(this.#flowId, this.#runId, node))) {
      if (envelope.kind !== MessageKind.eos) continue;
      const found = endMarkerIn(envelope.body);
      if (found.replica === replica) return found.marker;
    }
    return null;
  }

  deadLettersOf(node: string): Envelope[] {
    return this.#broker.messaging.stored(channelId(this.#flowId, this.#runId, node))
      .filter((envelope) => envelope.kind === MessageKind.dlq);
  }

  unseenDrops(spec: NodeSpec): Record<string, number> {
    const messaging = this.#broker.messaging;
    const drops: Record<string, number> = {};
    for (const parent of spec.parents) {
      for (const subscription of messaging.subscriptionIds(channelId(this.#flowId, this.#runId, parent))) {
        if (subscription.consumerNode !== spec.name || subscription.kind !== MessageKind.data) continue;
        for (const [reason, n] of Object.entries(messaging.unseenDrops(subscription))) {
          drops[reason] = (drops[reason] ?? 0) + n;
        }
      }
    }
    return drops;
  }

  unsettledOutputs(node: string): number {
    const messaging = this.#broker.messaging;
    return Math.max(
      0,
      ...messaging.subscriptionIds(channelId(this.#flowId, this.#runId, node))
        .filter((subscription) => subscription.kind === MessageKind.data)
        .map((subscription) => messaging.unsettled(subscription)),
    );
  }

  /** The embedded broker's counts are read when asked: nothing to read again. */
  readAgain(): Promise<void> {
    return Promise.resolve();
  }

  abandon(subscription: SubscriptionId): void {
    this.#broker.messaging.abandon(subscription);
  }

  setDropOwnership(subscription: SubscriptionId, owns: (envelope: Envelope) => boolean): void {
    this.#broker.messaging.setDropOwnership(subscription, owns);
  }

  async payloadBytes(key: string): Promise<Uint8Array | null> {
    const store = this.#broker.payload;
    const read = await store.read(await store.refForKey(key));
    return read.kind === "bytes" ? read.data : null;
  }

  close(): Promise<void> {
    return this.#broker.close();
  }
}
