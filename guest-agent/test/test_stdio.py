#!/usr/bin/env python3
"""Drives `airlock-agent --stdio` on this machine: exec, stdin, timeouts, signals, errors,
flow control, file transfer beneath --root; then --unix, the kernels and --relay.
Usage: test_stdio.py AGENT [LOGFILE]"""
import base64
import hashlib
import json
import os
import re
import shutil
import socket
import signal as sig
import stat
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from alframes import *  # noqa: E402,F403

agent = sys.argv[1]
log = open(sys.argv[2] if len(sys.argv) > 2 else os.devnull, 'w')


def show_log_tail(kind, value, tb):
    """A failure that ends the script (a run that never answered) shows the agents' last
    words: the log file is gone with CI's build dir."""
    sys.__excepthook__(kind, value, tb)
    if log.name != os.devnull:
        log.flush()
        with open(log.name, errors='replace') as f:
            sys.stderr.write('# the agent log\'s end:\n' + ''.join(f.readlines()[-40:]))


sys.excepthook = show_log_tail
root = tempfile.mkdtemp(prefix='airlock-root-')
p = subprocess.Popen([agent, '--stdio', '--root', root], stdin=subprocess.PIPE,
                     stdout=subprocess.PIPE, stderr=log)
c = Conn(p.stdout.fileno(), p.stdin.fileno())
tap = Tap()
check = tap.check


# Before HELLO
c.send(exec_(1, ['true']))
t, _, i, d = c.expect(ERROR)
check('frame before hello', i == 1 and d['klass'] == ERR['PROTOCOL'], d)

c.send(hello(version=7))
t, _, i, d = c.expect(ERROR)
check('bad version', i == 0 and 'version 7 not supported' in d['message'], d)

c.send(hello(nonce=0x1234))
t, _, i, d = c.expect(HELLO_ACK)
check('hello-ack', d['nonce'] == 0x1234 and d['version'] == PROTO_VERSION and 'sh' in d['langs'], d)
print('#   ', d)
ack = d

d, out, err, fr = c.run(2, ['echo', 'hi'])
check('echo hi', d.get('how') == 0 and d['value'] == 0 and out == b'hi\n', (d, out))
types = [NAMES[f[0]] for f in fr]
check('frame order', types[0] == 'STARTED' and types[-1] == 'EXIT', types)

d, out, err, _ = c.run(3, ['echo $0 $1 >&2; pwd; echo $FOO; exit 3', 'x'], lang='sh',
                       cwd='/tmp', env=['FOO=bar'])
check('sh lang, cwd, env, exit 3', d.get('value') == 3 and out == b'/tmp\nbar\n'
      and err == b'sh x\n', (d, out, err))

d, out, err, fr = c.run(4, ['cat'], stdin=b'hello stdin')
credits = [f[3]['bytes'] for f in fr if f[0] == CREDIT]
check('stdin', out == b'hello stdin' and d.get('value') == 0 and sum(credits) == 11,
      (d, out, credits))

# Big stdin: the host must wait for CREDIT once a window is out.
body = os.urandom(3 << 20)
c.send(exec_(30, ['cat'], flags=EXEC_STDIN))
c.expect(STARTED)
sent, window, out, credited = 0, 1 << 20, bytearray(), 0
while True:
    while sent < len(body) and window > 0:
        n = min(65536, window, len(body) - sent)
        c.send(data(30, 0, body[sent:sent + n], eof=sent + n == len(body)))
        sent += n
        window -= n
    t, fl, i, d = c.recv()
    if t == CREDIT and d['stream'] == 0:
        window += d['bytes']
        credited += d['bytes']
    elif t == DATA:
        out += d['data']
        if d['data']:
            c.send(credit(30, d['stream'], len(d['data'])))
    elif t == EXIT:
        break
check('3 MiB stdin with credit', bytes(out) == body and credited == len(body), (len(out), credited))
c.send(exec_(31, ['sleep', '100'], flags=EXEC_STDIN))  # reads nothing: all of it buffers
c.expect(STARTED)
c.send(*[data(31, 0, b'x' * 65536) for _ in range(18)])  # window + the 64 KiB pipe + 1 chunk
t, _, i, d = c.until(ERROR)
check('stdin beyond the window', i == 31 and d['klass'] == ERR['PROTOCOL'], d)
c.send(signal(31, 9))
c.until(EXIT)

# A PATH given in the request's environment is the one searched.
os.mkdir(os.path.join(root, 'bin'))
with open(os.path.join(root, 'bin', 'hello-airlock'), 'w') as f:
    f.write('#!/bin/sh\necho from path\n')
os.chmod(os.path.join(root, 'bin', 'hello-airlock'), 0o755)
d, out, err, _ = c.run(32, ['hello-airlock'], env=['PATH=%s/bin:/bin:/usr/bin' % root])
check('PATH from env', out == b'from path\n', (d, out))
os.unlink(os.path.join(root, 'bin', 'hello-airlock'))
os.rmdir(os.path.join(root, 'bin'))

t0 = time.time()
d, out, err, _ = c.run(5, ['sleep', '1000'], timeout_ms=300)
check('timeout', d.get('how') == 1 and d['value'] == 9 and d['flags'] & TIMED_OUT
      and time.time() - t0 < 2, d)

c.send(exec_(6, ['while :; do :; done'], lang='sh'))
c.expect(STARTED)
time.sleep(0.2)
c.send(signal(6, 2))
t, _, i, d = c.until(EXIT)
check('SIGINT busy loop', d['how'] == 1 and d['value'] == 2, d)

c.send(signal(99, 2))
t, _, i, d = c.expect(ERROR)
check('signal unknown id', i == 99 and d['klass'] == ERR['NOT_FOUND'], d)

d, *_ = c.run(7, ['no-such-command-xyz'])
check('unknown command', d.get('klass') == ERR['NOT_FOUND'] and 'command not found' in
      d['message'], d)
d, *_ = c.run(8, ['true'], cwd='/nonexistent')
check('bad cwd', d.get('klass') == ERR['NOT_FOUND'], d)
d, *_ = c.run(9, ['x'], lang='cobol')
check('unknown language', d.get('klass') == ERR['UNSUPPORTED'], d)

# Output cap: bytes past the cap are drained, the flag says so.
d, out, err, _ = c.run(10, ['head -c 1000000 /dev/zero; echo err >&2'], lang='sh', cap=1000)
check('output cap', len(out) == 1000 and err == b'err\n' and d['flags'] == TRUNC_OUT, (d, len(out)))

# Background process holding the pipe: the exec still ends.
t0 = time.time()
d, out, err, _ = c.run(11, ['sleep 100 & echo started'], lang='sh')
check('background leftover', d.get('value') == 0 and out == b'started\n'
      and time.time() - t0 < 2, (d, time.time() - t0))

# Flow control: without credit at most one window arrives.
c.send(exec_(12, ['head -c 3000000 /dev/zero'], lang='sh'))
got = 0
while True:
    f = c.recv(1.0)
    if f is None:
        break
    if f[0] == DATA:
        got += len(f[3]['data'])
check('window respected', got == 1 << 20, got)
c.send(credit(12, 1, got))
while True:
    t, fl, i, d = c.recv()
    if t == DATA:
        got += len(d['data'])
        if d['data']:
            c.send(credit(12, d['stream'], len(d['data'])))
    if t == EXIT:
        break
check('resumed on credit', got == 3000000 and d['value'] == 0, (got, d))

