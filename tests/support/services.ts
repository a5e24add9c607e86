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
  /** `http://127.0.0.1:<port>` of its monitoring endpoints (`/varz`: bytes and messages in and out). */
  readonly monitorUrl: string;
  /** Where JetStream keeps its file storage. */
  readonly storeDir: string;
  /** Stops the server (resuming it first if paused; SIGTERM, then SIGKILL after 5 s) and removes its storage. Idempotent. */
  stop(): Promise<void>;
  /**
   * Freezes the server (SIGSTOP): its connections stay open and nothing is answered, what a stalled or
   * partitioned server looks like to its clients.
   */
  pause(): void;
  /** Lets a paused server go on (SIGCONT). */
  resume(): void;
  /**
   * Stops the server (SIGTERM, as an operator's restart does) and starts it again on the same port and
   * storage, resolving once it accepts connections.
   */
  restart(): Promise<void>;
  /** Kills the server and removes its storage at once, for an `unload` listener (which cannot wait). */
  killNow(): void;
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

/** Sends SIGCONT and SIGTERM, then SIGKILL if the process is still there after 5 s, and waits for it. */
async function terminate(child: Deno.ChildProcess): Promise<void> {
  try {
    child.kill("SIGCONT");
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
  const monitorPort = freePort();
  const storeDir = await Deno.makeTempDir({ prefix: "vf-nats-" });
  const logPath = `${storeDir}.log`;
  const log = await Deno.open(logPath, { write: true, create: true });
  const spawn = async (): Promise<Deno.ChildProcess> => {
    const started = new Deno.Command("nats-server", {
      args: ["-js", "-sd", storeDir, "-a", "127.0.0.1", "-p", String(port), "-m", String(monitorPort)],
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    started.stdout.pipeTo(log.writable, { preventClose: true }).catch(() => {});
    started.stderr.pipeTo(log.writable, { preventClose: true }).catch(() => {});
    try {
      await untilAccepting(port, READY_SECONDS, started.status);
    } catch (error) {
      await terminate(started);
      throw error;
    }
    return started;
  };
  let child = await spawn();
  let stopped = false;
  return {
    url: `nats://127.0.0.1:${port}`,
    port,
    monitorUrl: `http://127.0.0.1:${monitorPort}`,
    storeDir,
    async stop() {
      if (stopped) return;
      stopped = true;
      await terminate(child);
      log.close();
      await Deno.remove(storeDir, { recursive: true }).catch(() => {});
      await Deno.remove(logPath).catch(() => {});
    },
    pause: () => child.kill("SIGSTOP"),
    resume: () => child.kill("SIGCONT"),
    async restart() {
      await terminate(child);
      child = await spawn();
    },
    killNow() {
      if (stopped) return;
      stopped = true;
      child.kill("SIGKILL");
      log.close();
      Deno.removeSync(storeDir, { recursive: true });
      Deno.removeSync(logPath);
    },
  };
}

/** A server a test can freeze (SIGSTOP) and let go on. */
export interface Freezable {
  pause(): void;
  resume(): void;
}

/**
 * Freezes `server` for `seconds`, then lets it go on (also when the wait is cut short); `atFreeze` runs
 * first thing while it is frozen (what a test checks of that moment: nothing the server serves moves on).
 */
export async function freezeFor(
  server: Freezable,
  seconds: number,
  atFreeze: () => Promise<void>,
): Promise<void> {
  server.pause();
  try {
    await atFreeze();
    await new Promise((resolve) => setTimeout(resolve, seconds * 1000));
  } finally {
    server.resume();
  }
}

/** A running `redis-server` and the faults a test can put it through. */
export interface RedisServer {
  /** `redis://127.0.0.1:<port>`. */
  readonly url: string;
  /** The loopback port it listens on. */
  readonly port: number;
  /** The directory its append-only file is written to. */
  readonly dir: string;
  /** Freezes the process (SIGSTOP): connections stay open and nothing is answered. */
  pause(): void;
  /** Lets a paused process go on (SIGCONT). */
  resume(): void;
  /**
   * Stops the process (SIGTERM, which writes out the append-only file) and starts a new one on the same
   * port and directory, resolving once it answers PING: what a crashed-and-replaced server looks like.
   */
  restart(): Promise<void>;
  /** Stops the server (resuming it first if paused) and removes its directory. Idempotent. */
  stop(): Promise<void>;
  /** Kills the server and removes its directory at once, for an `unload` listener (which cannot wait). */
  killNow(): void;
}

/** What {@link startRedisServer} may add to the defaults. */
export interface RedisServerOptions {
  /** More `--name value` arguments, e.g. `["--maxmemory-policy", "allkeys-lru"]`. */
  readonly args?: readonly string[];
}

const START_LIMIT_MS = 10_000;
const START_ATTEMPTS = 3;

/** Whether a server on `port` answers PING with PONG. */
async function answersPing(port: number): Promise<boolean> {
  let connection: Deno.TcpConn | null = null;
  try {
    connection = await Deno.connect({ hostname: "127.0.0.1", port });
    await connection.write(new TextEncoder().encode("PING\r\n"));
    const reply = new Uint8Array(64);
    const read = await connection.read(reply);
    return read !== null && new TextDecoder().decode(reply.subarray(0, read)).startsWith("+PONG");
  } catch {
    return false;
  } finally {
    connection?.close();
  }
}

/** One `redis-server` process: its exit status and everything it wrote. */
interface RedisProcess {
  readonly child: Deno.ChildProcess;
  readonly status: Promise<Deno.CommandStatus>;
  readonly output: Promise<string>;
}

/** Spawns `redis-server` on `port` over `dir`; resolves once it answers PING, or to its output when it exited first. */
async function spawnRedis(
  port: number,
  dir: string,
  args: readonly string[],
): Promise<RedisProcess | string> {
  const child = new Deno.Command("redis-server", {
    args: [
      "--port",
      String(port),
      "--bind",
      "127.0.0.1",
      "--dir",
      dir,
      "--appendonly",
      "yes",
      "--appendfsync",
      "everysec",
      "--save",
      "",
      "--daemonize",
      "no",
      "--logfile",
      "",
      ...args,
    ],
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const output = Promise.all([
    new Response(child.stdout).text(),
    new Response(child.stderr).text(),
  ]).then((parts) => parts.join(""));
  let exited = false;
  const status = child.status.finally(() => exited = true);
  const limit = performance.now() + START_LIMIT_MS;
  while (!exited && performance.now() < limit && !(await answersPing(port))) {
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  if (!exited && await answersPing(port)) return { child, status, output };
  if (!exited) child.kill("SIGKILL");
  await status;
  return await output;
}

/** Signals `child`, unless it already exited. */
function signal(child: Deno.ChildProcess, name: Deno.Signal): void {
  try {
    child.kill(name);
  } catch (error) {
    if (!(error instanceof TypeError)) throw error;
  }
}

/** Ends `process` with SIGTERM (resuming it first if paused), which writes out its append-only file. */
async function terminateRedis(process: RedisProcess): Promise<void> {
  signal(process.child, "SIGCONT");
  signal(process.child, "SIGTERM");
  await process.status;
  await process.output;
}

/**
 * Starts `redis-server` with `--appendonly yes` (fsync every second), no RDB snapshots, its directory a
 * fresh temporary one, bound to 127.0.0.1 on a free port, and resolves once it answers PING. A port taken
 * between choosing and binding it is retried on another.
 */
export async function startRedisServer(options: RedisServerOptions = {}): Promise<RedisServer> {
  const args = options.args ?? [];
  let lastError = "";
  for (let attempt = 0; attempt < START_ATTEMPTS; attempt++) {
    const dir = await Deno.makeTempDir({ prefix: "vf-redis-" });
    const port = freePort();
    const started = await spawnRedis(port, dir, args);
    if (typeof started !== "string") return redisHandle(started, port, dir, args);
    lastError = started;
    await Deno.remove(dir, { recursive: true });
  }
  throw new Error(`redis-server did not start in ${START_ATTEMPTS} attempts:\n${lastError}`);
}

function redisHandle(first: RedisProcess, port: number, dir: string, args: readonly string[]): RedisServer {
  let current = first;
  let stopping: Promise<void> | null = null;
  return {
    url: `redis://127.0.0.1:${port}`,
    port,
    dir,
    pause: () => current.child.kill("SIGSTOP"),
    resume: () => current.child.kill("SIGCONT"),
    async restart() {
      await terminateRedis(current);
      const next = await spawnRedis(port, dir, args);
      if (typeof next === "string") throw new Error(`redis-server did not start again:\n${next}`);
      current = next;
    },
    killNow() {
      signal(current.child, "SIGKILL");
      Deno.removeSync(dir, { recursive: true });
    },
    stop() {
      stopping ??= (async () => {
        await terminateRedis(current);
        await Deno.remove(dir, { recursive: true });
      })();
      return stopping;
    },
  };
}
