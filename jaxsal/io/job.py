"""Streaming, resumable batch jobs: explain every frame of a buffer into a chunked map store.

A reader thread loads the next chunk from disk and puts it on the device while the current
chunk is explained (host-to-device overlap); a writer thread saves finished chunks while
the next one computes. Memory is bounded by a few chunks, never by the buffer size. Chunk
boundaries are fixed by the job's configuration, so a rerun after a kill computes exactly
the missing chunks and ends with the same files as an uninterrupted run.

Each chunk is explained as `jaxsal.explain(method=[...])` explains a list: methods of the
single-backward family with identical settings are computed together (one backward per ReLU
rule, jaxsal.front.share_groups), every other method on its own.
"""
from __future__ import annotations

import dataclasses
import json
import queue
import threading
import time
from pathlib import Path

import jax
import numpy as np

from jaxsal import checks, sizing
from jaxsal.batching import batch_sharding, pad_rows
from jaxsal.engine import expression
from jaxsal.engine.precision import check_precision
from jaxsal.errors import SaliencyInputError
from jaxsal.io import store
from jaxsal.io.readers import dtype_spans, row_ids, verify_input
from jaxsal.registry import COMMON_ARGS, FRONT_DEFAULTS, STOCHASTIC, accepted_options, check_options
from jaxsal.targets import explains_action, get_target

DTYPES = ("float32", "float16")
SCAN_BYTES = 1 << 30  # float inputs up to this size are checked in full before anything is written


@dataclasses.dataclass(frozen=True)
class MethodSpec:
    """One output of a job: `alias` names its directory, `method` the registered method or a method
    expression (jaxsal.engine.expression, e.g. "noise_tunnel(gradcam, n=16)")."""
    alias: str
    method: str
    options: dict

    def split(self) -> tuple[dict, dict]:
        """(common kwargs of jaxsal.explain, the method's own options)."""
        common = {k: v for k, v in self.options.items() if k in COMMON_ARGS}
        own = {k: v for k, v in self.options.items() if k not in COMMON_ARGS}
        return common, own


def check_specs(specs: list[MethodSpec]):
    """Unknown methods, bad method expressions or unknown options fail here, before any work starts."""
    if not specs:
        raise SaliencyInputError("no methods given; e.g. --methods gradcam,gradient")
    seen = set()
    for s in specs:
        if s.alias.startswith("_"):
            raise SaliencyInputError(f"method alias {s.alias!r} may not start with '_' (reserved for "
                                     "the job's own files)")
        if s.alias in seen:
            raise SaliencyInputError(f"method {s.alias!r} given twice; name a variant alias=method")
        seen.add(s.alias)
        if not s.alias.replace("_", "").replace("-", "").isalnum():
            raise SaliencyInputError(f"bad method name {s.alias!r}: use letters, digits, _ and -")
        accepted = accepted_options(expression.function(s.method))
        check_options(s.method, accepted, s.options, shown=[a for a in accepted if a not in ("key", "batch_size")])


def _jsonable(x):
    return json.loads(json.dumps(x, default=lambda o: repr(o)))


class _Worker(threading.Thread):
    """A daemon thread running `fn(item)` over a bounded queue; its first error is kept."""

    def __init__(self, fn, maxsize: int = 2):
        super().__init__(daemon=True)
        self.fn, self.q, self.error = fn, queue.Queue(maxsize), None

    def run(self):
        while True:
            item = self.q.get()
            if item is None:
                return
            if self.error is None:
                try:
                    self.fn(item)
                except BaseException as e:  # reported by the main thread
                    self.error = e

    def put(self, item):
        while True:
            if self.error is not None:
                raise self.error
            try:
                self.q.put(item, timeout=0.2)
                return
            except queue.Full:
                continue


