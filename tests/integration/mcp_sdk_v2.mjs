// The MCP client of the TypeScript SDK's v2 (@modelcontextprotocol/client, installed at test time
// by test_mcp.py), pinned to the 2026-07-28 generation (server/discover, no initialize, the
// version in each request), over stdio against `airlock mcp` and over Streamable HTTP against
// airlockd's /mcp. Prints one JSON object. Usage: node mcp_sdk_v2.mjs DIR AIRLOCK URL KEY
import path from "node:path";

const [dir, airlock, url, key] = process.argv.slice(2);
const dist = path.join(dir, "node_modules/@modelcontextprotocol/client/dist");
const { Client, StreamableHTTPClientTransport } = await import(path.join(dist, "index.mjs"));
const { StdioClientTransport } = await import(path.join(dist, "stdio.mjs"));

async function story(transport) {
  const c = new Client(
    { name: "airlock-v2-test", version: "1.0.0" },
    { versionNegotiation: { mode: { pin: "2026-07-28" } } },
  );
  await c.connect(transport);
  const out = { version: c.getNegotiatedProtocolVersion?.() ?? null };
  out.tools = (await c.listTools()).tools.map((t) => t.name);
  let progress = 0;
  const start = await c.callTool({ name: "start_session", arguments: {} }, { timeout: 600000, onprogress: () => progress++ });
  const session = start.structuredContent.session;
  out.progress = progress;
  const run = await c.callTool({ name: "run_code", arguments: { session, language: "bash", code: "echo v2-$((40+2))" } }, { timeout: 600000 });
  out.stdout = run.structuredContent.stdout;
  out.isError = run.isError;
  const bad = await c.callTool({ name: "run_code", arguments: { session: "sb_nope", code: "1" } });
  out.bad = bad.isError;
  const stop = await c.callTool({ name: "stop_session", arguments: { session } });
  out.stopped = stop.structuredContent.stopped;
  await c.close();
  return out;
}

const report = {};
report.stdio = await story(new StdioClientTransport({ command: airlock, args: ["mcp"], env: process.env, stderr: "inherit" }));
report.http = await story(new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: "Bearer " + key } },
}));
console.log(JSON.stringify(report));
process.exit(0);
