import assert from "node:assert/strict";
import { join } from "node:path";
import koffi from "koffi";
import { NVML_STRUCTS } from "../../../ffi/nvml_types.ts";

const HEADER_DIR = new URL("../../fixtures/fake_nvml/", import.meta.url).pathname;

/** `struct member size offset` lines gcc computes from fake_nvml.h, one per member, then `struct size`. */
async function gccLayout(): Promise<Map<string, number>> {
  const lines: string[] = [];
  for (const [name, type] of Object.entries(NVML_STRUCTS)) {
    lines.push(`printf("${name} %zu\\n", sizeof(${name}));`);
    for (const member of Object.keys(type.members ?? {})) {
      lines.push(`printf("${name}.${member} %zu\\n", offsetof(${name}, ${member}));`);
    }
  }
  const dir = await Deno.makeTempDir({ prefix: "nvml_layout_" });
  const source = join(dir, "layout.c");
  await Deno.writeTextFile(
    source,
    `#include <stddef.h>\n#include <stdio.h>\n#include "fake_nvml.h"\nint main(void) {\n${
      lines.join("\n")
    }\nreturn 0;\n}\n`,
  );
  const binary = join(dir, "layout");
  const built = await new Deno.Command("gcc", { args: ["-I", HEADER_DIR, "-o", binary, source] }).output();
  assert.ok(built.success, new TextDecoder().decode(built.stderr));
  const run = await new Deno.Command(binary).output();
  const layout = new Map<string, number>();
  for (const line of new TextDecoder().decode(run.stdout).trim().split("\n")) {
    const [key, value] = line.split(" ");
    layout.set(key, Number(value));
  }
  await Deno.remove(dir, { recursive: true });
  return layout;
}

Deno.test("every NVML struct koffi declares has the size and member offsets gcc gives the C header", async () => {
  const layout = await gccLayout();
  let members = 0;
  for (const [name, type] of Object.entries(NVML_STRUCTS)) {
    assert.equal(koffi.sizeof(type), layout.get(name), `sizeof(${name})`);
    for (const member of Object.keys(type.members ?? {})) {
      assert.equal(
        koffi.offsetof(type, member),
        layout.get(`${name}.${member}`),
        `offsetof(${name}, ${member})`,
      );
      members++;
    }
  }
  assert.equal(members, 3 + 7 + 11 + 2 + 9, "every member of the five structs was compared");
  assert.equal(layout.get("nvmlPciInfo_t"), 68);
  assert.equal(layout.get("nvmlGpuInstanceProfileInfo_t"), 48);
});
