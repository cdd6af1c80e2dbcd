"""`kd eval`: the models compared, the tasks and their measures, speed and size, the cached teacher vectors,
the report's figures and the bundled evaluation sets."""
