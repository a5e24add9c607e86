/**
 * The NVML session: the library loaded, its symbols declared and `nvmlInit_v2` called once, held for the
 * process ({@link sharedNvml}) and ended with `nvmlShutdown` when the process unloads (or at
 * {@link closeNvml}). A library that is missing, lacks `nvmlInit_v2`, or whose init fails is an
 * {@link Unknown} with the reason: never a session that reads zero GPUs.
 *
 * @module
 */

import { known, type Observation, type Unknown, unknown } from "../src/backends/outcomes.ts";
import { NVML_SUCCESS, type NvmlError, nvmlError, nvmlUnknown } from "../ffi/nvml_error.ts";
import { NVML_LIBRARY_SEARCH, NVML_SYMBOLS, type NvmlSymbol } from "../ffi/nvml_symbols.ts";
import { type LibrarySearch, openSharedLibrary } from "../ffi/shared_library.ts";
import { type DeclaredSymbols, declareSymbols } from "../ffi/symbols.ts";

/** An initialized NVML: call its symbols until {@link NvmlSession.close}. */
export interface NvmlSession {
  /** The library the session runs on (the name or path it was loaded by). */
  readonly library: string;
  /** Every symbol of the table, declared or Unknown (the library lacks it). */
  readonly symbols: DeclaredSymbols<typeof NVML_SYMBOLS>;
  /**
   * Calls `symbol` with `args` and returns its return code, or the Unknown that stands for the call when
   * the library lacks the symbol or the session is closed.
   */
  call(symbol: NvmlSymbol, ...args: unknown[]): number | Unknown;
  /** The typed error for `symbol` having returned `code` (described through `nvmlErrorString`). */
  errorFor(symbol: NvmlSymbol, code: number): NvmlError;
  /** Ends the session with `nvmlShutdown`; later calls are Unknown. Idempotent. */
  close(): void;
}

/**
 * Loads NVML from `search` (by default `VF_NVML_LIBRARY`, then the driver's usual names and paths),
 * declares its symbols and initializes it; Unknown with the reason when any of that fails. Each
 * session holds one `nvmlInit_v2` until it is closed.
 */
export function openNvml(search: LibrarySearch = NVML_LIBRARY_SEARCH): Observation<NvmlSession> {
  const library = openSharedLibrary(search);
  if (library.kind === "unknown") {
    return unknown(library.reason, undefined, `NVML could not be loaded: ${library.detail}`);
  }
  const symbols = declareSymbols(library.value, NVML_SYMBOLS);
  const init = symbols.nvmlInit_v2;
  if (init.kind === "unknown") return init;
  const code = Number(init.value());
  if (code !== NVML_SUCCESS) {
    const failure = nvmlUnknown(nvmlError(symbols, "nvmlInit_v2", code));
    return unknown(
      failure.reason,
      undefined,
      `NVML at ${library.value.path} did not start: ${failure.detail}`,
    );
  }
  let open = true;
  const session: NvmlSession = {
    library: library.value.path,
    symbols,
    call(symbol, ...args) {
      if (!open) return unknown("unread", undefined, `${symbol} was called after the NVML session closed`);
      const declared = symbols[symbol];
      if (declared.kind === "unknown") return declared;
      return Number(declared.value(...args));
    },
    errorFor: (symbol, code) => nvmlError(symbols, symbol, code),
    close() {
      if (!open) return;
      open = false;
      const shutdown = symbols.nvmlShutdown;
      if (shutdown.kind === "known") shutdown.value();
    },
  };
  return known(Object.freeze(session));
}

let shared: NvmlSession | null = null;
let unloadHooked = false;

/**
 * The process's NVML session, opened on first use and kept until the process unloads; a failed open is
 * returned as its Unknown and tried again on the next call (a driver may come up later).
 */
export function sharedNvml(): Observation<NvmlSession> {
  if (shared !== null) return known(shared);
  const opened = openNvml();
  if (opened.kind === "unknown") return opened;
  shared = opened.value;
  if (!unloadHooked) {
    unloadHooked = true;
    globalThis.addEventListener("unload", closeNvml);
  }
  return opened;
}

/** Ends the process's NVML session (`nvmlShutdown`); the next {@link sharedNvml} opens a new one. */
export function closeNvml(): void {
  shared?.close();
  shared = null;
}
