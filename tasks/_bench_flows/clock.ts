/**
 * The one clock every benchmark thread reads: wall time in milliseconds with sub-millisecond resolution
 * (`performance.timeOrigin + performance.now()`). Each Deno Worker has its own `timeOrigin`, and the sum
 * lines up across the workers of one process, so a time stamped in one thread can be subtracted in another.
 *
 * @module
 */

/** Milliseconds since the epoch, comparable between the threads of one process. */
export function nowMs(): number {
  return performance.timeOrigin + performance.now();
}

/**
 * CPU time this whole process (every thread, so every Worker of it) has used, user and system, in
 * milliseconds. Reading it needs no permission.
 */
export function processCpuMs(): number {
  const { user, system } = process.cpuUsage();
  return (user + system) / 1000;
}
