/**
 * What the messenger stories and unit tests share: a flow of nodes provisioned on a provider's messaging
 * backend, a payload store and a run ledger (memory, or a file store in a temporary directory when the
 * story needs durability), messengers opened for its nodes as a worker would open them, and a driver that
 * moves the fake clock while a messenger call waits.
 *
 * @module
 */

import { FakeClock } from "../../../src/backends/memory/clock.ts";
import { MemoryMessagingBackend } from "../../../src/backends/memory/messaging.ts";
import { MemoryPayloadStore } from "../../../src/backends/memory/payload.ts";
import { MemoryRuntimeStore } from "../../../src/backends/memory/runtime_store.ts";
import {
  type ChannelId,
  channelId,
  type Envelope,
  type MessagingBackend,
} from "../../../src/backends/messaging.ts";
import type { PublicationOutcome } from "../../../src/backends/outcomes.ts";
import type { PayloadStore } from "../../../src/backends/payload.ts";
import { FlowRuntime } from "../../../src/backends/runtime.ts";
import type { RuntimeStore } from "../../../src/backends/runtime_store.ts";
import { DeliveryPolicy } from "../../../src/core/delivery_policy.ts";
import type { FlowType } from "../../../src/core/flow_type.ts";
import { JoinPolicy } from "../../../src/core/join_policy.ts";
import type { InputGroup } from "../../../src/core/messenger.ts";
import type { JsonObject } from "../../../src/core/node.ts";
import { EmbeddedBroker } from "../../../src/engines/embedded_broker.ts";
import { EmbeddedMessagingBackend } from "../../../src/embedded/messaging_backend.ts";
import { BrokerMessenger, type MessengerOptions } from "../../../src/messaging/messenger.ts";
import { flowTopology, provisionFlow, type TopologyNode } from "../../../src/messaging/topology.ts";
import { EmbeddedPayloadStore } from "../../../src/embedded/payload_store.ts";
import { EmbeddedConnection } from "../../../src/embedded/rpc.ts";
import { FileRuntimeStore } from "../../../src/runtime/file_store.ts";

export const FLOW = "flow-A";
export const RUN = "run-1";

/** The transport and payload store one provider builds for a story, on the story's fake clock. */
export interface MessengerBackends {
  readonly backend: MessagingBackend;
  readonly payloads: PayloadStore;
  /** What the broker retains for a channel, then its dead letters (the hosted model's inventory). */
  stored(channel: ChannelId): Envelope[];
  /** Releases whatever the provider holds. */
  dispose(): Promise<void>;
}

/** A MessagingBackend + PayloadStore implementation the messenger stories run over. */
export interface MessengerProvider {
  /** Prefixes every test name. */
  readonly name: string;
  create(clock: FakeClock): Promise<MessengerBackends>;
}

/** The memory reference broker and payload store, on the story's clock. */
export const memoryProvider: MessengerProvider = {
  name: "memory",
  create(clock) {
    const backend = new MemoryMessagingBackend({ clock });
    return Promise.resolve({
      backend,
      payloads: new MemoryPayloadStore({ clock }),
      stored: (channel) => backend.stored(channel),
      dispose: () => backend.shutdown(),
    });
  },
};

/**
 * The memory broker and payload store hosted by an {@link EmbeddedBroker} on the story's clock, reached
 * through the embedded clients over a MessagePort, as a node worker of the local engine reaches them.
 * `hosted` sees the hosted broker first (a test may wrap its calls).
 */
export function embeddedProvider(
  hosted: (messaging: MemoryMessagingBackend) => void = () => {},
): MessengerProvider {
  return {
    name: "embedded",
    async create(clock) {
      const messaging = new MemoryMessagingBackend({ clock });
      hosted(messaging);
      const broker = new EmbeddedBroker({ clock, messaging, payload: new MemoryPayloadStore({ clock }) });
      const connection = await EmbeddedConnection.connect(broker.openPort("messenger-conformance"));
      const backend = new EmbeddedMessagingBackend(connection, { clock });
      return {
        backend,
        payloads: new EmbeddedPayloadStore(connection, { clock }),
        stored: (channel) => broker.messaging.stored(channel),
        async dispose() {
          await backend.shutdown();
          await connection.close();
          await broker.close();
        },
      };
    },
  };
}

/** A node of a story's flow: a TopologyNode whose fields default to a single-replica, default-policy node. */
export interface StoryNode {
  readonly name: string;
  readonly parents?: readonly string[];
  readonly nbTasks?: number;
  readonly partitionBy?: string | null;
  readonly joinPolicy?: JsonObject | null;
  readonly delivery?: JsonObject | null;
}

/** How a story's flow is built. */
export interface FlowOptions {
  readonly flowType: FlowType;
  readonly nodes: readonly StoryNode[];
  /** A file ledger (durable and shared by this host's processes) instead of a memory one. */
  readonly durableLedger?: boolean;
}

/** Fake seconds a driver step advances when no timer is armed. */
const STEP_SECONDS = 0.01;
/** The most fake seconds one driver step advances: to the next timer, never further than this. */
const MAX_STEP_SECONDS = 0.25;

