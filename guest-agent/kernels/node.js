'use strict';
// Airlock's javascript kernel: runs the agent's code blocks one after another in one global
// context (vm.runInThisContext), so var, function, let and const declarations persist.
//
// Blocks are notebook cells, rewritten before they run with node's own acorn parser (reached
// through --expose-internals, which kernel.c passes; without it blocks run as written):
// top-level let, const and class declarations become var (so a later cell may declare the name
// again, as in Jupyter; a const is then no longer read-only). A block with a top-level await
// or an import declaration runs inside an async arrow function: its declared names are
// hoisted as globals (var) and its declarations become assignments, a function declaration is
// also made a global, the last expression statement is returned, and `import x, { a as b }, *
// as ns from 'mod'` becomes an `await import()` (resolved as require() would from the current
// directory; node builtins as they are) whose namespace's members are assigned in order;
// imports run where they stand, not first. The block's value is then that function's
// promise, waited for like any other (an interrupt stops the wait, not the function: what
// follows its await may still run later, as a promise's callbacks may). Line numbers stay
// those of the block as written (only columns on its first line move); a block acorn cannot
// parse runs as written, so that node reports its syntax error.
//
// Started by the agent (guest-agent/kernel.c) with fd 3 a socket to it and fd 4 the results
// pipe. Says "ready" once, then reads requests "run ID COUNT LEN..." followed by COUNT fields
// (the code, the path of the run's stdin, a directory to change to first or "", KEY=VALUE
// entries: the run's own environment, undone
// when it ends) and answers "done ID STATUS" when the block is over: 0, 1 for an uncaught
// error, 130 for an interrupt. Results go to fd 4 as records (a u32 little-endian length, then
// JSON; docs/PROTOCOL.md): a count, the block's value as an execute_result with text/plain
// (util.inspect), an uncaught error as an error record {name, value, traceback}. A block whose value is a promise is over when the
// promise settles. SIGINT interrupts a busy block (breakOnSigint) or stops waiting for its
// promise; the kernel and its globals survive. One that comes while the driver's own code runs
// (reading the request, compiling the block) is held and stops the block before it starts; one
// that comes before the next request belonged to the block before, and is dropped. vm's
// breakOnSigint removes the process's SIGINT listeners before its watchdog takes the signal,
// so for a moment SIGINT would end node: the agent waits for a handler before it sends one
// (kernel.c, kernel_signal).
const fs = require('fs');
const net = require('net');
const path = require('path');
const util = require('util');
const vm = require('vm');
const { builtinModules, createRequire } = require('module');
const { pathToFileURL } = require('url');

const CTL = 3;
const RESULTS = 4;
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

