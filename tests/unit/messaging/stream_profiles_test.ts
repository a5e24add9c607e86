import assert from "node:assert/strict";
import { ProfileRequest } from "../../../src/backends/capabilities.ts";
import { known, unknown } from "../../../src/backends/outcomes.ts";
import { BrokerUnavailable, IncompatibleProfile, UnobservableState } from "../../../src/core/errors.ts";
import {
  type EffectiveStream,
  profileMismatches,
  verifyChannelProfiles,
} from "../../../src/messaging/stream_profiles.ts";

const WORK: EffectiveStream = { retention: "interest", discard: "new", max_msgs: 10_000 };
const LIVE: EffectiveStream = { retention: "limits", discard: "old", max_msgs: 2 };

Deno.test("reliable_work is carried by an interest or work-queue stream that refuses when full, and by nothing else", () => {
  assert.deepEqual(profileMismatches("reliable_work", WORK), []);
  assert.deepEqual(profileMismatches("reliable_work", { ...WORK, retention: "workqueue" }), []);
  const findings = profileMismatches("reliable_work", LIVE);
  assert.equal(findings.length, 2);
  assert.match(findings[0], /^retention: limits/);
  assert.match(findings[1], /^discard: old evicts unacknowledged/);
  // A field the server left out of its read-back is its default: limits retention, discard old.
  assert.equal(profileMismatches("reliable_work", {}).length, 2);
});

Deno.test("live_latest needs limits retention, discard old and some bound on the backlog", () => {
  assert.deepEqual(profileMismatches("live_latest", LIVE), []);
  assert.deepEqual(
    profileMismatches("live_latest", { retention: "limits", discard: "old", max_age: 5e9 }),
    [],
  );
  assert.deepEqual(profileMismatches("live_latest", { ...LIVE, max_msgs: -1, max_msgs_per_subject: 1 }), []);
  assert.deepEqual(
    profileMismatches("live_latest", { retention: "limits", discard: "old", max_msgs: -1, max_bytes: -1 }),
    ["max_msgs, max_bytes, max_age: none set, so the backlog is unbounded"],
  );
  assert.equal(profileMismatches("live_latest", WORK).length, 2);
  assert.deepEqual(profileMismatches("durable_control", LIVE), []);
  assert.deepEqual(profileMismatches("replay_archive", WORK), []);
});

Deno.test("explicit profiles bind only the channels read back: a contradiction is IncompatibleProfile (2), a missing stream BrokerUnavailable (3), an unread one UnobservableState (3)", () => {
  const work = new ProfileRequest("cam", "reliable_work");
  const other = new ProfileRequest("elsewhere", "reliable_work");
  verifyChannelProfiles(new Map([["cam", known(WORK)]]), [work, other], "worker w");
  assert.throws(
    () => verifyChannelProfiles(new Map([["cam", known(LIVE)]]), [work], "worker w"),
    (error: unknown) =>
      error instanceof IncompatibleProfile && error.exitCode === 2 &&
      /^worker w: channel cam does not carry reliable_work: retention: limits/.test(error.message),
  );
  assert.throws(
    () => verifyChannelProfiles(new Map([["cam", unknown("missing", undefined, "no stream")]]), [work], "w"),
    (error: unknown) => error instanceof BrokerUnavailable && error.exitCode === 3,
  );
  assert.throws(
    () => verifyChannelProfiles(new Map([["cam", unknown("timeout", undefined, "slow")]]), [work], "w"),
    (error: unknown) =>
      error instanceof UnobservableState && error.exitCode === 3 && /slow/.test(error.message),
  );
});
