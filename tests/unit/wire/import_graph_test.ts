import assert from "node:assert/strict";

const ROOT = new URL("../../../", import.meta.url);
const WIRE = new URL("src/wire/", ROOT);

/**
 * protobufjs's light build in one file (reflection and its generated encoders, without the .proto parser),
 * and the types it is checked against.
 */
const PROTOBUFJS_LIGHT = /^npm:\/?protobufjs@[^/]+\/(dist\/light\/protobuf\.min\.js|light\.d\.ts)$/;

Deno.test("src/wire loads protobufjs's light build and no other npm package (no .proto parser at run time)", async () => {
  const modules = [...Deno.readDirSync(WIRE)].filter((entry) => entry.name.endsWith(".ts")).map((e) =>
    e.name
  );
  assert.ok(modules.includes("codec.ts") && modules.includes("schema.ts"), modules.join(", "));
  const loaders: string[] = [];
  for (const module of modules) {
    const info = await new Deno.Command(Deno.execPath(), {
      args: ["info", "--json", new URL(module, WIRE).pathname],
      cwd: ROOT,
      stdout: "piped",
      stderr: "piped",
    }).output();
    assert.ok(info.success, new TextDecoder().decode(info.stderr));
    const graph: { modules: { specifier: string }[] } = JSON.parse(new TextDecoder().decode(info.stdout));
    const specifiers = graph.modules.map((m) => m.specifier);
    assert.ok(
      specifiers.some((s) => s.endsWith(`/src/wire/${module}`)),
      `${module}: ${specifiers.join(", ")}`,
    );
    const npm = specifiers.filter((s) => s.startsWith("npm:") || s.includes("/node_modules/"));
    const others = npm.filter((s) => !PROTOBUFJS_LIGHT.test(s));
    assert.deepEqual(others, [], `${module} loads ${others.join(", ")}`);
    if (npm.length > 0) loaders.push(module);
  }
  assert.ok(loaders.includes("codec.ts") && loaders.includes("schema.ts"), loaders.join(", "));
});
