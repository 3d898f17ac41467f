#!/usr/bin/env python3
"""Boots an image directly with qemu-system-x86_64 (no libvirt) and talks to its agent over the
virtio-serial port: HELLO, `echo hi`, a few timings, SHUTDOWN.

    images/boot-check.py IMAGE_DIR [--accel tcg|kvm] [--quick] [--cmdline-extra ...]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'guest-agent',
                                'test'))
from alframes import *  # noqa: E402,F403

ap = argparse.ArgumentParser()
ap.add_argument('image')
ap.add_argument('--accel', default='tcg')
ap.add_argument('--quick', action='store_true', help='boot, hello, echo, shutdown only')
ap.add_argument('--cmdline', help='replace the manifest command line')
ap.add_argument('--cmdline-extra', default='')
args = ap.parse_args()

man = json.load(open(os.path.join(args.image, 'manifest.json')))
tmp = tempfile.mkdtemp(prefix='airlock-boot-')
sock, console = os.path.join(tmp, 'agent.sock'), os.path.join(tmp, 'console.log')
cmdline = (args.cmdline or man['cmdline']) + ' ' + args.cmdline_extra
qemu = ['qemu-system-x86_64', '-nodefaults', '-M', 'q35', '-accel', args.accel,
        '-m', str(man['memory_mib']), '-no-reboot', '-display', 'none',
        '-kernel', os.path.join(args.image, man['kernel']),
        '-initrd', os.path.join(args.image, man['initrd']), '-append', cmdline,
        '-device', 'virtio-serial-pci',
        '-chardev', 'socket,id=c0,path=%s,server=on,wait=off' % sock,
        '-device', 'virtserialport,chardev=c0,name=org.airlock.agent.0',
        '-serial', 'file:' + console]
if man.get('disk'):
    # As a session does: a throwaway overlay on the read-only base.
    overlay = os.path.join(tmp, 'disk.qcow2')
    subprocess.run(['qemu-img', 'create', '-q', '-f', 'qcow2', '-F', 'qcow2', '-b',
                    os.path.abspath(os.path.join(args.image, man['disk'])), overlay], check=True)
    qemu += ['-drive', 'file=%s,format=qcow2,if=virtio,cache=unsafe' % overlay]
tap = Tap()
check = tap.check


t0 = time.time()
vm = subprocess.Popen(qemu)
try:
    c = Conn.unix(sock)
    c.send(hello(nonce=77))
    t, _, _, d = c.expect(HELLO_ACK, timeout=60)
    boot = time.time() - t0
    check('hello-ack', d['nonce'] == 77, d)
    print('#    boot to HELLO_ACK: %.2f s  %s' % (boot, d))

    d, out, err, fr = c.run(1, ['echo', 'hi'])
    check('echo hi', out == b'hi\n' and d.get('value') == 0, (d, out, err))
    print('#    frames:', [(NAMES[f[0]], f[3]) for f in fr])

    if not args.quick:
        t1 = time.time()
        for k in range(20):
            c.run(100 + k, ['true'])
        print('#    exec `true` round trip: %.1f ms' % ((time.time() - t1) / 20 * 1000))

        n = 64 << 20
        t1 = time.time()
        d, out, err, _ = c.run(2, ['dd if=/dev/zero bs=64k count=%d 2>/dev/null' % (n >> 16)],
                               lang='sh', timeout=120)
        dt = time.time() - t1
        check('stream 64 MiB', len(out) == n, (d, len(out)))
        print('#    guest->host stdout: %.0f MB/s' % (n / dt / 1e6))

        body = os.urandom(4 << 20)
        t1 = time.time()
        c.send(put(3, '/workspace/blob', len(body)))
        for off in range(0, len(body), 65536):
            c.send(data(3, 3, body[off:off + 65536], eof=off + 65536 >= len(body)))
        f = c.until(OK, timeout=60)
        dt = time.time() - t1
        check('put 4 MiB', f[3]['value'] == len(body), f)
        print('#    host->guest file put: %.0f MB/s' % (len(body) / dt / 1e6))
        d, out, err, _ = c.run(4, ['md5sum /workspace/blob; id; hostname; cat /proc/self/cgroup'],
                               lang='sh')
        import hashlib
        check('put content', out.split()[0].decode() == hashlib.md5(body).hexdigest(), out)
        print('#   ', out.decode().replace('\n', ' | '))

        # A fork bomb stays inside its cgroup's pids.max; the agent keeps answering meanwhile.
        t1 = time.time()
        c.send(exec_(5, ['b() { b | b & }; b; sleep 30'], lang='sh', timeout_ms=4000))
        c.until(STARTED)
        time.sleep(1.5)
        t2 = time.time()
        c.send(ping(5, 6))
        c.until(PONG, timeout=30)
        print('#    ping during fork bomb: %.0f ms' % ((time.time() - t2) * 1000))
        f = c.until(EXIT, timeout=60)
        check('fork bomb contained', f[3]['flags'] & TIMED_OUT, f)
        print('#    fork bomb killed after %.1f s' % (time.time() - t1))
        # The agent removes a killed request's cgroup once its last process is reaped, retrying
        # in the background: under load that can outlast the EXIT frame by a few seconds.
        for i in range(20):
            rid = 7 if i == 0 else 1000 + i
            d, out, err, _ = c.run(rid, ['ls /sys/fs/cgroup/airlock/ | grep req- | grep -v req-%d-'
                                         % rid], lang='sh')
            if out == b'':
                break
            time.sleep(0.5)
        check('cgroups cleaned', out == b'', out)

    # The host goes away mid-request: the agent kills it and serves the next host.
    c.send(exec_(8, ['sleep 1000'], lang='sh'))
    pid = c.until(STARTED)[3]['pid']
    c.sock.close()
    time.sleep(0.5)
    c = Conn.unix(sock)
    c.send(hello(nonce=78))
    check('reconnect', c.until(HELLO_ACK)[3]['nonce'] == 78)
    d, out, err, _ = c.run(9, ['test -e /proc/%d && cat /proc/%d/stat; echo checked' % (pid, pid)],
                           lang='sh')
    check('request killed on disconnect', out == b'checked\n', out)

    c.send(shutdown())
    f = c.until(OK)
    rc = vm.wait(30)
    check('shutdown', rc == 0, rc)
finally:
    if vm.poll() is None:
        vm.kill()
    print('# --- console ---')
    for line in open(console, errors='replace').read()[-3000:].splitlines():
        print('#', line)
    shutil.rmtree(tmp)
tap.finish()
