"""Port: the ported work trees.

Work-tree clones, state and locking (worktree), `apply`: the lock, a series and the codemods
turned into a layered branch (apply), dependency-manifest rewriting (manifests), and what a
project's trees hold (status)."""
