"""`python -m inplace_jax check FILE.py:FUNCTION --arg f32[1000,1000] --donate 0`."""

from ._cli import main

raise SystemExit(main())