function topologyNode(node: StoryNode): TopologyNode {
  return {
    name: node.name,
    parents: node.parents ?? [],
    nbTasks: node.nbTasks ?? 1,
    partitionBy: node.partitionBy ?? null,
    joinPolicy: node.joinPolicy ?? null,
    delivery: node.delivery ?? null,
  };
}

/** A provisioned flow and the means to open its nodes' messengers. */
export class MessengerFlow {
  readonly clock: FakeClock;
  readonly backend: MessagingBackend;
  readonly payloads: PayloadStore;
  readonly flowType: FlowType;
  readonly nodes: ReadonlyMap<string, TopologyNode>;
  readonly #backends: MessengerBackends;
  readonly #root: string | null;
  readonly #stores: RuntimeStore[] = [];
  readonly #messengers: BrokerMessenger[] = [];
  #store: RuntimeStore;

  private constructor(
    clock: FakeClock,
    backends: MessengerBackends,
    options: FlowOptions,
    root: string | null,
    store: RuntimeStore,
  ) {
    this.clock = clock;
    this.backend = backends.backend;
    this.payloads = backends.payloads;
    this.flowType = options.flowType;
    this.nodes = new Map(options.nodes.map((node) => [node.name, topologyNode(node)]));
    this.#backends = backends;
    this.#root = root;
    this.#store = store;
    this.#stores.push(store);
  }

  /** Builds the provider's backends, the ledger and the flow's provisioned topology. */
  static async create(provider: MessengerProvider, options: FlowOptions): Promise<MessengerFlow> {
    const clock = new FakeClock();
    const backends = await provider.create(clock);
    const root = options.durableLedger ? await Deno.makeTempDir({ prefix: "vf-messenger-" }) : null;
    const store = root === null ? new MemoryRuntimeStore(clock) : await FileRuntimeStore.open(root, clock);
    const flow = new MessengerFlow(clock, backends, options, root, store);
    const ledgerBudget = options.durableLedger ?? false;
    await provisionFlow(
      backends.backend,
      flowTopology([...flow.nodes.values()], {
        flowId: FLOW,
        runId: RUN,
        flowType: options.flowType,
        ledgerBudget,
      }),
      "provision",
    );
    return flow;
  }

  /** What the broker retains for `node`'s channel, then the dead letters addressed to it. */
  stored(node: string): Envelope[] {
    return this.#backends.stored(channelId(FLOW, RUN, node));
  }

  /** The ledger store the flow's messengers share. */
  get store(): RuntimeStore {
    return this.#store;
  }

