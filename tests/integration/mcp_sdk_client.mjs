// The official MCP TypeScript SDK (installed at test time, pinned, by test_mcp.py) driving
// `airlock mcp` over stdio as an agent would. It records what it saw and prints one JSON object;
// test_mcp.py asserts on it. Usage: node mcp_sdk_client.mjs SDK_DIR AIRLOCK [ARGS...]
import path from "node:path";

const [sdkDir, airlock, ...args] = process.argv.slice(2);
const esm = (p) => import(path.join(sdkDir, "node_modules/@modelcontextprotocol/sdk/dist/esm", p));
const { Client } = await esm("client/index.js");
const { StdioClientTransport } = await esm("client/stdio.js");
const { LATEST_PROTOCOL_VERSION } = await esm("types.js");

const report = { sdk_latest: LATEST_PROTOCOL_VERSION, steps: {} };
const transport = new StdioClientTransport({
  command: airlock,
  args: ["mcp", ...args],
  env: process.env,
  stderr: "inherit",
});
const client = new Client({ name: "airlock-test", version: "1.0.0" });
await client.connect(transport);
report.server = client.getServerVersion();
report.protocol = transport._protocolVersion ?? null;
report.capabilities = client.getServerCapabilities();

const tools = await client.listTools();
report.tools = tools.tools.map((t) => t.name);
report.annotations = Object.fromEntries(tools.tools.map((t) => [t.name, t.annotations]));

// Each call's result is validated by the SDK against the tool's outputSchema (ajv): a result
// that does not match throws here.
async function call(name, args, opts = {}) {
  const r = await client.callTool({ name, arguments: args }, undefined, {
    timeout: 600000,
    ...opts,
  });
  const text = r.content.filter((c) => c.type === "text").map((c) => c.text).join("\n");
  return { ...r, text };
}

let progress = 0;
const t0 = Date.now();
const start = await call("start_session", {}, { onprogress: () => progress++ });
report.steps.start = {
  ms: Date.now() - t0,
  progress,
  session: start.structuredContent?.session,
  isError: start.isError,
  text: start.text,
};
const session = start.structuredContent.session;

const a = await call("run_code", { session, code: "x = 41\nprint('set')" });
const b = await call("run_code", { session, code: "x + 1" });
report.steps.state = {
  first: a.text,
  value: b.structuredContent.results.find((r) => r.kind === "value")?.data?.["text/plain"],
  text: b.text,
  exit_code: b.structuredContent.exit_code,
};

const fig = await call("run_code", {
  session,
  code:
    "import matplotlib.pyplot as plt\n" +
    "plt.figure(figsize=(20, 10), dpi=100)\nplt.plot([1, 3, 2])\nplt.show()",
});
const img = fig.content.find((c) => c.type === "image");
let png = null;
if (img) {
  const buf = Buffer.from(img.data, "base64");
  png = {
    mimeType: img.mimeType,
    magic: buf.subarray(0, 8).toString("hex"),
    width: buf.readUInt32BE(16),
    height: buf.readUInt32BE(20),
  };
}
report.steps.figure = { png, images: fig.structuredContent.images, isError: fig.isError };

const err = await call("run_code", { session, code: "1/0" });
report.steps.raise = {
  isError: err.isError,
  name: err.structuredContent?.error?.name,
  text: err.text,
};

const content = "héllo wörld\nline 2\n";
const w = await call("write_file", { session, path: "notes/hello.txt", content });
const r = await call("read_file", { session, path: "/workspace/notes/hello.txt" });
const bin = Buffer.from([0, 1, 2, 255, 254, 10, 13]).toString("base64");
await call("write_file", { session, path: "blob.bin", content: bin, encoding: "base64" });
const rb = await call("read_file", { session, path: "blob.bin" });
const ls = await call("list_files", { session });
report.steps.files = {
  written: w.structuredContent.bytes,
  same: r.structuredContent.content === content,
  encoding: r.structuredContent.encoding,
  binary_same: rb.structuredContent.content === bin && rb.structuredContent.encoding === "base64",
  names: ls.structuredContent.entries.map((e) => e.name),
};

