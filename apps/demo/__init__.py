"""`kd demo`: the whole workflow on the bundled corpus."""
