/**
 * The generated entry module of a node replica: a `data:` URL that statically imports the node's module,
 * the modules it loads when it opens, and the worker runtime, then serves. Static imports load before the
 * replica's sandbox applies, so a replica needs no read permission for code; the runtime's later dynamic
 * import of the node's module finds it loaded. One builder for the three launchers: a Deno Worker of the
 * local engine, a process replica of the local engine, and a Kubernetes pod's worker container.
 *
 * @module
 */

/** Who started a replica process, which decides how it is asked to stop. */
export const ProcessLauncher = {
  /** `vf run-local --isolation process`: quiesce is a line on stdin; SIGINT and SIGTERM are the engine's. */
  localEngine: "local-engine",
  /** A Kubernetes pod: SIGTERM quiesces, then ends the replica (RUN-030). */
  pod: "pod",
} as const;
/** One of {@link ProcessLauncher}. */
export type ProcessLauncher = typeof ProcessLauncher[keyof typeof ProcessLauncher];

/** What a replica's entry starts: a Deno Worker's runtime, or a process's, with its launcher. */
export type ReplicaRuntime =
  | { readonly kind: "worker"; readonly url: string }
  | { readonly kind: "process"; readonly url: string; readonly launcher: ProcessLauncher };

/**
 * The entry module of a replica as a `data:` URL (plain JavaScript, so a compiled vf's module loader
 * needs no transpiler for it): `modules` imported for their effects, and `runtime`'s serve function
 * called. A process's entry imports its runtime first: modules are evaluated in import order, and the
 * runtime hides the replica's settings from the environment as it is evaluated, before any node code.
 */
export function replicaEntryUrl(runtime: ReplicaRuntime, modules: readonly string[]): string {
  const imports = [...new Set(modules)].map((url) => `import ${JSON.stringify(url)};\n`).join("");
  const source = runtime.kind === "worker"
    ? `${imports}import { serveNodeWorker } from ${JSON.stringify(runtime.url)};\nserveNodeWorker();\n`
    : `import { serveNodeProcess } from ${JSON.stringify(runtime.url)};\n${imports}await serveNodeProcess(${
      JSON.stringify(runtime.launcher)
    });\n`;
  return `data:application/javascript;base64,${btoa(unescape(encodeURIComponent(source)))}`;
}
