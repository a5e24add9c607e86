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
  /** The node's name. */
  readonly node: string;
  /** Where the node stands: starting, running, done, failed ... */
  readonly state: NodeState;
  /** Replicas running now. */
  readonly replicasRunning: number;
  /** Replicas the node runs as. */
  readonly replicas: number;
  /** Input groups (a producer: items) its replicas finished. */
  readonly processed: number;
  /** Input groups its node failed on. */
  readonly failed: number;
  /** Messages taken and not yet settled; `null` when the broker could not say. */
  readonly inFlight: number | null;
  /** Messages given up, by reason (the spec's drop reasons), as far as they are counted. */
  readonly drops: Readonly<Record<string, number>>;
  /** The broker may have dropped inputs of the node that it cannot count (shown as `evicted ?`). */
  readonly dropsUncounted: boolean;
  /** Dead letters the node made. */
  readonly deadLetters: number;
  /** Restarts of its replicas. */
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

function dropsText(s: NodeSnapshot): string {
  const parts = Object.entries(s.drops).filter(([, n]) => n > 0).map(([reason, n]) => `${reason} ${n}`);
  if (s.dropsUncounted) parts.push("evicted ?");
  return parts.length === 0 ? "0" : parts.join(", ");
}

function dropsTotal(s: NodeSnapshot): string {
  const total = String(Object.values(s.drops).reduce((sum, n) => sum + n, 0));
  return s.dropsUncounted ? `${total}+?` : total;
}

function formatRate(rate: number | undefined): string {
  if (rate === undefined) return "-";
  return rate >= 100 ? `${Math.round(rate)}/s` : `${rate.toFixed(1)}/s`;
}

const HEADERS = ["node", "state", "replicas", "processed", "rate", "in flight", "drops", "dlq", "restarts"];

/**
 * The rows of the table, header first, as cells; with `dropsByReason` false a node's drops are one total
 * (what a narrow terminal shows).
 */
export function tableRows(
  snapshots: readonly NodeSnapshot[],
  rate: ReadonlyMap<string, number>,
  dropsByReason = true,
): string[][] {
  return [
    HEADERS,
    ...snapshots.map((s) => [
      s.node,
      s.state,
      `${s.replicasRunning}/${s.replicas}`,
      String(s.processed),
      formatRate(rate.get(s.node)),
      s.inFlight === null ? "?" : String(s.inFlight),
      dropsByReason ? dropsText(s) : dropsTotal(s),
      String(s.deadLetters),
      String(s.restarts),
    ]),
  ];
}

/** The fewest characters of a node's name a table narrower than its names keeps (then `…`). */
const NARROWEST_NODE_NAME = 8;

/** The columns a terminal too narrow for every column goes without, in this order. */
const OPTIONAL_COLUMNS: readonly string[] = ["rate", "replicas", "in flight"];

/** `text` in at most `width` characters: cut, with `…` as its last, when longer. */
function cut(text: string, width: number): string {
  return text.length <= width ? text : `${text.slice(0, Math.max(0, width - 1))}…`;
}

/**
 * `rows` as lines whose columns are `gap` spaces apart, each column as wide as its widest cell but the
 * node names', which get what `columns` leaves them (at least {@link NARROWEST_NODE_NAME}).
 */
function aligned(rows: readonly string[][], gap: number, columns: number): string[] {
  const widths = rows[0].map((_, col) => Math.max(...rows.map((row) => row[col].length)));
  const others = widths.slice(1).reduce((sum, width) => sum + width + gap, 0);
  widths[0] = Math.min(widths[0], Math.max(NARROWEST_NODE_NAME, columns - others));
  return rows.map((row) =>
    row.map((cell, col) => cut(cell, widths[col]).padEnd(widths[col])).join(" ".repeat(gap)).trimEnd()
  );
}

/** Which nodes a table too short for all of them shows first: those in trouble, then those at work. */
const STATE_PRIORITY: Readonly<Record<NodeState, number>> = {
  failed: 0,
  restarting: 0,
  running: 1,
  starting: 1,
  waiting: 1,
  done: 2,
};

/**
 * The nodes a table of at most `lines` lines shows, in flow order, and the line that sums up the others
 * (null when every node has its own row). The header and that line count among the `lines`; nodes failed
 * or restarting are kept before those at work, and those before the done ones.
 */
function shownNodes(
  snapshots: readonly NodeSnapshot[],
  lines: number,
): { shown: readonly NodeSnapshot[]; rest: string | null } {
  if (snapshots.length + 1 <= lines) return { shown: snapshots, rest: null };
  const room = Math.max(0, lines - 2);
  const kept = new Set(
    [...snapshots.keys()]
      .sort((a, b) => STATE_PRIORITY[snapshots[a].state] - STATE_PRIORITY[snapshots[b].state] || a - b)
      .slice(0, room),
  );
  const hidden = snapshots.filter((_, i) => !kept.has(i));
  const states = new Map<string, number>();
  for (const s of hidden) states.set(s.state, (states.get(s.state) ?? 0) + 1);
  const total = (of: (s: NodeSnapshot) => number) => hidden.reduce((sum, s) => sum + of(s), 0);
  const rest = `… ${hidden.length} more node${hidden.length === 1 ? "" : "s"} (` +
    [...states].map(([state, n]) => `${n} ${state}`).join(", ") +
    `): processed ${total((s) => s.processed)}, dlq ${total((s) => s.deadLetters)}, ` +
    `restarts ${total((s) => s.restarts)}`;
  return { shown: snapshots.filter((_, i) => kept.has(i)), rest };
}

