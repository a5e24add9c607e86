/**
 * The V8 heap flags of every videoflow process: one list for `vf`, its process replicas and the worker
 * containers of a Kubernetes deployment.
 *
 * @module
 */

/**
 * The V8 flags every videoflow process is meant to run under, `vf` (and the Worker replicas inside it) and
 * each process replica: a young generation of at most 8 MiB a semi-space, and an old generation collected
 * once it grows to 1.5 times what was live after the last full collection. V8's defaults (32 MiB
 * semi-spaces, and growth of up to 4 times) let each isolate of a flow passing many small items fill
 * itself with garbage: two to three times the memory, for a tenth to a fifth less CPU time (README,
 * "Memory"). These bound no heap, so a node that holds much still may. A
 * process replica is started with them (`subprocessV8Args`), and so is a pod's worker container; `vf` cannot set its own, so
 * `deno task vf` and the README's commands name them (`tests/unit/engines/deno_config_test.ts` keeps
 * those in step with this list).
 */
export const V8_HEAP_FLAGS: readonly string[] = ["--max-semi-space-size=8", "--heap-growing-percent=50"];
