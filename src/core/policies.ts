/**
 * Policies that tune how a node treats its inputs (spec core.policies): how a multi-parent node aligns them
 * ({@link JoinPolicy}), what a failure on one costs ({@link DeliveryPolicy}), how a keyed stateful node
 * orders them ({@link OrderingPolicy}, {@link ReorderBuffer}) and what a partitioned node does with an
 * unusable key ({@link PartitionKeyPolicy}). Each travels with its node as a plain snake_case dict, so it
 * survives the NodeSpec boundary into a worker that never sees the object graph.
 *
 * One policy a file; this module is the place to import them from.
 *
 * @module
 */

export * from "./join_policy.ts";
export * from "./delivery_policy.ts";
export * from "./ordering_policy.ts";
export * from "./partition_key_policy.ts";