/**
 * The table as aligned lines, at most `lines` of them and none longer than `columns` (a terminal's height
 * and width; unbounded by default). A table with more nodes than `lines` has rows for shows as many as fit
 * and sums up the others in its last line. A table too wide is narrowed step by step until it fits: node
 * names cut short, drops shown as one total, one space between columns, then without rate, replicas and
 * in flight; only a terminal too narrow for what is left gets its lines cut.
 */
export function renderTable(
  snapshots: readonly NodeSnapshot[],
  rate: ReadonlyMap<string, number>,
  columns = Infinity,
  lines = Infinity,
): string[] {
  const { shown, rest } = shownNodes(snapshots, lines);
  const table = lines < 2 ? [] : widthBound(shown, rate, columns);
  return rest === null ? table : [...table, cut(rest, columns)];
}

/** {@link renderTable} of every node in `snapshots`, narrowed to `columns`. */
function widthBound(
  snapshots: readonly NodeSnapshot[],
  rate: ReadonlyMap<string, number>,
  columns: number,
): string[] {
  const fits = (lines: readonly string[]) => lines.every((line) => line.length <= columns);
  let lines = aligned(tableRows(snapshots, rate), 2, columns);
  if (fits(lines)) return lines;
  let rows = tableRows(snapshots, rate, false);
  for (const gap of [2, 1]) {
    lines = aligned(rows, gap, columns);
    if (fits(lines)) return lines;
  }
  for (const header of OPTIONAL_COLUMNS) {
    const at = rows[0].indexOf(header);
    rows = rows.map((row) => row.filter((_, col) => col !== at));
    lines = aligned(rows, 1, columns);
    if (fits(lines)) return lines;
  }
  return lines.map((line) => cut(line, columns));
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
      dropsText(s)
    } dlq ${s.deadLetters} restarts ${s.restarts}`
  );
}

/** Writes text to a terminal or a pipe. */
export interface ViewOutput {
  /** Whether the text goes to a terminal: then the table is redrawn in place, else written line by line. */
  readonly isTerminal: boolean;
  /** Writes `text` as it is. */
  write(text: string): void;
  /**
   * The terminal's width now, in columns (`Deno.consoleSize().columns`), read at every redraw so that a
   * resized terminal is followed; `null` (or absent) when it cannot be read: then
   * {@link DEFAULT_TERMINAL_COLUMNS}.
   */
  columns?(): number | null;
  /**
   * The terminal's height now, in rows (`Deno.consoleSize().rows`), read at every redraw; `null` (or
   * absent) when it cannot be read: then {@link DEFAULT_TERMINAL_ROWS}.
   */
  rows?(): number | null;
}

/** The width a terminal that does not say its own is taken to have. */
export const DEFAULT_TERMINAL_COLUMNS = 80;

/** The height a terminal that does not say its own is taken to have. */
export const DEFAULT_TERMINAL_ROWS = 24;

/**
 * Shows snapshots as they come: on a terminal the table is redrawn in place (cursor up, clear line), each
 * line within the terminal's width (a line that wrapped would take two rows, and the redraw, moving up one
 * row a line, would leave a header behind each time) and the whole table a row shorter than the terminal
 * (a table that scrolled would leave its top behind the same way); on anything else each update is printed
 * as plain lines.
 */
export class LiveView {
  #drawn = 0;
  #previous: readonly NodeSnapshot[] = [];
  #previousAt: number | null = null;

  constructor(readonly output: ViewOutput, readonly startedAt: number) {}

  /**
   * How wide a table written to the output may be: the terminal's width now (else
   * {@link DEFAULT_TERMINAL_COLUMNS}); unbounded on anything but a terminal.
   */
  get columns(): number {
    return this.output.isTerminal ? this.output.columns?.() ?? DEFAULT_TERMINAL_COLUMNS : Infinity;
  }

  /**
   * How many lines a table written to the output may take: one fewer than the terminal's rows now (else
   * {@link DEFAULT_TERMINAL_ROWS}), since the cursor rests on the row below it; unbounded on anything but
   * a terminal.
   */
  get lines(): number {
    return this.output.isTerminal ? (this.output.rows?.() ?? DEFAULT_TERMINAL_ROWS) - 1 : Infinity;
  }

  /** Shows the snapshots taken at `now` (monotonic seconds). */
  update(now: number, snapshots: readonly NodeSnapshot[]): void {
    const rate = rates(this.#previous, snapshots, this.#previousAt === null ? 0 : now - this.#previousAt);
    this.#previous = snapshots;
    this.#previousAt = now;
    if (this.output.isTerminal) {
      const lines = renderTable(snapshots, rate, this.columns, this.lines);
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

/**
 * The end-of-run summary: totals per node (a table within `columns`, unbounded by default), then `notes`
 * (one line each), then the outcome line.
 */
export function renderSummary(
  elapsedSeconds: number,
  snapshots: readonly NodeSnapshot[],
  outcome: string,
  notes: readonly string[] = [],
  columns = Infinity,
): string[] {
  const rate = new Map(snapshots.map((s) => [s.node, elapsedSeconds > 0 ? s.processed / elapsedSeconds : 0]));
  return [...renderTable(snapshots, rate, columns), ...notes, `${outcome} in ${elapsedSeconds.toFixed(1)}s`];
}
