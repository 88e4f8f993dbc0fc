"""Patches: the patch series on disk and what is done with one patch.

The series model, its schema and DEP-3 headers (series), the apply ladder for one patch (apply),
export and the drift check between a work branch and the series (export), and regeneration of
drifted patches after an upstream move (regenerate)."""
