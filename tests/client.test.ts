import { spawn } from "node:child_process";
import { chmodSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { EngineClient, EngineError } from "../src/client/client.ts";
import { connectEngine, engineAllocatorEnv, startLocalEngine } from "../src/client/launcher.ts";
import { createPolicy, createTinyBase, useEngine } from "./helpers/engine.ts";

const eng = useEngine();
const tmp = mkdtempSync(join(tmpdir(), "marft-client-test-"));

async function caught(p: Promise<unknown>): Promise<EngineError> {
  try {
    await p;
  } catch (e) {
    expect(e).toBeInstanceOf(EngineError);
    return e as EngineError;
  }
  throw new Error("expected an EngineError");
}

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

async function waitDead(pid: number, ms = 15_000): Promise<boolean> {
  const t0 = Date.now();
  while (Date.now() - t0 < ms) {
    if (!alive(pid)) return true;
    await new Promise((r) => setTimeout(r, 100));
  }
  return false;
}

describe("EngineClient against a real engine", () => {
  it("creates a base and an adapter and samples token ids with log-probs", async () => {
    const c = eng.client;
    expect((await c.health()).status).toBe("ok");
    const base = await createTinyBase(c);
    expect(base.vocab_size).toBeGreaterThan(0);
    const ad = await createPolicy(c, "p");
    expect(ad.version).toBe(0);
    expect((await c.listAdapters()).adapters.map((a) => a.name)).toContain("p");
    const res = await c.sample({
      requests: [
        { adapter: "p", messages: [{ role: "user", content: "hi" }], sampling: { max_new_tokens: 4, n: 2 } },
      ],
      seed: 3,
    });
    expect(res.results).toHaveLength(1);
    const r = res.results[0]!;
    expect(r.adapter_version).toBe(0);
    expect(r.prompt_ids.length).toBeGreaterThan(0);
    expect(r.completions).toHaveLength(2);
    for (const comp of r.completions) {
      expect(comp.logprobs).toHaveLength(comp.response_ids.length);
      for (const lp of comp.logprobs) expect(lp).toBeLessThanOrEqual(0);
    }
    const stats = await c.stats();
    expect(stats.tokens_sampled).toBeGreaterThan(0);
  });

  it("surfaces engine errors as EngineError with the status and the engine's message", async () => {
    const c = eng.client;
    const missing = await caught(c.createAdapter({ name: "q", base: "no-such-base" }));
    expect(missing.status).toBe(404);
    expect(missing.kind).toBe("not_found");
    expect(missing.engineMessage).toContain("no-such-base");
    const bad = await caught(
      c.sample({
        requests: [{ adapter: "p", messages: [{ role: "user", content: "x" }], sampling: { top_p: 2 } }],
      }),
    );
    expect(bad.status).toBe(422);
    expect(bad.engineMessage).toContain("requests[0].sampling.top_p");
    expect(bad.message).toContain("POST /v1/sample");
    const wrongToken = new EngineClient({ url: eng.engine.url, token: "wrong" });
    expect((await caught(wrongToken.health())).status).toBe(401);
  });

  it("connects to a running engine as a remote one without spawning", async () => {
    const remote = await connectEngine({ url: eng.engine.url, token: eng.engine.token });
    expect(remote.process).toBeNull();
    expect((await remote.client.listBases()).bases.map((b) => b.name)).toContain("tiny");
    await remote.stop();
    expect((await eng.client.health()).status).toBe("ok");
  });
});

/** A fake server to produce connection failures: `mode` decides what it does with each request. */
async function fakeServer(
  mode: "reset" | "500",
): Promise<{ server: Server; url: string; hits: () => number }> {
  let hits = 0;
  const server = createServer((req, res) => {
    hits++;
    if (mode === "reset") req.socket.destroy();
    else {
      res.writeHead(500, { "content-type": "application/json" });
      res.end(JSON.stringify({ error: "internal", message: "boom" }));
    }
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const port = (server.address() as AddressInfo).port;
  return { server, url: `http://127.0.0.1:${port}`, hits: () => hits };
}

describe("EngineClient retries", () => {
  it("retries any call while the connection is refused, until the engine listens", async () => {
    const probe = await fakeServer("500");
    const port = Number(new URL(probe.url).port);
    await new Promise((r) => probe.server.close(r));
    const late = createServer((_req, res) => {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ adapter: "p", version: 1, grad_norm: 0, lr: 1 }));
    });
    setTimeout(() => late.listen(port, "127.0.0.1"), 150);
    const c = new EngineClient({ url: probe.url, token: "t", retries: 6, backoffMs: 50 });
    // optim_step is not idempotent, but a refused connection never reached anybody.
    expect((await c.optimStep({ adapter: "p" })).version).toBe(1);
    await new Promise((r) => late.close(r));
  });

  it("re-sends an idempotent call after a reset connection, never a non-idempotent one", async () => {
    const f = await fakeServer("reset");
    const c = new EngineClient({ url: f.url, token: "t", retries: 2, backoffMs: 10 });
    const e1 = await caught(c.sample({ requests: [{ adapter: "p", prompt_ids: [1, 2] }] }));
    expect(e1.kind).toBe("connection");
    expect(f.hits()).toBe(3);
    const e2 = await caught(c.forwardBackward({ adapter: "p", loss: "ppo", data: [{ tokens: [1, 2] }] }));
    expect(e2.engineMessage).toContain("not retried");
    expect(f.hits()).toBe(4);
    await new Promise((r) => f.server.close(r));
  });

  it("never retries an HTTP error, and times out", async () => {
    const f = await fakeServer("500");
    const c = new EngineClient({ url: f.url, token: "t", retries: 3, backoffMs: 10 });
    const e = await caught(c.health());
    expect(e.status).toBe(500);
    expect(e.engineMessage).toBe("boom");
    expect(f.hits()).toBe(1);
    await new Promise((r) => f.server.close(r));
    const slow = createServer(() => {}); // never answers
    await new Promise<void>((r) => slow.listen(0, "127.0.0.1", r));
    const s = new EngineClient({
      url: `http://127.0.0.1:${(slow.address() as AddressInfo).port}`,
      token: "t",
    });
    const t = await caught(s.health({ timeoutMs: 200 }));
    expect(t.kind).toBe("timeout");
    slow.closeAllConnections();
    await new Promise((r) => slow.close(r));
  });
});

