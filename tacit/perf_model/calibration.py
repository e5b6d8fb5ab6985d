"""`this-cpu`'s efficiency profile: fitted on the machine it prices, cached like the kernels.

A fit describes the machine it was made on. The profile once shipped in efficiency.json was
fitted on an AMD EPYC host without AMX (torch's bf16 matmul: 171 GFLOP/s at one thread; the
file did not record the processor), and predict priced every this-cpu with its roofs; on a
2-core Xeon with AMX oneDNN's bf16 matmul reaches ~1.1 TFLOP/s at one thread, and every
prefill GEMM was priced 4-6x too slow. So the fit is keyed by the machine and made there:

- the key: the processor (its /proc/cpuinfo name and family/model/stepping), the logical CPUs,
  the threads torch runs with (the fit is only true at the thread count it was made at: the
  per-step costs and the GEMM curves are per thread count) and torch's version (its oneDNN
  picks the matmul kernels). One file per key under cache_dir()/calibration/.
- the path: the fit times what the engine runs here (fit_host.py): bf16 and the C++ kernels on
  an AVX512-BF16 CPU, float32 torch paths on one without a native bf16 matmul (int8 there is not
  fitted: without the kernels the engine dequantizes it every call).
- the peaks: the fit stores the roofs it measured (bf16 matmul FLOP/s, read bandwidth, as
  `tacit bench hw` measures them); when this process measures either more than DRIFT_MARGIN
  away, the machine is not in the state the fit describes, and it is fitted again.

`tacit predict --calibrate` forces a new fit; `--validate` and `--hardware this-cpu` fit first
when no cached fit matches (one to two minutes on 2 cores, a progress bar on stderr).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import re
import sys
import time
from pathlib import Path
from typing import Any

from tacit.paths import cache_dir
from tacit.perf_model.efficiency import Profile, _profile, load_profile
from tacit.platforms.compute_thread import run_on_own_thread
from tacit.platforms.specs import HardwareSpec

# Between two processes on this 2-core machine the read bandwidth moved 41.0 -> 37.7 GB/s (8%)
# and the one-thread bf16 matmul 1.16 -> 1.13 TFLOP/s: 20% is over twice that noise, so an
# ordinary process does not refit, while the change that broke the shipped fit (171 GFLOP/s
# -> 1.1 TFLOP/s bf16, 6.6x) is far past it.
DRIFT_MARGIN = 0.20
# Bump when fit.py measures something new or differently: older files are then a miss.
# 3: the prefill step's fixed cost (fit_prefill.py); 4: the host's compute dtype (fit_host.py);
# 5: fixed costs at 256 wide, the Qwen3-MoE layer's own, per-row host costs; 6: the GEMM curve
# on both sides of the linear method's switch, a padded decode group's host cost
FIT_VERSION = 6
COMMAND = "tacit predict --calibrate"


class CalibrationError(RuntimeError):
    """A cached calibration that cannot be used as it is."""


def calibration_dir() -> Path:
    return cache_dir() / "calibration"


def cpu_name() -> str:
    """/proc/cpuinfo's model name (what a recipe or a report says was measured on)."""
    return _cpuinfo().get("model name", "an unnamed CPU")


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo ({} where there is none: not Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        k, _, v = line.partition(":")
        fields[k.strip()] = v.strip()
    return fields


def machine_key(threads: int | None = None) -> dict[str, Any]:
    """What a fit is true for: processor, logical CPUs, torch's threads and version."""
    import torch

    info = _cpuinfo()
    ids = "/".join(info.get(k, "?") for k in ("cpu family", "model", "stepping"))
    return {
        "processor": info.get("model name") or platform.processor() or platform.machine(),
        "cpu_ids": ids if info else platform.machine(),
        "logical_cpus": os.cpu_count() or 1,
        "threads": threads if threads is not None else torch.get_num_threads(),
        "torch": torch.__version__,
        "fit_version": FIT_VERSION,
    }


def calibration_path(key: dict[str, Any]) -> Path:
    """cache_dir()/calibration/<processor>-<N>cpu-<T>t-<hash of the whole key>.json"""
    slug = re.sub(r"[^a-z0-9]+", "-", key["processor"].lower()).strip("-")[:48] or "cpu"
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return calibration_dir() / f"{slug}-{key['logical_cpus']}cpu-{key['threads']}t-{digest}.json"


def current_peaks(spec: HardwareSpec | None = None) -> dict[str, float]:
    """spec's roofs, or this machine's as `tacit bench hw` measures them now: measured on every
    call (hardware_table.this_cpu_peaks), not the process's first measurement, which
    this_cpu_spec keeps: a validation checks them before each model, minutes apart."""
    if spec is not None:
        return {"bf16_flops": spec.peak_flops("bf16"), "read_bandwidth": spec.memory_bandwidth.value}
    from tacit.platforms.hardware_table import this_cpu_peaks

    peaks = this_cpu_peaks()
    return {"bf16_flops": peaks["bf16_flops"], "read_bandwidth": peaks["read_bandwidth"]}


def drift(roofs: dict[str, float], peaks: dict[str, float], margin: float = DRIFT_MARGIN) -> list[str]:
    """The peaks that moved more than `margin` from the fitted roofs, said in words."""
    moved = []
    for name, unit, scale in (("bf16_flops", "GFLOP/s", 1e9), ("read_bandwidth", "GB/s", 1e9)):
        fitted, now = roofs[name], peaks[name]
        if abs(now / fitted - 1) > margin:
            moved.append(
                f"{name} {fitted / scale:.1f} -> {now / scale:.1f} {unit} ({100 * (now / fitted - 1):+.0f}%, "
                f"margin {100 * margin:.0f}%)"
            )
    return moved


def read_calibration(path: Path) -> dict[str, Any]:
    """A calibration file's contents; CalibrationError naming the file if it is not one."""
    try:
        data = json.loads(path.read_text())
        _profile("this-cpu", data["profile"])  # every field a Profile needs is there
        data["profile"]["roofs"]["bf16_flops"], data["profile"]["roofs"]["read_bandwidth"]
        data["key"]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CalibrationError(f"{path} is not a tacit calibration ({type(e).__name__}: {e})") from None
    return data


def lookup(peaks: dict[str, float] | None = None, threads: int | None = None) -> tuple[dict | None, str]:
    """(this machine's cached calibration, "") or (None, why there is none usable)."""
    key = machine_key(threads)
    path = calibration_path(key)
    if not path.exists():
        return None, f"no calibration for this machine ({key['processor']}, {key['threads']} threads)"
    try:
        data = read_calibration(path)
    except CalibrationError as e:
        return None, str(e)
    if data["key"] != key:
        return None, f"{path} was fitted for another machine ({data['key']}, not {key})"
    moved = drift(data["profile"]["roofs"], peaks or current_peaks())
    if moved:
        return None, f"this machine's peaks moved since the fit of {data['fitted_at']}: {'; '.join(moved)}"
    return data, ""


def run_fit(repeats: int) -> dict[str, Any]:
    """The full micro-benchmark fit (fit.py): one to two minutes on 2 cores."""
    from tacit.perf_model.fit import fit

    return fit(repeats, progress=_progress_bar())


def _progress_bar():
    from tqdm import tqdm

    bar = tqdm(total=None, desc="calibrating this-cpu", unit="stage", file=sys.stderr, leave=True)

    def step(stage: str, total: int) -> None:
        bar.total = total
        bar.set_postfix_str(stage)
        bar.update(1)
        if bar.n >= total:
            bar.close()

    return step


# Best of 10 runs a point, not 5: on the AVX2 EPYC two validations after 10-repeat fits read
# prefill median 8.9% and 11.4% against 12.6-18.1% in three after 5-repeat fits (decode 10.0 and
# 7.1% against 7.5-10.8%), for ~40 s more fitting (~85 s there): each point has twice the chances
# of a run the shared machine did not disturb (docs/performance/predict.md)
REPEATS = 10


def calibrate(reason: str = "asked for (--calibrate)", repeats: int = REPEATS) -> dict[str, Any]:
    """Fit this machine now and write its calibration file (atomically: another process may be
    reading it); returns the file's contents."""
    key = machine_key()
    path = calibration_path(key)
    print(f"calibrating this-cpu: {reason}; one to two minutes (written to {path})", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    # On a thread of its own: the fit's torch work would leave the caller's thread an OpenMP pool
    # that slows the engine threads started after it (platforms/compute_thread.py)
    profile = run_on_own_thread(run_fit, repeats, name="tacit-calibration")
    data = {
        "key": key,
        "command": COMMAND,
        "fitted_at": datetime.datetime.now().isoformat(timespec="seconds"),
        "fit_seconds": round(time.perf_counter() - t0, 1),
        "drift_margin": DRIFT_MARGIN,
        "profile": profile,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)
    return data


def this_cpu_calibration(refit: bool = False, peaks: dict[str, float] | None = None) -> dict[str, Any]:
    """This machine's calibration: the cached one if it matches `peaks` (default: probed now),
    else a new fit (saying why)."""
    if refit:
        return calibrate()
    data, why = lookup(peaks)
    return data if data is not None else calibrate(why)


def this_cpu_profile(refit: bool = False, peaks: dict[str, float] | None = None) -> Profile:
    return calibration_profile(this_cpu_calibration(refit, peaks))


def calibration_profile(data: dict[str, Any]) -> Profile:
    """The Profile a calibration file's contents describe, its source naming the fit."""
    source = f"this machine's calibration, fitted {data['fitted_at']} ({calibration_path(data['key'])})"
    return _profile("this-cpu", {**data["profile"], "source": source})


def profile_for(spec: HardwareSpec) -> Profile:
    """The efficiency profile `spec` is priced with: this machine's own fit for `this-cpu`,
    else its named entry in efficiency.json."""
    if spec.efficiency_profile == "this-cpu":
        # The measured this-cpu spec carries this process's probe: the fit is checked against
        # it rather than a second probe (a few seconds more at every `tacit predict` start)
        return this_cpu_profile(peaks=current_peaks(spec) if spec.name == "this-cpu" else None)
    return load_profile(spec.efficiency_profile)
