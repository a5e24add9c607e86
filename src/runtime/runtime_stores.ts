/**
 * Runtime-store selection by URL scheme (spec runtime.runtime_stores; RFC 0006 ENV-10,
 * `VF_RUNTIME_STORE_URL`).
 *
 * Built in: `memory://` (this process only, never durable: tests and the default), `file://<dir>` (one
 * host, durable across restarts: the local engine's ledger) and `redis://` / `rediss://` (across hosts;
 * durable only when the server's persistence is read back on: redis_store.ts). Other schemes are added
 * with {@link registerRuntimeStore}; until then they are refused with the list of the schemes that are
 * known. What a store guarantees is its own `capabilities()`;
 * nothing here promises more.
 *
 * @example
 * ```ts
 * const store = await openRuntimeStore(Deno.env.get("VF_RUNTIME_STORE_URL"));
 * console.log((await store.capabilities()).store); // "memory" when the variable is unset
 * ```
 *
 * @module
 */

import { redactedUrl } from "../core/checks.ts";
import { ConfigError } from "../core/errors.ts";
import { MemoryRuntimeStore } from "../backends/memory/runtime_store.ts";
import type { RuntimeStore } from "../backends/runtime_store.ts";
import { FileRuntimeStore } from "./file_store.ts";
import { loadRedisModule } from "./redis_module.ts";

/** The store used when `VF_RUNTIME_STORE_URL` is unset: no durable state, nothing shared. */
export const DEFAULT_RUNTIME_STORE_URL = "memory://";

/** Builds a store from its full URL (the scheme already matched). */
export type RuntimeStoreFactory = (url: string) => RuntimeStore | Promise<RuntimeStore>;

const SCHEME = /^([a-z][a-z0-9+.-]*):\/\//i;

/** `redis://` and `rediss://`: the Redis ledger, its client library loaded only when one is opened. */
async function openRedisRuntimeStore(url: string): Promise<RuntimeStore> {
  const { RedisRuntimeStore } = await loadRedisModule(() => import("./redis_store.ts"));
  return RedisRuntimeStore.open(url);
}

const factories = new Map<string, RuntimeStoreFactory>([
  ["memory", () => new MemoryRuntimeStore()],
  ["file", (url) => FileRuntimeStore.open(url.slice(url.indexOf("://") + 3))],
  ["redis", openRedisRuntimeStore],
  ["rediss", openRedisRuntimeStore],
]);

/** The registered schemes, sorted. */
export function knownRuntimeStoreSchemes(): string[] {
  return [...factories.keys()].sort();
}

/**
 * Registers (or replaces) the factory for `scheme` (case-insensitive, without `://`); the factory receives
 * the full URL. Throws ConfigError for a string that is not a URL scheme.
 */
export function registerRuntimeStore(scheme: string, factory: RuntimeStoreFactory): void {
  if (!/^[a-z][a-z0-9+.-]*$/i.test(scheme)) {
    throw new ConfigError(
      `${JSON.stringify(scheme)} is not a URL scheme`,
      'register the bare scheme, e.g. registerRuntimeStore("redis", factory)',
      { scheme },
    );
  }
  factories.set(scheme.toLowerCase(), factory);
}

/**
 * Opens the runtime store `url` names. `null`, `undefined` or `""` mean {@link DEFAULT_RUNTIME_STORE_URL}.
 * `file://<dir>` takes everything after `file://` as the directory, literally (a relative one is relative
 * to the working directory). Throws ConfigError for a URL without a scheme or with an unknown one, naming
 * the known schemes.
 */
export async function openRuntimeStore(url?: string | null): Promise<RuntimeStore> {
  const effective = url ? url : DEFAULT_RUNTIME_STORE_URL;
  const scheme = SCHEME.exec(effective)?.[1].toLowerCase();
  const factory = scheme === undefined ? undefined : factories.get(scheme);
  if (factory === undefined) {
    const known = knownRuntimeStoreSchemes().map((s) => `${s}://`).join(", ");
    const what = scheme === undefined ? "has no scheme" : `has the unknown scheme ${scheme}://`;
    throw new ConfigError(
      `the runtime store URL ${JSON.stringify(redactedUrl(effective))} ${what}; known schemes are ${known}`,
      `set VF_RUNTIME_STORE_URL to one of ${known}, or register the scheme with registerRuntimeStore`,
      { url: redactedUrl(effective), known_schemes: knownRuntimeStoreSchemes() },
    );
  }
  return await factory(effective);
}
