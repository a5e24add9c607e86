/**
 * `deno task deploy FLOW.ts [--namespace NS] [--image IMG] [-o yaml|json] [--run-id ID] [--single-run] …`:
 * prints the Kubernetes manifests of one run of the flow (`vf deploy`, see `src/cli/deploy.ts`) and exits
 * with its code: 0 printed, 2 a flow or option the target refuses (every unmet requirement named), 3 an
 * environment that is not as required.
 *
 * @module
 */

import { main } from "../src/cli/main.ts";

if (import.meta.main) await main(["deploy", ...Deno.args]);
