/**
 * A local run over real servers (`vf run-local --nats URL --redis URL`): NATS JetStream carries every
 * message and Redis holds the payloads and the run ledger, which the replicas reach themselves, as pods
 * would. The supervisor admits the composition against what the servers read back, provisions the run's
 * streams and durables, listens on core NATS for the end markers and dead letters the replicas publish
 * (so it knows them as the embedded broker would), and reads the durables' backlog for the live view. The
 * servers' streams outlive the supervisor, so a stop ends no stream: the supervisor quiesces each replica
 * (it settles what it holds and publishes no end marker), and a re-run with the same run id goes on from
 * what the streams hold. What a server dropped on its own (a realtime stream evicting its oldest) is not
 * observable here: the live view says so rather than count it as none.
 *
 * @module
 */

import type { NatsConnection, Subscription } from "@nats-io/nats-core";
import { type JetStreamManager, jetstreamManager } from "@nats-io/jetstream";
import type { NodeSpec } from "../core/compiler.ts";
import type { FlowType } from "../core/flow_type.ts";
import {
  channelId,
  type Envelope,
  envelope,
  MessageKind,
  Overflow,
  type SubscriptionId,
} from "../backends/messaging.ts";
import { dlqSubjectFilter, eosSubjectFor, streamNameFor } from "../backends/names.ts";
import type { RuntimeStore } from "../backends/runtime_store.ts";
import { DeadLetterHeader } from "../messaging/messenger.ts";
import { connectNats, JetStreamMessagingBackend, MSG_ID_HEADER } from "../messaging/jetstream_backend.ts";
import { durableNameOf, type FlowTopology } from "../messaging/topology.ts";
import { admitComposition, provisionTopology } from "../runtime/provision.ts";
import { RedisPayloadStore } from "../runtime/redis_payload.ts";
import { serverAddresses } from "../runtime/permissions.ts";
import type { EndMarker } from "../runtime/worker.ts";
import { ENVELOPE_VERSION } from "../wire/codec.ts";
import { endMarkerIn, type Isolation, type ReplicaConnection, type RunBroker } from "./run_broker.ts";

/** The servers a run uses and the run itself. */
export interface ServerRunBrokerOptions {
  /** The JetStream server, `nats://host:port`. */
  readonly natsUrl: string;
  /** The Redis server holding payloads and the run ledger, `redis://host:port`. */
  readonly redisUrl: string;
  /** The run ledger on that Redis server, opened (and closed) by the caller. */
  readonly ledger: RuntimeStore;
  readonly flowId: string;
  readonly runId: string;
  readonly flowType: FlowType;
  readonly specs: readonly NodeSpec[];
  /** Called as each dead letter is seen published (the supervisor writes its dead-letter file). */
  readonly onDeadLetter: () => void;
  /** Told each warning admission has (a guarantee resting on a capability nobody could observe). */
  readonly onWarning: (line: string) => void;
}

/** Real NATS JetStream and Redis servers (see the module comment). */
export class ServerRunBroker implements RunBroker {
  readonly outlivesSupervisor = true;
  readonly ledger: RuntimeStore;
  readonly #options: ServerRunBrokerOptions;
  readonly #backend: JetStreamMessagingBackend;
  readonly #nc: NatsConnection;
  readonly #jsm: JetStreamManager;
  readonly #payload: RedisPayloadStore;
  readonly #markers = new Map<string, EndMarker>();
  readonly #letters = new Map<string, Envelope[]>();
  readonly #backlog = new Map<string, number>();
  readonly #reading = new Map<string, Promise<void>>();
  readonly #subscriptions: Subscription[] = [];
  #topology: FlowTopology | null = null;

  private constructor(
    options: ServerRunBrokerOptions,
    backend: JetStreamMessagingBackend,
    nc: NatsConnection,
    jsm: JetStreamManager,
    payload: RedisPayloadStore,
  ) {
    this.ledger = options.ledger;
    this.#options = options;
    this.#backend = backend;
    this.#nc = nc;
    this.#jsm = jsm;
    this.#payload = payload;
  }

  /**
   * Connects to both servers and listens for the run's end markers and dead letters; BrokerUnavailable
   * when NATS cannot be reached.
   */
  static async open(options: ServerRunBrokerOptions): Promise<ServerRunBroker> {
    const payload = RedisPayloadStore.open(options.redisUrl);
    let backend: JetStreamMessagingBackend | null = null;
    try {
      backend = await JetStreamMessagingBackend.connect({ url: options.natsUrl });
      const nc = await connectNats(options.natsUrl);
      const broker = new ServerRunBroker(options, backend, nc, await jetstreamManager(nc), payload);
      broker.#listen();
      return broker;
    } catch (error) {
      await backend?.shutdown();
      await payload.close();
      throw error;
    }
  }

