/**
 * Mounting in tests that break a disk on purpose (a read-only bind mount, a small tmpfs): only root may
 * mount, so such tests are ignored elsewhere ({@link MAY_MOUNT}); CI runs as root.
 *
 * @module
 */

import assert from "node:assert/strict";

/** Whether this process may mount filesystems (it runs as root). */
export const MAY_MOUNT = Deno.uid() === 0;

/** Runs `mount ARGS` or `umount ARGS`, failing the test with the command's stderr when it fails. */
export async function mountCommand(program: "mount" | "umount", args: readonly string[]): Promise<void> {
  const result = await new Deno.Command(program, { args: [...args], stdout: "null", stderr: "piped" })
    .output();
  assert.equal(result.code, 0, `${program} ${args.join(" ")}: ${new TextDecoder().decode(result.stderr)}`);
}
