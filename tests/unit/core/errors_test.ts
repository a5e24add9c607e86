import assert from "node:assert/strict";
import * as errors from "../../../src/core/errors.ts";
import {
  asRuntimeError,
  classify,
  ConfigError,
  DecodeError,
  Diagnostic,
  DISK_ERROR_KEY,
  diskFailure,
  errorToDict,
  GraphError,
  isDiskFailure,
  POISON,
  raiseForDiagnostics,
  registerClassifierFor,
  registeredErrorClassifiers,
  registerErrorClassifier,
  TRANSIENT,
  unregisterErrorClassifier,
  VideoflowError,
  VideoflowRuntimeError,
  WORKER_FATAL,
} from "../../../src/core/errors.ts";

/** The spec's table: class -> [code, exit code, base class, disposition or null]. */
const TAXONOMY: Record<string, [string, number, string, string | null]> = {
  VideoflowError: ["VF_UNKNOWN", 1, "Error", null],
  VideoflowUserError: ["VF_USER", 2, "VideoflowError", null],
  VideoflowEnvironmentError: ["VF_ENVIRONMENT", 3, "VideoflowError", null],
  VideoflowRuntimeError: ["VF_RUNTIME", 4, "VideoflowError", "transient"],
  ConfigError: ["VF_CONFIG", 2, "VideoflowUserError", null],
  GraphError: ["VF_GRAPH", 2, "VideoflowUserError", null],
  NodeContractError: ["VF_NODE_CONTRACT", 2, "VideoflowUserError", null],
  CapabilityError: ["VF_CAPABILITY", 2, "VideoflowUserError", null],
  GpuRequirementConflict: ["VF_CAPABILITY", 2, "CapabilityError", null],
  IdentityCollision: ["VF_IDENTITY_COLLISION", 2, "VideoflowUserError", null],
  IncompatibleProfile: ["VF_INCOMPATIBLE_PROFILE", 2, "VideoflowUserError", null],
  ActiveRunConflict: ["VF_ACTIVE_RUN", 3, "VideoflowEnvironmentError", null],
  BrokerUnavailable: ["VF_BROKER_UNAVAILABLE", 3, "VideoflowEnvironmentError", null],
  ClusterError: ["VF_CLUSTER", 3, "VideoflowEnvironmentError", null],
  FlowFailed: ["VF_FLOW_FAILED", 4, "VideoflowEnvironmentError", null],
  FlowStalled: ["VF_FLOW_STALLED", 5, "VideoflowEnvironmentError", null],
  OwnershipConflict: ["VF_OWNERSHIP_CONFLICT", 3, "VideoflowEnvironmentError", null],
  ResourceUnavailable: ["VF_RESOURCE_UNAVAILABLE", 3, "VideoflowEnvironmentError", null],
  UnobservableState: ["VF_STATE_UNKNOWN", 3, "VideoflowEnvironmentError", null],
  PoisonMessage: ["VF_POISON", 4, "VideoflowRuntimeError", "poison"],
  DecodeError: ["VF_POISON_DECODE", 4, "PoisonMessage", "poison"],
  SchemaError: ["VF_POISON_SCHEMA", 4, "PoisonMessage", "poison"],
  PartitionKeyError: ["VF_POISON_PARTITION_KEY", 4, "PoisonMessage", "poison"],
  ReplicaCrashed: ["VF_POISON_REPLICA_CRASHED", 4, "PoisonMessage", "poison"],
  ReplicaStalled: ["VF_POISON_REPLICA_STALLED", 4, "PoisonMessage", "poison"],
  TransientFailure: ["VF_TRANSIENT", 4, "VideoflowRuntimeError", "transient"],
  UpstreamUnavailable: ["VF_UPSTREAM_UNAVAILABLE", 4, "TransientFailure", "transient"],
  WorkerFatal: ["VF_WORKER_FATAL", 4, "VideoflowRuntimeError", "worker_fatal"],
  DeviceError: ["VF_DEVICE", 4, "WorkerFatal", "worker_fatal"],
  ResourceExhausted: ["VF_RESOURCE_EXHAUSTED", 4, "WorkerFatal", "worker_fatal"],
  WorkerUnhealthy: ["VF_WORKER_UNHEALTHY", 4, "WorkerFatal", "worker_fatal"],
  ProgressStalled: ["VF_PROGRESS_STALLED", 5, "VideoflowRuntimeError", "worker_fatal"],
  StaleAuthority: ["VF_STALE_AUTHORITY", 4, "VideoflowRuntimeError", "worker_fatal"],
  UpstreamAborted: ["VF_UPSTREAM_ABORTED", 4, "VideoflowRuntimeError", "worker_fatal"],
};