def bound_malloc(threshold: int = 1 << 20):
    """Make glibc return freed chunk-sized buffers to the OS (fixed mmap threshold).

    glibc raises its mmap threshold after each large free, so chunk buffers then come from
    the heap and fragment it: resident memory creeps up with the number of chunks. Fixing
    the threshold keeps peak memory bounded by the chunk. No-op off glibc.
    """
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, threshold)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def run_job(apply_fn, params, source, out, specs: list[MethodSpec], *, target: str = "q_chosen",
            chunk: int = 512, batch_size: int | None = 256, dtype: str = "float32", seed: int = 0,
            agent: dict | None = None, params_checksum: str | None = None,
            input_id: dict | None = None, process_id: int = 0, num_processes: int = 1,
            quiet: bool = False, extra_meta: dict | None = None, layout: str | None = None,
            objects=None, store_maps: bool = True, precision: str = "float32") -> dict:
    """Explain every frame of `source` with every method into `out`; resumes a stopped job.

    `source` is a reader from `jaxsal.io.open_source` (or anything with len/read/fingerprint/
    describe). Process `process_id` of `num_processes` computes chunks i with
    i % num_processes == process_id. Returns a summary dict (frames, maps/s per method,
    wall time, output path). `extra_meta` adds provenance fields to the manifest. `layout` is
    the model's ("NHWC"/"NCHW"; frames are read in it). Every chunk also stores the explained
    action (none for a target that explains no action, e.g. value), the model's output vector (both
    from the engine's clean forward of the chunk's methods: the job runs no forward of its own) and
    each state's index in the input (`jaxsal.load_outputs`: the row number, or a Dopamine buffer's
    index and checkpoint); with target="q_action" the
    actions come from `source.actions(start, stop)` (a Dopamine buffer's action file, an .npz's
    `actions` array).
    `objects` (a `jaxsal.io.object_files.ObjectsInput` aligned with `source`) adds per-frame object
    shares per method (DIR/_objects, `jaxsal.load_object_shares`); `store_maps=False` then keeps
    only those shares, not the maps. `precision` ("float32" or "bfloat16") is every method's
    (jaxsal.explain's precision=; a method's own option wins). With `objects.effects` each chunk
    also gets the causal effects of removing each object class (`jaxsal.metrics.object_effects`
    with this target and the actions the maps explain; DIR/_objects/_effects,
    `jaxsal.load_object_effects`), once for all methods.
    Methods computed together (summary "computed_together")
    are each credited the group's time in maps_per_s.
    Before anything is written the job runs jaxsal.checks once: the model on these frames, the
    target, the q_action actions, the frames' values (all of them up to SCAN_BYTES, else the first
    chunk, and each later chunk as it is read); the methods then check shapes only.
    """
    from jaxsal.provenance import params_checksum as checksum_of

    import jaxsal

    t0 = time.perf_counter()
    all_actions = _check_arguments(source, specs, target, dtype, precision, chunk, batch_size, seed, process_id,
                                   num_processes, store_maps, objects, layout)
    n = len(source)
    config = {
        "methods": {s.alias: {"method": s.method, "options": _jsonable(s.options)} for s in specs},
        "target": target, "dtype": dtype, "chunk": chunk, "n": n, "seed": seed,
        "frame_shape": list(source.shape[1:]),
        "input": input_id or {"checksum": source.fingerprint()},
        "params_checksum": params_checksum or checksum_of(params),
        "agent": (agent or {}).get("name"),
    }
    if layout not in (None, "NHWC"):
        config["layout"] = layout
    if precision != "float32":  # only then: float32 jobs' configs stay as they were
        config["precision"] = precision
    if objects is not None:  # only then: configs of jobs without objects stay as they were
        config["objects"] = objects.config()
        if not store_maps:
            config["store"] = "shares"
    meta = {"version": jaxsal.__version__, "created": store.stamp(), "input_source": source.describe(),
            "agent_card": (agent or {}).get("card"),
            "resolved": resolved_options(apply_fn, params, source, specs, target, layout, precision),
            "outputs": f"{OUTPUTS}/chunk_XXXXXXX.npz: per frame the explained action (none when the target "
                       "explains no action, e.g. value) and the model's output",
            **({"objects_source": objects.describe()} if objects is not None else {}),
            **(extra_meta or {})}
    verify_input(source)  # a corrupt archive member is refused before anything is written
    out = Path(out)
    # the library's checks, once, before anything is written: the model and target on these frames,
    # the actions q_action explains, the frames' values (NaN, pixel scale; whole if small enough)
    layout = checks.resolve_layout(source.shape, layout, getattr(apply_fn, "jaxsal_layout", None))
    model_out = checks.check_model(apply_fn, params, source.shape, layout=layout, target=target)
    if target == "q_action":
        try:
            checks.check_actions(all_actions, n, checks.num_actions(model_out))
        except SaliencyInputError as e:
            raise SaliencyInputError(f"the input's actions do not fit this model: {e}; model and input are for "
                                     "different games, or the actions are not one per frame stack") from None
    pixels = getattr(apply_fn, "jaxsal_pixels", None)
    scanned = _scan_values(source, pixels, chunk, whole_ok=not _resuming(out, config))
    with store.job_lock(out, shared=num_processes > 1):  # one job writes here at a time (its processes together)
        manifest = store.open_job(out, config, meta)
        for s in specs:  # each method's directory describes itself too
            store.write_method_meta(out, s.alias, manifest)
        job = _Chunks(apply_fn, params, source, out, specs, target=target, chunk=chunk, dtype=dtype, layout=layout,
                      batch_size=batch_size, precision=precision, seed=seed, objects=objects,
                      store_maps=store_maps, scanned=scanned, pixels=pixels)
        if objects is not None:
            from jaxsal.io import object_files as objs

            objs.write_meta(out, objects, store_maps)
        if num_processes == 1:  # nobody else writes here: drop temp files left by a killed run
            job.drop_temp_files()
        mine = [i for i in range(job.n_chunks) if i % num_processes == process_id]
        if store_maps:  # a damaged chunk is named now, not counted as done (load_maps would refuse it later)
            store.check_map_chunks(out, [s.alias for s in specs], mine, n, chunk)
        todo = [i for i in mine if not job.chunk_done(i)]
        total = sum(job.rows(i) for i in mine)
        done_before = total - sum(job.rows(i) for i in todo)
        bar = _progress(total, done_before, quiet)
        try:
            job.stream(todo, bar)
        finally:
            if bar is not None:
                bar.close()
        wall = time.perf_counter() - t0
        summary = {
            "frames": n, "frames_this_process": total, "frames_computed": job.computed,
            "frames_resumed": done_before, "wall_s": round(wall, 3),
            **job.rates(),
            **({"effects_s": round(job.effects_s, 3)} if job.effects else {}),
            "out": str(out.absolute()), "complete": all(job.chunk_done(i) for i in range(job.n_chunks)),
            "process_id": process_id, "num_processes": num_processes, "devices": jax.local_device_count(),
        }
        if todo or not (out / f"summary-p{process_id}.json").exists():  # nothing to do: write nothing (read-only ok)
            store.atomic_write(out / f"summary-p{process_id}.json", json.dumps(summary, indent=2).encode())
        return summary


