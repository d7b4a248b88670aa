"""The ``kdml`` command line: its entry point, which runs a subcommand and turns its errors and
stops into one line and an exit status. The subcommands live beside it (parser, train,
evaluate, reproduce; output: what they print).

Every user error becomes one line on stderr and exit status 2; no traceback.
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import gc
import io
import os
import re
import signal
import sys
from collections.abc import Sequence

from kdml.cli.evaluate import (
    _analyze_generalization,
    _embed,
    _eval,
    _index,
    _plot_charts,
    _plot_embedding,
    _plot_retrieval,
    _search,
)
from kdml.cli.output import _is_main_process, _rank, _stop_code
from kdml.cli.parser import build_parser, command_parser
from kdml.cli.reproduce import _reproduce
from kdml.cli.train import _config, _datasets, _recipes, _train
from kdml.errors import (
    KdmlError,
    LocalError,
    QuietExit,
    Terminated,
    check_run_folder,
    one_line,
    raised_over,
)
from kdml.launch import launched_by_torchrun

# The commands that read a trained run: one process each (torchrun is for training).
READING_COMMANDS = ("eval", "analyze", "plot", "embed", "index", "search")

# The process that set _interrupt as its SIGTERM handler (None: not set, as in tests that
# call it directly); a process forked from it inherits the handler.
_HANDLER_PID: int | None = None


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM as Ctrl-C: the files being written through a hidden partial are removed, and a
    run's train.log says it stopped. (Training under torchrun keeps the default: torchrun
    stops its ranks with SIGTERM when one fails, and the failing one says why.)

    A kill of the whole process group (SLURM, systemd) also ends the data loader's workers,
    and torch's SIGCHLD handler would then raise "DataLoader worker ... is killed by signal"
    over this stop: it goes back to the default first. A worker killed after its fork but
    before torch set its own handler would have raised Terminated through the code it was
    forked from: a forked process dies by the signal instead, as torch's handler has it (a
    worker once set up stops as :func:`kdml.data.loaders.stop_outside_shared_locks` says).

    SIGCHLD gets a handler that does nothing, not ``SIG_DFL``: a worker's death that arrived
    with the SIGTERM is still pending for Python, and Python prints "Signal 17 ignored due to
    race condition" with a traceback for a pending signal whose handler became ``SIG_DFL``."""
    if _HANDLER_PID is not None and os.getpid() != _HANDLER_PID:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    if hasattr(signal, "SIGCHLD"):
        signal.signal(signal.SIGCHLD, _ignore_signal)
    raise Terminated


def _ignore_signal(signum: int, frame: object) -> None:
    """A handler that does nothing (see :func:`_interrupt`)."""


# The error handler of the console command's stdout and stderr (_lenient_streams), by its
# codecs name.
ESCAPED_BYTES = "kdml.escaped-bytes"


def _escaped_bytes(error: UnicodeError) -> tuple[str, int]:
    """A codecs error handler: each byte of a file name that is not UTF-8 (which Python reads
    as a surrogate, U+DC80 to U+DCFF) written ``\\xNN``, as
    :func:`~kdml.data.formats.folder.shown_name` writes it in kdml's captions and tables
    (``backslashreplace`` wrote ``\\udcf6`` for the byte 0xF6); any other character the stream
    cannot encode is written as ``backslashreplace`` writes it."""
    if not isinstance(error, UnicodeEncodeError):
        raise error
    failed = error.object[error.start:error.end]
    return "".join(f"\\x{ord(char) - 0xDC00:02x}" if 0xDC80 <= ord(char) <= 0xDCFF
                   else char.encode("ascii", "backslashreplace").decode("ascii")
                   for char in failed), error.end


def _lenient_streams() -> None:
    """Print a file name that is not UTF-8 (a Latin-1 folder from an old zip, read as
    surrogates) with each such byte written ``\\xNN`` (``f\\xf6x``, as kdml's captions show
    it; :func:`_escaped_bytes`): a terminal whose locale makes stdout strict UTF-8 had stopped
    ``kdml search`` with a UnicodeEncodeError. stderr too, where kdml's one-line errors and
    warnings name such files: its default, ``backslashreplace``, had written the byte
    ``\\udcf6``, not as stdout and the captions write it."""
    codecs.register_error(ESCAPED_BYTES, _escaped_bytes)
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors=ESCAPED_BYTES)


