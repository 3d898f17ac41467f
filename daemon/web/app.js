// Airlock's web page: everything through the public HTTP API (docs/API.md), so that it is also
// the API's example. Signed in by an HttpOnly cookie (POST /v1/auth/login), or by nothing over
// the unix socket's local forward. Nothing from the guest or the model is ever parsed as HTML:
// it goes into the page as textContent (Markdown is built as DOM nodes from text); image results
// are shown from blobs made from the run's result events, HTML results in a sandboxed iframe
// without scripts, with a CSP of its own, cleared of everything that would make the browser
// connect anywhere.

const $ = (id) => document.getElementById(id);
const SHOWN_MAX = 65536; // characters of one output shown before "show more"
const IMAGE_EXT = /\.(png|jpe?g|gif|webp|svg)$/i;

let current = null; // the session shown
const displays = new Set(); // ids of the sessions with a screen
let activeRun = null; // {id, source} of the running chat turn or command

async function api(method, path, body, raw) {
  const opts = { method, headers: { 'X-Airlock-CSRF': '1' }, credentials: 'same-origin' };
  if (raw !== undefined) {
    opts.body = raw;
    opts.headers['Content-Type'] = 'application/octet-stream';
  } else if (body !== undefined) {
    opts.body = JSON.stringify(body);
    opts.headers['Content-Type'] = 'application/json';
  }
  const r = await fetch(path, opts);
  if (r.status === 401 && !path.startsWith('/v1/auth/')) {
    showLogin();
    throw new Error('sign in first');
  }
  if (!r.ok) {
    let msg = r.status + ' ' + r.statusText;
    try {
      const j = await r.json();
      if (j.error) msg = j.error.message || j.error.code;
    } catch (e) { /* not JSON */ }
    throw new Error(msg);
  }
  if (r.status === 204) return null;
  return r.headers.get('Content-Type')?.startsWith('application/json') ? r.json() : r;
}

const el = (tag, cls, text) => {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
};

// ---- signing in ----

function showLogin() {
  $('login').hidden = false;
  $('app').hidden = true;
  $('logout').hidden = true;
}

async function start() {
  try {
    await api('GET', '/v1/sessions');
  } catch (e) {
    return; // showLogin ran, or the daemon is away
  }
  $('login').hidden = true;
  $('app').hidden = false;
  // Who we are and what the daemon has: no "Sign out" where nobody signed in (the unix
  // socket's forward), and no model said before the first message, not after it.
  const me = await api('GET', '/v1/me').catch(() => null);
  $('logout').hidden = !me || me.via === 'socket';
  const notice = $('model-notice');
  notice.hidden = !me || me.model.configured;
  notice.textContent = me && !me.model.configured ? 'Chat needs a model: ' + me.model.why : '';
  await refreshSessions();
  if (!start.timer) start.timer = setInterval(() => { if (!$('app').hidden) refreshSessions().catch(() => {}); }, 15000);
}

$('login-form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  $('login-error').textContent = '';
  try {
    await api('POST', '/v1/auth/login', { api_key: $('api-key').value });
    $('api-key').value = '';
    await start();
  } catch (e) {
    $('login-error').textContent = 'Sign-in refused: ' + e.message;
  }
});

$('logout').addEventListener('click', async () => {
  await api('POST', '/v1/auth/logout').catch(() => {});
  showLogin();
});

// ---- sessions ----

async function refreshSessions() {
  const j = await api('GET', '/v1/sessions');
  const ul = $('sessions');
  ul.replaceChildren();
  displays.clear();
  for (const s of j.sessions) {
    if (s.display) displays.add(s.id);
    const li = el('li', s.id === current ? 'current' : '');
    li.dataset.id = s.id;
    li.append(el('span', 'name', s.id));
    const age = Math.round(Date.now() / 1000 - s.created);
    li.append(el('span', 'meta', `${s.image} · ${s.memory_mib} MiB · ${age} s${s.display ? ' · screen' : ''}`));
    // "End", not "Stop": the chat's Stop button stops a run; this ends the session (its VM).
    const stop = el('button', 'stop-session', 'End');
    stop.title = 'End the session: its VM and everything in it are gone';
    stop.addEventListener('click', async (ev) => {
      ev.stopPropagation();
      await api('DELETE', `/v1/sessions/${encodeURIComponent(s.id)}`).catch(showError);
      if (current === s.id) select(null);
      refreshSessions();
    });
    li.append(stop);
    li.addEventListener('click', () => select(s.id));
    ul.append(li);
  }
  showScreenTab();
}

function showError(e) {
  $('sessions-error').textContent = e.message;
}