const cp = await call("checkpoint", { session, name: "before-rm" });
const rm = await call("run_command", { session, command: "rm -rf /workspace/notes && ls /workspace" });
const gone = await call("read_file", { session, path: "notes/hello.txt" });
const rb2 = await call("rollback", { session, checkpoint: cp.structuredContent.checkpoint });
const back = await call("read_file", { session, path: "notes/hello.txt" });
const cps = await call("list_checkpoints", { session });
report.steps.rollback = {
  checkpoint: cp.structuredContent,
  rm_exit: rm.structuredContent.exit_code,
  gone_isError: gone.isError,
  rollback_isError: rb2.isError,
  back_same: back.structuredContent?.content === content,
  checkpoints: cps.structuredContent.checkpoints.map((c) => c.name),
};

// Cancel a long run: the SDK sends notifications/cancelled; the server interrupts the guest
// run (SIGINT: the kernel and its state survive).
await call("run_code", { session, code: "y = 7" });
const ac = new AbortController();
const long = call("run_code", { session, code: "import time\ntime.sleep(120)\nprint('slept')" }, {
  signal: ac.signal,
});
await new Promise((res) => setTimeout(res, 3000));
const tAbort = Date.now();
ac.abort("test");
let abortError = null;
try {
  await long;
} catch (e) {
  abortError = String(e);
}
let endedMs = null;
for (let i = 0; i < 100; i++) {
  const ps = await call("list_processes", { session });
  const run = ps.structuredContent.processes.find((p) => p.command.startsWith("import time"));
  if (run && run.state === "done") {
    endedMs = Date.now() - tAbort;
    break;
  }
  await new Promise((res) => setTimeout(res, 100));
}
const after = await call("run_code", { session, code: "y * 6" });
report.steps.cancel = {
  abortError,
  ended_ms: endedMs,
  kept_state: after.structuredContent.results.find((r) => r.kind === "value")?.data?.["text/plain"],
};

// Many at once: a server in the background while commands run against it.
const srv = await call("start_process", {
  session,
  command: "exec python3 -m http.server 8123 --bind 127.0.0.1",
});
const proc = srv.structuredContent.process;
let curl = null;
for (let i = 0; i < 40; i++) {
  curl = await call("run_command", {
    session,
    command: "python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:8123/').status)\"",
    timeout_s: 20,
  });
  if (curl.structuredContent.exit_code === 0) break;
  await new Promise((res) => setTimeout(res, 250));
}
const out = await call("process_output", { process: proc, wait_s: 2 });
const killed = await call("kill_process", { process: proc });
const after_kill = await call("run_command", {
  session,
  command: "python3 -c \"import urllib.request as u; u.urlopen('http://127.0.0.1:8123/')\"",
  timeout_s: 20,
});
report.steps.process = {
  curl: curl.text,
  curl_exit: curl.structuredContent.exit_code,
  log: out.structuredContent.stderr,
  killed_state: killed.structuredContent.state,
  after_kill_exit: after_kill.structuredContent.exit_code,
};

// A run that outlives its call (wait_s) and is picked up later.
const bg = await call("run_code", {
  session,
  code: "import time\nfor i in range(4):\n    print('step', i, flush=True)\n    time.sleep(1)",
  wait_s: 1,
});
const bgId = bg.structuredContent.run;
let picked = null;
for (let i = 0; i < 10; i++) {
  picked = await call("run_output", { run: bgId, wait_s: 5 });
  if (picked.structuredContent.state === "done") break;
}
report.steps.wait = {
  first_state: bg.structuredContent.state,
  final_state: picked.structuredContent.state,
  stdout: picked.structuredContent.stdout,
};

// Errors: a bad handle is a tool error, an unknown tool a JSON-RPC one.
const bad = await call("run_code", { session: "sb_0000", code: "1" });
let unknown = null;
try {
  await call("no_such_tool", {});
} catch (e) {
  unknown = { code: e.code, message: e.message };
}
report.steps.errors = { bad_isError: bad.isError, bad_text: bad.text, unknown };

const resources = await client.listResources();
const hello = resources.resources.find((x) => x.name === "notes/hello.txt");
let resource_text = null;
if (hello) {
  const rr = await client.readResource({ uri: hello.uri });
  resource_text = rr.contents[0].text;
}
report.steps.resources = { names: resources.resources.map((x) => x.name), text: resource_text };

report.session = session;
await client.close();
console.log(JSON.stringify(report));
