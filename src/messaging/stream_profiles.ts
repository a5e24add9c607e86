/**
 * Explicit channel profiles bound to what the broker holds (spec messaging.topology `profile_mismatches`,
 * `verify_channel_profiles`; runtime.worker `verify_explicit_profiles`; story 42): the semantic half of a
 * read-back. A stream's fields can match what provisioning asked and still not carry the profile an
 * operator requires, and a stream nobody here provisioned can carry it with fields no request set, so the
 * check reads the effective configuration against the profile itself.
 *
 * @example
 * ```ts
 * profileMismatches("reliable_work", { retention: "limits", discard: "old" });
 * // ["retention: limits keeps nothing until it is acknowledged", "discard: old evicts …"]
 * ```
 *
 * @module
 */

import type { StreamConfig } from "@nats-io/jetstream";
import { MessagingProfile, type ProfileRequest } from "../backends/capabilities.ts";
import type { Observation } from "../backends/outcomes.ts";
import { BrokerUnavailable, IncompatibleProfile, UnobservableState } from "../core/errors.ts";

/** A stream's configuration as the server applies it (what `streams.info` reads back). */
export type EffectiveStream = Partial<StreamConfig>;

/**
 * The ways the effective stream `config` contradicts `profile`, each as `<field>: <value> <what it
 * means>`; empty when the stream carries it. `reliable_work` needs a retention that keeps a message until it
 * is acknowledged (interest or work queue) and discard `new` at the limit; `live_latest` needs limits
 * retention, discard `old` and a bound on the backlog. `durable_control` and `replay_archive` make no
 * stream-level promise on JetStream (admission refuses them first): no findings.
 */
export function profileMismatches(profile: MessagingProfile, config: EffectiveStream): string[] {
  const found: string[] = [];
  const retention = config.retention ?? "limits";
  const discard = config.discard ?? "old";
  switch (profile) {
    case MessagingProfile.reliableWork:
      if (retention !== "interest" && retention !== "workqueue") {
        found.push(`retention: ${retention} keeps nothing until it is acknowledged`);
      }
      if (discard !== "new") {
        found.push(`discard: ${discard} evicts unacknowledged messages from a full stream`);
      }
      break;
    case MessagingProfile.liveLatest: {
      if (retention !== "limits") {
        found.push(`retention: ${retention} keeps stale messages for slow consumers`);
      }
      if (discard !== "old") found.push(`discard: ${discard} refuses the freshest message on a full stream`);
      const bounded = [config.max_msgs, config.max_bytes, config.max_msgs_per_subject]
        .some((limit) => limit !== undefined && limit > 0) || (config.max_age ?? 0) > 0;
      if (!bounded) found.push("max_msgs, max_bytes, max_age: none set, so the backlog is unbounded");
      break;
    }
    case MessagingProfile.durableControl:
    case MessagingProfile.replayArchive:
      break;
  }
  return found;
}

/**
 * Binds `requests` to the streams read back in `readBack` (channel name → the stream's effective
 * configuration, or Unknown). Requests for channels not read back are not this caller's to judge.
 *
 * @throws IncompatibleProfile naming every stream that definitely does not carry its profile (exit 2);
 * BrokerUnavailable when a requested channel's stream does not exist (provisioning has not run, or ran for
 * another run id); UnobservableState when one could not be read (an explicit request does not pass on an
 * unread guarantee, exit 3).
 */
export function verifyChannelProfiles(
  readBack: ReadonlyMap<string, Observation<EffectiveStream>>,
  requests: readonly ProfileRequest[],
  where: string,
): void {
  const contradicted: string[] = [];
  const missing: string[] = [];
  const unread: string[] = [];
  for (const request of requests) {
    const observed = readBack.get(request.channel);
    if (observed === undefined) continue;
    if (observed.kind === "unknown") {
      const line = `channel ${request.channel} (${request.profile}): ${observed.detail || observed.reason}`;
      (observed.reason === "missing" ? missing : unread).push(line);
      continue;
    }
    const findings = profileMismatches(request.profile, observed.value);
    if (findings.length > 0) {
      contradicted.push(
        `channel ${request.channel} does not carry ${request.profile}: ${findings.join("; ")}`,
      );
    }
  }
  if (contradicted.length > 0) {
    throw new IncompatibleProfile(
      `${where}: ${contradicted.join("; ")}`,
      "provision the run's streams for the profiles required (or drop the requirement), then start it again",
      [],
      { requests: requests.map((r) => r.toDict()) },
    );
  }
  if (missing.length > 0) {
    throw new BrokerUnavailable(
      `${where}: the stream of a channel with a required profile does not exist: ${missing.join("; ")}`,
      "provision the run (vf provision) before its workers start, with the same flow and run id",
    );
  }
  if (unread.length > 0) {
    throw new UnobservableState(
      `${where}: a channel with a required profile could not be read back: ${unread.join("; ")}`,
      "make the NATS server reachable to this worker and start it again",
    );
  }
}
