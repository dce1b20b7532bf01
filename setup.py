"""Only here to declare the optional C accelerator; everything else lives in pyproject.toml.

``optional=True``: a machine without a C compiler still installs kdaemon and uses the
pure-Python record decoder, which produces identical results.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "kdaemon.protocol._speedups",
            ["kdaemon/protocol/_speedups.c"],
            optional=True,
            extra_compile_args=["-O2"],
        )
    ]
)
