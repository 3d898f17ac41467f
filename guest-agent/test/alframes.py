"""Hand-built Airlock frames (see proto/airlock-proto.h) for poking the agent from Python."""
import sys
import os
import select
import socket
import struct
import time

HDR = struct.Struct('<2sBBII')
HELLO, HELLO_ACK, EXEC, STARTED, DATA, CREDIT, SIGNAL, EXIT, ERROR = range(1, 10)
FILE_PUT, FILE_GET, FILE_INFO, OK, PING, PONG, SHUTDOWN, WAITING, REFRESH, RESIZE = range(10, 20)
CONNECT = 20
NAMES = {v: k for k, v in dict(HELLO=1, HELLO_ACK=2, EXEC=3, STARTED=4, DATA=5, CREDIT=6,
                                  SIGNAL=7, EXIT=8, ERROR=9, FILE_PUT=10, FILE_GET=11,
                                  FILE_INFO=12, OK=13, PING=14, PONG=15, SHUTDOWN=16,
                                  WAITING=17, REFRESH=18, RESIZE=19, CONNECT=20).items()}
CAP_REFRESH, CAP_CONNECT = 32, 64
EOF_FLAG = 1
EXEC_STDIN, EXEC_KERNEL, EXEC_PTY = 1, 2, 8
# The version the header says (this file sits in guest-agent/test).
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'proto',
                       'airlock-proto.h')) as _h:
    PROTO_VERSION = int(next(l.split()[2] for l in _h if l.startswith('#define AL_PROTO_VERSION ')))
TRUNC_OUT, TRUNC_ERR, TIMED_OUT = 1, 2, 4
ERR = dict(PROTOCOL=1, NOT_FOUND=2, PERMISSION=3, INVALID=4, LIMIT=5, IO=6, INTERNAL=7,
           UNSUPPORTED=8)


def frame(t, fid, payload=b'', flags=0):
    return HDR.pack(b'AL', t, flags, fid, len(payload)) + payload


def s(b):
    b = b.encode() if isinstance(b, str) else b
    return struct.pack('<I', len(b)) + b


def slist(v):
    return struct.pack('<I', len(v)) + b''.join(s(x) for x in v)


def hello(nonce=1, window=1 << 20, version=PROTO_VERSION):
    return frame(HELLO, 0, struct.pack('<IQI', version, nonce, window))


def exec_(fid, argv, lang='', cwd='', env=(), flags=0, timeout_ms=0, cap=0, input_wait_ms=0,
          rows=0, cols=0):
    return frame(EXEC, fid, struct.pack('<IIIQHH', flags, timeout_ms, input_wait_ms, cap, rows,
                                        cols) + s(lang) + s(cwd) + slist(argv) + slist(env))


def resize(fid, rows, cols):
    return frame(RESIZE, fid, struct.pack('<HH', rows, cols))


def connect(fid, port):
    return frame(CONNECT, fid, struct.pack('<H', port))


def data(fid, stream, b, eof=False):
    return frame(DATA, fid, bytes([stream]) + b, EOF_FLAG if eof else 0)


def credit(fid, stream, n):
    return frame(CREDIT, fid, struct.pack('<BI', stream, n))


def signal(fid, signo):
    return frame(SIGNAL, fid, struct.pack('<I', signo))


def put(fid, path, size, mode=0o644):
    return frame(FILE_PUT, fid, struct.pack('<IQ', mode, size) + s(path))


def get(fid, path):
    return frame(FILE_GET, fid, s(path))


def ping(cookie, fid=0):
    return frame(PING, fid, struct.pack('<Q', cookie))


def shutdown(how=0):
    return frame(SHUTDOWN, 0, struct.pack('<I', how))


def refresh(fid, hostname, sec=0, nsec=0):
    return frame(REFRESH, fid, bytes(64) + struct.pack('<QI', sec, nsec) + bytes(16) + s(hostname))


def decode(t, p):
    """Payload of a guest->host frame as a dict."""
    if t == HELLO_ACK:
        ver, nonce, window, caps = struct.unpack_from('<IQII', p)
        off = 20
        n, = struct.unpack_from('<I', p, off)
        agent = p[off + 4:off + 4 + n].decode()
        off += 4 + n
        cnt, = struct.unpack_from('<I', p, off)
        off += 4
        langs = []
        for _ in range(cnt):
            n, = struct.unpack_from('<I', p, off)
            langs.append(p[off + 4:off + 4 + n].decode())
            off += 4 + n
        return dict(version=ver, nonce=nonce, window=window, caps=caps, agent=agent, langs=langs)
    if t == STARTED:
        return dict(pid=struct.unpack('<I', p)[0])
    if t == DATA:
        return dict(stream=p[0], data=p[1:])
    if t == CREDIT:
        st, n = struct.unpack('<BI', p)
        return dict(stream=st, bytes=n)
    if t == EXIT:
        how, value, dur, flags = struct.unpack('<BiQI', p)
        return dict(how=how, value=value, duration_us=dur, flags=flags)
    if t == ERROR:
        klass, err, n = struct.unpack_from('<HII', p)
        return dict(klass=klass, err=err, message=p[10:10 + n].decode(errors='replace'))
    if t == FILE_INFO:
        mode, size = struct.unpack('<IQ', p)
        return dict(mode=mode, size=size)
    if t in (OK, PONG):
        return dict(value=struct.unpack('<Q', p)[0])
    if t == WAITING:
        return dict(waited_ms=struct.unpack('<I', p)[0])
    return dict(raw=p)


