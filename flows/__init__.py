"""Prefect flows of the training algorithms.

Prefect reads its settings when first imported, so the defaults that make the embedded
(ephemeral) API dependable on a small, busy machine are set here, before any flow module
imports prefect. Values already in the environment win.
"""

import os

# The ephemeral API server gets 20 s by default; a loaded 2-core machine needs more.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
