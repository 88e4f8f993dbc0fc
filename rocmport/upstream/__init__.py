"""Upstream: where the sources come from and which commits the port is built on.

URL validation and the cache of bare mirrors (remotes, store), ref resolution in a mirror (refs),
the companion Megatron-Bridge release (companion), the package index as a second source
(package_index), `upstream.lock` (lock), and sync's resolution of refs into a lock (resolve)."""
