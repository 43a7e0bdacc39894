#!/usr/bin/env node
// A raw terminal into an allocation over /ws/terminal/{id}, with the `ws` package
// (npm install ws). Keystrokes go out as binary frames; the shell's output is written to
// stdout; JSON control frames (session_ready, exit, error) go to stderr.
//
//   node scripts/terminal.mjs ws://127.0.0.1:8080/ws/terminal/$ALLOC "$TT" [command...]
//
// With a command, it is typed into the shell followed by "exit", and the script ends
// with the shell's exit code (handy for scripts and for checking a setup).
import WebSocket from "ws";

const [url, token, ...command] = process.argv.slice(2);
if (!url || !token) {
  console.error("usage: terminal.mjs WS_URL TOKEN [command...]");
  process.exit(2);
}
const ws = new WebSocket(url, ["gantry.terminal.v1", `gantry.token.${token}`]);
const interactive = command.length === 0 && process.stdin.isTTY;

ws.on("open", () => {
  if (interactive) {
    process.stdin.setRawMode(true);
    const size = () => ws.send(JSON.stringify({ type: "resize", cols: process.stdout.columns, rows: process.stdout.rows }));
    process.stdout.on("resize", size);
    size();
    process.stdin.on("data", (d) => ws.send(d, { binary: true }));
  }
});
ws.on("message", (data, isBinary) => {
  if (isBinary) {
    process.stdout.write(data);
    return;
  }
  const msg = JSON.parse(data.toString());
  console.error(`\r\n[${msg.type}] ${JSON.stringify(msg)}\r`);
  if (msg.type === "session_ready" && command.length > 0) {
    ws.send(Buffer.from(command.join(" ") + "\rexit\r"), { binary: true });
  }
  if (msg.type === "exit") {
    process.exitCode = typeof msg.code === "number" && msg.code >= 0 ? msg.code : 1;
  }
});
ws.on("unexpected-response", (_req, res) => {
  let body = "";
  res.on("data", (c) => (body += c));
  res.on("end", () => {
    console.error(`refused: HTTP ${res.statusCode} ${body}`);
    process.exit(1);
  });
});
ws.on("close", () => {
  if (interactive) process.stdin.setRawMode(false);
  process.exit();
});
ws.on("error", (err) => {
  console.error(String(err));
  process.exit(1);
});