type AnyErrorClass = new (
  message: string,
  remedy?: string | null,
  context?: Record<string, unknown>,
) => VideoflowError;

Deno.test("every error class of the spec has its code, exit code, base class and disposition", () => {
  const exported = errors as unknown as Record<string, unknown>;
  for (const [name, [code, exitCode, base, disposition]] of Object.entries(TAXONOMY)) {
    const cls = exported[name] as AnyErrorClass;
    assert.equal(typeof cls, "function", `${name} is exported`);
    const error = cls === GraphError || cls === errors.IncompatibleProfile
      ? new (cls as typeof GraphError)("boom", "do this", [], { node: "n" })
      : new cls("boom", "do this", { node: "n" });
    assert.deepEqual(error.context, { node: "n" });
    assert.equal(error.name, name);
    assert.equal(error.code, code, name);
    assert.equal(error.exitCode, exitCode, name);
    assert.equal(Object.getPrototypeOf(cls).name, base, name);
    assert.equal(error.disposition, disposition, name);
    assert.ok(error instanceof Error && error instanceof VideoflowError);
  }
});

Deno.test("every exported VideoflowError subclass appears in the spec table", () => {
  const classes = Object.entries(errors).filter(([, v]) =>
    typeof v === "function" && (v === VideoflowError || v.prototype instanceof VideoflowError)
  );
  assert.deepEqual(classes.map(([k]) => k).sort(), Object.keys(TAXONOMY).sort());
});

Deno.test("render() names the code, message, remedy and sorted context, never a stack trace", () => {
  const error = new ConfigError("flow_type must be realtime or batch", "pass flowType: 'batch'", {
    node: "cam",
    value: { a: 1 },
  });
  const text = error.render();
  assert.equal(
    text,
    "VF_CONFIG: flow_type must be realtime or batch\n  remedy: pass flowType: 'batch'\n" +
      '  context: node=cam value={"a":1}',
  );
  assert.ok(!text.includes("at "));
  assert.equal(new ConfigError("x").render(), "VF_CONFIG: x");
});

Deno.test("toDict and toJSON give the JSON-safe record", () => {
  const error = new DecodeError("bad bytes", "drop it", { seq: 12n, ratio: NaN, when: undefined });
  const record = error.toDict();
  assert.deepEqual(record, {
    code: "VF_POISON_DECODE",
    type: "DecodeError",
    message: "bad bytes",
    remedy: "drop it",
    exit_code: 4,
    disposition: "poison",
    context: { seq: "12", ratio: "NaN", when: null },
  });
  assert.deepEqual(JSON.parse(JSON.stringify(error)), record);
});

Deno.test("classify uses our disposition, then the latest matching classifier, then the fallback", () => {
  class LibError extends Error {}
  class LibOom extends LibError {}
  assert.equal(classify(new Error("x")), TRANSIENT);
  assert.equal(classify(new Error("x"), POISON), POISON);
  registerErrorClassifier(LibError, POISON);
  registerErrorClassifier(LibOom, WORKER_FATAL);
  try {
    assert.equal(classify(new LibError("x")), POISON);
    assert.equal(classify(new LibOom("x")), WORKER_FATAL);
    assert.equal(classify(new DecodeError("x")), POISON);
    const pairs = registeredErrorClassifiers().slice(-2);
    assert.deepEqual(pairs, [[LibError, POISON], [LibOom, WORKER_FATAL]]);
  } finally {
    assert.ok(unregisterErrorClassifier(LibOom));
    assert.ok(unregisterErrorClassifier(LibError));
  }
  assert.equal(classify(new LibOom("x")), TRANSIENT);
  assert.throws(() => registerErrorClassifier(LibError, "retry-forever"), ConfigError);
  assert.throws(() => classify(new Error("x"), "nonsense"), ConfigError);
});

