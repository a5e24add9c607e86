/**
 * A local run's directory, `{stateDir}/{flowId}/{runId}`: where it is, the lock that lets one supervisor
 * at a time run it, the record of how its last supervisor ended, which decides what a re-run keeps, and
 * the compiled specs document its subprocess replicas read params from that no environment entry holds.
 *
 * @module
 */

import { dirname } from "node:path";
import { sanitize } from "../backends/names.ts";
import type { NodeSpec } from "../core/compiler.ts";
import { ConfigError, diskFailure, ResourceUnavailable } from "../core/errors.ts";
import { syncDirectory, writeAtomically } from "../runtime/durable_write.ts";

/**
/** The longest flow id or run id: each is one directory's name, and a file system's names stop at 255 bytes. */
export const MAX_RUN_NAME_LENGTH = 255;

/**
 * Refuses a flow id or run id that is not a plain name (letters, digits, `_`, `-`) of at most
 * {@link MAX_RUN_NAME_LENGTH} characters: each names a directory of the run's state, and anything else could
 * name one outside it, or one no file system holds.
 *
 * @throws ConfigError naming the id and how to fix it.
 */
export function checkRunNames(flowId: string, runId: string): void {
  for (
    const [what, value, remedy] of [
      [
        "flow id",
        flowId,
        "name the flow with letters, digits, '_' and '-' (new Flow([...], { flowId: \"squares\" }))",
      ],
      ["run id", runId, "pass --run-id with a name such as run-7"],
    ]
  ) {
    if (value === "" || sanitize(value) !== value) {
      throw new ConfigError(
        `${what} ${JSON.stringify(value)} must be non-empty and use only letters, digits, '_' and '-'`,
        remedy,
        { [what.replace(" ", "_")]: value },
      );
    }
    if (value.length > MAX_RUN_NAME_LENGTH) {
      throw new ConfigError(
        `${what} ${
          JSON.stringify(`${value.slice(0, 40)}…`)
        } is ${value.length} characters long, more than the ` +
          `${MAX_RUN_NAME_LENGTH} a directory's name may have`,
        remedy,
        { [what.replace(" ", "_")]: `${value.slice(0, 40)}…` },
      );
    }
  }
}

/** Where a run's state lives: `{stateDir}/{flowId}/{runId}`, once {@link checkRunNames} accepts both ids. */
export function runDirectory(stateDir: string, flowId: string, runId: string): string {
  checkRunNames(flowId, runId);
  return `${stateDir}/${flowId}/${runId}`;
}

/** What to do once a disk failure of a run's state is mended: the run goes on from its ledger. */
export const RESUME_AFTER_DISK_REMEDY =
  "then run vf again with the same --run-id: the run goes on from its " +
  "ledger, whose every write happened whole or not at all";

/**
 * Runs `write`, which writes the run's state at `path` (`subject` says what that is: "the dead-letter
 * file"), and resolves with what it returns.
 *
 * @throws ResourceUnavailable (a `diskFailure`, exit 3) naming the path when its disk is read-only, full or
 * failing; any other failure as it is.
 */
export async function writingRunState<T>(subject: string, path: string, write: () => Promise<T>): Promise<T> {
  try {
    return await write();
  } catch (error) {
    throw diskFailure(error, `${subject} ${path}`, path, RESUME_AFTER_DISK_REMEDY) ?? error;
  }
}

/**
 * Holds the run's lock (an exclusive flock on `{runDir}/run.lock`, released when closed or when the
 * process dies): one supervisor per run directory at a time.
 *
 * @throws ResourceUnavailable when another supervisor holds it (two would share one ledger and write
 * every output twice), or the lock cannot be taken at all.
 */
