"""Datasets on the nodes, and the object-store I/O the checkpoint archive uses too (issue 41).
Named `staging`, not `datasets`, which is Hugging Face's package.

What the parts agree on (`staging/types.py`); reading a source, a path or an object-store URL
(`staging/source.py`); checksums (`staging/checksum.py`); each node's cache (`staging/cache.py`:
copied once, verified, made visible atomically, least-recently-used eviction over a cap).
"""
