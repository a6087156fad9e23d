"""Gated delta net (Qwen3-Next / Qwen3.5) ops. See cpu/kv/__init__.py for the table format."""
SGL_KERNEL: dict[str, dict[str, str]] = {}
POST_IMPORT: dict[str, str | list[str]] = {}
