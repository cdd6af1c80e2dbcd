"""Helpers every stage shares, below the store: errors, options' bounds, progress bars, hardware probes,
input readers and task files, content-hash ids, finiteness checks, the output-folder gate, and the parts
both fine-tuning commands share (`finetune`: imports torch, so only they import it).

Nothing here knows the store layout: `kd.storage` (the contract) builds on this package, and so do
`pipeline`, `student`, the dataset side and `apps`. See docs/design.md for the package map.
"""