$('new-session').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  $('sessions-error').textContent = '';
  $('start-session').disabled = true;
  const body = { checkpoint_policy: 'auto' };
  if ($('new-image').value) body.image = $('new-image').value;
  if ($('new-display').checked) body.display = true;
  try {
    const s = await api('POST', '/v1/sessions', body);
    await refreshSessions();
    select(s.id);
  } catch (e) {
    showError(e);
  } finally {
    $('start-session').disabled = false;
  }
});

function sp(path) {
  return `/v1/sessions/${encodeURIComponent(current)}${path}`;
}

async function select(id) {
  current = id;
  showScreenTab();
  showTerminal(id);
  $('session-title').textContent = id ? `Session ${id}` : 'No session selected';
  $('transcript').replaceChildren();
  for (const li of $('sessions').children) li.classList.toggle('current', li.dataset.id === id);
  if (id) {
    refreshTimeline();
    refreshFiles();
  }
}

// ---- output: text, capped, ANSI stripped ----

// Escape sequences (CSI, OSC, single ESC) and other controls but tab and newline.
const ANSI = /\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)?|\x1b[@-_]|[\x00-\x08\x0b-\x1f\x7f]/g;

function b64bytes(b64) {
  const bin = atob(b64);
  const bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
  return bytes;
}

// ---- Markdown (model text, text/markdown results): built as DOM nodes from text, never parsed
// as HTML. Fenced code, headings, lists, paragraphs; inline code, **bold**, *italic*, and links
// to http(s) only.

function mdInline(parent, text) {
  const re = /`([^`\n]+)`|\*\*([^*\n]+)\*\*|\*([^*\s][^*\n]*)\*|\[([^\]\n]+)\]\((https?:\/\/[^\s)]+)\)/g;
  let at = 0;
  for (const m of text.matchAll(re)) {
    if (m.index > at) parent.append(text.slice(at, m.index));
    if (m[1] !== undefined) parent.append(el('code', '', m[1]));
    else if (m[2] !== undefined) parent.append(el('strong', '', m[2]));
    else if (m[3] !== undefined) parent.append(el('em', '', m[3]));
    else {
      const a = el('a', '', m[4]);
      a.href = m[5];
      a.rel = 'noopener noreferrer nofollow';
      a.target = '_blank';
      parent.append(a);
    }
    at = m.index + m[0].length;
  }
  if (at < text.length) parent.append(text.slice(at));
}

function renderMarkdown(text) {
  const frag = document.createDocumentFragment();
  const lines = text.split('\n');
  let para = null;
  let list = null;
  const close = () => { para = null; list = null; };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = line.match(/^\s*(```|~~~)\s*([\w+-]*)/);
    if (fence) {
      const body = [];
      for (i++; i < lines.length && !lines[i].trimStart().startsWith(fence[1]); i++) body.push(lines[i]);
      const pre = el('pre', 'md-code', body.join('\n'));
      if (fence[2]) pre.dataset.lang = fence[2];
      frag.append(pre);
      close();
      continue;
    }
    const h = line.match(/^(#{1,6})\s+(.*)$/);
    const li = line.match(/^\s*(?:[-*+]|(\d+)[.)])\s+(.*)$/);
    if (!line.trim()) {
      close();
    } else if (h) {
      const e = el('h' + Math.min(h[1].length + 2, 6), 'md-h');
      mdInline(e, h[2]);
      frag.append(e);
      close();
    } else if (li) {
      const tag = li[1] === undefined ? 'ul' : 'ol';
      if (!list || list.tagName.toLowerCase() !== tag) {
        list = el(tag, 'md-list');
        frag.append(list);
      }
      const item = el('li');
      mdInline(item, li[2]);
      list.append(item);
      para = null;
    } else if (para) {
      para.append('\n');
      mdInline(para, line);
    } else {
      para = el('p', 'md-p');
      mdInline(para, line);
      frag.append(para);
      list = null;
    }
  }
  return frag;
}

// ---- guest HTML (a DataFrame's table): in an iframe with sandbox="" (no scripts, an opaque
// origin), its own CSP (nothing loads but data: images), and taken apart first by DOMParser
// (which runs and loads nothing) so that no element or attribute that makes the browser
// connect (resource hints, frames, base, forms, URL attributes) is left.

const HTML_DROP = 'script, link, meta, base, iframe, frame, frameset, object, embed, applet, portal, form, noscript, template';
const URL_ATTRS = ['href', 'src', 'srcset', 'action', 'formaction', 'poster', 'background', 'ping', 'cite', 'data', 'codebase', 'manifest', 'xlink:href', 'imagesrcset', 'lowsrc', 'dynsrc', 'longdesc'];
const FRAME_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'";

