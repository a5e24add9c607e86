import assert from "node:assert/strict";
import { UnobservableState } from "../../../src/core/errors.ts";
import { FakeClock } from "../../../src/backends/memory/clock.ts";
import {
  accepted,
  cleanupObservation,
  describeObservation,
  isKnown,
  known,
  mapKnown,
  match,
  type Observation,
  type PublicationOutcome,
  publicationUnknown,
  publicationUnresolvable,
  rejected,
  requireKnown,
  settleConfirmed,
  type SettleOutcome,
  settleStale,
  settleUnknown,
  unknown,
  UNKNOWN_REASONS,
} from "../../../src/backends/outcomes.ts";

Deno.test("known() and unknown() are stamped with the injected clock's monotonic time", () => {
  const clock = new FakeClock();
  const before = known(3, clock, "rv-7");
  clock.advance(2.5);
  const after = unknown("timeout", clock, "no answer in 2 s");
  assert.deepEqual(before, { kind: "known", value: 3, observedAt: 1000, generation: "rv-7" });
  assert.deepEqual(after, {
    kind: "unknown",
    reason: "timeout",
    observedAt: 1002.5,
    detail: "no answer in 2 s",
  });
  assert.equal(known("x", clock).generation, null);
  assert.equal(unknown("auth", clock).detail, "");
});

Deno.test("observations are frozen records", () => {
  const observation = known({ pending: 0 }, new FakeClock());
  assert.ok(Object.isFrozen(observation));
  assert.throws(() => {
    (observation as { observedAt: number }).observedAt = 0;
  }, TypeError);
  assert.ok(Object.isFrozen(unknown("unreachable", new FakeClock())));
});

Deno.test("match() takes the known branch with the value and the unknown branch with the reason", () => {
  const clock = new FakeClock();
  const branches = {
    known: (pending: number) => `pending=${pending}`,
    unknown: (why: { reason: string }) => `cannot tell: ${why.reason}`,
  };
  assert.equal(match(known(0, clock), branches), "pending=0");
  assert.equal(match<number, string>(unknown("timeout", clock), branches), "cannot tell: timeout");
});

Deno.test("isKnown() narrows, and a value cannot be read from an unnarrowed observation", () => {
  const clock = new FakeClock();
  const observations: Observation<number>[] = [known(5, clock), unknown("malformed", clock)];
  const values = observations.filter(isKnown).map((o) => o.value);
  assert.deepEqual(values, [5]);
  const either: Observation<number> = observations[1];
  // @ts-expect-error: Unknown has no value, so an Observation must be narrowed before reading one
  assert.equal(either.value, undefined);
});

Deno.test("mapKnown() keeps time and generation, and passes an Unknown through untouched", () => {
  const clock = new FakeClock();
  const seen = known(3, clock, "g1");
  clock.advance(10);
  const doubled = mapKnown(seen, (n) => n * 2);
  assert.deepEqual(doubled, { kind: "known", value: 6, observedAt: 1000, generation: "g1" });
  const missing = unknown("missing", clock, "no such stream");
  assert.equal(mapKnown(missing, (n: number) => n * 2), missing);
});

Deno.test("requireKnown() returns a known value, and throws UnobservableState naming the read and the reason", () => {
  const clock = new FakeClock();
  assert.equal(requireKnown(known(0, clock), "pending count"), 0);
  assert.throws(
    () => requireKnown(unknown("timeout", clock, "broker silent for 5 s"), "pending count"),
    (e: unknown) => {
      assert.ok(e instanceof UnobservableState);
      assert.equal(e.code, "VF_STATE_UNKNOWN");
      assert.match(e.message, /pending count could not be observed \(timeout: broker silent for 5 s\)/);
      assert.deepEqual(e.context, {
        what: "pending count",
        reason: "timeout",
        detail: "broker silent for 5 s",
      });
      assert.ok(e.remedy);
      return true;
    },
  );
});

