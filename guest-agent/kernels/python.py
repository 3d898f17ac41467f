"""Airlock's python kernel: runs the agent's code blocks one after another in one namespace.

Started by the agent (guest-agent/kernel.c) with fd 3 a socket to it. This says "ready" once,
then reads requests "run ID COUNT LEN..." followed by COUNT fields (the code, the path of the
run's stdin, KEY=VALUE entries) and answers
"done ID STATUS" once the block is over and its output flushed. stdout and stderr are the
agent's pipes for the kernel's whole life. Status: 0, 1 for an exception, 130 for an
interrupt (SIGINT raises KeyboardInterrupt in the block), SystemExit's code.

SIGINT (the user's ^C, or the agent at the run's timeout) interrupts the block's code only:
arriving while this driver is busy (reading the request, compiling the block, reporting), it
is held and stops the block before it starts; arriving after the block, it is dropped with
the next request. The driver's own code is never interrupted.

Blocks are taken as written, as Jupyter takes cells: one whose first line of code is indented
(pasted from inside a function or a triple-quoted string) runs after textwrap.dedent, which
keeps its lines where they were, so tracebacks name the block's own line numbers.
"""
import ast
import builtins
import importlib.machinery
import linecache
import os
import signal
import sys
import textwrap
import traceback
import types

CTL = 3
# plt.show() saves each open figure here as figure-N.png and prints the path.
OUTPUTS = '/tmp/airlock-outputs'
FIGURE_NOTE = '[airlock] figure saved: %s'


class Control:
    """The agent's socket: lines and counted fields in, short lines out."""

    def __init__(self, fd):
        self.fd, self.buf = fd, bytearray()

    def _fill(self):
        chunk = os.read(self.fd, 1 << 16)
        if not chunk:
            raise EOFError
        self.buf += chunk

    def wait(self):
        """Returns once bytes of the next request are here."""
        if not self.buf:
            self._fill()

    def line(self):
        while b'\n' not in self.buf:
            self._fill()
        i = self.buf.index(b'\n')
        line = bytes(self.buf[:i])
        del self.buf[:i + 1]
        return line

    def exact(self, n):
        while len(self.buf) < n:
            self._fill()
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data

    def send(self, text):
        os.write(self.fd, text.encode())


def figure_path():
    os.makedirs(OUTPUTS, exist_ok=True)
    n = 1
    while os.path.exists(os.path.join(OUTPUTS, 'figure-%d.png' % n)):
        n += 1
    return os.path.join(OUTPUTS, 'figure-%d.png' % n)


def patch_pyplot(plt):
    """No display here: show() becomes "save every open figure, say where, close it"."""

    def show(*args, **kwargs):
        for num in plt.get_fignums():
            path = figure_path()
            plt.figure(num).savefig(path)
            print(FIGURE_NOTE % path, flush=True)
        plt.close('all')

    plt.show = show


class PyplotHook:
    """Patches matplotlib.pyplot as it is imported, so that not even a `from matplotlib.pyplot
    import show` sees the original; importing matplotlib eagerly would cost every kernel."""

    def find_spec(self, name, path, target=None):
        if name != 'matplotlib.pyplot':
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            patch_pyplot(module)

        spec.loader.exec_module = exec_module
        return spec


def without_driver(te, seen):
    """Drops this driver's frames (the exec call, the SIGINT handler) from te and the
    exceptions chained to it."""
    if te is None or id(te) in seen:
        return
    seen.add(id(te))
    te.stack = traceback.StackSummary.from_list(
        [f for f in te.stack if f.filename != __file__])
    without_driver(te.__cause__, seen)
    without_driver(te.__context__, seen)


def show_exception(e, tb):
    """A traceback as python prints one, without this driver's frames."""
    sys.last_type, sys.last_value, sys.last_traceback = type(e), e, tb
    try:
        te = traceback.TracebackException(type(e), e, tb)
        without_driver(te, set())
        sys.stderr.write(''.join(te.format()))
    except BaseException:  # a broken __str__ or a second interrupt: still say something
        print(type(e).__name__, file=sys.stderr)