def _line_buffered_stdout() -> None:
    """Write each line of standard output as it is printed, as on a terminal, also into a file
    or a pipe (``kdml train ... > log 2>&1``, a batch job's log), where Python buffers it in
    blocks: "training ... into FOLDER", a grid's "[2/6] cell" lines and the results had come
    out at the command's end, after every warning on stderr, and a kill lost them."""
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``kdml`` command. Under torchrun the processes other than rank 0 print nothing to
    standard output (its usage, help, tables, YAML); their usage errors neither, and their
    other errors only where they are their own (:class:`LocalError`)."""
    try:
        if not _other_rank():
            return _main(argv)
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
            return _main(argv)
    finally:
        if argv is None:  # the console command, done: what it wrote is in place
            _default_stops()
            _skip_the_last_collection()


def _default_stops() -> None:
    """SIGTERM and SIGINT back to ending the process by the signal: one that arrived while
    the interpreter exited, after the command's work, had raised Terminated or
    KeyboardInterrupt in an atexit callback of torch's (a Python traceback, exit status 0)."""
    for stop in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(ValueError, OSError):  # not the main thread
            signal.signal(stop, signal.SIG_DFL)


def _skip_the_last_collection() -> None:
    """Leave the objects alive now (a million or so, most of them torch's) to the operating
    system: the garbage collection that ends the interpreter went through them all, 0.6 s of
    every command's exit (0.85 s against 0.22 s after ``import torch``). Exit still clears the
    modules and runs the atexit callbacks (logging's flush, multiprocessing's stop of loader
    workers); only garbage in reference cycles is not finalized, and the command has closed
    what it wrote."""
    gc.freeze()


def _other_rank() -> bool:
    """Whether torchrun started this process with a rank other than 0 (torchrun's variables
    set wrong: no, so that the error about them is printed)."""
    try:
        return launched_by_torchrun() and not _is_main_process()
    except KdmlError:
        return False