  /** Subscribes to every node's EOS subject and to the run's dead-letter subjects. */
  #listen(): void {
    const { flowId, runId, specs } = this.#options;
    for (const spec of specs) {
      this.#subscriptions.push(this.#nc.subscribe(eosSubjectFor(flowId, runId, spec.name), {
        callback: (_error, msg) => {
          const found = endMarkerIn(msg.data);
          this.#markers.set(`${spec.name}/${found.replica}`, found.marker);
        },
      }));
    }
    this.#subscriptions.push(this.#nc.subscribe(dlqSubjectFilter(flowId, runId), {
      callback: (_error, msg) => {
        const headers: Record<string, string> = {};
        for (const [name, values] of msg.headers ?? []) headers[name] = values[0] ?? "";
        const node = headers[DeadLetterHeader.originNode] ??
          msg.subject.slice(msg.subject.lastIndexOf(".") + 1);
        const letter = envelope({
          channel: channelId(flowId, runId, node),
          publicationId: headers[MSG_ID_HEADER] ?? `${msg.subject}:${msg.sid}`,
          eventId: headers[MSG_ID_HEADER] ?? "",
          headers,
          body: msg.data.slice(),
          schemaVersion: ENVELOPE_VERSION,
          kind: MessageKind.dlq,
        });
        const letters = this.#letters.get(node) ?? [];
        if (letters.some((known) => known.publicationId === letter.publicationId)) return;
        letters.push(letter);
        this.#letters.set(node, letters);
        this.#options.onDeadLetter();
      },
    }));
  }

  async provision(topology: FlowTopology, operationId: string): Promise<void> {
    const { flowType, specs, natsUrl } = this.#options;
    const warnings = await admitComposition(
      this.#backend,
      await this.#payload.capabilities(),
      await this.ledger.capabilities(),
      flowType,
      specs,
    );
    for (const warning of warnings) this.#options.onWarning(warning);
    await provisionTopology(this.#backend, topology, operationId, natsUrl);
    this.#topology = topology;
  }

  serve(_isolation: Isolation): Promise<void> {
    return Promise.resolve();
  }

  replicaConnection(_isolation: Isolation): ReplicaConnection {
    const { natsUrl, redisUrl } = this.#options;
    return {
      broker: { kind: "nats", url: natsUrl },
      runtimeStoreUrl: redisUrl,
      blobStoreUrl: redisUrl,
      net: [...serverAddresses(natsUrl), ...serverAddresses(redisUrl)],
    };
  }

  connectWorker(port: MessagePort, _label: string): (reason: string) => void {
    port.close();
    return () => {};
  }

  /** Keeps the streams as they are (a re-run goes on from them): the supervisor quiesces the replicas. */
  stopFlow(): boolean {
    return false;
  }

  endMarkerOf(node: string, replica: number): EndMarker | null {
    return this.#markers.get(`${node}/${replica}`) ?? null;
  }

  deadLettersOf(node: string): Envelope[] {
    return [...this.#letters.get(node) ?? []];
  }

  /**
   * None while every input channel of `spec` refuses rather than drops (a producer has none); not
   * countable once one evicts its oldest (a realtime stream does so without telling any client), or
   * before the run's channels are provisioned.
   */
  unseenDrops(spec: NodeSpec): Record<string, number> | null {
    const channels = this.#topology?.channels;
    if (channels === undefined) return spec.parents.length === 0 ? {} : null;
    const evicting = channels.some((channel) =>
      spec.parents.includes(channel.id.node) && channel.overflow === Overflow.evictOldest
    );
    return evicting ? null : {};
  }

  /** The last backlog read of `node`'s data durables (pending plus awaiting ack, the largest), read again now. */
  unsettledOutputs(node: string): number | null {
    this.#readBacklog(node);
    return this.#backlog.get(node) ?? null;
  }

  /**
   * Reads every node's backlog again and waits for the answers (an unreadable one is then unknown); a read
   * already out is waited for first, then one begun now follows it.
   */
  async readAgain(): Promise<void> {
    const nodes = [...new Set(this.#topology?.channels.map((channel) => channel.id.node) ?? [])];
    await Promise.all(nodes.map(async (node) => {
      await this.#reading.get(node);
      await this.#readBacklog(node);
    }));
  }

  /** Reads `node`'s data durables once; while a read is out another waits for it rather than start one. */
  #readBacklog(node: string): Promise<void> {
    const topology = this.#topology;
    const reading = this.#reading.get(node);
    if (reading !== undefined) return reading;
    if (topology === null) return Promise.resolve();
    const { flowId, runId } = this.#options;
    const stream = streamNameFor(flowId, runId, node);
    const durables = topology.subscriptions
      .filter((s) => s.id.channel.node === node && s.id.kind === MessageKind.data)
      .map((s) => durableNameOf(s.id));
    const read = Promise.all(durables.map((durable) => this.#jsm.consumers.info(stream, durable)))
      .then((infos) => {
        this.#backlog.set(node, Math.max(0, ...infos.map((i) => i.num_pending + i.num_ack_pending)));
      }, () => {
        this.#backlog.delete(node);
      })
      .finally(() => this.#reading.delete(node));
    this.#reading.set(node, read);
    return read;
  }

  /** Deletes the durable, so an interest stream keeps nothing more for a reader given up on for good. */
  abandon(subscription: SubscriptionId): void {
    const { flowId, runId, node } = subscription.channel;
    this.#jsm.consumers.delete(streamNameFor(flowId, runId, node), durableNameOf(subscription)).catch(
      () => {},
    );
  }

  setDropOwnership(_subscription: SubscriptionId, _owns: (envelope: Envelope) => boolean): void {}

  async payloadBytes(key: string): Promise<Uint8Array | null> {
    const read = await this.#payload.read(await this.#payload.refForKey(key));
    return read.kind === "bytes" ? read.data : null;
  }

  async close(): Promise<void> {
    for (const subscription of this.#subscriptions) subscription.unsubscribe();
    await this.#nc.drain().catch(() => this.#nc.close());
    await this.#backend.shutdown();
    await this.#payload.close();
  }
}
