"""Measured tile choices, persisted per GPU model: used ahead of the cost model when present.

One JSON file per GPU model under ``<cache dir>/tuning/``. An entry is keyed by (kernel — fp8_gemm_nt, or
bf16_gemm_<layout> with its addend kind —, N, K, output dtype, SM count, M bucket) and stores only the tile choice (block_m, block_n, cluster_m, and whether the last
wave ran as a stream tail or split along K) with the time
that won; the full config (stages, shared memory, pipelining) is rebuilt by the heuristic's own rules,
so a stale or hand-edited entry can never produce an inconsistent kernel. Unreadable files or entries
are ignored. Writes are read-modify-write under a file lock, published by atomic rename.

Behind the user's file, the package ships measured choices (``deepgemm/tuning/tuned/<gpu>.json``, same
format, read-only) for shapes where the cost model is known to pick a slower tile; the user's own
entries (``deepgemm tune``, ``DEEPGEMM_AUTOTUNE=1``) take precedence.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from deepgemm.jit.compiler import default_cache_dir
from deepgemm.kernels.sm90_bf16_gemm.config import Bf16GemmConfig
from deepgemm.kernels.sm90_bf16_gemm.cost_model import Bf16Problem, split_k_ranges, tile_allowed
from deepgemm.kernels.sm90_bf16_gemm.cost_model import make_config as make_bf16_config
from deepgemm.kernels.sm90_fp8_gemm_1d2d.config import GemmConfig
from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import candidate_tiles, clusters_allowed, make_config
from deepgemm.kernels.sm90_fp8_gemm_1d2d.problem import GemmKind, GemmProblem
from deepgemm.kernels.sm90_fp8_gemm_1d2d.schedule import model_split_tail, split_tail_applies, stream_tail_applies
from deepgemm.kernels.sm90_fp8_gemm_1d2d.smem import max_stages
from deepgemm.utils import next_power_of_2

FORMAT = "deepgemm-tuning"
VERSION = 1
KERNEL_FP8_GEMM_NT = "fp8_gemm_nt"


def m_bucket(m: int) -> int:
    """Shapes whose M rounds up to the same power of two share a tuned choice."""
    return next_power_of_2(m)


def gpu_slug(gpu_name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-") or "gpu"


def default_tuning_path(gpu_name: str) -> Path:
    return default_cache_dir() / "tuning" / f"{gpu_slug(gpu_name)}.json"


@dataclass(frozen=True)
class TunedChoice:
    block_m: int
    block_n: int
    cluster_m: int
    median_us: float
    measured_m: int
    stream_tail: bool = False
    split_tail: bool = False


def entry_key(n: int, k: int, out_elem_bytes: int, num_sms: int, m: int, kernel: str = KERNEL_FP8_GEMM_NT) -> str:
    return f"{kernel}|n={n}|k={k}|out={out_elem_bytes}|sms={num_sms}|m<={m_bucket(m)}"


def bf16_kernel_name(problem: Bf16Problem) -> str:
    """The entry-key kernel of a BF16 problem: its layout and addend kind (different kernels, own entries)."""
    layout = ("t" if problem.a_mn_major else "n") + ("n" if problem.b_mn_major else "t")
    return f"bf16_gemm_{layout}|c={problem.addend_bytes}"


class TuningDB:
    """The tuning file of one GPU model; loaded lazily, re-read after every write by this process."""

    def __init__(self, path: Path, fallback: TuningDB | None = None) -> None:
        self.path = path
        self.fallback = fallback  # consulted (read-only) when this file has no entry for a shape
        self._entries: dict[str, TunedChoice] | None = None
        self._lock = threading.Lock()

    def _read(self) -> dict[str, TunedChoice]:
        try:
            raw = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(raw, dict) or raw.get("format") != FORMAT or raw.get("version") != VERSION:
            return {}
        entries = {}
        for key, value in (raw.get("entries") or {}).items():
            try:
                stream_tail = value.get("stream_tail", False)
                split_tail = value.get("split_tail", False)
                if not isinstance(stream_tail, bool) or not isinstance(split_tail, bool):  # ("false" would read as true)
                    continue
                if stream_tail and split_tail:  # two ways to run the last wave: not an entry the tuner writes
                    continue
                entries[key] = TunedChoice(int(value["block_m"]), int(value["block_n"]), int(value["cluster_m"]),
                                           float(value["median_us"]), int(value["measured_m"]), stream_tail, split_tail)
            except (AttributeError, KeyError, TypeError, ValueError):
                continue
        return entries

    def entries(self) -> dict[str, TunedChoice]:
        if self._entries is None:
            with self._lock:
                if self._entries is None:
                    self._entries = self._read()
        return self._entries

    def lookup_problem(self, problem: GemmProblem) -> GemmConfig | None:
        """The tuned config for a dense problem (grouped layouts have no tuned entries), or None."""
        if problem.kind != GemmKind.DENSE:
            return None
        return self.lookup(problem.m, problem.n, problem.k, problem.num_sms, problem.out_elem_bytes)

    def lookup(self, m: int, n: int, k: int, num_sms: int, out_elem_bytes: int = 2) -> GemmConfig | None:
        """The tuned config for this shape's bucket, rebuilt and re-checked (else the fallback's), or None."""
        choice = self.entries().get(entry_key(n, k, out_elem_bytes, num_sms, m))
        if choice is None:
            return self.fallback.lookup(m, n, k, num_sms, out_elem_bytes) if self.fallback is not None else None
        if (choice.block_m, choice.block_n) not in candidate_tiles(m, n, allow_block_m_192=True):
            return None
        if choice.cluster_m not in (1, 2) or max_stages(choice.block_m, choice.block_n, k, out_elem_bytes) < 2:
            return None
        if choice.cluster_m == 2 and not clusters_allowed(m, choice.block_m, choice.block_n, num_sms):
            return None
        # A tuned stream or split tail stands only where it splits at this M (the bucket may hold other Ms).
        stream_tail = (choice.stream_tail and choice.cluster_m == 1
                       and stream_tail_applies(m, n, k, choice.block_m, choice.block_n, num_sms))
        split_tail = (not stream_tail and choice.cluster_m == 1
                      and (model_split_tail(m, n, k, choice.block_m, choice.block_n, num_sms)
                           or (choice.split_tail and split_tail_applies(m, n, k, choice.block_m, choice.block_n, num_sms))))
        return make_config(m, n, k, choice.block_m, choice.block_n, num_sms, out_elem_bytes, cluster_m=choice.cluster_m,
                           split_tail=split_tail, stream_tail=stream_tail)

    def lookup_bf16(self, problem: Bf16Problem) -> Bf16GemmConfig | None:
        """The tuned BF16 tile for this problem's bucket, rebuilt by the cost model's rules and re-checked (else the
        fallback's), or None."""
        key = entry_key(problem.n, problem.k, problem.out_bytes, problem.num_sms, problem.m, bf16_kernel_name(problem))
        choice = self.entries().get(key)
        if choice is None:
            return self.fallback.lookup_bf16(problem) if self.fallback is not None else None
        if choice.cluster_m != 1 or choice.stream_tail:
            return None  # the BF16 kernel has no clusters or stream tails: not an entry its tuner writes
        if not tile_allowed(problem, choice.block_m, choice.block_n):
            return None
        # A tuned split-K (stored as split_tail) stands only where it splits at this M (the bucket may hold other Ms).
        split_k = choice.split_tail and split_k_ranges(problem, choice.block_m, choice.block_n) > 1
        return make_bf16_config(problem, choice.block_m, choice.block_n, split_k)

    def record_bf16(self, problem: Bf16Problem, config: Bf16GemmConfig, median_us: float) -> None:
        """Store the BF16 winner for this problem's bucket (replacing an older entry)."""
        key = entry_key(problem.n, problem.k, problem.out_bytes, problem.num_sms, problem.m, bf16_kernel_name(problem))
        self._write(key, TunedChoice(config.block_m, config.block_n, 1, float(median_us), problem.m,
                                     split_tail=config.split_k))

    def record(self, m: int, n: int, k: int, num_sms: int, config: GemmConfig, median_us: float,
               out_elem_bytes: int = 2) -> None:
        """Store the winner for this shape's bucket (replacing an older entry)."""
        self._write(entry_key(n, k, out_elem_bytes, num_sms, m), TunedChoice(
            config.block_m, config.block_n, config.cluster_m, float(median_us), m, config.stream_tail, config.split_tail))

    def _write(self, key: str, choice: TunedChoice) -> None:
        """Read-modify-write of one entry under the file lock, published by atomic rename."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = self.path.with_suffix(".lock")
        with open(lock_path, "a+") as lock_file:
            fcntl.flock(lock_file, fcntl.LOCK_EX)
            entries = self._read()
            entries[key] = choice
            payload = {"format": FORMAT, "version": VERSION,
                       "entries": {name: vars(entry) for name, entry in sorted(entries.items())}}
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".tuning-", suffix=".json")
            with os.fdopen(fd, "w") as f:
                json.dump(payload, f, indent=1)
            os.replace(tmp, self.path)
        with self._lock:
            self._entries = entries


_databases: dict[Path, TuningDB] = {}


def shipped_tuning_path(gpu_name: str) -> Path:
    """The package's measured choices for this GPU model (may not exist)."""
    return Path(__file__).resolve().parent / "tuned" / f"{gpu_slug(gpu_name)}.json"


def tuning_db(gpu_name: str) -> TuningDB:
    """The user's tuning file for this GPU model, backed by the package's shipped choices."""
    path = default_tuning_path(gpu_name)
    db = _databases.get(path)
    if db is None:
        shipped = shipped_tuning_path(gpu_name)
        db = _databases.setdefault(path, TuningDB(path, TuningDB(shipped) if shipped.is_file() else None))
    return db
