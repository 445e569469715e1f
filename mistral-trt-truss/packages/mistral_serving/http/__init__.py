"""HTTP: the server (Truss with the routes it lacks), its guards and limits (API keys,
body, headers, connections), and the frontend every route goes through."""
