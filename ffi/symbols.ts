/**
 * Declaring a library's symbols from a table of C signatures, one at a time, so that a symbol the
 * library lacks (an older driver) is an {@link Unknown} for the calls that need it, never a failed load
 * of the others.
 *
 * @module
 */

import type koffi from "koffi";
import { known, type Observation, unknown } from "../src/backends/outcomes.ts";
import type { SharedLibrary } from "./shared_library.ts";

/** A koffi type: a C type name koffi parses (`unsigned int`) or a declared type object. */
export type FfiType = Parameters<typeof koffi.sizeof>[0];

/** One symbol's C signature: its result type and its parameters' types in order. */
export interface SymbolSignature {
  /** The C result type. */
  readonly result: FfiType;
  /** The C parameter types, in order. */
  readonly parameters: readonly FfiType[];
}

/** A declared native function (koffi's calling wrapper). */
// deno-lint-ignore no-explicit-any
export type NativeFunction = (...args: any[]) => any;

/** Each symbol of a table, declared or Unknown with the reason it is not. */
export type DeclaredSymbols<Table> = { readonly [Name in keyof Table]: Observation<NativeFunction> };

/**
 * Declares every symbol of `table` on `library`: `known(function)` for each the library exports,
 * `unknown("unsupported", ...)` naming the symbol and the library for each it does not.
 */
export function declareSymbols<Table extends Readonly<Record<string, SymbolSignature>>>(
  library: SharedLibrary,
  table: Table,
): DeclaredSymbols<Table> {
  const declared: Record<string, Observation<NativeFunction>> = {};
  for (const [name, signature] of Object.entries(table)) {
    try {
      declared[name] = known(
        library.handle.func(name, signature.result, [...signature.parameters]) as NativeFunction,
      );
    } catch (error) {
      const why = error instanceof Error ? error.message : String(error);
      declared[name] = unknown(
        "unsupported",
        undefined,
        `${library.path} has no symbol ${name} (an older driver?): ${why}`,
      );
    }
  }
  return Object.freeze(declared) as DeclaredSymbols<Table>;
}
