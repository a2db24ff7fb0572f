"""Build-time part of the install: the native int8 kernel (``src/tokennet/layers/int8dot.cpp``) as a compiled
extension, built when tokennet is installed rather than at first use.

It needs PyTorch at build time, so it is built only where the build sees the installed torch
(``pip install --no-build-isolation``, as ``scripts/install.sh`` installs); an isolated build, a machine without a
C++ compiler or a CPU other than x86-64 installs tokennet without it, and :mod:`tokennet.layers.int8dot` builds it
at first use as before (or falls back to the plain path). Everything else is in ``pyproject.toml``.
"""

import platform

from setuptools import setup


def _int8dot():
    """``(ext_modules, cmdclass)`` with the kernel where torch and an x86-64 compiler are at hand, else empty."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return [], {}
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:  # an isolated build: no torch to build against
        return [], {}
    # The flags of int8dot.py's build at first use (-ffp-contract=off keeps the scaling the formula's, bit for bit),
    # and -g0: Python's own flags ask for debug information, 36 times the library's size.
    flags = ["-O3", "-g0", "-ffp-contract=off", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-fopenmp"]
    ext = CppExtension("tokennet.layers._int8dot", ["src/tokennet/layers/int8dot.cpp"], extra_compile_args=flags,
                       extra_link_args=["-fopenmp"], optional=True)  # optional: a failed build is a warning
    return [ext], {"build_ext": _build_once(BuildExtension)}


def _build_once(base):
    """``build_ext`` that keeps a library already built in place from the same source against the same torch (an
    editable install builds in a fresh directory each time: ~50 s of compiling for nothing)."""
    import hashlib
    import os
    import shutil

    import torch

    class BuildOnce(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, no_python_abi_suffix=True, **kwargs)

        def build_extension(self, ext):
            here = os.path.join("src", *ext.name.split(".")) + ".so"
            stamp = hashlib.sha256(open(ext.sources[0], "rb").read() + torch.__version__.encode()).hexdigest()
            target = self.get_ext_fullpath(ext.name)
            if os.path.isfile(here) and os.path.isfile(here + ".stamp") and open(here + ".stamp").read() == stamp:
                if os.path.abspath(here) != os.path.abspath(target):
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    shutil.copy2(here, target)
                return
            super().build_extension(ext)
            if os.path.isfile(target):
                if os.path.abspath(here) != os.path.abspath(target):
                    shutil.copy2(target, here)
                with open(here + ".stamp", "w") as f:
                    f.write(stamp)

    return BuildOnce


ext_modules, cmdclass = _int8dot()
setup(ext_modules=ext_modules, cmdclass=cmdclass)
