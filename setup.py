"""Builds the optional C extension `edgellm._native` (native/build_native.py, cffi API mode) at install
time; everything else is declared in pyproject.toml. Without a working C compiler the install still
succeeds: edgellm then runs on the numba backend and `--backend native` says why it is unavailable."""

from setuptools import setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """build_ext that reports a failed C build in one line instead of failing the install."""

    def run(self):
        try:
            super().run()
        except Exception as e:  # no compiler at all (DistutilsPlatformError) or a setup problem
            self._skip(e)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as e:  # CompileError, LinkError
            self._skip(e)

    @staticmethod
    def _skip(e: Exception) -> None:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"edgellm: native backend not built ({msg}); edgellm will run on numba")


setup(cffi_modules=["native/build_native.py:ffibuilder"], cmdclass={"build_ext": OptionalBuildExt})
