/**
 * The argument checks and value predicates every layer shares: a count, a span of seconds, a record. A
 * failed check is a {@link ConfigError} that names the argument and the value it got, so a caller's
 * mistake surfaces where it was made.
 *
 * @example
 * ```ts
 * import { isRecord, requireCount, requirePositiveSeconds } from "./checks.ts";
 * requireCount(3, "nbTasks", 1); // 3
 * requirePositiveSeconds(0.5, "timeout"); // 0.5
 * isRecord([]); // false
 * ```
 *
 * @module
 */

import { ConfigError } from "./errors.ts";

/**
 * `value` when it is a safe integer of at least `min` (0 unless given); a ConfigError naming `what`
 * otherwise (NaN, a fraction and Infinity included).
 */
export function requireCount(
  value: number,
  what: string,
  min = 0,
  remedy = `pass ${what} as a whole number of ${min} or more`,
): number {
  if (!Number.isSafeInteger(value) || value < min) {
    throw new ConfigError(`${what} must be a whole number of at least ${min}, got ${value}`, remedy, {
      [what]: value,
    });
  }
  return value;
}

/** `value` when it is a finite number of seconds, 0 or more; a ConfigError naming `what` otherwise. */
export function requireSeconds(
  value: number,
  what: string,
  remedy = `pass ${what} in seconds, 0 or more`,
): number {
  if (!Number.isFinite(value) || value < 0) {
    throw new ConfigError(`${what} must be a finite number of seconds, 0 or more, got ${value}`, remedy, {
      [what]: value,
    });
  }
  return value;
}

/** `value` when it is a finite number of seconds above 0; a ConfigError naming `what` otherwise. */
export function requirePositiveSeconds(value: number, what: string): number {
  if (!Number.isFinite(value) || value <= 0) {
    throw new ConfigError(
      `${what} must be a positive, finite number of seconds, got ${value}`,
      `pass ${what} in seconds, more than 0`,
      { [what]: value },
    );
  }
  return value;
}

/** Whether `value` is an object with string keys: not null, not an array (a parsed JSON object passes). */
export function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** Whether `value` is a plain object: made by a literal, `JSON.parse` or `Object.create(null)`, no class. */
export function isPlainObject(value: unknown): value is Record<string, unknown> {
  if (typeof value !== "object" || value === null) return false;
  const proto = Object.getPrototypeOf(value);
  return proto === Object.prototype || proto === null;
}

/** `url` with any `user:password@` replaced by `***@`, so an error message never carries a credential. */
export function redactedUrl(url: string): string {
  return url.replace(/^([a-z][a-z0-9+.-]*:\/\/)[^/@]*@/i, "$1***@");
}
