"""What the commands share: exit codes, progress lines, a job's summary in lines."""
from __future__ import annotations

EXIT_INPUT, EXIT_INTERNAL, EXIT_INTERRUPT, EXIT_TERM = 2, 1, 130, 143


def say(msg: str, quiet: bool = False):
    if not quiet:
        print(msg, flush=True)


def check_flag(check, flag: str, value, hint: str = ""):
    """A flag's value through one of the library's checks (jaxsal.checks), in the command line's words:
    the flag, the value, what it is for; the checked value back."""
    from jaxsal.errors import CLIError, SaliencyInputError

    try:
        return check(flag, value)
    except SaliencyInputError as e:
        raise CLIError(f"{e}{hint}") from None


def check_positive(flag: str, value, hint: str = ""):
    """A count flag through jaxsal.checks.check_positive_int (>= 1, fits int32)."""
    from jaxsal.checks import check_positive_int

    return check_flag(check_positive_int, flag, value, hint)


def summary_lines(summary: dict) -> list[str]:
    steady = summary.get("maps_per_s_after_compile", {})
    rates = ", ".join((f"{k} {v:.1f}" if v else f"{k} -") + (f" ({steady[k]:.1f} after compile)"
                                                              if steady.get(k) else "")
                      for k, v in summary["maps_per_s"].items())
    lines = [f"frames: {summary['frames']} in the buffer, {summary['frames_computed']} computed now"
             + (f", {summary['frames_resumed']} already done" if summary["frames_resumed"] else "")
             + (f" (process {summary['process_id']} of {summary['num_processes']})"
                if summary["num_processes"] > 1 else ""),
             f"maps/s per method: {rates}",
             f"wall time: {summary['wall_s']:.1f}s on {summary['devices']} device(s)",
             f"output: {summary['out']}" + ("" if summary["complete"] else " (incomplete: other processes "
                                                                              "still running, or rerun)")]
    return lines