function frameDoc(html) {
  const doc = new DOMParser().parseFromString(html, 'text/html');
  for (const e of doc.querySelectorAll(HTML_DROP)) e.remove();
  for (const e of doc.querySelectorAll('*')) {
    for (const a of [...e.attributes]) {
      const n = a.name.toLowerCase();
      const dataImg = /^\s*data:image\/(png|jpeg|gif|webp);/i.test(a.value);
      if (n.startsWith('on') || (URL_ATTRS.includes(n) && !(n === 'src' && dataImg)) || /url\s*\(|@import/i.test(n === 'style' ? a.value : '')) e.removeAttribute(a.name);
    }
  }
  for (const st of doc.querySelectorAll('style')) if (/url\s*\(|@import/i.test(st.textContent)) st.remove();
  return '<!doctype html><html><head><meta charset="utf-8">' +
    `<meta http-equiv="Content-Security-Policy" content="${FRAME_CSP}">` +
    '<meta http-equiv="x-dns-prefetch-control" content="off"></head><body>' +
    doc.body.innerHTML + '</body></html>';
}

function htmlFrame(html) {
  const f = el('iframe');
  f.setAttribute('sandbox', ''); // no scripts, no same origin
  f.setAttribute('referrerpolicy', 'no-referrer');
  f.srcdoc = frameDoc(html);
  return f;
}

// ---- a kernel run's results, from the run's result events (docs/API.md, "Kernel results") ----

const IMAGE_TYPES = ['image/png', 'image/jpeg', 'image/svg+xml'];

function showResult(parent, d) {
  const box = el('div', 'result');
  box.dataset.kind = d.kind;
  if (d.kind === 'error') {
    box.append(el('div', 'error', `${d.name}: ${d.value}`));
    parent.append(box);
    return;
  }
  const data = d.data || {};
  const type = IMAGE_TYPES.find((t) => t in data);
  if (type) {
    const img = el('img');
    const bytes = type === 'image/svg+xml' ? new TextEncoder().encode(data[type]) : b64bytes(data[type]);
    img.src = URL.createObjectURL(new Blob([bytes], { type }));
    img.alt = data['text/plain'] || type;
    if (d.width) img.dataset.width = d.width;
    box.append(img);
  } else if ('text/html' in data) {
    box.append(htmlFrame(data['text/html']));
  } else if ('text/markdown' in data) {
    const md = el('div', 'msg md');
    md.append(renderMarkdown(data['text/markdown']));
    box.append(md);
  } else {
    const text = data['text/plain'] ?? data['text/latex'] ?? JSON.stringify(data['application/json'] ?? null);
    box.append(el('pre', 'value', String(text).replace(ANSI, '')));
  }
  if (d.kind === 'value' && d.execution_count) box.append(el('div', 'exit', `Out[${d.execution_count}]`));
  parent.append(box);
}

class Output {
  constructor(parent) {
    this.box = el('div', 'output');
    this.pre = el('pre', 'out');
    this.box.append(this.pre);
    parent.append(this.box);
    this.text = '';
    this.shown = SHOWN_MAX;
    this.more = null;
    this.dec = { stdout: new TextDecoder(), stderr: new TextDecoder() };
  }
  add(stream, b64) {
    this.text += (this.dec[stream] || this.dec.stdout).decode(b64bytes(b64), { stream: true }).replace(ANSI, '');
    this.render();
  }
  render() {
    if (this.pre.textContent.length < Math.min(this.text.length, this.shown))
      this.pre.textContent = this.text.slice(0, this.shown);
    if (this.text.length > this.shown && !this.more) {
      this.more = el('button', 'more');
      this.more.addEventListener('click', () => {
        this.shown *= 4;
        this.render();
      });
      this.box.append(this.more);
    }
    if (this.more) {
      const left = this.text.length - this.shown;
      this.more.hidden = left <= 0;
      this.more.textContent = `show more (${left} more characters)`;
    }
  }
}

// ---- figures and HTML results, fetched through the files API ----

async function showFile(parent, path) {
  const r = await api('GET', sp(`/files?path=${encodeURIComponent(path)}`));
  const blob = await r.blob();
  const box = el('div', 'result');
  box.dataset.kind = 'file';
  if (IMAGE_EXT.test(path)) {
    const type = path.toLowerCase().endsWith('.svg') ? 'image/svg+xml' : 'image/' + path.split('.').pop().toLowerCase().replace('jpg', 'jpeg');
    const img = el('img');
    img.alt = path;
    img.src = URL.createObjectURL(new Blob([blob], { type }));
    box.append(img);
  } else if (/\.html?$/i.test(path)) {
    box.append(htmlFrame(await blob.text()));
  } else {
    return;
  }
  box.append(el('div', 'exit', path));
  parent.append(box);
}

// ---- runs: chat turns and %% commands, their events over SSE ----

function follow(runId, box, onEnd) {
  // EventSource reconnects by itself with Last-Event-ID: the daemon replays from there.
  const src = new EventSource(sp(`/runs/${encodeURIComponent(runId)}/events`));
  activeRun = { id: runId, source: src };
  $('stop').disabled = false;
  let textDiv = null;
  let textAcc = '';
  let out = null;
  const on = (type, fn) => src.addEventListener(type, (ev) => fn(JSON.parse(ev.data)));
  // A dropped connection: EventSource comes back by itself with Last-Event-ID.
  src.addEventListener('error', () => {
    if (box.dataset.done) return;
    box.dataset.reconnects = String(Number(box.dataset.reconnects || 0) + 1);
  });
  on('text', (d) => {
    if (!textDiv) {
      textDiv = el('div', 'msg model');
      textAcc = '';
      box.append(textDiv);
    }
    textAcc += d.text;
    textDiv.replaceChildren(renderMarkdown(textAcc));
    scroll();
  });
  on('text_end', () => { textDiv = null; });
  let lastCode = null;
  on('code', (d) => {
    lastCode = el('pre', 'code', d.language === 'computer' ? computerAction(d.code) : d.code);
    lastCode.dataset.lang = d.language || '';
    box.append(lastCode);
    out = null;
  });
  // auto-run off: the code waits for Run, Edit (then Run) or Skip
  on('confirm', (d) => {
    const bar = el('div', 'confirm');
    const answer = async (run, code) => {
      bar.remove();
      const body = { run };
      if (code !== undefined) body.code = code;
      await api('POST', sp('/chat/confirm'), body).catch((e) => box.append(el('div', 'error', e.message)));
    };
    // OpenAI's safety check on a computer action: a person acknowledges it, or the turn ends.
    if (d.language === 'safety_check') {
      box.append(el('div', 'msg notice safety', 'The model\'s vendor flags the next action: ' + d.code));
      const ackB = el('button', 'run', 'Acknowledge');
      const noB = el('button', 'skip', 'Decline');
      ackB.addEventListener('click', () => answer(true));
      noB.addEventListener('click', () => answer(false));
      bar.append(ackB, noB);
      box.append(bar);
      scroll();
      return;
    }
    const runB = el('button', 'run', 'Run');
    const editB = el('button', 'edit', 'Edit');
    const skipB = el('button', 'skip', 'Skip');
    let editor = null;
    runB.addEventListener('click', () => {
      if (editor) {
        const code = editor.value;
        const pre = el('pre', 'code', code);
        editor.replaceWith(pre);
        answer(true, code);
      } else {
        answer(true);
      }
    });
    editB.addEventListener('click', () => {
      if (editor) return;
      editor = el('textarea', 'edit');
      editor.value = d.code;
      if (lastCode) lastCode.replaceWith(editor);
      else bar.before(editor);
    });
    skipB.addEventListener('click', () => answer(false));
    bar.append(runB, editB, skipB);
    box.append(bar);
    scroll();
  });
  on('output', (d) => {
    if (!out) out = new Output(box);
    out.add(d.stream, d.data_b64);
    scroll();
  });
  on('result', (d) => {
    showResult(box, d);
    out = null; // output after a result goes below it
    scroll();
  });
  on('refused', (d) => box.append(el('div', 'msg notice refused', 'result refused: ' + d.why)));
  on('run_end', (d) => {
    box.append(el('div', 'exit', `${d.how} ${d.value}${d.interrupted ? ' (interrupted)' : ''}${d.timed_out ? ' (timed out)' : ''}`));
    out = null;
    refreshTimeline();
  });
  on('notice', (d) => box.append(el('div', 'msg notice', d.message)));
  on('files', (d) => {
    for (const p of d.paths) if (IMAGE_EXT.test(p) || /\.html?$/i.test(p)) showFile(box, p).catch(() => {});
    refreshFiles();
  });
  const end = (d, type) => {
    src.close();
    if (activeRun && activeRun.id === runId) activeRun = null;
    $('stop').disabled = true;
    if (type === 'error') box.append(el('div', 'error', `${d.code}: ${d.message}`));
    else if (type === 'exit') box.append(el('div', 'exit', `${d.how} ${d.value}${d.interrupted ? ' (interrupted)' : ''}`));
    box.dataset.done = type;
    refreshTimeline();
    refreshFiles();
    if (onEnd) onEnd();
  };
  for (const t of ['done', 'error', 'exit']) on(t, (d) => end(d, t));
}

// A computer-use action of the model (the chat's "code" of language "computer", its JSON) as one
// line: "left_click [640, 400]", "type \"hello\"".
function computerAction(json) {
  let a;
  try { a = JSON.parse(json); } catch { return json; }
  // OpenAI's batch: one line per action, its type and what it says
  if (Array.isArray(a)) {
    return a.map((x) => (x && typeof x.type === 'string'
      ? [x.type, ...Object.entries(x).filter(([k]) => k !== 'type').map(([k, v]) => `${k}=${JSON.stringify(v)}`)].join(' ')
      : JSON.stringify(x))).join('\n');
  }
  if (!a || typeof a.action !== 'string') return json;
  let s = a.action;
  if (Array.isArray(a.start_coordinate)) s += ` from [${a.start_coordinate.join(', ')}]`;
  if (Array.isArray(a.coordinate)) s += ` [${a.coordinate.join(', ')}]`;
  if (typeof a.text === 'string') s += ` ${JSON.stringify(a.text)}`;
  if (a.scroll_direction) s += ` ${a.scroll_direction} ${a.scroll_amount || 1}`;
  return s;
}

function scroll() {
  const t = $('transcript');
  t.scrollTop = t.scrollHeight;
}

$('chat-form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const text = $('chat-input').value.trim();
  if (!current || !text) return;
  if (text.startsWith('%%')) return shell(text.slice(2).trim());
  $('chat-input').value = '';
  const turn = el('div', 'turn');
  turn.append(el('div', 'msg user', text));
  $('transcript').append(turn);
  try {
    const r = await api('POST', sp('/chat'), { message: text, auto_run: $('auto-run').checked });
    follow(r.id, turn);
  } catch (e) {
    turn.append(el('div', 'error', e.message));
  }
});

$('chat-input').addEventListener('keydown', (ev) => {
  if (ev.key === 'Enter' && !ev.shiftKey) {
    ev.preventDefault();
    $('send').click();
  }
});

async function shell(cmd) {
  if (!current || !cmd) return;
  const turn = el('div', 'turn');
  turn.append(el('pre', 'code', '%% ' + cmd));
  $('transcript').append(turn);
  try {
    const r = await api('POST', sp('/runs'), { argv: ['/bin/sh', '-c', cmd], cwd: '/workspace' });
    follow(r.id, turn);
  } catch (e) {
    turn.append(el('div', 'error', e.message));
  }
}

$('shell-form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  const cmd = $('shell-input').value;
  $('shell-input').value = '';
  shell(cmd);
});

