/**
 * The input groups the messenger hands its task (the core `Messenger` seam's `InputGroup`), made from the
 * join's ready groups.
 *
 * It guarantees: a data group's envelope entries are handed over as they are (no copy when no parent
 * collects), a collect parent's window as one entry with its first known event time; an end or abort
 * group names each parent's EOS, or its ABORT with the origin node and error record it carried (a marker
 * whose payload cannot be read still ends its parent, as its producer); a stop group signals the stop on
 * every parent.
 *
 * @module
 */

import { type ErrorRecord, errorToDict } from "../core/errors.ts";
import type { InputEntry, InputGroup } from "../core/messenger.ts";
import { type AbortMarker, type Envelope as WireEnvelope, readAbortPayload } from "../wire/codec.ts";
import type { CollectEntry, EnvelopeEntry, ReadyGroup } from "./grouping.ts";

/** What an ABORT envelope says; a marker whose payload is unreadable still ends its parent, as its producer. */
export function abortMarker(decoded: WireEnvelope): AbortMarker {
  try {
    return readAbortPayload(decoded.payloadType, decoded.payload);
  } catch (error) {
    return { node: decoded.producerName, error: errorToDict(error) };
  }
}

/** The InputEntry of an ABORT marker's entry. */
function abortInput<H>(entry: EnvelopeEntry<H>, origin: string, record: ErrorRecord): InputEntry {
  return {
    message: null,
    metadata: entry.metadata,
    eventTs: entry.eventTs,
    isStopSignal: false,
    isAbort: true,
    abortOrigin: origin,
    abortError: record,
  };
}

/** The InputEntry of a collect parent's window. */
function collectInput(entry: CollectEntry): InputEntry {
  return {
    message: entry.message,
    metadata: null,
    eventTs: entry.eventTs.find((ts) => ts !== null) ?? null,
    isStopSignal: false,
    isAbort: false,
  };
}

const STOP_ENTRY: InputEntry = Object.freeze({
  message: null,
  metadata: null,
  eventTs: null,
  isStopSignal: true,
  isAbort: false,
});

/** The entries of a data group as the task receives them: a collect parent's window as one entry. */
export function dataInput<H>(group: ReadyGroup<H>): InputGroup {
  const entries = group.entries;
  let converted: Record<string, InputEntry | null> | null = null;
  for (const name of Object.keys(entries)) {
    const entry = entries[name];
    if (entry?.kind === "collect") {
      (converted ??= { ...entries } as Record<string, InputEntry | null>)[name] = collectInput(entry);
    }
  }
  return converted ?? (entries as InputGroup);
}

/** The entries of an end or abort group: each parent's EOS, or its ABORT with origin and record. */
export function terminalInput<H>(group: ReadyGroup<H>): InputGroup {
  const input: Record<string, InputEntry | null> = {};
  for (const [name, entry] of Object.entries(group.entries)) {
    if (entry === null || entry.kind === "collect") {
      input[name] = entry === null ? null : collectInput(entry);
    } else if (entry.isAbort) {
      const marker = entry.message as AbortMarker;
      input[name] = abortInput(entry, marker.node, marker.error);
    } else {
      input[name] = entry;
    }
  }
  return input;
}

/** A group whose entries all signal the stop, one per parent. */
export function stopGroup(parentNames: readonly string[]): InputGroup {
  return Object.fromEntries(parentNames.map((name) => [name, STOP_ENTRY]));
}
