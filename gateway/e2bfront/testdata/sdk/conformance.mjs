// The E2B door's conformance test: the official SDK (package.json pins
// it) against a real vmgated, as E2B code runs unchanged with
// E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set to the door.
// Each check prints one line; the exit status is the number of failures.
// gateway/e2b_integ_test.go runs it (make test).
import { Sandbox, CommandExitError, NotFoundError, FileNotFoundError } from 'e2b'
import assert from 'node:assert/strict'

const API = process.env.E2B_API_URL
const KEY = process.env.E2B_API_KEY
let failed = 0
async function check(name, fn) {
  const t0 = Date.now()
  try {
    await fn()
    console.log(`ok   ${name} (${Date.now() - t0} ms)`)
  } catch (e) {
    failed++
    console.log(`FAIL ${name}: ${e && e.stack ? e.stack : e}`)
  }
}

// until polls f (every 100 ms, at most 10 s) for an effect that comes
// after the call that causes it.
async function until(f, what) {
  for (const t0 = Date.now(); Date.now() - t0 < 10_000; await new Promise((r) => setTimeout(r, 100))) {
    const v = await f()
    if (v) return v
  }
  throw new Error(`${what}: not within 10 s`)
}

let sbx
await check('create (v2) with metadata and envs', async () => {
  sbx = await Sandbox.create({ metadata: { suite: 'conformance', run: process.env.RUN_ID }, envs: { FOO: 'from-create' }, timeoutMs: 600_000 })
  assert.match(sbx.sandboxId, /^sbx-/)
})
if (!sbx) process.exit(1)

await check('commands.run: output, env, cwd, user', async () => {
  const r = await sbx.commands.run('echo out; echo err >&2; echo "$FOO $BAR"; pwd; id -un', { envs: { BAR: 'per-call' }, cwd: '/tmp' })
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'out\nfrom-create per-call\n/tmp\nagent\n')
  assert.equal(r.stderr, 'err\n')
  const root = await sbx.commands.run('id -u', { user: 'root' })
  assert.equal(root.stdout.trim(), '0')
  const bashism = await sbx.commands.run('[[ -n "$BASH_VERSION" ]] && echo bash')
  assert.equal(bashism.stdout, 'bash\n')
})

await check('commands.run: exit codes', async () => {
  await assert.rejects(sbx.commands.run('exit 3'), (e) => e instanceof CommandExitError && e.exitCode === 3)
  await assert.rejects(sbx.commands.run('echo partial; kill -9 $$'), (e) => e instanceof CommandExitError && e.stdout === 'partial\n')
})

await check('background server, reached by later commands', async () => {
  const h = await sbx.commands.run('python3 -m http.server 8765 --bind 127.0.0.1', { background: true, timeoutMs: 0 })
  assert.ok(h.pid > 0)
  const r = await sbx.commands.run('for i in $(seq 50); do curl -sf http://127.0.0.1:8765/ >/dev/null && break; sleep 0.2; done; curl -s -o /dev/null -w "%{http_code}" http://127.0.0.1:8765/')
  assert.equal(r.stdout, '200')
  const list = await sbx.commands.list()
  const p = list.find((x) => x.pid === h.pid)
  assert.ok(p, 'the server is listed')
  assert.equal(p.cmd, '/bin/bash')
  assert.deepEqual(p.args.slice(0, 2), ['-l', '-c'])
  assert.equal(await sbx.commands.kill(h.pid), true)
  const end = await h.wait().catch((e) => e)
  assert.ok(end instanceof CommandExitError, 'a killed process ends with an error')
  assert.equal(await sbx.commands.kill(h.pid), false)
})

