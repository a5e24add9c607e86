/**
 * The required `VF_*` variables of a processor replica, for tests that parse or start a worker.
 *
 * @module
 */

/** A processor `detect` of `cam` (its class at `nodeClass`) in flow `traffic`, run `r-1`, plus `extra`. */
export function processorEnv(nodeClass: string, extra: Record<string, string>): Record<string, string> {
  return {
    VF_NODE_CLASS: nodeClass,
    VF_NODE_PARAMS_JSON: '{"name":"detect"}',
    VF_NODE_KIND: "processor",
    VF_NODE_NAME: "detect",
    VF_PARENT_NAMES: "cam",
    VF_HAS_CHILDREN: "1",
    VF_FLOW_ID: "traffic",
    VF_FLOW_TYPE: "realtime",
    VF_RUN_ID: "r-1",
    ...extra,
  };
}