$('stop').addEventListener('click', async () => {
  if (!activeRun) return;
  await api('POST', sp(`/runs/${encodeURIComponent(activeRun.id)}/signal`), { signal: 'INT' }).catch(() => {});
});

// ---- checkpoints ----

async function refreshTimeline() {
  if (!current) return;
  const j = await api('GET', sp('/checkpoints')).catch(() => null);
  const chat = await api('GET', sp('/chat')).catch(() => null);
  const code = new Map((chat?.checkpoints || []).map((c) => [c.id, c.code]));
  const ol = $('timeline');
  ol.replaceChildren();
  if (!j) return;
  for (const c of j.checkpoints) {
    const li = el('li', '', `#${c.id} ${c.name || ''} `);
    if (code.has(c.id)) li.append(el('code', '', 'before: ' + code.get(c.id) + ' '));
    const b = el('button', 'rollback', 'Roll back to here');
    b.addEventListener('click', async () => {
      await api('POST', sp(`/checkpoints/${c.id}/rollback`)).catch((e) => alert(e.message));
      $('transcript').append(el('div', 'msg notice', `rolled back to checkpoint ${c.id}`));
      refreshFiles();
    });
    li.append(b);
    ol.append(li);
  }
}

$('undo').addEventListener('click', async () => {
  if (!current) return;
  try {
    const r = await api('POST', sp('/chat/undo'));
    const turns = $('transcript').querySelectorAll('.turn');
    if (turns.length) turns[turns.length - 1].remove();
    $('transcript').append(el('div', 'msg notice', r.rolled_back ? 'undone: the VM was rolled back' : 'undone (no checkpoint to roll back to)'));
  } catch (e) {
    $('transcript').append(el('div', 'msg notice error', 'undo: ' + e.message));
  }
  refreshTimeline();
  refreshFiles();
});