await check('commands: stdin, closeStdin, connect', async () => {
  const h = await sbx.commands.run('cat; echo done', { background: true, stdin: true })
  await sbx.commands.sendStdin(h.pid, 'line one\n')
  const again = await sbx.commands.connect(h.pid)
  await sbx.commands.sendStdin(h.pid, 'line two\n')
  await sbx.commands.closeStdin(h.pid)
  const r = await h.wait()
  assert.equal(r.stdout, 'line one\nline two\ndone\n')
  const r2 = await again.wait()
  assert.match(r2.stdout, /line two\ndone\n$/)
  await assert.rejects(sbx.commands.connect(999999), (e) => e instanceof NotFoundError)
})

await check('pty: a terminal, its input and its output', async () => {
  let out = ''
  const dec = new TextDecoder()
  const term = await sbx.pty.create({ cols: 100, rows: 30, onData: (d) => { out += dec.decode(d, { stream: true }) }, timeoutMs: 60_000 })
  try {
    assert.ok(term.pid > 0)
    assert.ok((await sbx.commands.list()).some((p) => p.pid === term.pid), 'the terminal is listed')
    await sbx.pty.sendInput(term.pid, new TextEncoder().encode('echo pty-$((6*7)) $(stty size) $(tty)\n'))
    const dev = await until(() => (out.match(/pty-42 30 100 (\/dev\/pts\/\d+)/) || [])[1], 'the terminal answers')
    // A resize reaches the terminal as SIGWINCH does, after the call:
    // another command reads the terminal's size until it shows.
    await sbx.pty.resize(term.pid, { cols: 120, rows: 40 })
    await until(async () => {
      const r = await sbx.commands.run(`stty -F ${dev} size`, { user: "root" }).catch((e) => e)
      if (r.exitCode !== 0) throw new Error(`stty -F ${dev}: ${r.stderr}`)
      return r.stdout === '40 120\n'
    }, 'the new size')
    await sbx.pty.sendInput(term.pid, new TextEncoder().encode('exit 4\n'))
    const end = await term.wait().catch((e) => e)
    assert.equal(end.exitCode, 4)
    assert.equal(await sbx.commands.kill(term.pid), false, 'an ended terminal is not found')
  } finally {
    await sbx.pty.kill(term.pid).catch(() => {}) // a check that failed leaves no terminal behind
  }
})

await check('files: write, read, list, exists, makeDir, rename, remove', async () => {
  const info = await sbx.files.write('work/a.txt', 'hello file')
  assert.equal(info.name, 'a.txt')
  assert.equal(info.path, '/home/agent/work/a.txt')
  assert.equal(await sbx.files.read('work/a.txt'), 'hello file')
  assert.equal(await sbx.files.exists('work/a.txt'), true)
  assert.equal(await sbx.files.exists('work/none'), false)
  assert.equal(await sbx.files.makeDir('work/sub/deeper'), true)
  assert.equal(await sbx.files.makeDir('work/sub/deeper'), false)
  const names = (await sbx.files.list('work')).map((e) => `${e.name}:${e.type}`).sort()
  assert.deepEqual(names, ['a.txt:file', 'sub:dir'])
  const moved = await sbx.files.rename('work/a.txt', 'work/b.txt')
  assert.equal(moved.name, 'b.txt')
  await sbx.files.remove('work/sub')
  assert.equal(await sbx.files.exists('work/sub'), false)
  await assert.rejects(sbx.files.read('work/a.txt'), (e) => e instanceof FileNotFoundError)
  const multi = await sbx.files.write([{ path: 'm/one.txt', data: '1' }, { path: '/tmp/two.txt', data: '2' }])
  assert.deepEqual(multi.map((e) => e.path), ['/home/agent/m/one.txt', '/tmp/two.txt'])
  const got = await sbx.commands.run('cat m/one.txt /tmp/two.txt')
  assert.equal(got.stdout, '12')
})

