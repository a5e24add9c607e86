/**
 * Peer-to-peer reach between every ordered pair of cards: `nvmlDeviceGetP2PStatus` for read, write,
 * NVLink and atomics, and `nvmlDeviceGetTopologyCommonAncestor`, each Known or Unknown on its own.
 *
 * @module
 */

import type { Observation } from "../src/backends/outcomes.ts";
import { P2P_CAPS_INDEX, P2P_STATUS, TOPOLOGY_LEVEL } from "../ffi/nvml_types.ts";
import { type DeviceHandle, notSeen, type NvmlRead, readUint, seen } from "./_reads.ts";

/** A P2P status as `nvidia-smi topo -p2p` codes it: OK, CNS, GNS, TNS, DRK, NS or U. */
export type P2pStatus = string;

/** What NVML says about reaching card `to` from card `from`. */
export interface P2pLink {
  /** The index of the card reaching. */
  readonly from: number;
  /** The index of the card reached. */
  readonly to: number;
  /** P2P reads (`NVML_P2P_CAPS_INDEX_READ`). */
  readonly read: Observation<P2pStatus>;
  /** P2P writes (`NVML_P2P_CAPS_INDEX_WRITE`). */
  readonly write: Observation<P2pStatus>;
  /** P2P over NVLink (`NVML_P2P_CAPS_INDEX_NVLINK`). */
  readonly nvlink: Observation<P2pStatus>;
  /** P2P atomics (`NVML_P2P_CAPS_INDEX_ATOMICS`). */
  readonly atomics: Observation<P2pStatus>;
  /** Where their paths meet: internal, single, multiple, hostbridge, node or system. */
  readonly commonAncestor: Observation<string>;
}

/** Every ordered pair of distinct cards (n × (n − 1) links), `from` major. */
export interface P2pMatrix {
  /** The links, `from` major, `to` minor. */
  readonly links: readonly P2pLink[];
}

/** The matrix over `handles` (card index order; null where a card had no handle). */
export function readP2pMatrix(read: NvmlRead, handles: readonly (DeviceHandle | null)[]): P2pMatrix {
  const links: P2pLink[] = [];
  handles.forEach((a, from) => {
    handles.forEach((b, to) => {
      if (from !== to) links.push(readLink(read, from, a, to, b));
    });
  });
  return Object.freeze({ links: Object.freeze(links) });
}

function readLink(
  read: NvmlRead,
  from: number,
  a: DeviceHandle | null,
  to: number,
  b: DeviceHandle | null,
): P2pLink {
  if (a === null || b === null) {
    const none = notSeen(read, "unread", `GPU ${a === null ? from : to} has no handle`);
    return Object.freeze({
      from,
      to,
      read: none,
      write: none,
      nvlink: none,
      atomics: none,
      commonAncestor: none,
    });
  }
  const status = (index: number) =>
    named(read, readUint(read, "nvmlDeviceGetP2PStatus", a, b, index), P2P_STATUS, "P2P status");
  return Object.freeze({
    from,
    to,
    read: status(P2P_CAPS_INDEX.read),
    write: status(P2P_CAPS_INDEX.write),
    nvlink: status(P2P_CAPS_INDEX.nvlink),
    atomics: status(P2P_CAPS_INDEX.atomics),
    commonAncestor: named(
      read,
      readUint(read, "nvmlDeviceGetTopologyCommonAncestor", a, b),
      TOPOLOGY_LEVEL,
      "topology level",
    ),
  });
}

/** The name of an enum value read, or malformed for a value the enum does not have. */
function named(
  read: NvmlRead,
  value: Observation<number>,
  names: Readonly<Record<number, string>>,
  what: string,
): Observation<string> {
  if (value.kind === "unknown") return value;
  const name = names[value.value];
  return name === undefined
    ? notSeen(read, "malformed", `${what} ${value.value} is not one NVML defines`)
    : seen(read, name);
}