Deno.test("requireKnown() never turns an Unknown of a falsy-looking value into a default", () => {
  const clock = new FakeClock();
  for (const reason of UNKNOWN_REASONS) {
    assert.throws(() => requireKnown<number>(unknown(reason, clock), "count"), UnobservableState);
  }
  assert.equal(requireKnown(known(false, clock), "flag"), false);
});

Deno.test("describeObservation() renders text for display, marking an Unknown as unknown", () => {
  const clock = new FakeClock();
  assert.equal(describeObservation(known({ a: 1 }, clock)), '{"a":1}');
  assert.equal(describeObservation(known(3, clock), (n) => `${n} GPUs`), "3 GPUs");
  assert.equal(describeObservation(unknown("auth", clock, "CONFIG denied")), "unknown (auth: CONFIG denied)");
  assert.equal(describeObservation(unknown("unsupported", clock)), "unknown (unsupported)");
});

function publicationLabel(outcome: PublicationOutcome): string {
  switch (outcome.kind) {
    case "accepted":
      return outcome.duplicate ? "deduplicated" : `stored at ${outcome.sequence}`;
    case "rejected":
      return outcome.retryable ? "retry later" : "refused";
    case "publication_unknown":
      return "maybe stored";
    case "publication_unresolvable":
      return "reconcile from intent";
  }
}

Deno.test("publication outcomes carry the spec's fields and are told apart by kind", () => {
  assert.deepEqual(accepted("p1", 42, false, "memory"), {
    kind: "accepted",
    publicationId: "p1",
    sequence: 42,
    duplicate: false,
    durabilityBoundary: "memory",
  });
  assert.deepEqual(rejected("p2", "too large", false), {
    kind: "rejected",
    publicationId: "p2",
    reason: "too large",
    retryable: false,
  });
  const labels = [
    accepted("p1", 42, false, "memory"),
    accepted("p1", 42, true, "memory"),
    rejected("p2", "throttled", true),
    publicationUnknown("p3", "deadline expired"),
    publicationUnresolvable("p4", "no publication ledger"),
  ].map(publicationLabel);
  assert.deepEqual(labels, [
    "stored at 42",
    "deduplicated",
    "retry later",
    "maybe stored",
    "reconcile from intent",
  ]);
});

Deno.test("a switch over publication outcomes that forgets the unknown cases does not compile", () => {
  function forgetful(outcome: PublicationOutcome): string {
    switch (outcome.kind) {
      case "accepted":
      case "rejected":
        return outcome.kind;
      default: {
        // @ts-expect-error: publication_unknown and publication_unresolvable are left unhandled
        const unhandled: never = outcome;
        return String(unhandled);
      }
    }
  }
  assert.equal(forgetful(publicationUnknown("p", "lost")), "[object Object]");
});

Deno.test("settlement outcomes keep the delivery token they settle", () => {
  const token = { messageId: "m-1", attempt: 2 };
  const outcomes: SettleOutcome<typeof token>[] = [
    settleConfirmed(token, "s-1"),
    settleUnknown(token, "ack reply lost"),
    settleStale(token, 3, "g-9"),
  ];
  assert.deepEqual(outcomes.map((o) => o.kind), ["settle_confirmed", "settle_unknown", "settle_stale"]);
  assert.ok(outcomes.every((o) => o.token === token));
  assert.deepEqual(outcomes[2], {
    kind: "settle_stale",
    token,
    currentAttempt: 3,
    currentGeneration: "g-9",
  });
});

Deno.test("a cleanup is complete only when nothing remains, and its lists are copied and frozen", () => {
  const removed = ["stream-a"];
  const done = cleanupObservation(true, removed, []);
  removed.push("stream-b");
  assert.deepEqual(done, { complete: true, removed: ["stream-a"], remaining: [], reason: "" });
  assert.ok(Object.isFrozen(done.removed));
  const listingFailed = cleanupObservation(false, [], [], "stream listing refused");
  assert.equal(listingFailed.complete, false);
  assert.equal(listingFailed.reason, "stream listing refused");
  assert.throws(() => cleanupObservation(true, [], ["consumer-x"]), RangeError);
});
