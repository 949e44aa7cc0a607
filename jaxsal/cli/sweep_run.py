"""How a sweep's cells run: one cell (its explain job, statistics and metrics, its record), in this
process, in worker processes (`jaxsal sweep --workers N`) or as Ray tasks (`--ray`). A worker imports
no command module: only the agent loading, the inputs and jaxsal.errors."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from jaxsal.caching import LRU
from jaxsal.cli._agent import check_agent, check_frames, load_agent
from jaxsal.cli._input import Limited, play
from jaxsal.errors import CLIError, error_line


def _sweep_source(agent, cell, out: Path, target: str, objects: bool = False):
    """(the cell's frames in the model's layout, the whole input's length, its file): a buffer (cut
    to its limit), or the agent's own rollout, played once per agent checkpoint x input and shared by
    its methods (a lock keeps parallel workers from playing it twice); with `objects` the rollout
    keeps each state's boxes beside it."""
    import fcntl

    from jaxsal.io import open_source
    from jaxsal.io.layout import as_layout

    inp = cell.input_spec
    if "path" in inp:
        saved = Path(inp["path"])
        source = open_source(saved)
    else:
        where = out / cell.input_dir
        where.mkdir(parents=True, exist_ok=True)
        saved = where / "_rollout" / "input" / "obs.npy"
        with open(where / ".play.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not saved.exists():
                play(agent, inp["play"], saved.parent.parent, game=inp.get("game"), seed=inp["seed"], quiet=True,
                     target=target, objects=objects)
        source = open_source(saved)
    source = as_layout(source, agent.layout)
    check_agent(agent, source.shape, None, target)
    check_frames(agent, source.shape)
    n = len(source)
    return (Limited(source, inp["limit"]) if "limit" in inp else source), n, str(saved)


_SWEEP_MODELS = LRU("sweep architectures", 64)  # agent card (JSON) -> the apply_fn of its architecture
_SWEEP_LAST = LRU("sweep last agent", 1)  # (spec, checkpoint, their files' times) -> the last cell's agent


def _sweep_agent(cell):
    """The cell's agent, loaded once for the consecutive cells of one checkpoint. Checkpoints of one
    card (a shipped name, a card, a .msgpack with its card) share one apply_fn, so the compiled
    programs of one cell serve the next instead of compiling again."""
    import dataclasses

    from jaxsal.agent_spec import is_function_spec
    from jaxsal.loaders import FILE_SUFFIXES

    stamp = [(p, os.stat(p).st_mtime_ns) for p in (cell.spec.rpartition(":")[0] if is_function_spec(cell.spec)
                                                    else cell.spec, cell.model) if p and os.path.exists(p)]
    key = (cell.spec, cell.model, tuple(stamp))  # consecutive cells of one checkpoint load it once
    agent = _SWEEP_LAST.get_or_build(key, lambda: load_agent(cell.spec, cell.model, None))
    if is_function_spec(cell.spec) or Path(cell.spec).suffix in FILE_SUFFIXES or not agent.card:
        return agent
    key = json.dumps([agent.card, agent.layout, agent.pixels], sort_keys=True, default=str)
    return dataclasses.replace(agent, apply_fn=_SWEEP_MODELS.get_or_build(key, lambda: agent.apply_fn))


def run_sweep_cell(cell, out: Path, metrics, sett: dict) -> dict:
    """Run one cell of a sweep: its explain job (run_job: resumable, chunked) in DIR/<cell>/job,
    then its statistics and metrics; the record (status ok or error with its one-line message,
    frames, seconds) goes to DIR/<cell>/cell.json. Errors are recorded, never raised."""
    from jaxsal.io import MethodSpec, run_job
    from jaxsal.io import sweep as sw

    t0 = time.perf_counter()
    where = Path(out) / cell.path
    rec = {"cell": cell.path, "status": "ok", "error": "", "frames": None, "metrics": {}}
    try:
        from jaxsal.plugins import load_methods
        load_methods()  # a worker process registers the plugins' methods as the command did
        agent = _sweep_agent(cell)
        boxes = bool({"objects", "effects"} & set(metrics))
        source, n_input, input_path = _sweep_source(agent, cell, Path(out), sett["target"], objects=boxes)
        rec["frames"] = len(source)
        objects = None
        if boxes:
            from jaxsal.io.layout import to_nhwc_shape
            from jaxsal.io.object_files import for_job

            objects, _ = for_job("auto", "maps", input_path, agent.card.get("game"), n_input,
                                 to_nhwc_shape(source.shape, agent.layout), cell.input_spec.get("limit"),
                                 effects="effects" in metrics)
        inp = cell.input_spec
        input_id = {k: inp[k] for k in ("play", "seed", "game") if k in inp} if "play" in inp else None
        spec = MethodSpec(cell.method, cell.method_name, cell.options)
        run_job(agent.apply_fn, agent.params, source, where / sw.JOB, [spec], target=sett["target"],
                chunk=sett["chunk"], batch_size=sett["batch_size"], seed=sett["seed"], precision=sett["precision"],
                agent={"name": agent.name, "card": agent.card}, input_id=input_id, quiet=True, layout=agent.layout,
                extra_meta={"sweep_cell": cell.path}, objects=objects)
        module = getattr(getattr(agent.apply_fn, "fn", None), "__self__", None)
        init = module if hasattr(module, "init") and hasattr(module, "apply") else None
        rec["metrics"] = sw.cell_metrics(agent.apply_fn, agent.params, source, where / sw.JOB, cell, metrics, sett,
                                         layout=agent.layout, init_fn=init)
    except Exception as e:  # noqa: BLE001 (recorded in the table; the other cells go on)
        if os.environ.get("JAXSAL_DEBUG"):
            raise
        rec.update(status="error", error=error_line(e), metrics={})
    rec["seconds"] = round(time.perf_counter() - t0, 3)
    sw.write_record(where / sw.CELL_RECORD, rec)
    return rec


WORKER = "from jaxsal.cli.sweep_run import sweep_worker; sweep_worker()"  # a worker process's program


def sweep_worker():
    """A worker process of `jaxsal sweep --workers N`: reads one cell (JSON) on stdin, runs it."""
    from jaxsal import cpu

    cpu.use_fast_kernels(warn=False)
    from jaxsal.io import sweep as sw

    job = json.loads(sys.stdin.read())
    run_sweep_cell(sw.Cell(**job["cell"]), Path(job["out"]), job["metrics"], job["settings"])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown (XLA threads); the record is on disk


def run_workers(todo, out: Path, metrics, sett, workers: int, finished):
    """Run the cells in up to `workers` processes at once (`sweep_worker`, the cell as JSON on
    stdin); a worker that dies without a record gets an error record; `finished(cell)` after each."""
    import subprocess
    import tempfile

    from jaxsal.io import sweep as sw

    pending, running = list(todo), {}
    try:
        while pending or running:
            while pending and len(running) < workers:
                cell = pending.pop(0)
                (out / cell.path).mkdir(parents=True, exist_ok=True)
                (out / cell.path / sw.CELL_RECORD).unlink(missing_ok=True)  # an old error: retried now
                err = tempfile.TemporaryFile()
                proc = subprocess.Popen([sys.executable, "-c", WORKER], stdin=subprocess.PIPE,
                                        stdout=subprocess.DEVNULL, stderr=err)
                try:
                    proc.stdin.write(json.dumps({"cell": cell.as_dict(), "out": str(out.absolute()),
                                                 "metrics": metrics, "settings": sett}).encode())
                    proc.stdin.close()
                except BrokenPipeError:  # the worker died at once: recorded below from its exit code
                    pass
                running[proc] = (cell, err)
            time.sleep(0.05)
            for proc in [p for p in running if p.poll() is not None]:
                cell, err = running.pop(proc)
                if sw.read_record(out, cell) is None:
                    err.seek(0)
                    lines = [ln for ln in err.read().decode(errors="replace").splitlines() if ln.strip()]
                    why = f"worker exited with code {proc.returncode}" + (f": {lines[-1][:300]}" if lines else "")
                    sw.write_record(out / cell.path / sw.CELL_RECORD, {
                        "cell": cell.path, "status": "error", "frames": None, "metrics": {}, "seconds": None,
                        "error": why})
                err.close()
                finished(cell)
    except BaseException:
        for proc in running:
            proc.terminate()  # SIGTERM: a job keeps its finished chunks, a rerun resumes
        for proc in running:
            proc.wait()
        raise


RAY_HINT = "pip install 'jaxsal[ray]'"


def import_ray():
    try:
        import ray
    except ImportError:
        raise CLIError(f"--ray needs Ray, which is not installed: {RAY_HINT}") from None
    return ray


def ray_cell(job_json: str) -> str:
    """A Ray task of `jaxsal sweep --ray`: one cell, given and returned as JSON (the cell spec, DIR,
    metrics and settings in; its record out); the cell's files go to the shared DIR."""
    from jaxsal import cpu

    cpu.use_fast_kernels(warn=False)
    from jaxsal.io import sweep as sw

    job = json.loads(job_json)
    rec = run_sweep_cell(sw.Cell(**job["cell"]), Path(job["out"]), job["metrics"], job["settings"])
    return json.dumps(rec, allow_nan=True)


def ray_task_env(gpus: float) -> dict | None:
    """The Ray runtime environment of a cell's task. Ray hides no GPU from a task that asked for none,
    whose JAX would take the node's GPUs (and their memory) anyway: such a task runs JAX on the CPU.
    A task given a fraction of a GPU preallocates that fraction of its memory (XLA's default, 75% of
    the whole GPU, would not leave room for the others sharing it)."""
    if gpus == 0:
        return {"env_vars": {"JAX_PLATFORMS": "cpu"}}
    if gpus < 1:
        return {"env_vars": {"XLA_PYTHON_CLIENT_MEM_FRACTION": f"{0.9 * gpus:.3f}"}}
    return None


def ray_address(address: str) -> tuple[bool, int | None]:
    """(local, CPUS) of --ray: local, local:CPUS (a Ray instance started here) or a cluster's address."""
    kind, colon, n = address.partition(":")
    if kind != "local":
        return False, None
    if colon and not (n.isdigit() and int(n) > 0):
        raise CLIError(f"--ray {address!r}: use local, local:CPUS (a positive integer) or a cluster ADDRESS")
    return True, int(n) if n else None


def run_ray(todo, out: Path, metrics, sett, address: str, cpus: float, gpus: float, finished):
    """Run the cells as Ray tasks (`ray_cell`, `cpus` CPUs and `gpus` GPUs each) on the cluster at
    `address`, or on a Ray instance started here (`local`, `local:CPUS`), or on the one this process
    has already started (ray.init); `finished(cell)` after each. A task that dies is recorded as an
    error; a record missing from DIR after its task (a DIR the node does not share) too."""
    from jaxsal.io import sweep as sw

    if not todo:
        return
    ray = import_ray()
    started = False
    if not ray.is_initialized():
        import warnings

        local, num = ray_address(address)
        with warnings.catch_warnings():  # Ray starts its processes with fork+exec, which is safe here
            warnings.filterwarnings("ignore", message="os.fork", category=RuntimeWarning)
            if local:
                ray.init(num_cpus=num, include_dashboard=False, log_to_driver=False)
            else:
                try:
                    ray.init(address=address, log_to_driver=False)
                except ConnectionError as e:
                    raise CLIError(f"--ray {address}: cannot connect to a Ray cluster there "
                                   f"({str(e).splitlines()[0]}); give its address (ray start --head prints it), "
                                   "or --ray local") from None
        started = True
    task = ray.remote(num_cpus=cpus, num_gpus=gpus, max_retries=0, runtime_env=ray_task_env(gpus))(ray_cell)
    refs = {}
    try:
        for cell in todo:
            (out / cell.path).mkdir(parents=True, exist_ok=True)
            (out / cell.path / sw.CELL_RECORD).unlink(missing_ok=True)  # an old error: retried now
            job = json.dumps({"cell": cell.as_dict(), "out": str(out.absolute()), "metrics": metrics,
                              "settings": sett})
            refs[task.remote(job)] = cell
        while refs:
            ready, _ = ray.wait(list(refs), num_returns=1)
            for ref in ready:
                cell = refs.pop(ref)
                try:
                    ray.get(ref)
                    why = None if sw.read_record(out, cell) is not None else (
                        f"its Ray task finished but left no record in {out.absolute()}: --out must be a folder "
                        "every Ray node shares")
                except Exception as e:  # noqa: BLE001 (the task or its worker died)
                    lines = [ln for ln in str(e).splitlines() if ln.strip()]
                    why = f"Ray task failed: {type(e).__name__}" + (f": {lines[-1][:300]}" if lines else "")
                if why is not None:
                    sw.write_record(out / cell.path / sw.CELL_RECORD, {
                        "cell": cell.path, "status": "error", "frames": None, "metrics": {}, "seconds": None,
                        "error": why})
                finished(cell)
    except BaseException:
        for ref in refs:
            ray.cancel(ref)  # a job keeps its finished chunks, a rerun resumes
        raise
    finally:
        if started:
            ray.shutdown()
