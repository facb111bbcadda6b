"""Environment images on the nodes: resolved in a registry, pulled into a node's cache, unpacked once.

The plane (or, on Slurm, the node) asks a node's `NodeCache` for an image pinned to a digest;
the cache pulls what it lacks with `skopeo` into one OCI layout per node (blobs shared between
images), unpacks each layer once into a directory of its own (layers shared between images; a
container's root is an overlay of them), evicts the least recently used entries over a size cap,
and never leaves a half-pulled or half-unpacked entry. What a pull can fail of is an
`ImagePullError` with a kind of its own, and whether the registry (not the user) is at fault.
The container run itself is the backends' (the rank runner execs `runc`).
"""