def _main(argv: Sequence[str] | None) -> int:
    global _HANDLER_PID
    if argv is None and hasattr(signal, "SIGPIPE"):  # `kdml search ... | head` ends quietly
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    if argv is None:  # the console command: this process's streams are kdml's to set
        _lenient_streams()
        _line_buffered_stdout()
    parser = build_parser()
    # key=value overrides may follow options (`--out DIR epochs=3`), which argparse's positional
    # matching does not allow, so collect the leftovers and accept only overrides among them.
    try:  # argparse exits on --help, --version and bad arguments; return its status instead
        args, extras = parser.parse_known_args(argv)
        unknown = [item for item in extras
                   if item.startswith("-") or args.command not in ("train", "config")]
        if unknown:  # pointing at the command's own --help, which lists its options
            command_parser(parser, args).error(f"unrecognized arguments: {' '.join(unknown)}")
    except SystemExit as exit_request:
        code = int(exit_request.code or 0)
        if code:  # a usage error, which rank 0 alone says (parser.error)
            _stopped_before_joining(quiet=_other_rank())
        return code
    except OSError as error:  # the help or version text, > /dev/full (_Parser._print_message)
        if error.filename is not None or error.errno not in UNWRITABLE_OUTPUT:
            raise
        return _unwritten_output(error)
    if extras:
        args.overrides = [*args.overrides, *extras]
    quiet = False  # under torchrun: this rank stops on an error that rank 0 says
    unsaid: str | None = None  # that error, which this rank says if rank 0 never does
    try:
        training = args.command in ("train", "reproduce")
        if args.command in READING_COMMANDS and launched_by_torchrun():
            # each rank would do the whole work again, on the same GPU, and write the same files
            from kdml.distributed import refusal

            raise refusal(f"kdml {args.command} runs in one process, on one device "
                          "(--device): run it without torchrun")
        # a mistyped run folder is said at once: the command would import torch first
        named_run = getattr(args, "run_dir", None) or getattr(args, "resume", None)
        if named_run is not None:
            check_run_folder(named_run)
        # a kill (SIGTERM) cleans up what the command was writing, as Ctrl-C
        if argv is None and not (training and launched_by_torchrun()):
            _HANDLER_PID = os.getpid()
            signal.signal(signal.SIGTERM, _interrupt)
        if training:  # training shows its warnings itself
            return _flushed(_COMMANDS[args.command](args))
        from kdml.run_log import warnings_on_stderr

        with warnings_on_stderr():
            return _flushed(_COMMANDS[args.command](args))
    except QuietExit as stop:  # rank 0 reported it
        quiet, unsaid = True, str(stop)
        return 2
    except KdmlError as error:
        if _is_main_process():  # under torchrun the ranks fail alike: rank 0 says it once
            print(f"kdml: error: {one_line(str(error))}", file=sys.stderr)
        elif isinstance(error, LocalError):  # met by this rank alone: rank 0 cannot say it
            print(f"kdml: error: rank {_rank()}: {one_line(str(error))}", file=sys.stderr)
            _tell_main(str(error))  # for rank 0's train.log
        else:
            quiet, unsaid = True, str(error)
        return 2
    except KeyboardInterrupt as stop:  # Ctrl-C, or a kill (SIGTERM: Terminated)
        code, stopped = _stop_code(stop)
        print(f"kdml: {stopped}", file=sys.stderr)
        return code
    except MemoryError as error:  # Python's or NumPy's
        return _out_of_memory_stop(error, args.command)
    except RuntimeError as error:
        if _out_of_memory(error):
            return _out_of_memory_stop(error, args.command)
        behind = raised_over(error, KeyboardInterrupt)
        if behind is not None:  # a worker's death raised over a kill or Ctrl-C: that stop
            code, stopped = _stop_code(behind)
            print(f"kdml: {stopped}", file=sys.stderr)
            return code
        if _worker_killed(error):
            return _memory_stop("a data loader worker was killed (SIGKILL), most likely by the "
                                "system for lack of memory", "lower data.num_workers or "
                                "data.batch_size (or data.resize for image files)", args.command)
        if not _failed_collective(error):
            raise
        # another process of the job died (killed, out of memory): its own output says why;
        # this one's traceback, deep in gloo or NCCL, would only bury it
        reason = (str(error).splitlines() or [type(error).__name__])[0]
        print(f"kdml: error: a collective operation failed, most likely because another "
              f"process of this job stopped: its output says why ({reason[:300]})",
              file=sys.stderr)
        return 1
    except ModuleNotFoundError as error:
        # a declared dependency missing from this environment (a broken or partial install):
        # say which to install; any other missing module is a bug, so keep its traceback
        top = (error.name or "").partition(".")[0]
        if top not in DEPENDENCIES:
            raise
        quiet = not _is_main_process()
        if not quiet:
            print(f"kdml: error: the Python package {DEPENDENCIES[top]} (import name {top}), "
                  f"which kdml {args.command} needs, is not installed here: install kdml's "
                  "dependencies (pip install -c constraints.txt -e . in the kdml clone)",
                  file=sys.stderr)
        return 2
    except ImportError as error:
        # a Ctrl-C or kill while a C extension was imported (the commands import lazily)
        interrupted = raised_over(error, KeyboardInterrupt)
        if interrupted is None:
            raise
        code, stopped = _stop_code(interrupted)
        print(f"kdml: {stopped}", file=sys.stderr)
        return code
    except OSError as error:
        if error.filename is None and error.errno in UNWRITABLE_OUTPUT:
            # kdml's own files name themselves in their errors (file_write): one that names
            # none is a printed line's, > /dev/full or to a reader that is gone
            return _unwritten_output(error)
        if error.filename is None:  # not about a path: a bug, so keep its traceback
            raise
        # the file system refused a path (a file where a folder goes, no permission, a full
        # disk): say which and why in one line, as for any other bad input
        quiet = not _is_main_process()
        if not quiet:
            # bytes from some writers (TensorBoard's): their b'...' form is no path to read
            paths = " -> ".join(os.fsdecode(name) if isinstance(name, bytes) else str(name)
                                for name in (error.filename, error.filename2)
                                if name is not None)
            advice = ("check its permissions" if isinstance(error, PermissionError)
                      else "move what is in the way or choose another path"
                      if isinstance(error, (FileExistsError, IsADirectoryError,
                                            NotADirectoryError))
                      else "free space on its disk and run the command again"
                      + _RUN_AGAIN_NOTES.get(args.command, "")
                      if error.errno in (errno.ENOSPC, errno.EDQUOT)
                      else "fix it or choose another path")
            print(f"kdml: error: {paths}: {error.strerror or error}; {advice}", file=sys.stderr)
        return 2
    finally:
        if "kdml.distributed" in sys.modules:  # imported only by commands that train
            # a quiet rank first waits for rank 0's line: torchrun stops the job's other
            # processes once one has stopped, and had stopped rank 0 before it said why
            said = sys.modules["kdml.distributed"].teardown(sys.exc_info()[1], quiet=quiet)
            if not said and unsaid:
                # rank 0 never met it (rank 1's own config file misspelt a key, while rank 0
                # waited for it to join): had torchrun ended the job without a word of why
                print(f"kdml: error: rank {_rank()}: {one_line(unsaid)}", file=sys.stderr)


