import assert from "node:assert/strict";

const ROOT = new URL("../../../", import.meta.url);
const WIRE = new URL("src/wire/", ROOT);

Deno.test("no module of src/wire loads an npm package (protobufjs stays a test-only oracle)", async () => {
  const modules = [...Deno.readDirSync(WIRE)].filter((entry) => entry.name.endsWith(".ts")).map((e) =>
    e.name
  );
  assert.ok(modules.includes("codec.ts") && modules.includes("schema.ts"), modules.join(", "));
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
    assert.deepEqual(npm, [], `${module} loads ${npm.join(", ")}`);
  }
});