// ---- files of /workspace ----

async function refreshFiles() {
  if (!current) return;
  const ul = $('files');
  const j = await api('GET', sp('/files/list?path=/workspace')).catch(() => null);
  ul.replaceChildren();
  if (!j) return;
  for (const f of j.entries) {
    const li = el('li');
    const path = '/workspace/' + f.name;
    if (f.type === 'file') {
      const a = el('a', 'download', f.name);
      a.href = sp(`/files?path=${encodeURIComponent(path)}`);
      a.download = f.name;
      li.append(a, el('span', 'meta', `${f.size} B`));
    } else {
      li.append(el('span', '', f.name + (f.type === 'dir' ? '/' : '')));
    }
    ul.append(li);
  }
}

async function upload(files) {
  for (const f of files) {
    const name = f.name.replace(/[/\\]/g, '_');
    await api('PUT', sp(`/files?path=${encodeURIComponent('/workspace/' + name)}`), undefined, f).catch((e) => $('transcript').append(el('div', 'error', 'upload: ' + e.message)));
  }
  refreshFiles();
}

// The whole folder: tar made in the guest by a run, then fetched with the files API.
$('archive').addEventListener('click', async () => {
  if (!current) return;
  const tmp = '/tmp/airlock-workspace.tar';
  const link = $('archive-link');
  link.hidden = true;
  try {
    const r = await api('POST', sp('/runs'), { argv: ['tar', '-C', '/workspace', '-cf', tmp, '.'] });
    const end = await api('GET', sp(`/runs/${encodeURIComponent(r.id)}/wait?timeout_s=300`));
    if (!end.result || end.result.value !== 0) throw new Error('tar failed');
    const blob = await (await api('GET', sp(`/files?path=${encodeURIComponent(tmp)}`))).blob();
    await api('DELETE', sp(`/files?path=${encodeURIComponent(tmp)}`)).catch(() => {});
    if (link.href) URL.revokeObjectURL(link.href);
    link.href = URL.createObjectURL(new Blob([blob], { type: 'application/x-tar' }));
    link.hidden = false;
    link.click();
  } catch (e) {
    $('transcript').append(el('div', 'error', 'archive: ' + e.message));
  }
});

