"""Airlock's python kernel: runs the agent's code blocks one after another in one namespace, on
IPython's InteractiveShell when IPython is installed (`!cmd`, `%magics`, display(), rich reprs,
notebook tracebacks), else on a plain driver of its own (last value and errors only).

Started by the agent (guest-agent/kernel.c) with fd 3 a socket to it and fd 4 the results
pipe. This says "ready" once, then reads requests "run ID COUNT LEN..." followed by COUNT
fields (the code, the path of the run's stdin, a directory to change to first or "", KEY=VALUE
entries: the run's own environment, undone when it ends) and answers "done ID STATUS" once the block is over and its output
flushed. stdout and stderr are the agent's pipes for the kernel's whole life. Status: 0, 1 for
an exception, 130 for an interrupt (SIGINT raises KeyboardInterrupt in the block), SystemExit's
code.

Results go to fd 4 as records, each a u32 little-endian length and that many bytes of JSON
(docs/PROTOCOL.md, "Results"): {"type": "count", "execution_count": N} first, then
"execute_result" (the last expression's value) and "display_data" (each display()) with a
"data" MIME bundle, and "error" {name, value, traceback}. The host trusts none of it.

SIGINT (the user's ^C, or the agent at the run's timeout) interrupts the block's code only:
arriving while this driver is busy (reading the request, compiling the block, reporting), it
is held and stops the block before it starts; arriving after the block, it is dropped with
the next request. The driver's own code is never interrupted.

Blocks are taken as written, as Jupyter takes cells: one whose first line of code is indented
(pasted from inside a function or a triple-quoted string) runs after textwrap.dedent, which
keeps its lines where they were, so tracebacks name the block's own line numbers.
"""
import ast
import base64
import builtins
import importlib.machinery
import json
import linecache
import os
import signal
import struct
import sys
import textwrap
import traceback
import types

CTL = 3
RESULTS = 4
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


INLINE_BACKEND = 'module://matplotlib_inline.backend_inline'


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


def cut_driver_frames(tb):
    """Ends a traceback at the block's last frame when this driver's frames follow it (the
    SIGINT handler raising KeyboardInterrupt)."""
    seen_block = False
    while tb is not None and tb.tb_next is not None:
        seen_block = seen_block or tb.tb_frame.f_code.co_filename != __file__
        if tb.tb_next.tb_frame.f_code.co_filename == __file__ and seen_block:
            tb.tb_next = None
            return
        tb = tb.tb_next


