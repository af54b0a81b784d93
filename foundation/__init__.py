"""The bottom library: what every layer above may use and which uses none of them.

TLS and the cluster's PKI (``tls``, ``pki``), network helpers (``netutil``), the memory
allocator choice for spawned servers (``allocator``), and the one retry policy of every loop
that tries again (``retry``: jittered exponential backoff with a cap and a deadline). Nothing here imports ``store``,
``placement``, ``services``, ``godel`` or ``bench`` (pyproject's import-linter contracts)."""