# Errors that keep the agent alive.
c.send(exec_(13, ['sleep', '5']))
c.expect(STARTED)
c.send(exec_(13, ['true']))
t, _, i, d = c.expect(ERROR)
check('id in use', i == 13 and d['klass'] == ERR['INVALID'], d)
c.send(signal(13, 9))
t, _, i, d = c.until(EXIT)
check('SIGKILL', d['how'] == 1 and d['value'] == 9, d)
c.send(exec_(0, ['true']))
t, _, i, d = c.expect(ERROR)
check('id 0', d['klass'] == ERR['INVALID'], d)
c.send(frame(STARTED, 14, b'\0\0\0\0'))
t, _, i, d = c.expect(ERROR)
check('wrong direction', i == 14 and d['klass'] == ERR['PROTOCOL'], d)
c.send(frame(EXEC, 15, b'\1\2\3'))
t, _, i, d = c.expect(ERROR)
check('malformed exec', i == 15 and d['klass'] == ERR['PROTOCOL'], d)
c.send(frame(40, 16, b'xyz'))
t, _, i, d = c.expect(ERROR)
check('unknown type', i == 16 and d['klass'] == ERR['PROTOCOL'], d)
c.send(b'garbage!' * 10)
t, _, i, d = c.expect(ERROR)
check('garbage', i == 0 and d['klass'] == ERR['PROTOCOL'], d)
c.send(ping(42, 17))
t, _, i, d = c.expect(PONG)
check('alive after garbage', i == 17 and d['value'] == 42, d)
c.send(shutdown())
t, _, i, d = c.expect(ERROR)
check('shutdown refused in stdio mode', d['klass'] == ERR['UNSUPPORTED'], d)
# REFRESH is for a VM restored from a template: an agent anywhere else (this host) neither
# announces it nor lets it set the machine's clock or name.
host_name, epoch_clock = socket.gethostname(), time.time()
c.send(refresh(18, 'not-this-host', sec=1))
t, _, i, d = c.expect(ERROR)
check('refresh refused in stdio mode', i == 18 and d['klass'] == ERR['UNSUPPORTED'] and
      not ack['caps'] & CAP_REFRESH and socket.gethostname() == host_name and
      time.time() >= epoch_clock, (d, ack['caps']))
c.send(refresh(19, 'a.b'))
t, _, i, d = c.expect(ERROR)
check('refresh with a dotted hostname is malformed', i == 19 and d['klass'] == ERR['PROTOCOL'], d)

# A run on a terminal: the program's controlling terminal, of the size asked, resized by RESIZE;
# stdout and stderr as one stream; ^C is the line discipline's; stdin's EOF hangs it up.
PTY_SH = ('tty >/dev/null && echo is-a-tty; stty size; echo to-stderr >&2; read line; '
          'echo "read:$line"; trap "stty size; echo winch" WINCH; echo trapped; '
          'while :; do sleep 0.1; done')
c.send(exec_(30, ['/bin/sh', '-c', PTY_SH], flags=EXEC_PTY | EXEC_STDIN, rows=24, cols=80))
c.expect(STARTED)


pty_streams = []  # streams other than 1 a terminal's run sent on


def pty_until(fid, want, timeout=10):
    got = b''
    end = time.time() + timeout
    while want not in got and time.time() < end:
        f = c.recv(max(0, end - time.time()))
        if f is None:
            break
        t, _, i, d = f
        if t == DATA and i == fid and d['stream'] != 1:
            pty_streams.append(d['stream'])
        if t == DATA and i == fid:
            got += d['data']
            if d['data']:
                c.send(credit(fid, 1, len(d['data'])))
        if t in (EXIT, ERROR) and i == fid:
            return got, d
    return got, None


got, _ = pty_until(30, b'to-stderr\r\n')
check('pty: a terminal of the size asked, stderr on it, \\n made \\r\\n',
      b'is-a-tty\r\n24 80\r\n' in got and b'to-stderr\r\n' in got, got)
c.send(data(30, 0, b'typed\r'))
got, _ = pty_until(30, b'trapped')
check('pty: keys are the terminal\'s input (echoed by it)', b'typed\r\n' in got and b'read:typed' in got, got)
c.send(resize(30, 50, 132))
got, _ = pty_until(30, b'winch')
check('pty: RESIZE sets the size and the program gets SIGWINCH', b'50 132' in got, got)
c.send(data(30, 0, b'\x03'))
got, d = pty_until(30, b'never')
check('pty: ^C is the terminal\'s interrupt', d is not None and d.get('how') == 1 and d.get('value') == 2, (got, d))
c.send(exec_(31, ['/bin/sh', '-c', 'sleep 100'], flags=EXEC_PTY | EXEC_STDIN, rows=24, cols=80))
c.expect(STARTED)
c.send(data(31, 0, b'', eof=True))
got, d = pty_until(31, b'never')
check('pty: stdin\'s EOF hangs the terminal up (SIGHUP)', d is not None and d.get('how') == 1 and d.get('value') == 1, (got, d))
c.send(resize(13, 24, 80))
t, _, i, d = c.expect(ERROR)
check('pty: RESIZE of a request that is none', i == 13 and d['klass'] == ERR['NOT_FOUND'], d)
c.send(exec_(32, ['sleep', '5']))
c.expect(STARTED)
c.send(resize(32, 24, 80))
t, _, i, d = c.expect(ERROR)
check('pty: RESIZE of a run without a terminal', i == 32 and d['klass'] == ERR['INVALID'], d)
c.send(signal(32, 9))
c.until(EXIT)
c.send(resize(33, 0, 80))
t, _, i, d = c.expect(ERROR)
check('pty: a 0-row RESIZE is malformed', i == 33 and d['klass'] == ERR['PROTOCOL'], d)
c.send(exec_(34, ['true'], flags=EXEC_PTY, rows=1001, cols=80))
t, _, i, d = c.expect(ERROR)
check('pty: 1001 rows are refused', i == 34 and d['klass'] == ERR['PROTOCOL'], d)
check('pty: one stream, 1 (stdout and stderr together)', not pty_streams, pty_streams)

# A run the host kills while it has no credit (a flood nobody reads): the host gave up on its
# output, so its end comes without it, and the request's slot is free again.
c.send(exec_(44, ['yes']))
c.expect(STARTED)
time.sleep(1)  # its stream is out of credit: nothing credits it here
c.send(signal(44, 9))
end = time.time() + 10
ended = None
while time.time() < end and not ended:
    f = c.recv(1)
    if f and f[0] == EXIT and f[2] == 44:
        ended = f[3]
check('a run killed without credit ends (EXIT, its unread output dropped)',
      ended is not None and ended.get('how') == 1 and ended.get('value') == 9, ended)

# CONNECT: a tunnel to 127.0.0.1:PORT (the agent runs here, so the port is this test's): the
# service's bytes as stream 1 under the credit, ours as stdin, our EOF its FIN, its close the end.
check('connect: the agent says it takes CONNECT', ack['caps'] & CAP_CONNECT, ack['caps'])
srv = socket.socket()
srv.bind(('127.0.0.1', 0))
srv.listen(1)
port = srv.getsockname()[1]
c.send(connect(40, port))
conn, _ = srv.accept()
c.expect(STARTED)
c.send(data(40, 0, b'ping'))
conn.settimeout(10)
check('connect: our bytes reach the service', conn.recv(100) == b'ping')
conn.sendall(b'pong' * 1000)
got, _ = pty_until(40, b'pong' * 1000)
check('connect: the service\'s bytes come back as stream 1', got == b'pong' * 1000, len(got))
c.send(data(40, 0, b'', eof=True))
check('connect: our EOF is the service\'s EOF (a half-close)', conn.recv(100) == b'')
conn.sendall(b'after')
conn.close()
got, d = pty_until(40, b'never')
check('connect: what it sends after our EOF, then its close ends the tunnel (EXIT 0)',
      got == b'after' and d is not None and d.get('how') == 0 and d.get('value') == 0, (got, d))