def in_block(frame):
    """Whether frame is the block's code or code the block called (its frames carry the cell's
    name, '<cell N>', further down the stack)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith(('<cell ', '<ipython-input-')):
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


# The MIME types a result may carry (the host refuses others); images travel as base64.
MIME_TEXT = ('text/plain', 'text/html', 'text/markdown', 'image/svg+xml', 'text/latex')
MIME_BINARY = ('image/png', 'image/jpeg')
MIME_JSON = 'application/json'


def bundle(data):
    """The known MIME types of a format dict, as JSON can carry them."""
    out = {}
    for mime, value in data.items():
        if mime in MIME_BINARY:
            if isinstance(value, bytes):
                value = base64.b64encode(value).decode('ascii')
            if isinstance(value, str):  # IPython's own base64 has line breaks: none go out
                out[mime] = ''.join(value.split())
        elif mime in MIME_TEXT:
            if isinstance(value, bytes):
                value = value.decode('utf-8', 'replace')
            if isinstance(value, str):
                out[mime] = value
        elif mime == MIME_JSON:
            out[mime] = value
    return out


class Results:
    """fd 4: one record per result, error and count, in the order they happen."""

    def __init__(self, fd):
        self.fd = fd

    def send(self, record):
        # What was printed before the result reaches the agent first.
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except BaseException:
                pass
        try:
            body = json.dumps(record, ensure_ascii=False, default=repr)
        except (TypeError, ValueError) as e:  # application/json that is not JSON
            print('airlock: result not sent: %s' % e, file=sys.stderr)
            return
        body = body.encode('utf-8', 'replace')
        view = memoryview(struct.pack('<I', len(body)) + body)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]

    def value(self, data, count):
        data = bundle(data)
        if data:
            self.send({'type': 'execute_result', 'execution_count': count, 'data': data})

    def display(self, data):
        data = bundle(data)
        if data:
            self.send({'type': 'display_data', 'data': data})

    def error(self, name, value, tb):
        self.send({'type': 'error', 'name': name, 'value': value, 'traceback': tb})


def exception_text(e):
    try:
        return str(e)
    except BaseException:
        return '<unprintable %s>' % type(e).__name__


class Kernel:
    """The plain driver: used where IPython is not installed (an image's own python)."""

    def __init__(self, results):
        self.results = results
        self.count = 0
        self.machine = None  # /etc/machine-id's identity at the last block (reseed_if_restored)
        self.running = False  # between the start and the end of a block's execution
        self.pending = False  # an interrupt came while the driver's own code ran
        self.devnull = os.open(os.devnull, os.O_RDONLY)
        signal.signal(signal.SIGINT, self.on_sigint)

    def on_sigint(self, signo, frame):
        # Only the block is interrupted; in the driver's code the interrupt is held (execute
        # looks at it right before the block starts).
        if self.running and in_block(frame):
            # Raised from C: the traceback ends in the block's frame, not in this handler.
            signal.default_int_handler(signo, frame)
        self.pending = True

    def setup(self):
        main = types.ModuleType('__main__')
        main.__builtins__ = builtins
        sys.modules['__main__'] = main  # pickle, `if __name__ == '__main__'`, doctest
        self.ns = main.__dict__
        sys.meta_path.insert(0, PyplotHook())

    def report(self, e, tb):
        """The traceback on stderr, as python prints one, and as an error record."""
        sys.last_type, sys.last_value, sys.last_traceback = type(e), e, tb
        try:
            te = traceback.TracebackException(type(e), e, tb)
            without_driver(te, set())
            text = ''.join(te.format())
        except BaseException:  # a broken __str__ or a second interrupt: still say something
            text = type(e).__name__ + '\n'
        sys.stderr.write(text)
        self.results.error(type(e).__name__, exception_text(e), text)

    def compile(self, code, name):
        """The block as module code, plus its last expression alone, whose value is the
        result."""
        tree = ast.parse(code, name, 'exec')
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = compile(ast.Expression(tree.body.pop().value), name, 'eval')
        return compile(tree, name, 'exec'), last

    def execute(self, code):
        self.count += 1
        self.results.send({'type': 'count', 'execution_count': self.count})
        name = '<cell %d>' % self.count
        linecache.cache[name] = (len(code), None, code.splitlines(True), name)
        try:
            body, last = self.compile(code, name)
        except (SyntaxError, ValueError) as e:
            self.report(e, None)  # as python reports a script that does not parse
            return 1
        try:
            value = None
            self.running = True
            try:
                # No check for pending signals lies between this test and the block's first
                # instruction, where on_sigint then runs in the block's frame.
                if self.pending:
                    raise KeyboardInterrupt
                exec(body, self.ns)
                if last is not None:
                    if self.pending:
                        raise KeyboardInterrupt
                    value = eval(last, self.ns)
            finally:
                self.running = False
            if value is not None:
                builtins._ = value
                self.results.value({'text/plain': repr(value)}, self.count)
        except SystemExit as e:
            return exit_status(e)
        except BaseException as e:
            self.report(e, e.__traceback__)
            return 130 if isinstance(e, KeyboardInterrupt) else 1
        return 0

    def reseed_if_restored(self):
        """A kernel restored from a template (orchestrator/session/template.c) holds the template's
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

    def run(self, code, stdin_path, cwd, env):
        self.reseed_if_restored()
        # The agent names a directory only for a fresh kernel's first run (one the VM's
        # template started elsewhere); later runs stay where the blocks have gone.
        if cwd:
            try:
                os.chdir(cwd)
            except OSError as e:
                print('airlock: cannot change to %s: %s' % (cwd, e.strerror), file=sys.stderr)
                return 1
        code = as_cell(code)
        saved = {}
        for entry in env:
            key, _, value = entry.partition('=')
            if key not in saved:
                saved[key] = os.environ.get(key)
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
            return self.execute(code)
        finally:
            for f in (sys.stdout, sys.stderr):
                try:
                    f.flush()
                except BaseException:
                    pass
            os.dup2(self.devnull, 0)
            # The run's environment was the run's only (the block's own changes stay).
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

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
            status = self.run(text[0], text[1], text[2], text[3:])
            ctl.send('done %d %d\n' % (rid, status))


class IPythonKernel(Kernel):
    """The driver on IPython's InteractiveShell: cells run as in a notebook, and what IPython
    would send a notebook (execute_result, display_data, error) goes to fd 4."""

    def setup(self):
        os.environ.setdefault('IPYTHONDIR', '/tmp/airlock-ipython')
        # Figures are shown as image/png results after each cell (and by plt.show()); savefig
        # still writes the files asked for. The backend is loaded with pyplot, not now.
        os.environ['MPLBACKEND'] = INLINE_BACKEND
        # This kernel uses neither IPython's terminal (prompt_toolkit, which IPython's package
        # imports for embed()) nor completion (jedi): kept out while IPython loads, they cost
        # 40% of its start, seconds under emulation. A cell may still import them afterwards.
        held = {'IPython.terminal.embed': types.ModuleType('IPython.terminal.embed'),
                'jedi': None}
        held['IPython.terminal.embed'].embed = None
        for name, module in held.items():
            sys.modules.setdefault(name, module)
        from IPython.core.displayhook import DisplayHook
        from IPython.core.displaypub import DisplayPublisher
        from IPython.core.interactiveshell import InteractiveShell
        from traitlets.config import Config
        kernel = self

        class Hook(DisplayHook):
            def write_output_prompt(self):
                pass

            def write_format_data(self, format_dict, md_dict=None):
                kernel.results.value(format_dict, self.shell.execution_count)

            def finish_displayhook(self):
                sys.stdout.flush()

        class Publisher(DisplayPublisher):
            def publish(self, data, metadata=None, source=None, *, transient=None,
                        update=False, **kwargs):
                kernel.results.display(data)

            def clear_output(self, wait=False):
                pass

        class Shell(InteractiveShell):
            displayhook_class = Hook
            display_pub_class = Publisher
            # No pty: a command gets the run's stdin and the kernel's pipes, and a ^C reaches
            # it as part of the kernel's process group.
            system = InteractiveShell.system_raw

            def enable_gui(self, gui=None):
                # %matplotlib inline (the only backend with no GUI) needs nothing more; a GUI
                # event loop has no screen to open here
                if gui not in (None, 'inline'):
                    raise RuntimeError('no GUI here: %matplotlib inline shows figures as '
                                       'results')

            def showtraceback(self, exc_tuple=None, *args, **kwargs):
                etype, evalue, _ = exc_tuple or sys.exc_info()
                if kernel.quiet_interrupt and etype is KeyboardInterrupt:
                    # IPython's own work on the cell was interrupted, not the block: nothing
                    # of the block to show (formatting IPython's frames can itself fail).
                    self._showtraceback(etype, evalue, ['KeyboardInterrupt'])
                    return
                try:
                    InteractiveShell.showtraceback(self, exc_tuple, *args, **kwargs)
                except Exception:
                    # IPython's formatter fails on some frames (stack_data finds no statement
                    # in a cell interrupted before its first line): the exception alone, not
                    # the formatter's own traceback.
                    self._showtraceback(etype, evalue,
                                        traceback.format_exception_only(etype, evalue))

            def _showtraceback(self, etype, evalue, stb):
                if kernel.quiet_interrupt and etype is KeyboardInterrupt:
                    stb = ['KeyboardInterrupt']  # not the block's: no traceback to show
                text = self.InteractiveTB.stb2text(stb)
                if not text.endswith('\n'):
                    text += '\n'
                sys.stderr.write(text)
                sys.stderr.flush()
                kernel.results.error(getattr(etype, '__name__', str(etype)),
                                     exception_text(evalue), text)

            async def run_code(self, code_obj, result=None, *, async_=False):
                __tracebackhide__ = '__ipython_bottom__'  # noqa: F841 (read by IPython)
                try:
                    kernel.running = True
                    try:
                        # As in Kernel.execute: a held interrupt stops the cell here.
                        if kernel.pending:
                            kernel.quiet_interrupt = True
                            raise KeyboardInterrupt
                        if async_:
                            await eval(code_obj, self.user_global_ns, self.user_ns)
                        else:
                            exec(code_obj, self.user_global_ns, self.user_ns)
                    finally:
                        kernel.running = False
                except SystemExit as e:
                    kernel.exit = e
                    if result is not None:
                        result.error_in_exec = e
                    return True
                except BaseException:
                    if result is not None:
                        result.error_in_exec = sys.exc_info()[1]
                    cut_driver_frames(sys.exc_info()[1].__traceback__)
                    if isinstance(sys.exc_info()[1], KeyboardInterrupt) and kernel.pending:
                        self.showtraceback(exception_only=True)
                    else:
                        self.showtraceback(running_compiled_code=True)
                    return True
                return False

        config = Config()
        config.HistoryManager.enabled = False
        config.InteractiveShell.colors = 'NoColor'
        config.InteractiveShell.autoindent = False
        # A figure's PNG is its size times its dpi, not cropped to what was drawn.
        config.InlineBackend.print_figure_kwargs = {'bbox_inches': None}
        self.in_cell = False
        self.quiet_interrupt = False
        self.shell = Shell.instance(config=config)
        for name, module in held.items():
            if sys.modules.get(name, False) is module:
                del sys.modules[name]
        self.shell.display_formatter.active_types = list(self.shell.display_formatter.formatters)
        self.exit = None

    def on_sigint(self, signo, frame):
        # IPython's own work on the cell (transforming, parsing, compiling a big one takes
        # seconds under emulation) is interrupted too, as in a notebook; only this driver's
        # code holds the interrupt.
        if self.in_cell and not self.running:
            self.quiet_interrupt = True
            signal.default_int_handler(signo, frame)
        Kernel.on_sigint(self, signo, frame)

    def execute(self, code):
        shell = self.shell
        self.results.send({'type': 'count', 'execution_count': shell.execution_count})
        self.exit = None
        self.quiet_interrupt = False
        result = None
        try:
            try:
                self.in_cell = True
                result = shell.run_cell(code, store_history=True)
            finally:
                self.in_cell = False
        except KeyboardInterrupt:  # it came in IPython's code outside the cell's try
            pass
        if result is None:
            sys.stderr.write('KeyboardInterrupt\n')
            self.results.error('KeyboardInterrupt', '', 'KeyboardInterrupt\n')
            return 130
        if self.exit is not None:
            return exit_status(self.exit)
        self.rescue_figures()
        err = result.error_before_exec or result.error_in_exec
        if err is None:
            return 0
        return 130 if isinstance(err, KeyboardInterrupt) else 1

    def rescue_figures(self):
        """A cell that switched matplotlib off the inline backend (matplotlib.use('Agg'), as
        model-written code often does) would lose the figures it left open, and leave the
        kernel without figures for good: they come back as results here, and the inline
        backend is set again."""
        plt = sys.modules.get('matplotlib.pyplot')
        if plt is None:
            return
        try:
            import matplotlib
            if matplotlib.get_backend() == INLINE_BACKEND:
                return
            import io
            for num in plt.get_fignums():
                fig = plt.figure(num)
                buf = io.BytesIO()
                fig.savefig(buf, format='png')
                self.results.display({'image/png': buf.getvalue(), 'text/plain': repr(fig)})
            plt.close('all')
            self.shell.enable_matplotlib('inline')
        except BaseException as e:  # a figure that cannot draw: said, the kernel goes on
            print('airlock: figures left open were not shown: %s' % exception_text(e),
                  file=sys.stderr)


def make_kernel():
    results = Results(RESULTS)
    try:
        import IPython  # noqa: F401
    except ImportError:
        k = Kernel(results)
    else:
        k = IPythonKernel(results)
    k.setup()
    return k


if __name__ == '__main__':
    os.set_inheritable(CTL, False)  # not the business of the processes a block starts
    os.set_inheritable(RESULTS, False)
    make_kernel().serve(Control(CTL))
