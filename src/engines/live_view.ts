/**
 * What `run-local` shows while a flow runs: one row per node (state, replicas, items processed, rate, in
 * flight, drops by reason, dead letters, restarts), redrawn in place on a terminal and printed as plain
 * periodic lines otherwise; and the summary at the end. Pure rendering: the engine supplies snapshots.
 *
 * @module
 */

/** Where a node stands. */
export const NodeState = {
  /** A realtime flow's producer, held until every non-producer replica has opened (nothing evicted at start). */
  waiting: "waiting",
  starting: "starting",
  running: "running",
  restarting: "restarting",
  done: "done",
  failed: "failed",
} as const;
/** Where a node stands. */
export type NodeState = typeof NodeState[keyof typeof NodeState];

/** One node's counters at one instant. `null` where the figure could not be read (never shown as 0). */
export interface NodeSnapshot {
  readonly node: string;
  readonly state: NodeState;
  readonly replicasRunning: number;
  readonly replicas: number;
  readonly processed: number;
  readonly failed: number;
  readonly inFlight: number | null;
  readonly drops: Readonly<Record<string, number>>;
  readonly deadLetters: number;
  readonly restarts: number;
}

/** The rate of each node between two snapshots, items per second. */
export function rates(
  previous: readonly NodeSnapshot[],
  current: readonly NodeSnapshot[],
  seconds: number,
): Map<string, number> {
  const before = new Map(previous.map((s) => [s.node, s.processed]));
  const out = new Map<string, number>();
  for (const snap of current) {
    const delta = snap.processed - (before.get(snap.node) ?? 0);
    out.set(snap.node, seconds > 0 ? Math.max(0, delta) / seconds : 0);
  }
  return out;
}

function dropsText(drops: Readonly<Record<string, number>>): string {
  const parts = Object.entries(drops).filter(([, n]) => n > 0).map(([reason, n]) => `${reason} ${n}`);
  return parts.length === 0 ? "0" : parts.join(", ");
}

function formatRate(rate: number | undefined): string {
  if (rate === undefined) return "-";
  return rate >= 100 ? `${Math.round(rate)}/s` : `${rate.toFixed(1)}/s`;
}

const HEADERS = ["node", "state", "replicas", "processed", "rate", "in flight", "drops", "dlq", "restarts"];

/** The rows of the table, header first, as cells. */
export function tableRows(snapshots: readonly NodeSnapshot[], rate: ReadonlyMap<string, number>): string[][] {
  return [
    HEADERS,
    ...snapshots.map((s) => [
      s.node,
      s.state,
      `${s.replicasRunning}/${s.replicas}`,
      String(s.processed),
      formatRate(rate.get(s.node)),
      s.inFlight === null ? "?" : String(s.inFlight),
      dropsText(s.drops),
      String(s.deadLetters),
      String(s.restarts),
    ]),
  ];
}

/** The table as aligned lines. */
export function renderTable(snapshots: readonly NodeSnapshot[], rate: ReadonlyMap<string, number>): string[] {
  const rows = tableRows(snapshots, rate);
  const widths = HEADERS.map((_, col) => Math.max(...rows.map((row) => row[col].length)));
  return rows.map((row) => row.map((cell, col) => cell.padEnd(widths[col])).join("  ").trimEnd());
}

/** One plain line per node, for logs and pipes: `[12.0s] square running 2/2 processed 120 (45/s) ...`. */
export function renderLines(
  elapsedSeconds: number,
  snapshots: readonly NodeSnapshot[],
  rate: ReadonlyMap<string, number>,
): string[] {
  return snapshots.map((s) =>
    `[${
      elapsedSeconds.toFixed(1)
    }s] ${s.node} ${s.state} ${s.replicasRunning}/${s.replicas} processed ${s.processed} ` +
    `(${formatRate(rate.get(s.node))}) in flight ${s.inFlight === null ? "?" : s.inFlight} drops ${
      dropsText(s.drops)
    } dlq ${s.deadLetters} restarts ${s.restarts}`
  );
}

/** Writes text to a terminal or a pipe. */
export interface ViewOutput {
  readonly isTerminal: boolean;
  write(text: string): void;
}

/**
 * Shows snapshots as they come: on a terminal the table is redrawn in place (cursor up, clear line); on
 * anything else each update is printed as plain lines.
 */
export class LiveView {
  #drawn = 0;
  #previous: readonly NodeSnapshot[] = [];
  #previousAt: number | null = null;

  constructor(readonly output: ViewOutput, readonly startedAt: number) {}

  /** Shows the snapshots taken at `now` (monotonic seconds). */
  update(now: number, snapshots: readonly NodeSnapshot[]): void {
    const rate = rates(this.#previous, snapshots, this.#previousAt === null ? 0 : now - this.#previousAt);
    this.#previous = snapshots;
    this.#previousAt = now;
    if (this.output.isTerminal) {
      const lines = renderTable(snapshots, rate);
      const up = this.#drawn > 0 ? `\x1b[${this.#drawn}A` : "";
      this.output.write(`${up}${lines.map((line) => `\x1b[2K${line}`).join("\n")}\n`);
      this.#drawn = lines.length;
    } else {
      this.output.write(`${renderLines(now - this.startedAt, snapshots, rate).join("\n")}\n`);
    }
  }

  /** Prints a line above the table (a lifecycle event), keeping the table below it. */
  event(line: string): void {
    if (this.output.isTerminal && this.#drawn > 0) {
      this.output.write(`\x1b[${this.#drawn}A\x1b[J${line}\n`);
      this.#drawn = 0;
    } else {
      this.output.write(`${line}\n`);
    }
  }
}

/** The end-of-run summary: totals per node, then `notes` (one line each), then the outcome line. */
export function renderSummary(
  elapsedSeconds: number,
  snapshots: readonly NodeSnapshot[],
  outcome: string,
  notes: readonly string[] = [],
): string[] {
  const rate = new Map(snapshots.map((s) => [s.node, elapsedSeconds > 0 ? s.processed / elapsedSeconds : 0]));
  return [...renderTable(snapshots, rate), ...notes, `${outcome} in ${elapsedSeconds.toFixed(1)}s`];
}