describe("launcher", () => {
  it("stop() ends the engine process", async () => {
    // The shared engine of this file, in its last use: stopping it saves starting another one.
    const e = eng.engine;
    const pid = e.process!.pid!;
    expect((await e.client.health()).status).toBe("ok");
    // tcmalloc is in the engine process where `make setup` fetched it (engineAllocatorEnv), and the
    // engine's log names the allocator it runs on
    const preload = "LD_PRELOAD" in engineAllocatorEnv();
    expect(readFileSync(`/proc/${pid}/maps`, "utf8").includes("libtcmalloc_minimal")).toBe(preload);
    expect(readFileSync(eng.logFile, "utf8")).toContain(
      `memory allocator: ${preload ? "tcmalloc" : "the C library's malloc"}`,
    );
    await e.stop();
    expect(alive(pid)).toBe(false);
    expect((await caught(e.client.health({ timeoutMs: 2000 }))).kind).toBe("connection");
  });

  it("preloads tcmalloc from the model cache unless told not to", () => {
    const cache = mkdtempSync(join(tmpdir(), "marft-cache-"));
    const env = { MARFT_CACHE_DIR: cache, LD_PRELOAD: "/lib/other.so" };
    expect(engineAllocatorEnv(env)).toEqual({}); // not fetched: glibc's malloc
    mkdirSync(join(cache, "tcmalloc"));
    const lib = join(cache, "tcmalloc", "libtcmalloc_minimal.so.4");
    writeFileSync(lib, "");
    expect(engineAllocatorEnv(env).LD_PRELOAD).toBe(`${lib}:/lib/other.so`);
    expect(engineAllocatorEnv({ MARFT_CACHE_DIR: cache }).LD_PRELOAD).toBe(lib);
    expect(engineAllocatorEnv({ ...env, MARFT_ALLOCATOR: "system" })).toEqual({});
  });

  it("an engine that crashes at start gives an error with the log tail", async () => {
    const fake = join(tmp, "fake-python.sh");
    writeFileSync(fake, "#!/bin/sh\necho 'Traceback: model weights missing at /nowhere' >&2\nexit 3\n");
    chmodSync(fake, 0o755);
    await expect(startLocalEngine({ python: fake, logFile: join(tmp, "crash.log") })).rejects.toThrow(
      /exited before it was ready \(exit code 3\)[\s\S]*model weights missing/,
    );
  });

  /**
   * A stand-in engine process for the exit-hook tests: it speaks the launcher's protocol (ready line,
   * bearer-checked /v1/health) but, unlike the real engine, has no --parent-pid watch, so only the
   * launcher's hooks can stop it (with the real engine the watch would hide a broken hook), and it
   * starts in milliseconds.
   */
  const standIn = join(tmp, "stand-in-engine.py");
  writeFileSync(
    standIn,
    `#!/usr/bin/env python3
import http.server, json, os, sys
token = os.environ["MARFT_ENGINE_TOKEN"]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.headers.get("authorization") == "Bearer " + token
        body = json.dumps({"status": "ok", "version": "0", "device": "cpu"} if ok else {"error": "unauthorized", "message": "token"}).encode()
        self.send_response(200 if ok else 401)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
s = http.server.HTTPServer(("127.0.0.1", 0), H)
print(json.dumps({"event": "ready", "url": "http://127.0.0.1:%d" % s.server_port}), flush=True)
s.serve_forever()
`,
  );
  chmodSync(standIn, 0o755);

  // A failing hook test must not leave stand-ins running (they have no parent watch).
  const standIns: number[] = [];
  afterAll(() => {
    for (const pid of standIns) if (alive(pid)) process.kill(pid, "SIGKILL");
  });

  /** Runs a script that starts a (stand-in) engine, prints its pid, then does `then`. */
  async function inChild(name: string, then: string, python = standIn) {
    const script = join(tmp, `${name}.mts`);
    const launcher = join(process.cwd(), "src/client/launcher.ts");
    writeFileSync(
      script,
      `import { startLocalEngine } from ${JSON.stringify(launcher)};\n` +
        `const e = await startLocalEngine({ python: ${JSON.stringify(python)}, logFile: ${JSON.stringify(join(tmp, `${name}.log`))} });\n` +
        "console.log(String(e.process.pid));\n" +
        then,
    );
    const child = spawn(join(process.cwd(), "node_modules/.bin/tsx"), [script], {
      stdio: ["ignore", "pipe", "pipe"],
    });
    let out = "";
    child.stdout.on("data", (d) => {
      out += d;
    });
    const [code, signal] = await new Promise<[number | null, string | null]>((r) =>
      child.on("exit", (c, s) => r([c, s])),
    );
    const pid = Number(out.trim().split("\n")[0]);
    if (pid > 0) standIns.push(pid);
    return { code, signal, lines: out.trim().split("\n"), pid };
  }

  it("stop() waits for an engine slower to exit than the grace period, and the program goes on", async () => {
    // An engine that ignores SIGTERM is killed after the grace period; the program must still be
    // there when stop() returns (it used to exit with code 13 mid-demo: nothing kept Node alive).
    const stubborn = join(tmp, "stubborn-engine.py");
    writeFileSync(
      stubborn,
      readFileSync(standIn, "utf8").replace(
        "import http.server, json, os, sys",
        "import http.server, json, os, signal, sys\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)",
      ),
    );
    chmodSync(stubborn, 0o755);
    const r = await inChild("slow-exit", 'await e.stop(300);\nconsole.log("after stop");\n', stubborn);
    expect(r.code).toBe(0);
    expect(r.lines[1]).toBe("after stop");
    expect(alive(r.pid)).toBe(false);
  });

  it("the engine is stopped when the program dies of an uncaught exception", async () => {
    const r = await inChild("crashing", 'setTimeout(() => { throw new Error("crash"); }, 50);\n');
    expect(r.code).not.toBe(0);
    expect(r.pid).toBeGreaterThan(0);
    expect(await waitDead(r.pid)).toBe(true);
  });

  it("Ctrl-C: with the program's own handler the engine serves until the program exits; without, both stop", async () => {
    // The trainer's case: its SIGINT handler still reaches the engine (to save a checkpoint).
    const own = await inChild(
      "own-handler",
      'process.on("SIGINT", async () => { console.log((await e.client.health()).status); process.exit(0); });\n' +
        'process.kill(process.pid, "SIGINT");\nsetInterval(() => {}, 1000);\n',
    );
    expect(own.code).toBe(0);
    expect(own.lines[1]).toBe("ok");
    expect(await waitDead(own.pid)).toBe(true);
    // No handler: Node's default (die of SIGINT), and the engine goes with it.
    const plain = await inChild(
      "no-handler",
      'process.kill(process.pid, "SIGINT");\nsetInterval(() => {}, 1000);\n',
    );
    // (tsx relays the child's death by SIGINT as exit code 130.)
    expect(plain.signal === "SIGINT" || plain.code === 130).toBe(true);
    expect(await waitDead(plain.pid)).toBe(true);
  });
});
