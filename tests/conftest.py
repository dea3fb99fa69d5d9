"""Test-wide settings: experiments run through `genvi.cli.main` in tests do not write
JAX's persistent compilation cache (a user's `genvi run` does; see
`genvi.core.compile_cache.use_compilation_cache`)."""

import os

os.environ["GENVI_CACHE"] = "off"