def _launched() -> bool:
    """:func:`launched_by_torchrun`, False where torchrun's variables are set wrong (each
    process then says so itself)."""
    try:
        return launched_by_torchrun()
    except KdmlError:
        return False


def _stopped_before_joining(quiet: bool) -> None:
    """Under torchrun, a command stopped before it imported kdml.distributed (a usage error):
    rank 0, once it has said why, tells the others, and a ``quiet`` one (its error is rank
    0's to say) waits for that, as :func:`kdml.distributed.teardown` has them do for the
    errors met later."""
    if _launched():
        from kdml import distributed

        distributed.teardown(quiet=quiet)


# kdml's declared dependencies (pyproject.toml's), by the name they are imported as.
DEPENDENCIES = {"torch": "torch", "numpy": "numpy",
                "pytorch_metric_learning": "pytorch-metric-learning", "faiss": "faiss-cpu",
                "sklearn": "scikit-learn", "scipy": "scipy", "PIL": "pillow",
                "safetensors": "safetensors", "kornia": "kornia", "matplotlib": "matplotlib",
                "tqdm": "tqdm", "tensorboard": "tensorboard", "yaml": "pyyaml",
                "mlxtend": "mlxtend", "mnist1d": "mnist1d"}

# A write's errors that name no file: a full disk or quota, a pipe whose reader is gone.
UNWRITABLE_OUTPUT = (errno.ENOSPC, errno.EDQUOT, errno.EPIPE)


def _flushed(code: int) -> int:
    """``code``, once standard output is flushed: a write error of what it still buffers (a
    full disk) is then raised here, for main's one line, not at Python's exit, which prints
    "Exception ignored" and exits 120 (without PYTHONUNBUFFERED, stdout is buffered). A
    process without standard output (closed, ``>&-``, or ``pythonw``'s: ``sys.stdout`` is
    None, into which ``print`` writes nothing) has nothing to flush: its flush had ended a
    finished run with an AttributeError's traceback and exit status 1."""
    if sys.stdout is not None:
        sys.stdout.flush()
    return code


def _unwritten_output(error: OSError) -> int:
    """Say in one line that standard output could not be written (a full disk, a reader that
    is gone); the exit status."""
    _silence_stdout()  # Python's own flush at exit would add a traceback
    print(f"kdml: error: the output could not be written ({error.strerror or error}); free "
          "space where it goes, or send it elsewhere", file=sys.stderr)
    return 2


