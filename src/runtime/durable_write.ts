/**
 * Crash-safe replacement of one file: a temporary file written and fsynced, renamed over the target, the
 * directory fsynced. A process killed at any instant leaves the target old or new, never torn. Used for
 * the file store's log records, its journal's compacted segments and its marker, and the run directory's
 * documents.
 *
 * @module
 */

import { writeAll } from "../core/bytes.ts";

/** Syncs directory `dir`, so the entries renamed or removed in it are durable. */
export async function syncDirectory(dir: string): Promise<void> {
  const handle = await Deno.open(dir, { read: true });
  try {
    await handle.sync();
  } finally {
    handle.close();
  }
}

/**
 * Temporary file, fsync, atomic rename over `target`, fsync of the directory (`syncDir`, by default
 * opening `dir`): old or new, never torn. `beforeRename` runs between the fsync and the rename (the
 * file store's `ledger.write.mid` barrier, a journal's seal).
 */
export async function writeAtomically(
  dir: string,
  temp: string,
  target: string,
  bytes: Uint8Array,
  beforeRename: () => Promise<void> = () => Promise.resolve(),
  syncDir: () => Promise<void> = () => syncDirectory(dir),
): Promise<void> {
  const file = await Deno.open(temp, { write: true, create: true, truncate: true, mode: 0o644 });
  try {
    await writeAll(file, bytes);
    await file.syncData();
  } finally {
    file.close();
  }
  await beforeRename();
  await Deno.rename(temp, target);
  await syncDir();
}
