/**
 * What every `vf` command writes through: results and diagnostics as separate streams, so a command never
 * touches the console itself and a test can read both.
 *
 * @module
 */

/** Where a command writes what it reports: stdout for results, stderr for diagnostics. */
export interface CommandOutput {
  /** One line of results. */
  out(line: string): void;
  /** One line of diagnostics. */
  err(line: string): void;
  /** Raw text on the results stream (a live view redrawing itself). */
  write(text: string): void;
}