def _check_arguments(source, specs, target, dtype, precision, chunk, batch_size, seed, process_id, num_processes,
                     store_maps, objects, layout):
    """run_job's arguments, before anything is read beyond headers or written; returns every state's
    action for target="q_action" (checked against the model later), else None."""
    check_specs(specs)
    get_target(target)  # an unknown target fails here, before anything is written
    bound_malloc()
    if dtype not in DTYPES:
        raise SaliencyInputError(f"--dtype must be one of {DTYPES}, got {dtype!r}")
    check_precision(precision)
    for name, v in (("chunk", chunk), ("num_processes", num_processes)):
        checks.check_positive_int(name, v)
    sizing.check_batch_size(batch_size)
    checks.check_seed("seed", seed)
    if not 0 <= process_id < num_processes:
        raise SaliencyInputError(f"process_id must be in [0, {num_processes}), got {process_id}")
    all_actions = None
    if target == "q_action":
        if not hasattr(source, "actions"):
            raise SaliencyInputError("--target q_action needs the actions taken in each state: save them in the "
                                     ".npz next to the frames (np.savez(path, obs=frames, actions=actions), "
                                     "one integer per frame stack), use a Dopamine replay directory (its "
                                     "$store$_action_ckpt files), or choose another target")
        all_actions = source.actions(0, len(source))  # every part's, checked before anything is written
        for s in specs:
            if "actions" in s.options:
                raise SaliencyInputError(f"{s.alias}: --target q_action takes the actions from the input; "
                                         "drop its actions option")
    if not store_maps and objects is None:
        raise SaliencyInputError("storing no maps leaves nothing to store: --store shares needs --objects")
    if objects is not None:
        from jaxsal.io.layout import to_nhwc_shape
        from jaxsal.io.object_files import check_aligned

        check_aligned(objects, len(source), to_nhwc_shape(source.shape, layout or "NHWC"))
    return all_actions


