"""What ``ft_launcher`` does before it imports torch, so that its first workers start no later than torchrun's.

The launcher and its worker factory (:mod:`ft_core.launcher.startup.prewarm`) each need torch, which
takes over a second to import. One after the other, they would put the first
rank up a whole import later than torchrun, which imports torch once. So
:class:`HeadStart`, entered before the launcher's own imports:

* **makes the worker factory ready early**, from a quick read of the command
  line (:func:`guess_factory`). As the process's entry point (``ft_launcher``,
  ``python -m ft_core.launcher``) it forks the factory right after its own
  imports, so the factory imports nothing that the launcher has imported:
  the node imports torch once (on a loaded node, two imports side by side
  slow each other down), and the first workers start about when torchrun's
  would start, already warm. Called from other code, or when the script's
  directory holds a module that would shadow one of the launcher's, it
  starts the factory as a new process instead, at once, importing while the
  launcher does. Once the launcher has parsed its arguments, it keeps that
  factory only if it is the very one it would start then (:func:`adopt`:
  same interpreter, script or module, ``sys.path[0]``, pre-warm modules and
  environment); otherwise it stops it and starts the right one, as it did
  before. A wrong guess costs time, never behaviour.
* **starts the node monitor's process** (a standby monitor, see
  :class:`ft_core.monitor.spawn.StandbyMonitor`): it imports meanwhile and
  gets its settings once the launcher has them, so the first workers do not
  wait for a new interpreter's start-up.
* **pauses the garbage collector during the launcher's imports** and then
  freezes what they created (``gc.freeze``), as the factory does: the
  collector's full passes over torch's import-time objects (about 0.1 s here)
  are skipped, during the imports and for the rest of the run.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, NoReturn, Optional

from ft_core.launcher.startup.prewarm import WorkerFactory

if TYPE_CHECKING:
    from ft_core.monitor.spawn import StandbyMonitor

__all__ = ["HeadStart", "adopt", "guess_factory", "shadowed_modules"]

log = logging.getLogger("ft_core.launcher")


class HeadStart:
    """Around the launcher's imports (a context manager): the factory and the monitor warm up, the collector waits.

    ``factory`` is the job's likely factory (None: no guess) and ``monitor``
    the standby monitor (None unless the command line names a training
    script): hand them to the launch (:func:`adopt`, ``NodeMonitor``) after
    :meth:`imports_done`. On exit, what nobody took is stopped, and the
    collector runs again.

    With ``fork_factory`` (only where returning from the launcher's ``main``
    ends the process: see :meth:`imports_done`) and the launcher run by the
    workers' interpreter without options of its own, the factory is not
    started before the imports but forked from the launcher after them, so
    that torch is imported once: on a loaded node, two imports side by side
    slow each other down. For the imports, the environment is the factory's
    (``OMP_NUM_THREADS``, read when torch's library loads); it is ours again
    afterwards.
    """

    def __init__(self, argv: Sequence[str], *, fork_factory: bool = False) -> None:
        self._argv = list(argv)
        self._fork_factory = fork_factory
        self._paused_gc = False
        #: The factory to fork once the imports are done.
        self._to_fork: Optional[WorkerFactory] = None
        #: The environment variables set for the imports, and their values before (None: unset).
        self._environ_before: dict[str, Optional[str]] = {}
        self.factory: Optional[WorkerFactory] = None
        self.monitor: Optional[StandbyMonitor] = None

    def __enter__(self) -> HeadStart:
        self._paused_gc = gc.isenabled()
        gc.disable()
        guess = guess_factory(self._argv)
        if guess is not None and self._fork_factory and _runs_plain(guess.interpreter):
            self._to_fork = guess
            for name, value in guess.env.items():
                if os.environ.get(name) != value:
                    self._environ_before[name] = os.environ.get(name)
                    os.environ[name] = value
        elif guess is not None:
            self.factory = guess
            guess.origin = "started before the launcher's imports"
            guess.start()  # first: its imports are the longest
        if _training_script(self._argv) is not None:  # a launch, not --help
            from ft_core.monitor.spawn import StandbyMonitor

            try:
                self.monitor = StandbyMonitor()
            except OSError:  # no process to spare now: the launch starts the monitor as before, or says why not
                self.monitor = None
        return self

    def imports_done(self) -> Optional[Callable[[], None]]:
        """The launcher's modules are imported: freeze what they created, let the collector run again; fork the
        factory if it is to be forked.

        Returns None, except in a worker forked by that factory: there it
        returns the function that runs the worker's script. The caller returns
        from the launcher's ``main`` after calling it, so that the process ends
        as the script's interpreter would (``WorkerFactory.start_forked``).
        """
        gc.freeze()
        self._resume_gc()
        # Torchrun's own reading of the environment follows (it sets OMP_NUM_THREADS, with its warning).
        for name, value in self._environ_before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._environ_before.clear()
        factory, self._to_fork = self._to_fork, None
        if factory is None:
            return None
        shadowed = shadowed_modules(factory.path0)
        if shadowed:  # the worker must import the script directory's modules of these names
            factory.origin = (f"started anew after the launcher's imports ({', '.join(shadowed)} in "
                              f"{factory.path0} would shadow the launcher's modules)")
            factory.start()
        else:
            worker = factory.start_forked(self._release_in_factory)
            if worker is not None:
                return worker
        self.factory = factory
        return None

    def __exit__(self, exc_type: Optional[type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        if self.factory is not None:
            self.factory.close()  # the launch closed an adopted one already: then a no-op
        if self.monitor is not None:
            self.monitor.close()  # a no-op once the launch took it
        self._resume_gc()

    def _release_in_factory(self) -> None:
        """In the factory forked from here: let go of the monitor's process without ending it (it is the job's)."""
        monitor, self.monitor = self.monitor, None
        if monitor is not None:
            monitor.release()

    def _resume_gc(self) -> None:
        if self._paused_gc:
            self._paused_gc = False
            gc.enable()


def _runs_plain(interpreter: str) -> bool:
    """Whether this process is ``interpreter`` run without options (a forked worker would inherit them)."""
    argv = sys.orig_argv
    return interpreter == sys.executable and len(argv) > 1 and (argv[1] == "-m" or not argv[1].startswith("-"))


def shadowed_modules(path0: str) -> list[str]:
    """Modules imported in this process that a worker whose ``sys.path[0]`` is ``path0`` would import from there.

    A process forked after its imports keeps the modules it found on its own
    ``sys.path``; a new interpreter with ``path0`` first would find the
    script directory's ``name.py``, ``name/__init__.py`` or ``name.*.so``
    instead. Built-in and frozen modules come before any path, as in that
    interpreter.
    """
    try:
        entries = os.listdir(path0)
    except OSError:
        return []
    found = set()
    for entry in entries:
        stem, dot, suffix = entry.partition(".")
        if suffix == "py" or suffix == "so" or suffix.endswith(".so"):
            found.add(stem)
        elif not dot and os.path.isfile(os.path.join(path0, entry, "__init__.py")):
            found.add(entry)
    real_path0 = os.path.realpath(path0)
    shadowed = []
    for name in sorted(found):
        module = sys.modules.get(name)
        if module is None or name in sys.builtin_module_names or \
                getattr(getattr(module, "__spec__", None), "origin", None) == "frozen":
            continue
        where = getattr(module, "__file__", None)
        # The module or package found in path0 itself is the one the worker would import.
        if where is None or os.path.dirname(os.path.realpath(where)) not in (
                real_path0, os.path.join(real_path0, name)):
            shadowed.append(name)
    return shadowed


class _GuessParser(argparse.ArgumentParser):
    """Never prints nor exits: the launcher's own parser reports a bad command line."""

    def error(self, message: str) -> NoReturn:
        raise ValueError(message)


