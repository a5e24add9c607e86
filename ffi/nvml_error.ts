/**
 * NVML's return codes and the one mapping of a failed call into a typed error: {@link NvmlError} names
 * the symbol, the code, the code's `NVML_ERROR_*` name (or that it is not one NVML defines) and what
 * `nvmlErrorString` says about it; {@link nvmlUnknown} turns it into the {@link Unknown} a field reads.
 *
 * @module
 */

import { VideoflowEnvironmentError } from "../src/core/errors.ts";
import { type Clock, systemClock } from "../src/backends/clock.ts";
import { type Unknown, unknown, type UnknownReason } from "../src/backends/outcomes.ts";
import type { DeclaredSymbols } from "./symbols.ts";
import type { NVML_SYMBOLS } from "./nvml_symbols.ts";

/** `NVML_SUCCESS`. */
export const NVML_SUCCESS = 0;

/** `nvmlReturn_t` values by name, as nvml.h defines them. */
export const NVML_RETURN = {
  NVML_ERROR_UNINITIALIZED: 1,
  NVML_ERROR_INVALID_ARGUMENT: 2,
  NVML_ERROR_NOT_SUPPORTED: 3,
  NVML_ERROR_NO_PERMISSION: 4,
  NVML_ERROR_ALREADY_INITIALIZED: 5,
  NVML_ERROR_NOT_FOUND: 6,
  NVML_ERROR_INSUFFICIENT_SIZE: 7,
  NVML_ERROR_INSUFFICIENT_POWER: 8,
  NVML_ERROR_DRIVER_NOT_LOADED: 9,
  NVML_ERROR_TIMEOUT: 10,
  NVML_ERROR_IRQ_ISSUE: 11,
  NVML_ERROR_LIBRARY_NOT_FOUND: 12,
  NVML_ERROR_FUNCTION_NOT_FOUND: 13,
  NVML_ERROR_CORRUPTED_INFOROM: 14,
  NVML_ERROR_GPU_IS_LOST: 15,
  NVML_ERROR_RESET_REQUIRED: 16,
  NVML_ERROR_OPERATING_SYSTEM: 17,
  NVML_ERROR_LIB_RM_VERSION_MISMATCH: 18,
  NVML_ERROR_IN_USE: 19,
  NVML_ERROR_MEMORY: 20,
  NVML_ERROR_NO_DATA: 21,
  NVML_ERROR_VGPU_ECC_NOT_SUPPORTED: 22,
  NVML_ERROR_INSUFFICIENT_RESOURCES: 23,
  NVML_ERROR_FREQ_NOT_SUPPORTED: 24,
  NVML_ERROR_ARGUMENT_VERSION_MISMATCH: 25,
  NVML_ERROR_DEPRECATED: 26,
  NVML_ERROR_NOT_READY: 27,
  NVML_ERROR_GPU_NOT_FOUND: 28,
  NVML_ERROR_INVALID_STATE: 29,
  NVML_ERROR_RESET_TYPE_NOT_SUPPORTED: 30,
  NVML_ERROR_UNKNOWN: 999,
} as const;

const NAMES: ReadonlyMap<number, string> = new Map(Object.entries(NVML_RETURN).map(([k, v]) => [v, k]));

/** The `NVML_ERROR_*` name of `code`, or null for a code nvml.h does not define. */
export function nvmlReturnName(code: number): string | null {
  return NAMES.get(code) ?? null;
}

/** The Unknown reason each return code reads as; any other defined code is `api`, an undefined one `malformed`. */
const REASONS: Readonly<Record<number, UnknownReason>> = {
  [NVML_RETURN.NVML_ERROR_NOT_SUPPORTED]: "unsupported",
  [NVML_RETURN.NVML_ERROR_FUNCTION_NOT_FOUND]: "unsupported",
  [NVML_RETURN.NVML_ERROR_NO_PERMISSION]: "auth",
  [NVML_RETURN.NVML_ERROR_TIMEOUT]: "timeout",
  [NVML_RETURN.NVML_ERROR_DRIVER_NOT_LOADED]: "unreachable",
  [NVML_RETURN.NVML_ERROR_LIBRARY_NOT_FOUND]: "unreachable",
  [NVML_RETURN.NVML_ERROR_GPU_IS_LOST]: "unreachable",
  [NVML_RETURN.NVML_ERROR_NOT_FOUND]: "missing",
  [NVML_RETURN.NVML_ERROR_GPU_NOT_FOUND]: "missing",
};

/** An NVML call returned something other than `NVML_SUCCESS` (exit 3: the host is not as required). */
export class NvmlError extends VideoflowEnvironmentError {
  /** Stable code of this class, `VF_NVML`. */
  static override readonly code: string = "VF_NVML";
  /** The symbol that was called. */
  readonly symbol: string;
  /** The code it returned. */
  readonly returnCode: number;
  /** The code's `NVML_ERROR_*` name; null when NVML defines no such code. */
  readonly returnName: string | null;

  /** The failure of `symbol` with `returnCode`, described by `description` (nvmlErrorString's text). */
  constructor(symbol: string, returnCode: number, description: string) {
    const name = nvmlReturnName(returnCode);
    super(
      `${symbol} returned ${name ?? "a code NVML does not define"} (${returnCode}): ${description}`,
      name === null
        ? "the driver answered with a return code this binding does not know: update videoflow or the driver"
        : "see the NVML documentation of this return code; `nvidia-smi -q` shows the driver's own view",
      { symbol, return_code: returnCode },
    );
    this.symbol = symbol;
    this.returnCode = returnCode;
    this.returnName = name;
  }

  /** The Unknown reason this failure reads as. */
  get reason(): UnknownReason {
    if (this.returnName === null) return "malformed";
    return REASONS[this.returnCode] ?? "api";
  }
}

/**
 * The typed error for `symbol` returning `code`, described through `nvmlErrorString` (or, where the
 * library lacks it, saying so).
 */
export function nvmlError(
  symbols: Pick<DeclaredSymbols<typeof NVML_SYMBOLS>, "nvmlErrorString">,
  symbol: string,
  code: number,
): NvmlError {
  const errorString = symbols.nvmlErrorString;
  let description = "nvmlErrorString is not exported by this library";
  if (errorString.kind === "known") {
    const text: unknown = errorString.value(code);
    description = typeof text === "string" ? text : "nvmlErrorString returned no text";
  }
  return new NvmlError(symbol, code, description);
}

/** The {@link Unknown} a field reads when its call failed with `error`, stamped by `clock`. */
export function nvmlUnknown(error: NvmlError, clock: Clock = systemClock): Unknown {
  return unknown(error.reason, clock, error.message);
}
