// bench/e2b.py's E2B side: one measurement through E2B's SDKs, its milliseconds as JSON.
//   node e2b-sdk.mjs NPM_DIR create_run      Sandbox.create() + runCode("1+1") + kill
//   node e2b-sdk.mjs NPM_DIR create_runs     the same in one process, once per line read
//                                            (the bench's "go": the pool is ready), one
//                                            untimed round first; a JSON line per round
//   node e2b-sdk.mjs NPM_DIR run_true N      N commands.run("true") in one sandbox, each timed
//   node e2b-sdk.mjs NPM_DIR load S P        S sandboxes x P concurrent commands: errors
import path from 'node:path'

const [dir, mode, a, b] = process.argv.slice(2)
const ci = await import(path.join(dir, 'node_modules/@e2b/code-interpreter/dist/index.mjs'))
const e2b = await import(path.join(dir, 'node_modules/e2b/dist/index.mjs'))
const now = () => Number(process.hrtime.bigint()) / 1e6

// A sandbox created, 1+1 run in it: the milliseconds until the answer (its kill not counted).
const createRun = async () => {
  const t0 = now()
  const sb = await ci.Sandbox.create({ timeoutMs: 300000 })
  const e = await sb.runCode('1+1')
  const ms = now() - t0
  await sb.kill()
  if (e.text !== '2') throw new Error('1+1 = ' + e.text)
  return ms
}

if (mode === 'create_run') {
  console.log(JSON.stringify({ ms: await createRun() }))
} else if (mode === 'create_runs') {

  const readline = await import('node:readline')
  let first = true
  for await (const line of readline.createInterface({ input: process.stdin })) {
    if (!line.trim()) continue
    const ms = await createRun()
    console.log(JSON.stringify({ ms, warmup: first }))
    first = false
  }
} else if (mode === 'run_true') {
  const sb = await e2b.Sandbox.create({ timeoutMs: 300000 })
  await sb.commands.run('true')
  const ms = []
  for (let i = 0; i < Number(a); i++) {
    const t0 = now()
    await sb.commands.run('true')
    ms.push(now() - t0)
  }
  await sb.kill()
  console.log(JSON.stringify({ ms }))
} else if (mode === 'load') {
  const sbs = await Promise.all(Array.from({ length: Number(a) }, () => e2b.Sandbox.create({ timeoutMs: 600000 })))
  let errors = 0
  const t0 = now()
  await Promise.all(sbs.flatMap((sb, i) => Array.from({ length: Number(b) }, async (_, j) => {
    try {
      const r = await sb.commands.run(`echo ${i}-${j}`)
      if (r.stdout !== `${i}-${j}\n`) errors++
    } catch (err) {
      errors++
    }
  })))
  const ms = now() - t0
  await Promise.all(sbs.map((sb) => sb.kill()))
  console.log(JSON.stringify({ errors, ms }))
}
