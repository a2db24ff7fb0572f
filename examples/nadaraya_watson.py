"""Nadaraya–Watson attention pooling on the lecture's toy problem (d2l §11.2).

Writes runs/nadaraya-watson/nadaraya_watson.png and .json; same as `tokennet demo nadaraya-watson`.
"""

import logging

from tokennet.nadaraya_watson import run_demo

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    metrics = run_demo("runs/nadaraya-watson")
    for name, value in metrics.items():
        print(f"{name:>24}: {value:.4g}" if isinstance(value, float) else f"{name:>24}: {value}")
