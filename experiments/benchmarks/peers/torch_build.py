"""torch's build beside every peer timing: a CUDA build timed on the CPU flatters jaxsal (its CPU
convolutions can run several times slower than the CPU build's), so it is refused unless asked for,
and then every result says so."""
from __future__ import annotations

CUDA_ON_CPU = ("a CUDA build of torch timed on the CPU: its CPU convolutions can run several times slower than the CPU "
               "build's, so the ratios overstate jaxsal")


def build_note(cuda: str | None, on_cpu: bool = True) -> str:
    """'CPU build', 'CUDA x.y build' or, for a CUDA build timed on the CPU, the warning."""
    if cuda is None:
        return "CPU build"
    return f"CUDA {cuda} build" + (f": {CUDA_ON_CPU}" if on_cpu else "")


def refuse_cuda_on_cpu(version: str, cuda: str | None, allow: bool) -> None:
    """Stop, naming the fix, before a CUDA build of torch is timed on the CPU, unless `allow`."""
    if cuda is not None and not allow:
        raise SystemExit(
            f"torch {version} is a CUDA build (CUDA {cuda}); timed on the CPU its convolutions can run several "
            "times slower than torch's CPU build and the ratios would flatter jaxsal. Install the CPU build "
            "(pip install torch --index-url https://download.pytorch.org/whl/cpu, or a +cpu wheel you have), "
            "or pass --allow-cuda-build-on-cpu to time it anyway with every result flagged.")
