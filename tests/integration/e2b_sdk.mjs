// E2B's own SDKs (`e2b`, `@e2b/code-interpreter`, from the npm registry at the versions
// test_e2b.py pins) used as their users use them, against airlockd's e2b listener: the cases
// re-express what E2B's own suites check (packages/js-sdk/tests, code-interpreter js/tests),
// written anew. One JSON line per case: {"case", "ok", "detail"}.
//
//   node e2b_sdk.mjs NPM_DIR GROUP      E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY set;
//                                       OTHER_KEY: another key's (the security group)
import http from 'node:http'
import path from 'node:path'

const [dir, group] = process.argv.slice(2)
const e2b = await import(path.join(dir, 'node_modules/e2b/dist/index.mjs'))
const ci = await import(path.join(dir, 'node_modules/@e2b/code-interpreter/dist/index.mjs'))
const { Sandbox, CommandExitError, NotFoundError, TimeoutError, SandboxError, FilesystemEventType } = e2b

let failed = 0
async function check(name, fn) {
  try {
    const detail = await fn()
    console.log(JSON.stringify({ case: name, ok: true, detail: detail ?? null }))
  } catch (err) {
    failed++
    console.log(JSON.stringify({ case: name, ok: false, detail: String(err && err.stack || err) }))
  }
}
function eq(got, want, what) {
  if (JSON.stringify(got) !== JSON.stringify(want))
    throw new Error(`${what}: got ${JSON.stringify(got)}, want ${JSON.stringify(want)}`)
}
function truthy(v, what) {
  if (!v) throw new Error(`${what}: ${JSON.stringify(v)}`)
}
async function rejects(p, cls, what) {
  try {
    await p
  } catch (err) {
    // by name: the code interpreter's own copy of e2b's classes may not be this one's
    if (cls && !(err instanceof cls) && err.constructor.name !== cls.name)
      throw new Error(`${what}: ${err.constructor.name}: ${err.message}`)
    return err
  }
  throw new Error(`${what}: it did not fail`)
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

async function commands() {
  const sb = await Sandbox.create({ timeoutMs: 600000, envs: { FROM_CREATE: 'made' }, metadata: { suite: 'commands' } })
  await check('run: stdout, stderr, exit code', async () => {
    const r = await sb.commands.run('echo hello; echo oops >&2')
    eq([r.stdout, r.stderr, r.exitCode], ['hello\n', 'oops\n', 0], 'result')
  })
  await check('run: a failing command throws CommandExitError', async () => {
    const err = await rejects(sb.commands.run('echo partial; exit 3'), CommandExitError, 'exit 3')
    eq([err.exitCode, err.stdout], [3, 'partial\n'], 'error')
  })
  await check('run: envs, the sandbox\'s and the call\'s', async () => {
    const r = await sb.commands.run('echo $FOO-$FROM_CREATE', { envs: { FOO: 'bar' } })
    eq(r.stdout, 'bar-made\n', 'stdout')
  })
  await check('run: cwd', async () => {
    eq((await sb.commands.run('pwd', { cwd: '/tmp' })).stdout, '/tmp\n', 'pwd')
  })
  await check('the default user is user, at /home/user; root on request', async () => {
    eq((await sb.commands.run('whoami; pwd; echo $HOME')).stdout, 'user\n/home/user\n/home/user\n', 'user')
    eq((await sb.commands.run('whoami', { user: 'root' })).stdout, 'root\n', 'root')
  })
  await check('onStdout streams lines as they come', async () => {
    const seen = []
    const t0 = Date.now()
    await sb.commands.run('for i in 1 2 3; do echo line$i; sleep 1; done', {
      onStdout: (d) => seen.push([d, Date.now() - t0]),
    })
    eq(seen.map((x) => x[0]).join(''), 'line1\nline2\nline3\n', 'lines')
    truthy(seen[seen.length - 1][1] - seen[0][1] >= 1500, 'spread over time: ' + JSON.stringify(seen))
  })
  await check('stdin: sendStdin then closeStdin', async () => {
    const h = await sb.commands.run('cat', { background: true, stdin: true })
    await sb.commands.sendStdin(h.pid, 'hello ')
    await sb.commands.sendStdin(h.pid, 'world')
    await sb.commands.closeStdin(h.pid)
    const r = await h.wait()
    eq(r.stdout, 'hello world', 'cat')
  })
  await check('background: list, then kill', async () => {
    const h = await sb.commands.run('sleep 120', { background: true })
    const list = await sb.commands.list()
    const mine = list.find((p) => p.pid === h.pid)
    truthy(mine && mine.cmd === '/bin/bash' && mine.args.join(' ') === '-l -c sleep 120', 'listed: ' + JSON.stringify(list))
    eq(await sb.commands.kill(h.pid), true, 'kill')
    const err = await rejects(h.wait(), CommandExitError, 'killed')
    truthy(err.exitCode !== 0, 'exit code ' + err.exitCode)
    await sleep(500)
    truthy(!(await sb.commands.list()).some((p) => p.pid === h.pid), 'gone from the list')
    eq(await sb.commands.kill(999999), false, 'kill of no process')
    // the process really went (a pkill of the tree, not a report)
    eq((await sb.commands.run('ps -eo args= | grep -cx "sleep 120" || true')).stdout, '0\n', 'no sleep left')
  })
  await check('a process\'s pid is its pid in the sandbox: kill PID from a command ends it', async () => {
    const h = await sb.commands.run('sleep 130', { background: true })
    const cmdline = (await sb.commands.run(`tr '\\0' ' ' < /proc/${h.pid}/cmdline`)).stdout
    truthy(/sleep 130/.test(cmdline), `pid ${h.pid} is ${JSON.stringify(cmdline)}`)
    await sb.commands.run(`kill -9 ${h.pid}`)
    const err = await rejects(h.wait(), CommandExitError, 'killed by pid')
    eq(err.exitCode, -1, 'signalled')
    truthy(!(await sb.commands.list()).some((p) => p.pid === h.pid), 'gone from the list')
  })
  await check('connect: another handle to a running process gets its later output', async () => {
    const h = await sb.commands.run('for i in $(seq 1 6); do echo tick$i; sleep 1; done', { background: true })
    await sleep(1500)
    const seen = []
    const h2 = await sb.commands.connect(h.pid, { onStdout: (d) => seen.push(d) })
    const r = await h2.wait()
    eq(r.exitCode, 0, 'exit')
    truthy(seen.join('').includes('tick6\n'), 'later output: ' + JSON.stringify(seen))
    truthy(!seen.join('').includes('tick1\n'), 'not the earlier output: ' + JSON.stringify(seen))
  })
  await check('a command past its timeoutMs is killed', async () => {
    const t0 = Date.now()
    await rejects(sb.commands.run('sleep 30; echo late', { timeoutMs: 3000 }), null, 'timeout')
    truthy(Date.now() - t0 < 20000, 'it ended at its deadline: ' + (Date.now() - t0))
    await sleep(1000)
    eq((await sb.commands.run('ps -eo args= | grep -cx "sleep 30" || true')).stdout, '0\n', 'killed in the guest')
  })
  await check('a disconnect does not kill a background process', async () => {
    const h = await sb.commands.run('sleep 3; echo done > /tmp/bg-done', { background: true })
    await h.disconnect()
    await sleep(5000)
    eq((await sb.commands.run('cat /tmp/bg-done')).stdout, 'done\n', 'ran on')
  })
  await check('pty: input, output, resize, kill', async () => {
    let out = ''
    const p = await sb.pty.create({ cols: 80, rows: 24, onData: (d) => { out += new TextDecoder().decode(d) } })
    await sb.pty.sendInput(p.pid, new TextEncoder().encode('stty size; echo pty-$((6*7))\n'))
    for (let i = 0; i < 100 && !out.includes('pty-42'); i++) await sleep(100)
    truthy(out.includes('24 80') && out.includes('pty-42'), 'output: ' + JSON.stringify(out))
    await sb.pty.resize(p.pid, { cols: 100, rows: 30 })
    await sb.pty.sendInput(p.pid, new TextEncoder().encode('stty size\n'))
    for (let i = 0; i < 100 && !out.includes('30 100'); i++) await sleep(100)
    truthy(out.includes('30 100'), 'resized: ' + JSON.stringify(out))
    eq(await sb.pty.kill(p.pid), true, 'kill')
  })
  await check('a sandbox\'s own port through E2b-Sandbox-Port, with its traffic token', async () => {
    await sb.files.write('/tmp/www/hello.txt', 'served')
    await sb.commands.run('cd /tmp/www && exec python3 -m http.server 8000', { background: true, timeoutMs: 0 })
    const get = (token) => fetch(process.env.E2B_SANDBOX_URL + '/hello.txt', {
      headers: { 'E2b-Sandbox-Id': sb.sandboxId, 'E2b-Sandbox-Port': '8000',
        ...(token ? { 'E2B-Traffic-Access-Token': token } : {}) },
    })
    let r
    for (let i = 0; i < 100; i++) {
      r = await get(sb.trafficAccessToken)
      if (r.status === 200) break
      await sleep(200)
    }
    eq([r.status, await r.text()], [200, 'served'], 'through the proxy')
    // without its traffic token the port answers as a sandbox that is not there
    eq((await get(null)).status, 502, 'no token')
    eq((await get('0'.repeat(64))).status, 502, 'a wrong token')
    // getHost's name routes by Host to the same port (PORT-ID.localhost:N on this machine;
    // the request goes to 127.0.0.1 with that Host, as a resolver of *.localhost would send it)
    const host = sb.getHost(8000)
    const listener = new URL(process.env.E2B_SANDBOX_URL)
    eq(host, `8000-${sb.sandboxId}.localhost:${listener.port}`, 'getHost')
    const byHost = (token) => new Promise((resolve, reject) => {
      const req = http.get({ host: '127.0.0.1', port: listener.port, path: '/hello.txt',
        headers: { Host: host, ...(token ? { 'e2b-traffic-access-token': token } : {}) } }, (res) => {
        let body = ''
        res.on('data', (d) => { body += d })
        res.on('end', () => resolve([res.statusCode, body]))
      })
      req.on('error', reject)
    })
    eq(await byHost(sb.trafficAccessToken), [200, 'served'], 'by Host')
    eq((await byHost(null))[0], 502, 'by Host, no token')
  })
  await check('getInfo: metadata, template, state', async () => {
    const info = await sb.getInfo()
    eq([info.sandboxId, info.metadata.suite, info.state], [sb.sandboxId, 'commands', 'running'], 'info')
    const page = await Sandbox.list({ query: { metadata: { suite: 'commands' } } }).nextItems()
    truthy(page.some((s) => s.sandboxId === sb.sandboxId), 'listed by metadata')
    const none = await Sandbox.list({ query: { metadata: { suite: 'other' } } }).nextItems()
    truthy(!none.some((s) => s.sandboxId === sb.sandboxId), 'not under other metadata')
  })
  // E2B's sandbox/metrics.test.ts: the host's counters of the VM, in a time range; a busy
  // guest shows as CPU use the host measured
  await check('getMetrics: the host\'s counters of the VM', async () => {
    const start = new Date(Date.now() - 1000)
    const idle = (await sb.getMetrics()).at(-1)
    for (const k of ['cpuUsedPct', 'cpuCount', 'memUsed', 'memTotal', 'diskUsed', 'diskTotal']) truthy(typeof idle[k] === 'number', k + ': ' + JSON.stringify(idle))
    truthy(idle.cpuCount >= 1 && idle.memTotal >= 64 << 20 && idle.memUsed > 0, 'sizes: ' + JSON.stringify(idle))
    await sleep(1100)
    await sb.commands.run("timeout 3 sh -c 'while :; do :; done' || true")
    const busy = (await sb.getMetrics({ start, end: new Date() })).at(-1)
    truthy(busy.cpuUsedPct > idle.cpuUsedPct && busy.cpuUsedPct > 10, `cpu: idle ${idle.cpuUsedPct}, busy ${busy.cpuUsedPct}`)
    const all = await sb.getMetrics({ start, end: new Date() })
    truthy(all.length >= 2 && all.every((m) => m.timestamp.getTime() >= start.getTime() - 1000), 'in the range: ' + all.length)
    eq(await sb.getMetrics({ end: new Date(Date.now() - 3600000) }), [], 'nothing an hour ago')
  })
  await check('the user may sudo without a password, as in E2B\'s templates', async () => {
    eq((await sb.commands.run('whoami; sudo -n whoami')).stdout, 'user\nroot\n', 'sudo')
  })
  // E2B's api/list.test.ts: pages (limit, nextToken), newest first, order, startedAfter
  await check('list in pages, newest first', async () => {
    const tag = 'pages-' + Date.now()
    const a = await Sandbox.create({ metadata: { tag } })
    await sleep(20)
    const b = await Sandbox.create({ metadata: { tag } })
    try {
      const p = Sandbox.list({ limit: 1, query: { metadata: { tag } } })
      const one = await p.nextItems()
      eq([one.map((s) => s.sandboxId), p.hasNext], [[b.sandboxId], true], 'first page')
      truthy(p.nextToken !== undefined, 'a token')
      const two = await p.nextItems()
      eq([two.map((s) => s.sandboxId), p.hasNext, p.nextToken], [[a.sandboxId], false, undefined], 'second page')
      const asc = await Sandbox.list({ order: 'asc', query: { metadata: { tag } } }).nextItems()
      eq(asc.map((s) => s.sandboxId), [a.sandboxId, b.sandboxId], 'oldest first')
      const later = await Sandbox.list({ query: { metadata: { tag }, startedAfter: new Date(Date.now() + 3600000) } }).nextItems()
      eq(later, [], 'started after an hour from now')
      // a sandbox started at the very time asked for is in (E2B's list.test.ts)
      const since = await Sandbox.list({ query: { metadata: { tag }, startedAfter: (await b.getInfo()).startedAt } }).nextItems()
      truthy(since.some((s) => s.sandboxId === b.sandboxId), 'started at the time asked for')
    } finally {
      await a.kill()
      await b.kill()
    }
  })
  await check('setTimeout moves the end; kill ends it', async () => {
    await sb.setTimeout(300000)
    const info = await sb.getInfo()
    const left = info.endAt.getTime() - Date.now()
    truthy(left > 250000 && left <= 301000, 'end in ' + left)
    // E2B keeps the later end: a connect with a shorter timeout does not shorten it
    await Sandbox.connect(sb.sandboxId, { timeoutMs: 10000 })
    const kept = (await sb.getInfo()).endAt.getTime() - Date.now()
    truthy(kept > 250000, 'end after a shorter connect in ' + kept)
    eq(await sb.isRunning(), true, 'running')
    await sb.kill()
    eq(await sb.isRunning(), false, 'not running')
    await rejects(sb.commands.run('true'), null, 'a killed sandbox runs nothing')
    await rejects(Sandbox.connect(sb.sandboxId), NotFoundError, 'connect to a killed one')
  })
}

async function files() {
  const sb = await Sandbox.create({ timeoutMs: 600000 })
  await check('write and read text and bytes; parents made', async () => {
    const info = await sb.files.write('/tmp/a/b/c.txt', 'hello file')
    eq([info.name, info.path], ['c.txt', '/tmp/a/b/c.txt'], 'write info')
    eq(await sb.files.read('/tmp/a/b/c.txt'), 'hello file', 'text')
    const bytes = new Uint8Array(300000).map((_, i) => (i * 7) % 256)
    await sb.files.write('/tmp/bin', bytes)
    const back = await sb.files.read('/tmp/bin', { format: 'bytes' })
    eq([back.length, Buffer.from(back).equals(Buffer.from(bytes))], [300000, true], 'bytes')
  })
  await check('relative paths are in the user\'s home, and theirs', async () => {
    await sb.files.write('rel.txt', 'mine')
    eq((await sb.commands.run('cat /home/user/rel.txt; echo; stat -c %U /home/user/rel.txt')).stdout, 'mine\nuser\n', 'home')
    // every parent a write or makeDir made is theirs, not only the deepest
    await sb.files.write('deep/a/b.txt', 'x')
    await sb.files.makeDir('made/x/y')
    eq((await sb.commands.run('cd /home/user && stat -c %U deep deep/a deep/a/b.txt made made/x made/x/y')).stdout,
      'user\n'.repeat(6), 'parents')
  })
  await check('write many files at once', async () => {
    const out = await sb.files.write([{ path: '/tmp/m/1.txt', data: 'one' }, { path: '/tmp/m/2.txt', data: 'two' }])
    eq(out.map((x) => x.path).sort(), ['/tmp/m/1.txt', '/tmp/m/2.txt'], 'written')
    eq(await sb.files.read('/tmp/m/2.txt'), 'two', 'second')
  })
  await check('list: names, types, depth', async () => {
    await sb.commands.run('mkdir -p /tmp/l/d/e && touch /tmp/l/f /tmp/l/d/g /tmp/l/d/e/h')
    const one = (await sb.files.list('/tmp/l')).map((e) => [e.name, e.type]).sort()
    eq(one, [['d', 'dir'], ['f', 'file']], 'depth 1')
    // E2B's list.test.ts: depth 2 in the order of a walk (envd's), not level by level
    const two = (await sb.files.list('/tmp/l', { depth: 2 })).map((e) => e.path)
    eq(two, ['/tmp/l/d', '/tmp/l/d/e', '/tmp/l/d/g', '/tmp/l/f'], 'depth 2, in path order')
  })
  // E2B's info.test.ts (get info of a file, of a directory, of a symlink) and write.test.ts
  await check('entries as envd gives them: mode, owner, group, a symlink\'s target', async () => {
    await sb.files.write('info.txt', 'test')
    const i = await sb.files.getInfo('info.txt')
    eq([i.mode, i.permissions, i.owner, i.group], [0o644, '-rw-r--r--', 'user', 'user'], 'file')
    await sb.commands.run('chmod 600 /home/user/info.txt')
    await sb.files.write('info.txt', 'again')
    eq((await sb.files.getInfo('info.txt')).mode, 0o600, 'an existing file keeps its mode')
    await sb.files.makeDir('infodir')
    const d = await sb.files.getInfo('infodir')
    eq([d.type, d.mode, d.permissions, d.owner, d.group], ['dir', 0o755, 'drwxr-xr-x', 'user', 'user'], 'dir')
    await sb.commands.run('cd /home/user && ln -s info.txt link.txt')
    const l = await sb.files.getInfo('link.txt')
    eq([l.name, l.symlinkTarget], ['link.txt', '/home/user/info.txt'], 'symlink')
    const listed = (await sb.files.list('/home/user')).find((e) => e.name === 'link.txt')
    eq(listed.symlinkTarget, '/home/user/info.txt', 'symlink, listed')
  })
  await check('exists, getInfo', async () => {
    eq([await sb.files.exists('/tmp/l/f'), await sb.files.exists('/tmp/nope')], [true, false], 'exists')
    await sb.files.write('/tmp/sized', 'twelve bytes')
    const i = await sb.files.getInfo('/tmp/sized')
    eq([i.name, i.type, i.size, i.path], ['sized', 'file', 12, '/tmp/sized'], 'info')
    await rejects(sb.files.getInfo('/tmp/nope'), NotFoundError, 'missing')
  })
  await check('makeDir: true, then false when it exists', async () => {
    eq(await sb.files.makeDir('/tmp/newdir/sub'), true, 'made')
    eq(await sb.files.makeDir('/tmp/newdir/sub'), false, 'exists')
    eq((await sb.files.getInfo('/tmp/newdir/sub')).type, 'dir', 'a dir')
  })
  await check('rename, remove', async () => {
    await sb.files.write('/tmp/old.txt', 'moving')
    const i = await sb.files.rename('/tmp/old.txt', '/tmp/new.txt')
    eq(i.path, '/tmp/new.txt', 'renamed')
    eq([await sb.files.exists('/tmp/old.txt'), await sb.files.read('/tmp/new.txt')], [false, 'moving'], 'moved')
    await sb.files.remove('/tmp/a')
    eq(await sb.files.exists('/tmp/a/b/c.txt'), false, 'removed, recursively')
    // E2B's remove.test.ts: removing what is not there is no error
    await sb.files.remove('/tmp/never-there')
  })
  // E2B's files/signing.test.ts: a signed URL needs no header; the signature names the
  // sandbox, the path, the operation and the user
  await check('signed file URLs: download, upload, as root; tampered and expired refused', async () => {
    await sb.files.write('hello.txt', 'hello world')
    const dl = await sb.downloadUrl('hello.txt', { useSignatureExpiration: 10000 })
    let r = await fetch(dl)
    eq([r.status, await r.text()], [200, 'hello world'], 'download')
    await sb.files.write('hello.txt', 'root\'s', { user: 'root' })
    r = await fetch(await sb.downloadUrl('hello.txt', { user: 'root', useSignatureExpiration: 10000 }))
    eq([r.status, await r.text()], [200, 'root\'s'], 'as root')
    const up = await sb.uploadUrl('up/signed.txt', { useSignatureExpiration: 10000 })
    const form = new FormData()
    form.append('file', 'file content')
    r = await fetch(up, { method: 'POST', body: form })
    eq(r.status, 200, 'upload: ' + await r.text())
    eq(await sb.files.read('up/signed.txt'), 'file content', 'uploaded')
    r = await fetch(await sb.downloadUrl('hello.txt', { useSignatureExpiration: -10000 }))
    eq([r.status, await r.json()], [401, { code: 401, message: 'signature is already expired' }], 'expired')
    const other = new URL(dl)
    other.searchParams.set('path', '/etc/shadow')
    eq((await fetch(other)).status, 401, 'another path under the same signature')
    const tampered = new URL(dl)
    tampered.searchParams.set('signature', 'v1_' + 'A'.repeat(43))
    eq((await fetch(tampered)).status, 401, 'a signature of nobody\'s')
    const asWrite = new URL(dl)
    eq((await fetch(asWrite, { method: 'POST', body: form })).status, 401, 'a read signature does not write')
  })
  await check('read of a missing file: NotFoundError', async () => {
    await rejects(sb.files.read('/tmp/missing'), NotFoundError, 'read')
  })
  // waits for an event matching want (or fails after ms)
  function waiter(events, want, ms, what) {
    return new Promise((resolve, reject) => {
      const t0 = Date.now()
      const tick = () => {
        if (events.some(want)) return resolve()
        if (Date.now() - t0 > ms) return reject(new Error(`${what}: not seen in ${JSON.stringify(events)}`))
        setTimeout(tick, 50)
      }
      tick()
    })
  }
  const W = FilesystemEventType
  await check('watchDir: a write through files.write, a command\'s create and remove', async () => {
    await sb.files.makeDir('/tmp/w')
    await sb.files.write('/tmp/w/f.txt', 'first')
    const events = []
    const h = await sb.files.watchDir('/tmp/w', (e) => { events.push([e.type, e.name]) })
    await sb.files.write('/tmp/w/f.txt', 'second')
    await waiter(events, ([t, n]) => t === W.WRITE && n === 'f.txt', 20000, 'write')
    await sb.commands.run('touch /tmp/w/new && rm /tmp/w/new && mkdir /tmp/w/sub')
    await waiter(events, ([t, n]) => t === W.REMOVE && n === 'new', 20000, 'remove')
    await waiter(events, ([t, n]) => t === W.CREATE && n === 'sub', 20000, 'a directory')
    // not recursive: what happens in sub is not reported
    await sb.commands.run('touch /tmp/w/sub/deep')
    await sleep(500)
    eq(events.filter(([, n]) => n.includes('deep')), [], 'non-recursive')
    // the agent's temporary names never show
    eq(events.filter(([, n]) => n.startsWith('.airlock-')), [], 'no temporary names')
    await h.stop()
    // the watching ends in the guest too
    let left = 'x'
    for (let i = 0; i < 40 && left; i++) {
      left = (await sb.commands.run("pgrep -f -- '--watc[h] /tmp/w' || true")).stdout.trim()
      if (left) await sleep(250)
    }
    eq(left, '', 'no watcher left in the guest')
    const after = events.length
    await sb.commands.run('touch /tmp/w/later')
    await sleep(500)
    eq(events.length, after, 'no events after stop')
    return events.slice(0, 6)
  })
  await check('watchDir recursive: an existing nested dir, and one made after', async () => {
    await sb.files.makeDir('/tmp/r/nested')
    await sb.files.write('/tmp/r/nested/f.txt', 'one')
    const events = []
    const h = await sb.files.watchDir('/tmp/r', (e) => { events.push([e.type, e.name]) }, { recursive: true })
    await sb.files.write('/tmp/r/nested/f.txt', 'two')
    await waiter(events, ([t, n]) => t === W.WRITE && n === 'nested/f.txt', 20000, 'nested write')
    await sb.files.makeDir('/tmp/r/later')
    await waiter(events, ([t, n]) => t === W.CREATE && n === 'later', 20000, 'new dir')
    await sb.files.write('/tmp/r/later/g.txt', 'three')
    await waiter(events, ([t, n]) => t === W.WRITE && n === 'later/g.txt', 20000, 'in the new dir')
    await sb.files.rename('/tmp/r/later/g.txt', '/tmp/r/h.txt')
    await waiter(events, ([t, n]) => t === W.RENAME && n === 'later/g.txt', 20000, 'renamed from')
    await waiter(events, ([t, n]) => t === W.CREATE && n === 'h.txt', 20000, 'renamed to')
    await sb.commands.run('chmod 600 /tmp/r/h.txt')
    await waiter(events, ([t, n]) => t === W.CHMOD && n === 'h.txt', 20000, 'chmod')
    await h.stop()
  })
  await check('watchDir: a missing directory is FileNotFoundError, a file SandboxError', async () => {
    await rejects(sb.files.watchDir('/tmp/no_such_dir', () => {}), NotFoundError, 'missing')
    await sb.files.write('/tmp/plain.txt', 'x')
    const err = await rejects(sb.files.watchDir('/tmp/plain.txt', () => {}), SandboxError, 'a file')
    truthy(/directory/.test(err.message), 'says why: ' + err.message)
  })
  await check('write with gzip and as octet-stream (envd 0.5.7)', async () => {
    const big = 'compressible line\n'.repeat(20000)
    const i = await sb.files.write('/tmp/gz/z.txt', big, { gzip: true })
    eq(i.path, '/tmp/gz/z.txt', 'written')
    eq(await sb.files.read('/tmp/gz/z.txt'), big, 'inflated as it was')
    await sb.files.write('/tmp/gz/o.bin', new Uint8Array([0, 1, 2, 255]), { useOctetStream: true })
    eq(Array.from(await sb.files.read('/tmp/gz/o.bin', { format: 'bytes' })), [0, 1, 2, 255], 'octet-stream')
    eq((await sb.commands.run('stat -c %U /tmp/gz/z.txt')).stdout, 'user\n', 'the user\'s')
  })
  await check('git in the sandbox: init, commit, log', async () => {
    const r = await sb.commands.run('cd /tmp && rm -rf g && git init -q g && cd g && echo x > f && git add f && ' +
      'git -c user.email=a@b -c user.name=n commit -qm first && git log --format=%s')
    eq(r.stdout, 'first\n', 'log')
  })
  await sb.kill()
}

async function interpreter() {
  const sb = await ci.Sandbox.create({ timeoutMs: 600000 })
  // code-interpreter's executionCount.test.ts: a fresh sandbox counts from 1
  await check('the execution count of a fresh sandbox', async () => {
    await sb.runCode('!pwd')
    eq((await sb.runCode('!pwd')).executionCount, 2, 'the second execution')
  })
  // the server strips a string value's quotes (code-interpreter's result.py)
  await check('a string value\'s text without its quotes', async () => {
    eq([(await sb.runCode("'bar'")).text, (await sb.runCode('"it\'s"')).text,
      (await sb.runCode("'a' + \"'\"")).text], ['bar', "it's", "a'"], 'text')
  })
  await check('runCode: the last expression, stdout', async () => {
    const e = await sb.runCode('x = 41\nprint("hi")\nx + 1')
    eq([e.text, e.logs.stdout, e.error], ['42', ['hi\n'], undefined], 'execution')
  })
  await check('state persists; the execution count grows', async () => {
    const a = await sb.runCode('x')
    const b = await sb.runCode('x * 2')
    eq([a.text, b.text], ['41', '82'], 'state')
    truthy(b.executionCount > a.executionCount, `count ${a.executionCount} then ${b.executionCount}`)
  })
  await check('an error: name, value, traceback', async () => {
    const e = await sb.runCode('1/0')
    eq([e.error.name, e.error.value], ['ZeroDivisionError', 'division by zero'], 'error')
    truthy(e.error.traceback.includes('ZeroDivisionError'), 'traceback')
  })
  await check('callbacks: onStdout, onStderr, onResult, onError', async () => {
    const got = { out: [], err: [], res: [], error: [] }
    await sb.runCode('import sys\nprint("o")\nprint("e", file=sys.stderr)\n7', {
      onStdout: (m) => got.out.push(m.line), onStderr: (m) => got.err.push(m.line),
      onResult: (r) => got.res.push(r.text),
    })
    await sb.runCode('raise ValueError("bad")', { onError: (e) => got.error.push(e.name) })
    eq(got, { out: ['o\n'], err: ['e\n'], res: ['7'], error: ['ValueError'] }, 'callbacks')
  })
  await check('display data: html beside the main result', async () => {
    const e = await sb.runCode('from IPython.display import display, HTML\ndisplay(HTML("<b>x</b>"))\n2')
    eq(e.results.map((r) => [r.isMainResult, r.html ?? null, r.text]),
      [[false, '<b>x</b>', '<IPython.core.display.HTML object>'], [true, null, '2']], 'results')
  })
  await check('a matplotlib figure comes as a PNG', async () => {
    const e = await sb.runCode('import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()')
    const png = e.results.find((r) => r.png)
    truthy(png && Buffer.from(png.png, 'base64').subarray(1, 4).toString() === 'PNG', 'png: ' + JSON.stringify(e.results.map((r) => r.formats())))
  })
  await check('env_vars for one execution', async () => {
    const e = await sb.runCode('import os; os.environ.get("ONE_RUN")', { envs: { ONE_RUN: 'yes' } })
    eq(e.text, 'yes', 'env')
  })
  await check('contexts: their own state and cwd; list, restart, remove', async () => {
    const c = await sb.createCodeContext({ language: 'python', cwd: '/tmp' })
    eq((await sb.runCode('import os; os.getcwd()', { context: c })).text, '/tmp', 'cwd')
    await sb.runCode('y = 5', { context: c })
    eq((await sb.runCode('y', { context: c })).text, '5', 'its state')
    eq((await sb.runCode('"y" in globals()')).text, 'False', 'not the default\'s')
    truthy((await sb.listCodeContexts()).some((x) => x.id === c.id), 'listed')
    const dflt = (await sb.listCodeContexts()).find((x) => x.language === 'python' && x.id !== c.id)
    eq((await sb.runCode('x', { context: dflt })).text, '41', 'the default context, by its id')
    await sb.restartCodeContext(c)
    eq((await sb.runCode('"y" in globals()', { context: c })).text, 'False', 'restarted afresh')
    await sb.removeCodeContext(c)
    truthy(!(await sb.listCodeContexts()).some((x) => x.id === c.id), 'removed')
    await rejects(sb.runCode('1', { context: c }), null, 'gone')
  })
  await check('javascript', async () => {
    const e = await sb.runCode('console.log("js"); 3 * 3', { language: 'js' })
    eq([e.logs.stdout, e.text], [['js\n'], '9'], 'js')
  })
  await check('a caller that gives up interrupts its execution; the next one runs', async () => {
    await rejects(sb.runCode('import time\ntime.sleep(60)', { timeoutMs: 3000 }), TimeoutError, 'timeout')
    const t0 = Date.now()
    eq((await sb.runCode('"after"')).text, 'after', 'after')
    truthy(Date.now() - t0 < 30000, 'soon: ' + (Date.now() - t0))
  })
  await check('a killed sandbox runs no code', async () => {
    await sb.kill()
    await rejects(sb.runCode('1'), null, 'killed')
  })
}

async function security() {
  const sb = await Sandbox.create({ timeoutMs: 600000 })
  const url = process.env.E2B_SANDBOX_URL
  const envd = (token, id = sb.sandboxId) => fetch(url + '/filesystem.Filesystem/Stat', {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', 'E2b-Sandbox-Id': id, 'E2b-Sandbox-Port': '49983',
      ...(token ? { 'X-Access-Token': token } : {}) },
    body: JSON.stringify({ path: '/' }),
  })
  await check('another key sees no such sandbox (control plane 404)', async () => {
    const opts = { apiKey: process.env.OTHER_KEY }
    await rejects(Sandbox.connect(sb.sandboxId, opts), NotFoundError, 'connect')
    await rejects(Sandbox.getInfo(sb.sandboxId, opts), NotFoundError, 'getInfo')
    eq(await Sandbox.kill(sb.sandboxId, opts), false, 'kill')
    const page = await Sandbox.list(opts).nextItems()
    truthy(!page.some((s) => s.sandboxId === sb.sandboxId), 'not listed')
    eq(await sb.isRunning(), true, 'still running')
  })
  await check('the data plane takes only the sandbox\'s token', async () => {
    eq((await envd(sb.envdAccessToken)).status, 200, 'its token')
    // without its token a live sandbox answers as one that is not there (502): nobody learns
    // which ids are live
    eq((await envd(null)).status, 502, 'no token')
    eq((await envd('0'.repeat(64))).status, 502, 'a wrong token')
    eq((await envd(process.env.E2B_API_KEY)).status, 502, 'the API key')
    eq((await envd(sb.envdAccessToken, 'nosuchsandbox')).status, 502, 'no such sandbox')
  })
  await check('a bad API key is refused', async () => {
    await rejects(Sandbox.create({ apiKey: 'e2b_' + '0'.repeat(60) }), e2b.AuthenticationError, 'create')
  })
  await check('fork: each fork has the state, its own token and writes; the source goes on', async () => {
    await sb.files.write('/tmp/before-fork.txt', 'made before the fork')
    await rejects(Sandbox.fork(sb.sandboxId, { count: 1, apiKey: process.env.OTHER_KEY }), NotFoundError,
      'another key forks it')
    const forks = await sb.fork({ count: 2, timeoutMs: 120000 })
    eq(forks.length, 2, 'entries')
    for (const f of forks) {
      truthy(f instanceof Sandbox, `a fork failed: ${f}`)
      truthy(f.sandboxId !== sb.sandboxId, 'a new id')
      eq(await f.files.read('/tmp/before-fork.txt'), 'made before the fork', 'the file')
    }
    truthy(forks[0].envdAccessToken !== sb.envdAccessToken, 'a token of its own')
    await forks[0].files.write('/tmp/before-fork.txt', 'fork 0')
    eq(await forks[1].files.read('/tmp/before-fork.txt'), 'made before the fork', 'the other fork')
    eq(await sb.files.read('/tmp/before-fork.txt'), 'made before the fork', 'the source')
    eq(await sb.isRunning(), true, 'the source runs on')
    const info = await forks[0].getInfo()
    truthy(Date.parse(info.endAt) - Date.now() <= 121000, `the fork's timeout (${info.endAt})`)
    await Promise.all(forks.map((f) => f.kill()))
  })
  await check('snapshots: create, start from, list (paged, by sandbox), delete', async () => {
    await sb.files.write('/tmp/snap.txt', 'in the snapshot')
    const snap = await sb.createSnapshot()
    truthy(snap.snapshotId, 'an id')
    eq(snap.names, [snap.snapshotId], 'names')
    const named = await sb.createSnapshot({ name: 'named-one' })
    eq(named.snapshotId, 'named-one', 'a named one')
    const from = await Sandbox.create(snap.snapshotId, { timeoutMs: 120000 })
    eq(await from.files.read('/tmp/snap.txt'), 'in the snapshot', 'its file')
    await from.kill()
    const all = []
    const pages = Sandbox.listSnapshots({ limit: 1 })
    while (pages.hasNext) all.push(...await pages.nextItems())
    eq(all.map((x) => x.snapshotId).sort(), [snap.snapshotId, 'named-one'].sort(), 'listed, a page each')
    eq((await sb.listSnapshots().nextItems()).length, 2, 'this sandbox\'s')
    eq((await Sandbox.listSnapshots({ apiKey: process.env.OTHER_KEY }).nextItems()).length, 0, 'another key\'s')
    await rejects(Sandbox.create(snap.snapshotId, { apiKey: process.env.OTHER_KEY }), null, 'another key starts from it')
    eq(await Sandbox.deleteSnapshot(snap.snapshotId), true, 'deleted')
    eq(await Sandbox.deleteSnapshot(snap.snapshotId), false, 'deleted already')
    eq(await Sandbox.deleteSnapshot('named-one'), true, 'the named one deleted')
  })
  await check('volumes: made, mounted, kept for the next sandbox, listed, destroyed', async () => {
    const vol = await e2b.Volume.create('e2b-vol')
    eq([vol.name, vol.volumeId], ['e2b-vol', 'e2b-vol'], 'the volume')
    const a = await Sandbox.create({ timeoutMs: 120000, volumeMounts: { '/mnt/vol': vol } })
    eq((await a.getInfo()).volumeMounts, [{ name: 'e2b-vol', path: '/mnt/vol' }], 'its mounts')
    await a.commands.run('echo from-a > /mnt/vol/f && sync', { user: 'root' })
    await a.kill()
    const b = await Sandbox.create({ timeoutMs: 120000, volumeMounts: { '/mnt/vol': 'e2b-vol' } })
    eq((await b.commands.run('cat /mnt/vol/f')).stdout, 'from-a\n', 'the data')
    eq((await e2b.Volume.list()).map((v) => v.name), ['e2b-vol'], 'listed')
    eq((await e2b.Volume.list({ apiKey: process.env.OTHER_KEY })).length, 0, 'another key\'s')
    await rejects(Sandbox.create({ volumeMounts: { '/x': 'e2b-vol' }, apiKey: process.env.OTHER_KEY }),
      null, 'mounted with another key')
    await rejects(e2b.Volume.destroy(vol.volumeId), null, 'destroyed while mounted')
    await b.kill()
    eq(await e2b.Volume.destroy(vol.volumeId), true, 'destroyed')
    eq(await e2b.Volume.destroy(vol.volumeId), false, 'destroyed already')
  })
  await check('pause, and connect brings it back as it was', async () => {
    await sb.files.write('/tmp/kept.txt', 'kept before the pause')
    await sb.pause()
    eq(await sb.isRunning(), false, 'paused: not running')
    const back = await Sandbox.connect(sb.sandboxId)
    eq(await back.isRunning(), true, 'running again')
    eq(await back.files.read('/tmp/kept.txt'), 'kept before the pause', 'the file')
    eq((await back.commands.run('echo still')).stdout, 'still\n', 'runs on')
  })
  await sb.kill()
}