Deno.test("registerClassifierFor reports whether the type resolved", () => {
  class Optional extends Error {}
  assert.equal(registerClassifierFor("missing.Type", POISON, () => null), false);
  assert.equal(
    registerClassifierFor("throws.Type", POISON, () => {
      throw new Error("not installed");
    }),
    false,
  );
  assert.equal(registerClassifierFor("Optional", WORKER_FATAL, () => Optional), true);
  try {
    assert.equal(classify(new Optional()), WORKER_FATAL);
  } finally {
    unregisterErrorClassifier(Optional);
  }
});

Deno.test("asRuntimeError enriches ours in place and wraps anything else with its classification", () => {
  const ours = new DecodeError("bad", null, { node: "a" });
  const same = asRuntimeError(ours, TRANSIENT, { node: "b", trace_id: "t:1" });
  assert.equal(same, ours);
  assert.deepEqual(same.context, { node: "a", trace_id: "t:1" });
  assert.equal(same.code, "VF_POISON_DECODE");

  const raw = new TypeError("undefined is not a function");
  const wrapped = asRuntimeError(raw, WORKER_FATAL, { node: "n" });
  assert.ok(wrapped instanceof VideoflowRuntimeError);
  assert.equal(wrapped.disposition, WORKER_FATAL);
  assert.equal(wrapped.message, "undefined is not a function");
  assert.deepEqual(wrapped.context, { node: "n", error_type: "TypeError" });
  assert.equal((wrapped as { cause?: unknown }).cause, raw);
  assert.equal(asRuntimeError("plain string").message, "plain string");
  assert.equal(asRuntimeError({ code: "E42", message: "disk" }).message, '{"code":"E42","message":"disk"}');
  const cyclic: Record<string, unknown> = {};
  cyclic.self = cyclic;
  assert.equal(
    asRuntimeError(cyclic).message,
    "[object Object]",
    "what JSON cannot hold says what String says",
  );
});

Deno.test("errorToDict keeps ours, derives a code for a bare error, and relays records unchanged", () => {
  assert.equal(errorToDict(new ConfigError("x")).code, "VF_CONFIG");
  const bare = errorToDict(new RangeError("out of range"));
  assert.equal(bare.code, "VF_EXC_RANGE_ERROR");
  assert.equal(bare.message, "out of range");
  assert.equal(bare.disposition, TRANSIENT);
  const relayed = { code: "VF_DEVICE", message: "gpu fell off", node: "detector", context: { a: 1 } };
  assert.equal(errorToDict(relayed), relayed);
});

Deno.test("raiseForDiagnostics raises one GraphError with every error and ignores warnings", () => {
  const warning = new Diagnostic("warning", "VF_GRAPH", "a", "odd");
  raiseForDiagnostics([warning]);
  const first = new Diagnostic("error", "VF_GRAPH", "a", "cycle", "remove an edge");
  const second = new Diagnostic("error", "VF_CONFIG", null, "bad flow type");
  try {
    raiseForDiagnostics([first, warning, second]);
    assert.fail("expected a GraphError");
  } catch (error) {
    assert.ok(error instanceof GraphError);
    assert.deepEqual(error.diagnostics, [first, second]);
    assert.equal(error.exitCode, 2);
    const text = error.render();
    assert.match(text, /^VF_GRAPH: the flow is invalid: 2 problems/);
    assert.ok(text.includes("error VF_GRAPH a: cycle (remedy: remove an edge)"));
    assert.ok(text.includes("error VF_CONFIG -: bad flow type"));
    assert.equal(error.toDict().diagnostics?.length, 2);
  }
});

