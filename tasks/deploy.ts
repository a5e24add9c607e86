/**
 * `deno task deploy FLOW.ts [--namespace NS] [--image IMG] [-o yaml|json] [--run-id ID] [--single-run] …`:
 * prints the Kubernetes manifests of one run of the flow (`vf deploy`, see `src/cli/deploy.ts`), or with
 * `--apply --server URL` applies them and waits for the provision Job, or with `--teardown --run-id ID`
 * deletes what the run owns, and exits with its code: 0 done, 2 a flow or option the target refuses (every
 * unmet requirement named), 3 an environment that is not as required (the cluster refused, another run is
 * active, the provision Job did not finish in time), 4 a provision Job that failed.
 *
 * @module
 */

import { main } from "../src/cli/main.ts";

if (import.meta.main) await main(["deploy", ...Deno.args]);