def _scan_values(source, pixels, chunk: int, whole_ok: bool) -> int:
    """The up-front value check of float frames (uint8 frames need no look); returns how many leading
    frames it covered, the later ones being checked as they are read. Rows of other dtypes (every float
    shard of a shard folder, not only the first chunk's) are checked in full when they are at most
    SCAN_BYTES (and the job is not resuming), else the first chunk of each shard."""
    n = len(source)
    spans = [(a, b, dt) for a, b, dt in dtype_spans(source) if dt not in (np.uint8, np.bool_)]
    if not spans:
        return n
    row = int(np.prod(source.shape[1:]))
    whole = whole_ok and sum((b - a) * row * dt.itemsize for a, b, dt in spans) <= SCAN_BYTES
    for a0, b0, _ in spans:
        for a in range(a0, b0 if whole else min(b0, a0 + chunk), chunk):
            b = min(b0, a + chunk)
            _check_values(np.asarray(source.read(a, b)), pixels, a, b, prefix_nan=False)
    return n if whole else min(n, chunk)


class _Chunks:
    """A job's chunks: which are done, how one is read, explained and saved, and the streaming loop
    (a reader thread loads and places the next chunk, a writer thread saves the last one)."""

    def __init__(self, apply_fn, params, source, out: Path, specs, *, target, chunk, dtype, layout, batch_size,
                 precision, seed, objects, store_maps, scanned, pixels):
        self.apply_fn, self.params, self.source, self.out, self.specs = apply_fn, params, source, out, specs
        self.target, self.chunk, self.dtype, self.layout, self.batch_size = target, chunk, dtype, layout, batch_size
        self.objects, self.store_maps, self.scanned, self.pixels = objects, store_maps, scanned, pixels
        self.effects = objects is not None and objects.effects
        self.n = len(source)
        self.n_chunks = -(-self.n // chunk)
        self.use_actions = target == "q_action"
        key = jax.random.PRNGKey(seed)
        self.base = {s.alias: _explain_args(s, target, layout, key, batch_size, precision) for s in specs}
        # every chunk is padded to the same rows (one compiled executable for all), a multiple of
        # the local devices, and lands on them already split along the batch axis
        self.pad_to = sizing.device_multiple(min(chunk, self.n))
        self.sharding = batch_sharding()
        self.seconds = {s.alias: 0.0 for s in specs}
        self.shared: dict = {}  # alias -> the aliases computed together with it (one backward per chunk)
        self.first_chunk_s: dict = {}
        self.computed, self.effects_s = 0, 0.0

    # ---------------------------------------------------------------- what is on disk
    def rows(self, i: int) -> int:
        return min(self.chunk, self.n - i * self.chunk)

    def method_done(self, alias: str, i: int) -> bool:
        """A method's chunk is done when everything it stores for the chunk exists."""
        from jaxsal.io import object_files as objs

        return ((not self.store_maps or store.chunk_path(self.out, alias, i).exists())
                and (self.objects is None or objs.objects_path(self.out, alias, i).exists()))

    def effects_done(self, i: int) -> bool:
        from jaxsal.io import object_files as objs

        return not self.effects or objs.effects_path(self.out, i).exists()

    def chunk_done(self, i: int) -> bool:
        return (all(self.method_done(s.alias, i) for s in self.specs) and store.outputs_done(self.out, i)
                and self.effects_done(i))

    def drop_temp_files(self):
        """Temporary files a killed run left (only when no other process writes here)."""
        for s in self.specs:
            for tmp in (self.out / s.alias).glob(".chunk_*.tmp") if (self.out / s.alias).exists() else ():
                tmp.unlink(missing_ok=True)
        if self.objects is not None:
            from jaxsal.io import object_files as objs

            objs.drop_temp_files(self.out, [s.alias for s in self.specs])

    # ---------------------------------------------------------------- one chunk
    def load(self, i: int):
        """Chunk i read, value-checked beyond the up-front scan, padded and placed on the devices."""
        a, m = i * self.chunk, self.rows(i)
        x = np.asarray(self.source.read(a, a + m))
        if a + m > self.scanned:  # beyond the up-front scan: checked before its outputs exist
            _check_values(x, self.pixels, a, a + m)
        x = pad_rows(x, self.pad_to)
        acts = pad_rows(np.asarray(self.source.actions(a, a + m)), self.pad_to) if self.use_actions else None
        return i, m, (jax.device_put(x) if self.sharding is None else jax.device_put(x, self.sharding)), acts

    def explain(self, i: int, m: int, x, acts):
        """(maps and shares per method, the stored outputs, the object effects or None) of chunk i."""
        from jaxsal.engine import run as run_engine
        from jaxsal.front import explain_group, share_groups

        results, engine_out = [], None
        # each chunk's states keep their positions in the input (first_index): per-state draws
        # (SmoothGrad's noise) are those of one call on the whole input, whatever --chunk is
        calls = {a: (meth, common if acts is None else dict(common, actions=acts),
                     dict(own, first_index=own["first_index"] + i * self.chunk) if "first_index" in own else own)
                 for a, (meth, common, own) in self.base.items()}
        for group in share_groups(calls):  # the same every chunk: it depends on the settings only
            # a group with any chunk missing is computed whole, so a resumed job writes
            # what an uninterrupted one would (the same computation, not a smaller one)
            if all(self.method_done(a, i) for a in group):
                continue
            ts = time.perf_counter()
            # the stored actions and outputs come from the first group that explains the job's
            # target and actions: what its clean forward gave (the job runs no forward of its own)
            want = engine_out is None and all(calls[a][1]["target"] == self.target and calls[a][1]["actions"] is acts
                                              for a in group)
            try:
                with checks.values_checked():  # once per chunk, when it was read
                    maps, got = explain_group(self.apply_fn, self.params, x, calls, group, outputs=True) if want \
                        else (explain_group(self.apply_fn, self.params, x, calls, group), None)
                engine_out = engine_out if got is None else got
                for a in group:
                    results.append((a, np.asarray(maps[a][:m]).astype(self.dtype) if self.store_maps else None,
                                    self._shares(maps[a], i, m)))
            except SaliencyInputError as e:  # say which frames, keep it one line
                raise SaliencyInputError(
                    f"{'+'.join(group)}, frames {i * self.chunk}:{i * self.chunk + m}: {e}") from None
            self._took(group, m, time.perf_counter() - ts)
        chunk_effects = self._effects(i, m, x, acts)
        if engine_out is None:  # no group ran on the engine (or all were done): its forward alone
            with checks.values_checked():
                _, engine_out = run_engine([], self.apply_fn, self.params, x, target=self.target, actions=acts,
                                           layout=self.layout, batch_size=self.batch_size, outputs=True)
        outputs = stored_outputs(engine_out, self.target, acts is not None, m)
        a = i * self.chunk
        outputs.update(row_ids(self.source, a, a + m))  # which state of the input each row is
        return results, outputs, chunk_effects

    def _shares(self, maps, i: int, m: int):
        """Object shares of one method's float32 maps of chunk i (None without objects)."""
        if self.objects is None:
            return None
        from jaxsal.io import object_files as objs

        return objs.chunk_shares(maps, self.objects.boxes[i * self.chunk:i * self.chunk + m], m)

    def _effects(self, i: int, m: int, x, acts):
        """The causal effects of removing each object class in chunk i, once for all methods (or None)."""
        if not self.effects or self.effects_done(i):
            return None
        from jaxsal.io import object_files as objs

        ts = time.perf_counter()
        try:
            with checks.values_checked():
                res = objs.chunk_effects(self.apply_fn, self.params, x,
                                         self.objects.boxes[i * self.chunk:i * self.chunk + m], m, self.target,
                                         actions=acts, layout=self.layout, batch_size=self.batch_size)
        except SaliencyInputError as e:
            raise SaliencyInputError(f"object effects, frames {i * self.chunk}:{i * self.chunk + m}: {e}") from None
        self.effects_s += time.perf_counter() - ts
        return res

    def _took(self, group, m: int, took: float):
        for a in group:  # each method of a group took the group's time
            self.seconds[a] += took
            if not self.first_chunk_s.get(a):
                self.first_chunk_s[a] = (m, took)  # includes compilation
        self.shared.update({a: list(group) for a in group if len(group) > 1})

    def save(self, item):
        """Everything chunk i stores that is not on disk yet (the writer thread)."""
        from jaxsal.io import object_files as objs

        i, results, outputs, chunk_effects = item
        if chunk_effects is not None and not objs.effects_path(self.out, i).exists():
            objs.write_effects(self.out, i, chunk_effects)
        for alias, maps, shares in results:
            if maps is not None and not store.chunk_path(self.out, alias, i).exists():
                store.write_chunk(self.out, alias, i, maps)
            if shares is not None and not objs.objects_path(self.out, alias, i).exists():
                objs.write_shares(self.out, alias, i, shares)
        if not store.outputs_done(self.out, i):  # also rewrites a chunk an older jaxsal wrote without "index"
            store.write_outputs(self.out, i, outputs)

    # ---------------------------------------------------------------- the stream
    def stream(self, todo: list[int], bar):
        """Explain the chunks `todo`: a reader thread loads the next while one computes, a writer thread
        saves the last; an input that fails while being read marks the job so that its chunks are never
        served as complete, and every chunk computed before an error is still saved."""
        reader_q: queue.Queue = queue.Queue(maxsize=2)
        reader_err: list = []
        stop = threading.Event()

        def offer(item):
            while not stop.is_set():
                try:
                    reader_q.put(item, timeout=0.2)
                    return True
                except queue.Full:
                    continue
            return False

        def reader():
            try:
                for i in todo:
                    if not offer(self.load(i)):
                        return
            except BaseException as e:
                reader_err.append(e)
            offer(None)

        writer = _Worker(self.save)
        writer.start()
        threading.Thread(target=reader, daemon=True).start()
        try:
            while True:
                item = reader_q.get()
                if item is None:
                    break
                i, m, x, acts = item
                results, outputs, chunk_effects = self.explain(i, m, x, acts)
                writer.put((i, results, outputs, chunk_effects))
                self.computed += m
                if bar is not None:
                    bar.update(m)
            if reader_err:
                if isinstance(reader_err[0], SaliencyInputError):  # the input failed while being read: the chunks
                    store.mark_input_failed(self.out, str(reader_err[0]))  # already written are never served as complete
                raise reader_err[0]
        finally:
            stop.set()  # the reader stops; the writer still saves every chunk already computed
            writer.q.put(None)
            writer.join()
        if writer.error is not None:
            raise writer.error

    def rates(self) -> dict:
        """The summary's maps/s per method (each credited its group's time), after compilation too."""
        computed, first = self.computed, self.first_chunk_s
        return {
            "maps_per_s": {a: (round(computed / t, 2) if t > 0 and computed else None) for a, t in self.seconds.items()},
            "maps_per_s_after_compile": {
                a: (round((computed - first[a][0]) / (t - first[a][1]), 2)
                    if a in first and computed > first[a][0] and t > first[a][1] else None)
                for a, t in self.seconds.items()},
            "computed_together": sorted({tuple(g) for g in self.shared.values()}),
        }


def _explain_args(spec: MethodSpec, target, layout, key, batch_size, precision) -> tuple:
    """(method: a name or Spec, common, options) of a spec as `jaxsal.explain(method=...)` gets
    them in a job: the job's target, layout, batch size and precision unless the spec sets its own, and
    the job's key for methods that take one (the same key every chunk)."""
    common, own = spec.split()
    kw = dict(common, **own)
    kw.setdefault("target", target)
    kw.setdefault("layout", layout)
    kw.setdefault("batch_size", batch_size)
    kw.setdefault("precision", precision)
    method = expression.parse(spec.method)  # a name, or the Spec of an expression (built once per job)
    accepted = accepted_options(expression.function(method))
    if "key" in accepted or spec.method in STOCHASTIC:
        kw["key"] = key  # one key for every chunk: e.g. the same RISE masks for every state
    if "first_index" in accepted:
        kw.setdefault("first_index", 0)  # plus each chunk's first frame (run_job)
    args = {k: kw.pop(k, FRONT_DEFAULTS[k]) for k in COMMON_ARGS}
    return method, args, kw


def _resuming(out: Path, config: dict) -> bool:
    """`out` holds this job on this input already (its input was checked when it started)."""
    try:
        return json.loads((Path(out) / store.MANIFEST).read_text())["config"].get("input") == config["input"]
    except (OSError, ValueError, KeyError):
        return False


def _check_values(x, pixels, a: int, b: int, prefix_nan: bool = True):
    """jaxsal.checks.check_values of frames a:b of the input (host arrays: no device work)."""
    try:
        checks.check_values(x, pixels, a, ("frame", "the input"))
    except checks.NonFinite as e:
        if prefix_nan:
            raise checks.NonFinite(f"frames {a}:{b}: {e}", e.index) from None
        raise
    except SaliencyInputError as e:
        raise SaliencyInputError(f"frames {a}:{b}: {e}") from None


OUTPUTS = store.OUTPUTS
POLICY_TARGETS = ("policy_logit", "log_prob")


def stored_outputs(engine_out: dict, target, given: bool, m: int) -> dict:
    """What a chunk stores of the engine's clean forward (jaxsal.engine.run(outputs=True)), as
    host arrays of its m real rows: {"action": (m,), "q" or "logits": (m, A), ["value": (m,)]},
    the action the target explains (the given one for q_action; none for a target that explains
    no action, e.g. value) and the model's output vector."""
    from jaxsal.targets import LOGIT_KEYS, Q_KEYS, logits_of, q_of, value_of

    o = jax.tree.map(lambda v: np.asarray(v)[:m], engine_out["output"])
    res = {}
    if isinstance(o, dict):
        if any(k in o for k in Q_KEYS):
            res["q"] = q_of(o)
        if any(k in o for k in LOGIT_KEYS):
            res["logits"] = logits_of(o)
        if "value" in o:
            res["value"] = value_of(o)
    elif isinstance(o, (tuple, list)) and len(o) == 2:
        res["logits" if target in POLICY_TARGETS else "q"] = o[0]
        res["value"] = value_of(o)
    elif getattr(o, "ndim", None) == 2:
        res["logits" if target in POLICY_TARGETS else "q"] = o
    if given or explains_action(get_target(target)):  # value (and callables): no action is explained
        res["action"] = np.asarray(engine_out["actions"])[:m].astype(np.int32)
    return res


def resolved_options(apply_fn, params, source, specs, target, layout, precision="float32") -> dict:
    """Per method: every option with its default filled in, the target, the layout, the precision, and the layer
    a CAM method taps when none was given (resolved on the first frame)."""
    import inspect

    from jaxsal.backprop.layers import resolve_layer

    res = {}
    first = None
    for s in specs:
        fn = expression.function(s.method)
        sig = inspect.signature(fn)
        opts = {k: p.default for k, p in sig.parameters.items()
                if p.default is not inspect.Parameter.empty and k not in ("key", "batch_size", "actions")}
        opts.update(s.options)
        if "target" not in s.options:
            opts["target"] = target if isinstance(target, str) else getattr(target, "__name__", "callable")
        if "layout" not in s.options:
            opts["layout"] = layout or "NHWC"
        if "precision" in opts and "precision" not in s.options:
            opts["precision"] = precision
        if "layer" in opts and opts["layer"] is None:
            try:
                if first is None:
                    first = np.asarray(source.read(0, 1)).astype(np.float32)
                opts["layer"] = resolve_layer(apply_fn, params, first, None)
            except Exception as e:  # noqa: BLE001 (the job itself reports a bad model clearly)
                opts["layer"] = f"unresolved ({type(e).__name__})"
        res[s.alias] = {"method": s.method, "options": _jsonable(opts)}
    return res


def _progress(total: int, initial: int, quiet: bool):
    if quiet:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="frame", dynamic_ncols=True,
                desc="explain", smoothing=0.1)
