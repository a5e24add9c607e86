/**
 * The worker image (`Dockerfile`), checked where no container engine runs: it copies paths that exist and
 * everything the worker and `vf` load, its Deno is the one CI pins, and its entrypoint, run from this
 * checkout as the image runs it from /app, serves replicas over real servers to the end of a flow.
 *
 * @module
 */

import assert from "node:assert/strict";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { compileFlow } from "../../src/core/compiler.ts";
import { Flow } from "../../src/core/flow.ts";
import { ModuleIndex } from "../../src/core/node_class.ts";
import { V8_HEAP_FLAGS } from "../../src/engines/deno_config.ts";
import * as storyNodes from "../fixtures/e2e/story_nodes.ts";
import { AppendingSink, Count } from "../fixtures/e2e/story_nodes.ts";
import { startNatsServer, startRedisServer } from "../support/services.ts";
import { provisionOnServers, startReplica } from "../support/replicas.ts";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));
const DOCKERFILE = Deno.readTextFileSync(join(ROOT, "Dockerfile"));

/** The image's directory for the project (its WORKDIR). */
const WORKDIR = /^WORKDIR (\S+)$/m.exec(DOCKERFILE)?.[1] ?? "";

/** The sources of every COPY, relative to the build context. */
function copiedSources(): string[] {
  return [...DOCKERFILE.matchAll(/^COPY (.+) \S+$/gm)].flatMap((m) => m[1].split(/\s+/));
}

/** The ENTRYPOINT's argv. */
function entrypoint(): string[] {
  const found = /^ENTRYPOINT (\[.*\])$/m.exec(DOCKERFILE);
  assert(found !== null, "the Dockerfile has an exec-form ENTRYPOINT");
  return JSON.parse(found[1]);
}

Deno.test("the worker image copies paths that exist, everything the worker and vf load, and runs the Deno CI pins", async () => {
  assert.equal(WORKDIR, "/app");
  const sources = copiedSources();
  for (const source of sources) {
    assert(await Deno.stat(join(ROOT, source)).then(() => true, () => false), `${source} exists`);
  }
  const pinned = /deno@(\d+\.\d+\.\d+)/.exec(await Deno.readTextFile(join(ROOT, ".ci/run")))?.[1];
  assert.equal(/^ARG DENO_VERSION=(\S+)$/m.exec(DOCKERFILE)?.[1], pinned);
  assert.match(DOCKERFILE, /^FROM denoland\/deno:debian-\$\{DENO_VERSION\}$/m);
  assert.equal(Deno.version.deno, pinned, "the tests run on the Deno the image has");
  assert(entrypoint().includes(`--v8-flags=${V8_HEAP_FLAGS.join(",")}`), "the project's V8 heap flags");
  // Every local module the worker entry and vf reach is under a copied path.
  const copied = (path: string) =>
    sources.some((source) => source.endsWith("/") ? path.startsWith(source) : path === source);
  for (const entry of [entrypoint().at(-1)!, "mod.ts"]) {
    const output = await new Deno.Command(Deno.execPath(), {
      args: ["info", "--json", entry],
      cwd: ROOT,
      stdout: "piped",
    }).output();
    const info = JSON.parse(new TextDecoder().decode(output.stdout)) as { modules: { specifier: string }[] };
    const local = info.modules.map((m) => m.specifier).filter((s) => s.startsWith(`file://${ROOT}`));
    assert(local.length > 10, entry);
    for (const module of local) {
      const path = fileURLToPath(module).slice(ROOT.length);
      assert(copied(path), `${path} (reached from ${entry}) is copied into the image`);
    }
  }
});

Deno.test("the image's entrypoint, run from this checkout as the image runs it from /app, serves every replica of a flow over real servers to its end", async () => {
  const nats = await startNatsServer();
  const redis = await startRedisServer();
  const dir = await Deno.makeTempDir();
  try {
    const out = `${dir}/out.txt`;
    const count = new Count({ name: "count", n: 20 });
    const flow = new Flow([new AppendingSink({ name: "sink", path: out }).from(count)], {
      flowType: "batch",
      flowId: "image-entry",
    });
    const modules = new ModuleIndex().add(
      new URL("../fixtures/e2e/story_nodes.ts", import.meta.url).href,
      storyNodes,
    );
    const specs = compileFlow(flow, { modules });
    const servers = { nats: nats.url, redis: redis.url };
    await provisionOnServers(
      servers,
      { flowId: flow.flowId, flowType: "batch" },
      "r1",
      specs,
    );
    const codes = await Promise.all(
      specs.map(async (spec) =>
        [
          spec.name,
          await startReplica(
            spec,
            specs,
            { flowId: flow.flowId, flowType: "batch" },
            "r1",
            servers,
            dir,
            0,
            {},
            entrypoint(),
          )
            .exited,
        ] as const
      ),
    );
    assert.deepEqual(Object.fromEntries(codes), { count: 0, sink: 0 });
    const lines = (await Deno.readTextFile(out)).trim().split("\n").map(Number).sort((a, b) => a - b);
    assert.deepEqual(lines, Array.from({ length: 20 }, (_, i) => i + 1));
  } finally {
    await nats.stop();
    await redis.stop();
    await Deno.remove(dir, { recursive: true });
  }
});
