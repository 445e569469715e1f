"""Build tools behind `build.py` (not in the image): dev models, the engine pipeline and its
publishing, the image context and truss config, Kubernetes and Gateway manifests, the local
server launcher, verify-gpu and the docs' diagrams. `cli.py` maps subcommands to them."""
