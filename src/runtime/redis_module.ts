/**
 * Loads a module that brings in the Redis client (ioredis) inside a replica's sandbox. ioredis's `debug`
 * dependency enumerates `process.env` as it is evaluated, which needs read access to every variable, and a
 * replica may read only the variables its node declared (a Worker's permissions are fixed as it starts):
 * without env access, that module is evaluated with `process.env` shadowed by an empty object, so no
 * debug output is configured and nothing else changes. With env access it is loaded as it is.
 *
 * @module
 */

import process from "node:process";

/** Resolves with `load()`'s module, loaded where the sandbox allows it (see the module comment). */
export async function loadRedisModule<T>(load: () => Promise<T>): Promise<T> {
  if (Deno.permissions.querySync({ name: "env" }).state === "granted") return await load();
  const env = Object.getOwnPropertyDescriptor(process, "env");
  Object.defineProperty(process, "env", { value: {}, configurable: true, writable: true });
  try {
    return await load();
  } finally {
    if (env !== undefined) Object.defineProperty(process, "env", env);
  }
}
