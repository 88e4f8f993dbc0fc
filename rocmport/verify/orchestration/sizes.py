"""The bounds of verify's sizes, once: the click type of a parallel size (--tp, --pp, --dp, --nproc,
--nnodes, --unit-nproc), shared by every command that takes one (verify, refresh, bot) and by the stages
that declare such an option.

Every size is checked where it enters: at least 1, and no more processes than any machine has (a typo
such as --tp 99999999999999999999 is exit 2 at once, --dry-run included, not after a refresh ran);
the world (their product) is checked by rocmport.verify.orchestration.run.check_sizes."""

from __future__ import annotations

import click

# The most processes a run may ask for: beyond any machine's (and torchrun's) reach, so a typo such as
# `--dp 99999999999999999999` is refused at once instead of reaching the launcher.
MAX_WORLD = 65536
MAX_ITERS = 10**7
SIZE = click.IntRange(1, MAX_WORLD)
"""The bounds every size verify (and refresh's verify) is given is checked against, where it enters."""
