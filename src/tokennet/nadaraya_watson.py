"""Kept for code that imports it by this name: the demo lives in :mod:`tokennet.demos.nadaraya_watson`."""

from .demos.nadaraya_watson import *  # noqa: F403
from .demos.nadaraya_watson import __all__  # noqa: F401
