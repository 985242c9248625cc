// The dashboard's HTTP server (node:http): the page, a small JSON API over the runs folder, and
// Server-Sent Events that tell the page what changed, so it updates without a reload.
//
// It binds to loopback unless told otherwise and answers only requests that carry its token (the
// `?token=` of the URL it prints, then a cookie the page keeps, or `Authorization: Bearer`): run
// directories hold prompts, transcripts and paths a person may not want to share with every local
// process or, with --host, the network.
import { randomBytes, timingSafeEqual } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { renderPage } from "./page.ts";
import { RunsFolder } from "./runs.ts";

export interface DashboardOptions {
  /** The runs folder. */
  root: string;
  host?: string;
  /** 0: any free port. */
  port?: number;
  /** Default: 32 random hex digits. */
  token?: string;
  /** How often the files are checked for changes (ms). */
  pollMs?: number;
}

export interface Dashboard {
  server: Server;
  /** The URL to open, token included. */
  url: string;
  host: string;
  port: number;
  token: string;
  close(): Promise<void>;
}

function sameToken(given: string | undefined, token: string): boolean {
  if (given === undefined) return false;
  const a = Buffer.from(given);
  const b = Buffer.from(token);
  return a.length === b.length && timingSafeEqual(a, b);
}

function cookie(req: IncomingMessage, name: string): string | undefined {
  for (const part of (req.headers.cookie ?? "").split(";")) {
    const eq = part.indexOf("=");
    if (eq > 0 && part.slice(0, eq).trim() === name) return decodeURIComponent(part.slice(eq + 1).trim());
  }
  return undefined;
}

interface Reply {
  status: number;
  type: string;
  body: string;
  headers?: Record<string, string>;
}

const text = (status: number, body: string): Reply => ({ status, type: "text/plain; charset=utf-8", body });
const json = (value: unknown): Reply => ({
  status: 200,
  type: "application/json; charset=utf-8",
  body: JSON.stringify(value),
});

function send(res: ServerResponse, r: Reply): void {
  res.writeHead(r.status, {
    "content-type": r.type,
    "cache-control": "no-store",
    "x-content-type-options": "nosniff",
    ...r.headers,
  });
  res.end(r.body);
}

export async function startDashboard(opts: DashboardOptions): Promise<Dashboard> {
  const host = opts.host ?? "127.0.0.1";
  const token = opts.token ?? randomBytes(16).toString("hex");
  const folder = new RunsFolder(opts.root);
  const page = renderPage({ mode: "live" });
  const clients = new Set<ServerResponse>();
  let cookieName = "marft_dashboard";

  const authorized = (req: IncomingMessage, url: URL): boolean => {
    const bearer = /^Bearer (.+)$/.exec(req.headers.authorization ?? "")?.[1];
    return [url.searchParams.get("token") ?? undefined, cookie(req, cookieName), bearer].some((t) =>
      sameToken(t, token),
    );
  };

  /** The answer to an authorized GET of `url` (the event stream aside). */
  const route = (url: URL): Reply => {
    const name = url.searchParams.get("name") ?? "";
    const run = () => folder.run(name);
    switch (url.pathname) {
      case "/":
        return {
          status: 200,
          type: "text/html; charset=utf-8",
          body: page.html,
          headers: {
            "set-cookie": `${cookieName}=${token}; Path=/; HttpOnly; SameSite=Strict`,
            "content-security-policy": page.csp,
          },
        };
      case "/api/runs":
        return json(folder.list());
      case "/api/run": {
        const from = Number(url.searchParams.get("from") ?? 0) || 0;
        return run() ? json(run()!.data(from)) : text(404, `404: no run "${name}"\n`);
      }
      case "/api/transcripts": {
        const iteration = Number(url.searchParams.get("iteration"));
        return run() ? json(run()!.transcriptsOf(iteration)) : text(404, `404: no run "${name}"\n`);
      }
      case "/api/compare": {
        const c = folder.compare(name);
        return c ? json(c) : text(404, `404: no compare result "${name}"\n`);
      }
      default:
        return text(404, `404: ${url.pathname}\n`);
    }
  };

  const handle = (req: IncomingMessage, res: ServerResponse): void => {
    const url = new URL(req.url ?? "/", "http://dashboard");
    if (!authorized(req, url)) {
      send(
        res,
        text(
          401,
          "401: this dashboard needs its token; open the URL that `marft dashboard` printed (.../?token=...)\n",
        ),
      );
    } else if (req.method !== "GET") {
      send(res, text(405, "405: GET only\n"));
    } else if (url.pathname === "/api/events") {
      res.writeHead(200, {
        "content-type": "text/event-stream",
        "cache-control": "no-store",
        connection: "keep-alive",
      });
      res.write("retry: 1000\n\n");
      clients.add(res);
      req.on("close", () => clients.delete(res));
    } else {
      send(res, route(url));
    }
  };

  const server = createServer((req, res) => {
    try {
      handle(req, res);
    } catch (e) {
      // a file that does not parse: say which, keep serving the rest
      if (!res.headersSent) send(res, text(500, `500: ${(e as Error).message}\n`));
      else res.end();
    }
  });

  // Watch the files while a page listens: one event per run whose files changed, one when the
  // listing (runs or compare results) changed.
  let last = folder.signatures();
  let beats = 0;
  const timer = setInterval(() => {
    if (clients.size === 0) return;
    let now: ReturnType<RunsFolder["signatures"]>;
    try {
      now = folder.signatures();
    } catch {
      return; // the folder is being changed under us; look again next time
    }
    const events: string[] = [];
    if (now.list !== last.list) events.push("event: runs\ndata: {}\n\n");
    for (const [name, sig] of now.runs) {
      if (last.runs.get(name) !== sig) events.push(`event: run\ndata: ${JSON.stringify({ name })}\n\n`);
    }
    if (++beats % 30 === 0) events.push(": keep-alive\n\n");
    last = now;
    for (const c of clients) for (const e of events) c.write(e);
  }, opts.pollMs ?? 500);

  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(opts.port ?? 0, host, () => resolve());
  });
  const port = (server.address() as AddressInfo).port;
  // cookies are per host, not per port: two dashboards on one machine keep their own
  cookieName = `marft_dashboard_${port}`;
  const shown = host.includes(":") ? `[${host}]` : host;
  return {
    server,
    url: `http://${shown}:${port}/?token=${token}`,
    host,
    port,
    token,
    close: () =>
      new Promise<void>((resolve) => {
        clearInterval(timer);
        for (const c of clients) c.end();
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}
