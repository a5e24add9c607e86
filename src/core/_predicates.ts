/**
 * Private value predicates the validators share: the node checks of `graph.ts` and the NodeSpec reader of
 * `compiler.ts` accept exactly the same names, counts and sizes.
 *
 * @module
 */

/** A string with at least one character. */
export const isNonEmptyString = (value: unknown): boolean => typeof value === "string" && value !== "";

/** A safe integer >= 1 (a replica count, a GPU count, a batch size). */
export const isPositiveInteger = (value: unknown): boolean =>
  Number.isSafeInteger(value) && (value as number) >= 1;

/** A finite number > 0 (a memory size, a window). */
export const isPositiveNumber = (value: unknown): boolean =>
  typeof value === "number" && Number.isFinite(value) && value > 0;
