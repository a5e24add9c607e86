/**
 * Real servers for the tests that need them, each on a free loopback port with its state in a fresh
 * temporary directory, stopped (and the directory removed) by the handle's `stop()`.
 *
 * @module
 */

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

/** A loopback port nothing listened on a moment ago. */
function freePort(): number {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  listener.close();
  return port;
}

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
async function terminate(process: RedisProcess): Promise<void> {
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
      await terminate(current);
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
        await terminate(current);
        await Deno.remove(dir, { recursive: true });
      })();
      return stopping;
    },
  };
}
