/**
 * Worker-side verification of a node's declared assets (spec runtime.assetcheck, RUN-033). Before a node
 * is opened, the worker hashes every {@link AssetRequirement} and refuses to run with a missing asset or
 * one whose bytes are not the declared ones: a model file on one host's disk is not on the host a
 * rescheduled worker landed on, and only the digest says the bytes are the declared bytes. Nothing here
 * fetches or distributes; the deployment owns distribution, this module only verifies identity.
 *
 * @example
 * ```ts
 * const reports = await verifyAssets([new AssetRequirement("./models/yolo.onnx", "9f86d08…")], "detect");
 * console.log(reports[0].status); // "ok", or ResourceUnavailable was thrown naming the path and the fix
 * ```
 *
 * @module
 */

import { createHash } from "node:crypto";
import type { AssetRequirement, Node } from "../core/node.ts";
import { ResourceUnavailable } from "../core/errors.ts";

/** What a check found for one asset. */
export const AssetStatus = {
  /** Present, and its SHA-256 is the declared one. */
  ok: "ok",
  /** No file at the path on this host. */
  missing: "missing",
  /** Present, with other bytes than the declared ones. */
  mismatch: "mismatch",
  /** Present but not readable here: a directory, no permission, an I/O error. */
  unreadable: "unreadable",
} as const;
/** What a check found for one asset. */
export type AssetStatus = typeof AssetStatus[keyof typeof AssetStatus];

/** One asset's check: its path, the declared and the actual digest, and the verdict. */
export interface AssetReport {
  readonly path: string;
  /** The declared SHA-256, lowercase hex. */
  readonly expected: string;
  /** The SHA-256 of the bytes found, or `null` when none could be read. */
  readonly actual: string | null;
  /** Whether the asset is declared available on every host. */
  readonly portable: boolean;
  readonly status: AssetStatus;
  /** Why an unreadable asset could not be read; `null` otherwise. */
  readonly detail: string | null;
}

const CHUNK_BYTES = 1 << 20;

/** The lowercase hex SHA-256 of the file at `path`, read in 1 MiB chunks. Rejects with the read error. */
export async function sha256Of(path: string): Promise<string> {
  using file = await Deno.open(path, { read: true });
  const hash = createHash("sha256");
  const buffer = new Uint8Array(CHUNK_BYTES);
  for (let read = await file.read(buffer); read !== null; read = await file.read(buffer)) {
    hash.update(buffer.subarray(0, read));
  }
  return hash.digest("hex");
}

async function checkOne(requirement: AssetRequirement): Promise<AssetReport> {
  const expected = requirement.sha256.trim().toLowerCase();
  const report = (status: AssetStatus, actual: string | null, detail: string | null = null): AssetReport =>
    Object.freeze({
      path: requirement.path,
      expected,
      actual,
      portable: requirement.portable,
      status,
      detail,
    });
  let actual: string;
  try {
    actual = await sha256Of(requirement.path);
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return report(AssetStatus.missing, null);
    return report(AssetStatus.unreadable, null, error instanceof Error ? error.message : String(error));
  }
  return report(actual === expected ? AssetStatus.ok : AssetStatus.mismatch, actual);
}

/** One report per requirement, in order. Never throws: {@link verifyAssets} decides what a report means. */
export function checkAssets(requirements: readonly AssetRequirement[]): Promise<AssetReport[]> {
  return Promise.all(requirements.map(checkOne));
}

function hostName(): string {
  try {
    return Deno.hostname();
  } catch {
    return "this host";
  }
}

function describeProblem(report: AssetReport): string {
  switch (report.status) {
    case AssetStatus.missing:
      return `${report.path} is missing`;
    case AssetStatus.mismatch:
      return `${report.path} has sha256 ${report.actual}, declared ${report.expected}`;
    default:
      return `${report.path} cannot be read (${report.detail})`;
  }
}

function remedyFor(problems: readonly AssetReport[]): string {
  const local = problems.filter((report) => !report.portable);
  const portable = problems.filter((report) => report.portable);
  const parts: string[] = [];
  if (local.length > 0) {
    parts.push(
      `${local.map((r) => r.path).join(", ")} ${
        local.length === 1 ? "is" : "are"
      } declared local to one host: ` +
        "pin the worker to the host that has the file with the declared digest, or make the asset portable " +
        "(a volume claim, an image layer, a download)",
    );
  }
  if (portable.length > 0) {
    const expected = portable.map((r) => `${r.path} (sha256 ${r.expected})`).join(", ");
    parts.push(
      `the distribution did not deliver the declared bytes of ${expected}: check the volume claim, image layer ` +
        "or download that provides them, or update the declared digest if the asset changed on purpose",
    );
  }
  return parts.join("; ");
}

/**
 * Checks every requirement and resolves with the reports when all are `ok`. Otherwise throws one
 * {@link ResourceUnavailable} naming the host, every failing path, and the fix: for a local-only asset,
 * pin the worker or make the asset portable; for a portable one, the distribution delivered other bytes.
 */
export async function verifyAssets(
  requirements: readonly AssetRequirement[],
  nodeName = "node",
): Promise<AssetReport[]> {
  const reports = await checkAssets(requirements);
  const problems = reports.filter((report) => report.status !== AssetStatus.ok);
  if (problems.length === 0) return reports;
  const host = hostName();
  throw new ResourceUnavailable(
    `node ${nodeName} cannot run on ${host}: ${problems.map(describeProblem).join("; ")}`,
    remedyFor(problems),
    {
      node: nodeName,
      host,
      assets: problems.map(({ path, expected, actual, status, portable }) => ({
        path,
        expected,
        actual,
        status,
        portable,
      })),
    },
  );
}

/** The worker's entry point: {@link verifyAssets} over the node's `requiredAssets()`, named by the node. */
export function verifyNodeAssets(node: Node): Promise<AssetReport[]> {
  return verifyAssets(node.requiredAssets(), node.name);
}