await check('files: binary and 5 MB contents', async () => {
  const bin = new Uint8Array(256)
  for (let i = 0; i < 256; i++) bin[i] = i
  await sbx.files.write('bin.dat', bin.buffer)
  assert.deepEqual(await sbx.files.read('bin.dat', { format: 'bytes' }), bin)
  const big = new Uint8Array(5 * 1024 * 1024)
  for (let i = 0; i < big.length; i++) big[i] = (i * 7 + (i >> 12)) & 255
  await sbx.files.write('big.dat', big.buffer)
  const sum = await sbx.commands.run('sha256sum big.dat | cut -c1-64')
  const { createHash } = await import('node:crypto')
  assert.equal(sum.stdout.trim(), createHash('sha256').update(big).digest('hex'))
  const back = await sbx.files.read('big.dat', { format: 'bytes' })
  assert.equal(back.length, big.length)
  assert.ok(Buffer.from(back).equals(Buffer.from(big)))
  await sbx.files.write('gz.txt', 'through gzip', { gzip: true })
  assert.equal(await sbx.files.read('gz.txt'), 'through gzip')
})

await check('setTimeout and getInfo', async () => {
  await sbx.setTimeout(900_000)
  const info = await sbx.getInfo()
  assert.equal(info.state, 'running')
  assert.equal(info.metadata.suite, 'conformance')
  assert.ok(info.endAt.getTime() > Date.now() + 800_000)
})

await check('Sandbox.list with metadata', async () => {
  const other = await Sandbox.create({ metadata: { suite: 'other', run: process.env.RUN_ID } })
  const mine = await Sandbox.list({ query: { metadata: { suite: 'conformance', run: process.env.RUN_ID } } }).nextItems()
  assert.deepEqual(mine.map((s) => s.sandboxId), [sbx.sandboxId])
  const all = await Sandbox.list({ query: { metadata: { run: process.env.RUN_ID } } }).nextItems()
  assert.equal(all.length, 2)
  assert.equal(await other.kill(), true)
})

await check('pause, then connect (resume) keeps files and processes', async () => {
  await sbx.files.write('before-pause.txt', 'kept')
  const h = await sbx.commands.run('sleep 600', { background: true, timeoutMs: 0 })
  assert.equal(await sbx.pause(), true)
  assert.equal((await sbx.getInfo()).state, 'paused')
  assert.equal(await Sandbox.betaPause(sbx.sandboxId), false) // already paused: 409
  const back = await Sandbox.connect(sbx.sandboxId)
  assert.equal((await back.getInfo()).state, 'running')
  assert.equal(await back.files.read('before-pause.txt'), 'kept')
  assert.ok((await back.commands.list()).some((p) => p.pid === h.pid), 'the process outlived the pause')
  await back.commands.kill(h.pid)
})

await check('fork', async () => {
  await sbx.files.write('parent.txt', 'from the parent')
  const [child] = await sbx.fork()
  assert.ok(child instanceof Sandbox, String(child))
  assert.notEqual(child.sandboxId, sbx.sandboxId)
  assert.equal(await child.files.read('parent.txt'), 'from the parent')
  await child.files.write('parent.txt', 'changed in the child')
  assert.equal(await sbx.files.read('parent.txt'), 'from the parent')
  assert.equal(await child.kill(), true)
})

await check('an older client: POST /sandboxes, connect, run', async () => {
  const res = await fetch(`${API}/sandboxes`, { method: 'POST', headers: { 'X-API-Key': KEY, 'Content-Type': 'application/json' }, body: JSON.stringify({ templateID: 'base', timeout: 120 }) })
  assert.equal(res.status, 201)
  const body = await res.json()
  assert.match(body.envdVersion, /^\d+\.\d+\.\d+$/)
  const old = await Sandbox.connect(body.sandboxID)
  assert.equal((await old.commands.run('echo v1')).stdout, 'v1\n')
  assert.equal(await old.kill(), true)
})

await check('kill', async () => {
  assert.equal(await sbx.isRunning(), true)
  assert.equal(await sbx.kill(), true)
  assert.equal(await Sandbox.kill(sbx.sandboxId), false)
  assert.equal(await sbx.isRunning(), false)
})

process.exit(failed)