def _silence_stdout() -> None:
    """Point standard output at /dev/null (what it still buffers is dropped there)."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError):  # no file descriptor (a test's captured stdout)
        pass


def _failed_collective(error: RuntimeError) -> bool:
    """Whether ``error`` is a collective failing because a peer is gone
    (:func:`kdml.distributed.failed_collective`); False where torch.distributed was never
    imported (a command that does not train)."""
    if "torch.distributed" not in sys.modules:
        return False
    from kdml.distributed import failed_collective

    return failed_collective(error)


def _tell_main(message: str) -> None:
    """Leave this rank's own error for rank 0 (:func:`kdml.distributed.tell_main`); nothing
    where torch.distributed was never imported (a command that does not train)."""
    if "kdml.distributed" in sys.modules:
        sys.modules["kdml.distributed"].tell_main(message)


def _out_of_memory(error: RuntimeError) -> bool:
    """Whether ``error`` is torch's failed allocation: on a GPU (``OutOfMemoryError``) or on
    the CPU (a RuntimeError saying "can't allocate memory", also when a data loader's worker
    met it), or a worker's ``MemoryError`` (NumPy's), which torch raises again as a
    RuntimeError ("Caught MemoryError in DataLoader worker process 0")."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(error, torch.OutOfMemoryError):
        return True
    text = str(error)
    return "can't allocate memory" in text or text.startswith("Caught MemoryError in ")


def _worker_killed(error: RuntimeError) -> bool:
    """Whether ``error`` is torch's report of a data loader worker that died by SIGKILL
    ("exited unexpectedly", raised over "is killed by signal: Killed"): on Linux, the kernel's
    out-of-memory killer, which strikes where an allocation had seemed to succeed."""
    return any(isinstance(candidate, RuntimeError)
               and "is killed by signal: Killed" in str(candidate)
               for candidate in (error, error.__cause__, error.__context__))


def _out_of_memory_stop(error: BaseException, command: str) -> int:
    """Say in one line that ``command`` ran out of memory, how much it asked for and what
    lowers it, and return the exit status."""
    return _memory_stop(f"out of memory{_allocation(error)}", "lower data.batch_size or "
                        "eval.embed_batch_size (or data.resize for image files)", command)


def _memory_stop(what: str, lower: str, command: str) -> int:
    """Say ``what`` stopped ``command`` for lack of memory, in one line (each rank of a
    torchrun job says its own), with the remedy: for ``kdml train`` the settings to ``lower``,
    else to free memory; and what a stopped command keeps. Returns the exit status."""
    prefix = "" if _is_main_process() else f"rank {_rank()}: "
    if prefix:
        _tell_main(what)  # for rank 0's train.log, where its collective fails
    remedy = lower if command == "train" else "free memory or use a device with more,"
    print(f"kdml: error: {prefix}{what}; {remedy} and run it again"
          f"{_RUN_AGAIN_NOTES.get(command, '')}", file=sys.stderr)
    return 1


def _allocation(error: BaseException) -> str:
    """`` (tried to allocate 111.8 GiB)``: the size ``error`` says it failed to allocate, or
    nothing; torch's whole message (the CPU allocator's source line, the GPU's memory
    summary, a worker's traceback) is many lines."""
    found = re.search(r"(?:tried to|unable to) allocate ([0-9.]+) ?([KMGTPE]iB|bytes)",
                      str(error), re.IGNORECASE)
    if found is None:
        return ""
    amount, unit = found.groups()
    if unit.lower() == "bytes":
        amount, unit = f"{int(amount) / 2**30:,.1f}", "GiB"
    return f" (tried to allocate {amount} {unit})"


# What a stopped command keeps (a full disk, too little memory), said after "run it again".
_RUN_AGAIN_NOTES = {"train": " (a stopped run continues with kdml train --resume)",
                    "reproduce": " (it keeps its finished runs and continues)"}


_ANALYSES = {"generalization": _analyze_generalization}
_PLOTS = {"charts": _plot_charts, "retrieval": _plot_retrieval,
          "embedding": _plot_embedding}
_COMMANDS = {"train": _train, "eval": _eval, "datasets": _datasets, "recipes": _recipes,
             "config": _config, "embed": _embed, "index": _index, "search": _search,
             "reproduce": _reproduce,
             "analyze": lambda args: _ANALYSES[args.analysis](args),
             "plot": lambda args: _PLOTS[args.plot](args)}

