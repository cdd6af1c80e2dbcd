"""Stage one: read a corpus, run teachers over it once, write their outputs to a store."""