def in_block(frame):
    """Whether frame is the block's code or code the block called (its frames carry the cell's
    name, '<cell N>', further down the stack)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith('<cell '):
            return True
        frame = frame.f_back
    return False


def settle():
    """Nothing: calling a python function is where the interpreter runs the handlers of
    signals that have arrived."""


def as_cell(code):
    """The block dedented when its first line that is not blank is indented."""
    for line in code.splitlines():
        if line.strip():
            return textwrap.dedent(code) if line[0] in ' \t' else code
    return code


def exit_status(e):
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code & 0xff
    print(e.code, file=sys.stderr)
    return 1


class Kernel:
    def __init__(self):
        self.cell = 0
        self.machine = None  # /etc/machine-id's identity at the last block (reseed_if_restored)
        self.running = False  # between the start and the end of a block's execution
        self.pending = False  # an interrupt came while the driver's own code ran
        main = types.ModuleType('__main__')
        main.__builtins__ = builtins
        sys.modules['__main__'] = main  # pickle, `if __name__ == '__main__'`, doctest
        self.ns = main.__dict__
        self.devnull = os.open(os.devnull, os.O_RDONLY)
        signal.signal(signal.SIGINT, self.on_sigint)
        sys.meta_path.insert(0, PyplotHook())

    def on_sigint(self, signo, frame):
        # Only the block is interrupted; in the driver's code the interrupt is held (execute
        # looks at it right before the block starts).
        if self.running and in_block(frame):
            raise KeyboardInterrupt
        self.pending = True

    def compile(self, code, name):
        """The block as module code, plus its last expression alone so that its value is
        printed as at the interactive prompt."""
        tree = ast.parse(code, name, 'exec')
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = compile(ast.Interactive([tree.body.pop()]), name, 'single')
        return compile(tree, name, 'exec'), last

    def execute(self, code, name):
        try:
            body, last = self.compile(code, name)
        except (SyntaxError, ValueError) as e:
            show_exception(e, None)  # as python reports a script that does not parse
            return 1
        try:
            self.running = True
            try:
                for part in (body, last):
                    if part is None:
                        continue
                    # No check for pending signals lies between this test and the block's
                    # first instruction, where on_sigint then runs in the block's frame.
                    if self.pending:
                        raise KeyboardInterrupt
                    exec(part, self.ns)
            finally:
                self.running = False
        except SystemExit as e:
            return exit_status(e)
        except BaseException as e:
            show_exception(e, e.__traceback__)
            return 130 if isinstance(e, KeyboardInterrupt) else 1
        return 0

    def reseed_if_restored(self):
        """A kernel restored from a template (orchestrator/template.c) holds the template's
        generator states, the same in every session restored from it. The host's refresh of the
        restored guest writes a new /etc/machine-id (a new inode): before the first block after
        it, random, tempfile's names and NumPy's global generator are reseeded from the kernel's
        (reseeded) RNG. uuid4 and secrets read os.urandom and need nothing."""
        try:
            st = os.stat('/etc/machine-id')
            ident = (st.st_ino, st.st_mtime_ns)
        except OSError:
            ident = None
        if self.machine is not None and ident != self.machine:
            import random
            import tempfile
            random.seed()
            tempfile._name_sequence = None
            if 'numpy' in sys.modules:
                sys.modules['numpy'].random.seed()
        self.machine = ident

    def run(self, code, stdin_path, env):
        self.reseed_if_restored()
        self.cell += 1
        name = '<cell %d>' % self.cell
        code = as_cell(code)
        linecache.cache[name] = (len(code), None, code.splitlines(True), name)
        for entry in env:
            key, _, value = entry.partition('=')
            os.environ[key] = value
        try:
            fd = os.open(stdin_path, os.O_RDONLY)
            os.dup2(fd, 0)
            os.close(fd)
        except OSError as e:
            print('airlock: %s' % e, file=sys.stderr)
            return 1
        # A fresh reader: nothing buffered from an earlier run's stdin.
        sys.stdin = open(0, 'r', encoding='utf-8', errors='surrogateescape', closefd=False)
        try:
            return self.execute(code, name)
        finally:
            for f in (sys.stdout, sys.stderr):
                try:
                    f.flush()
                except BaseException:
                    pass
            os.dup2(self.devnull, 0)

    def serve(self, ctl):
        ctl.send('ready\n')
        while True:
            try:
                ctl.wait()
                # The agent interrupts only the run in progress, and writes a request after the
                # last run ended: an interrupt that arrived before its first bytes was the last
                # block's. Its handler has run once settle() returns; what comes later is this
                # request's, held until the block starts.
                settle()
                self.pending = False
                head = ctl.line().split()
                rid, count = int(head[1]), int(head[2])
                fields = [ctl.exact(int(n)) for n in head[3:3 + count]]
            except EOFError:
                return
            text = [f.decode('utf-8', 'surrogateescape') for f in fields]
            status = self.run(text[0], text[1], text[2:])
            ctl.send('done %d %d\n' % (rid, status))


if __name__ == '__main__':
    os.set_inheritable(CTL, False)  # not the business of the processes a block starts
    Kernel().serve(Control(CTL))
