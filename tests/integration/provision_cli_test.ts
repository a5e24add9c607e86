/**
 * `vf provision` against a real `nats-server -js`: the run's streams and durables are created and listed,
 * a second provisioning changes nothing, a run provisioned as another flow type is refused with exit 2,
 * and an unreachable server or a missing run id is refused before anything is created.
 *
 * @module
 */

import assert from "node:assert/strict";
import { runCli } from "../../src/cli/main.ts";
import { startNatsServer } from "../support/services.ts";

const SQUARES = "tests/fixtures/flows/squares.ts";

/** Runs `vf` on `args` in this process; resolves with its exit code, stdout lines and stderr lines. */
async function vf(args: string[]): Promise<{ code: number; out: string[]; err: string[] }> {
  const out: string[] = [];
  const err: string[] = [];
  const code = await runCli(args, {
    out: (line) => out.push(line),
    err: (line) => err.push(line),
    write: (text) => out.push(text),
  });
  return { code, out, err };
}

Deno.test("vf provision creates a run's streams and durables, and a second one changes nothing", async () => {
  const nats = await startNatsServer();
  try {
    const first = await vf(["provision", SQUARES, "--run-id", "r1", "--nats", nats.url]);
    assert.equal(first.code, 0, first.err.join("\n"));
    assert.deepEqual(
      first.out.filter((line) => line.startsWith("stream ")).map((line) => line.split(" ")[1]),
      ["vf-squares-r1-count", "vf-squares-r1-square", "vf-squares-r1-sum", "vf-squares-r1-print"],
    );
    assert.ok(
      first.out.includes(
        "durable square--from--count: filter_subject=vf.squares.r1.count ack_policy=explicit ack_wait=60s " +
          "max_deliver=4 max_ack_pending=10",
      ),
      first.out.join("\n"),
    );
    assert.match(first.err.at(-1) ?? "", /provisioned on nats:\/\/127\.0\.0\.1:\d+: 4 streams, 8 durables$/);
    const again = await vf(["provision", SQUARES, "--run-id", "r1", "--nats", nats.url]);
    assert.equal(again.code, 0, again.err.join("\n"));
    assert.deepEqual(again.out, first.out);
    const realtime = await vf([
      "provision",
      SQUARES,
      "--run-id",
      "r1",
      "--nats",
      nats.url,
      "--flow-type",
      "realtime",
    ]);
    assert.equal(realtime.code, 2);
    assert.match(
      realtime.err.join("\n"),
      /VF_INCOMPATIBLE_PROFILE: stream vf-squares-r1-count exists with settings/,
    );
  } finally {
    await nats.stop();
  }
});

Deno.test("vf provision refuses an unreachable server (exit 3) and a missing run id (exit 2)", async () => {
  const unreachable = await vf(["provision", SQUARES, "--run-id", "r1", "--nats", "nats://127.0.0.1:9"]);
  assert.equal(unreachable.code, 3);
  assert.match(unreachable.err.join("\n"), /VF_BROKER_UNAVAILABLE: cannot reach the NATS server/);
  const noRun = await vf(["provision", SQUARES, "--nats", "nats://127.0.0.1:9"]);
  assert.equal(noRun.code, 2);
  assert.match(noRun.err.join("\n"), /pass --run-id ID/);
});