  /** A replacement process's view of a durable ledger: the file store opened again (a memory one is lost). */
  async reopenStore(): Promise<RuntimeStore> {
    this.#store = this.#root === null
      ? new MemoryRuntimeStore(this.clock)
      : await FileRuntimeStore.open(this.#root, this.clock);
    this.#stores.push(this.#store);
    return this.#store;
  }

  /** A FlowRuntime of `node`'s replica over the flow's ledger, with the flow's parent replica counts. */
  runtime(node: string, replicaId = 0): FlowRuntime {
    const spec = this.#node(node);
    return new FlowRuntime({
      store: this.#store,
      flowId: FLOW,
      runId: RUN,
      node,
      replicaId,
      nbTasks: spec.nbTasks,
      partitionBy: spec.partitionBy,
      parentReplicas: this.parentReplicas(node),
      clock: this.clock,
    });
  }

  /** Parent name to its replica count, as VF_PARENT_REPLICAS gives it. */
  parentReplicas(node: string): Record<string, number> {
    return Object.fromEntries(this.#node(node).parents.map((parent) => [parent, this.#node(parent).nbTasks]));
  }

  /** The options a worker builds `node`'s messenger with, replica `replicaId`, plus `overrides`. */
  options(node: string, replicaId = 0, overrides: Partial<MessengerOptions> = {}): MessengerOptions {
    const spec = this.#node(node);
    return {
      backend: this.backend,
      flowId: FLOW,
      runId: RUN,
      flowType: this.flowType,
      node,
      parentNames: spec.parents,
      replicaId,
      nbTasks: spec.nbTasks,
      partitionBy: spec.partitionBy,
      joinPolicy: spec.joinPolicy === null ? null : JoinPolicy.fromDict(spec.joinPolicy),
      deliveryPolicy: DeliveryPolicy.resolve(this.flowType, spec.delivery),
      parentReplicas: this.parentReplicas(node),
      runtime: this.runtime(node, replicaId),
      payloadStore: this.payloads,
      blobReaderIds: this.readerIds(node),
      clock: this.clock,
      random: () => 0.5,
      instanceId: `${node}-${replicaId}-${this.#messengers.length}`,
      ...overrides,
    };
  }

  /** The reader obligations a put of `node`'s output acquires (VF_BLOB_READER_IDS). */
  readerIds(node: string): string[] {
    return [...this.nodes.values()].filter((n) => n.parents.includes(node)).flatMap((child) =>
      child.partitionBy !== null && child.nbTasks > 1
        ? Array.from({ length: child.nbTasks }, (_, i) => `${child.name}/p${i}`)
        : [child.name]
    );
  }

  /** Opens `node`'s messenger for replica `replicaId`, as its worker would. */
  async open(
    node: string,
    replicaId = 0,
    overrides: Partial<MessengerOptions> = {},
  ): Promise<BrokerMessenger> {
    const messenger = await this.drive(BrokerMessenger.open(this.options(node, replicaId, overrides)));
    this.#messengers.push(messenger);
    return messenger;
  }

  /**
   * Awaits `promise` while moving the fake clock forward to each next timer (a quarter second at most),
   * letting real I/O (a file ledger) run between steps. Fails when it has not settled within `maxSeconds`
   * of fake time.
   */
  async drive<T>(promise: Promise<T>, maxSeconds = 600): Promise<T> {
    let settled = false;
    const watched = promise.finally(() => {
      settled = true;
    });
    watched.catch(() => {});
    const start = this.clock.monotonic();
    while (!settled) {
      await new Promise((resolve) => setTimeout(resolve, 0));
      if (settled) break;
      if (this.clock.monotonic() - start > maxSeconds) {
        throw new Error(`the call did not settle within ${maxSeconds} s of fake time`);
      }
      const next = this.clock.nextTimerIn();
      await this.clock.advanceAsync(
        next === null ? STEP_SECONDS : Math.min(Math.max(next, 0), MAX_STEP_SECONDS),
      );
    }
    return await watched;
  }

  /** Closes every messenger (as a crash: nothing handed back), the ledgers and the provider's backends. */
  async dispose(): Promise<void> {
    for (const messenger of this.#messengers) await messenger.close({ handBack: false });
    for (const store of this.#stores) await store.close();
    await this.#backends.dispose();
    if (this.#root !== null) await Deno.remove(this.#root, { recursive: true });
  }

  #node(name: string): TopologyNode {
    const node = this.nodes.get(name);
    if (node === undefined) throw new Error(`no node ${name} in the story's flow`);
    return node;
  }
}

/** Starts `call` and reports, after `seconds` of fake time, whether it has settled. */
export async function settlesWithin<T>(
  flow: MessengerFlow,
  call: Promise<T>,
  seconds: number,
): Promise<boolean> {
  let settled = false;
  call.then(() => settled = true, () => settled = true);
  await flow.drive(flow.clock.sleep(seconds));
  return settled;
}

/** Whether every present entry of `group` ends its parent (EOS or ABORT): the task's loop would stop. */
export function isTerminal(group: InputGroup): boolean {
  const entries = Object.values(group).filter((entry) => entry !== null);
  return entries.some((entry) => entry.isStopSignal || entry.isAbort);
}

/** What {@link consume} saw: every data group in order, and the group that ended the stream. */
export interface Consumed {
  readonly groups: InputGroup[];
  readonly end: InputGroup;
}

/**
 * A task's loop in miniature: receives until a terminal group; each data group is published as `map(group)`
 * when `map` is given, then acked. With `map` the node's own EOS follows the end, as a processor's does.
 */
export async function consume(
  flow: MessengerFlow,
  messenger: BrokerMessenger,
  map?: (group: InputGroup) => unknown,
): Promise<Consumed> {
  const groups: InputGroup[] = [];
  for (;;) {
    const group = await flow.drive(messenger.receiveMessage());
    if (isTerminal(group)) {
      if (map !== undefined && Object.values(group).every((entry) => entry === null || !entry.isAbort)) {
        await flow.drive(messenger.publishStopSignal());
      }
      return { groups, end: group };
    }
    groups.push(group);
    if (map !== undefined) await flow.drive(messenger.publishMessage(map(group)));
    await flow.drive(messenger.ackInputs());
  }
}

/** Publishes `values` from a producer's messenger, then (unless told not to) its EOS. */
export async function produce(
  flow: MessengerFlow,
  messenger: BrokerMessenger,
  values: readonly unknown[],
  end = true,
): Promise<void> {
  for (const value of values) await flow.drive(messenger.publishMessage(value));
  if (end) await flow.drive(messenger.publishStopSignal());
}

/** One publication as a test decides it: `original` is the backend's own single publish. */
export type PublicationAnswer = (
  envelope: Envelope,
  deadline: number,
  original: (envelope: Envelope, deadline: number) => Promise<PublicationOutcome>,
) => Promise<PublicationOutcome>;

/**
 * Makes `answer` decide every publication `backend` is given, alone or in a batch (a batch's entries are
 * handed to it in order, in one turn, and the batch answers once all have): the seam a test uses to play a
 * broker that refuses, or answers late.
 */
export function answerPublications(backend: MessagingBackend, answer: PublicationAnswer): void {
  const original = backend.publish.bind(backend);
  backend.publish = (envelope, deadline) => answer(envelope, deadline, original);
  backend.publishBatch = (envelopes, deadline) =>
    Promise.all(envelopes.map((envelope) => answer(envelope, deadline, original)));
}