Deno.test("asRuntimeError keeps a user or environment error's code, exit status and remedy, with a disposition", () => {
  const config = asRuntimeError(
    new ConfigError("path must be set", "pass path", { key: "path" }),
    TRANSIENT,
    {
      node: "sink",
    },
  );
  assert.ok(config instanceof VideoflowRuntimeError);
  assert.equal(config.code, "VF_CONFIG");
  assert.equal(config.exitCode, 2);
  assert.equal(config.name, "ConfigError");
  assert.equal(config.remedy, "pass path");
  assert.equal(config.disposition, WORKER_FATAL, "a misconfigured node fails every message alike");
  assert.deepEqual(config.context, { node: "sink", key: "path" });
  assert.equal(config.toDict().code, "VF_CONFIG");
  const environment = asRuntimeError(new errors.ResourceUnavailable("no clip"), POISON);
  assert.equal(environment.code, "VF_RESOURCE_UNAVAILABLE");
  assert.equal(environment.exitCode, 3);
  assert.equal(environment.disposition, POISON, "the caller's fallback for the environment");
});

/** An error as Deno's fs throws one for an OS error it has no class for: a plain Error with a `code`. */
function osError(code: string, message: string): Error {
  return Object.assign(new Error(message), { code });
}

Deno.test("diskFailure maps a read-only, full, over-quota or failing disk to ResourceUnavailable naming the path and the remedy; nothing else", () => {
  const cases = [
    ["EROFS", "is read-only", /writable again/],
    ["ENOSPC", "is full", /free space/],
    ["EDQUOT", "is over its quota", /quota/],
    ["EIO", "failed with an I/O error", /check the disk/],
  ] as const;
  for (const [code, says, remedy] of cases) {
    const failure = diskFailure(
      osError(code, `os says ${code}`),
      "the ledger at /s/l",
      "/s/l",
      "then re-run",
    );
    assert.ok(failure instanceof errors.ResourceUnavailable, code);
    assert.equal(failure.exitCode, 3);
    assert.equal(failure.message, `cannot write the ledger at /s/l: its filesystem ${says} (${code})`);
    assert.match(failure.remedy ?? "", remedy);
    assert.match(failure.remedy ?? "", /; then re-run$/);
    assert.deepEqual(failure.context, { path: "/s/l", [DISK_ERROR_KEY]: code, os_error: `os says ${code}` });
    assert.ok(isDiskFailure(failure) && isDiskFailure(failure.toDict()), "the error and its record");
  }
  assert.equal(diskFailure(osError("EACCES", "denied"), "x", "/x"), null);
  assert.equal(diskFailure(new Deno.errors.NotFound("gone"), "x", "/x"), null);
  assert.equal(
    diskFailure(new errors.ResourceUnavailable("ours"), "x", "/x"),
    null,
    "ours is not mapped again",
  );
  assert.ok(!isDiskFailure(new errors.ResourceUnavailable("no clip", null, { path: "/c" })));
});

Deno.test("asRuntimeError makes a full disk a node hit the worker-fatal ResourceUnavailable (exit 3): the input is not to blame", () => {
  const raw = asRuntimeError(osError("ENOSPC", "No space left on device (os error 28)"), POISON, {
    node: "sink",
  });
  assert.equal(raw.code, "VF_RESOURCE_UNAVAILABLE");
  assert.equal(raw.exitCode, 3);
  assert.equal(raw.disposition, WORKER_FATAL);
  assert.equal(raw.context.node, "sink");
  assert.equal(raw.context[DISK_ERROR_KEY], "ENOSPC");
  const named = diskFailure(osError("EROFS", "read-only"), "node sink's output /o", "/o");
  assert.equal(asRuntimeError(named, TRANSIENT).disposition, WORKER_FATAL);
});
