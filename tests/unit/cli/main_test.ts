/**
 * The CLI's argument handling, in process through runCli: what reaches stdout and stderr, and the exit
 * code. The commands themselves run end to end in tests/e2e/cli_test.ts.
 */
import assert from "node:assert/strict";
import { runCli } from "../../../src/cli/main.ts";

/** Runs the CLI on `args`, capturing both streams. */
async function cli(...args: string[]): Promise<{ code: number; out: string[]; err: string[] }> {
  const out: string[] = [];
  const err: string[] = [];
  const code = await runCli(args, {
    out: (line) => out.push(line),
    err: (line) => err.push(line),
    write: (text) => out.push(text),
  });
  return { code, out, err };
}

Deno.test("no command prints the usage and exits 2; --help prints it and exits 0", async () => {
  const bare = await cli();
  assert.equal(bare.code, 2);
  assert.match(bare.out.join("\n"), /^usage: vf <command>/);
  for (const command of ["validate", "compile", "explain", "decode"]) {
    assert.match(bare.out.join("\n"), new RegExp(`^  ${command} `, "m"), `the usage lists ${command}`);
  }
  const help = await cli("-h");
  assert.equal(help.code, 0);
  assert.deepEqual(help.out, bare.out);
  assert.deepEqual(help.err, []);
});

Deno.test("an option the command does not take is a usage error naming it, with the remedy", async () => {
  const run = await cli("validate", "--dot", "flow.ts");
  assert.equal(run.code, 2);
  assert.deepEqual(run.out, []);
  assert.match(run.err.join("\n"), /^VF_CONFIG: validate does not take --dot/);
  assert.match(run.err.join("\n"), /remedy: run `vf --help`/);
});

Deno.test("an option no command knows and a second path are usage errors, exit 2", async () => {
  const unknownOption = await cli("compile", "--nope", "flow.ts");
  assert.equal(unknownOption.code, 2);
  assert.match(unknownOption.err.join("\n"), /^VF_CONFIG: .*--nope/);
  const twoPaths = await cli("decode", "a.bin", "b.bin");
  assert.equal(twoPaths.code, 2);
  assert.match(twoPaths.err.join("\n"), /^VF_CONFIG: decode takes exactly one path, got 2/);
});

Deno.test("a flow path that is a directory is refused as not a file, exit 2", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf-cli-" });
  try {
    const run = await cli("validate", dir);
    assert.equal(run.code, 2);
    assert.match(run.err.join("\n"), /^VF_CONFIG: flow file .* is not a file/);
  } finally {
    await Deno.remove(dir);
  }
});

Deno.test("a flow file this process may not read is refused as unreadable, not as missing", async () => {
  const root = new URL("../../../", import.meta.url);
  const output = await new Deno.Command(Deno.execPath(), {
    args: ["run", "--allow-read=/nonexistent-vf-dir", "mod.ts", "validate", "examples/hello.ts"],
    cwd: root,
    env: { NO_COLOR: "1" },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const stderr = new TextDecoder().decode(output.stderr);
  assert.equal(output.code, 2, stderr);
  assert.match(stderr, /^VF_CONFIG: flow file examples\/hello.ts cannot be read: /);
  assert.match(stderr, /remedy: make the file readable by this process/);
});
