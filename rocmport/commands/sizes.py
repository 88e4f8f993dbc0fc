"""The click type of a parallel size (--tp, --pp, --dp, --nproc, --nnodes ...), one for every command
that takes one (verify, refresh, bot).

Every size is checked where it enters: at least 1, and no more processes than any machine has (a typo
such as --tp 99999999999999999999 is exit 2 at once, --dry-run included, not after a refresh ran);
the world (their product) is checked by rocmport.verify.orchestration.run.check_sizes."""

from __future__ import annotations

import click

from rocmport.verify.orchestration.run import MAX_WORLD

SIZE = click.IntRange(1, MAX_WORLD)
