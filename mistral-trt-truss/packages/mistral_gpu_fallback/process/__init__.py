"""The PyTorch engine in a child process: the server-side client, the child's entry point."""