export async function lockRun(runDir: string, flowId: string, runId: string): Promise<Deno.FsFile> {
  const path = `${runDir}/run.lock`;
  const lock = await writingRunState(
    "the run's lock",
    path,
    () => Deno.open(path, { read: true, write: true, create: true }),
  );
  let held: boolean;
  try {
    held = await lock.tryLock(true);
  } catch (error) {
    lock.close();
    throw new ResourceUnavailable(
      `the lock ${path} of run ${runId} cannot be taken: ${(error as Error).message}`,
      "put --state on a local disk that supports file locks",
      { run_dir: runDir },
    );
  }
  if (held) return lock;
  lock.close();
  throw new ResourceUnavailable(
    `run ${runId} of flow ${flowId} is already running: another vf holds ${path}`,
    "wait for that run to end (or stop it), or pass another --run-id",
    { run_dir: runDir },
  );
}

/** How a run's supervisor ended, when it ended on its own terms. */
export const RunEnd = {
  /** Every replica finished: the run is done. */
  finished: "finished",
  /** A signal stopped it and every item taken was finished: the broker held nothing undelivered. */
  stopped: "stopped",
} as const;
/** One of {@link RunEnd}. */
export type RunEnd = typeof RunEnd[keyof typeof RunEnd];

/** How a supervisor ended, and when (ISO time). */
export interface RunEndRecord {
  readonly end: RunEnd;
  readonly at: string;
}

const END_FILE = "end.json";

/**
 * How the last supervisor of the run in `runDir` ended, or null when none did on its own terms (it was
 * killed, forced, or failed), or none ran yet.
 *
 * @throws ResourceUnavailable when the record is unreadable or not one this module wrote.
 */
export async function readRunEnd(runDir: string): Promise<RunEndRecord | null> {
  const path = `${runDir}/${END_FILE}`;
  let parsed: unknown;
  try {
    parsed = JSON.parse(await Deno.readTextFile(path));
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return null;
    throw unusableRunEnd(path, `cannot be read: ${(error as Error).message}`);
  }
  const record = parsed as Partial<RunEndRecord> | null;
  if (
    record === null || typeof record !== "object" || !Object.values(RunEnd).includes(record.end as RunEnd) ||
    typeof record.at !== "string"
  ) {
    throw unusableRunEnd(path, "is not one videoflow wrote");
  }
  return { end: record.end as RunEnd, at: record.at };
}

function unusableRunEnd(path: string, why: string): ResourceUnavailable {
  return new ResourceUnavailable(
    `the run's end record ${path} ${why}`,
    "remove the file: the run is then treated as one whose supervisor died, and replays its sources",
    { path },
  );
}

/** Records how this supervisor ended: written whole and synced (a temporary file renamed over it), or not at all. */
export async function writeRunEnd(runDir: string, end: RunEnd): Promise<void> {
  const bytes = new TextEncoder().encode(JSON.stringify({ end, at: new Date().toISOString() }));
  const path = `${runDir}/${END_FILE}`;
  await writingRunState(
    "the run's end record",
    path,
    () => writeAtomically(runDir, `${path}.tmp`, path, bytes),
  );
}

/** The name of the compiled specs document in a run directory. */
export const SPECS_FILE = "specs.json";

/**
 * Writes the compiled specs document at `path` (a run's {@link SPECS_FILE}: a JSON list of NodeSpecs, the
 * document `VF_FLOW_SPECS_PATH` names) whole and synced, replacing an earlier one.
 */
export async function writeSpecsDocument(path: string, specs: readonly NodeSpec[]): Promise<void> {
  const bytes = new TextEncoder().encode(JSON.stringify(specs.map((spec) => spec.toDict())));
  await writingRunState(
    "the run's specs document",
    path,
    () => writeAtomically(dirname(path), `${path}.tmp`, path, bytes),
  );
}

/** Removes the end record before a supervisor goes on with the run, so its own death leaves none. */
export async function clearRunEnd(runDir: string): Promise<void> {
  const path = `${runDir}/${END_FILE}`;
  await writingRunState("the run's end record", path, async () => {
    try {
      await Deno.remove(path);
    } catch (error) {
      if (error instanceof Deno.errors.NotFound) return;
      throw error;
    }
    await syncDirectory(runDir);
  });
}