// ---- ports: what the session serves, at an origin of its own (PORT-ID.localhost), so that its
// pages never run as this one; the daemon's open-port link signs that origin in for that port.
$('port-form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  const port = Number($('port-input').value);
  if (!current || !(port >= 1 && port <= 65535)) return;
  window.open(sp(`/open-port/${port}`), '_blank', 'noopener');
});

const dz = $('dropzone');
dz.addEventListener('dragover', (ev) => { ev.preventDefault(); dz.classList.add('over'); });
dz.addEventListener('dragleave', () => dz.classList.remove('over'));
dz.addEventListener('drop', (ev) => {
  ev.preventDefault();
  dz.classList.remove('over');
  if (current) upload(ev.dataTransfer.files);
});
$('upload').addEventListener('change', (ev) => {
  if (current) upload(ev.target.files);
  ev.target.value = '';
});

// ---- the terminal tab: a login shell on a pty run (POST /runs with pty), its output over the
// run's SSE events into xterm.js, the keys in order through /stdin (one request at a time, what
// was typed meanwhile goes in the next), the size through /resize as the pane changes. One
// terminal per session, kept while the page is open; the guest's escape sequences go to the
// terminal emulator only, never into the page's text.

const terminals = new Map(); // session id -> {div, term, fit, runId, src, ended}
let xterm = null; // the modules, loaded on first use
let tab = 'chat';

async function loadXterm() {
  if (!xterm) {
    const [x, f] = await Promise.all([import('/xterm.mjs'), import('/addon-fit.mjs')]);
    xterm = { Terminal: x.Terminal, FitAddon: f.FitAddon };
  }
  return xterm;
}

function setTab(t) {
  tab = t;
  for (const n of ['chat', 'terminal', 'screen']) $('tab-' + n).classList.toggle('current', t === n);
  $('terminal-pane').hidden = t !== 'terminal';
  $('screen-pane').hidden = t !== 'screen';
  for (const id of ['transcript', 'chat-form', 'shell-form']) $(id).hidden = t !== 'chat';
  showTerminal(current);
  if (t === 'screen') screenLoop();
}

$('tab-chat').addEventListener('click', () => setTab('chat'));
$('tab-terminal').addEventListener('click', () => setTab('terminal'));
$('tab-screen').addEventListener('click', () => setTab('screen'));
$('terminal-new').addEventListener('click', () => {
  const t = terminals.get(current);
  if (t) { t.div.remove(); terminals.delete(current); }
  showTerminal(current);
});
window.addEventListener('resize', () => {
  const t = terminals.get(current);
  if (t && tab === 'terminal') t.fit.fit();
});

function termStatus(t) {
  if (terminals.get(current) !== t) return;
  $('terminal-status').textContent = t.status;
  $('terminal-new').hidden = !t.ended;
}

