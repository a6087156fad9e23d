"""The model options every bench shares: the tiny archs (--models, made under --models-root) or the user's own model
directory (--model-path), one meaning per name across subcommands."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

from sglang_radixflow.models import ARCHS


def add_model_arguments(parser: Any, default_models: Sequence[str]) -> None:
    parser.add_argument("--models", default=None,
                        help=f"comma list of tiny model archs, made under --models-root (default: "
                             f"{','.join(default_models)}; choices: {', '.join(ARCHS)})")
    parser.add_argument("--model-path", default=None,
                        help="your own local Hugging Face model directory instead of the tiny archs (its tokenizer "
                             "serves text workloads; --server-args go to its servers as given, CPU flags only on a "
                             "machine without a GPU)")
    parser.add_argument("--models-root", default="runs/models",
                        help="where tiny models are made/reused (default: %(default)s)")


def models_from_args(args: Any, default_models: Sequence[str]) -> tuple[tuple[str, ...], Optional[Path]]:
    """(model names, the user's model directory or None); ValueError when both kinds are given."""
    model_path = Path(args.model_path) if args.model_path else None
    if model_path is not None and args.models:
        raise ValueError("--models (tiny archs) and --model-path (your model directory): give one of them")
    if model_path is not None:
        return (model_path.name,), model_path
    return tuple(m.strip() for m in (args.models or ",".join(default_models)).split(",") if m.strip()), None
