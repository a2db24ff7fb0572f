"""Datasets: embedded and offline corpora, loaders and batch sources."""

from .text import DataError, LMBatches, embedded_corpus, read_corpus

__all__ = ["DataError", "LMBatches", "embedded_corpus", "read_corpus"]
