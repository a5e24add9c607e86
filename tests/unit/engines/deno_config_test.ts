import assert from "node:assert/strict";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import {
  discoveredConfig,
  launchFlags,
  namesModule,
  resolutionFlags,
  subprocessResolutionArgs,
  subprocessV8Args,
  V8_HEAP_FLAGS,
  withoutComments,
  workerOptionsEnabled,
} from "../../../src/engines/deno_config.ts";

async function inTempDir(body: (dir: string) => Promise<void>): Promise<void> {
  const dir = await Deno.realPath(await Deno.makeTempDir({ prefix: "vf-deno-config-" }));
  try {
    await body(dir);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("launchFlags: the flags before the main module, named by a relative path or its URL", () => {
  const main = Deno.mainModule;
  const asArg = main.startsWith("file:") ? new URL(main).pathname : main;
  const cmdline = ["deno", "run", "-A", "--config", "x.json", asArg, "run-local", "--config", "y"].join("\0");
  assert.deepEqual(launchFlags(cmdline), ["run", "-A", "--config", "x.json"]);
  assert.deepEqual(launchFlags(["deno", "run", main, "a"].join("\0") + "\0"), ["run"]);
  assert.equal(
    launchFlags(["deno", "test", "tests/"].join("\0")),
    null,
    "no main module among the arguments",
  );
  assert.equal(launchFlags(null), null);
});

Deno.test("resolutionFlags: keeps what changes module resolution, with paths made absolute", () => {
  const cwd = Deno.cwd();
  assert.deepEqual(
    resolutionFlags([
      "run",
      "-A",
      "-c",
      "proj/deno.json",
      "--import-map=/abs/map.json",
      "--allow-read=/x",
      "--node-modules-dir=auto",
      "--cached-only",
      "--unstable-worker-options",
    ]),
    [
      `--config=${join(cwd, "proj/deno.json")}`,
      "--import-map=/abs/map.json",
      "--node-modules-dir=auto",
      "--cached-only",
    ],
  );
  assert.deepEqual(resolutionFlags(["--config=https://example.com/deno.json"]), [
    "--config=https://example.com/deno.json",
  ]);
  assert.deepEqual(resolutionFlags(["--no-config", "--config"]), ["--no-config"], "a flag missing its value");
});

Deno.test("discoveredConfig: the nearest deno.json or deno.jsonc above a local main module", async () => {
  await inTempDir(async (dir) => {
    await Deno.mkdir(join(dir, "a/b"), { recursive: true });
    const main = pathToFileURL(join(dir, "a/b/main.ts")).href;
    await Deno.writeTextFile(join(dir, "deno.jsonc"), "{}");
    assert.equal(discoveredConfig(main), join(dir, "deno.jsonc"));
    await Deno.writeTextFile(join(dir, "a/deno.json"), "{}");
    assert.equal(discoveredConfig(main), join(dir, "a/deno.json"));
  });
});

Deno.test("subprocessResolutionArgs: the given configuration, else the one Deno found, named", () => {
  assert.deepEqual(subprocessResolutionArgs(["run", "--config=/p/deno.json", "--lock=/p/deno.lock"]), [
    "--config=/p/deno.json",
    "--lock=/p/deno.lock",
  ]);
  assert.deepEqual(subprocessResolutionArgs(["run", "--no-config"]), ["--no-config"]);
  const found = discoveredConfig();
  assert.deepEqual(subprocessResolutionArgs(["run", "--cached-only"]), [
    found === null ? "--no-config" : `--config=${found}`,
    "--cached-only",
  ]);
});

Deno.test("subprocessV8Args: the project's heap flags, then DENO_V8_FLAGS, then vf's own --v8-flags", () => {
  const project = `--v8-flags=${V8_HEAP_FLAGS.join(",")}`;
  assert.deepEqual(subprocessV8Args(["run", "-A"], undefined), [project]);
  assert.deepEqual(subprocessV8Args(null, ""), [project], "an empty DENO_V8_FLAGS adds no empty flag");
  assert.deepEqual(
    subprocessV8Args(["run", "--v8-flags=--max-old-space-size=512", "-A"], "--max-semi-space-size=8"),
    [project, "--v8-flags=--max-semi-space-size=8", "--v8-flags=--max-old-space-size=512"],
    "in the order Deno applies them, so a flag the user gave wins over the project's",
  );
});

Deno.test("deno task vf and the README start vf under V8_HEAP_FLAGS, as a process replica starts", async () => {
  const flag = `--v8-flags=${V8_HEAP_FLAGS.join(",")}`;
  const root = new URL("../../../", import.meta.url);
  const config = JSON.parse(await Deno.readTextFile(new URL("deno.json", root))) as {
    tasks: Record<string, string>;
  };
  for (const [name, command] of Object.entries(config.tasks)) {
    if (!/^deno run .* mod\.ts( |$)/.test(command)) continue;
    assert.ok(command.includes(` ${flag} `), `deno task ${name} starts vf with ${flag}: ${command}`);
  }
  const readme = await Deno.readTextFile(new URL("README.md", root));
  for (const command of readme.match(/deno run [^`\n]*jsr:@videoflow\/cli/g) ?? []) {
    assert.ok(command.includes(` ${flag} `), `the README's ${command} starts vf with ${flag}`);
  }
});

Deno.test("workerOptionsEnabled: the flag, or the feature in the configuration file or one above it", async () => {
  assert.equal(workerOptionsEnabled(null), null, "unknown without the command line");
  assert.equal(workerOptionsEnabled(["run", "--unstable-worker-options", "--no-config"]), true);
  assert.equal(workerOptionsEnabled(["run", "--no-config"]), false);
  assert.equal(
    workerOptionsEnabled(["run", "--unstable", "--no-config"]),
    false,
    "Deno 2 removed --unstable",
  );
  await inTempDir(async (dir) => {
    const config = join(dir, "proj/deno.jsonc");
    await Deno.mkdir(join(dir, "proj"));
    await Deno.writeTextFile(config, '// a comment\n{ "imports": { "a": "./a.ts" } /* "unstable" */ }');
    assert.equal(workerOptionsEnabled(["run", `--config=${config}`]), false);
    await Deno.writeTextFile(join(dir, "deno.json"), '{ "unstable": ["kv", "worker-options"] }');
    assert.equal(workerOptionsEnabled(["run", `--config=${config}`]), true, "a workspace root's setting");
    await Deno.writeTextFile(join(dir, "deno.json"), '{ "unstable": ["kv"], }');
    assert.equal(workerOptionsEnabled(["run", `--config=${config}`]), null, "a file that is not JSON");
  });
});

Deno.test("withoutComments: comments go, strings that look like them stay", () => {
  const text = '{ "a": "http://x//y", // line\n "b": "/* no */" /* block */, "c": "q\\"//" }';
  assert.deepEqual(JSON.parse(withoutComments(text)), { a: "http://x//y", b: "/* no */", c: 'q"//' });
});

Deno.test("namesModule: a path, a URL, or a jsr: package as Deno runs it", () => {
  const jsr = "https://jsr.io/@videoflow/cli/0.1.0/mod.ts";
  assert.ok(namesModule("jsr:@videoflow/cli", jsr));
  assert.ok(namesModule("jsr:@videoflow/cli@0.1.0/mod.ts", jsr));
  assert.ok(!namesModule("jsr:@videoflow/other", jsr));
  assert.ok(namesModule(jsr, jsr));
  assert.ok(namesModule("/work/x/mod.ts", "file:///work/x/mod.ts"));
  assert.ok(!namesModule("--config", "file:///work/x/mod.ts"));
});
