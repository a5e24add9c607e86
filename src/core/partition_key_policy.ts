/**
 * What a partitioned node does with a record whose partition key is unusable: absent, null, empty, or not
 * a scalar (spec core.policies, PartitionKeyPolicy, RUN-020). Such a key is never hashed as the string
 * "None": that silent fallback made every invalid record an undeclared hot partition.
 *
 * @module
 */

import { ConfigError } from "./errors.ts";
import { isValidPartitionKey } from "../wire/identities.ts";
import { PolicyCheck, readCheckedDict } from "./_policy_fields.ts";

/** Poison: dead-lettered as `VF_POISON_PARTITION_KEY`, a traceable terminal outcome (the default). */
export const INVALID_KEY_REJECT = "reject";
/** Routed to one declared partition, observable in the record's metadata. */
export const INVALID_KEY_FALLBACK = "fallback";
/** What a partitioned node does with an unusable key. */
export const INVALID_KEY_POLICIES = [INVALID_KEY_REJECT, INVALID_KEY_FALLBACK] as const;
/** One of {@link INVALID_KEY_POLICIES}. */
export type InvalidKeyPolicy = typeof INVALID_KEY_POLICIES[number];

const PARTITION_KEY_KEYS = ["invalid", "fallback_partition"];

/** The constructor's camelCase options; both optional. */
export interface PartitionKeyPolicyInit {
  /** `reject` (default) or `fallback`. */
  readonly invalid?: InvalidKeyPolicy;
  /** The replica index an invalid key routes to under `fallback` (default 0); below `nb_tasks`. */
  readonly fallbackPartition?: number;
}

/** The serialized form, with the spec's exact keys (`PartitionKeyPolicy.to_dict`). */
export interface PartitionKeyPolicyDict {
  /** What happens to a record with an unusable key. */
  readonly invalid: InvalidKeyPolicy;
  /** The replica an unusable key routes to under `fallback`. */
  readonly fallback_partition: number;
}

type PartitionKeyRaw = { readonly [K in keyof PartitionKeyPolicyInit]?: unknown };

function checkPartitionKey(raw: PartitionKeyRaw, check: PolicyCheck): Required<PartitionKeyPolicyInit> {
  const fields = {
    invalid: raw.invalid ?? INVALID_KEY_REJECT,
    fallbackPartition: raw.fallbackPartition ?? 0,
  };
  check.oneOf("invalid", fields.invalid, INVALID_KEY_POLICIES);
  check.number("fallback_partition", fields.fallbackPartition, { integer: true, min: 0 });
  check.throwIfAny();
  return fields as Required<PartitionKeyPolicyInit>;
}

/**
 * A validated partition-key policy; construction refuses an unknown `invalid` and a `fallback_partition`
 * that is not an integer >= 0, both at once in one {@link ConfigError}.
 */
export class PartitionKeyPolicy {
  /** What happens to a record with an unusable key. */
  readonly invalid: InvalidKeyPolicy;
  /** The replica an unusable key routes to under `fallback`. */
  readonly fallbackPartition: number;

  /** A policy of `init`, its defaults for what `init` leaves out; throws {@link ConfigError} when invalid. */
  constructor(init: PartitionKeyPolicyInit = {}) {
    const fields = checkPartitionKey(init, new PolicyCheck("PartitionKeyPolicy", "init"));
    this.invalid = fields.invalid;
    this.fallbackPartition = fields.fallbackPartition;
  }

  /**
   * A usable partition key: a non-empty well-formed string, a boolean, a bigint or an integer number; never
   * null, undefined, `""`, a fractional number or a container (RUN-020). The same rule the partition hash
   * applies, so a key this accepts always hashes.
   */
  static isValidKey(value: unknown): boolean {
    return isValidPartitionKey(value);
  }

  /**
   * Rebuilds a policy from its dict; `null`, `undefined` or `{}` is the default policy (reject). A
   * non-object, an unknown key and every invalid value are reported together in one {@link ConfigError}.
   */
  static fromDict(d: unknown): PartitionKeyPolicy {
    if (d === null || d === undefined) return new PartitionKeyPolicy();
    return new PartitionKeyPolicy(
      readCheckedDict("PartitionKeyPolicy", d, PARTITION_KEY_KEYS, checkPartitionKey),
    );
  }

  /** The dict with the spec's exact keys; `fromDict(toDict())` is an equal policy. */
  toDict(): PartitionKeyPolicyDict {
    return { invalid: this.invalid, fallback_partition: this.fallbackPartition };
  }

  /**
   * The check made when the policy is bound to a node with `nbTasks` replicas: under `fallback` the
   * fallback partition must name one of them. Throws {@link ConfigError} otherwise.
   */
  checkBound(nbTasks: number): void {
    if (this.invalid !== INVALID_KEY_FALLBACK || this.fallbackPartition < nbTasks) return;
    throw new ConfigError(
      `fallback_partition ${this.fallbackPartition} is not a replica of a node with nb_tasks ${nbTasks}`,
      `set fallback_partition below ${nbTasks}, or raise nb_tasks`,
      { fallback_partition: this.fallbackPartition, nb_tasks: nbTasks },
    );
  }
}
