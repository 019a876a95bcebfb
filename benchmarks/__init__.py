"""Throughput and accuracy scripts whose results BENCHMARKS.md and docs/benchmarks.md record; each runs as
`python benchmarks/NAME.py`. A package only so that the import contract (pyproject.toml) can hold them to vitlab's
public names."""
