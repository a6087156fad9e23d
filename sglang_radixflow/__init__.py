"""sglang-radixflow: state-ready prefix caching for hybrid LLMs, as an SGLang 0.5.23 plugin.

Importing this package is cheap on purpose (it is imported by SGLang's plugin loader in every process).
"""
from __future__ import annotations

__version__ = "0.1.0"
SGLANG_VERSION = "0.5.23"
