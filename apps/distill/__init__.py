"""`kd distill`: a recipe (data), checked against its models, run step by step or planned (--dry-run);
stages shared between runs, several teachers' weights."""
