"""A request's generation: the service (tokens in, text chunks out), admission (slots and a
bounded queue) and the deadline."""
