/**
 * Real servers for tests that need a broker or a store: each starts on a free loopback port with its data in
 * a fresh temporary directory, is waited for until it accepts connections, and is stopped (and its
 * directory removed) by the handle it returns. Nothing here is a model: the tests that use these drive the
 * adapters against the very servers a deployment runs.
 *
 * @module
 */

import { connect } from "node:net";

/** A running `nats-server -js` this test started. */
export interface NatsServer {
  /** `nats://127.0.0.1:<port>`. */
  readonly url: string;
  readonly port: number;
  /** Where JetStream keeps its file storage (kept across {@link restart}). */
  readonly storeDir: string;
  /** Stops the server (SIGTERM, then SIGKILL after 5 s) and removes its storage. Idempotent. */
  stop(): Promise<void>;
  /** Stops the server and starts it again on the same port and storage; resolves once it accepts again. */
  restart(): Promise<void>;
}

/** How long a started server is given to accept its first connection. */
const READY_SECONDS = 15;

/** A loopback TCP port nothing listens on right now (the OS picks it). */
export function freePort(): number {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const { port } = listener.addr as Deno.NetAddr;
  listener.close();
  return port;
}

/** Resolves once `port` accepts a TCP connection, rejects after `seconds` or when `exited` settles first. */
async function untilAccepting(
  port: number,
  seconds: number,
  exited: Promise<Deno.CommandStatus>,
): Promise<void> {
  let gone = false;
  exited.then(() => gone = true);
  const until = performance.now() + seconds * 1000;
  while (performance.now() < until) {
    if (gone) throw new Error(`the server on port ${port} exited before accepting connections`);
    const open = await new Promise<boolean>((resolve) => {
      const socket = connect({ host: "127.0.0.1", port });
      socket.once("connect", () => {
        socket.destroy();
        resolve(true);
      });
      socket.once("error", () => resolve(false));
    });
    if (open) return;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error(`the server on port ${port} did not accept connections within ${seconds} s`);
}

/** Sends SIGTERM, then SIGKILL if the process is still there after 5 s, and waits for it. */
async function terminate(child: Deno.ChildProcess): Promise<void> {
  try {
    child.kill("SIGTERM");
  } catch {
    return;
  }
  const timer = setTimeout(() => {
    try {
      child.kill("SIGKILL");
    } catch {
      // already gone
    }
  }, 5000);
  await child.status;
  clearTimeout(timer);
}

/**
 * Starts `nats-server -js` on a free loopback port with file storage in a new temporary directory, and
 * resolves once it accepts connections. The server's output goes to `<storeDir>.log` so a failing test can
 * read it.
 */
export async function startNatsServer(): Promise<NatsServer> {
  const port = freePort();
  const storeDir = await Deno.makeTempDir({ prefix: "vf-nats-" });
  const logPath = `${storeDir}.log`;
  const spawn = async (): Promise<Deno.ChildProcess> => {
    const log = await Deno.open(logPath, { write: true, create: true, append: true });
    const child = new Deno.Command("nats-server", {
      args: ["-js", "-sd", storeDir, "-a", "127.0.0.1", "-p", String(port)],
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    child.stdout.pipeTo(log.writable, { preventClose: true }).catch(() => {});
    child.stderr.pipeTo(log.writable).catch(() => {});
    try {
      await untilAccepting(port, READY_SECONDS, child.status);
    } catch (error) {
      await terminate(child);
      throw error;
    }
    return child;
  };
  let child: Deno.ChildProcess | null = await spawn();
  let stopped = false;
  return {
    url: `nats://127.0.0.1:${port}`,
    port,
    storeDir,
    async stop() {
      if (stopped) return;
      stopped = true;
      if (child !== null) await terminate(child);
      child = null;
      await Deno.remove(storeDir, { recursive: true }).catch(() => {});
      await Deno.remove(logPath).catch(() => {});
    },
    async restart() {
      if (stopped) throw new Error("restart of a nats-server that was stopped");
      if (child !== null) await terminate(child);
      child = null;
      child = await spawn();
    },
  };
}
