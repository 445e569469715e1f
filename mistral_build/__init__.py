"""Build tools behind `build.py`: dev model, engine pipeline, image context, manifests,
and the local server launcher. One module per subcommand."""
