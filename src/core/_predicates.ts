/**
 * Private value predicates the validators share: the node checks of `graph.ts` and the NodeSpec reader of
 * `compiler.ts` accept exactly the same names, counts and sizes.
 *
 * @module
 */

/** A string with at least one character. */
export const isNonEmptyString = (value: unknown): boolean => typeof value === "string" && value !== "";

/** What a node name must be, as the validators say it. */
export const NODE_NAME_EXPECTED = "a non-empty string without control characters";

/**
 * A node name: a non-empty string without control characters (U+0000–U+001F, U+007F), since a name rides in
 * environment variables, command lines, file names and log lines, where a NUL cannot be carried at all.
 */
export const isNodeName = (value: unknown): boolean =>
  isNonEmptyString(value) &&
  ![...(value as string)].some((char) => char.charCodeAt(0) < 0x20 || char.charCodeAt(0) === 0x7f);

/** A safe integer >= 1 (a replica count, a GPU count, a batch size). */
export const isPositiveInteger = (value: unknown): boolean =>
  Number.isSafeInteger(value) && (value as number) >= 1;

/** A safe integer >= 0 (a prefetch depth, a retry count). */
export const isNonNegativeInteger = (value: unknown): boolean =>
  Number.isSafeInteger(value) && (value as number) >= 0;

/** A finite number > 0 (a memory size, a window). */
export const isPositiveNumber = (value: unknown): boolean =>
  typeof value === "number" && Number.isFinite(value) && value > 0;
