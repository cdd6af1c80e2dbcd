"""A teacher: resolved from --teacher, loaded, batched over texts; its vocab and init outputs; fine-tuned into a
task teacher."""
