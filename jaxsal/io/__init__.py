"""Batch jobs on disk: input readers (.npy/.npz/shards/Dopamine), the chunked map store, the runner.

    source = jaxsal.io.open_source("buffer.npz")
    jaxsal.io.run_job(apply_fn, params, source, "out/", [MethodSpec("gradcam", "gradcam", {})])
    maps = jaxsal.load_maps("out/", "gradcam")      # array-like (N, H, W)
"""
from jaxsal.io.job import MethodSpec, run_job
from jaxsal.io.readers import open_source
from jaxsal.io.object_files import load_object_effects, load_object_shares, read_objects
from jaxsal.io.store import MapArray, load_maps, read_manifest

__all__ = ["MethodSpec", "run_job", "open_source", "MapArray", "load_maps", "read_manifest", "load_object_shares", "load_object_effects",
           "read_objects"]
