"""Heterogeneous devices: fingerprints (NVML or CPU), the performance score and its refit,
work shares, and the role plan.

Modules: nvml (raw NVML answers), specs (derived peaks), cpu (CPU fingerprint and
micro-benchmarks), fingerprint (`fingerprint_host`), recorded (recorded fingerprints and an
NVML stand-in), score (`ScoreModel`, `work_shares`, `credits_for`), nnls (bounded least
squares), plan (`plan_roles`), cluster (cluster files), settings (`HardwareSettings`).
Nothing is imported here, so importing the package costs nothing.
"""
