"""Helpers every stage shares, below the store: errors, options' bounds, progress bars, hardware probes,
input readers and task files, content-hash ids, finiteness checks, the output-folder gate.

Nothing here knows the store layout: `kd.storage` (the contract) builds on this package, and so do
`pipeline`, `student`, the dataset side and `apps`. See docs/design.md for the package map.
"""