async function showTerminal(id) {
  for (const [sid, t] of terminals) t.div.hidden = sid !== id || tab !== 'terminal';
  if (!id || tab !== 'terminal') return;
  let t = terminals.get(id);
  if (t) {
    termStatus(t);
    t.fit.fit();
    t.term.focus();
    return;
  }
  t = { div: el('div', 'terminal'), status: 'starting a shell…', ended: false, keys: '', sending: false };
  t.div.dataset.session = id;
  terminals.set(id, t);
  $('terminals').append(t.div);
  termStatus(t);
  let X;
  try {
    X = await loadXterm();
  } catch (e) {
    t.status = 'the terminal is not built into this daemon (meson option web_terminal)';
    t.ended = true;
    termStatus(t);
    return;
  }
  t.term = new X.Terminal({ cursorBlink: true, scrollback: 5000 });
  t.fit = new X.FitAddon();
  t.term.loadAddon(t.fit);
  t.term.open(t.div);
  t.fit.fit();
  const path = (p) => `/v1/sessions/${encodeURIComponent(id)}${p}`;
  let run;
  try {
    run = await api('POST', path('/runs'), { pty: { rows: t.term.rows, cols: t.term.cols } });
  } catch (e) {
    t.status = 'no shell: ' + e.message;
    t.ended = true;
    termStatus(t);
    return;
  }
  t.runId = run.id;
  t.div.dataset.run = run.id;
  const rp = (p) => path(`/runs/${encodeURIComponent(run.id)}${p}`);
  t.status = `shell ${run.id} · ${t.term.cols}×${t.term.rows}`;
  termStatus(t);
  t.src = new EventSource(rp('/events'));
  t.src.addEventListener('output', (ev) => t.term.write(b64bytes(JSON.parse(ev.data).data_b64)));
  const end = (ev) => {
    const d = JSON.parse(ev.data);
    t.src.close(); // else EventSource would come back for more
    t.ended = true;
    t.status = d.how ? `the shell ended (${d.how} ${d.value})` : `the shell failed: ${d.message || d.code}`;
    t.div.dataset.ended = '1';
    termStatus(t);
  };
  t.src.addEventListener('exit', end);
  t.src.addEventListener('error', (ev) => { if (ev.data) end(ev); });
  const send = async () => {
    if (t.sending || !t.keys || t.ended) return;
    t.sending = true;
    const keys = t.keys;
    t.keys = '';
    try {
      await api('POST', rp('/stdin'), undefined, new TextEncoder().encode(keys));
    } catch (e) {
      t.status = 'input refused: ' + e.message;
      termStatus(t);
    }
    t.sending = false;
    send();
  };
  t.term.onData((d) => { t.keys += d; send(); });
  t.term.onResize(({ rows, cols }) => {
    if (t.ended) return;
    t.status = `shell ${run.id} · ${cols}×${rows}`;
    termStatus(t);
    api('POST', rp('/resize'), { rows, cols }).catch(() => {});
  });
  t.term.focus();
}

// ---- the screen tab (sessions started with a screen): the host's screenshots of the VM
// (GET /screen, a few a second while the tab is shown: simpler than a VNC stream, and what the
// model sees too); "take over" sends the person's pointer and keys as input actions (POST
// /input, in the pixels of the screenshot shown, one request at a time and in order). The
// guest draws the pixels; nothing in them is read by the page, they are only shown.

const SCREEN_PERIOD_MS = 250;
const screen = { loop: null, w: 0, h: 0, frames: 0, queue: Promise.resolve(), moving: null };

