"""A deterministic simulator of a bascule cluster: the real node code in one process, on virtual
time, a simulated network (``testing.bus``), modelled metadata Raft (``metadata``) and real logs in
a scratch directory, driven by a seed through faults, with the invariants checked as it runs
(``invariants``). ``python -m bascule.simulation --seeds 1-100`` runs seeds; see ``run``."""
