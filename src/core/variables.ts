/**
 * Reading an environment variable's text as a number: one grammar for decimals (no hex, no `Infinity`,
 * no blanks inside) and one error for a value that does not fit, naming the variable, what it must be and
 * what it got, so a worker started with a mistyped setting fails at once and says which.
 *
 * @example
 * ```ts
 * import { secondsFromText, wholeNumberFromText } from "./variables.ts";
 * secondsFromText("VF_WATCHDOG_INTERVAL_SECONDS", "2.5", true); // 2.5
 * wholeNumberFromText("VF_MAX_RETRIES", "3", 0); // 3
 * ```
 *
 * @module
 */

import { ConfigError } from "./errors.ts";

const DECIMAL = /^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/;

/** The number a decimal literal spells (digits, an optional fraction and exponent), or NaN for any other text. */
export function parseDecimal(text: string): number {
  return DECIMAL.test(text) ? Number(text) : NaN;
}

/**
 * The ConfigError for variable `name` whose text `raw` is not `wanted`: its remedy says to set it to such
 * a value (like `example`, when given), then `otherwise` (by default: or to unset it where it is optional).
 */
export function malformedVariable(
  name: string,
  raw: string,
  wanted: string,
  example: string | null,
  otherwise = "or unset it where it is optional",
): ConfigError {
  const like = example === null ? "" : ` (e.g. ${example})`;
  return new ConfigError(
    `${name} must be ${wanted}, got ${JSON.stringify(raw)}`,
    `set ${name} to ${wanted}${like}, ${otherwise}`,
    { variable: name, value: raw },
  );
}

/**
 * `raw` as seconds: a finite decimal above 0, or of 0 or more when `allowZero`; otherwise
 * {@link malformedVariable}, with `example` and `otherwise` for its remedy.
 */
export function secondsFromText(
  name: string,
  raw: string,
  allowZero: boolean,
  example = "60",
  otherwise?: string,
): number {
  const value = parseDecimal(raw);
  if (!Number.isFinite(value) || value < 0 || (!allowZero && value === 0)) {
    const wanted = allowZero ? "a number of seconds, 0 or more" : "a positive number of seconds";
    throw malformedVariable(name, raw, wanted, example, otherwise);
  }
  return value;
}

/**
 * `raw` as a whole number of at least `min`: decimal digits only; otherwise {@link malformedVariable},
 * with `example` and `otherwise` for its remedy.
 */
export function wholeNumberFromText(
  name: string,
  raw: string,
  min: number,
  example: string | null = String(Math.max(min, 1)),
  otherwise?: string,
): number {
  const value = /^\d+$/.test(raw) ? Number(raw) : NaN;
  if (!Number.isSafeInteger(value) || value < min) {
    throw malformedVariable(name, raw, `a whole number of ${min} or more`, example, otherwise);
  }
  return value;
}