// import declarations in blocks: `await __airlock_import(spec)`, resolved from the cwd.
Object.defineProperty(globalThis, '__airlock_import', {
  configurable: true,
  value: function (spec) {
    if (spec.startsWith('node:') || builtinModules.includes(spec) || /^[a-z][a-z0-9+.-]+:/i.test(spec))
      return import(spec);
    let file;
    try {
      file = globalThis.require.resolve(spec);
    } catch (e) {
      if (!/^\.{0,2}\//.test(spec))
        throw e;
      file = path.resolve(process.cwd(), spec);
    }
    return import(builtinModules.includes(file) ? file : pathToFileURL(file).href);
  },
});

let acorn = null;
try {
  acorn = require('internal/deps/acorn/acorn/dist/acorn');
} catch (e) {
  // node without --expose-internals: blocks run as written.
}

const FUNCTIONS = new Set(['FunctionDeclaration', 'FunctionExpression', 'ArrowFunctionExpression']);

// Whether node (a statement) awaits outside any function of its own.
function awaits(node) {
  if (Array.isArray(node))
    return node.some(awaits);
  if (!node || typeof node.type !== 'string' || FUNCTIONS.has(node.type))
    return false;
  if (node.type === 'AwaitExpression' || (node.type === 'ForOfStatement' && node.await))
    return true;
  for (const key in node) {
    const v = node[key];
    if (v && typeof v === 'object' && key !== 'loc' && awaits(v))
      return true;
  }
  return false;
}

// The names a declaration's pattern binds.
function bound(p, names) {
  switch (p.type) {
  case 'Identifier': names.push(p.name); break;
  case 'ObjectPattern': for (const q of p.properties) bound(q.type === 'Property' ? q.value : q, names); break;
  case 'ArrayPattern': for (const q of p.elements) if (q) bound(q, names); break;
  case 'RestElement': bound(p.argument, names); break;
  case 'AssignmentPattern': bound(p.left, names); break;
  }
  return names;
}

// The block as it runs (see the header): code as written where nothing needs a rewrite.
function notebook(code) {
  if (!acorn || !/\b(let|const|class|await|import)\b/.test(code))
    return code;
  let ast;
  try {
    ast = acorn.parse(code, { ecmaVersion: 'latest', sourceType: 'script',
      allowAwaitOutsideFunction: true, allowImportExportEverywhere: true,
      allowHashBang: true });
  } catch (e) {
    return code; // node reports the syntax error itself
  }
  const body = ast.body;
  const wrap = body.some((s) => s.type === 'ImportDeclaration' || awaits(s));
  const edits = []; // [at, end, text]
  const hoisted = [];
  const globals = [];
  const src = (n) => code.slice(n.start, n.end);
  for (const s of body) {
    if (s.type === 'VariableDeclaration' && (wrap || s.kind !== 'var')) {
      const decls = s.declarations;
      // Ended, as `let a\n[a]` was: `a = undefined\n[a]` would read on.
      if (code[s.end - 1] !== ';')
        edits.push([s.end, s.end, ';']);
      if (!wrap) {
        edits.push([s.start, s.start + s.kind.length, 'var']);
      } else {
        edits.push([s.start, decls[0].start, 'void (']);
        edits.push([decls[decls.length - 1].end, decls[decls.length - 1].end, ')']);
      }
      for (const d of decls) {
        if (wrap)
          bound(d.id, hoisted);
        if (!d.init && s.kind === 'let')
          edits.push([d.end, d.end, ' = undefined']);
      }
    } else if (s.type === 'ClassDeclaration') {
      hoisted.push(s.id.name);
      edits.push([s.start, s.start, (wrap ? '' : 'var ') + s.id.name + ' = ']);
      edits.push([s.end, s.end, ';']);
    } else if (s.type === 'FunctionDeclaration' && wrap) {
      globals.push(s.id.name);
    } else if (s.type === 'ImportDeclaration') {
      const sets = s.specifiers.map((p) => {
        hoisted.push(p.local.name);
        if (p.type === 'ImportNamespaceSpecifier')
          return `${p.local.name} = __airlock_ns;`;
        const name = p.type === 'ImportDefaultSpecifier' ? 'default'
          : p.imported.type === 'Identifier' ? p.imported.name : p.imported.value;
        return `${p.local.name} = __airlock_ns[${JSON.stringify(name)}];`;
      });
      // On the declaration's own lines, so that the lines after keep their numbers.
      const lines = '\n'.repeat((src(s).match(/\n/g) || []).length);
      edits.push([s.start, s.end, `void ((__airlock_ns) => { ${sets.join(' ')} })(await ` +
        `__airlock_import(${JSON.stringify(s.source.value)}));${lines}`]);
    }
  }
  const last = body[body.length - 1];
  if (wrap && last && last.type === 'ExpressionStatement') {
    // The statement's bounds: an expression's own leave out the parentheses around it.
    const end = code[last.end - 1] === ';' ? last.end - 1 : last.end;
    edits.push([last.start, last.start, 'return (']);
    edits.push([end, end, ')']);
  }
  if (!wrap && edits.length === 0)
    return code;
  // In one pass, front to back; of two inserts at one place, the one pushed last comes first:
  // `x = undefined);`.
  edits.forEach((e, i) => e.push(i));
  edits.sort((a, b) => a[0] - b[0] || b[3] - a[3]);
  const parts = [];
  let pos = 0;
  for (const [at, end, text] of edits) {
    parts.push(code.slice(pos, at), text);
    pos = end;
  }
  parts.push(code.slice(pos));
  const out = parts.join('');
  if (!wrap)
    return out;
  const start = (hoisted.length ? `var ${[...new Set(hoisted)].join(', ')}; ` : '') +
    '(async () => { ' + globals.map((n) => `globalThis.${n} = ${n}; `).join('');
  // A hashbang must stay first.
  const bang = out.startsWith('#!') ? out.indexOf('\n') + 1 || out.length : 0;
  return out.slice(0, bang) + start + out.slice(bang) + '\n})()';
}

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

// One record on fd 4; a full pipe (the host reading slowly) is waited out.
function sendRecord(record) {
  const body = Buffer.from(JSON.stringify(record), 'utf8');
  const head = Buffer.alloc(4);
  head.writeUInt32LE(body.length, 0);
  let data = Buffer.concat([head, body]);
  while (data.length) {
    try {
      data = data.subarray(fs.writeSync(RESULTS, data));
    } catch (e) {
      if (e.code !== 'EAGAIN')
        return;
    }
  }
}

function errorRecord(e, text) {
  const name = e instanceof Error ? (e.name || 'Error') : 'Uncaught';
  const value = e instanceof Error ? String(e.message) : util.inspect(e);
  sendRecord({ type: 'error', name, value, traceback: text });
}

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
  try {
    errorRecord(e, text + '\n');
  } catch (_) {
    // a value whose inspection throws: stderr said what could be said
  }
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

async function run(code, stdinPath, cwd, env) {
  await cleared;
  // The agent names a directory only for a fresh kernel's first run (one the VM's template
  // started elsewhere); later runs stay where the blocks have gone.
  if (cwd) {
    try {
      process.chdir(cwd);
    } catch (e) {
      process.stderr.write(`airlock: cannot change to ${cwd}: ${e.message}\n`);
      return 1;
    }
  }
  cell += 1;
  sendRecord({ type: 'count', execution_count: cell });
  const saved = new Map();
  for (const entry of env) {
    const i = entry.indexOf('=');
    const key = entry.slice(0, i);
    if (!saved.has(key))
      saved.set(key, Object.prototype.hasOwnProperty.call(process.env, key) ? process.env[key] : undefined);
    process.env[key] = entry.slice(i + 1);
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
      const script = new vm.Script(notebook(code), { filename: `cell ${cell}` });
      await settle();
      if (held)
        throw interruption();
      let value = script.runInThisContext({ breakOnSigint: true, displayErrors: false });
      if (value && typeof value.then === 'function')
        value = await waitFor(value);
      if (value !== undefined)
        sendRecord({ type: 'execute_result', execution_count: cell,
          data: { 'text/plain': util.inspect(value) } });
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
  // The run's environment was the run's only.
  for (const [key, value] of saved) {
    if (value === undefined)
      delete process.env[key];
    else
      process.env[key] = value;
  }
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
    const status = await run(f[0], f[1], f[2], f.slice(3));
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
