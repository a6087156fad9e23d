"""Mamba-2 (NemotronH) ops: causal conv1d, SSD chunk scan, selective_state_update. See cpu/kv/__init__.py."""
SGL_KERNEL: dict[str, dict[str, str]] = {}
POST_IMPORT: dict[str, str | list[str]] = {}