class Conn:
    """Frames over a pair of fds (a pipe pair, or one socket for both)."""

    def __init__(self, rfd, wfd):
        self.rfd, self.wfd, self.buf, self.pos = rfd, wfd, bytearray(), 0
        os.set_blocking(wfd, False)  # a blocking write of a big frame would stop our reads

    @classmethod
    def unix(cls, path, timeout=30):
        end = time.time() + timeout
        while True:
            try:
                sk = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sk.connect(path)
                break
            except OSError:
                if time.time() > end:
                    raise
                time.sleep(0.01)
        c = cls(sk.fileno(), sk.fileno())
        c.sock = sk
        return c

    def send(self, *frames):
        """Writes frames, reading meanwhile: the agent stops reading while its output queue is
        full, so a host that only writes can deadlock with it."""
        b = memoryview(b''.join(frames))
        while b:
            r, w, _ = select.select([self.rfd], [self.wfd], [])
            if r:
                got = os.read(self.rfd, 1 << 20)
                if not got:
                    raise EOFError
                self.buf += got
            if w:
                try:
                    b = b[os.write(self.wfd, b):]
                except BlockingIOError:
                    pass

    def recv(self, timeout=10):
        """Next frame as (type, flags, id, dict); None on timeout; raises EOFError on EOF."""
        end = time.time() + timeout
        while True:
            if len(self.buf) - self.pos >= 12:
                magic, t, fl, fid, n = HDR.unpack_from(self.buf, self.pos)
                assert magic == b'AL', bytes(self.buf[self.pos:self.pos + 32])
                if len(self.buf) - self.pos >= 12 + n:
                    p = bytes(self.buf[self.pos + 12:self.pos + 12 + n])
                    self.pos += 12 + n
                    return t, fl, fid, decode(t, p)
            if self.pos:
                del self.buf[:self.pos]
                self.pos = 0
            left = end - time.time()
            if left <= 0:
                return None
            r, _, _ = select.select([self.rfd], [], [], left)
            if r:
                b = os.read(self.rfd, 1 << 20)
                if not b:
                    raise EOFError
                self.buf += b

    def expect(self, t, timeout=10):
        f = self.recv(timeout)
        assert f and f[0] == t, 'expected %s, got %r' % (NAMES[t], f)
        return f

    def until(self, t, timeout=10):
        """Skips frames up to the next one of type t."""
        end = time.time() + timeout
        while True:
            f = self.recv(max(0, end - time.time()))
            assert f, 'no %s within %ss' % (NAMES[t], timeout)
            if f[0] == t:
                return f

    def run(self, fid, argv, stdin=None, timeout=30, credit_back=True, flags=0, **kw):
        """EXEC and collect: returns (exit or error dict, stdout, stderr, frames)."""
        flags |= EXEC_STDIN if stdin is not None else 0
        self.send(exec_(fid, argv, flags=flags, **kw))
        if stdin is not None:
            self.send(data(fid, 0, stdin, eof=True))
        out, err, frames, res = bytearray(), bytearray(), [], bytearray()
        self.results = b''
        owed = [0] * 5
        end = time.time() + timeout
        while time.time() < end:
            f = self.recv(end - time.time())
            if f is None:
                break
            t, fl, i, d = f
            frames.append((t, fl, i, d if t != DATA else dict(stream=d['stream'], n=len(d['data']))))
            if i != fid:
                continue
            if t == DATA:
                if d['stream'] == 1:
                    out += d['data']
                elif d['stream'] == 4:
                    res += d['data']
                    self.results = bytes(res)
                else:
                    err += d['data']
                owed[d['stream']] += len(d['data'])
                if credit_back and owed[d['stream']] >= 256 << 10:
                    self.send(credit(fid, d['stream'], owed[d['stream']]))
                    owed[d['stream']] = 0
            elif t in (EXIT, ERROR):
                return d, bytes(out), bytes(err), frames
        raise TimeoutError([(NAMES[f[0]], f[2]) for f in frames[-5:]])


class Tap:
    """TAP lines with the plan at the end; finish() exits non-zero on any failure."""

    def __init__(self):
        self.failed = self.count = 0

    def check(self, name, cond, detail=''):
        self.count += 1
        print('%s %d - %s%s' % ('ok' if cond else 'not ok', self.count, name,
                                '' if cond else ' # %r' % (detail,)))
        self.failed += not cond

    def finish(self):
        print('1..%d' % self.count)
        sys.exit(1 if self.failed else 0)
