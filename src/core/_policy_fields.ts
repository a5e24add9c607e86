/**
 * Private helpers the policy classes share: checking a policy's fields while collecting every problem, so
 * one {@link ConfigError} names them all, and reading a policy's snake_case dict into its camelCase init.
 *
 * @module
 */

import { isRecord } from "./checks.ts";
import { ConfigError } from "./errors.ts";
import { checkFlowType, FlowType } from "./flow_type.ts";

/** How a field is named in a problem: as the camelCase init key, or as the snake_case dict key. */
export type FieldNaming = "init" | "dict";

/** One invalid field of a policy. */
export interface PolicyProblem {
  readonly field: string;
  readonly message: string;
  readonly remedy: string;
}

/** Bounds a numeric field must respect. */
export interface NumberRule {
  /** Whole numbers only. */
  readonly integer?: boolean;
  /** Smallest allowed value (inclusive). */
  readonly min?: number;
  /** Values must be strictly above zero. */
  readonly positive?: boolean;
  /** `null` is a legitimate value (it means "unset"). */
  readonly nullable?: boolean;
}

/** `timeout_seconds` → `timeoutSeconds`. */
export function camelCase(snake: string): string {
  return snake.replace(/_([a-z])/g, (_, letter: string) => letter.toUpperCase());
}

/** A value as a message quotes it: its JSON, or `String(value)` for what JSON cannot spell. */
export function show(value: unknown): string {
  if (value === undefined) return "undefined";
  try {
    return JSON.stringify(value) ?? String(value);
  } catch {
    return String(value);
  }
}

function describeRule(rule: NumberRule): string {
  const kind = rule.integer ? "an integer" : "a finite number";
  if (rule.positive) return `${kind} > 0`;
  if (rule.min !== undefined) return `${kind} >= ${rule.min}`;
  return kind;
}

/**
 * The problems found in one policy. Checks record a problem instead of throwing, so a policy with three
 * wrong fields reports three; {@link PolicyCheck.throwIfAny} raises them together.
 */
export class PolicyCheck {
  readonly #problems: PolicyProblem[] = [];

  constructor(readonly policy: string, readonly naming: FieldNaming) {}

  /** The name the reader wrote for a field (given as its snake_case dict key). */
  name(field: string): string {
    return this.naming === "dict" ? field : camelCase(field);
  }

  /** Records one problem. */
  fail(field: string, message: string, remedy: string): void {
    this.#problems.push({ field, message, remedy });
  }

  /** Whether `value` is one of `allowed`; records a problem when it is not. */
  oneOf<T extends string>(field: string, value: unknown, allowed: readonly T[]): value is T {
    if (typeof value === "string" && (allowed as readonly string[]).includes(value)) return true;
    const choices = allowed.map((a) => JSON.stringify(a)).join(", ");
    this.fail(
      field,
      `${this.name(field)} must be one of ${choices}, got ${show(value)}`,
      `set ${this.name(field)} to one of ${choices}`,
    );
    return false;
  }

  /** Whether `value` is a number within `rule` (or an allowed `null`); records a problem when it is not. */
  number(field: string, value: unknown, rule: NumberRule): value is number {
    if (value === null && rule.nullable) return false;
    const ok = typeof value === "number" && Number.isFinite(value) &&
      (!rule.integer || Number.isInteger(value)) &&
      (!rule.positive || value > 0) &&
      (rule.min === undefined || value >= rule.min);
    if (ok) return true;
    const wanted = describeRule(rule) + (rule.nullable ? " or null" : "");
    this.fail(
      field,
      `${this.name(field)} must be ${wanted}, got ${show(value)}`,
      `set ${this.name(field)} to ${wanted}`,
    );
    return false;
  }

  /** Every problem recorded so far. */
  get problems(): readonly PolicyProblem[] {
    return [...this.#problems];
  }

  /** Throws one {@link ConfigError} carrying every recorded problem; does nothing when there are none. */
  throwIfAny(): void {
    if (this.#problems.length === 0) return;
    const messages = this.#problems.map((p) => p.message);
    throw new ConfigError(
      `invalid ${this.policy}: ${messages.join("; ")}`,
      this.#problems.map((p) => p.remedy).join("; "),
      { policy: this.policy, fields: this.#problems.map((p) => this.name(p.field)), problems: messages },
    );
  }
}

/**
 * Reads a policy's snake_case dict into a camelCase init record holding the keys present. Anything that is
 * not an object, and any key outside `keys`, is a problem recorded on `check` (a misspelt key never
 * silently falls back to a default).
 */
function readPolicyDict(
  check: PolicyCheck,
  d: unknown,
  keys: readonly string[],
): Record<string, unknown> {
  const init: Record<string, unknown> = {};
  if (!isRecord(d)) {
    check.fail(
      "",
      `${check.policy} must be a JSON object, got ${show(d)}`,
      `pass an object with keys ${keys}`,
    );
    return init;
  }
  for (const [key, value] of Object.entries(d)) {
    if (keys.includes(key)) {
      if (value !== undefined) init[camelCase(key)] = value;
    } else {
      check.fail(key, `unknown key ${JSON.stringify(key)}`, `use only the keys ${keys.join(", ")}`);
    }
  }
  return init;
}

/**
 * Reads and checks a policy dict in one pass: the dict's shape (object, known keys) and then its values
 * through `checkFields`, so a dict with a misspelt key and a bad value reports both in one
 * {@link ConfigError}. Returns the camelCase init the policy's constructor accepts.
 */
export function readCheckedDict(
  policy: string,
  d: unknown,
  keys: readonly string[],
  checkFields: (raw: Record<string, unknown>, check: PolicyCheck) => unknown,
): Record<string, unknown> {
  const check = new PolicyCheck(policy, "dict");
  const raw = readPolicyDict(check, d, keys);
  checkFields(raw, check);
  return raw;
}

/** Whether `flowType` is the batch flow type; throws {@link ConfigError} for a name that is no flow type. */
export function isBatchFlow(flowType: string): boolean {
  return checkFlowType(flowType) === FlowType.batch;
}