function showScreenTab() {
  const has = current !== null && displays.has(current);
  $('tab-screen').hidden = !has;
  if (!has && tab === 'screen') setTab('chat');
  if (has && tab === 'screen') screenLoop();
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function screenLoop() {
  const id = current;
  if (!id || screen.loop === id) return;
  screen.loop = id;
  const img = $('screen-img');
  while (screen.loop === id && current === id && tab === 'screen') {
    const t0 = performance.now();
    try {
      const r = await api('GET', sp('/screen'));
      const blob = await r.blob();
      if (current !== id) break;
      const old = img.src;
      img.src = URL.createObjectURL(blob);
      await img.decode().catch(() => {});
      if (old.startsWith('blob:')) URL.revokeObjectURL(old);
      screen.w = Number(r.headers.get('X-Screen-Width')) || img.naturalWidth;
      screen.h = Number(r.headers.get('X-Screen-Height')) || img.naturalHeight;
      img.dataset.frames = ++screen.frames;
      $('screen-status').textContent = `${screen.w}×${screen.h} · ${Math.round(performance.now() - t0)} ms`;
    } catch (e) {
      $('screen-status').textContent = 'no screen: ' + e.message;
      await sleep(2000);
    }
    await sleep(Math.max(0, SCREEN_PERIOD_MS - (performance.now() - t0)));
  }
  if (screen.loop === id) screen.loop = null;
}

// The screenshot's pixel under the pointer, or null outside it.
function screenPoint(ev) {
  const img = $('screen-img');
  const r = img.getBoundingClientRect();
  const w = img.naturalWidth, h = img.naturalHeight;
  if (!w || !h || !r.width || !r.height) return null;
  const x = Math.floor(((ev.clientX - r.left) * w) / r.width);
  const y = Math.floor(((ev.clientY - r.top) * h) / r.height);
  return x >= 0 && y >= 0 && x < w && y < h ? [x, y] : null;
}

function sendInput(actions) {
  const img = $('screen-img');
  const body = { actions, width: img.naturalWidth, height: img.naturalHeight };
  const id = current;
  screen.queue = screen.queue.then(async () => {
    if (current !== id) return;
    try {
      await api('POST', sp('/input'), body);
      img.dataset.sent = Number(img.dataset.sent || 0) + actions.length;
    } catch (e) {
      $('screen-status').textContent = 'input refused: ' + e.message;
    }
  });
}

const takingOver = () => $('take-over').checked && !$('screen-pane').hidden;

$('take-over').addEventListener('change', () => {
  $('screen-img').classList.toggle('live', $('take-over').checked);
  if ($('take-over').checked) $('screen-img').focus();
});

const screenImg = $('screen-img');
screenImg.addEventListener('mousedown', (ev) => {
  if (!takingOver()) return;
  ev.preventDefault();
  screenImg.focus();
  const at = screenPoint(ev);
  if (!at) return;
  if (ev.button === 0) sendInput([{ action: 'left_mouse_down', coordinate: at }]);
  else if (ev.button === 1) sendInput([{ action: 'middle_click', coordinate: at }]);
  else if (ev.button === 2) sendInput([{ action: 'right_click', coordinate: at }]);
});
screenImg.addEventListener('mouseup', (ev) => {
  if (!takingOver() || ev.button !== 0) return;
  ev.preventDefault();
  const at = screenPoint(ev);
  sendInput([at ? { action: 'left_mouse_up', coordinate: at } : { action: 'left_mouse_up' }]);
});
screenImg.addEventListener('contextmenu', (ev) => { if (takingOver()) ev.preventDefault(); });
// Moves go at most one request at a time: the latest position waits for the one in flight.
screenImg.addEventListener('mousemove', (ev) => {
  if (!takingOver()) return;
  const at = screenPoint(ev);
  if (!at) return;
  const pending = screen.moving !== null;
  screen.moving = at;
  if (pending) return;
  setTimeout(() => {
    const to = screen.moving;
    screen.moving = null;
    if (to) sendInput([{ action: 'mouse_move', coordinate: to }]);
  }, 50);
});
screenImg.addEventListener('wheel', (ev) => {
  if (!takingOver()) return;
  ev.preventDefault();
  const at = screenPoint(ev);
  if (!at || (!ev.deltaX && !ev.deltaY)) return;
  const dir = Math.abs(ev.deltaY) >= Math.abs(ev.deltaX) ? (ev.deltaY > 0 ? 'down' : 'up') : (ev.deltaX > 0 ? 'right' : 'left');
  sendInput([{ action: 'scroll', coordinate: at, scroll_direction: dir, scroll_amount: 1 }]);
}, { passive: false });

// The browser's key names as the input's (xdotool's); a printable key without ctrl, alt or
// meta is typed as its character.
const KEY_NAMES = {
  Enter: 'Return', Backspace: 'BackSpace', Tab: 'Tab', Escape: 'Escape', Delete: 'Delete',
  Insert: 'Insert', Home: 'Home', End: 'End', PageUp: 'Page_Up', PageDown: 'Page_Down',
  ArrowLeft: 'Left', ArrowRight: 'Right', ArrowUp: 'Up', ArrowDown: 'Down', ' ': 'space',
};

screenImg.addEventListener('keydown', (ev) => {
  if (!takingOver()) return;
  if (['Control', 'Shift', 'Alt', 'Meta', 'AltGraph', 'CapsLock'].includes(ev.key)) return;
  ev.preventDefault();
  const chord = ev.ctrlKey || ev.altKey || ev.metaKey;
  if (!chord && ev.key.length === 1 && ev.key !== ' ') {
    sendInput([{ action: 'type', text: ev.key }]);
    return;
  }
  let name = KEY_NAMES[ev.key] || (/^F([1-9]|1[0-2])$/.test(ev.key) ? ev.key : null);
  if (!name && ev.key.length === 1) name = ev.key.toLowerCase();
  if (!name) {
    $('screen-status').textContent = `the key ${ev.key} is not sent`;
    return;
  }
  const mods = [];
  if (ev.ctrlKey) mods.push('ctrl');
  if (ev.altKey) mods.push('alt');
  if (ev.shiftKey && (chord || name.length > 1)) mods.push('shift');
  if (ev.metaKey) mods.push('super');
  sendInput([{ action: 'key', text: [...mods, name].join('+') }]);
});

start();