async function load() {
  // many sandboxes, each with several commands at once, through the SDK
  const n = Number(process.env.SANDBOXES || 4), per = Number(process.env.PER || 5)
  await check(`${n} sandboxes x ${per} concurrent commands`, async () => {
    const sbs = await Promise.all(Array.from({ length: n }, () => Sandbox.create({ timeoutMs: 600000 })))
    let errors = 0, right = 0
    const why = []
    await Promise.all(sbs.flatMap((sb, i) => Array.from({ length: per }, async (_, j) => {
      try {
        const r = await sb.commands.run(`echo ${i}-${j}`)
        right += r.stdout === `${i}-${j}\n`
      } catch (err) {
        errors++
        why.push(`${i}-${j}: ${err}`)
      }
    })))
    await Promise.all(sbs.map((sb) => sb.kill()))
    eq([errors, right], [0, n * per], 'errors, right answers ' + why.slice(0, 5).join('; '))
  })
}

// A sandbox killed under a command or an execution: the stream drops, as on E2B, and the
// SDK raises (not a CommandExitError of "signal: killed", not a normal execution result).
async function killed() {
  await check('a command whose sandbox is killed under it raises', async () => {
    const sb = await Sandbox.create({ timeoutMs: 600000 })
    // settled as it happens: the rejection comes while the kill is awaited
    const p = sb.commands.run('sleep 600').then(() => null, (e) => e)
    await sleep(3000)
    await sb.kill()
    const err = await p
    truthy(err, 'the command did not fail')
    if (err instanceof CommandExitError || err.constructor.name === 'CommandExitError')
      throw new Error(`an exit, not a dropped stream: ${err.message}`)
    eq(err.constructor.name, 'TimeoutError', `the error (${err.message})`)
    return `${err.constructor.name}: ${err.message}`
  })
  await check('runCode whose sandbox is killed under it raises', async () => {
    const sb = await ci.Sandbox.create({ timeoutMs: 600000 })
    await sb.runCode('1')
    const p = sb.runCode('import time\ntime.sleep(600)').then((x) => ({ result: x }), (e) => e)
    await sleep(3000)
    await sb.kill()
    const err = await p
    if (!(err instanceof Error)) throw new Error(`a result, not a dropped stream: ${JSON.stringify(err)}`)
    return `${err.constructor.name}: ${err.message}`
  })
}

const groups = { commands, files, interpreter, security, load, killed }
await groups[group]()
process.exit(failed ? 1 : 0)
