'use strict';
// Airlock's javascript kernel: runs the agent's code blocks one after another in one global
// context (vm.runInThisContext), so var, function, let and const declarations persist.
//
// Started by the agent (guest-agent/kernel.c) with fd 3 a socket to it. Says "ready" once, then
// reads requests "run ID COUNT LEN..." followed by COUNT fields (the code, the path of the run's
// stdin, KEY=VALUE entries) and answers "done ID STATUS" when the block is over: 0, 1 for an
// uncaught error, 130 for an interrupt. A block whose value is a promise is over when the
// promise settles. SIGINT interrupts a busy block (breakOnSigint) or stops waiting for its
// promise; the kernel and its globals survive. One that comes while the driver's own code runs
// (reading the request, compiling the block) is held and stops the block before it starts; one
// that comes before the next request belonged to the block before, and is dropped.
const fs = require('fs');
const net = require('net');
const path = require('path');
const util = require('util');
const vm = require('vm');
const { createRequire } = require('module');

const CTL = 3;
let cell = 0;
let stopWaiting = null; // rejects the wait for a block's promise
let held = false;       // a SIGINT came while no block ran
let stdinFd = null;     // the run's stdin, opened from the path the agent gave
let stdinStream = null;

// The block's stdin. node cannot move a new file onto fd 0, so process.stdin, readFileSync(0)
// and readSync(0) are pointed at the run's own descriptor instead.
function runStdinFd() {
  return stdinFd === null ? 0 : stdinFd;
}
Object.defineProperty(process, 'stdin', {
  configurable: true,
  enumerable: true,
  get() {
    if (!stdinStream)
      stdinStream = fs.createReadStream(null, { fd: runStdinFd(), autoClose: stdinFd !== null });
    return stdinStream;
  },
});
const realReadFileSync = fs.readFileSync;
const realReadSync = fs.readSync;
const isStdin = (f) => f === 0 || f === '/dev/stdin';
fs.readFileSync = function (file, ...rest) {
  return realReadFileSync.call(fs, isStdin(file) ? runStdinFd() : file, ...rest);
};
fs.readSync = function (fd, ...rest) {
  return realReadSync.call(fs, fd === 0 ? runStdinFd() : fd, ...rest);
};

// require() as in a script in the current directory.
globalThis.require = function require(id) {
  return createRequire(path.join(process.cwd(), '[cell]'))(id);
};
globalThis.require.resolve = (id, opts) =>
  createRequire(path.join(process.cwd(), '[cell]')).resolve(id, opts);

// A kernel outlives the mistakes of background code: report them, do not die of them.
process.on('uncaughtException', (e) => printError(e));
process.on('unhandledRejection', (e) => printError(e));
const interruption = () => Object.assign(new Error('Interrupted'), { interrupted: true });
process.on('SIGINT', () => {
  if (stopWaiting)
    stopWaiting(interruption());
  else
    held = true;
});
// Two turns of the event loop, each with its poll for I/O: a SIGINT that came before is
// delivered by then (libuv turns it into an event through a pipe, read in a later poll).
const immediate = () => new Promise((resolve) => setImmediate(resolve));
const settle = async () => { await immediate(); await immediate(); };
// Set when a request's first bytes arrive: a SIGINT held until then was the last block's
// (the agent writes a request after the last run ended), and is dropped.
let cleared = Promise.resolve();

function printError(e) {
  let text;
  if (e instanceof Error && typeof e.stack === 'string') {
    // The driver's and node's own frames say nothing about the block.
    text = e.stack.split('\n')
      .filter((l) => !/^\s+at .*(node:|\(node:|evalmachine|[/\\]node\.js:)/.test(l) ||
        l.includes('cell '))
      .join('\n');
  } else {
    text = 'Uncaught ' + util.inspect(e);
  }
  process.stderr.write(text + '\n');
}

function interrupted(e) {
  // A blocking read that SIGINT broke fails with EINTR rather than the interrupt's own error.
  return e && (e.interrupted || e.code === 'ERR_SCRIPT_EXECUTION_INTERRUPTED' ||
    e.code === 'EINTR');
}

function waitFor(promise) {
  return new Promise((resolve, reject) => {
    stopWaiting = reject;
    promise.then(resolve, reject);
  }).finally(() => { stopWaiting = null; });
}

async function run(code, stdinPath, env) {
  await cleared;
  cell += 1;
  for (const entry of env) {
    const i = entry.indexOf('=');
    process.env[entry.slice(0, i)] = entry.slice(i + 1);
  }
  let status = 0;
  try {
    stdinFd = fs.openSync(stdinPath, 'r');
  } catch (e) {
    process.stderr.write(`airlock: ${e.message}\n`);
    status = 1;
  }
  if (status === 0) {
    try {
      // Compiled first: breakOnSigint covers only the run, so a SIGINT that came while the
      // request was read or the block compiled (a big block) is held, and seen here.
      const script = new vm.Script(code, { filename: `cell ${cell}` });
      await settle();
      if (held)
        throw interruption();
      let value = script.runInThisContext({ breakOnSigint: true, displayErrors: false });
      if (value && typeof value.then === 'function')
        value = await waitFor(value);
      if (value !== undefined)
        process.stdout.write(util.inspect(value) + '\n');
    } catch (e) {
      printError(e);
      status = interrupted(e) ? 130 : 1;
    }
  }
  // A stream closes its descriptor itself, once a read still in flight is back (the agent
  // ends the run's stdin with the run): closing it here could pull it from under that read.
  if (stdinStream)
    stdinStream.destroy();
  else if (stdinFd !== null)
    fs.closeSync(stdinFd);
  stdinStream = null;
  stdinFd = null;
  return status;
}

// Requests in, one at a time.
const ctl = new net.Socket({ fd: CTL, readable: true, writable: true });
let buf = Buffer.alloc(0);
let busy = false;

function nextRequest() {
  const nl = buf.indexOf(10);
  if (nl < 0)
    return null;
  const head = buf.subarray(0, nl).toString().split(' ');
  const id = Number(head[1]);
  const lens = head.slice(3, 3 + Number(head[2])).map(Number);
  const total = lens.reduce((a, b) => a + b, 0);
  if (buf.length < nl + 1 + total)
    return null;
  const fields = [];
  let at = nl + 1;
  for (const n of lens) {
    fields.push(buf.subarray(at, at + n).toString());
    at += n;
  }
  buf = buf.subarray(at);
  return { id, fields };
}

async function serve() {
  if (busy)
    return;
  busy = true;
  let req;
  while ((req = nextRequest())) {
    const f = req.fields;
    const status = await run(f[0], f[1], f.slice(2));
    ctl.write(`done ${req.id} ${status}\n`);
  }
  busy = false;
}

ctl.on('data', (chunk) => {
  // No run is in progress when a request starts: serve() took the last one whole.
  if (buf.length === 0 && !busy)
    cleared = settle().then(() => { held = false; });
  buf = Buffer.concat([buf, chunk]);
  serve();
});
ctl.on('end', () => process.exit(0));
ctl.on('error', () => process.exit(0));
ctl.write('ready\n');