srv.close()
c.send(connect(41, port))  # nothing listens now
t, _, i, d = c.expect(ERROR)
check('connect: nothing listening is NOT_FOUND', i == 41 and d['klass'] == ERR['NOT_FOUND'], d)
c.send(frame(CONNECT, 42, struct.pack('<H', 0)))
t, _, i, d = c.expect(ERROR)
check('connect: port 0 is malformed', i == 42 and d['klass'] == ERR['PROTOCOL'], d)
srv = socket.socket()
srv.bind(('127.0.0.1', 0))
srv.listen(1)
c.send(connect(43, srv.getsockname()[1]))
conn, _ = srv.accept()
c.expect(STARTED)
c.send(signal(43, 9))
got, d = pty_until(43, b'never')
conn.settimeout(10)
check('connect: a KILL ends the tunnel and closes the service\'s connection',
      d is not None and d.get('how') == 0 and conn.recv(10) == b'', d)
conn.close()
srv.close()

# Files beneath --root.
os.mkdir(os.path.join(root, 'sub'))
os.symlink('/etc', os.path.join(root, 'etc-link'))
body = os.urandom(300000)
c.send(put(20, '/sub/f.bin', len(body), 0o640))
for off in range(0, len(body), 65536):
    c.send(data(20, 3, body[off:off + 65536], eof=off + 65536 >= len(body)))
while True:
    t, _, i, d = c.recv()
    if t != CREDIT:
        break
check('put', t == OK and d['value'] == len(body), (NAMES[t], d))
path = os.path.join(root, 'sub/f.bin')
check('put content', open(path, 'rb').read() == body and os.stat(path).st_mode & 0o777 == 0o640)
check('no temp left', os.listdir(os.path.join(root, 'sub')) == ['f.bin'], os.listdir(root + '/sub'))

c.send(get(21, 'sub/f.bin'))
t, _, i, d = c.expect(FILE_INFO)
check('file-info', d['size'] == len(body) and d['mode'] == 0o640, d)
got = b''
while True:
    t, fl, i, d = c.expect(DATA)
    got += d['data']
    if d['data']:
        c.send(credit(21, 3, len(d['data'])))
    if fl & EOF_FLAG:
        break
t, _, i, d = c.expect(OK)
check('get', got == body and d['value'] == len(body))

for fid, pth, klass in ((22, '../etc/passwd', 'INVALID'), (23, 'etc-link/passwd', 'INVALID'),
                        (24, 'sub/../../x', 'INVALID'), (25, 'nodir/x', 'NOT_FOUND'),
                        (26, 'sub', 'INVALID')):
    c.send(put(fid, pth, 1))
    t, _, i, d = c.expect(ERROR)
    check('put %s' % pth, i == fid and d['klass'] == ERR[klass], d)
c.send(get(27, 'etc-link/passwd'))
t, _, i, d = c.expect(ERROR)
check('get escape', 'escapes' in d['message'], d)
c.send(get(28, 'etc-link'))
t, _, i, d = c.expect(ERROR)
check('get symlink', 'not a regular file' in d['message'], d)
c.send(put(29, 'short', 10), data(29, 3, b'abc', eof=True))
t, _, i, d = c.expect(ERROR)
check('size mismatch', 'size mismatch' in d['message']
      and sorted(os.listdir(root)) == ['etc-link', 'sub'], (d, os.listdir(root)))

# Latency of `true`.
t0 = time.time()
runs = [c.run(100 + k, ['true'])[0] for k in range(50)]
check('50 execs of true all exit 0', all(d.get('how') == 0 and d.get('value') == 0 for d in runs),
      [d for d in runs if d.get('value') != 0][:3])
print('#    exec true round trip: %.2f ms' % ((time.time() - t0) / 50 * 1000))

# Throughput: stdout of a big producer, credited as it arrives.
n = 64 << 20
t0 = time.time()
d, out, err, fr = c.run(200, ['head -c %d /dev/zero' % n], lang='sh', timeout=60)
dt = time.time() - t0
check('throughput', len(out) == n, len(out))
print('#    stdout throughput: %.0f MB/s' % (n / dt / 1e6))

# 64 concurrent requests, the 65th refused.
for k in range(64):
    c.send(exec_(300 + k, ['sleep', '10']))
for k in range(64):
    c.expect(STARTED)
c.send(exec_(400, ['true']))
t, _, i, d = c.expect(ERROR)
check('request limit', i == 400 and d['klass'] == ERR['LIMIT'], d)
c.send(hello(nonce=9))     # a new HELLO kills everything
t, _, i, d = c.expect(HELLO_ACK)
check('hello resets', d['nonce'] == 9)
time.sleep(0.3)
kids = [d for d in os.listdir('/proc') if d.isdigit() and os.path.exists('/proc/%s/stat' % d)
        and open('/proc/%s/stat' % d).read().rsplit(')', 1)[1].split()[1] == str(p.pid)]
check('children killed on reset', not kids, kids)

# EOF on stdin ends the agent.
c.send(exec_(500, ['sleep', '100']))
c.expect(STARTED)
p.stdin.close()
rc = p.wait(5)
check('exit on EOF', rc == 0, rc)
# --unix: one connection at a time; a dropped connection kills its requests. (Newest wins and
# kernels kept across connections: with --relay below.)
sock = os.path.join(root, 'agent.sock')
u = subprocess.Popen([agent, '--unix', sock, '--root', root], stderr=log)
c = Conn.unix(sock)
c.send(hello(nonce=5))
c.expect(HELLO_ACK)
c.send(exec_(1, ['sleep', '100']))
t, _, _, d = c.expect(STARTED)
c.sock.close()
time.sleep(0.5)
check('unix: request killed on disconnect', not os.path.exists('/proc/%d' % d['pid'])
      or open('/proc/%d/stat' % d['pid']).read().split()[2] == 'Z')
c = Conn.unix(sock)
c.send(exec_(2, ['true']))
t, _, i, d = c.expect(ERROR)
check('unix: new connection needs hello', d['klass'] == ERR['PROTOCOL'], d)
c.send(hello(nonce=6))
c.expect(HELLO_ACK)
d, out, err, _ = c.run(3, ['echo', 'again'])
check('unix: second connection', out == b'again\n', (d, out))
u.send_signal(sig.SIGTERM)
check('unix: exit on SIGTERM', u.wait(5) == 0)