def _guess_parser(environ: Mapping[str, str]) -> _GuessParser:
    """The few flags (ours in ``options.add_launcher_args``, torchrun's in ``torch.distributed.run``) that
    change the factory. No abbreviations: one the real parser accepts only makes the guess miss."""
    parser = _GuessParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--ft-prewarm", "--ft_prewarm", default="on")
    parser.add_argument("--ft-no-prewarm", "--ft_no_prewarm", dest="ft_prewarm", action="store_const", const="off")
    parser.add_argument("--ft-prewarm-modules", "--ft_prewarm_modules", default="torch")
    parser.add_argument("--nproc-per-node", "--nproc_per_node", default=environ.get("PET_NPROC_PER_NODE", "1"))
    parser.add_argument("--no-python", "--no_python", action="store_true")
    parser.add_argument("--run-path", "--run_path", action="store_true")
    parser.add_argument("-m", "--module", action="store_true")
    return parser


def guess_factory(argv: Sequence[str], environ: Optional[Mapping[str, str]] = None) -> Optional[WorkerFactory]:
    """The worker factory ``ft_launcher argv`` will most likely want (not started), or None: no good guess.

    A quick read, without torchrun's parser (importing it imports torch): the
    training script is the first argument that is an existing ``.py`` file,
    or the one right after ``-m``/``--module``; what follows it is the
    script's. Before it, only the flags that change the factory are read; the
    worker's command line is built as torchrun builds it (``python -u [-m]
    script args``), and torchrun's change to the environment is applied:
    ``OMP_NUM_THREADS=1`` when unset and a node runs more than one process
    (``torch.distributed.run.config_from_args``; a non-numeric
    ``--nproc-per-node`` such as ``gpu`` is taken as more than one).
    """
    environ = os.environ if environ is None else environ
    found = _training_script(argv)
    if found is None:
        return None
    index, module = found
    try:
        flags = _guess_parser(environ).parse_known_args(argv[:index])[0]
    except ValueError:
        return None
    if flags.ft_prewarm != "on" or flags.no_python or flags.run_path or flags.module != module:
        return None
    env = dict(environ)
    nproc = flags.nproc_per_node
    if "OMP_NUM_THREADS" not in env and (not nproc.isdigit() or int(nproc) > 1):
        env["OMP_NUM_THREADS"] = "1"
    interpreter = environ.get("PYTHON_EXEC", sys.executable)
    args = ["-u", *(["-m"] if module else []), *argv[index:]]
    modules = [name.strip() for name in flags.ft_prewarm_modules.split(",") if name.strip()]
    return WorkerFactory.for_job(interpreter, args, modules, env=env, quiet=True)


def _training_script(argv: Sequence[str]) -> Optional[tuple[int, bool]]:
    """(index of the training script in ``argv``, whether it is a ``-m`` module), or None."""
    for index, arg in enumerate(argv):
        if arg == "--":
            return None
        if arg in ("-m", "--module"):
            following = argv[index + 1] if index + 1 < len(argv) else "-"
            if not following.startswith("-"):
                return index + 1, True
        elif not arg.startswith("-") and arg.endswith(".py") and os.path.isfile(arg):
            return index, False
    return None


def adopt(early: Optional[WorkerFactory], wanted: Optional[WorkerFactory]) -> Optional[WorkerFactory]:
    """The job's factory: ``early`` (started by :class:`HeadStart`) if it is exactly ``wanted``, else ``wanted``.

    ``wanted`` is the factory the parsed command line asks for (None: none); an
    ``early`` one that differs from it is stopped here.
    """
    if early is None:
        return wanted
    differences = early.differences(wanted) if wanted is not None else ["pre-warming does not apply"]
    if not differences:
        log.debug("worker factory pid %s, %s, adopted", early.pid, early.origin)
        return early
    log.debug("the worker factory %s does not fit the job (%s): stopped", early.origin, ", ".join(differences))
    early.close()
    return wanted
