"""What a `radixflow bench multi-candidate` run is asked for: BenchOptions, checked when made, and its defaults."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from sglang_radixflow.bench.fleet import Fleet
from sglang_radixflow.bench.frontend import FRONTEND_PATHS
from sglang_radixflow.bench.server import check_hybrid_strategy, check_overlap_schedule, overlap_off
from sglang_radixflow.bench.workloads import WorkloadParams
from sglang_radixflow.config import ARMS
from sglang_radixflow.models import ARCHS, VOCAB_SIZE, ensure_model, model_vocab_size

DEFAULT_ARMS: tuple[str, ...] = ("sglang", "prefix-stop", "radixflow")
DEFAULT_MODELS: tuple[str, ...] = ("nemotron_h", "qwen3")
DEFAULT_KV_TOKENS = 32768
# S mirrors the paper's Nemotron S = 16; T is its 8192 scaled like the QuALITY documents (x 0.25).
QUICK_BUDGETS: tuple[int, int] = (16, 2048)
CALIBRATION_GRID: tuple[tuple[int, int], ...] = ((8, 2048), (16, 2048), (16, 4096), (32, 4096))
# How a question reaches the server: raw /generate per branch, an SGLang frontend program (bench/frontend.py), or one
# call of SGLang's scoring endpoint (bench/score.py).
PATHS: tuple[str, ...] = ("raw", *FRONTEND_PATHS, "score")

@dataclass(frozen=True)
class BenchOptions:
    out: Path
    workload: WorkloadParams
    models: tuple[str, ...] = DEFAULT_MODELS
    arms: tuple[str, ...] = DEFAULT_ARMS
    budgets: Optional[tuple[int, int]] = None  # (S, T); None: calibrate on the sglang arm
    calibration_questions: int = 8
    calibration_grid: tuple[tuple[int, int], ...] = CALIBRATION_GRID
    # KV pool (--max-total-tokens): large enough that the workload's documents are not evicted mid-run; None: SGLang
    # sizes it from memory (the default for your own model on a GPU)
    kv_tokens: Optional[int] = DEFAULT_KV_TOKENS
    models_root: Path = Path("runs/models")
    request_timeout_s: float = 600.0
    quick: bool = False
    # torch intra-op threads per server (OMP_NUM_THREADS; 0: torch's default). 1 by default: on a small shared CPU,
    # multi-threaded ops swing by 10x with other load (OpenMP threads spin and get descheduled), single-threaded
    # ones do not, and every arm gets the same setting.
    server_threads: int = 1
    extra_server_args: tuple[str, ...] = field(default_factory=tuple)
    path: str = "raw"  # one of PATHS
    # hybrids: SGLang's mamba radix-cache strategy (bench/server.py): no_buffer, or extra_buffer (GPU default; Mamba-2)
    mamba_strategy: str = "no_buffer"
    overlap_schedule: str = "auto"  # SGLang's overlap scheduler: auto (off on CPU, see overlap_off), on, off
    # The user's own model directory instead of the tiny archs (`models` is then its one name); servers get the
    # user's --server-args as given, and CPU flags only on a machine without a GPU.
    model_path: Optional[Path] = None
    # Servers already running, one per arm (in `arms` order): nothing is started, budgets are read from them.
    urls: tuple[str, ...] = ()
    workload_file: Optional[Path] = None  # the user's questions (bench/workload_file.py) instead of the generated ones
    # Several workers behind SGLang's gateway (bench/fleet.py); with a gateway, each arm also runs once on one server
    # (the reference) unless `reference` is off.
    fleet: Fleet = field(default_factory=Fleet)
    reference: bool = True

    def __post_init__(self) -> None:
        if self.path not in PATHS:
            raise ValueError(f"path={self.path!r}; allowed: {', '.join(PATHS)}")
        unknown = [a for a in self.arms if a not in ARMS]
        if unknown:
            raise ValueError(f"unknown arm(s) {', '.join(unknown)}; allowed: {', '.join(ARMS)}")
        if (not self.arms and not self.urls) or not self.models:
            raise ValueError("need at least one arm and one model")
        if self.urls and self.arms and len(self.urls) != len(self.arms):
            raise ValueError(f"--url gives {len(self.urls)} server(s) for {len(self.arms)} arm(s) "
                             f"({', '.join(self.arms)}): one URL per arm, in --arms order")
        if self.urls and self.budgets is not None:
            raise ValueError("--budgets with --url: the servers' own budgets are used (read from /server_info)")
        if self.workload.anchor and self.path != "raw":
            raise ValueError(f"--anchor with --path {self.path}: the anchor request exists on the raw path only")
        if self.urls and self.path in FRONTEND_PATHS and self.model_path is None:
            raise ValueError(f"--path {self.path} with --url needs the served model's tokenizer: add --model-path DIR")
        if self.workload_file is not None and self.budgets is None and not self.urls:
            raise ValueError("--workload FILE: give the budgets (--budgets S,T, or --quick); calibration runs on "
                             "generated questions")
        if self.model_path is not None:
            check_model_dir(self.model_path)
        elif not self.urls:
            unknown = [m for m in self.models if m not in ARCHS]
            if unknown:
                raise ValueError(f"unknown model(s) {', '.join(unknown)}; allowed: {', '.join(ARCHS)} "
                                 "(or --model-path DIR for a model directory of your own)")
        if self.budgets is not None and min(self.budgets) < 1:
            raise ValueError(f"budgets S,T = {self.budgets}: both must be positive integers")
        for name in ("kv_tokens", "calibration_questions"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} {getattr(self, name)}: must be >= 1")
        if self.server_threads < 0:
            raise ValueError(f"--server-threads {self.server_threads}: must be >= 0 (0: torch's default)")
        check_hybrid_strategy(self.mamba_strategy)
        check_overlap_schedule(self.overlap_schedule)
        if self.fleet.gateway and self.urls:
            raise ValueError("--workers with --url: the bench starts the workers and the gateway itself")
        if self.fleet.gateway and self.path != "raw":
            raise ValueError(f"--workers with --path {self.path}: runs through a gateway use the raw path only")

    @property
    def overlap_off(self) -> bool:
        """Whether every server runs with --disable-overlap-schedule (server.overlap_off)."""
        return overlap_off(self.overlap_schedule)


def check_model_dir(path: Path) -> None:
    """The user's model directory can serve the workload: it exists, and its vocabulary holds the token ids drawn."""
    if not path.is_dir():
        raise ValueError(f"--model-path {path}: no such directory")
    vocab = model_vocab_size(path)
    if vocab < VOCAB_SIZE:
        raise ValueError(f"--model-path {path}: its vocabulary has {vocab} ids; the workload draws ids below "
                         f"{VOCAB_SIZE}")


def model_dir(opts: BenchOptions, model: str) -> Path:
    """The directory a model name of the run stands for: the user's --model-path, or a tiny arch made on demand."""
    return opts.model_path if opts.model_path is not None else ensure_model(model, opts.models_root)