# ---- Language kernels (python, shell, javascript) and input waits, on this machine's
# interpreters, the drivers taken from the source tree. ----
kernels = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'kernels')
k = subprocess.Popen([agent, '--stdio', '--root', root, '--kernels', kernels],
                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
c = Conn(k.stdout.fileno(), k.stdin.fileno())
c.send(hello(nonce=77))
t, _, i, d = c.expect(HELLO_ACK)
have = {'python': shutil.which('python3', path='/usr/bin:/bin:/usr/local/bin'),
        'shell': shutil.which('bash', path='/usr/bin:/bin:/usr/local/bin'),
        'javascript': shutil.which('node', path='/usr/bin:/bin:/usr/local/bin')}
check('hello-ack announces the kernels found here',
      all(('kernel:' + n in d['langs']) == bool(x) for n, x in have.items()), (d['langs'], have))
fid = [1000]
EXEC_KERNEL_OP = 4


def krun(lang, code, **kw):
    """One code block in a kernel: (exit or error dict, stdout, stderr, frames)."""
    fid[0] += 1
    kw['flags'] = kw.get('flags', 0) | EXEC_KERNEL
    c.results = b''
    return c.run(fid[0], [code], lang=lang, **kw)


def kstart(lang, code, **kw):
    fid[0] += 1
    c.results = b''
    c.send(exec_(fid[0], [code], lang=lang, flags=kw.pop('flags', 0) | EXEC_KERNEL, **kw))
    c.expect(STARTED)
    return fid[0]


def route(d, out, err):
    """A DATA frame's bytes to stdout, stderr or the run's results (c.results)."""
    if d['stream'] == 4:
        c.results += d['data']
        return out, err
    return (out + d['data'], err) if d['stream'] == 1 else (out, err + d['data'])


def records():
    """The last run's result records, decoded."""
    recs, b = [], c.results
    while len(b) >= 4:
        n = struct.unpack('<I', b[:4])[0]
        recs.append(json.loads(b[4:4 + n]))
        b = b[4 + n:]
    return recs


def shown(out):
    """stdout, then each value's text/plain on a line, as a REPL shows a block's output."""
    return out + b''.join(r['data']['text/plain'].encode() + b'\n' for r in records()
                          if r['type'] == 'execute_result')


def kfinish(rid, sig=None, wait_for=None, timeout=10):
    """Optionally waits for a frame type, sends a signal, and collects up to EXIT: (exit,
    stdout, stderr, types seen)."""
    out, err, seen = b'', b'', []
    if wait_for:
        f = c.recv(timeout)
        while f and f[0] != wait_for and f[0] not in (EXIT, ERROR):
            seen.append(f[0])
            if f[0] == DATA:
                out, err = route(f[3], out, err)
            f = c.recv(timeout)
        seen.append(f[0] if f else None)
        if not f or f[0] in (EXIT, ERROR):
            return (f[3] if f else None), out, err, seen
    if sig:
        c.send(signal(rid, sig))
    while True:
        f = c.recv(timeout)
        if f is None:
            return None, out, err, seen
        t, fl, i, d = f
        seen.append(t)
        if t == DATA:
            out, err = route(d, out, err)
        if t in (EXIT, ERROR) and i == rid:
            return d, out, err, seen


def kinterrupt(lang, code):
    """Starts code in lang's kernel, and half a second in sends it SIGINT: kfinish's answer."""
    rid = kstart(lang, code)
    time.sleep(0.5)
    return kfinish(rid, sig=2)


def ok_exit(d, value=0):
    return d is not None and d.get('how') == 0 and d.get('value') == value


if have['python']:
    d, out, err, _ = krun('python', 'x = 41\nimport os\ndef twice(v):\n    return 2 * v\n')
    d, out, err, _ = krun('python', 'x + 1')
    check('python: state across runs, the last value printed', ok_exit(d) and shown(out) == b'42\n',
          (d, out, err))
    d, out, err, _ = krun('python', 'print(twice(x))\n1/0')
    check('python: a traceback without the driver, status 1', ok_exit(d, 1) and out == b'82\n'
          and b'ZeroDivisionError' in err and b'Cell In [' in err and b'python.py' not in err,
          (d, out, err))
    d, out, err, _ = krun('python', 'x')
    check('python: alive after the exception', ok_exit(d) and shown(out) == b'41\n', (d, out, err))
    d, out, err, _ = krun('python', 'if x:\n  y = (')
    check('python: a syntax error is the block\'s failure', ok_exit(d, 1) and
          b'SyntaxError' in err and b'python.py' not in err, (d, err))
    d, out, err, _ = kinterrupt('python', 'x = 5\nwhile True: pass')
    check('python: SIGINT raises KeyboardInterrupt, status 130', ok_exit(d, 130) and
          b'KeyboardInterrupt' in err and b'python.py' not in err, (d, err))
    d, out, err, _ = krun('python', 'x')
    check('python: variables survive the interrupt', ok_exit(d) and shown(out) == b'5\n', (d, out, err))
    d, out, err, _ = krun('python', 'name = input("who? ")\nprint("hi", name)', stdin=b'bob\n')
    check('python: input() reads the run\'s stdin', ok_exit(d) and out == b'who? hi bob\n',
          (d, out, err))
    d, out, err, _ = krun('python', 'import sys\nsys.stdin.read()')
    check('python: without stdin, stdin is at EOF', ok_exit(d) and shown(out) == b"\'\'\n", (d, out, err))
    t0 = time.time()
    rid = kstart('python', 'input()', input_wait_ms=400)
    d, out, err, seen = kfinish(rid, sig=2, wait_for=WAITING)
    check('python: input() without stdin is reported waiting, then interrupted',
          WAITING in seen and ok_exit(d, 130) and b'KeyboardInterrupt' in err, (d, seen, err))
    check('python: the wait is reported after about input_wait_ms', 0.35 < time.time() - t0 < 3,
          time.time() - t0)
    rid = kstart('python', 'import time\ntime.sleep(1)', input_wait_ms=300)
    d, out, err, seen = kfinish(rid)
    check('python: a quiet sleep is not a wait for input', ok_exit(d) and WAITING not in seen,
          (d, seen))
    rid = kstart('python', 'import time\ntime.sleep(5)')
    fid[0] += 1
    c.send(exec_(fid[0], ['1'], lang='python', flags=EXEC_KERNEL))
    f = c.recv(10)
    while f and f[0] == DATA:  # the running block's result records may come first
        f = c.recv(10)
    t, _, i, d = f
    check('python: a busy kernel refuses a second run', i == fid[0] and d['klass'] == ERR['LIMIT'],
          d)
    d, *_ = kfinish(rid, sig=2)
    d, out, err, _ = krun('python', 'print("y" * 100000)\nprint("z")', cap=1000)
    check('python: output cap', ok_exit(d) and out == b'y' * 1000 and d['flags'] == TRUNC_OUT,
          (d, len(out)))
    d, out, err, _ = krun('python', 'import threading, time\n'
                          'threading.Thread(target=lambda: (time.sleep(0.3), print("late"))).start()')
    time.sleep(0.6)
    d, out, err, _ = krun('python', 'print("next")')
    check('python: output between runs goes to no run', ok_exit(d) and out == b'next\n',
          (d, out))
    t0 = time.time()
    d, out, err, _ = krun('python', 'while True: pass', timeout_ms=300)
    check('python: a timeout interrupts the block', ok_exit(d, 130) and d['flags'] & TIMED_OUT
          and b'KeyboardInterrupt' in err and time.time() - t0 < 3, (d, err))
    d, out, err, _ = krun('python', 'x')
    check('python: the kernel survives its timeout', ok_exit(d) and shown(out) == b'5\n', (d, out))
    # Transforming and parsing 8000 statements takes IPython a few tenths of a second: the
    # timeout's SIGINT comes while the driver's own code runs, is held, and stops the block
    # before it starts.
    big = 'y=1\n' * 8000 + 'while True: pass\n'
    t0 = time.time()
    d, out, err, _ = krun('python', big, timeout_ms=40)
    check('python: a timeout during the driver\'s work stops the block before it starts',
          ok_exit(d, 130) and d['flags'] & TIMED_OUT and b'KeyboardInterrupt' in err and
          b'python.py' not in err and b'Traceback' not in err and time.time() - t0 < 2,
          (d, err[-500:], time.time() - t0))
    d, out, err, _ = krun('python', "print(x, 'y' in dir())")
    check('python: ...and the kernel keeps its variables', ok_exit(d) and out == b'5 False\n',
          (d, out, err))
    d, out, err, _ = krun('python', '    z = 1\n    if z:\n        print(z + x)\n')
    check('python: a uniformly indented block runs dedented', ok_exit(d) and out == b'6\n',
          (d, out, err))
    d, out, err, _ = krun('python', '\n    z = 2\n    1 / 0\n')
    # IPython drops the leading blank line, as Jupyter does: the line of the cell it ran.
    check('python: ...its traceback has the block\'s line', ok_exit(d, 1) and
          b'line 2' in err and b'1 / 0' in err, (d, err))
    d, out, err, _ = krun('python', 'import os\nos._exit(3)')
    check('python: a kernel that dies ends the run with its status', ok_exit(d, 3), d)
    d, out, err, _ = krun('python', 'x')
    check('python: the next run restarts it and says so', ok_exit(d, 1) and
          b'kernel restarted; state lost' in err and b'NameError' in err, (d, err))
    if subprocess.call([have['python'], '-c', 'import matplotlib'], stderr=subprocess.DEVNULL) == 0:
        fig = os.path.join(root, 'al-fig.png')  # not /tmp's: two runs of this test at once
        d, out, err, _ = krun('python', 'import matplotlib.pyplot as plt\n'
                              'plt.plot([1, 3, 2])\nplt.savefig(%r)\nplt.show()' % fig,
                              timeout=120)
        pngs = [base64.b64decode(r['data']['image/png']) for r in records()
                if r['type'] == 'display_data' and 'image/png' in r['data']]
        check('python: plt.show() gives the figure as one image/png result; savefig still saves',
              ok_exit(d) and len(pngs) == 1 and pngs[0][:8] == b'\x89PNG\r\n\x1a\n' and
              open(fig, 'rb').read(8) == pngs[0][:8], (d, out, err[-300:]))
        os.unlink(fig)
    else:
        print('# matplotlib is not importable by %s: plot test skipped' % have['python'])

    # IPython's notebook features, and the results on the kernel's fd 4 (docs/PROTOCOL.md).
    d, out, err, _ = krun('python', 'display(1)\nprint("between")\ndisplay({"a": 2})\n3')
    recs = records()
    check('python: a count, display() twice in order, then the value',
          ok_exit(d) and [r['type'] for r in recs] == ['count', 'display_data', 'display_data',
                                                     'execute_result'] and
          [r['data']['text/plain'] for r in recs[1:]] == ['1', "{'a': 2}", '3'] and
          recs[3]['execution_count'] == recs[0]['execution_count'] and out == b'between\n',
          (d, out, recs))
    d, out, err, _ = krun('python', 'def f():\n    raise ValueError("bad")\nf()')
    recs = records()
    check('python: an exception is an error record (name, value, traceback), no result',
          ok_exit(d, 1) and [r['type'] for r in recs] == ['count', 'error'] and
          recs[1]['name'] == 'ValueError' and recs[1]['value'] == 'bad' and
          'f()' in recs[1]['traceback'] and b'ValueError' in err, (d, recs, err))
    d, out, err, _ = krun('python', '%cd /tmp\n!pwd\n!echo $AL_RUN_ONLY',
                          env=['AL_RUN_ONLY=visible'])
    check('python: %cd, then !pwd in the new cwd; a run\'s env reaches its commands',
          ok_exit(d) and out.endswith(b'/tmp\nvisible\n'), (d, out, err))
    d, out, err, _ = krun('python', 'import os\nos.environ.get("AL_RUN_ONLY", "gone")')
    check('python: the run\'s env is gone in the next run', ok_exit(d) and
          shown(out) == b"'gone'\n", (d, out, err))
    d, out, err, _ = krun('python', 'class R:\n    def __repr__(self):\n        raise OSError("no")\n'
                          'R()')
    d2, out2, err2, _ = krun('python', '6 * 7')
    check('python: a repr that raises is reported and the kernel lives on',
          ok_exit(d) and b'OSError' in err and ok_exit(d2) and shown(out2) == b'42\n',
          (d, err, d2, out2))

    # Contexts: "python@NAME" is a kernel of its own, with its own state and cwd.
    krun('python@a', 'ctx = "a"\nimport os\nos.chdir("/tmp")')
    krun('python@b', 'ctx = "b"')
    d, out, err, _ = krun('python@a', 'ctx, os.getcwd()')
    a_val = shown(out)
    d2, out2, err2, _ = krun('python@b', 'import os\nctx, os.getcwd() == "/tmp"')
    check('python: two contexts keep their own variables and cwd',
          a_val == b"('a', '/tmp')\n" and shown(out2) == b"('b', False)\n", (a_val, out2, err2))
    # A fresh kernel's first run sets where it is; later runs' cwd does not move it.
    d, out, err, _ = krun('python@c', 'import os\nos.getcwd()', cwd='/tmp')
    d2, out2, err2, _ = krun('python@c', 'os.getcwd()', cwd='/')
    check('python: a new kernel starts in its first run\'s cwd and keeps its own after',
          ok_exit(d) and shown(out) == b"'/tmp'\n" and shown(out2) == b"'/tmp'\n",
          (d, out, err, out2, err2))
    krun('python@c', 'stop', flags=EXEC_KERNEL_OP)
    d, out, err, _ = krun('python', 'list', flags=EXEC_KERNEL_OP)
    check('contexts: list names each running context', ok_exit(d) and
          b'python a running\n' in out and b'python b running\n' in out, (d, out))
    d, out, err, _ = krun('python@a', 'stop', flags=EXEC_KERNEL_OP)
    d2, out2, err2, _ = krun('python', 'list', flags=EXEC_KERNEL_OP)
    d3, out3, err3, _ = krun('python@a', 'ctx')
    check('contexts: stop ends one; the next run there starts afresh, the other keeps its state',
          ok_exit(d) and b'python a ' not in out2 and b'python b running' in out2 and
          ok_exit(d3, 1) and b'NameError' in err3 and b'state lost' not in err3 and
          shown(krun('python@b', 'ctx')[1]) == b"'b'\n", (d, out2, d3, err3))
    krun('python@a', 'stop', flags=EXEC_KERNEL_OP)
    krun('python@b', 'stop', flags=EXEC_KERNEL_OP)
    fid[0] += 1
    c.send(exec_(fid[0], ['x'], lang='python@bad/name', flags=EXEC_KERNEL))
    t, _, i, d = c.expect(ERROR)
    check('contexts: a bad context name is refused', d['klass'] == ERR['UNSUPPORTED'], d)

if have['shell']:
    d, out, err, _ = krun('shell', 'cd /tmp && v=5 && greet() { echo "hi $1"; }; false')
    check('shell: the block\'s status', ok_exit(d, 1), (d, err))
    d, out, err, _ = krun('shell', 'echo $v; pwd; greet you')
    check('shell: cwd, variables and functions persist', ok_exit(d) and
          out == b'5\n/tmp\nhi you\n', (d, out, err))
    d, out, err, _ = krun('shell', 'exit_code() { return 7; }; exit_code')
    check('shell: status 7', ok_exit(d, 7), d)
    d, out, err, _ = kinterrupt('shell', 'v=6; while :; do :; done')
    check('shell: SIGINT stops a builtin loop, status 130', ok_exit(d, 130), d)
    rid = kstart('shell', 'sleep 100; echo not reached')
    time.sleep(0.3)
    d, out, err, _ = kfinish(rid, sig=2)
    check('shell: SIGINT stops a foreground command and the rest of the block',
          ok_exit(d, 130) and b'not reached' not in out, (d, out))
    d, out, err, _ = krun('shell', 'echo $v; pwd')
    check('shell: bash survives the interrupts with its state', ok_exit(d) and
          out == b'6\n/tmp\n', (d, out, err))
    d, out, err, _ = krun('shell', 'read a b; echo "[$b] [$a]"', stdin=b'one two\n')
    check('shell: read gets the run\'s stdin', ok_exit(d) and out == b'[two] [one]\n', (d, out))
    rid = kstart('shell', 'read line', input_wait_ms=300)
    d, out, err, seen = kfinish(rid, sig=2, wait_for=WAITING)
    check('shell: read without stdin is reported waiting', WAITING in seen and ok_exit(d, 130),
          (d, seen))
    rid = kstart('shell', 'sleep 1', input_wait_ms=300)
    d, out, err, seen = kfinish(rid)
    check('shell: a quiet sleep is not a wait for input', ok_exit(d) and WAITING not in seen,
          (d, seen))
    d, out, err, _ = krun('shell', 'echo "$FOO"; pwd', env=['FOO=bar baz'], cwd='/')
    check('shell: env of the run; a running kernel keeps its cwd', ok_exit(d) and
          out == b'bar baz\n/tmp\n', (d, out))
    d, out, err, _ = krun('shell', "echo 'it'\\''s' \"!x\"; echo $((6 * 7))")
    check('shell: quotes and ! pass through untouched', ok_exit(d) and
          out == b"it's !x\n42\n", (d, out, err))

if have['javascript']:
    d, out, err, _ = krun('javascript', 'var a = 3; let b = 4; function f() { return a * b; }',
                          cwd='/tmp')
    d, out, err, _ = krun('javascript', 'process.cwd()')
    check('javascript: a new kernel starts in the run\'s cwd', ok_exit(d) and shown(out) == b"'/tmp'\n",
          (d, out, err))
    d, out, err, _ = krun('javascript', 'f() + b')
    check('javascript: var, let and functions persist; the value is printed', ok_exit(d) and
          shown(out) == b'16\n', (d, out, err))
    d, out, err, _ = krun('javascript', 'null.x')
    check('javascript: an error prints its stack, status 1', ok_exit(d, 1) and
          b'TypeError' in err and b'node.js' not in err, (d, err))
    d, out, err, _ = kinterrupt('javascript', 'a = 9; while (true) {}')
    check('javascript: SIGINT interrupts a busy loop, status 130', ok_exit(d, 130), (d, err))
    d, out, err, _ = krun('javascript', 'a')
    check('javascript: globals survive the interrupt', ok_exit(d) and shown(out) == b'9\n', (d, out, err))
    # A timeout while the driver compiles a big block (some 40 ms here; breakOnSigint is not
    # armed yet) is held, and stops the block before it starts.
    big = 'var y=1;\n' * 25000 + 'while (true) {}\n'
    t0 = time.time()
    d, out, err, _ = krun('javascript', big, timeout_ms=15)
    check('javascript: a timeout during the driver\'s work stops the block before it starts',
          ok_exit(d, 130) and d['flags'] & TIMED_OUT and time.time() - t0 < 1.5,
          (d, err[-300:], time.time() - t0))
    d, out, err, _ = krun('javascript', 'a')
    check('javascript: ...and the kernel keeps its globals', ok_exit(d) and shown(out) == b'9\n',
          (d, out, err))
    d, out, err, _ = krun('javascript', 'new Promise(r => setTimeout(() => r(a + 1), 100))')
    check('javascript: a promise\'s value is awaited', ok_exit(d) and shown(out) == b'10\n',
          (d, out))
    d, out, err, _ = krun('javascript', 'require("fs").readFileSync(0, "utf8").trim()',
                          stdin=b'from stdin\n')
    check('javascript: the run\'s stdin', ok_exit(d) and shown(out) == b"'from stdin'\n", (d, out, err))
    rid = kstart('javascript', 'new Promise(r => process.stdin.once("data", r))', input_wait_ms=300)
    d, out, err, seen = kfinish(rid, sig=2, wait_for=WAITING)
    check('javascript: a read of process.stdin is reported waiting', WAITING in seen and
          ok_exit(d, 130), (d, seen, err))
    # Notebook cells: top-level await, import declarations, let/const declared again.
    d, out, err, _ = krun('javascript', 'await Promise.resolve(1)')
    check('javascript: top-level await; its value is printed', ok_exit(d) and shown(out) == b'1\n',
          (d, out, err))
    d, out, err, _ = krun('javascript', 'const w = await new Promise(r => setTimeout(() => r(5), 10));'
                          '\nfunction g() { return w + 1; }\nw')
    check('javascript: const with await, and its value', ok_exit(d) and shown(out) == b'5\n',
          (d, out, err))
    d, out, err, _ = krun('javascript', 'w + g()')
    check('javascript: an awaiting block\'s const and function persist', ok_exit(d) and
          shown(out) == b'11\n', (d, out, err))
    d, out, err, _ = krun('javascript', "import fs from 'fs'\nimport { readFileSync as rd, "
                          "existsSync } from 'fs'\nimport * as P from 'node:path'")
    d, out, err, _ = krun('javascript', "[fs.readFileSync('/etc/hostname', 'utf8') === "
                          "rd('/etc/hostname', 'utf8'), existsSync('/'), P.basename('/a/b')]")
    check('javascript: import declarations (default, named, namespace) of builtins',
          ok_exit(d) and shown(out) == b"[ true, true, 'b' ]\n", (d, out, err))
    jsdir = tempfile.mkdtemp(prefix='airlock-js-', dir=root)  # goes with root at the end
    os.makedirs(os.path.join(jsdir, 'node_modules', 'pkg'))
    with open(os.path.join(jsdir, 'node_modules', 'pkg', 'index.js'), 'w') as f:
        f.write('exports.twice = (v) => 2 * v;\n')
    with open(os.path.join(jsdir, 'local.mjs'), 'w') as f:
        f.write('export default 7;\n')
    d, out, err, _ = krun('javascript', f"process.chdir({jsdir!r})\n"
                          "import { twice } from 'pkg'\nimport seven from './local.mjs'\ntwice(seven)")
    check('javascript: imports resolve from the current directory', ok_exit(d) and
          shown(out) == b'14\n', (d, out, err))
    d, out, err, _ = krun('javascript', 'let la = 1; const lc = 1; class K {}')
    for what, code, want in [
            ('let, const and class declared again in a later block',
             'let la = 2; const lc = 3; class K { v() { return 4; } }\n[la, lc, new K().v()]',
             b'[ 2, 3, 4 ]\n'),
            ('let without a value is undefined again', 'let la\n[la]', b'[ undefined ]\n'),
            ('declared again with await, destructuring',
             'const lc = await Promise.resolve(8); let { p, q: [r] } = { p: 1, q: [2] }; [lc, p, r]',
             b'[ 8, 1, 2 ]\n'),
            ('an awaiting block\'s last value in parentheses', 'await null; (lc)', b'8\n')]:
        d, out, err, _ = krun('javascript', code)
        check('javascript: ' + what, ok_exit(d) and shown(out) == want, (d, out, err))
    d, out, err, _ = krun('javascript', 'await null;\nnull.x')
    check('javascript: an error in an awaiting block reports with its line, status 1',
          ok_exit(d, 1) and b'TypeError' in err and re.search(rb'cell \d+:2:', err) and
          b'node.js' not in err, (d, err))
    d, out, err, _ = kinterrupt('javascript', 'a = 11; await new Promise(r => setTimeout(r, 100000))')
    check('javascript: SIGINT stops waiting in an awaiting block, status 130', ok_exit(d, 130),
          (d, err))
    d, out, err, _ = krun('javascript', '[a, lc]')
    check('javascript: ...and the kernel keeps its globals', ok_exit(d) and
          shown(out) == b'[ 11, 8 ]\n', (d, out, err))

# Plain execs get the same input-wait check.
rid = 3000
c.send(exec_(rid, ['read x'], lang='sh', input_wait_ms=300))
c.expect(STARTED)
d, out, err, seen = kfinish(rid, sig=9, wait_for=WAITING)
check('exec: read without stdin is reported waiting', WAITING in seen and d.get('how') == 1, (d, seen))
c.send(exec_(rid + 1, ['sleep 1'], lang='sh', input_wait_ms=300))
c.expect(STARTED)
d, out, err, seen = kfinish(rid + 1)
check('exec: a quiet sleep is not a wait', ok_exit(d) and WAITING not in seen, (d, seen))
# Waiting in select, poll or epoll with stdin among the fds counts too; for a timer it does not.
waits = (('select', 'select.select([0], [], [])'),
         ('poll', 'p = select.poll(); p.register(0, select.POLLIN); p.poll()'),
         ('epoll', 'e = select.epoll(); e.register(0, select.EPOLLIN); e.poll()'))
for n, (name, code) in enumerate(waits):
    c.send(exec_(rid + 10 + n, ['/usr/bin/python3', '-c', 'import select\n' + code],
                 input_wait_ms=300))
    c.expect(STARTED)
    d, out, err, seen = kfinish(rid + 10 + n, sig=9, wait_for=WAITING)
    check('exec: %s on stdin is reported waiting' % name, WAITING in seen, (d, seen, err))
c.send(exec_(rid + 20, ['/usr/bin/python3', '-c', 'import select\nselect.select([], [], [], 1)'],
             input_wait_ms=300))
c.expect(STARTED)
d, out, err, seen = kfinish(rid + 20)
check('exec: select on nothing but a timer is not a wait', ok_exit(d) and WAITING not in seen,
      (d, seen))
c.send(exec_(rid + 2, ['cat'], flags=EXEC_STDIN, input_wait_ms=300))
c.expect(STARTED)
c.send(data(rid + 2, 0, b'partial'))
d, out, err, seen = kfinish(rid + 2, wait_for=WAITING)
check('exec: cat waiting for more stdin is reported', WAITING in seen, seen)
c.send(data(rid + 2, 0, b'', eof=True))
d, out, err, seen = kfinish(rid + 2)
check('exec: and ends at EOF', ok_exit(d), (d, out))

for bad_lang, argv, klass in (('cobol', ['1'], 'UNSUPPORTED'), ('python', ['1', '2'], 'INVALID'),
                              ('python', ['a\0b'], 'INVALID')):
    fid[0] += 1
    c.send(exec_(fid[0], argv, lang=bad_lang, flags=EXEC_KERNEL))
    t, _, i, d = c.expect(ERROR)
    check('kernel %s %r refused' % (bad_lang, argv), i == fid[0] and d['klass'] == ERR[klass], d)

if have['python']:
    krun('python', 'kept = 7')
    c.send(hello(nonce=78))
    c.expect(HELLO_ACK)
    d, out, err, _ = krun('python', 'kept')
    check('a new hello keeps idle kernels (the re-handshake after a checkpoint restore)',
          ok_exit(d) and shown(out) == b'7\n', (d, out, err))
k.stdin.close()
check('kernels: agent exits on EOF', k.wait(5) == 0)

# A python kernel that takes a second to start (a sitecustomize that sleeps): the start does not
# count against the run's timeout, and a signal while it starts ends it without a traceback.
if have['python']:
    slow = tempfile.mkdtemp(prefix='airlock-slow-')
    with open(os.path.join(slow, 'sitecustomize.py'), 'w') as f:
        f.write('import time\ntime.sleep(1.2)\n')
    k = subprocess.Popen([agent, '--stdio', '--root', root, '--kernels', kernels],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                         env=dict(os.environ, PYTHONPATH=slow))
    c = Conn(k.stdout.fileno(), k.stdin.fileno())
    c.send(hello(nonce=79))
    c.expect(HELLO_ACK)
    rid = kstart('python', 'print(6 * 7)')
    time.sleep(0.4)
    d, out, err, _ = kfinish(rid, sig=2)
    check('python: a signal while the kernel starts ends it, without a traceback',
          d is not None and d.get('how') == 1 and b'Traceback' not in err, (d, out, err))
    d, out, err, _ = krun('python', 'print(6 * 7)', timeout_ms=600)
    check('python: the kernel\'s start does not count against the timeout', ok_exit(d) and
          not d['flags'] & TIMED_OUT and out == b'42\n', (d, out, err))
    check('python: a kernel that never started lost no state', b'state lost' not in err, err)
    k.stdin.close()
    check('slow kernel: agent exits on EOF', k.wait(5) == 0)
    shutil.rmtree(slow)


# ---- --relay, the guest's end of an SSH session: it starts the agent as a daemon on a unix
# socket when none answers, then copies bytes; the daemon and its kernels outlive the relays.
# The binary and the kernels are copied elsewhere and named by relative paths, as a host might.
rdir = tempfile.mkdtemp(prefix='airlock-relay-')
bindir = os.path.join(rdir, 'bin')
os.mkdir(bindir)
ragent = os.path.join(bindir, 'agent-copy')
shutil.copy(agent, ragent)
shutil.copytree(kernels, os.path.join(bindir, 'kernels'))
rsock = os.path.join(bindir, 'run', 'agent.sock')
race_sock = os.path.join(rdir, 'race', 'agent.sock')
fail_sock = os.path.join(rdir, 'fail', 'agent.sock')
procs = []


def daemons(path):
    """Pids of live agents serving path: not our children, so found through /proc."""
    pids = []
    for d in os.listdir('/proc'):
        try:
            argv = open('/proc/%s/cmdline' % d, 'rb').read().split(b'\0')
            state = open('/proc/%s/stat' % d).read().rsplit(')', 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != 'Z' and b'--unix' in argv and argv[argv.index(b'--unix') + 1:][:1] == \
                [path.encode()]:
            pids.append(int(d))
    return pids


def gone(pid, timeout=0):
    """True when pid is dead (a zombie counts: reaping is its parent's business), waiting up to
    timeout for it: a kill through cgroup.kill takes effect a little later."""
    end = time.time() + timeout
    while True:
        try:
            if open('/proc/%d/stat' % pid).read().rsplit(')', 1)[1].split()[0] == 'Z':
                return True
        except OSError:
            return True
        if time.time() >= end:
            return False
        time.sleep(0.02)


def relay(*extra):
    r = subprocess.Popen([ragent, '--relay', 'run/agent.sock', '--kernels', 'kernels', '--root',
                          root] + list(extra), cwd=bindir, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=log)
    procs.append(r)
    return r, Conn(r.stdout.fileno(), r.stdin.fileno())


def closed(conn, timeout=3):
    """True when the agent ends the connection within timeout (frames before it are skipped)."""
    try:
        while conn.recv(timeout) is not None:
            pass
    except EOFError:
        return True
    return False


kernel = ('python', 'kept = 11', 'kept') if have['python'] else \
    ('shell', 'kept=11', 'echo $kept') if have['shell'] else None
try:
    r1, c = relay()
    c.send(hello(nonce=90))
    t, _, i, d = c.expect(HELLO_ACK)
    agents = daemons(rsock)
    check('relay: starts the agent and handshakes through it', d['nonce'] == 90 and
          len(agents) == 1, (d, agents))
    check('relay: the agent runs from the copied binary, with the kernels beside it',
          agents and os.readlink('/proc/%d/exe' % agents[0]) == ragent and
          all(('kernel:' + n in d['langs']) == bool(x) for n, x in have.items()),
          (agents, d['langs']))
    check('relay: the socket\'s new directory is private, the agent logs beside the socket',
          stat.S_IMODE(os.stat(os.path.dirname(rsock)).st_mode) == 0o700 and
          b'listening on' in open(rsock + '.log', 'rb').read())
    d, out, err, _ = c.run(1, ['echo', 'hi'])
    check('relay: an exec through it', ok_exit(d) and out == b'hi\n', (d, out))
    # Random bytes both ways: nothing lost, added or reordered. 1 MB of stdin fits the window.
    body = os.urandom(1000000)
    c.send(exec_(2, ['sha256sum'], flags=EXEC_STDIN))
    c.send(*[data(2, 0, body[o:o + 65536], eof=o + 65536 >= len(body))
             for o in range(0, len(body), 65536)])
    d, out, err, _ = kfinish(2)
    check('relay: 1 MB of binary stdin intact', ok_exit(d) and
          out.split()[:1] == [hashlib.sha256(body).hexdigest().encode()], (d, out, err))
    blob = os.path.join(rdir, 'blob')
    with open(blob, 'wb') as f:
        f.write(os.urandom(5 << 20))
    d, out, err, _ = c.run(3, ['cat', blob], timeout=60)
    check('relay: 5 MiB of binary stdout intact', ok_exit(d) and
          out == open(blob, 'rb').read(), (d, len(out)))
    if kernel:
        krun(kernel[0], kernel[1])
    r1.stdin.close()
    check('relay: exits 0 at EOF and the agent stays', r1.wait(5) == 0 and
          daemons(rsock) == agents, (r1.returncode, agents, daemons(rsock)))

    r2, c = relay()
    c.send(hello(nonce=91))
    c.expect(HELLO_ACK)
    if kernel:
        d, out, err, _ = krun(kernel[0], kernel[2])
        check('relay: a %s kernel keeps its state from one connection to the next' % kernel[0],
              ok_exit(d) and shown(out) == b'11\n', (d, out, err))
    # The link drops without an EOF: the request goes, as if the host had left.
    c.send(exec_(4, ['sleep', '100']))
    t, _, i, d = c.expect(STARTED)
    r2.kill()
    r2.wait()
    check('relay: a dropped link drops its requests', gone(d['pid'], 2))

    # Newest wins: a second connection is served at once, the first one is closed.
    ca = Conn.unix(rsock)
    ca.send(hello(nonce=92))
    ca.expect(HELLO_ACK)
    ca.send(exec_(5, ['sleep', '100']))
    t, _, i, d = ca.expect(STARTED)
    cb = Conn.unix(rsock)
    t0 = time.time()
    cb.send(hello(nonce=93))
    f = cb.recv(3)
    check('newest wins: the new connection is answered at once', f and f[0] == HELLO_ACK and
          f[3]['nonce'] == 93 and time.time() - t0 < 2, (f, time.time() - t0))
    check('newest wins: the old connection is closed, its requests dropped',
          closed(ca) and gone(d['pid'], 2))
    c = cb
    if kernel:
        d, out, err, _ = krun(kernel[0], kernel[2])
        check('newest wins: idle kernels are kept', ok_exit(d) and shown(out) == b'11\n', (d, out, err))
    r3, c = relay()
    c.send(hello(nonce=94))
    c.expect(HELLO_ACK)
    check('newest wins: over a relay too', closed(cb))
    cd = Conn.unix(rsock)
    cd.send(hello(nonce=95))
    cd.expect(HELLO_ACK)
    check('relay: exits 0 when a newer connection replaces its own', r3.wait(5) == 0,
          r3.returncode)
    cd.sock.close()

    # Two relays start at once where no agent runs: one agent serves, the later connection.
    rs = [subprocess.Popen([ragent, '--relay', race_sock, '--root', root], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, stderr=log) for _ in range(2)]
    procs += rs
    end = time.time() + 10
    while time.time() < end and all(r.poll() is None for r in rs):
        time.sleep(0.05)
    left = [r for r in rs if r.poll() is None]
    f = None
    if len(left) == 1:
        c = Conn(left[0].stdout.fileno(), left[0].stdin.fileno())
        c.send(hello(nonce=96))
        f = c.recv(5)
        left[0].stdin.close()
        left[0].wait(5)
    # The agent that lost the race exits once it finds the lock held; a slow start (a
    # sanitized agent) may still be on its way there.
    end = time.time() + 10
    while time.time() < end and len(daemons(race_sock)) > 1:
        time.sleep(0.05)
    check('relays starting together: one agent, serving the later connection',
          f and f[0] == HELLO_ACK and [r.returncode for r in rs] == [0, 0] and
          len(daemons(race_sock)) == 1, (f, [r.returncode for r in rs], daemons(race_sock)))

    # An agent that cannot start: one line on stderr, exit 1, and no 10 s wait for it.
    t0 = time.time()
    r = subprocess.run([ragent, '--relay', os.path.join(blob, 'run', 'agent.sock')],
                       stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=30)
    check('relay: no socket directory possible: one line of error, exit 1', r.returncode == 1 and
          re.fullmatch(rb'airlock-agent: [^\n]*Not a directory\n', r.stderr) and not r.stdout, r)
    r = subprocess.run([ragent, '--relay', fail_sock, '--root', os.path.join(rdir, 'nowhere')],
                       stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=30)
    check('relay: an agent failing at start: one line naming its log, exit 1', r.returncode == 1
          and re.fullmatch(rb'airlock-agent: [^\n]*agent\.sock\.log\n', r.stderr)
          and b'nowhere' in open(fail_sock + '.log', 'rb').read(), (r, time.time() - t0))
    check('relay: both failures known at once', time.time() - t0 < 5, time.time() - t0)
finally:
    for r in procs:
        if r.poll() is None:
            r.kill()
            r.wait()
    # Never leave an agent behind: SIGTERM stops it with its kernels.
    pids = daemons(rsock) + daemons(race_sock) + daemons(fail_sock)
    for pid in pids:
        os.kill(pid, sig.SIGTERM)
    for pid in pids:
        if not gone(pid, 5):
            os.kill(pid, sig.SIGKILL)
check('relay: the agents stop on SIGTERM', all(gone(pid) for pid in pids), pids)
shutil.rmtree(rdir)

# --watch (watch.c): a directory's changes as lines, read by airlockd's E2B watchers.
wdir = tempfile.mkdtemp(prefix='airlock-watch-')
os.mkdir(os.path.join(wdir, 'old'))
wp = subprocess.Popen([agent, '--watch', wdir, '--recursive'], stdout=subprocess.PIPE,
                      stderr=log)


wbuf = bytearray()


def wline(timeout=5):
    """The watcher's next line (read unbuffered: select sees only the pipe), or None."""
    import select
    end = time.time() + timeout
    while b'\n' not in wbuf:
        r, _, _ = select.select([wp.stdout], [], [], max(0, end - time.time()))
        data = os.read(wp.stdout.fileno(), 65536) if r else b''
        if not data:
            return None
        wbuf.extend(data)
    line, _, rest = bytes(wbuf).partition(b'\n')
    wbuf[:] = rest
    return line.decode()


def wevents(n):
    got = []
    for _ in range(n):
        line = wline()
        if line is None:
            break
        k, _, h = line.partition(' ')
        got.append((k, bytes.fromhex(h).decode('utf-8', 'replace') if h else ''))
    return got


check('watch: ok once it watches', wline() == 'ok')
with open(os.path.join(wdir, 'old', 'f'), 'w') as f:
    f.write('x')
got = wevents(2)
check('watch: an existing subdirectory is watched (create, write)',
      got == [('create', 'old/f'), ('write', 'old/f')], got)
os.mkdir(os.path.join(wdir, 'new'))
check('watch: a new directory reported', wevents(1) == [('create', 'new')])
open(os.path.join(wdir, 'new', 'g\nh'), 'w').close()
got = wevents(1)
check('watch: a new directory is watched; any name, hex', got == [('create', 'new/g\nh')], got)
tmp = os.path.join(wdir, 'new', '.airlock-9-1.tmp')
with open(tmp, 'w') as f:
    f.write('y')
os.rename(tmp, os.path.join(wdir, 'new', 'done'))
got = wevents(2)
check('watch: the agent\'s temporary write is a create and a write of its target',
      got == [('create', 'new/done'), ('write', 'new/done')], got)
os.rename(os.path.join(wdir, 'new'), os.path.join(wdir, 'moved'))
got = wevents(2)
check('watch: a moved directory: rename and create', got == [('rename', 'new'),
                                                             ('create', 'moved')], got)
open(os.path.join(wdir, 'moved', 'i'), 'w').close()
got = wevents(1)
check('watch: beneath the moved directory, names by its new path', got == [('create', 'moved/i')],
      got)
shutil.rmtree(wdir)
deadline = time.time() + 5
while wp.poll() is None and time.time() < deadline:
    wline(0.2)
check('watch: ends (0) when its directory goes', wp.poll() == 0, wp.poll())
r = subprocess.run([agent, '--watch', os.path.join(root, 'nowhere')], stdout=subprocess.PIPE,
                   timeout=10)
check('watch: a missing directory: err not_found, exit 1',
      (r.returncode, r.stdout) == (1, b'err not_found\n'), r)
r = subprocess.run([agent, '--watch', '/etc/hostname'], stdout=subprocess.PIPE, timeout=10)
check('watch: a file: err not_dir, exit 1', (r.returncode, r.stdout) == (1, b'err not_dir\n'), r)

shutil.rmtree(root)
tap.finish()
