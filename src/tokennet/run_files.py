"""The names of the files in a run directory, in one place below every module that writes or reads them.

:mod:`tokennet.run` owns the directory (it re-exports these names); the trainer writes ``log.jsonl``
and ``checkpoints/`` and the report reads them, and both sit below ``run`` in the import layers, so the
names live here rather than as literals in each.
"""

from __future__ import annotations

__all__ = ["RUN_FILE", "METRICS_FILE", "TOKENIZER_FILE", "LOG_FILE", "CHECKPOINT_DIR", "LOCK_FILE", "REPORT_FILE",
           "ADAPTER_FILE"]

RUN_FILE = "run.json"
METRICS_FILE = "metrics.json"
TOKENIZER_FILE = "tokenizer.json"
LOG_FILE = "log.jsonl"
CHECKPOINT_DIR = "checkpoints"
LOCK_FILE = ".lock"
REPORT_FILE = "report.html"
ADAPTER_FILE = "adapter.safetensors"  # a LoRA run's adapters alone (--set lora_save=adapter)
