// The official MCP TypeScript SDK (pinned, installed by test_screen.py) driving `airlock mcp`
// over stdio through computer use: a session with a display, the screenshot and computer tools
// (their structuredContent checked by the SDK against each tool's outputSchema), and what the
// guest's input devices received. Prints one JSON object. Usage: node mcp_sdk_screen.mjs SDK_DIR
// AIRLOCK READER_SCRIPT [ARGS...]
import fs from "node:fs";
import path from "node:path";

const [sdkDir, airlock, readerPath, ...args] = process.argv.slice(2);
const esm = (p) => import(path.join(sdkDir, "node_modules/@modelcontextprotocol/sdk/dist/esm", p));
const { Client } = await esm("client/index.js");
const { StdioClientTransport } = await esm("client/stdio.js");

const transport = new StdioClientTransport({
  command: airlock,
  args: ["mcp", ...args],
  env: process.env,
  stderr: "inherit",
});
const client = new Client({ name: "airlock-screen-test", version: "1.0.0" });
await client.connect(transport);
const report = {};
const call = (name, a) =>
  client.callTool({ name, arguments: a }, undefined, { timeout: 600000 });
const text = (r) => r.content.filter((c) => c.type === "text").map((c) => c.text).join("\n");
const images = (r) =>
  r.content
    .filter((c) => c.type === "image")
    .map((c) => {
      const b = Buffer.from(c.data, "base64");
      return { mime: c.mimeType, magic: b.subarray(0, 8).toString("hex"),
               width: b.readUInt32BE(16), height: b.readUInt32BE(20) };
    });

const tools = await client.listTools();
report.tools = tools.tools.map((t) => t.name);
const plain = await call("start_session", {});
report.plain_screenshot = { isError: plain.isError ? false : (await call("screenshot", {
  session: plain.structuredContent.session })).isError };
const start = await call("start_session", { display: true });
const session = start.structuredContent.session;
const shot = await call("screenshot", { session });
report.screenshot = { isError: shot.isError, st: shot.structuredContent, images: images(shot) };
const small = await call("screenshot", { session, max_edge: 360 });
report.small = { st: small.structuredContent, images: images(small) };

// The guest's input reader, then actions in the small screenshot's pixels (its 2x2 blocks).
await call("write_file", { session, path: "/tmp/reader.py", content: fs.readFileSync(readerPath,
  "utf8") });
await call("start_process", { session, command: "python3 /tmp/reader.py" });
for (let i = 0; i < 100; i++) {
  const r = await call("run_command", { session, command: "head -n1 /tmp/ev.log 2>/dev/null" });
  if (text(r).includes("ready")) break;
  await new Promise((res) => setTimeout(res, 200));
}
const act = await call("computer", { session, actions: [
  { action: "left_click", coordinate: [180, 100] },
  { action: "type", text: "ok" },
] });
report.computer = { isError: act.isError, st: act.structuredContent, images: images(act),
                    text: text(act) };
const bad = await call("computer", { session, actions: [{ action: "left_click",
  coordinate: [360, 0] }] });
report.bad = { isError: bad.isError, text: text(bad) };
await new Promise((res) => setTimeout(res, 500));
const log = await call("run_command", { session, command: "tail -n +2 /tmp/ev.log" });
report.events = log.structuredContent.stdout;
// The desktop image's sessions have a display without asking for one; a size is asked for
// with display_width and display_height, and a bad one is a tool error before any boot.
const desk = await call("start_session", { image: "desktop", display_width: 1024,
                                           display_height: 768 });
const deskShot = await call("screenshot", { session: desk.structuredContent.session });
report.desktop = { isError: deskShot.isError, images: images(deskShot) };
const plainDesk = await call("start_session", { image: "desktop" });
const plainShot = await call("screenshot", { session: plainDesk.structuredContent.session });
report.desktop_default = { isError: plainShot.isError, images: images(plainShot) };
const badSize = await call("start_session", { display_width: 1000, display_height: 700 });
report.bad_size = { isError: badSize.isError, text: text(badSize) };
await client.close();
console.log(JSON.stringify(report));
