// The official MCP TypeScript SDK (installed at test time by test_mcp.py) against airlockd's
// /mcp over Streamable HTTP, with an API key: two keys, each its own sessions. Prints one JSON
// object of what it saw. Usage: node mcp_sdk_http.mjs SDK_DIR URL KEY_A KEY_B
import path from "node:path";

const [sdkDir, url, keyA, keyB] = process.argv.slice(2);
const esm = (p) => import(path.join(sdkDir, "node_modules/@modelcontextprotocol/sdk/dist/esm", p));
const { Client } = await esm("client/index.js");
const { StreamableHTTPClientTransport } = await esm("client/streamableHttp.js");

async function connect(key) {
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { Authorization: "Bearer " + key } },
  });
  const client = new Client({ name: "airlock-http-test", version: "1.0.0" });
  await client.connect(transport);
  return { client, transport };
}

async function call(client, name, args, opts = {}) {
  const r = await client.callTool({ name, arguments: args }, undefined, { timeout: 600000, ...opts });
  const text = r.content.filter((c) => c.type === "text").map((c) => c.text).join("\n");
  return { ...r, text };
}

const report = {};
const a = await connect(keyA);
report.session_id = a.transport.sessionId ?? null;
report.protocol = a.transport.protocolVersion ?? null;
report.tools = (await a.client.listTools()).tools.map((t) => t.name);
let progress = 0;
const start = await call(a.client, "start_session", {}, { onprogress: () => progress++ });
const sid = start.structuredContent.session;
report.start = { session: sid, progress, isError: start.isError };
const run = await call(a.client, "run_code", { session: sid, language: "bash", code: "echo hello-$((6*7))" });
report.run = { stdout: run.structuredContent.stdout, exit_code: run.structuredContent.exit_code };
await call(a.client, "write_file", { session: sid, path: "f.txt", content: "über\n" });
const rd = await call(a.client, "read_file", { session: sid, path: "f.txt" });
report.file = rd.structuredContent.content;

// Another key: the same handle is no session of its.
const b = await connect(keyB);
const stolen = await call(b.client, "run_code", { session: sid, language: "bash", code: "echo pwned" });
const listB = await call(b.client, "list_sessions", {});
report.other_key = { isError: stolen.isError, text: stolen.text, sessions: listB.structuredContent.sessions.length };
// The same key on a second MCP session sees the first one's sandbox (they are the key's).
const a2 = await connect(keyA);
const listA2 = await call(a2.client, "list_sessions", {});
report.same_key_sessions = listA2.structuredContent.sessions.map((s) => s.session);

const stop = await call(a.client, "stop_session", { session: sid });
report.stopped = stop.structuredContent.stopped;
// DELETE ends the protocol session; its id is then unknown (404).
const oldId = a.transport.sessionId;
await a.transport.terminateSession();
const resp = await fetch(url, {
  method: "POST",
  headers: {
    Authorization: "Bearer " + keyA,
    "Content-Type": "application/json",
    Accept: "application/json, text/event-stream",
    "Mcp-Session-Id": oldId,
  },
  body: JSON.stringify({ jsonrpc: "2.0", id: 99, method: "tools/list" }),
});
const after = resp.status;
report.after_delete = after;
await b.client.close();
await a2.client.close();
console.log(JSON.stringify(report));
process.exit(0);
