"""The metadata Raft group: its state machine, its commands and the pysyncobj shell around them."""

from bascule.deferred_imports import import_without

# Before any module of this package imports pysyncobj: see bascule.deferred_imports.
import_without("pysyncobj", "cryptography")
