"""The `jaxsal` command: explain replay buffers in batch, render galleries and videos, run the demo.

    jaxsal explain --agent breakout --methods gradcam,rise --input buffer.npz --out maps/
    jaxsal render maps/
    jaxsal sweep sweep.toml --out runs/sweep/
    jaxsal demo
    jaxsal agents
    jaxsal agents fetch pong --from path/to/jaxsal/agents/shipped

Every bad input ends in one line on stderr and a non-zero exit, never a traceback
(set JAXSAL_DEBUG=1 to see one). Here: the parser, the exit codes and `main`; each command is a
module of its own (explain, render, demo, sweep, agents), which builds its subparser.
"""
from __future__ import annotations

import argparse
import os
import sys

from jaxsal.cli._common import EXIT_INPUT, EXIT_INTERNAL, EXIT_INTERRUPT, EXIT_TERM
from jaxsal.errors import error_line, is_user_error


def _die(msg: str, code: int = EXIT_INPUT):
    print(f"jaxsal: error: {msg}", file=sys.stderr)
    return code


def build_parser() -> argparse.ArgumentParser:
    """The `jaxsal` parser. The command modules are imported here, not when the package is, so that a
    sweep worker (jaxsal.cli.sweep_run) loads none of them."""
    from jaxsal import __version__
    from jaxsal.cli import agents, demo, explain, render, sweep

    p = argparse.ArgumentParser(prog="jaxsal", description="Saliency maps for deep RL agents, in batch.")
    p.add_argument("--version", action="version", version=f"jaxsal {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    for command in (explain, render, demo, sweep, agents):
        command.add_parser(sub)
    return p


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread: a job stops as on Ctrl-C (finished chunks kept, resumable)."""


def _on_sigterm(signum, frame):
    raise Terminated()


def main(argv=None) -> int:
    """Console entry point; returns the exit status (also used by `sys.exit`)."""
    import signal
    import threading

    args = build_parser().parse_args(argv)
    from jaxsal import cpu
    cpu.use_fast_kernels(warn=False)  # before any JAX computation: XLA reads its flags once
    handled = threading.current_thread() is threading.main_thread()  # signals reach the main thread only
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if handled else None
    try:
        from jaxsal.plugins import load_methods
        load_methods()  # the methods of other packages and JAXSAL_METHODS, before --methods is read
        code = args.fn(args)
    except KeyboardInterrupt as e:
        term = isinstance(e, Terminated)
        saved = getattr(e, "jaxsal_saved", "finished chunks are kept")
        code = _die(f"{'terminated (SIGTERM)' if term else 'interrupted'}; {saved}, no partial chunk is counted; "
                    "rerun the same command to resume", EXIT_TERM if term else EXIT_INTERRUPT)
        if argv is None:  # console: skip interpreter teardown, which can crash (SIGSEGV) while XLA
            sys.stdout.flush()  # or reader threads are still busy; every finished chunk is on disk
            sys.stderr.flush()
            os._exit(code)
    except Exception as e:  # one line for the user, never a traceback
        if os.environ.get("JAXSAL_DEBUG"):
            raise
        job = args.command in ("explain", "sweep", "demo")
        code = _die(error_line(e, job), EXIT_INPUT if is_user_error(e) else EXIT_INTERNAL)
    finally:
        if handled:  # in-process callers (tests, notebooks) get their handler back
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
    if argv is None:
        sys.exit(code)
    return code
